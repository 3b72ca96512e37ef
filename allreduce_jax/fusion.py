"""Tensor fusion: all-reduce a pytree through a few large flat buckets.

Many small all-reduces each pay the per-step latency; packing the leaves of a
gradient pytree into flat per-dtype buffers pays it once per bucket (PyTorch DDP:
25 MB buckets; Horovod: a 64-128 MB fusion buffer).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from allreduce_jax import _comm, cost_model
from allreduce_jax._api import all_reduce, check_axis_name, check_wire, keyword_only
from allreduce_jax._comm import AxisName
from allreduce_jax._invariant import typed, varying_axes
from allreduce_jax._ops import get_op
from allreduce_jax.registry import check_algorithm


def plan_buckets(leaves: Sequence[Any], bucket_bytes: int | None) -> list[list[int]]:
  """Groups leaf indices into buckets of one dtype and at most ``bucket_bytes``.

  Leaves keep their order within a dtype; a leaf larger than ``bucket_bytes`` gets
  a bucket of its own (leaves are never split). ``None`` means one bucket per dtype,
  ``0`` one bucket per leaf.

  Example:
    >>> import numpy as np
    >>> leaves = [np.zeros(4, np.float32), np.zeros(2, np.int32), np.zeros(4, np.float32)]
    >>> plan_buckets(leaves, None)
    [[0, 2], [1]]
    >>> plan_buckets(leaves, 16)
    [[0], [1], [2]]
  """
  if bucket_bytes is not None and (
    isinstance(bucket_bytes, bool)
    or not isinstance(bucket_bytes, (int, np.integer))
    or bucket_bytes < 0
  ):
    raise ValueError(
      f"bucket_bytes={bucket_bytes!r} must be None (one bucket per dtype), 0 (no"
      " fusion) or a positive number of bytes."
    )
  if bucket_bytes == 0:
    return [[k] for k in range(len(leaves))]
  open_bucket: dict[np.dtype, int] = {}  # dtype -> index of its bucket being filled
  buckets: list[list[int]] = []
  filled: list[int] = []
  for k, leaf in enumerate(leaves):
    dtype = jnp.dtype(leaf.dtype)
    nbytes = int(np.prod(leaf.shape)) * dtype.itemsize
    b = open_bucket.get(dtype)
    if b is None or (bucket_bytes is not None and filled[b] + nbytes > bucket_bytes):
      open_bucket[dtype] = b = len(buckets)
      buckets.append([])
      filled.append(0)
    buckets[b].append(k)
    filled[b] += nbytes
  return buckets


class InvariantLeafWarning(UserWarning):
  """A leaf handed to :func:`all_reduce_tree` is already invariant over the axis."""


def invariant_leaves(tree: Any, axis_name: AxisName) -> list[str]:
  """Paths (``jax.tree_util.keystr``) of the leaves of ``tree`` that typed
  ``shard_map`` already types as invariant over ``axis_name``: reduced (or
  replicated) before they got here. Empty under ``check_vma=False``, where
  nothing is typed."""
  if not typed(axis_name):
    return []
  axes = set(_comm.axes_tuple(axis_name))
  return [
    jax.tree_util.keystr(path) or "(the array itself)"
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    if not axes <= varying_axes(jnp.asarray(leaf))
  ]


@keyword_only(2, "op, algorithm, bucket_bytes and wire (and cost_params)")
def all_reduce_tree(
  tree: Any,
  axis_name: AxisName,
  *,
  op: str = "sum",
  algorithm: str = "ring",
  bucket_bytes: int | None = None,
  wire: str | None = None,
  cost_params=None,
) -> Any:
  """All-reduces every leaf of ``tree``, fused into flat per-dtype buckets.

  Args:
    tree: a pytree of arrays (e.g. gradients), inside a ``jax.shard_map`` body.
    axis_name: as in :func:`allreduce_jax.all_reduce`.
    op: keyword-only; the same default as :func:`allreduce_jax.all_reduce`
      (``"sum"``, ``lax.psum``'s meaning), so the two never disagree silently.
      (Before the keyword-only change it was ``"mean"``; for gradients use
      :func:`allreduce_jax.all_reduce_gradients`, whose default is ``"mean"``.)
    algorithm, cost_params: keyword-only, as in :func:`allreduce_jax.all_reduce`.
    bucket_bytes: keyword-only; at most this many bytes per bucket; ``None``: one
      bucket per dtype; ``0``: one all-reduce per leaf (no fusion).
    wire: keyword-only; the wire format of the floating-point buckets (as in
      :func:`allreduce_jax.all_reduce`); integer buckets always travel exact.

  Returns:
    A pytree of the same structure, shapes and dtypes, reduced over ``axis_name``
    (typed invariant over it under ``check_vma=True``, like ``lax.psum``'s).

  Leaves already invariant over ``axis_name`` (typed ``shard_map`` only): they are
  reduced with ``lax.psum``/``lax.pmean``'s semantics for an invariant value, i.e.
  as p equal copies: ``op="sum"`` returns p × the leaf, ``op="mean"`` the leaf
  itself (``"max"``/``"min"``: the leaf). An :class:`InvariantLeafWarning` names
  each such leaf, because the usual way to get one is ``jax.grad`` with respect to
  parameters replicated with ``in_specs=P()``: JAX has then already *summed* the
  per-device gradients with XLA's all-reduce, and ``op="mean"`` returns that sum,
  p × the mean (``docs/gradients.md``). :func:`allreduce_jax.all_reduce_gradients`
  refuses such gradients with an error instead.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> from allreduce_jax import all_reduce_tree
    >>> mesh = jax.make_mesh((8,), ("i",))
    >>> g = {"w": jnp.ones((8, 3)), "b": jnp.arange(8.0)}
    >>> g = jax.device_put(g, jax.NamedSharding(mesh, P("i")))
    >>> f = jax.shard_map(lambda t: all_reduce_tree(t, "i", op="sum"), mesh=mesh,
    ...                   in_specs=P("i"), out_specs=P("i"))
    >>> print(f(g)["b"])
    [28. 28. 28. 28. 28. 28. 28. 28.]
  """
  if cost_params is not None:
    with cost_model.use_params(cost_params):
      return all_reduce_tree(
        tree, axis_name, op=op, algorithm=algorithm, bucket_bytes=bucket_bytes, wire=wire
      )
  check_algorithm(algorithm)
  get_op(op, jnp.float32)  # op and wire are checked whatever the leaves (none, or integers)
  check_wire(wire, op, algorithm)
  check_axis_name(axis_name, algorithm)  # the same errors as all_reduce's, first
  leaves, treedef = jax.tree.flatten(tree)
  leaves = [jnp.asarray(leaf) for leaf in leaves]
  if leaves:
    for path in invariant_leaves(tree, axis_name):
      warnings.warn(
        f"all_reduce_tree: leaf {path} is already invariant over {axis_name!r}"
        f" (typed shard_map); op={op!r} reduces it like lax.psum/lax.pmean reduce an"
        " invariant value (sum: p x it; mean: it unchanged). If it is a gradient with"
        " respect to replicated parameters, JAX has already summed it over the"
        " participants: differentiate per device or use check_vma=False"
        " (docs/gradients.md).",
        InvariantLeafWarning,
        stacklevel=2,
      )
  out: list[jax.Array | None] = [None] * len(leaves)
  for bucket in plan_buckets(leaves, bucket_bytes):
    reduced = reduce_bucket(
      [leaves[k] for k in bucket], axis_name, op=op, algorithm=algorithm, wire=wire
    )
    for k, leaf in zip(bucket, reduced):
      out[k] = leaf
  return jax.tree.unflatten(treedef, out)


def reduce_bucket(
  leaves: Sequence[jax.Array], axis_name: AxisName, *, op: str, algorithm: str, wire: str | None
) -> list[jax.Array]:
  """All-reduces one bucket of :func:`plan_buckets` (leaves of one dtype, in order):
  packed into one flat buffer, reduced, and cut back into the leaves.

  This is the whole of a bucket's arithmetic: the element at each offset of the flat
  buffer, and the buffer's length (hence each algorithm's chunks and padding), decide
  the bits of the result, so every caller (:func:`all_reduce_tree`, the overlapped
  gradient of :mod:`allreduce_jax.overlap`) packs a bucket here and nowhere else.
  Integer buckets always travel exact (``wire`` applies to floating ones).
  """
  floating = jnp.issubdtype(leaves[0].dtype, jnp.floating)
  kw = dict(op=op, algorithm=algorithm, wire=wire if floating else None)
  if len(leaves) == 1:
    return [all_reduce(leaves[0], axis_name, **kw)]
  flat = jnp.concatenate([leaf.reshape(-1) for leaf in leaves])  # T[sum of sizes]
  reduced = all_reduce(flat, axis_name, **kw)
  out, offset = [], 0
  for leaf in leaves:
    out.append(reduced[offset : offset + leaf.size].reshape(leaf.shape))
    offset += leaf.size
  return out
