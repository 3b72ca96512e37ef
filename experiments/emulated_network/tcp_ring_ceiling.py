"""The ceiling a lockstep ring can reach over TCP on the emulated switch, without JAX or gloo.

The ring all-reduce's 2(p-1) steps each send n/p bytes to the right neighbour while
receiving n/p from the left, and step s+1 starts only when step s has arrived. This
script runs exactly that pattern with plain Python sockets (one TCP connection per
neighbour pair, a sending thread and a receiving loop per step) on an emulated switch
of ``allreduce_jax.netns``, and prints (and appends through the row store) one row per
(p, n): its time (median and range over ``--trials`` runs of all the steps) and its busbw
as a fraction of the link rate, the same ratio ``allreduce-jax bench`` reports for ``ring`` on ``allreduce-jax
cluster``. It separates what the link and TCP cost (frame headers: a 1500-byte MTU
carries 1448 payload bytes in a 1514-byte frame, so at most 0.956 of the rate is
payload; the bubble between steps) from what gloo and XLA add.

It builds and removes its own namespaces, as ``allreduce-jax cluster`` does: as root, or
without root in a user namespace of the user's own. Run it while no cluster is running:

    python experiments/emulated_network/tcp_ring_ceiling.py --hosts 4,8 --bytes 4MiB,16MiB --link 200Mbit \\
      --tcp-queue 16KiB --out experiments/emulated_network/rows/tcp_ring_ceiling.jsonl

``--variants work,handshake`` adds, one at a time, what the hand-written ring does besides
the transfer (its local float32 work between steps; gloo's "ready to receive" before each
send), to find which of them costs the ring its line rate.

``--tcp-queue`` is the cluster's (default 16 KiB a socket); the rows without a
``tcp_queue`` field ran before it existed, at this kernel's own 4 MiB.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

from allreduce_jax import netns, results, units

# One host: connect to the right neighbour, accept the left one, then run the ring's
# 2(p-1) steps ``trials`` times; print the seconds of each trial.
_HOST = r"""
import socket, sys, threading, time
import numpy as np
r, p, chunk, steps, trials, work, handshake = map(int, sys.argv[1:8]); addrs = sys.argv[8].split(",")
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((addrs[r], 40000)); srv.listen(1)
for _ in range(100):
    try:
        out = socket.create_connection((addrs[(r + 1) % p], 40000)); break
    except OSError:
        time.sleep(0.1)
out.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
inn, _ = srv.accept()
inn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
f32 = chunk // 4  # the chunk as float32 elements, as the ring combines them
mine = np.ones(p * f32, np.float32)  # this host's buffer, T[p*c]
gathered = np.zeros(p * f32, np.float32)  # the all-gather's output
bufs = [np.empty(f32, np.float32) for _ in range(2)]  # step s receives into bufs[s % 2]
def recv_exactly(k, s=0):
    mv, got = memoryview(bufs[s % 2]).cast("B"), 0
    while got < k:
        got += inn.recv_into(mv[got:k])
def send(a):
    if handshake:  # gloo's rendezvous: wait for the receiver's "ready to receive"
        out.recv(1)
    out.sendall(memoryview(a).cast("B"))
def barrier():  # a token around the ring and back: every host has started
    out.sendall(b"x"); recv_exactly(1)
times = []
for _ in range(trials):
    barrier()
    t0 = time.perf_counter()
    acc = mine[:f32].copy()
    for s in range(steps):
        th = threading.Thread(target=send, args=(acc,)); th.start()
        if handshake:
            inn.sendall(b"r")
        recv_exactly(chunk, s); th.join()
        if work and s < p - 1:  # reduce-scatter: slice our own chunk, add what arrived
            k = (r - s - 2) % p
            acc = bufs[s % 2] + mine[k * f32:(k + 1) * f32]
        elif work:  # all-gather: store the block that arrived, forward it as it is
            k = (r - (s - p + 1) - 1) % p
            gathered[k * f32:(k + 1) * f32] = acc = bufs[s % 2]
    times.append(time.perf_counter() - t0)
