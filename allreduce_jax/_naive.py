"""Centralized ("parameter server") all-reduce: the baseline with a bottleneck."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from allreduce_jax import _comm, cost_model
from allreduce_jax._comm import AxisName
from allreduce_jax.registry import Algorithm, register

Combine = Callable[[jax.Array, jax.Array], jax.Array]


def naive(flat: jax.Array, axis_name: AxisName, combine: Combine) -> jax.Array:
  """Everyone sends its buffer to participant 0, which reduces and sends the result
  back to everyone.

  A ppermute is a permutation (each participant receives at most one message per
  step), so the root takes the p-1 incoming buffers one step at a time and sends the
  result out one step at a time, exactly like a single parameter-server NIC would.

  - steps: 2(p-1), all through the root
  - bytes: the root receives (p-1)·n and sends (p-1)·n, 2(p-1)·n through one link
  - time: 2(p-1)(α + nβ) + (p-1)·nγ — grows linearly with p

  Args/Returns: as :func:`allreduce_jax._ring.ring`.
  """
  p, i = _comm.size(axis_name), _comm.index(axis_name)
  total = flat  # T[n]; meaningful on the root only until the broadcast
  for k in range(1, p):
    total = combine(total, _comm.send(flat, axis_name, [(k, 0)]))
  total = _comm.settle(total)  # lossy wire: the root holds what it broadcasts
  for k in range(1, p):
    recv = _comm.send(total, axis_name, [(0, k)])
    total = jnp.where(i == k, recv, total)
  return total


def naive_messages(sizes: Sequence[int]) -> list[list[tuple]]:
  """Everyone to participant 0, one at a time, then 0 to everyone, full buffers."""
  (p,) = sizes
  return [[(k, 0, 1.0, True)] for k in range(1, p)] + [[(0, k, 1.0, False)] for k in range(1, p)]


register(
  Algorithm(
    "naive",
    naive,
    schedule=cost_model.naive_schedule,
    messages=naive_messages,
    at_scale=False,
    summary="parameter server: everyone to a root and back",
  )
)
