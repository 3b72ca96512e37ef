"""The ring against line rate as the emulated link's queue, MTU and TCP queue change.

Each shaped link of ``allreduce-jax cluster`` is a token bucket whose queue holds
``--queue`` of traffic (default 100 ms). In a lockstep ring, host i's "ready to receive"
for the next step leaves through the same egress as its bulk data to host i+1, so it
waits behind whatever that queue holds; gloo's own ring (``psum``) pipelines its chunks
and waits less. A short queue lets the notifications through, but where several
senders converge on one port (the parameter server's root, the tree's inner nodes) it
drops packets and TCP stalls: the same trade-off as a data-centre switch's buffer
(bufferbloat against incast). A small TCP queue (``--tcp-queue``, Linux's TCP Small
Queues) keeps the link's queue long for the ports where flows converge, but lets one
socket hold only a few segments of its own host's queue, so the notifications pass.

For every (hosts, queue, MTU, TCP queue, congestion control, repeat) this runs

    allreduce-jax cluster --hosts H --queue Q --mtu M --tcp-queue T [--congestion-control C] \\
      -- bench --algorithms ring,psum -b 4MiB -e 16MiB -f 4 --no-uneven -n 5 -w 1 -a 3 [--order O]

(``--max-bytes`` changes ``-e``) and appends its rows, tagged with ``hosts``, ``queue``,
``mtu``, ``tcp_queue``, ``congestion_control`` (where one was asked for) and ``repeat``,
to ``--out`` (resumable: a finished configuration is skipped). The repeats
go round the configurations, so a slow spell of the machine hits each alike.
``--incast`` adds one run per queue and TCP queue of the algorithms whose messages
converge (naive, tree, recursive doubling) at 4 MiB on the largest host count. Needs
root; nothing else should run meanwhile.

    python experiments/emulated_network/link_queue.py --out experiments/emulated_network/rows/link_queue.jsonl
    python experiments/emulated_network/link_queue.py --queues 100ms --tcp-queues 4MiB,16KiB --order blocks \\
        --incast --out experiments/emulated_network/rows/tcp_queue.jsonl
    python experiments/emulated_network/link_queue.py --hosts 8 --queues 100ms --tcp-queues 16KiB \\
        --congestion-controls bbr,cubic --max-bytes 64MiB --order blocks \\
        --out experiments/emulated_network/rows/congestion_control.jsonl        # then --hosts 4
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
  # Rows from before --tcp-queue existed ran at the kernel's own 4 MiB.
  return {
    (r["hosts"], r["queue"], r["mtu"], r.get("tcp_queue", "4MiB"),
     r.get("congestion_control", ""), r["repeat"], r["set"])
    for r in rows
  }  # fmt: skip


def run_one(
  hosts: int, queue: str, mtu: int, tcp_queue: str, cc: str, algorithms: str, bench: list[str]
) -> list[dict]:
  """One cluster run of ``bench``; its rows (each process 0's row file)."""
  with tempfile.TemporaryDirectory() as tmp:
    out = Path(tmp) / "rows.jsonl"
    cmd = [sys.executable, "-m", "allreduce_jax", "cluster", "--hosts", str(hosts),
           "--link", "200Mbit", "--queue", queue, "--mtu", str(mtu), "--tcp-queue", tcp_queue,
           *(["--congestion-control", cc] if cc else []), "--", "bench", "--algorithms",
           algorithms, *bench, "--out", str(out), "--fresh"]  # fmt: skip
    print("#", " ".join(cmd[1:]), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ})
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--hosts", default="4,8")
  ap.add_argument("--queues", default="1ms,2ms,100ms")
  ap.add_argument("--mtus", default="1500")
  ap.add_argument("--tcp-queues", default="4MiB", help="cluster --tcp-queue values")
  ap.add_argument(
    "--congestion-controls",
    default="",
    help="cluster --congestion-control values (default: the machine's own)",
  )
  ap.add_argument("--max-bytes", default="16MiB", help="the ring set's largest size (bench -e)")
  ap.add_argument("--order", default=None, help="bench --order (default: bench's own)")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--incast", action="store_true")
  ap.add_argument("--out", default="results/link_queue.jsonl")
  args = ap.parse_args(argv)
  out = Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  hosts = [int(h) for h in args.hosts.split(",")]
  queues, tcps = args.queues.split(","), args.tcp_queues.split(",")
  ccs = args.congestion_controls.split(",")
  plan = [(h, q, int(m), t, c, k, "ring") for k in range(1, args.repeats + 1) for h in hosts
          for q in queues for m in args.mtus.split(",") for t in tcps for c in ccs]  # fmt: skip
  if args.incast:
    plan += [(max(hosts), q, 1500, t, c, 1, "incast") for q in queues for t in tcps for c in ccs]
  ring_bench = [*BENCH]
  ring_bench[ring_bench.index("-e") + 1] = args.max_bytes
  order = ["--order", args.order] if args.order else []
  done = _done(out)
  for h, q, m, t, c, k, which in plan:
    if (h, q, m, t, c, k, which) in done:
      continue
    algs, bench = (
      ("ring,psum", ring_bench) if which == "ring" else ("naive,tree,recursive_doubling", INCAST)
    )
    rows = run_one(h, q, m, t, c, algs, bench + order)
    tags = {"hosts": h, "queue": q, "mtu": m, "tcp_queue": t, "repeat": k, "set": which}
    if c:
      tags["congestion_control"] = c
    with out.open("a") as f:
      for r in rows:
        f.write(json.dumps({**r, **tags}) + "\n")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