print(" ".join(map(str, times)))
"""


def measure(
  p: int,
  nbytes: int,
  rate: float,
  trials: int,
  tcp_queue: int,
  cc: str | None = None,
  work: bool = False,
  handshake: bool = False,
  rootless: bool = False,
) -> dict:
  chunk, steps = nbytes // p, 2 * (p - 1)
  plan = netns.plan("switch", p, rate, tcp_queue=tcp_queue, congestion_control=cc)
  procs: list[subprocess.Popen] = []
  with netns.built(plan, rootless) as plan:
    try:
      args = [str(chunk), str(steps), str(trials), str(int(work)), str(int(handshake))]
      args.append(",".join(plan.addresses))
      for r in range(p):
        argv = [*plan.exec_in(plan.hosts[r]), sys.executable, "-c", _HOST, str(r), str(p)]
        procs.append(subprocess.Popen(argv + args, stdout=subprocess.PIPE, text=True))
      per_host = [[float(t) for t in q.communicate(timeout=600)[0].split()] for q in procs]
    finally:
      for q in procs:
        q.kill()
  # a trial ends when the slowest host has its last step
  times = [max(h[i] for h in per_host) for i in range(trials)]
  ideal = steps * chunk / rate
  t = statistics.median(times)
  return {
    "hosts": p, "bytes": nbytes, "link_Bps": rate, "tcp_queue": tcp_queue, "steps": steps,
    "trials": trials, **({"congestion_control": cc} if cc else {}),
    **({"work": "ring"} if work else {}), **({"handshake": True} if handshake else {}),
    "time_s": t, "time_s_min": min(times), "time_s_max": max(times),
    "busbw_over_line": ideal / t, "busbw_over_line_best": ideal / min(times),
  }  # fmt: skip


def sweep(a: argparse.Namespace) -> None:
  """Every (repeat, hosts, size, congestion control, variant), taking turns; each row
  printed, and appended to ``--out`` through the row store (kind ``tcp_ring``)."""
  ccs = [c or None for c in a.congestion_controls.split(",")]
  variants = a.variants.split(",")
  known = ("plain", "work", "handshake", "work+handshake")
  if bad := [v for v in variants if v not in known]:
    raise SystemExit(f"--variants: expected some of {', '.join(known)}, got {bad[0]!r}")
  rootless, problem = netns.choose()
  problem = problem or next(filter(None, map(netns.congestion_control_problem, ccs)), None)
  if problem:
    raise SystemExit(problem)
  rate = units.parse_rate(a.link, "--link")
  tcp_queue = units.parse_size(a.tcp_queue, "--tcp-queue")
  store = results.RowStore(a.out, "tcp_ring", context={}) if a.out else None
  for repeat in range(1, a.repeats + 1):
    for p in (int(h) for h in a.hosts.split(",")):
      for nbytes in (units.parse_size(b, "--bytes") for b in a.bytes.split(",")):
        for cc, v in ((cc, v) for cc in ccs for v in variants):
          row = measure(
            p, nbytes, rate, a.trials, tcp_queue, cc, "work" in v, "handshake" in v, rootless
          )
          if a.repeats > 1:
            row["repeat"] = repeat
          print(row, flush=True)
          if store:
            store.append(row, store.key(key(row)))


def key(row: dict) -> dict:
  """A row's configuration: its network (as ``cluster`` describes one) and what ran."""
  net = {"network": "switch", "hosts": row["hosts"], "link_Bps": row["link_Bps"],
         "tcp_queue": row.get("tcp_queue")}  # fmt: skip
  if "congestion_control" in row:
    net["congestion_control"] = row["congestion_control"]
  what = ("bytes", "trials", "work", "handshake", "repeat")
  return {"network": net, **{k: row[k] for k in what if k in row}}


def parser() -> argparse.ArgumentParser:
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
  ap.add_argument(
    "--variants",
    default="plain",
    help="what each step does besides the transfer, comma-separated, taking turns: plain"
    " (nothing), work (the ring's local work: add the arriving chunk to this host's own,"
    " store the gathered ones, as float32 in NumPy), handshake (the sender waits for the"
    " receiver's one-byte 'ready to receive', as gloo's rendezvous does), work+handshake",
  )
  ap.add_argument("--repeats", type=int, default=1, help="rounds over the congestion controls")
  ap.add_argument("--out", default=None, help="the rows' file (.jsonl, appended)")
  return ap


if __name__ == "__main__":
  sweep(parser().parse_args())
