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
the hand-written ring (:mod:`allreduce_jax.tools.backend_oracle`; jax#40830 reports
gloo's ``psum_scatter`` returning wrong values with no error). The inputs and the
comparison both use are :mod:`allreduce_jax.tools.compare`.

One jitted program per (algorithm, participant count) computes every op × dtype ×
input kind × shape, so a full verification compiles only a few dozen programs.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P
from tqdm import tqdm

from allreduce_jax import ALGORITHMS, _wire, all_reduce, devices, wire_error
from allreduce_jax._ops import OPS, get_op, oracle
from allreduce_jax.tools import backend_oracle
from allreduce_jax.tools._args import (
  add_algorithms,
  add_devices,
  available_memory,
  check_memory,
  csv_list,
  dtype_choice,
  row_store,
)
from allreduce_jax.tools.compare import (
  DTYPES,
  KINDS,
  MAKERS,
  REFERENCE,
  SHAPES,
  SPECIALS,
  Agreement,
  agreement,
  describe,
  identical,
  labeler,
  place,
  print_findings,
  random_input,
  rank_coded,
  special_input,
  special_label,
  special_patterns,
  stored,
  subnormal_input,
  tolerance,
  valid,
  verifiable_input,
  write_rows,
)

#: verify's own names, and the inputs and comparison it checks with
#: (:mod:`allreduce_jax.tools.compare`, re-exported: ``verify.verifiable_input``...).
__all__ = [
  "DTYPES",
  "KINDS",
  "REFERENCE",
  "SHAPES",
  "SPECIALS",
  "Agreement",
  "Row",
  "agreement",
  "configure",
  "count_cases",
  "describe",
  "failures",
  "findings",
  "format_table",
  "lossy_selection",
  "lossy_tolerance",
  "random_input",
  "rank_coded",
  "run",
  "run_case",
  "special_input",
  "special_label",
  "stored",
  "subnormal_input",
  "summarize",
  "verifiable_input",
]


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


#: A first run that takes seconds, suggested when the selection is large.
QUICK = "--devices 4 --algorithms ring,swing --dtypes float32 --shapes 13"
QUICK_CASES = 200


def _mesh_and_axis(algorithm: str, p: int):
  if ALGORITHMS[algorithm].axes == 2 and jax.process_count() > 1:
    # One mesh axis per process level: outer = processes, inner = local devices.
    if p != jax.device_count():
      raise ValueError(
        f"across processes {algorithm} needs all {jax.device_count()} devices, got p={p}."
      )
    return devices.process_mesh(("outer", "inner")), ("outer", "inner")
  return devices.mesh_for(algorithm, p)


def lossy_tolerance(algorithm: str, x: np.ndarray, op: str, wire: str | None, p: int) -> float:
  """The stated bound of a lossy wire format (``_wire``): every quantization whose error
  reaches an element adds at most ``u`` x its block's absmax, which is at most the
  largest Σ_i |x_i| (x 1.01 for the earlier errors). How many reach the worst element
  is read off the algorithm's own program (:func:`allreduce_jax.wire_error.quantizations`:
  p for the ring, 2(p − 1) for recursive doubling at a power of two), not from its
  step count. 0.0 for an exact wire."""
  fmt = _wire.get(wire)
  if not fmt.lossy:
    return 0.0
  mesh, axis = _mesh_and_axis(algorithm, p)
  n = max(1, int(np.prod(x.shape[1:])))
  dtype = jnp.dtype(x.dtype)  # a narrower float travels as float32 (all_reduce)
  count = wire_error.quantizations(
    algorithm, mesh, axis, n, "float32" if dtype.itemsize < 4 else dtype
  )
  bound = float(np.max(np.sum(np.abs(x.astype(np.float64)), axis=0), initial=0.0))
  return 1.01 * count * fmt.unit_error * bound / (p if op == "mean" else 1)


def lossy_selection(wire: str | None, ops, dtypes, kinds) -> tuple[tuple, tuple, tuple]:
  """The ops, dtypes and input kinds a lossy ``wire`` can be checked on (sum/mean of
  float inputs that are not special values: ``_wire``'s bound is for finite data);
  everything for an exact wire."""
  if not _wire.get(wire).lossy:
    return tuple(ops), tuple(dtypes), tuple(kinds)
  return (
    tuple(op for op in ops if op in ("sum", "mean")),
    tuple(d for d in dtypes if jnp.issubdtype(jnp.dtype(d), jnp.floating)),
    tuple(k for k in kinds if k != "special"),
  )


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
  ops, dtypes, kinds = lossy_selection(wire, ops, dtypes, kinds)
  mesh, axis = _mesh_and_axis(algorithm, p)
  spec = P(axis)
  inputs = {}
  for kind in kinds:
    for dtype in dtypes:
      for shape in shapes:
        if any(valid(op, dtype, kind) for op in ops):
          inputs[(kind, dtype, shape)] = MAKERS[kind](p, shape, dtype, seed)

  def body(blocks):
    out = {}
    for (kind, dtype, shape), block in blocks.items():
      x = block[0]  # T[*shape] (T[V, *shape] for special inputs): this participant's block
      for op in ops:
        if valid(op, dtype, kind):
          got = all_reduce(x, axis, op=op, algorithm=algorithm, wire=wire)
          ref = get_op(op, x.dtype).reference(x, axis)
          out[(kind, dtype, shape, op)] = (got[None], ref[None])
    return out

  fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
  results = fn(place(inputs, mesh, spec))
  hand_written = getattr(ALGORITHMS[algorithm], "hand_written", True)
  rows = []
  for (kind, dtype, shape, op), (got, ref) in results.items():
    got, ref = devices.fetch(got), devices.fetch(ref)
    x = inputs[(kind, dtype, shape)]
    want = oracle(op, x)
    tol = tolerance(x, want, op, kind, p)
    label = labeler(kind, shape)
    a = agreement(got[0], want, op, tol + lossy_tolerance(algorithm, x, op, wire, p))
    if op == "mean":  # exact sum, then the backend's division (not correctly rounded on CPU)
      exact = agreement(got[0], _backend_mean(x, p), op).exact
      a = Agreement(a.ok, exact, a.err, a.bad, a.total, a.first)
    replicas = all(identical(got[k], got[0]) for k in range(p))  # NaN bits too
    detail = describe(a, got[0], want, want.shape, label)
    if not replicas:
      detail = "participants hold different results" + (f"; {detail}" if detail else "")
    b = agreement(ref[0], want, op, tol)
    ref_replicas = all(identical(ref[k], ref[0]) for k in range(p))
    backend = describe(b, ref[0], want, want.shape, label)
    if not ref_replicas:
      backend = "participants hold different results" + (f"; {backend}" if backend else "")
    patterns = special_patterns(b, ref[0], want, op, tol, label)
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
      dtype_choice(d)  # unknown, not reducible, or 64-bit without JAX_ENABLE_X64=1
    except argparse.ArgumentTypeError as e:
      raise SystemExit(f"--dtypes: {e}") from None
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
  if not args.backend_oracle:
    wire = None if args.wire == "none" else args.wire
    able = [a for a in algorithms if wire in ALGORITHMS[a].wires]
    if not able:
      raise SystemExit(
        f"--wire {wire}: none of --algorithms {','.join(algorithms)} can send in it; nothing"
        " to check"
      )
    if not count_cases(args.ops, args.dtypes, args.kinds, shapes, wire):
      what = f"--ops {','.join(args.ops)} --dtypes {','.join(args.dtypes)}"
      what += f" --kinds {','.join(args.kinds)}"
      if _wire.get(wire).lossy:
        raise SystemExit(
          f"--wire {wire} is checked on op sum/mean of float inputs that are not special"
          f" values (its error bound is for finite data); {what} leaves nothing to check"
        )
      raise SystemExit(f"{what} leaves nothing to check (no integer mean or special inputs)")
  return algorithms, shapes


def count_cases(ops, dtypes, kinds, shapes, wire: str | None = None) -> int:
  """How many cases :func:`run_case` compares for one (algorithm, participant count)."""
  ops, dtypes, kinds = lossy_selection(wire, ops, dtypes, kinds)
  return len(shapes) * sum(valid(op, d, k) for k in kinds for d in dtypes for op in ops)


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
    return backend_oracle.run_backend_oracle(args, ps, shapes, store)
  rows: list[Row] = []
  t0 = time.perf_counter()
  wire = None if args.wire == "none" else args.wire
  skipped = [a for a in algorithms if wire not in ALGORITHMS[a].wires]
  if skipped:
    print(f"# --wire {wire}: skipping {', '.join(skipped)} (cannot send in it)", flush=True)
  cases = [(a, p) for a in algorithms if a not in skipped for p in ps]
  ops, dtypes, kinds = lossy_selection(wire, args.ops, args.dtypes, args.kinds)
  left_out = [f"--ops {o}" for o in args.ops if o not in ops]
  left_out += [f"--dtypes {d}" for d in args.dtypes if d not in dtypes]
  left_out += [f"--kinds {k}" for k in args.kinds if k not in kinds]
  if left_out:
    print(f"# --wire {wire}: not checked (sum/mean of finite floats only): {', '.join(left_out)}")
  total = len(cases) * count_cases(ops, dtypes, kinds, shapes)
  print(
    f"# {total} cases to compare: {len(cases)} (algorithm, participant count) programs x"
    f" {total // max(len(cases), 1)} (op, dtype, input kind, shape) each",
    flush=True,
  )
  if total > QUICK_CASES:
    print(f"# a quick first check instead (seconds): allreduce-jax verify {QUICK}", flush=True)
  # Each (algorithm, p) compiles one program per op × dtype × kind × shape: minutes in
  # all. Count, rate and ETA on stderr, only on a terminal and on process 0.
  bar = tqdm(cases, desc="verify", unit="case", file=sys.stderr, leave=False,
             disable=None if jax.process_index() == 0 else True)  # fmt: skip
  for algorithm, p in bar:
    bar.set_postfix_str(f"{algorithm}, p={p}", refresh=False)
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
  failed = sum(not r.passed for r in rows)
  backend = sum(r.passed and bool(r.detail) for r in rows)  # XLA's own, differing
  print(
    f"# {len(rows)} cases compared with the NumPy oracle in {time.perf_counter() - t0:.1f} s:"
    f" {len(rows) - failed - backend} passed, {failed} failed"
    + (f", {backend} backend" if backend else "")
  )
  print_findings(found, args.strict)
  write_rows(
    store, [asdict(r) for r in rows], ("algorithm", "op", "dtype", "p", "input_kind", "shape")
  )
  return 1 if failed or not rows or (args.strict and found) else 0


def _check_memory(args: argparse.Namespace, ps: list[int], shapes) -> None:
  """Before allocating: one program's inputs, results (the algorithm's and XLA's, per
  op) and the float64 oracle fit in memory; else one line saying what fits."""
  p = max(ps)
  per_element = 0  # bytes per element of a block, over every dtype and kind
  for kind in args.kinds:
    copies = len(SPECIALS) if kind == "special" else 1
    for d in args.dtypes:
      ops = [op for op in args.ops if valid(op, d, kind)]
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
