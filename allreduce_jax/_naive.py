"""Centralized ("parameter server") all-reduce: the baseline with a bottleneck."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from allreduce_jax import _comm
from allreduce_jax._comm import AxisName

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
