"""What ``verify`` and its backend oracle share: the inputs and the comparison with NumPy.

The inputs (:func:`verifiable_input`, :func:`random_input`, :func:`special_input`,
:func:`subnormal_input`; :data:`MAKERS` by kind, :func:`valid` for which op takes
which) and the comparison of a result with the oracle
(:func:`allreduce_jax._ops.oracle`): :func:`agreement` (NaN where the oracle has NaN,
infinities exact, finite values within a tolerance, signed zeros for max/min),
:func:`tolerance` (0 on exact inputs, the summation bound on random ones),
:func:`describe` and :func:`special_patterns` (where and at which special pattern a result
differs), :func:`same_bits` / :func:`identical`; and the rows both write
(:func:`stored`, :func:`write_rows`). :mod:`allreduce_jax.tools.verify` checks the
algorithms with them, :mod:`allreduce_jax.tools.backend_oracle` the backend's own
collectives.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from allreduce_jax import devices

__all__ = [
  "DTYPES",
  "KINDS",
  "MAKERS",
  "REFERENCE",
  "SHAPES",
  "SPECIALS",
  "Agreement",
  "agreement",
  "describe",
  "identical",
  "labeler",
  "place",
  "print_findings",
  "random_input",
  "rank_coded",
  "same_bits",
  "special_input",
  "special_label",
  "special_patterns",
  "stored",
  "subnormal_input",
  "tolerance",
  "valid",
  "verifiable_input",
  "write_rows",
]

DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16", "int32")
KINDS: tuple[str, ...] = ("verifiable", "random", "special", "subnormal")
SHAPES: tuple[tuple[int, ...], ...] = ((), (1,), (13,), (3, 7))


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


MAKERS = {
  "verifiable": verifiable_input,
  "random": random_input,
  "special": special_input,
  "subnormal": subnormal_input,
}


def valid(op: str, dtype: str, kind: str) -> bool:
  """Whether ``op`` is checked on ``dtype`` inputs of ``kind`` (no mean or special
  values of integers; subnormals for float max/min only)."""
  integer = jnp.issubdtype(jnp.dtype(dtype), jnp.integer)
  if kind == "subnormal":  # max/min of floats (sums flush subnormals: kept, see _ops)
    return not integer and op in ("max", "min")
  return not (integer and (op == "mean" or kind == "special"))


def _bits(a: np.ndarray) -> np.ndarray:
  return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind in "fV" or a.dtype.itemsize == 2 else a


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
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


def identical(a: np.ndarray, b: np.ndarray) -> bool:
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


def tolerance(x: np.ndarray, want: np.ndarray, op: str, kind: str, p: int) -> float:
  """How far a result may be from the oracle's ``want`` for inputs ``x: T[p, ...]``:
  0 for integers, max/min and exact sums; 2 ulp for a mean; the summation bound on
  random inputs."""
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


def labeler(kind: str, shape: tuple[int, ...]):
  """``flat index -> special pattern name`` for special inputs (None otherwise)."""
  return (lambda f: special_label(shape, f)) if kind == "special" else None


def place(inputs: dict, mesh, spec) -> dict:
  """Every input ``T[p, ...]`` put on ``mesh`` sharded by ``spec`` (each process
  places its own devices' blocks)."""
  sharding = NamedSharding(mesh, spec)
  return {
    k: devices.put(v.shape, v.dtype, sharding, lambda index, v=v: v[index])
    for k, v in inputs.items()
  }


def special_patterns(a: Agreement, got, want, op, tol, label) -> tuple[str, ...]:
  """The special-input patterns at which ``got`` differs (empty without labels)."""
  if a.ok or label is None:
    return ()
  got, want = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
  names = []
  for f in range(got.size):
    if not agreement(got[f : f + 1], want[f : f + 1], op, tol).ok and label(f) not in names:
      names.append(label(f))
  return tuple(names)


def print_findings(found: list[str], strict: bool) -> None:
  """The backend findings (or one line saying there are none)."""
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


def write_rows(store, records: list[dict], fields: tuple[str, ...]) -> None:
  """Appends the rows to ``store`` (``--out``) as :func:`stored` writes them, keyed on
  the compared cell's ``fields``: earlier runs' rows stay (a rerun of a cell adds its
  newer row, which ``RowStore.done`` prefers)."""
  if store is None or jax.process_index() != 0:  # every process holds the same rows
    return
  rows = [stored(r) for r in records]
  store.extend(rows, by=fields)
