"""gloo on a real wire: bytes per host from a schedule, and the half-duplex pairwise exchange.

Measured on an emulated cluster (``allreduce-jax cluster``, shaped 200 Mbit/s links),
two things the replay (:mod:`allreduce_jax.topology`) did not know:

- **Bytes per host** are the schedule's: :func:`schedule_bytes` sums a host's messages
  (the ring's ~2n, the parameter server root's (p-1)n) and the interface counters
  agree within TCP/IP headers (``docs/results/network/``).
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

Pure Python and NumPy; importing it does not import JAX.
"""

from __future__ import annotations

import numpy as np

from allreduce_jax import cost_model, topology


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


def predict_seconds(
  algorithm: str,
  p: int,
  n_bytes: float,
  params: cost_model.Params,
  top=None,
  duplex: str = "half",
) -> float:
  """The replayed time of ``algorithm`` (generated schedule) on ``top`` (default the
  switch) with ``params``; ``duplex="half"`` prices exchanges as gloo runs them,
  ``"full"`` is :func:`topology.predict_seconds`'s assumption."""
  if duplex not in ("half", "full"):
    raise ValueError(f"duplex={duplex!r}: expected 'half' or 'full'.")
  if p < 2:
    return 0.0
  top = top or topology.switch()
  sizes = topology.axis_sizes(algorithm, p, top)
  steps = topology.messages(algorithm, sizes, n_bytes)
  if duplex == "half":
    steps = half_duplex(steps)
  prof = topology.profile(steps, top, p)
  return float(prof.seconds(n_bytes, cost_model.resolve(params, algorithm)).sum())


def link_params(rate_bytes_per_s: float, alpha_s: float) -> cost_model.Params:
  """α-β parameters of an emulated link: β from its rate, α (per step) as fitted."""
  return cost_model.Params(alpha_s, 1.0 / rate_bytes_per_s, 0.0)
