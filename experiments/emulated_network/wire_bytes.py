"""Bytes each host puts on the wire per all-reduce, from its interface counters.

Runs on every host of an emulated cluster (one process per host, one device each):

    allreduce-jax cluster --hosts 4 --topology switch --link 200Mbit -- \\
        python experiments/emulated_network/wire_bytes.py --bytes 4MiB --out experiments/emulated_network/rows/wire_bytes.jsonl

For each algorithm: compile and run it once, wait for every host (a barrier), read
this host's ``tx_bytes`` (``/sys/class/net/DEV/statistics``, the namespace's own
interfaces: ``ip netns exec`` mounts its /sys), run it ``--reps`` times, barrier, read
again. The same interval with nothing run (barriers only) is subtracted. Host 0 writes
one row per (algorithm, host) with the schedule's bytes for that host next to it
(:func:`allreduce_jax.gloo_model.schedule_bytes`). Rows already in ``--out`` are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from allreduce_jax import distributed


def _tx() -> int:
  total = 0
  for dev in os.listdir("/sys/class/net"):
    if dev != "lo":
      total += int(Path(f"/sys/class/net/{dev}/statistics/tx_bytes").read_text())
  return total


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--bytes", default="4MiB", help="bytes per participant")
  ap.add_argument("--reps", type=int, default=2, help="calls counted per algorithm")
  ap.add_argument(
    "--algorithms", default=None, help="comma list (default: every one with a schedule)"
  )
  ap.add_argument("--network", default="switch", help="the cluster's --topology (for the rows)")
  ap.add_argument("--out", required=True)
  args = ap.parse_args(argv)
  distributed.initialize_from_env()
  import jax
  import numpy as np
  from jax.experimental import multihost_utils
  from jax.sharding import NamedSharding

  from allreduce_jax import ALGORITHMS, devices, gloo_model
  from allreduce_jax.tools.bench import programs, verifiable_block
  from allreduce_jax.units import parse_size

  p = jax.device_count()
  n = parse_size(args.bytes)
  names = args.algorithms.split(",") if args.algorithms else [
    a for a, r in ALGORITHMS.items() if r.messages is not None and devices.fits(a, p)
  ]  # fmt: skip
  count = n // 4
  done = set()
  out = Path(args.out)
  if out.exists():
    for line in out.read_text().splitlines():
      r = json.loads(line)
      done.add((r["network"], r["p"], r["bytes"], r["algorithm"]))
  names = [a for a in names if (args.network, p, n, a) not in done]
  rows = []

  def counted(fn) -> int:
    multihost_utils.sync_global_devices("before")
    t0 = _tx()
    for _ in range(args.reps):
      fn()
    multihost_utils.sync_global_devices("after")
    return _tx() - t0

  idle = counted(lambda: None)
  for alg in names:
    mesh, spec, timed, _ = programs(alg, p, "sum")
    x = devices.put(
      (p, count), "float32", NamedSharding(mesh, spec), lambda idx: verifiable_block(idx, p, count)
    )
    timed(x).block_until_ready()  # compile, connect
    sent = (counted(lambda t=timed, x=x: t(x).block_until_ready()) - idle) / args.reps
    every = multihost_utils.process_allgather(np.array([sent], np.float64))
    every = np.asarray(every).reshape(-1)
    schedule = gloo_model.schedule_bytes(alg, p, n)
    for host, b in enumerate(every):
      rows.append({
        "network": args.network, "p": p, "bytes": n, "algorithm": alg, "host": host,
        "wire_bytes": float(b), "schedule_bytes": float(schedule[host]),
        "ratio": float(b / schedule[host]) if schedule[host] else None,
      })  # fmt: skip
    if jax.process_index() == 0:
      print(
        f"{alg:22s} host0 {every[0] / 1e6:8.2f} MB  schedule {schedule[0] / 1e6:8.2f} MB",
        flush=True,
      )
  if jax.process_index() == 0 and rows:
    with open(out, "a") as f:
      for r in rows:
        f.write(json.dumps(r) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
