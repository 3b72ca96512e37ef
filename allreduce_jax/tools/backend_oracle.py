"""``verify --backend-oracle``: the backend's own collectives against the NumPy oracle.

:func:`backend_case` runs XLA's ``psum``, ``pmean``, ``pmax``, ``pmin``,
``psum_scatter`` and ``all_gather`` (:data:`COLLECTIVES`) on the verify inputs next
to the hand-written ring and compares both with :func:`allreduce_jax._ops.oracle`;
:func:`run_backend_oracle` prints the table and the findings and writes the rows
(jax#40830 reports gloo's ``psum_scatter`` returning wrong values with no error).
``allreduce-jax verify --backend-oracle`` runs it after verify's own option checks.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from allreduce_jax import all_reduce, devices
from allreduce_jax._ops import get_op, oracle
from allreduce_jax._ring import ring_all_gather, ring_reduce_scatter
from allreduce_jax.tools.compare import (
  DTYPES,
  KINDS,
  MAKERS,
  SHAPES,
  agreement,
  describe,
  labeler,
  place,
  print_findings,
  same_bits,
  special_patterns,
  tolerance,
  valid,
  write_rows,
)

__all__ = ["COLLECTIVES", "backend_case", "run_backend_oracle"]

#: The collectives ``--backend-oracle`` checks.
COLLECTIVES: tuple[str, ...] = ("psum", "pmean", "pmax", "pmin", "psum_scatter", "all_gather")


def _collective_valid(name: str, dtype: str, kind: str) -> bool:
  op = {"pmean": "mean", "pmax": "max", "pmin": "min"}.get(name, "sum")
  return valid(op, dtype, kind)  # all_gather: as sum (no special values in integers)


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
            inputs[(name, kind, dtype, shape)] = MAKERS[kind](p, block, dtype, seed)

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
  placed = place(inputs, mesh, spec)
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
  label = labeler(kind, shape)
  label_at = (lambda f: label(f % n)) if label else None  # result index -> input pattern
  if name == "all_gather":
    want = np.broadcast_to(flat.reshape(-1), (p, p * n))  # every participant: all blocks
    tol = 0.0
  elif name == "psum_scatter":
    total = oracle("sum", flat)  # T[n] = T[p*m]
    want = total.reshape(p, -1)  # participant j: chunk j, i.e. flat index j*m + e
    tol = tolerance(flat, total, "sum", kind, p)
    label_at = labeler(kind, (p, *shape))
  else:
    want = np.broadcast_to(oracle(op, flat), (p, n))
    tol = tolerance(flat, want[0], op, kind, p)
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
    "patterns": list(special_patterns(b, xla, want, op, tol, label_at)),
    "hand_written_differ": h.bad,
    "hand_written_first": describe(h, hand, want, want.shape, label_at),
    "agrees_with_hand_written": bool(same_bits(xla, hand) if tol == 0 else b.ok and h.ok),
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
  print_findings(found, args.strict)
  write_rows(store, records, ("collective", "input_kind", "dtype", "shape", "p", "repetition"))
  return 1 if broken or (args.strict and found) else 0
