"""Near-first halving-doubling: Rabenseifner's steps with the nearest partners first.

The same butterfly as :func:`allreduce_jax._recursive.halving_doubling` (MPICH's fold
for non-powers of two included), with the XOR masks in the order 1, 2, ..., pof2/2:
the big halves go to the nearest partners and only the small slices travel far.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax

from allreduce_jax import _comm, cost_model
from allreduce_jax._comm import AxisName
from allreduce_jax._recursive import butterfly, butterfly_messages, largest_pof2
from allreduce_jax.registry import Algorithm, register

Combine = Callable[[jax.Array, jax.Array], jax.Array]


def near_first_partners(pof2: int) -> list[list[int]]:
  """XOR partners, smallest distance first: masks 1, 2, ..., pof2/2."""
  return [[r ^ (1 << s) for r in range(pof2)] for s in range(pof2.bit_length() - 1)]


def halving_doubling_near(flat: jax.Array, axis_name: AxisName, combine: Combine) -> jax.Array:
  """Halving-doubling with the near-first order: partner ``r XOR 1`` first, then
  ``r XOR 2``, ... ``r XOR pof2/2`` (the all-gather runs the reverse order).

  The same bytes and steps as :func:`halving_doubling`, but the big halves (n/2,
  n/4, ...) go to the nearest partners and only the small slices travel far; rank r
  ends the reduce-scatter owning the slice at bit-reversed position r. On a 1-D torus
  (physical ring) with minimal routing the reduce-scatter's busiest link carries
  (lg p)/2 · n instead of far-first's (p/3)(1 - 1/p²) · n.

  - steps: 2 lg p (+2 when p is not a power of two: MPICH's fold)
  - bytes sent per participant: 2(p-1)/p·n (+n on folded pairs)
  - time (flat α-β): 2 lg p·α + 2(p-1)/p·nβ + (p-1)/p·nγ

  Args/Returns: as :func:`allreduce_jax._ring.ring`.
  """
  return butterfly(
    flat, axis_name, combine, near_first_partners(largest_pof2(_comm.size(axis_name)))
  )


def halving_doubling_near_messages(sizes: tuple[int, ...]) -> list[list[tuple]]:
  """Message steps of :func:`halving_doubling_near` on ``prod(sizes)`` participants."""
  p = math.prod(sizes)
  return butterfly_messages(p, near_first_partners(largest_pof2(p)))


register(
  Algorithm(
    "halving_doubling_near",
    halving_doubling_near,
    schedule=cost_model.halving_doubling_near_schedule,
    messages=halving_doubling_near_messages,
    summary="halving-doubling with the nearest partners first (big halves go near)",
  )
)
