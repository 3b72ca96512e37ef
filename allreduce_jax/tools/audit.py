"""Communication audit sweep: permutes and bytes per participant from compiled HLO vs p.

For each p, a fresh subprocess with p emulated CPU devices compiles (never runs)
every algorithm on a buffer of ``n`` bytes per participant, counts its
``collective-permute`` ops and the bytes each participant sends
(:func:`allreduce_jax.hlo.audit`), and compares them with the closed-form
:func:`allreduce_jax.cost_model.schedule`. It also records the compile time, which
must not grow badly with p for the unrolled ring (2(p-1) permutes).

Ring's per-participant traffic 2(p-1)/p·n tends to 2n; the naive root's (p-1)·n
grows linearly: the figure shows both, normalized by n.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
from tqdm import tqdm

from allreduce_jax import _wire, cost_model, devices, hlo, names
from allreduce_jax.devices import fits
from allreduce_jax.results import RowStore
from allreduce_jax.tools import plot
from allreduce_jax.tools._args import (
  output_path,
  positive_int,
  positive_int_list,
  row_store,
  text_table,
)


def audited() -> tuple[str, ...]:
  """Every hand-written algorithm with a cost model (from the registry)."""
  return names(hand_written=True, priced=True)


#: The payload element type each wire format must keep in the compiled HLO.
NARROW = {None: "f32", "bf16": "u16", "int8": "s8", "fp8": "s8"}


def audit_in_process(p: int, nbytes: int, algorithms=None, wire: str | None = None) -> list[dict]:
  """Compiles every algorithm on this process's first ``p`` devices, sending in wire
  format ``wire``; one row each. A lossy format's row matches when every permute's
  payload has the format's narrow type and the bytes sent are the record's
  ``wire_bytes`` (scales included)."""
  count = nbytes // 4
  rows = []
  for alg in algorithms or audited():
    if not devices.fits(alg, p):
      continue  # p has too few factors for a k-level mesh
    a = hlo.audit_all_reduce(alg, p, count, wire=wire)
    s = cost_model.schedule(alg, p, nbytes, inner=devices.inner_size(alg, p))
    if wire is not None:  # the same steps; each message narrowed (blocks: + its scales)
      per_element = _wire.get(wire).bytes_per_element(max(1, count // p)) / 4
      s = cost_model.Schedule(
        s.steps, s.beta_bytes, s.gamma_bytes, s.permutes, s.max_sent_bytes * per_element
      )
    narrow = set(a.permute_dtypes) <= {NARROW[wire]}
    rows.append(
      {
        "algorithm": alg,
        "p": p,
        "bytes": nbytes,
        "permutes": a.permutes,
        "permutes_model": s.permutes,
        "max_sent_bytes": a.max_sent_bytes,
        "max_sent_bytes_model": s.max_sent_bytes,
        "sent_over_n": a.max_sent_bytes / nbytes,
        "all_reduce_ops": a.counts["all-reduce"],
        # The formula is for unpadded n; the program pads the buffer to whole chunks
        # (a bidirectional ring pads each half to p chunks: < 2p float32 elements in all,
        # sent about twice), so allow 16·p bytes.
        "match": a.permutes == s.permutes
        and abs(a.max_sent_bytes - s.max_sent_bytes) <= 16 * p + 4 * s.permutes
        and narrow,
        "wire": wire,
        "payload_dtypes": sorted(set(a.permute_dtypes)),
        "compile_s": a.compile_s,
        "jax_version": jax.__version__,
      }
    )
  return rows


def audit_subprocess(
  p: int, nbytes: int, algorithms=None, timeout: float = 600, wire: str | None = None
) -> list:
  """Runs :func:`audit_in_process` in a fresh Python with ``p`` CPU devices."""
  code = (
    f"import json, jax; jax.config.update('jax_num_cpu_devices', {p});"
    "from allreduce_jax.tools.audit import audit_in_process;"
    f"print(json.dumps(audit_in_process({p}, {nbytes}, {tuple(algorithms or audited())!r},"
    f" wire={wire!r})))"
  )
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  res = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
  )
  if res.returncode:
    raise RuntimeError(f"audit at p={p} failed:\n{res.stderr[-2000:]}")
  return json.loads(res.stdout.strip().splitlines()[-1])


def format_rows(rows: list[dict]) -> str:
  return text_table(
    rows,
    [
      ("algorithm", 18, lambda r: r["algorithm"]),
      ("p", 4, lambda r: r["p"]),
      ("permutes", 8, lambda r: r["permutes"]),
      ("model", 6, lambda r: r["permutes_model"]),
      ("sent/n", 8, lambda r: f"{r['sent_over_n']:.3f}"),
      ("model", 8, lambda r: f"{r['max_sent_bytes_model'] / r['bytes']:.3f}"),
      ("match", 5, lambda r: "yes" if r["match"] else "NO"),
      ("compile(s)", 10, lambda r: f"{r['compile_s']:.2f}"),
    ],
  )


def store(out, fresh: bool = False):
  """The audit's :class:`~allreduce_jax.results.RowStore`, checked (and emptied if
  ``fresh``): rows are keyed on (algorithm, p, bytes) and the JAX version (the
  subprocesses compile on CPU)."""

  return row_store(out, "audit", fresh=fresh, context={"jax_version": jax.__version__})


def sweep(
  ps, nbytes: int, out, algorithms=None, fresh: bool = False, wire: str | None = None
) -> list[dict]:
  """Audits every p (skipping the (algorithm, p, bytes) rows already in ``out``, a
  path or the :func:`store` of a running command)."""
  if isinstance(out, RowStore):
    return _sweep(ps, nbytes, out, algorithms, wire)
  rows_store = store(out, fresh)
  try:
    return _sweep(ps, nbytes, rows_store, algorithms, wire)
  finally:
    rows_store.unlock()


def _sweep(ps, nbytes: int, rows_store, algorithms=None, wire: str | None = None) -> list[dict]:
  done = rows_store.done()
  rows = []
  # One compile per (p, algorithm), p up to 64: minutes. Count, rate and ETA on stderr,
  # only on a terminal.
  for p in tqdm(ps, desc="audit", unit="p", file=sys.stderr, disable=None, leave=False):
    keys = {
      a: rows_store.key(algorithm=a, p=p, bytes=nbytes, **({"wire": wire} if wire else {}))
      for a in algorithms or audited()
      if fits(a, p)
    }
    todo = [a for a, k in keys.items() if k not in done]
    if todo:
      new = audit_subprocess(p, nbytes, todo, wire=wire)
      stored = rows_store.extend(new, [keys[r["algorithm"]] for r in new])
      done.update((r["key"], r) for r in stored)
    rows += [done[k] for k in keys.values() if k in done]
  return rows


def configure(parser: argparse.ArgumentParser) -> None:
  parser.add_argument(
    "--ps",
    type=positive_int_list,
    default=[2, 4, 8, 16, 32, 64],
    help="participant counts (default: 2,4,8,16,32,64)",
  )
  parser.add_argument(
    "--bytes",
    type=positive_int,
    default=1 << 16,
    help="bytes per participant, a multiple of 4 (default: %(default)s)",
  )
  parser.add_argument(
    "--out", default="results/hlo_audit.jsonl", help="rows (default: %(default)s)"
  )
  parser.add_argument("--fresh", action="store_true", help="discard earlier rows first")
  parser.add_argument(
    "--wire",
    default="none",
    choices=list(("none" if w is None else w) for w in NARROW),
    help="wire format to compile with; a lossy one also checks each permute's payload"
    " type (bf16: u16, int8/fp8: s8) and bytes with the scales",
  )


def run(args) -> int:

  if args.bytes % 4:
    raise SystemExit(f"--bytes {args.bytes}: must be a multiple of 4 (float32 elements).")
  rows_store = store(args.out, args.fresh)  # refuses a foreign, unwritable or busy --out now
  fig = output_path(Path(args.out).with_suffix(".png"), "--out")
  rows = sweep(args.ps, args.bytes, rows_store, wire=None if args.wire == "none" else args.wire)
  print(format_rows(sorted(rows, key=lambda r: (r["algorithm"], r["p"]))))
  plot.save(plot.audit(rows), fig, dpi=110)
  return 0 if all(r["match"] and r["all_reduce_ops"] == 0 for r in rows) else 1
