"""Verification of every algorithm, and of the backend's own collectives, against NumPy.

The reference is :func:`allreduce_jax._ops.oracle`: the reduction computed by NumPy
from every participant's input, with the special-value semantics defined once in
``allreduce_jax._ops`` (NaN propagates through max/min, ``-0.0 < +0.0``, ±inf are
ordinary values). It is not the backend's collective: ``lax.pmax`` over gloo, for one,
mishandles NaN, and a check against it would blame the algorithm.

Inputs follow nccl-tests' "verifiable" idea: small integer-valued floats, rank-coded
(participant i's values depend on i and on the position), whose sums are exact in
any order. On them every algorithm must match the oracle **bit for bit**, and
``mean`` within 2 ulp. Random inputs (normal floats, full-range int32) are compared
within the floating-point summation bound, special inputs (:data:`SPECIALS`: NaN
on one participant or on all, NaNs of both signs, ±inf, -0.0 with +0.0) and, for
``max``/``min``, subnormal inputs (:func:`subnormal_input`) bit for bit. Every
participant must hold the same bits, NaN signs and payloads included.

Next to each algorithm the program also runs XLA's collective of the same op
(``lax.psum``/``pmean``/``pmax``/``pmin``). Where it differs from the oracle, the line
is a *backend finding*: printed, but not a failure of the algorithms (``--strict``
makes it one). ``--backend-oracle`` checks the backend's ``psum``, ``pmean``,
``pmax``, ``pmin``, ``psum_scatter`` and ``all_gather`` alone, against the oracle and
the hand-written ring (jax#40830 reports gloo's ``psum_scatter`` returning wrong
values with no error).

One jitted program per (algorithm, participant count) computes every op × dtype ×
input kind × shape, so a full verification compiles only a few dozen programs.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import ALGORITHMS, _wire, all_reduce, devices
from allreduce_jax._ops import OPS, get_op, oracle
from allreduce_jax._ring import ring_all_gather, ring_reduce_scatter
from allreduce_jax.tools._args import (
  add_algorithms,
  add_devices,
  available_memory,
  check_memory,
  csv_list,
  row_store,
)

DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16", "int32")
KINDS: tuple[str, ...] = ("verifiable", "random", "special", "subnormal")
SHAPES: tuple[tuple[int, ...], ...] = ((), (1,), (13,), (3, 7))
#: The collectives ``--backend-oracle`` checks.
COLLECTIVES: tuple[str, ...] = ("psum", "pmean", "pmax", "pmin", "psum_scatter", "all_gather")


def _rot(values: np.ndarray, k: int) -> np.ndarray:
  return np.roll(values, k)


def _one(value: float, offset: int = 0):
  """The column ``b`` with ``value`` on participant ``k + offset`` (mod p)."""

  def make(b: np.ndarray, k: int) -> np.ndarray:
    b = b.copy()
    b[(k + offset) % len(b)] = value
    return b

  return make


def _two(first: float, second: float):
  def make(b: np.ndarray, k: int) -> np.ndarray:
    b = b.copy()
    b[k % len(b)] = first
    if len(b) > 1:
      b[(k + 1) % len(b)] = second
    return b

  return make


def _three(first: float, second: float, third: float):
  def make(b: np.ndarray, k: int) -> np.ndarray:
    b = b.copy()
    for j, v in enumerate((first, second, third)[: len(b)]):
      b[(k + j) % len(b)] = v
    return b

  return make


def _all(value: float):
  return lambda b, k: np.full_like(b, value)


def _zeros_mixed(b: np.ndarray, k: int) -> np.ndarray:
  return _rot(np.where(np.arange(len(b)) % 2 == 0, -0.0, 0.0), k)  # -0.0 first


def _among(sign: float, *zeros: float):
  """Strictly ``sign``-signed values with the given zeros planted (max/min ties)."""

  def make(b: np.ndarray, k: int) -> np.ndarray:
    b = sign * (np.abs(b) + 1)
    for j, z in enumerate(zeros):
      if j < len(b):
        b[(k + j) % len(b)] = z
    return b

  return make


#: Special-value patterns, ``(name, make(column, k) -> column)``: a column holds the
#: p participants' values at one position ``k`` (verifiable values to start from).
SPECIALS: tuple[tuple[str, object], ...] = (
  ("NaN on one participant", _one(np.nan)),
  ("NaN on every participant", _all(np.nan)),
  ("+inf on one participant", _one(np.inf, 1)),
  ("-inf on one participant", _one(-np.inf, 2)),
  ("+inf and -inf", _two(np.inf, -np.inf)),
  ("NaN and +inf", _two(np.nan, np.inf)),
  ("+inf on every participant", _all(np.inf)),
  ("-inf on every participant", _all(-np.inf)),
  ("-0.0 on every participant", _all(-0.0)),
  ("-0.0 and +0.0", _zeros_mixed),
  ("-0.0 among negatives", _among(-1.0, -0.0)),
  ("-0.0 and +0.0 among negatives", _among(-1.0, -0.0, 0.0)),
  ("+0.0 and -0.0 among positives", _among(1.0, 0.0, -0.0)),
  # NaNs of both signs meet in different orders on different participants (recursive
  # doubling); the result's NaN must still have the same bits everywhere.
  ("NaN and -NaN", _two(np.nan, -np.nan)),
  ("+inf, -inf and NaN", _three(np.inf, -np.inf, np.nan)),
)


@dataclass(frozen=True)
class Row:
  """One compared result: a (algorithm, op, dtype, p, kind, shape) cell.

  ``max_abs_err``, ``bit_exact`` and ``passed`` compare the algorithm with the NumPy
  oracle. ``detail`` says where the algorithm differs from it (empty if nowhere);
  ``backend`` does the same for XLA's collective ``reference`` on the same input, a
  backend finding. An algorithm that is the backend's own collective
  (``hand_written=False``) never fails: its disagreement is a finding too.
  """

  algorithm: str
  op: str
  dtype: str
  p: int
  kind: str
  shape: tuple[int, ...]
  max_abs_err: float
  bit_exact: bool
  replicas_identical: bool
  tolerance: float
  passed: bool
  detail: str = ""
  reference: str = ""
  backend: str = ""
  backend_bad: int = 0
  backend_patterns: tuple[str, ...] = ()
  wire: str | None = None


def rank_coded(i, k, seed: int = 0):
  """The verifiable value of participant ``i`` at position ``k`` (arrays broadcast):
  ``(13 i + 7 k + seed) mod 31 - 15``, an integer in [-15, 15]. The one formula of
  every verifiable input (``verify``, ``bench``, ``fusion``).

  Example:
    >>> int(rank_coded(1, 2))
    12
  """
  return (13 * i + 7 * k + seed) % 31 - 15


def verifiable_input(p: int, shape: tuple[int, ...], dtype, seed: int = 0) -> np.ndarray:
  """Rank-coded integers in [-15, 15]: ``x[i, k] = (13 i + 7 k + seed) mod 31 - 15``.

  Any partial sum over at most 8 participants stays below 2^8 in magnitude, so it
  is exact even in bfloat16, whatever the order; a chunk sent to the wrong place
  changes the answer.
  """
  n = int(np.prod(shape, dtype=np.int64))
  i = np.arange(p)[:, None]
  k = np.arange(n)[None, :]
  return rank_coded(i, k, seed).reshape((p, *shape)).astype(jnp.dtype(dtype))


def random_input(p: int, shape: tuple[int, ...], dtype, seed: int = 0) -> np.ndarray:
  """Standard-normal floats, or int32 over the full range (sums wrap, exactly)."""
  rng = np.random.default_rng(seed)
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.integer):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=(p, *shape), dtype=dtype, endpoint=True)
  return rng.standard_normal((p, *shape)).astype(dtype)


def special_input(p: int, shape: tuple[int, ...], dtype, seed: int = 0) -> np.ndarray:
  """``T[p, V, *shape]``: variant ``v`` plants pattern ``SPECIALS[v]`` at every even
  position (rotating which participant holds the special value) and keeps verifiable
  values at odd ones, so a special value that leaks into a neighbour shows up."""
  n = int(np.prod(shape, dtype=np.int64))
  base = verifiable_input(p, (n,), np.float64, seed)  # f64[p, n]
  out = np.empty((p, len(SPECIALS), n))
  for v, (_, make) in enumerate(SPECIALS):
    out[:, v] = base
    for k in range(0, n, 2):
      out[:, v, k] = make(base[:, k], k // 2 + v)
  return out.reshape((p, len(SPECIALS), *shape)).astype(jnp.dtype(dtype))


def special_label(shape: tuple[int, ...], flat_index: int) -> str:
  """Which pattern of :func:`special_input` sits at ``flat_index`` of a block."""
  n = max(int(np.prod(shape, dtype=np.int64)), 1)
  v, k = divmod(flat_index, n)
  return SPECIALS[v][0] if k % 2 == 0 else "verifiable value"


def subnormal_input(p: int, shape: tuple[int, ...], dtype, seed: int = 0) -> np.ndarray:
  """Rank-coded subnormals: ``x[i, k] = ((13 i + 7 k + seed) mod 31 - 15) · s`` with ``s``
  the dtype's smallest subnormal (``1.4e-45`` in float32), so every participant holds a
  different value below ``finfo.tiny`` (both signs, and zeros). XLA:CPU compares floats
  with denormals as zero; ``max``/``min`` must still match the oracle bit for bit.
  Checked for ``max``/``min`` only: sums of subnormals are flushed to zero by XLA:CPU,
  kept on purpose (``allreduce_jax._ops``)."""
  tiny = float(jnp.finfo(jnp.dtype(dtype)).smallest_subnormal)
  return (verifiable_input(p, shape, np.float64, seed) * tiny).astype(jnp.dtype(dtype))


_MAKERS = {
  "verifiable": verifiable_input,
  "random": random_input,
  "special": special_input,
  "subnormal": subnormal_input,
}


def _valid(op: str, dtype: str, kind: str) -> bool:
  integer = jnp.issubdtype(jnp.dtype(dtype), jnp.integer)
  if kind == "subnormal":  # max/min of floats (sums flush subnormals: kept, see _ops)
    return not integer and op in ("max", "min")
  return not (integer and (op == "mean" or kind == "special"))


def _bits(a: np.ndarray) -> np.ndarray:
  return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind in "fV" or a.dtype.itemsize == 2 else a


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
  """Bitwise equality, counting any two NaNs as equal (payloads may differ)."""
  if a.shape != b.shape or a.dtype != b.dtype:
    return False
  if jnp.issubdtype(a.dtype, jnp.integer):
    return bool(np.array_equal(a, b))
  af, bf = a.astype(np.float64), b.astype(np.float64)
  nan_a, nan_b = np.isnan(af), np.isnan(bf)
  if not np.array_equal(nan_a, nan_b):
    return False
  return bool(np.array_equal(_bits(a)[~nan_a], _bits(b)[~nan_b]))


def _identical(a: np.ndarray, b: np.ndarray) -> bool:
  """The same bits, NaN signs and payloads included (what participants must hold)."""
  return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(_bits(a), _bits(b)))


def _ulp(dtype) -> float:
  return float(jnp.finfo(jnp.dtype(dtype)).eps)


@dataclass(frozen=True)
class Agreement:
  """How a result compares with the oracle: ``bad`` of ``total`` elements differ
  (beyond ``tol``), the first at flat index ``first``."""

  ok: bool
  exact: bool
  err: float
  bad: int
  total: int
  first: int | None


def agreement(got: np.ndarray, want: np.ndarray, op: str, tol: float = 0.0) -> Agreement:
  """Compares ``got`` with the oracle's ``want`` (same shape and dtype).

  NaN must be where the oracle has NaN; infinities must match exactly; finite values
  within ``tol``. ``max``/``min`` compare bits, so ``-0.0`` and ``+0.0`` differ; a sum's
  zero may have either sign (see ``allreduce_jax._ops``).
  """
  got, want = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
  if jnp.issubdtype(got.dtype, jnp.integer):
    diff = got != want
    err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0))
    exact = not diff.any()
  else:
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan_g, nan_w = np.isnan(g), np.isnan(w)
    both = ~nan_g & ~nan_w
    finite = both & np.isfinite(g) & np.isfinite(w)
    with np.errstate(invalid="ignore"):
      delta = np.where(finite, np.abs(g - w), 0.0)
    err = float(np.max(delta, initial=0.0))
    unequal = both & (g != w)
    if op in ("max", "min"):
      unequal |= both & (np.signbit(g) != np.signbit(w))
    exact = not ((nan_g != nan_w) | unequal).any()
    diff = (nan_g != nan_w) | (both & ~finite & (g != w)) | (finite & (delta > tol))
    if op in ("max", "min"):
      diff |= unequal
  bad = int(diff.sum())
  return Agreement(bad == 0, exact, err, bad, got.size, int(np.argmax(diff)) if bad else None)


def _fmt(v) -> str:
  v = float(v)
  if v == 0:
    return "-0.0" if np.signbit(v) else "0.0"
  return f"{v:.6g}"


def describe(
  a: Agreement, got: np.ndarray, want: np.ndarray, shape, label=None, where: str = ""
) -> str:
  """``'3 of 26 elements differ; first at [0, 2] (NaN on one participant): got 3, oracle nan'``."""
  if a.ok:
    return ""
  got, want = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
  index = [int(i) for i in np.unravel_index(a.first, shape)] if shape else []
  what = f" ({label(a.first)})" if label else ""
  return (
    f"{a.bad} of {a.total} elements differ{where}; first at {index}{what}:"
    f" got {_fmt(got[a.first])}, oracle {_fmt(want[a.first])}"
  )


def _tolerance(x: np.ndarray, want: np.ndarray, op: str, kind: str, p: int) -> float:
  integer = jnp.issubdtype(x.dtype, jnp.integer)
  w = want.astype(np.float64)
  w = w[np.isfinite(w)]
  if integer or op in ("max", "min"):
    return 0.0
  if kind != "random":
    # Exact sums; a mean is one rounded division (2 ulp of the result).
    return 2 * _ulp(x.dtype) * float(np.max(np.abs(w), initial=0.0)) if op == "mean" else 0.0
  # Summation in some order: within (p-1)·eps·Σ|x_i| of the exact sum (twice, to
  # cover the final rounding and a different order of the same bound).
  bound = np.sum(np.abs(x.astype(np.float64)), axis=0)
  if op == "mean":
    bound = bound / p
  return float(2 * max(p - 1, 1) * _ulp(x.dtype) * np.max(bound, initial=0.0))


def _labeler(kind: str, shape: tuple[int, ...]):
  return (lambda f: special_label(shape, f)) if kind == "special" else None


def _mesh_and_axis(algorithm: str, p: int):
  if ALGORITHMS[algorithm].axes == 2 and jax.process_count() > 1:
    # One mesh axis per process level: outer = processes, inner = local devices.
    if p != jax.device_count():
      raise ValueError(
        f"across processes {algorithm} needs all {jax.device_count()} devices, got p={p}."
      )
    return devices.process_mesh(("outer", "inner")), ("outer", "inner")
  return devices.mesh_for(algorithm, p)


def _place(inputs: dict, mesh, spec) -> dict:
  sharding = NamedSharding(mesh, spec)
  return {
    k: devices.put(v.shape, v.dtype, sharding, lambda index, v=v: v[index])
    for k, v in inputs.items()
  }


def lossy_tolerance(algorithm: str, x: np.ndarray, op: str, wire: str | None, p: int) -> float:
  """The stated bound of a lossy wire format (``_wire``): every quantization on an
  element's path adds at most ``u`` x its block's absmax, which is at most the largest
  Σ_i |x_i| (x 1.01 for the earlier errors); no path has more quantizations than the
  schedule has steps. 0.0 for an exact wire."""
  fmt = _wire.get(wire)
  if not fmt.lossy:
    return 0.0
  record = ALGORITHMS[algorithm]
  n = max(1, int(np.prod(x.shape[1:])))
  steps = record.schedule(p, 4.0 * n, devices.inner_size(algorithm, p)).steps
  bound = float(np.max(np.sum(np.abs(x.astype(np.float64)), axis=0), initial=0.0))
  return 1.01 * steps * fmt.unit_error * bound / (p if op == "mean" else 1)


def run_case(
  algorithm: str,
  p: int,
  ops=OPS,
  dtypes=DTYPES,
  kinds=KINDS,
  shapes=SHAPES,
  seed: int = 0,
  wire: str | None = None,
) -> list[Row]:
  """Runs ``algorithm`` on ``p`` participants for every op × dtype × kind × shape in
  one compiled program; compares each result, and XLA's collective's, with the oracle.

  With a lossy ``wire`` (``all_reduce(..., wire=...)``) only sum/mean of float inputs
  that are not special values are run, and a result passes when every participant
  holds the same bits and it is within :func:`lossy_tolerance` of the oracle."""
  lossy = _wire.get(wire).lossy
  if lossy:
    ops = tuple(op for op in ops if op in ("sum", "mean"))
    dtypes = tuple(d for d in dtypes if jnp.issubdtype(jnp.dtype(d), jnp.floating))
    kinds = tuple(k for k in kinds if k != "special")
  mesh, axis = _mesh_and_axis(algorithm, p)
  spec = P(axis)
  inputs = {}
  for kind in kinds:
    for dtype in dtypes:
      for shape in shapes:
        if any(_valid(op, dtype, kind) for op in ops):
          inputs[(kind, dtype, shape)] = _MAKERS[kind](p, shape, dtype, seed)

  def body(blocks):
    out = {}
    for (kind, dtype, shape), block in blocks.items():
      x = block[0]  # T[*shape] (T[V, *shape] for special inputs): this participant's block
      for op in ops:
        if _valid(op, dtype, kind):
          got = all_reduce(x, axis, op=op, algorithm=algorithm, wire=wire)
          ref = get_op(op, x.dtype).reference(x, axis)
          out[(kind, dtype, shape, op)] = (got[None], ref[None])
    return out

  fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
  results = fn(_place(inputs, mesh, spec))
  hand_written = getattr(ALGORITHMS[algorithm], "hand_written", True)
  rows = []
  for (kind, dtype, shape, op), (got, ref) in results.items():
    got, ref = devices.fetch(got), devices.fetch(ref)
    x = inputs[(kind, dtype, shape)]
    want = oracle(op, x)
    tol = _tolerance(x, want, op, kind, p)
    label = _labeler(kind, shape)
    a = agreement(got[0], want, op, tol + lossy_tolerance(algorithm, x, op, wire, p))
    if op == "mean":  # exact sum, then the backend's division (not correctly rounded on CPU)
      exact = agreement(got[0], _backend_mean(x, p), op).exact
      a = Agreement(a.ok, exact, a.err, a.bad, a.total, a.first)
    replicas = all(_identical(got[k], got[0]) for k in range(p))  # NaN bits too
    detail = describe(a, got[0], want, want.shape, label)
    if not replicas:
      detail = "participants hold different results" + (f"; {detail}" if detail else "")
    b = agreement(ref[0], want, op, tol)
    ref_replicas = all(_identical(ref[k], ref[0]) for k in range(p))
    backend = describe(b, ref[0], want, want.shape, label)
    if not ref_replicas:
      backend = "participants hold different results" + (f"; {backend}" if backend else "")
    patterns = _patterns(b, ref[0], want, op, tol, label)
    tol += lossy_tolerance(algorithm, x, op, wire, p)  # the algorithm's, not the backend's
    passed = (replicas and a.ok and (tol > 0 or a.exact)) or not hand_written
    rows.append(
      Row(
        algorithm,
        op,
        dtype,
        p,
        kind,
        shape,
        a.err,
        a.exact,
        replicas,
        tol,
        passed,
        detail,
        f"lax.{get_op(op, x.dtype).reference.__name__}",
        backend,
        b.bad,
        patterns,
        wire,
      )
    )
  return rows


def _backend_mean(x: np.ndarray, p: int) -> np.ndarray:
  """The exact sum divided by ``p`` on a local device, as ``mean`` finalizes it.

  XLA:CPU's float division is not correctly rounded (``x / 3`` can be 1 ulp off
  NumPy's), so ``mean`` passes within 2 ulp of the oracle and is *bit-exact* when it
  equals this: proof that the sum before the division was exact.
  """
  total = jax.device_put(oracle("sum", x), jax.local_devices()[0])
  return np.asarray(get_op("mean", x.dtype).finalize(total, p))


def _patterns(a: Agreement, got, want, op, tol, label) -> tuple[str, ...]:
  """The special-input patterns at which ``got`` differs (empty without labels)."""
  if a.ok or label is None:
    return ()
  got, want = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
  names = []
  for f in range(got.size):
    if not agreement(got[f : f + 1], want[f : f + 1], op, tol).ok and label(f) not in names:
      names.append(label(f))
  return tuple(names)


def summarize(rows: list[Row]) -> list[dict]:
  """One line per (algorithm, op, dtype, p): worst error, exactness on verifiable
  inputs, and PASS only if every kind and shape passed."""
  groups: dict[tuple, list[Row]] = {}
  for r in rows:
    groups.setdefault((r.algorithm, r.op, r.dtype, r.p), []).append(r)
  table = []
  for (algorithm, op, dtype, p), rs in groups.items():
    exact_rows = [r for r in rs if r.kind == "verifiable"]
    table.append(
      {
        "algorithm": algorithm,
        "op": op,
        "dtype": dtype,
        "p": p,
        "max_abs_err": max(r.max_abs_err for r in rs),
        "bit_exact": all(r.bit_exact for r in exact_rows),
        "passed": all(r.passed for r in rs),
        # the backend's own collective as the algorithm, differing from the oracle
        "backend": any(r.detail for r in rs if r.passed),
        "cases": len(rs),
      }
    )
  return table


def _result(t: dict) -> str:
  if not t["passed"]:
    return "FAIL"
  return "backend" if t["backend"] else "PASS"


def format_table(table: list[dict]) -> str:
  w = max([20, *(len(t["algorithm"]) + 2 for t in table)])  # a name is always followed by a space
  head = (
    f"{'algorithm':<{w}}{'op':<6}{'dtype':<10}{'p':>3}  {'max|err| vs oracle':>18}"
    f"  {'bit-exact':>9}  result"
  )
  lines = [head, "-" * len(head)]
  for t in table:
    lines.append(
      f"{t['algorithm']:<{w}}{t['op']:<6}{t['dtype']:<10}{t['p']:>3}  {t['max_abs_err']:>18.3g}"
      f"  {'yes' if t['bit_exact'] else 'no':>9}  {_result(t)}"
    )
  return "\n".join(lines)


def failures(rows: list[Row]) -> list[str]:
  """One line per failed cell: where the algorithm differs from the oracle."""
  return [
    f"FAIL {r.algorithm} {r.op} {r.dtype} p={r.p} {r.kind} shape={list(r.shape)}: {r.detail}"
    for r in rows
    if not r.passed
  ]


def findings(rows: list[Row]) -> list[str]:
  """Backend findings, one line per (collective, op, dtype, p, input kind): where XLA's
  collective differs from the oracle, counted over the shapes."""
  cells: dict[tuple, dict] = {}
  for r in rows:
    sources = [(r.reference, r.backend, r.backend_bad, r.backend_patterns)]
    if r.passed and r.detail and r.detail != r.backend:  # the backend's collective as algorithm
      sources.append((f"{r.reference} (algorithm {r.algorithm})", r.detail, 0, ()))
    for who, text, bad, patterns in sources:
      cell = cells.setdefault((who, r.op, r.dtype, r.p, r.kind), {"shapes": {}, "seen": set()})
      cell["seen"].add(r.shape)
      if text:
        cell["shapes"].setdefault(r.shape, (text, bad, patterns))
  lines = []
  for (who, _op, dtype, p, kind), cell in cells.items():
    shapes = cell["shapes"]
    if not shapes:
      continue
    first_shape, (first, _, _) = next(iter(shapes.items()))
    patterns = []
    for _, _, ps in shapes.values():
      patterns += [q for q in ps if q not in patterns]
    what = f" [{'; '.join(patterns)}]" if patterns else ""
    lines.append(
      f"backend finding: {who} {dtype} p={p} {kind} inputs: differs from the NumPy oracle"
      f" in {len(shapes)} of {len(cell['seen'])} shapes{what}; shape {list(first_shape)}: {first}"
    )
  return lines


def configure(parser: argparse.ArgumentParser) -> None:
  add_devices(parser)
  add_algorithms(parser, f"comma-separated subset of {', '.join(ALGORITHMS)} (default: all)")
  parser.add_argument(
    "--participants",
    type=csv_list,
    default=None,
    help="comma-separated participant counts (default: --devices)",
  )
  parser.add_argument("--ops", type=csv_list, default=list(OPS), help="default: sum,mean,max,min")
  parser.add_argument(
    "--dtypes", type=csv_list, default=list(DTYPES), help=f"default: {','.join(DTYPES)}"
  )
  parser.add_argument(
    "--kinds", type=csv_list, default=list(KINDS), help=f"input kinds (default: {','.join(KINDS)})"
  )
  parser.add_argument(
    "--shapes",
    type=csv_list,
    default=None,
    help="per-participant block shapes like 13,3x7 ('scalar' for 0-d; default: scalar,1,13,3x7)",
  )
  parser.add_argument(
    "--strict",
    action="store_true",
    help="exit 1 on backend findings too (XLA's collective differing from the NumPy oracle)",
  )
  parser.add_argument(
    "--backend-oracle",
    action="store_true",
    help="check the backend's own psum, pmean, pmax, pmin, psum_scatter and all_gather"
    " (all devices, across processes) against the NumPy oracle and the hand-written ring",
  )
  parser.add_argument(
    "--repeat",
    type=int,
    default=1,
    help="with --backend-oracle: run the checked program this many times (intermittent bugs)",
  )
  parser.add_argument(
    "--out", default=None, help="also write every compared case as JSON Lines (appended)"
  )
  parser.add_argument("--fresh", action="store_true", help="empty --out first")
  parser.add_argument(
    "--wire",
    default="none",
    choices=["none", *(w for w in _wire.WIRES if w)],
    help="wire format (all_reduce(..., wire=...)); a lossy one checks sum/mean of float"
    " inputs against its stated error bound and identical replicas",
  )


def _parse(args: argparse.Namespace):
  algorithms = args.algorithms or list(ALGORITHMS)
  for a in algorithms:
    if a not in ALGORITHMS:
      raise SystemExit(f"--algorithms: unknown {a!r}; expected some of {', '.join(ALGORITHMS)}")
  for op in args.ops:
    if op not in OPS:
      raise SystemExit(f"--ops: unknown {op!r}; expected some of {', '.join(OPS)}")
  for d in args.dtypes:
    try:
      jnp.dtype(d)
    except TypeError:
      raise SystemExit(f"--dtypes: unknown dtype {d!r}") from None
    for op in args.ops:
      if op == "mean" and jnp.issubdtype(jnp.dtype(d), jnp.integer):
        continue  # skipped: an integer mean is not defined
      try:
        get_op(op, d)
      except TypeError as e:
        raise SystemExit(f"--dtypes {d} with --ops {op}: {e}") from None
  for k in args.kinds:
    if k not in KINDS:
      raise SystemExit(f"--kinds: unknown {k!r}; expected some of {', '.join(KINDS)}")
  shapes = SHAPES
  if args.shapes:
    try:
      shapes = tuple(
        () if s == "scalar" else tuple(int(d) for d in s.split("x")) for s in args.shapes
      )
    except ValueError:
      raise SystemExit(f"--shapes: expected e.g. scalar,13,3x7; got {args.shapes}") from None
    if any(d < 1 for shape in shapes for d in shape):
      raise SystemExit(f"--shapes: dimensions must be positive; got {args.shapes}")
  if args.repeat < 1:
    raise SystemExit(f"--repeat: must be at least 1, got {args.repeat}")
  return algorithms, shapes


def run(args: argparse.Namespace) -> int:
  if args.devices is not None and args.devices < 1:
    raise SystemExit(f"--devices: must be at least 1, got {args.devices}")
  algorithms, shapes = _parse(args)
  # A foreign, unwritable or busy --out: refused now (the lock is held until the end).
  store = row_store(args.out, "verify", fresh=args.fresh, context={}) if args.out else None
  try:
    args.devices = devices.use_cpu_devices(args.devices)
  except ValueError as e:
    raise SystemExit(str(e)) from None
  try:
    ps = [int(v) for v in args.participants] if args.participants else [len(jax.devices())]
  except ValueError:
    raise SystemExit(f"--participants: expected integers, got {args.participants}") from None
  for p in ps:
    if not 1 <= p <= len(jax.devices()):
      raise SystemExit(f"--participants: {p} is outside 1..{len(jax.devices())} devices")
    if jax.process_count() > 1 and p != jax.device_count():
      raise SystemExit(
        f"--participants: {p}; across {jax.process_count()} processes every one of the"
        f" {jax.device_count()} devices takes part"
      )
  _check_memory(args, ps, shapes)
  print(
    f"# verify{' --backend-oracle' if args.backend_oracle else ''}: jax {jax.__version__},"
    f" backend {jax.default_backend()}, {len(jax.devices())} devices,"
    f" {jax.process_count()} process(es)",
    flush=True,
  )
  if args.backend_oracle:
    return run_backend_oracle(args, ps, shapes, store)
  rows: list[Row] = []
  t0 = time.perf_counter()
  wire = None if args.wire == "none" else args.wire
  skipped = [a for a in algorithms if wire not in ALGORITHMS[a].wires]
  if skipped:
    print(f"# --wire {wire}: skipping {', '.join(skipped)} (cannot send in it)", flush=True)
  for algorithm in (a for a in algorithms if a not in skipped):
    for p in ps:
      rows += run_case(
        algorithm,
        p,
        ops=tuple(args.ops),
        dtypes=tuple(args.dtypes),
        kinds=tuple(args.kinds),
        shapes=shapes,
        wire=wire,
      )
  table = summarize(rows)
  print(format_table(table))
  for line in failures(rows):
    print(line)
  found = findings(rows)
  failed = [t for t in table if not t["passed"]]
  passed = [t for t in table if t["passed"] and not t["backend"]]
  print(
    f"# {len(passed)} passed, {len(failed)} failed"
    + (
      f", {len(table) - len(passed) - len(failed)} backend"
      if len(passed) + len(failed) < len(table)
      else ""
    )
    + f" ({len(rows)} cases compared with the NumPy oracle in {time.perf_counter() - t0:.1f} s)"
  )
  _print_findings(found, args.strict)
  _write(store, [asdict(r) for r in rows], ("algorithm", "op", "dtype", "p", "input_kind", "shape"))
  return 1 if failed or (args.strict and found) else 0


def _check_memory(args: argparse.Namespace, ps: list[int], shapes) -> None:
  """Before allocating: one program's inputs, results (the algorithm's and XLA's, per
  op) and the float64 oracle fit in memory; else one line saying what fits."""
  p = max(ps)
  per_element = 0  # bytes per element of a block, over every dtype and kind
  for kind in args.kinds:
    copies = len(SPECIALS) if kind == "special" else 1
    for d in args.dtypes:
      ops = [op for op in args.ops if _valid(op, d, kind)]
      per_element += copies * p * (jnp.dtype(d).itemsize * (1 + 2 * len(ops)) + 16)
  biggest = max(int(np.prod(s, dtype=np.int64)) for s in shapes)
  elements = sum(int(np.prod(s, dtype=np.int64)) for s in shapes)

  have = available_memory() or 0
  fits = have // max(per_element, 1)
  check_memory(
    elements * per_element,
    f"--shapes {','.join('x'.join(map(str, s)) or 'scalar' for s in shapes)} at p={p}"
    f" ({biggest} elements per block)",
    f"blocks of at most about {fits} elements fit with these --dtypes, --kinds and --ops",
  )


def _print_findings(found: list[str], strict: bool) -> None:
  if not found:
    print("# backend: XLA's collectives agree with the NumPy oracle on every input checked")
    return
  print(
    f"# {len(found)} backend finding(s): the backend's own collective differs from the NumPy"
    " oracle (the semantics in allreduce_jax/_ops.py)"
    + ("; --strict makes these fail" if not strict else "; failing (--strict)")
  )
  for line in found:
    print(line)


#: What every verify row was compared with (its ``reference`` field).
REFERENCE = "numpy oracle (allreduce_jax._ops.oracle)"


def stored(record: dict) -> dict:
  """A verify record as a row: the row store owns ``kind`` (``"verify"``), so the input
  kind is ``input_kind``; ``reference`` names the NumPy oracle every result was
  compared with, ``backend_collective`` XLA's collective run beside it (a finding where
  it differs, not a failure).

  Example:
    >>> stored({"kind": "special", "reference": "lax.pmax", "passed": True})
    {'input_kind': 'special', 'reference': 'numpy oracle (allreduce_jax._ops.oracle)', 'backend_collective': 'lax.pmax', 'passed': True}
  """
  out = {"input_kind": record["kind"], "reference": REFERENCE}
  if "reference" in record:
    out["backend_collective"] = record["reference"]
  return out | {k: v for k, v in record.items() if k not in ("kind", "reference")}


def _write(store, records: list[dict], fields: tuple[str, ...]) -> None:
  """Appends the rows to ``store`` (``--out``) as :func:`stored` writes them, keyed on
  the compared cell's ``fields``: earlier runs' rows stay (a rerun of a cell adds its
  newer row, which ``RowStore.done`` prefers)."""
  if store is None or jax.process_index() != 0:  # every process holds the same rows
    return
  rows = [stored(r) for r in records]
  store.extend(rows, [store.key({f: r[f] for f in fields}) for r in rows])


# -- the backend's own collectives ---------------------------------------------------


def _collective_valid(name: str, dtype: str, kind: str) -> bool:
  op = {"pmean": "mean", "pmax": "max", "pmin": "min"}.get(name, "sum")
  return _valid(op, dtype, kind)  # all_gather: as sum (no special values in integers)


def backend_case(
  p: int,
  collectives=COLLECTIVES,
  dtypes=DTYPES,
  kinds=KINDS,
  shapes=SHAPES,
  seed: int = 0,
  repeat: int = 1,
) -> list[dict]:
  """Runs XLA's ``collectives`` on ``p`` devices (every process's, in a multi-process
  run) next to the hand-written ring, and compares both with the NumPy oracle.

  ``psum``/``pmean``/``pmax``/``pmin`` reduce a block ``T[*shape]``; ``psum_scatter``
  reduces ``T[p, *shape]`` and leaves participant ``j`` with the sum of row ``j``
  (``ring_reduce_scatter``); ``all_gather`` stacks the blocks (``ring_all_gather``).
  Returns one record per (collective, dtype, kind, shape, repetition).
  """
  mesh, axis = devices.submesh((p,), ("i",)), "i"
  spec = P(axis)
  inputs = {}
  for kind in kinds:
    for dtype in dtypes:
      for shape in shapes:
        for name in collectives:
          if _collective_valid(name, dtype, kind):
            block = (p, *shape) if name == "psum_scatter" else shape
            inputs[(name, kind, dtype, shape)] = _MAKERS[kind](p, block, dtype, seed)

  def body(blocks):
    out = {}
    for (name, kind, dtype, shape), block in blocks.items():
      x = block[0]  # T[*block]: this participant's
      flat = x.reshape(-1)
      if name == "psum_scatter":
        xla = lax.psum_scatter(flat, axis, scatter_dimension=0, tiled=True)
        hand = ring_reduce_scatter(flat, axis, lax.add)
      elif name == "all_gather":
        xla = lax.all_gather(flat, axis, axis=0, tiled=True)
        hand = ring_all_gather(flat, axis)
      else:
        op = {"psum": "sum", "pmean": "mean", "pmax": "max", "pmin": "min"}[name]
        xla = get_op(op, x.dtype).reference(flat, axis)
        hand = all_reduce(flat, axis, op=op, algorithm="ring")
      out[(name, kind, dtype, shape)] = (xla[None], hand[None])
    return out

  fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
  placed = _place(inputs, mesh, spec)
  records = []
  for rep in range(repeat):
    results = fn(placed)
    for key, (xla, hand) in results.items():
      name, kind, dtype, shape = key
      x = inputs[key]
      xla, hand = devices.fetch(xla), devices.fetch(hand)  # T[p, m]: per participant
      records.append(_backend_record(name, kind, dtype, shape, x, xla, hand, p, rep))
  return records


def _backend_record(name, kind, dtype, shape, x, xla, hand, p, rep) -> dict:
  flat = x.reshape(p, -1)  # T[p, n]: participant i's block, flattened
  op = {"pmean": "mean", "pmax": "max", "pmin": "min"}.get(name, "sum")
  n = flat.shape[1]
  label = _labeler(kind, shape)
  label_at = (lambda f: label(f % n)) if label else None  # result index -> input pattern
  if name == "all_gather":
    want = np.broadcast_to(flat.reshape(-1), (p, p * n))  # every participant: all blocks
    tol = 0.0
  elif name == "psum_scatter":
    total = oracle("sum", flat)  # T[n] = T[p*m]
    want = total.reshape(p, -1)  # participant j: chunk j, i.e. flat index j*m + e
    tol = _tolerance(flat, total, "sum", kind, p)
    label_at = _labeler(kind, (p, *shape))
  else:
    want = np.broadcast_to(oracle(op, flat), (p, n))
    tol = _tolerance(flat, want[0], op, kind, p)
  b = agreement(xla, want, op, tol)
  h = agreement(hand, want, op, tol)
  return {
    "collective": f"lax.{name}",
    "kind": kind,
    "dtype": dtype,
    "shape": list(shape),
    "p": p,
    "repetition": rep,
    "elements": int(want.size),
    "differ": b.bad,
    "max_abs_err": b.err,
    "tolerance": tol,
    "first": describe(b, xla, want, want.shape, label_at),
    "patterns": list(_patterns(b, xla, want, op, tol, label_at)),
    "hand_written_differ": h.bad,
    "hand_written_first": describe(h, hand, want, want.shape, label_at),
    "agrees_with_hand_written": bool(_same_bits(xla, hand) if tol == 0 else b.ok and h.ok),
  }


def run_backend_oracle(args: argparse.Namespace, ps: list[int], shapes, store=None) -> int:
  t0 = time.perf_counter()
  records = []
  for p in ps:
    records += backend_case(
      p, dtypes=tuple(args.dtypes), kinds=tuple(args.kinds), shapes=shapes, repeat=args.repeat
    )
  cells: dict[tuple, list[dict]] = {}
  for r in records:
    cells.setdefault((r["collective"], r["dtype"], r["p"], r["kind"]), []).append(r)
  head = (
    f"{'collective':<18}{'dtype':<10}{'p':>3}  {'kind':<11}{'checked':>10}  {'differ':>7}"
    f"  {'hand-written':>12}  result"
  )
  print(head)
  print("-" * len(head))
  found, broken = [], []
  for (name, dtype, p, kind), rs in cells.items():
    elements = sum(r["elements"] for r in rs)
    differ = sum(r["differ"] for r in rs)
    hand_differ = sum(r["hand_written_differ"] for r in rs)
    result = "agrees" if not differ else "DIFFERS"
    print(
      f"{name:<18}{dtype:<10}{p:>3}  {kind:<11}{elements:>10}  {differ:>7}"
      f"  {'ok' if not hand_differ else 'FAIL':>12}  {result}"
    )
    bad = [r for r in rs if r["differ"]]
    if bad:
      patterns = []
      for r in bad:
        patterns += [q for q in r["patterns"] if q not in patterns]
      reps = sorted({r["repetition"] for r in bad})
      first = bad[0]
      found.append(
        f"backend finding: {name} {dtype} p={p} {kind} inputs: {differ} of {elements}"
        f" elements differ from the NumPy oracle"
        + (f" [{'; '.join(patterns)}]" if patterns else "")
        + (f" in {len(reps)} of {args.repeat} repetitions" if args.repeat > 1 else "")
        + f"; shape {first['shape']}: {first['first']}"
        + ("; the hand-written ring gives the oracle's values" if not hand_differ else "")
      )
    for r in rs:
      if r["hand_written_differ"]:
        broken.append(
          f"FAIL hand-written ring for {name} {dtype} p={p} {kind} shape={r['shape']}:"
          f" {r['hand_written_first']}"
        )
  for line in broken:
    print(line)
  agree = sum(1 for rs in cells.values() if not sum(r["differ"] for r in rs))
  print(
    f"# backend oracle: {agree} of {len(cells)} (collective, dtype, p, kind) cells agree with"
    f" the NumPy oracle, {len(found)} differ; hand-written: {len(broken)} failed"
    f" ({len(records)} results in {time.perf_counter() - t0:.1f} s)"
  )
  _print_findings(found, args.strict)
  _write(store, records, ("collective", "input_kind", "dtype", "shape", "p", "repetition"))
  return 1 if broken or (args.strict and found) else 0
