"""The ring against line rate as the emulated link's queue and MTU change.

Each shaped link of ``allreduce-jax cluster`` is a token bucket whose queue holds
``--queue`` of traffic (default 100 ms). In a lockstep ring, host i's "ready to receive"
for the next step leaves through the same egress as its bulk data to host i+1, so it
waits behind whatever that queue holds; gloo's own ring (``psum``) pipelines its chunks
and waits less. A short queue lets the notifications through, but where several
senders converge on one port (the parameter server's root, the tree's inner nodes) it
drops packets and TCP stalls: the same trade-off as a data-centre switch's buffer
(bufferbloat against incast).

For every (hosts, queue, MTU, repeat) this runs

    allreduce-jax cluster --hosts H --queue Q --mtu M -- bench --algorithms ring,psum \\
      -b 4MiB -e 16MiB -f 4 --no-uneven -n 5 -w 1 -a 3

and appends its rows, tagged with ``hosts``, ``queue``, ``mtu`` and ``repeat``, to
``--out`` (resumable: a finished configuration is skipped). ``--incast`` adds one run
per queue of the algorithms whose messages converge (naive, tree, recursive doubling)
at 4 MiB on the largest host count. Needs root; nothing else should run meanwhile.

    python experiments/link_queue.py --out docs/results/network/link_queue.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = ["-b", "4MiB", "-e", "16MiB", "-f", "4", "--no-uneven", "-n", "5", "-w", "1", "-a", "3"]
INCAST = ["-b", "4MiB", "-e", "4MiB", "--no-uneven", "-n", "3", "-w", "1", "-a", "3"]


def _done(path: Path) -> set[tuple]:
  if not path.exists():
    return set()
  rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  return {(r["hosts"], r["queue"], r["mtu"], r["repeat"], r["set"]) for r in rows}


def run_one(hosts: int, queue: str, mtu: int, algorithms: str, bench: list[str]) -> list[dict]:
  """One cluster run of ``bench``; its rows (each process 0's row file)."""
  with tempfile.TemporaryDirectory() as tmp:
    out = Path(tmp) / "rows.jsonl"
    cmd = [sys.executable, "-m", "allreduce_jax", "cluster", "--hosts", str(hosts),
           "--link", "200Mbit", "--queue", queue, "--mtu", str(mtu), "--", "bench",
           "--algorithms", algorithms, *bench, "--out", str(out), "--fresh"]  # fmt: skip
    print("#", " ".join(cmd[1:]), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ})
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--hosts", default="4,8")
  ap.add_argument("--queues", default="1ms,2ms,100ms")
  ap.add_argument("--mtus", default="1500")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--incast", action="store_true")
  ap.add_argument("--out", default="results/link_queue.jsonl")
  args = ap.parse_args(argv)
  out = Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  hosts = [int(h) for h in args.hosts.split(",")]
  plan = [(h, q, int(m), k, "ring") for k in range(1, args.repeats + 1) for h in hosts
          for q in args.queues.split(",") for m in args.mtus.split(",")]  # fmt: skip
  if args.incast:
    plan += [(max(hosts), q, 1500, 1, "incast") for q in args.queues.split(",")]
  done = _done(out)
  for h, q, m, k, which in plan:
    if (h, q, m, k, which) in done:
      continue
    algs, bench = (
      ("ring,psum", BENCH) if which == "ring" else ("naive,tree,recursive_doubling", INCAST)
    )
    rows = run_one(h, q, m, algs, bench)
    with out.open("a") as f:
      for r in rows:
        f.write(
          json.dumps({**r, "hosts": h, "queue": q, "mtu": m, "repeat": k, "set": which}) + "\n"
        )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
