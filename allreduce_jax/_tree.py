"""Binomial-tree all-reduce: reduce to participant 0, then broadcast from it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from allreduce_jax import _comm, cost_model
from allreduce_jax._comm import AxisName
from allreduce_jax.registry import Algorithm, register

Combine = Callable[[jax.Array, jax.Array], jax.Array]


def tree(flat: jax.Array, axis_name: AxisName, combine: Combine) -> jax.Array:
  """Binomial-tree reduce to participant 0, then binomial-tree broadcast.

  Reduce: at distance ``mask`` = 1, 2, 4, ... every participant whose rank is an odd
  multiple of ``mask`` sends its partial result to ``rank - mask``. Broadcast runs the
  same tree backwards. Only ⌈lg p⌉ steps each way, but every step moves the full
  buffer and half the participants idle: the old MPICH default, kept as the
  latency-friendly, bandwidth-poor baseline.

  - steps: 2⌈lg p⌉
  - bytes sent per participant: up to ⌈lg p⌉·n (the root, during the broadcast)
  - time: 2⌈lg p⌉(α + nβ) + ⌈lg p⌉·nγ

  Args/Returns: as :func:`allreduce_jax._ring.ring`.
  """
  p, i = _comm.size(axis_name), _comm.index(axis_name)
  x = flat  # T[n]
  masks = []
  mask = 1
  while mask < p:  # reduce towards 0
    masks.append(mask)
    recv = _comm.send(x, axis_name, [(j, j - mask) for j in range(mask, p, 2 * mask)])
    receiving = (i % (2 * mask) == 0) & (i + mask < p)
    x = jnp.where(receiving, combine(x, recv), x)
    mask <<= 1
  x = _comm.settle(x)  # lossy wire: the root holds what it broadcasts
  for mask in reversed(masks):  # broadcast from 0
    recv = _comm.send(x, axis_name, [(j, j + mask) for j in range(0, p - mask, 2 * mask)])
    x = jnp.where(i % (2 * mask) == mask, recv, x)
  return x


def tree_messages(sizes: Sequence[int]) -> list[list[tuple]]:
  """Binomial reduce to 0 (masks 1, 2, 4, ...) then broadcast back, full buffers."""
  (p,) = sizes
  masks = [1 << k for k in range((p - 1).bit_length())]
  up = [[(j, j - m, 1.0, True) for j in range(m, p, 2 * m)] for m in masks]
  down = [[(j, j + m, 1.0, False) for j in range(0, p - m, 2 * m)] for m in reversed(masks)]
  return up + down


register(
  Algorithm(
    "tree",
    tree,
    schedule=cost_model.tree_schedule,
    messages=tree_messages,
    two_level=cost_model.tree_two_level,
    summary="binomial reduce to a root, then binomial broadcast",
  )
)
