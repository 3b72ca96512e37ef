"""XLA's own all-reduce (``lax.psum``/``pmax``/``pmin``): the reference every hand-written
algorithm is checked against, registered as ``"psum"``."""

from __future__ import annotations

import jax

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
  )
)
