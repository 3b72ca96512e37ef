"""``algorithm="auto"``: the cost model's choice among the registered candidates."""

from __future__ import annotations

import jax

from allreduce_jax import _comm, cost_model, gloo_model
from allreduce_jax._comm import AxisName
from allreduce_jax.registry import ALGORITHMS, Algorithm, register


def auto(flat: jax.Array, axis_name: AxisName, combine) -> jax.Array:
  """The cost model's choice (NCCL-style argmin) for this participant count and size.

  Picks, at trace time, ``cost_model.choose(p, n_bytes, params)`` among the records
  with ``auto=True`` (single-axis, hand-written, priced: never ``hierarchical`` or
  ``psum``), with explicit parameters: those of the innermost
  ``cost_model.use_params(...)`` block (or ``all_reduce(..., cost_params=...)``), else
  the defaults shipped for the running backend (``cost_model.backend_params``).
  Nothing is read from the working directory or the environment: the same code picks
  the same algorithm wherever it is launched. With fitted parameters, only the
  algorithms the fit measured are candidates. Inside ``cost_model.use_topology(net)``
  the candidates are priced by replaying their message steps on that network
  (``allreduce_jax.topology``), as its ``duplex`` says they run; a network from
  ``topology.with_link_rates`` tells it which host links are slower.
  """
  p = _comm.size(axis_name)
  nbytes = flat.shape[0] * flat.dtype.itemsize
  choice = gloo_model.choose(
    p,
    nbytes,
    cost_model.current_params(),
    topology=cost_model.current_topology(),
    duplex=cost_model.current_duplex(),
  )
  return ALGORITHMS[choice](flat, axis_name, combine)


register(Algorithm("auto", auto, auto=False, summary="the cost model's choice for this p and size"))
