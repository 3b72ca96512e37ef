"""Swing all-reduce (De Sensi, Bonato, Saam & Hoefler, NSDI 2024), bandwidth-optimal variant.

A reduce-scatter by recursive halving and an all-gather by recursive doubling, like
Rabenseifner's, but with the Swing partner: at step s participant r talks to

    r + ρ(s) (r even)   or   r - ρ(s) (r odd)   (mod p),
    ρ(s) = Σ_{i=0..s} (-2)^i = (1 - (-2)^{s+1}) / 3 = 1, -1, 3, -5, 11, -21, ...

so the distance of step s is |ρ(s)| ≈ 2^{s+1}/3 instead of 2^s: partners stay about
a third closer than recursive doubling's on a ring or torus, while every step is
still a perfect matching (the map is an involution: ρ(s) is odd, so an even rank's
partner is odd and maps back). The reduce-scatter runs the steps near-first (s = 0,
1, ...), sending the largest halves the shortest distances.
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


def rho(s: int) -> int:
  """ρ(s) = Σ_{i=0..s} (-2)^i: 1, -1, 3, -5, 11, -21, 43, ..."""
  return (1 - (-2) ** (s + 1)) // 3


def swing_partners(p: int) -> list[list[int]]:
  """``partners[s][r]``: rank r's Swing partner at step s, for p a power of two."""
  if p & (p - 1):
    raise ValueError(f"swing_partners needs a power of two, got p={p}.")
  steps = p.bit_length() - 1
  return [
    [(r + rho(s)) % p if r % 2 == 0 else (r - rho(s)) % p for r in range(p)] for s in range(steps)
  ]


def swing(flat: jax.Array, axis_name: AxisName, combine: Combine) -> jax.Array:
  """Swing all-reduce: reduce-scatter + all-gather in 2 lg p steps with partners r ± ρ(s).

  Reduce-scatter step s (s = 0 .. lg p - 1): every participant sends its partner the
  blocks the partner will be responsible for, i.e. the blocks owned by the ranks the
  partner reaches in the remaining steps s+1, ... (its *group*), and combines the
  other half, the blocks of its own group, with what it receives. The groups of the
  remaining steps halve at every step (checked for every power of two by
  :func:`allreduce_jax._recursive.butterfly_tables`), so laying the blocks out in
  group order makes each of those block sets one contiguous half of the current
  slice: after lg p steps rank r owns one n/p slice, fully reduced. The all-gather
  retraces the steps in reverse. For p not a power of two, MPICH's fold: the first
  2·rem participants pair up (``2k`` hands its buffer to ``2k+1``), the remaining
  pof2 run Swing on their folded ranks, and ``2k+1`` hands the result back.

  - steps: 2 lg p (+2 when p is not a power of two)
  - bytes sent per participant: 2(p-1)/p·n (bandwidth-optimal; +n on folded pairs)
  - time (flat α-β): 2 lg p·α + 2(p-1)/p·nβ + (p-1)/p·nγ, the same as
    Rabenseifner's; Swing's gain is the distance: on a 64-node 1-D torus the
    reduce-scatter's busiest link carries 1.55·n against 21.3·n for the far-first
    XOR order and 3.0·n near-first.

  Args/Returns: as :func:`allreduce_jax._ring.ring`.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> from allreduce_jax import all_reduce
    >>> mesh = jax.make_mesh((8,), ("i",))
    >>> f = jax.shard_map(lambda x: all_reduce(x, "i", algorithm="swing"), mesh=mesh,
    ...                   in_specs=P("i"), out_specs=P("i"))
    >>> x = jax.device_put(jnp.arange(8.0), jax.NamedSharding(mesh, P("i")))
    >>> print(f(x))
    [28. 28. 28. 28. 28. 28. 28. 28.]

  References:
    De Sensi, Bonato, Saam & Hoefler, "Swing: Short-cutting Rings for Higher
    Bandwidth Allreduce", NSDI 2024.
  """
  return butterfly(flat, axis_name, combine, swing_partners(largest_pof2(_comm.size(axis_name))))


def swing_messages(sizes: tuple[int, ...]) -> list[list[tuple]]:
  """Message steps of :func:`swing` on ``prod(sizes)`` participants (mesh row-major
  order): fold, lg pof2 halving steps, the doubling steps in reverse, unfold; each
  step a list of ``(source, target, fraction of n, combined)``."""
  p = math.prod(sizes)
  return butterfly_messages(p, swing_partners(largest_pof2(p)))


register(
  Algorithm(
    "swing",
    swing,
    schedule=cost_model.swing_schedule,
    messages=swing_messages,
    summary="Swing: halving RS + doubling AG with partners r ± ρ(s), near-first",
  )
)
