"""Hierarchical all-reduce over a mesh of two or more axes ``(outer, ..., inner)``.

The 2-D/3-D torus scheme of TPU pods (Ying et al. 2018; Mikami et al. 2018 for
2-D): ring reduce-scatters along the axes from the innermost (fastest) outwards,
a ring all-reduce of the remaining 1/(product of the inner sizes) shard along the
outermost axis, then ring all-gathers back in along the axes. Every phase is a ring
on one mesh axis, so on a torus each uses only that dimension's links.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax

from allreduce_jax import _comm, cost_model
from allreduce_jax._ring import ring, ring_all_gather, ring_reduce_scatter
from allreduce_jax.registry import Algorithm, register

Combine = Callable[[jax.Array, jax.Array], jax.Array]


def hierarchical(flat: jax.Array, axis_name: Sequence[str], combine: Combine) -> jax.Array:
  """Reduce-scatter along the inner axes (innermost first), all-reduce the
  remaining shard along the outermost axis, all-gather back along the inner axes.

  With axis sizes a_0 (outer), a_1, ..., a_m (inner) and n bytes per participant,
  level d (m, m-1, ..., 1) reduce-scatters n/(a_m···a_{d+1}) bytes over a_d
  participants; the outermost ring all-reduces n/(a_1···a_m) bytes. For two axes
  ``(outer, inner)`` = (b, a) with inner the fast level (GPUs in a node on NVLink)
  and outer the slow one (nodes on InfiniBand), the slow links carry only n/a bytes
  per participant and take 2(b-1) steps instead of 2(ab-1).

  - steps: 2 Σ_{d≥1} (a_d - 1) + 2(a_0 - 1)
  - bytes sent per participant: Σ_{d≥1} 2(a_d-1)/a_d · n/(a_m···a_{d+1})
    + 2(a_0-1)/a_0 · n/(a_1···a_m)
  - time (two axes): 2(a-1)α₁ + 2(a-1)/a·nβ₁ + (a-1)/a·nγ + T_ring(b, n/a; α₂, β₂, γ)

  Args:
    flat: ``T[n]``.
    axis_name: a tuple of two or more mesh axis names, outer first
      (``(outer, inner)``; ``(x, y, z)`` on a 3-D torus).
    combine: elementwise reduction.

  Returns:
    ``T[n]``, reduced over every axis, identical on all participants.
  """
  *outer_axes, inner = tuple(axis_name)
  if not outer_axes:
    raise ValueError(f"hierarchical needs at least two mesh axes, got {axis_name!r}.")
  a, n = _comm.size(inner), flat.shape[0]
  padded = _comm.pad_to_multiple(flat, a)  # T[a*c]
  shard = ring_reduce_scatter(padded, inner, combine)  # T[c], reduced over inner
  if len(outer_axes) > 1:
    shard = hierarchical(shard, tuple(outer_axes), combine)  # reduced over the rest
  elif _comm.size(outer_axes[0]) > 1:
    shard = ring(shard, outer_axes[0], combine)  # T[c], reduced over both
  return ring_all_gather(shard, inner)[:n]


def hierarchical_messages(sizes: tuple[int, ...]) -> list[list[tuple]]:
  """Message steps of :func:`hierarchical` on a mesh of axis sizes ``sizes`` (outer
  first), participants numbered row-major; each step a list of
  ``(source, target, fraction of n, combined)``. Fractions ignore padding."""
  sizes = tuple(sizes)
  if len(sizes) < 2:
    raise ValueError(f"hierarchical needs at least two axes, got sizes={sizes}.")
  p = math.prod(sizes)
  index = [divmod_all(r, sizes) for r in range(p)]

  def along(axis: int, frac: float, combined: bool) -> list[tuple]:
    size, stride = sizes[axis], math.prod(sizes[axis + 1 :])
    return [
      (r, r + ((idx[axis] + 1) % size - idx[axis]) * stride, frac, combined)
      for r, idx in enumerate(index)
    ]

  def level(axis: int, frac: float) -> list[list[tuple]]:
    # Repeated steps share one list object (the replay prices each distinct step once).
    a = sizes[axis]
    rs = [along(axis, frac / a, True)] * (a - 1)
    ag = [along(axis, frac / a, False)] * (a - 1)
    if axis == 0:  # the outermost: a ring all-reduce of the shard
      return rs + ag
    return rs + level(axis - 1, frac / a) + ag

  return level(len(sizes) - 1, 1.0)


def divmod_all(r: int, sizes: Sequence[int]) -> tuple[int, ...]:
  """Row-major coordinates of flat index ``r`` in a mesh of shape ``sizes``."""
  out = []
  for s in reversed(sizes):
    r, x = divmod(r, s)
    out.append(x)
  return tuple(reversed(out))


register(
  Algorithm(
    "hierarchical",
    hierarchical,
    axes=2,
    auto=False,
    schedule=cost_model.hierarchical_schedule,
    messages=hierarchical_messages,
    two_level=cost_model.hierarchical_two_level,
    summary="ring RS inside, all-reduce across on 1/a, AG inside",
  )
)
