"""Two-level hierarchical all-reduce over a 2-D mesh ``(outer, inner)``."""

from __future__ import annotations

from collections.abc import Callable

import jax

from allreduce_jax import _comm
from allreduce_jax._ring import ring, ring_all_gather, ring_reduce_scatter

Combine = Callable[[jax.Array, jax.Array], jax.Array]


def hierarchical(flat: jax.Array, axis_name: tuple[str, str], combine: Combine) -> jax.Array:
  """Reduce-scatter along ``inner``, all-reduce the 1/a shard along ``outer``,
  all-gather along ``inner`` (a = |inner|, b = |outer|).

  With ``inner`` the fast level (GPUs in a node on NVLink) and ``outer`` the slow one
  (nodes on InfiniBand), the slow links carry only n/a bytes per participant and the
  step count on them is 2(b-1) instead of 2(ab-1). All three phases use rings.

  - steps: 2(a-1) on inner links + 2(b-1) on outer links
  - bytes sent per participant: 2(a-1)/a·n (inner) + 2(b-1)/b·n/a (outer)
  - time: 2(a-1)α₁ + 2(a-1)/a·nβ₁ + (a-1)/a·nγ + T_ring(b, n/a; α₂, β₂, γ)

  Args:
    flat: ``T[n]``.
    axis_name: ``(outer, inner)``, two mesh axis names.
    combine: elementwise reduction.

  Returns:
    ``T[n]``, reduced over both axes, identical on all a·b participants.
  """
  outer, inner = axis_name
  a, n = _comm.size(inner), flat.shape[0]
  padded = _comm.pad_to_multiple(flat, a)  # T[a*c]
  shard = ring_reduce_scatter(padded, inner, combine)  # T[c], reduced over inner
  if _comm.size(outer) > 1:
    shard = ring(shard, outer, combine)  # T[c], reduced over both
  return ring_all_gather(shard, inner)[:n]
