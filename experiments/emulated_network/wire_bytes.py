"""Bytes each host puts on the wire per all-reduce, from its interface counters.

Runs on every host of an emulated cluster (one process per host, one device each):

    allreduce-jax cluster --hosts 4 --topology switch --link 200Mbit -- \\
        python experiments/emulated_network/wire_bytes.py --bytes 4MiB --out experiments/emulated_network/rows/wire_bytes.jsonl

For each algorithm: compile and run it once, wait for every host (a barrier), read
this host's ``tx_bytes`` (``/sys/class/net/DEV/statistics``, the namespace's own
interfaces: ``ip netns exec`` mounts its /sys), run it ``--reps`` times, barrier, read
again (:func:`allreduce_jax.tools.bench.wire_per_call`). The same interval with nothing run
(barriers only) is subtracted. Host 0 appends one row per (algorithm, host) with the
schedule's bytes for that host next to it (:func:`allreduce_jax.gloo_model.schedule_bytes`),
through the row store (kind ``wire``); the algorithms already in ``--out`` at this size
and host count are skipped.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from allreduce_jax import ALGORITHMS, devices, distributed, gloo_model, results
from allreduce_jax.tools.bench import (
  programs,
  verifiable_input,
  wire_bytes,
  wire_parser,
  wire_per_call,
)
from allreduce_jax.units import parse_size


def sent_per_call(algorithm: str, p: int, count: int, reps: int, idle: np.ndarray) -> np.ndarray:
  """Every host's bytes sent per call of ``algorithm`` (``f64[p]``), the idle interval's
  (``idle``, sent and received) subtracted."""
  mesh, spec, timed, _ = programs(algorithm, p, "sum")
  x = verifiable_input(mesh, spec, p, count)
  timed(x).block_until_ready()  # compile, connect
  return wire_per_call(lambda: timed(x).block_until_ready(), reps, idle)[:, 0]


def measure(args: argparse.Namespace) -> None:
  distributed.initialize_from_env()
  p = jax.device_count()
  n = parse_size(args.bytes)
  names = args.algorithms.split(",") if args.algorithms else [
    a for a, r in ALGORITHMS.items() if r.messages is not None and devices.fits(a, p)
  ]  # fmt: skip
  done = {
    (r["network"], r["p"], r["bytes"], r["algorithm"]) for r in results.read_rows(args.out, "wire")
  }
  idle = wire_bytes(lambda: None, args.reps)
  rows = []
  for alg in [a for a in names if (args.network, p, n, a) not in done]:
    every = sent_per_call(alg, p, n // 4, args.reps, idle)
    schedule = gloo_model.schedule_bytes(alg, p, n)
    for host, b in enumerate(every):
      rows.append({
        "network": args.network, "p": p, "bytes": n, "algorithm": alg, "host": host,
        "wire_bytes": float(b), "schedule_bytes": float(schedule[host]),
        "ratio": float(b / schedule[host]) if schedule[host] else None,
      })  # fmt: skip
    if jax.process_index() == 0:
      print(f"{alg:22s} host0 {every[0] / 1e6:8.2f} MB  schedule {schedule[0] / 1e6:8.2f} MB",
            flush=True)  # fmt: skip
  if jax.process_index() == 0 and rows:
    store = results.RowStore(args.out, "wire")
    store.extend(rows, by=("bytes", "algorithm", "host"))


def parser() -> argparse.ArgumentParser:
  return wire_parser(
    __doc__.splitlines()[0], reps=2, algorithms=None,
    algorithms_help="comma list (default: every one with a schedule)",
  )  # fmt: skip


if __name__ == "__main__":
  measure(parser().parse_args())
