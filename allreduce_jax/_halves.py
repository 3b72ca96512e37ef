"""The two halves of an all-reduce as collectives of their own: :func:`reduce_scatter`
and :func:`all_gather`, for the algorithms whose record has them.

A ring all-reduce is a reduce-scatter (participant i ends with chunk i of the
reduction) followed by an all-gather (every chunk to everyone). Sharded data
parallelism (ZeRO, FSDP) uses the halves apart: gradients reduce-scattered, each
participant updating its own slice of the parameters and optimizer state, the
parameters all-gathered. The two functions mirror ``lax.psum_scatter`` and
``lax.all_gather`` (same arguments, same shapes, same chunk order) and take an
``algorithm=`` like :func:`~allreduce_jax.all_reduce`; like it, this module checks,
reshapes and dispatches, and each algorithm's module holds its per-shard halves
(the record's ``reduce_scatter`` and ``all_gather`` fields).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from allreduce_jax import _comm
from allreduce_jax._api import check_axis_name, keyword_only
from allreduce_jax._comm import AxisName
from allreduce_jax._ops import get_op
from allreduce_jax.registry import ALGORITHMS, check_algorithm, names


def _check_halves(algorithm: str) -> None:
  check_algorithm(algorithm)
  if not ALGORITHMS[algorithm].halves:
    raise ValueError(
      f"algorithm={algorithm!r} has no reduce-scatter and all-gather of its own; expected"
      f" one of {list(names(halves=True))}."
    )


def _user_order(axis_name: AxisName) -> np.ndarray | None:
  """``perm[j]``: the index, in the order ``axis_name`` lists its axes, of the
  participant numbered ``j`` in the mesh's order (which the algorithms use); None
  when the two orders agree. ``lax.psum_scatter`` and ``lax.all_gather`` number
  participants in the order given, as ``lax.axis_index`` does."""
  given = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
  mesh = _comm.axes_tuple(given)
  if mesh == given:
    return None
  sizes = {a: int(lax.axis_size(a)) for a in given}
  coords = np.unravel_index(np.arange(int(np.prod(list(sizes.values())))), [sizes[a] for a in mesh])
  by_name = dict(zip(mesh, coords))
  return np.ravel_multi_index([by_name[a] for a in given], [sizes[a] for a in given])


def _axis(value, ndim: int, name: str) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise TypeError(f"{name}={value!r} must be an int.")
  if not -ndim <= value < ndim:
    raise ValueError(f"{name}={value} is out of range for {ndim} dimension(s).")
  return int(value) % ndim


def _check_tiled(tiled) -> None:
  if not isinstance(tiled, bool):
    raise TypeError(f"tiled={tiled!r} must be True or False.")


@keyword_only(2, "op, algorithm, scatter_dimension and tiled")
def reduce_scatter(
  x: jax.Array,
  axis_name: AxisName,
  *,
  op: str = "sum",
  algorithm: str = "ring",
  scatter_dimension: int = 0,
  tiled: bool = False,
) -> jax.Array:
  """Reduces ``x`` over ``axis_name`` and leaves participant ``i`` the ``i``-th slice.

  ``lax.psum_scatter`` with an ``op`` and an ``algorithm``: call it inside a
  ``jax.shard_map`` body. With ``tiled=True``, ``x.shape[scatter_dimension]`` is a
  multiple of the p participants and is divided by p; with ``tiled=False`` (the
  default, as in ``lax``) it equals p and is removed. Participants are numbered as
  ``lax.axis_index(axis_name)`` numbers them.

  For n elements per participant: the ring takes p-1 steps and sends (p-1)/p·n
  bytes per participant, (p-1)α + (p-1)/p·nβ + (p-1)/p·nγ, half an all-reduce;
  halving-doubling the same bytes in lg p steps (a power-of-two p only).

  Args:
    x: the local block, a numeric dtype.
    axis_name: a mesh axis name or a tuple of names (their product), as in ``lax``.
    op: keyword-only, one of ``OPS``: ``"sum"`` (``lax.psum_scatter``), ``"mean"``,
      ``"max"``, ``"min"``.
    algorithm: keyword-only, an algorithm with halves (``names(halves=True)``:
      ``"ring"``, ``"bidirectional_ring"``, ``"halving_doubling"``, ``"two_shot"``,
      ``"psum"`` = XLA's own).
    scatter_dimension: keyword-only, the dimension of ``x`` to scatter.
    tiled: keyword-only, as in ``lax.psum_scatter``.

  Returns:
    This participant's slice, reduced over all participants: bit for bit the
    slice :func:`~allreduce_jax.all_reduce` with the same ``algorithm`` and ``op``
    computes for it. Typed like ``lax.psum_scatter``'s: varying over ``axis_name``.

  Gradients: ``jax.grad``/``jax.vjp`` give ``lax.psum_scatter``'s (for ``"sum"``,
  the transpose of a reduce-scatter is an all-gather of the cotangent, here sent
  through the same algorithm's ``ppermute``\\ s in reverse).

  Raises:
    ValueError: unknown ``op``, an ``algorithm`` without halves, an unbound
      ``axis_name``, a ``scatter_dimension`` out of range, a size that does not
      suit ``tiled``, halving-doubling over a p that is not a power of two.
    TypeError: options passed positionally, a non-numeric dtype, integer ``mean``.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> from allreduce_jax import reduce_scatter
    >>> mesh = jax.make_mesh((4,), ("i",), devices=jax.devices()[:4])
    >>> x = jax.device_put(jnp.arange(16.0), jax.NamedSharding(mesh, P("i")))
    >>> f = jax.shard_map(lambda b: reduce_scatter(b, "i", tiled=True), mesh=mesh,
    ...                   in_specs=P("i"), out_specs=P("i"))
    >>> print(f(x))  # participant i: element i of the sum of the four blocks
    [24. 28. 32. 36.]
  """
  x = jnp.asarray(x)
  reduction = get_op(op, x.dtype)
  _check_halves(algorithm)
  _check_tiled(tiled)
  check_axis_name(axis_name, algorithm)
  if x.ndim == 0:
    raise ValueError("x is a scalar: reduce_scatter needs a dimension to scatter.")
  d = _axis(scatter_dimension, x.ndim, "scatter_dimension")
  p = _comm.size(axis_name)
  size = x.shape[d]
  if (tiled and size % p) or (not tiled and size != p):
    want = f"a multiple of {p}" if tiled else f"{p}"
    raise ValueError(
      f"x.shape[{d}] = {size} (scatter_dimension={scatter_dimension}, tiled={tiled}) must"
      f" be {want}, the participants along axis_name={axis_name!r}."
    )
  moved = jnp.moveaxis(x, d, 0)  # T[p*m, ...]: participant j's slice is rows j*m..
  flat = moved.reshape(p, -1)  # T[p, c]
  perm = _user_order(axis_name)
  if perm is not None:  # mesh-order participant j gets the slice of its given-order index
    flat = flat[perm]
  flat = flat.reshape(-1)  # T[p*c]
  if ALGORITHMS[algorithm].hand_written:  # mixed with ppermute results: typed varying
    flat = _comm.make_varying(flat, axis_name)
  block = ALGORITHMS[algorithm].reduce_scatter(flat, axis_name, reduction.combine)  # T[c]
  block = reduction.finalize(block, p)
  shape = (size // p, *moved.shape[1:]) if tiled else moved.shape[1:]
  out = block.reshape(shape)
  return jnp.moveaxis(out, 0, d) if tiled else out


@keyword_only(2, "algorithm, axis and tiled")
def all_gather(
  x: jax.Array,
  axis_name: AxisName,
  *,
  algorithm: str = "ring",
  axis: int = 0,
  tiled: bool = False,
) -> jax.Array:
  """Gathers every participant's ``x`` into one array on every participant.

  ``lax.all_gather`` with an ``algorithm``: call it inside a ``jax.shard_map`` body.
  With ``tiled=False`` (the default, as in ``lax``) the blocks are stacked along a
  new dimension ``axis`` of size p; with ``tiled=True`` they are concatenated along
  dimension ``axis``. Block ``j`` is participant ``j``'s, numbered as
  ``lax.axis_index(axis_name)`` numbers them.

  For a result of n elements: the ring takes p-1 steps and sends (p-1)/p·n bytes
  per participant, (p-1)α + (p-1)/p·nβ; halving-doubling lg p steps (a power-of-two
  p only).

  Args:
    x: the local block, any shape and dtype.
    axis_name: a mesh axis name or a tuple of names (their product), as in ``lax``.
    algorithm: keyword-only, an algorithm with halves (``names(halves=True)``).
    axis: keyword-only, where the blocks go (``lax.all_gather``'s ``axis``).
    tiled: keyword-only, as in ``lax.all_gather``.

  Returns:
    The gathered array, the same bits on every participant, typed like
    ``lax.all_gather``'s: varying over ``axis_name``.

  Gradients: ``jax.grad``/``jax.vjp`` give ``lax.all_gather``'s (the transpose of
  an all-gather is a reduce-scatter (sum) of the cotangent).

  Raises:
    ValueError: an ``algorithm`` without halves, an unbound ``axis_name``, an
      ``axis`` out of range, halving-doubling over a p that is not a power of two.
    TypeError: options passed positionally, a non-integer ``axis``.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> from allreduce_jax import all_gather
    >>> mesh = jax.make_mesh((4,), ("i",), devices=jax.devices()[:4])
    >>> x = jax.device_put(jnp.arange(4.0), jax.NamedSharding(mesh, P("i")))
    >>> f = jax.shard_map(lambda b: all_gather(b, "i", tiled=True), mesh=mesh,
    ...                   in_specs=P("i"), out_specs=P("i"))
    >>> print(f(x))  # every participant's copy, one after the other
    [0. 1. 2. 3. 0. 1. 2. 3. 0. 1. 2. 3. 0. 1. 2. 3.]
  """
  x = jnp.asarray(x)
  _check_halves(algorithm)
  _check_tiled(tiled)
  check_axis_name(axis_name, algorithm)
  if tiled and x.ndim == 0:
    raise ValueError("x is a scalar: a tiled all_gather needs a dimension to concatenate.")
  a = _axis(axis, x.ndim if tiled else x.ndim + 1, "axis")
  p = _comm.size(axis_name)
  moved = jnp.moveaxis(x, a, 0) if tiled else x[None]  # T[m, ...]
  block = moved.reshape(-1)  # T[c]
  if ALGORITHMS[algorithm].hand_written:
    block = _comm.make_varying(block, axis_name)
  gathered = ALGORITHMS[algorithm].all_gather(block, axis_name).reshape(p, -1)  # T[p, c]
  perm = _user_order(axis_name)
  if perm is not None:  # block j belongs at the given-order index of participant j
    gathered = gathered[np.argsort(perm)]
  out = gathered.reshape(p * moved.shape[0], *moved.shape[1:])
  return jnp.moveaxis(out, 0, a)


__all__ = ["all_gather", "reduce_scatter"]
