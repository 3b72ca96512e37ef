"""Verification of every algorithm against XLA's own collectives.

Inputs follow nccl-tests' "verifiable" idea: small integer-valued floats, rank-coded
(participant i's values depend on i and on the position), whose sums are exact in
any order. On them every algorithm must match ``lax.psum``/``pmax``/``pmin``
**bit for bit**, and ``mean`` within 2 ulp. Random inputs (normal floats, full-range
int32) are compared within the floating-point summation bound, and special inputs
check that NaN and ±Inf propagate as in the lax collective.

One jitted program per (algorithm, participant count) computes every op × dtype ×
input kind × shape, custom and reference side by side, so a full verification
compiles only a few dozen programs.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import _devices
from allreduce_jax._api import ALGORITHMS, all_reduce
from allreduce_jax._ops import OPS, get_op
from allreduce_jax.tools._args import add_devices, csv_list

DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16", "int32")
KINDS: tuple[str, ...] = ("verifiable", "random", "special")
SHAPES: tuple[tuple[int, ...], ...] = ((), (1,), (13,), (3, 7))


@dataclass(frozen=True)
class Row:
  """One compared result: a (algorithm, op, dtype, p, kind, shape) cell."""

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


def verifiable_input(p: int, shape: tuple[int, ...], dtype, seed: int = 0) -> np.ndarray:
  """Rank-coded integers in [-15, 15]: ``x[i, k] = (13 i + 7 k + seed) mod 31 - 15``.

  Any partial sum over at most 8 participants stays below 2^8 in magnitude, so it
  is exact even in bfloat16, whatever the order; a chunk sent to the wrong place
  changes the answer.
  """
  n = int(np.prod(shape, dtype=np.int64))
  i = np.arange(p)[:, None]
  k = np.arange(n)[None, :]
  values = (13 * i + 7 * k + seed) % 31 - 15
  return values.reshape((p, *shape)).astype(jnp.dtype(dtype))


def random_input(p: int, shape: tuple[int, ...], dtype, seed: int = 0) -> np.ndarray:
  """Standard-normal floats, or int32 over the full range (sums wrap, exactly)."""
  rng = np.random.default_rng(seed)
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.integer):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=(p, *shape), dtype=dtype, endpoint=True)
  return rng.standard_normal((p, *shape)).astype(dtype)


def special_input(p: int, shape: tuple[int, ...], dtype, seed: int = 0) -> np.ndarray:
  """Verifiable values with NaN, +Inf and -Inf planted on a few participants."""
  x = verifiable_input(p, shape, dtype, seed).reshape(p, -1).copy()
  n = x.shape[1]
  specials = [np.nan, np.inf, -np.inf, np.inf]
  for j, value in enumerate(specials):
    x[(3 * j + 1) % p, (5 * j) % n] = value  # two infs may meet: inf + inf, inf - inf
  return x.reshape((p, *shape))


_MAKERS = {"verifiable": verifiable_input, "random": random_input, "special": special_input}


def _valid(op: str, dtype: str, kind: str) -> bool:
  integer = jnp.issubdtype(jnp.dtype(dtype), jnp.integer)
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


def _ulp(dtype) -> float:
  return float(jnp.finfo(jnp.dtype(dtype)).eps)


def _compare(x: np.ndarray, got: np.ndarray, ref: np.ndarray, op: str, kind: str, p: int):
  """Returns ``(max_abs_err, bit_exact, replicas_identical, tolerance, passed)``.

  ``x``: the inputs ``T[p, ...]``; ``got``: the algorithm's per-participant results
  ``T[p, ...]``; ``ref``: the lax collective's result (row 0 is compared).
  """
  replicas = all(_same_bits(got[k], got[0]) for k in range(p))
  exact = _same_bits(got[0], ref[0])
  g, r = got[0].astype(np.float64), ref[0].astype(np.float64)
  finite = np.isfinite(g) & np.isfinite(r)
  err = float(np.max(np.abs(g[finite] - r[finite]), initial=0.0))
  same_nonfinite = np.array_equal(np.isnan(g), np.isnan(r)) and np.array_equal(
    np.where(finite, 0, np.nan_to_num(g, nan=0.0)), np.where(finite, 0, np.nan_to_num(r, nan=0.0))
  )
  integer = jnp.issubdtype(x.dtype, jnp.integer)
  if integer or op in ("max", "min") or kind != "random":
    # Exact inputs (or ops without rounding): bit-exact, mean within 2 ulp.
    tol = 0.0
    if op == "mean" and not integer:
      tol = 2 * _ulp(x.dtype) * float(np.max(np.abs(r[finite]), initial=0.0))
  else:
    # Summation in a different order: each of the two results is within
    # (p-1)·eps·Σ|x_i| of the exact sum.
    bound = np.sum(np.abs(x.astype(np.float64)), axis=0)
    if op == "mean":
      bound = bound / p
    tol = float(2 * max(p - 1, 1) * _ulp(x.dtype) * np.max(bound, initial=0.0))
  passed = replicas and same_nonfinite and (exact or err <= tol)
  if tol == 0.0:
    passed = passed and exact
  return err, exact, replicas, tol, passed


def _mesh_and_axis(algorithm: str, p: int):
  if ALGORITHMS[algorithm].axes == 2 and jax.process_count() > 1:
    # One mesh axis per process level: outer = processes, inner = local devices.
    if p != jax.device_count():
      raise ValueError(
        f"across processes {algorithm} needs all {jax.device_count()} devices, got p={p}."
      )
    return _devices.process_mesh(("outer", "inner")), ("outer", "inner")
  return _devices.mesh_for(algorithm, p)


def run_case(
  algorithm: str,
  p: int,
  ops=OPS,
  dtypes=DTYPES,
  kinds=KINDS,
  shapes=SHAPES,
  seed: int = 0,
) -> list[Row]:
  """Runs ``algorithm`` on ``p`` participants for every op × dtype × kind × shape in
  one compiled program and compares each result with the lax collective."""
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
      x = block[0]  # T[*shape]: this participant's block
      for op in ops:
        if _valid(op, dtype, kind):
          got = all_reduce(x, axis, op=op, algorithm=algorithm)
          ref = get_op(op, x.dtype).reference(x, axis)
          out[(kind, dtype, shape, op)] = (got[None], ref[None])
    return out

  sharding = NamedSharding(mesh, spec)
  placed = {
    k: _devices.put(v.shape, v.dtype, sharding, lambda index, v=v: v[index])
    for k, v in inputs.items()
  }
  fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
  results = fn(placed)
  rows = []
  for (kind, dtype, shape, op), (got, ref) in results.items():
    got, ref = _devices.fetch(got), _devices.fetch(ref)
    err, exact, replicas, tol, passed = _compare(
      inputs[(kind, dtype, shape)], got, ref, op, kind, p
    )
    rows.append(Row(algorithm, op, dtype, p, kind, shape, err, exact, replicas, tol, passed))
  return rows


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
        "cases": len(rs),
      }
    )
  return table


def format_table(table: list[dict]) -> str:
  head = f"{'algorithm':<20}{'op':<6}{'dtype':<10}{'p':>3}  {'max|err| vs lax':>16}  {'bit-exact':>9}  result"
  lines = [head, "-" * len(head)]
  for t in table:
    lines.append(
      f"{t['algorithm']:<20}{t['op']:<6}{t['dtype']:<10}{t['p']:>3}  {t['max_abs_err']:>16.3g}"
      f"  {'yes' if t['bit_exact'] else 'no':>9}  {'PASS' if t['passed'] else 'FAIL'}"
    )
  return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
  add_devices(parser)
  parser.add_argument(
    "--algorithms",
    type=csv_list,
    default=None,
    help=f"comma-separated subset of {', '.join(ALGORITHMS)} (default: all)",
  )
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
  parser.add_argument("--out", default=None, help="also write every compared case as JSON Lines")


def run(args: argparse.Namespace) -> int:
  _devices.use_cpu_devices(args.devices)
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
  print(
    f"# verify: jax {jax.__version__}, backend {jax.default_backend()},"
    f" {len(jax.devices())} devices, {jax.process_count()} process(es)",
    flush=True,
  )
  rows: list[Row] = []
  t0 = time.perf_counter()
  for algorithm in algorithms:
    for p in ps:
      rows += run_case(
        algorithm,
        p,
        ops=tuple(args.ops),
        dtypes=tuple(args.dtypes),
        kinds=tuple(args.kinds),
        shapes=shapes,
      )
  table = summarize(rows)
  print(format_table(table))
  failed = [t for t in table if not t["passed"]]
  print(
    f"# {len(table) - len(failed)} passed, {len(failed)} failed"
    f" ({len(rows)} cases compared in {time.perf_counter() - t0:.1f} s)"
  )
  if args.out and jax.process_index() == 0:  # every process holds the same rows
    import json
    from pathlib import Path

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
      for r in rows:
        f.write(json.dumps(asdict(r)) + "\n")
  return 1 if failed else 0
