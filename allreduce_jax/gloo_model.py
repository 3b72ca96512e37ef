"""gloo on a real wire: bytes per host, the half-duplex exchange, one collective at a time.

Measured on an emulated cluster (``allreduce-jax cluster``, shaped 200 Mbit/s links) and
traced to the sources, what the replay (:mod:`allreduce_jax.topology`) did not know:

- **Bytes per host** are the schedule's: :func:`schedule_bytes` sums a host's messages
  (the ring's ~2n, the parameter server root's (p-1)n) and the interface counters
  agree within TCP/IP headers (``docs/results/network/``); :func:`link_params` prices
  those headers (:func:`payload_share`: 4.4 % of the link at a 1500-byte MTU).
- **A pairwise exchange runs half duplex over gloo.** When host A and B swap buffers in
  one ``ppermute``, XLA's gloo collective-permute posts the send before the receive
  (``xla/backends/cpu/collectives/gloo_communicator.cc``), and gloo's TCP pair sends
  its control messages through the same first-in-first-out queue as data
  (``gloo/transport/tcp/pair.cc``: ``send`` transmits at once if the peer's
  "ready to receive" arrived, and the following ``recv``'s "ready to receive" waits
  behind that payload). So the later of the two sends its whole payload before the
  earlier learns it may send: the two directions take turns. :func:`half_duplex`
  prices that: in each step, a message whose reverse is in the same step shares the
  pair's time with it (its fraction becomes the sum of both). A shift (j → j+1) has
  no reverse message and keeps full duplex.
- **One collective at a time.** XLA:CPU's collective thunks all write one resource,
  the communicator (``xla/backends/cpu/runtime/collective_thunk.cc``:
  ``resource_uses``), so its executor runs them in program order, one after the other,
  even the ppermutes an algorithm issues together (the bidirectional ring's two lanes,
  a double-tree round). :func:`ppermute_steps` lists a schedule that way (one step per
  ppermute: its own α, its own half-duplex check), so the two lanes of the
  bidirectional ring are two shifts in turn, not one exchange between neighbours.

NumPy over the replay's schedules; it traces nothing and touches no device.
"""

from __future__ import annotations

import numpy as np

from allreduce_jax import cost_model, topology
from allreduce_jax.registry import ALGORITHMS


def emulated(network: str):
  """The topology that models ``allreduce-jax cluster --topology network``: its hosts
  have one link each, so ``switch`` is :func:`topology.switch` with one port (a host's
  messages of a step share its link, in and out); the others as
  :func:`topology.parse` reads them."""
  top = topology.parse(network)
  if isinstance(top, topology.Switch) and top.ports is None:
    return topology.switch(1)
  return top


def schedule_bytes(algorithm: str, p: int, n_bytes: float, top=None) -> np.ndarray:
  """``float[p]``: bytes participant i sends in ``algorithm``'s generated schedule for
  ``n_bytes`` per participant (its messages' fractions × n, summed over steps)."""
  top = top or topology.switch()
  sizes = topology.axis_sizes(algorithm, p, top)
  sent = np.zeros(p)
  for step in topology.messages(algorithm, sizes, n_bytes):
    for m in step:
      sent[m[0]] += m[2] * n_bytes
  return sent


def ppermute_steps(algorithm: str, sizes: tuple[int, ...], n_bytes: float) -> topology.Steps:
  """``algorithm``'s schedule one step per ``ppermute``, as XLA:CPU runs it: the
  record's ``ppermutes`` generator where its message steps hold several ppermutes,
  else its ``messages`` steps (each already one ppermute)."""
  record = ALGORITHMS[algorithm]
  if record.ppermutes is None:
    return topology.messages(algorithm, sizes, n_bytes)
  if topology.takes_size(record.ppermutes):
    return record.ppermutes(tuple(sizes), n_bytes=n_bytes)
  return record.ppermutes(tuple(sizes))


def half_duplex(steps: topology.Steps) -> topology.Steps:
  """The schedule as gloo runs it: in every step, a message ``a → b`` whose reverse
  ``b → a`` is in the same step carries both fractions (the pair takes turns).
  Identical steps stay shared (one conversion each), so long schedules stay cheap."""
  converted: dict[int, list] = {}
  out = []
  for step in steps:
    key = id(step)
    if key not in converted:
      pair = {}
      for m in step:
        pair[(m[0], m[1])] = pair.get((m[0], m[1]), 0.0) + m[2]
      new = []
      for m in step:
        back = pair.get((m[1], m[0]), 0.0)
        new.append((m[0], m[1], m[2] + back, *m[3:]))
      converted[key] = new
    out.append(converted[key])
  return out


def steps_as_run(
  algorithm: str, sizes: tuple[int, ...], n_bytes: float, duplex: str = "half"
) -> topology.Steps:
  """The steps :func:`predict_seconds` replays: ``duplex="half"``, as XLA:CPU and gloo run
  them (:func:`ppermute_steps`, then :func:`half_duplex`); ``"full"``, the record's
  ``messages`` as :mod:`allreduce_jax.topology` replays them."""
  if duplex == "half":
    return half_duplex(ppermute_steps(algorithm, sizes, n_bytes))
  if duplex == "full":
    return topology.messages(algorithm, sizes, n_bytes)
  raise ValueError(f"duplex={duplex!r}: expected 'half' or 'full'.")


def predict_seconds(
  algorithm: str,
  p: int,
  n_bytes: float,
  params: cost_model.Params,
  top=None,
  duplex: str = "half",
) -> float:
  """The replayed time of ``algorithm`` (generated schedule) on ``top`` (default the
  switch) with ``params``; ``duplex="half"`` prices it as XLA:CPU and gloo run it (one
  ppermute at a time, :func:`ppermute_steps`; exchanges at half duplex), ``"full"`` is
  :func:`topology.predict_seconds`'s assumption (a step's ppermutes together, every
  link full duplex)."""
  if duplex not in ("half", "full"):
    raise ValueError(f"duplex={duplex!r}: expected 'half' or 'full'.")
  if p < 2:
    return 0.0
  top = top or topology.switch()
  steps = steps_as_run(algorithm, topology.axis_sizes(algorithm, p, top), n_bytes, duplex)
  prof = topology.profile(steps, top, p)
  return float(prof.seconds(n_bytes, cost_model.resolve(params, algorithm)).sum())


def payload_share(mtu: int = 1500) -> float:
  """The share of a shaped link's bytes that is TCP payload in bulk transfer: a full
  segment carries ``mtu - 52`` payload bytes (20 of IPv4, 32 of TCP with timestamps)
  in an ``mtu + 14``-byte frame (the Ethernet header, which ``tc`` counts): 0.956 at
  1500, 0.993 at 9000. The plain-TCP ring on the emulated switch reaches 0.951–0.955
  of the rate (``experiments/tcp_ring_ceiling.py``)."""
  if mtu <= 52:
    raise ValueError(f"mtu={mtu!r}: expected more than 52 bytes (IPv4 + TCP headers).")
  return (mtu - 52) / (mtu + 14)


def link_params(rate_bytes_per_s: float, alpha_s: float, mtu: int = 1500) -> cost_model.Params:
  """α-β parameters of an emulated link for gloo's payload: β from its rate and the
  frames' headers (:func:`payload_share` at ``mtu``), α (per step) as fitted."""
  return cost_model.Params(alpha_s, 1.0 / (rate_bytes_per_s * payload_share(mtu)), 0.0)
