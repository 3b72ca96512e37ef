"""The ceiling a lockstep ring can reach over TCP on the emulated switch, without JAX or gloo.

The ring all-reduce's 2(p-1) steps each send n/p bytes to the right neighbour while
receiving n/p from the left, and step s+1 starts only when step s has arrived. This
script runs exactly that pattern with plain Python sockets (one TCP connection per
neighbour pair, a sending thread and a receiving loop per step) on an emulated switch
of ``allreduce_jax.netns``, and prints one JSON row per (p, n): its time (median and
range over ``--trials`` runs of all the steps) and its busbw as a fraction of the link
rate, the same ratio ``allreduce-jax bench`` reports for ``ring`` on ``allreduce-jax
cluster``. It separates what the link and TCP cost (frame headers: a 1500-byte MTU
carries 1448 payload bytes in a 1514-byte frame, so at most 0.956 of the rate is
payload; the bubble between steps) from what gloo and XLA add.

Needs root (it builds and removes its own namespaces, as ``allreduce-jax cluster``
does). Run it while no cluster is running:

    python experiments/tcp_ring_ceiling.py --hosts 4,8 --bytes 4MiB,16MiB --link 200Mbit \\
      --tcp-queue 16KiB --out docs/results/network/tcp_ring_ceiling.jsonl

``--tcp-queue`` is the cluster's (default 16 KiB a socket); the rows without a
``tcp_queue`` field ran before it existed, at this kernel's own 4 MiB.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from allreduce_jax import netns, units

# One host: connect to the right neighbour, accept the left one, then run the ring's
# 2(p-1) steps ``trials`` times; print the seconds of each trial.
_HOST = r"""
import socket, sys, threading, time
r, p, chunk, steps, trials = map(int, sys.argv[1:6]); addrs = sys.argv[6].split(",")
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((addrs[r], 40000)); srv.listen(1)
for _ in range(100):
    try:
        out = socket.create_connection((addrs[(r + 1) % p], 40000)); break
    except OSError:
        time.sleep(0.1)
out.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
inn, _ = srv.accept()
buf = bytearray(chunk); data = bytes(chunk); mv = memoryview(buf)
def recv_exactly(k):
    got = 0
    while got < k:
        got += inn.recv_into(mv[got:k])
def barrier():  # a token around the ring and back: every host has started
    out.sendall(b"x"); recv_exactly(1)
times = []
for _ in range(trials):
    barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        th = threading.Thread(target=out.sendall, args=(data,)); th.start()
        recv_exactly(chunk); th.join()
    times.append(time.perf_counter() - t0)
print(" ".join(map(str, times)))
"""


def measure(
  p: int, nbytes: int, rate: float, trials: int, tcp_queue: int, cc: str | None = None
) -> dict:
  chunk, steps = nbytes // p, 2 * (p - 1)
  plan = netns.plan("switch", p, rate, tcp_queue=tcp_queue, congestion_control=cc)
  procs: list[subprocess.Popen] = []
  try:
    netns.up(plan)
    args = [str(chunk), str(steps), str(trials), ",".join(plan.addresses)]
    for r in range(p):
      argv = ["ip", "netns", "exec", plan.hosts[r], sys.executable, "-c", _HOST, str(r), str(p)]
      procs.append(subprocess.Popen(argv + args, stdout=subprocess.PIPE, text=True))
    per_host = [[float(t) for t in q.communicate(timeout=600)[0].split()] for q in procs]
  finally:
    for q in procs:
      q.kill()
    netns.down(plan.tag)
  # a trial ends when the slowest host has its last step
  times = [max(h[i] for h in per_host) for i in range(trials)]
  ideal = steps * chunk / rate
  t = statistics.median(times)
  return {
    "hosts": p, "bytes": nbytes, "link_Bps": rate, "tcp_queue": tcp_queue, "steps": steps,
    "trials": trials, **({"congestion_control": cc} if cc else {}),
    "time_s": t, "time_s_min": min(times), "time_s_max": max(times),
    "busbw_over_line": ideal / t, "busbw_over_line_best": ideal / min(times),
  }  # fmt: skip


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--hosts", default="4,8", help="host counts, comma-separated")
  ap.add_argument("--bytes", default="4MiB,16MiB", help="bytes per participant")
  ap.add_argument("--link", default="200Mbit", help="each link's rate, each way")
  ap.add_argument("--trials", type=int, default=5)
  ap.add_argument(
    "--tcp-queue",
    default=units.format_bytes(netns.DEFAULT_TCP_QUEUE),
    help="bytes a TCP socket may queue in its host (cluster's default)",
  )
  ap.add_argument(
    "--congestion-controls",
    default="",
    help="the hosts' TCP congestion controls to compare, comma-separated, taking turns"
    " (cluster --congestion-control; default: the machine's own)",
  )
  ap.add_argument("--repeats", type=int, default=1, help="rounds over the congestion controls")
  ap.add_argument("--out", default=None, help="JSON Lines file (appended)")
  a = ap.parse_args(argv)
  ccs = [c or None for c in a.congestion_controls.split(",")]
  problem = netns.privilege_problem() or next(
    filter(None, map(netns.congestion_control_problem, ccs)), None
  )
  if problem:
    raise SystemExit(problem)
  rate = units.parse_rate(a.link, "--link")
  tcp_queue = units.parse_size(a.tcp_queue, "--tcp-queue")
  for repeat in range(1, a.repeats + 1):
    for p in (int(h) for h in a.hosts.split(",")):
      for nbytes in (units.parse_size(b, "--bytes") for b in a.bytes.split(",")):
        for cc in ccs:
          row = measure(p, nbytes, rate, a.trials, tcp_queue, cc)
          if a.repeats > 1:
            row["repeat"] = repeat
          print(json.dumps(row), flush=True)
          if a.out:
            with open(a.out, "a") as f:
              f.write(json.dumps(row) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
