"""The public entry point :func:`all_reduce`, the algorithm registry and input checks.

Every algorithm is a per-shard function ``fn(flat, axis_name, combine) -> flat`` on a
1-D block ``T[n]``; this module is the one place that flattens, checks, dispatches,
finalizes (``mean``) and restores the shape.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from allreduce_jax import _comm
from allreduce_jax._comm import AxisName
from allreduce_jax._hierarchical import hierarchical
from allreduce_jax._naive import naive
from allreduce_jax._ops import OPS, XLA_COLLECTIVE, get_op
from allreduce_jax._recursive import halving_doubling, recursive_doubling
from allreduce_jax._ring import bidirectional_ring, ring
from allreduce_jax._tree import tree


def xla_psum(flat: jax.Array, axis_name: AxisName, combine) -> jax.Array:
  """XLA's own all-reduce (``lax.psum``/``pmax``/``pmin``): the reference.

  Its result is *invariant* over ``axis_name`` (typed shard_map may return it with
  ``out_specs=P()``), while the hand-written algorithms return *varying* values.
  """
  return XLA_COLLECTIVE[combine](flat, _comm.axes_tuple(axis_name))


def auto(flat: jax.Array, axis_name: AxisName, combine) -> jax.Array:
  """The cost model's choice (NCCL-style argmin) for this participant count and size.

  Picks, at trace time, ``cost_model.choose(p, n_bytes, params)`` among the
  single-axis hand-written algorithms (never ``hierarchical`` or ``psum``), with the
  fitted parameters of ``$ALLREDUCE_JAX_COST_PARAMS`` or ``results/cost_params.json``
  when that file exists (``allreduce-jax bench --fit`` writes it), else
  ``cost_model.DEFAULT_PARAMS``.
  """
  from allreduce_jax import cost_model  # lazy: keeps the import graph acyclic

  p = _comm.size(axis_name)
  nbytes = flat.shape[0] * flat.dtype.itemsize
  choice = cost_model.choose(p, nbytes, cost_model.load_default_params())
  return ALGORITHMS[choice](flat, axis_name, combine)


#: name -> per-shard function ``(flat: T[n], axis_name, combine) -> T[n]``.
ALGORITHMS: dict[str, Callable[..., jax.Array]] = {
  "ring": ring,
  "bidirectional_ring": bidirectional_ring,
  "tree": tree,
  "recursive_doubling": recursive_doubling,
  "halving_doubling": halving_doubling,
  "naive": naive,
  "hierarchical": hierarchical,
  "psum": xla_psum,
  "auto": auto,
}


def _check_algorithm(algorithm: str) -> None:
  if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
    raise ValueError(
      f"algorithm={algorithm!r} is not supported; expected one of {sorted(ALGORITHMS)}."
    )


def _check_axis_name(axis_name: AxisName, algorithm: str) -> None:
  names = _comm.axes_tuple(axis_name)
  if not names or not all(isinstance(a, str) for a in names):
    raise TypeError(f"axis_name={axis_name!r} must be a mesh axis name (str) or a tuple of names.")
  if len(set(names)) != len(names):
    raise ValueError(f"axis_name={axis_name!r} names the same axis twice.")
  for a in names:
    try:
      lax.axis_size(a)
    except NameError:
      try:
        bound = tuple(jax.sharding.get_abstract_mesh().manual_axes)
      except Exception:  # pragma: no cover - depends on the JAX version
        bound = ()
      raise ValueError(
        f"axis_name {a!r} is not bound here; all_reduce must run inside"
        f" jax.shard_map over a mesh with that axis. Bound axes: {bound}."
      ) from None
  if algorithm == "hierarchical" and (not isinstance(axis_name, (tuple, list)) or len(names) != 2):
    raise ValueError(
      f"algorithm='hierarchical' needs axis_name=(outer, inner), a tuple of two mesh"
      f" axis names; got {axis_name!r}."
    )


def all_reduce(
  x: jax.Array, axis_name: AxisName, op: str = "sum", algorithm: str = "ring"
) -> jax.Array:
  """All-reduces the local block ``x`` over ``axis_name`` with a hand-written algorithm.

  Call it inside a ``jax.shard_map`` body, like ``lax.psum``. Every participant
  passes its block; every participant gets the same combined block back.

  Args:
    x: the local block: any shape (0-d too), a numeric dtype (float32, bfloat16,
      float16, int32, float64 under x64...).
    axis_name: a mesh axis name or a tuple of names (their product), as in
      ``lax.psum``. ``algorithm="hierarchical"`` takes ``(outer, inner)``.
    op: one of ``OPS`` = ``("sum", "mean", "max", "min")``.
    algorithm: a key of ``ALGORITHMS``. ``"psum"`` is XLA's own collective.

  Returns:
    An array of ``x``'s shape and dtype, identical on every participant. The
    hand-written algorithms return a value typed as varying over ``axis_name``:
    return it with a per-device ``out_specs`` (e.g. ``P("i")``) or use
    ``check_vma=False``.

  Raises:
    ValueError: unknown ``op`` or ``algorithm``, unbound ``axis_name``, or
      ``hierarchical`` without two axes.
    TypeError: non-numeric dtype, integer ``mean``, malformed ``axis_name``.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> from allreduce_jax import all_reduce
    >>> mesh = jax.make_mesh((8,), ("i",))
    >>> x = jax.device_put(jnp.arange(8.0), jax.NamedSharding(mesh, P("i")))
    >>> f = jax.shard_map(lambda b: all_reduce(b, "i", op="max", algorithm="tree"),
    ...                   mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    >>> print(f(x))
    [7. 7. 7. 7. 7. 7. 7. 7.]
  """
  x = jnp.asarray(x)
  reduction = get_op(op, x.dtype)
  _check_algorithm(algorithm)
  _check_axis_name(axis_name, algorithm)
  p = _comm.size(axis_name)
  flat = x.reshape(-1)  # T[n]
  if algorithm != "psum":
    flat = _comm.make_varying(flat, axis_name)
  if p > 1 or algorithm == "psum":
    flat = ALGORITHMS[algorithm](flat, axis_name, reduction.combine)
  return reduction.finalize(flat, p).reshape(x.shape)


__all__ = ["ALGORITHMS", "OPS", "all_reduce"]
