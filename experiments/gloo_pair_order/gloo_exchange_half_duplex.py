"""Minimal reproduction: a pairwise exchange in one ``ppermute`` runs half duplex over gloo.

Self-contained (JAX only), for an upstream report. Start one process per host, with
links of a known rate between them, e.g. on one Linux machine as root:

    allreduce-jax cluster --hosts 4 --link 200Mbit -- python experiments/gloo_pair_order/gloo_exchange_half_duplex.py

(``experiments/emulated_network/run.py sweep 1 9`` runs it so and keeps the rows it prints),
or on any machines: ``JAX_COORDINATOR_ADDRESS=host0:1234 JAX_NUM_PROCESSES=4
JAX_PROCESS_ID=i python gloo_exchange_half_duplex.py``. It times, with 16 MiB per
process (or each of ``--sizes 256KiB,1MiB,...``; median, min and max of 7 after a
warm-up):

- ``shift``: ``ppermute`` with pairs ``j -> j+1``: every host sends n and receives n,
  from different peers;
- ``exchange``: pairs ``j <-> j^1``: every host sends n to and receives n from the
  same peer;
- ``one_way``: ``j -> j^1`` for even j only: half the hosts send n;
- ``handshake``: the exchange right after an exchange of 4 bytes between the same
  pairs (``lax.optimization_barrier`` orders the two), so the two peers post the big
  exchange within a network latency of each other.

On a full-duplex link the three take the same time (n / rate). Measured on 200 Mbit/s
links (``experiments/gloo_pair_order/rows/half_duplex_p4.jsonl``) the exchange takes twice as long: the
two directions take turns (``half_duplex_sizes_p4.jsonl``: 1.31× at 256 KiB, 1.81× at
1 MiB, 1.95× at 4 MiB, where each turn's first 100 KB leave at once from the emulated
link's token bucket, refilled during the other turn). Cause, from the sources: XLA's
``GlooCommunicator::CollectivePermute`` posts ``send`` before ``recv``; in gloo's TCP
pair (``gloo/transport/tcp/pair.cc``) a ``send`` whose peer has already announced its
receive writes the payload at once, and the "ready to receive" that the following
``recv`` announces is queued behind that payload in the pair's one FIFO transmit
queue. The later of the two peers therefore sends its whole payload before the earlier
one may start. Posting the receive first in ``CollectivePermute`` (or letting gloo's
control messages overtake queued data) would let both directions flow at once:
``experiments/gloo_pair_order/`` measures that with gloo alone (C++, no JAX), where the
same exchange with the receive posted first takes one way's time at every size from
256 KiB (``experiments/gloo_pair_order/rows/gloo_pair_order.jsonl``); its README is the report.

``handshake`` is the evidence for that order, and the reason it cannot be fixed from
JAX: when both peers happen to post their send before the other's "ready to receive"
has arrived, both sends wait, both notifications leave, and the exchange runs at full
duplex (its fastest call matches ``shift``); when one peer is later by more than that
latency, which on a loaded host is most calls, it is half duplex again (its median
matches ``exchange``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def _init() -> None:
  env = os.environ
  address = env.get("ALLREDUCE_JAX_COORDINATOR") or env.get("JAX_COORDINATOR_ADDRESS")
  num = env.get("ALLREDUCE_JAX_NUM_PROCESSES") or env.get("JAX_NUM_PROCESSES")
  pid = env.get("ALLREDUCE_JAX_PROCESS_ID") or env.get("JAX_PROCESS_ID")
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(address, int(num), int(pid))


def _handshake(b, axis, perm):
  """4 bytes to the peer, then (ordered after them) the whole buffer."""
  t = jax.lax.ppermute(b[:, :1], axis, perm)
  t, b = jax.lax.optimization_barrier((t, b))
  return jax.lax.ppermute(b, axis, perm) + 0 * t


def _sizes(argv: list[str]) -> list[int]:
  """Bytes per process from ``--sizes 256KiB,1MiB,...`` (default: 16 MiB)."""
  if not argv:
    return [16 << 20]
  if len(argv) != 2 or argv[0] != "--sizes":
    raise SystemExit(f"usage: gloo_exchange_half_duplex.py [--sizes 256KiB,1MiB,...]; got {argv}")
  units = {"KiB": 1 << 10, "MiB": 1 << 20}
  out = []
  for word in argv[1].split(","):
    unit = word[-3:]
    if unit not in units or not word[:-3].isdigit() or int(word[:-3]) == 0:
      raise SystemExit(f"--sizes: {word!r} is not a whole number of KiB or MiB (e.g. 256KiB).")
    out.append(int(word[:-3]) * units[unit])
  return out


def time_all(sizes: list[int]) -> None:
  """Every pattern at every size, on this process's host; process 0 prints the rows."""
  _init()
  for n in sizes:
    _time_patterns(n)


def _time_patterns(n: int) -> None:
  p = jax.device_count()
  mesh = Mesh(np.array(jax.devices()), ("i",))
  perms = {
    "shift": [(j, (j + 1) % p) for j in range(p)],
    "exchange": [(j, j ^ 1) for j in range(p)],
    "one_way": [(j, j ^ 1) for j in range(0, p, 2)],
    "handshake": [(j, j ^ 1) for j in range(p)],
  }
  x = jax.make_array_from_callback(
    (p, n // 4), NamedSharding(mesh, P("i")), lambda idx: np.ones((1, n // 4), np.float32)
  )
  rows = []
  for name, perm in perms.items():
    body = _handshake if name == "handshake" else jax.lax.ppermute
    f = jax.jit(
      jax.shard_map(
        lambda b, perm=perm, body=body: body(b, "i", perm),
        mesh=mesh,
        in_specs=P("i"),
        out_specs=P("i"),
      )
    )
    f(x).block_until_ready()
    times = []
    for _ in range(7):
      t0 = time.perf_counter()
      f(x).block_until_ready()
      times.append(time.perf_counter() - t0)
    rows.append({"p": p, "bytes": n, "pattern": name, "median_s": statistics.median(times),
                 "min_s": min(times), "max_s": max(times)})  # fmt: skip
  if jax.process_index() == 0:
    for r in rows:
      print(json.dumps(r), flush=True)


if __name__ == "__main__":
  time_all(_sizes(sys.argv[1:]))
