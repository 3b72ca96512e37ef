"""XLA's own all-reduce (``lax.psum``/``pmax``/``pmin``): the reference every hand-written
algorithm is checked against, registered as ``"psum"``."""

from __future__ import annotations

import jax
from jax import lax

from allreduce_jax import _comm, cost_model
from allreduce_jax._comm import AxisName
from allreduce_jax._ops import XLA_COLLECTIVE
from allreduce_jax._ring import ring_messages
from allreduce_jax.registry import Algorithm, register


def xla_psum(flat: jax.Array, axis_name: AxisName, combine) -> jax.Array:
  """XLA's own all-reduce (``lax.psum``/``pmax``/``pmin``): the reference.

  Its result is *invariant* over ``axis_name`` (typed shard_map may return it with
  ``out_specs=P()``); :func:`~allreduce_jax.all_reduce` types the hand-written results
  the same way.
  """
  return XLA_COLLECTIVE[combine](flat, _comm.axes_tuple(axis_name))


def xla_reduce_scatter(flat: jax.Array, axis_name: AxisName, combine) -> jax.Array:
  """XLA's own reduce-scatter (``lax.psum_scatter``, tiled): ``T[p*c] -> T[c]``. XLA has
  no max/min reduce-scatter: those are its all-reduce (``lax.pmax``/``pmin``) and this
  participant's chunk of it."""
  axes = _comm.axes_tuple(axis_name)
  if combine is lax.add:
    return lax.psum_scatter(flat, axes, tiled=True)
  c = flat.shape[0] // _comm.size(axes)
  return _comm.chunk(XLA_COLLECTIVE[combine](flat, axes), _comm.index(axes), c)


def xla_all_gather(block: jax.Array, axis_name: AxisName) -> jax.Array:
  """XLA's own all-gather (``lax.all_gather``, tiled): ``T[c] -> T[p*c]``."""
  return lax.all_gather(block, _comm.axes_tuple(axis_name), tiled=True)


register(
  Algorithm(
    "psum",
    xla_psum,
    hand_written=False,
    auto=False,
    wires=(None,),
    schedule=cost_model.ring_schedule,
    messages=ring_messages,  # modelled as a ring
    summary="XLA's own collective (the reference)",
    reduce_scatter=xla_reduce_scatter,
    all_gather=xla_all_gather,
  )
)
