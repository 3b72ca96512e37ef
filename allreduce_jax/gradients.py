"""The optax route: :func:`all_reduce_gradients`, a gradient transformation to chain first.

Inside a ``jax.shard_map`` data-parallel step each participant differentiates its
own batch shard; ``optax.chain(all_reduce_gradients("data"), optax.adam(1e-3))``
then averages the per-device gradients with a hand-written all-reduce before Adam
sees them, exactly where ``lax.pmean`` would sit.
"""

import sys
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from allreduce_jax import _comm, _wire
from allreduce_jax._api import check_axis_name, check_wire, keyword_only
from allreduce_jax._comm import AxisName
from allreduce_jax._invariant import varying_axes
from allreduce_jax._ops import OPS
from allreduce_jax.fusion import all_reduce_tree, invariant_leaves, plan_buckets
from allreduce_jax.registry import check_algorithm


class ErrorFeedbackState(NamedTuple):
  """``residual``: what the wire format dropped from this participant's last
  contribution, a float32 tree like the updates."""

  residual: Any


class AlreadyReducedError(ValueError):
  """The gradients are already invariant over the axis: typed shard_map summed them."""


def _already_reduced(axis_name: AxisName, paths: list[str], op: str) -> AlreadyReducedError:
  shown = ", ".join(paths[:4]) + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")
  return AlreadyReducedError(
    f"all_reduce_gradients({axis_name!r}): the gradients are already invariant over"
    f" {axis_name!r} ({shown}). Under typed shard_map (check_vma=True), jax.grad with"
    " respect to parameters replicated over that axis (in_specs=P()) transposes their"
    " implicit pvary into a psum: XLA has already SUMMED the per-device gradients, so"
    f" op={op!r} here would give p x the {op} (lax.pmean would too) and the all-reduce"
    " would move nothing useful. Fix either: (1) differentiate per device:"
    f" jax.grad(loss)(jax.lax.pcast(params, {axis_name!r}, to='varying'), ...) inside the"
    " body, so each device keeps its own gradient; or (2) jax.shard_map(...,"
    " check_vma=False), where nothing is typed and gradients stay per device."
    " See docs/gradients.md."
  )


def _inside_multisteps() -> bool:
  """Whether ``update`` was called from ``optax.MultiSteps``' own code (its branches)."""
  frame = sys._getframe(2)
  while frame is not None:
    name = frame.f_code.co_filename.replace("\\", "/")
    if name.endswith("/_accumulation.py") and "/optax/" in name:
      return True
    frame = frame.f_back
  return False


def _multisteps_typing(axis_name: AxisName) -> AlreadyReducedError:
  return AlreadyReducedError(
    f"all_reduce_gradients({axis_name!r}) inside optax.MultiSteps under typed shard_map"
    " (check_vma=True): MultiSteps' lax.cond runs this update on its accumulator"
    " (state.acc_grads), which is invariant over the axis (its state is replicated),"
    " while the gradients vary per device, so the branches' types cannot match (lax.pmean"
    " fails there too). Put MultiSteps after the all-reduce instead:"
    f" optax.chain(all_reduce_gradients({axis_name!r}, ...), optax.MultiSteps(opt,"
    " every_k_schedule=k)) (reduces every micro-step, accumulates the reduced gradients),"
    " or use jax.shard_map(..., check_vma=False). See docs/gradients.md."
  )


@keyword_only(1, "op, algorithm, bucket_bytes, wire and error_feedback (and cost_params)")
def all_reduce_gradients(
  axis_name: AxisName,
  *,
  op: str = "mean",
  algorithm: str = "ring",
  bucket_bytes: int | None = None,
  wire: str | None = None,
  error_feedback: bool = False,
  cost_params=None,
) -> optax.GradientTransformation:
  """An optax transformation that all-reduces the updates over ``axis_name``.

  Chain it first, inside the ``jax.shard_map`` body of a data-parallel step:
  ``optax.chain(all_reduce_gradients("data", algorithm="ring"), optax.adam(1e-3))``.
  It is stateless (``optax.EmptyState``) and takes any pytree of arrays (plain dicts,
  Flax NNX ``nnx.State`` of ``nnx.Param``\\ s...). Leaves are fused into per-dtype
  buckets as in :func:`allreduce_jax.all_reduce_tree`.

  With ``optax.MultiSteps`` (gradient accumulation over ``k`` micro-steps):
  ``optax.MultiSteps(optax.chain(all_reduce_gradients(...), opt), k)`` works under
  ``shard_map(..., check_vma=False)``; MultiSteps calls the inner update at every
  micro-step, so the all-reduce runs every micro-step on the accumulated gradient (its
  result is emitted every ``k``-th). Under typed ``shard_map`` (``check_vma=True``) that
  order cannot type-check (MultiSteps' ``lax.cond`` mixes its replicated accumulator
  with per-device gradients; ``lax.pmean`` fails the same way) and ``update`` raises
  :class:`AlreadyReducedError` naming MultiSteps; use
  ``optax.chain(all_reduce_gradients(...), optax.MultiSteps(opt, k))`` there, which
  accumulates the reduced gradients (also an all-reduce per micro-step).

  Args:
    axis_name: the data-parallel mesh axis (or a tuple of axes: their product).
    op: keyword-only; ``"mean"`` (default: averaging gradients is what a
      data-parallel step needs) or any of ``OPS``.
    algorithm: keyword-only; a key of ``ALGORITHMS`` (``"psum"`` gives XLA's own).
    bucket_bytes: keyword-only; fusion bucket size (None: one bucket per dtype).
    wire: keyword-only; the wire format of the all-reduce (``all_reduce(...,
      wire=...)``): None (exact), ``"bf16"``, ``"int8"``, ``"fp8"``; lossy ones for
      ``op="sum"``/``"mean"`` only.
    error_feedback: keyword-only; with a lossy ``wire``, add to each gradient what
      the format dropped from this participant's previous contribution,
      ``c = g + e``, and keep ``e ← c − roundtrip(c)`` (the format's encoding of each
      leaf once: the participant's own share of the error). Floating leaves only,
      and only when something is sent: at p = 1 and for integer leaves (which
      travel exact) the residual stays zero. The state is then an
      :class:`ErrorFeedbackState` instead of ``optax.EmptyState``.
    cost_params: keyword-only; parameters for ``algorithm="auto"``.

  Returns:
    ``optax.GradientTransformation(init, update)``; ``update(grads, state, params=None)``
    returns the reduced gradients (typed invariant under ``check_vma=True``).

  Raises:
    ValueError: unknown ``op``/``algorithm`` or bad ``bucket_bytes`` (at
      construction); :class:`AlreadyReducedError` from ``update`` when, under typed
      ``shard_map``, any gradient is already invariant over ``axis_name`` (JAX has
      summed it: see the message for the two fixes), or inside ``optax.MultiSteps``
      under typed ``shard_map`` (see above). Never p × the mean silently. From
      ``update``: an axis name that is not bound, ``all_reduce``'s ``ValueError``.
    TypeError: options passed positionally.

  Example:
    >>> import jax, jax.numpy as jnp, optax
    >>> from jax.sharding import PartitionSpec as P
    >>> from allreduce_jax import all_reduce_gradients
    >>> mesh = jax.make_mesh((8,), ("data",))
    >>> tx = all_reduce_gradients("data", algorithm="tree")
    >>> g = jax.device_put(jnp.arange(8.0), jax.NamedSharding(mesh, P("data")))
    >>> step = jax.shard_map(lambda t: tx.update(t, tx.init(t))[0], mesh=mesh,
    ...                      in_specs=P("data"), out_specs=P())
    >>> print(step(g))
    [3.5]
  """
  fmt = _check_options(op, algorithm, wire, error_feedback, bucket_bytes)

  def init_fn(params: Any):
    if not error_feedback:
      return optax.EmptyState()
    return ErrorFeedbackState(jax.tree.map(lambda a: jnp.zeros(jnp.shape(a), jnp.float32), params))

  def reduce(tree):
    return all_reduce_tree(
      tree,
      axis_name,
      op=op,
      algorithm=algorithm,
      bucket_bytes=bucket_bytes,
      wire=wire,
      cost_params=cost_params,
    )

  def update_fn(updates: Any, state, params: Any = None):
    del params
    _refuse_reduced(updates, axis_name, algorithm, op)
    if not error_feedback:
      return reduce(updates), state
    c, residual = _error_feedback(updates, state.residual, fmt, axis_name)
    return reduce(c), ErrorFeedbackState(residual)

  return optax.GradientTransformation(init_fn, update_fn)


def _check_options(op: str, algorithm: str, wire: str | None, error_feedback: bool, bucket_bytes):
  """``ValueError`` for a bad option, at construction; returns the wire format."""
  if op not in OPS:
    raise ValueError(f"op={op!r} is not supported; expected one of {OPS}.")
  check_algorithm(algorithm)
  fmt = check_wire(wire, op, algorithm)
  if error_feedback and not fmt.lossy:
    raise ValueError(
      "error_feedback=True needs a lossy wire (wire='bf16', 'int8' or 'fp8'): an exact"
      " all-reduce drops nothing to feed back."
    )
  plan_buckets([], bucket_bytes)  # validates bucket_bytes now, not at the first step
  return fmt


def _refuse_reduced(updates: Any, axis_name: AxisName, algorithm: str, op: str) -> None:
  """A mistyped axis (all_reduce's ValueError), or :class:`AlreadyReducedError` when
  a gradient is already invariant over ``axis_name`` (or inside ``optax.MultiSteps``)."""
  check_axis_name(axis_name, algorithm)
  already = invariant_leaves(updates, axis_name)
  if already:
    if _inside_multisteps():
      raise _multisteps_typing(axis_name)
    raise _already_reduced(axis_name, already, op)


def _error_feedback(updates: Any, residual: Any, fmt, axis_name: AxisName) -> tuple[Any, Any]:
  """``(c, e')``: ``c = g + e`` in each gradient's dtype (what is all-reduced) and
  ``e' = (g + e) − roundtrip(c)`` (what the format and the cast to ``g``'s dtype
  dropped), typed like the incoming residual. Where nothing is dropped the residual
  stays zero: at p = 1 (nothing is sent) and for integer leaves (they travel exact,
  so they get no float residual either)."""
  axes = set(_comm.axes_tuple(axis_name))
  sent = _comm.size(axis_name) > 1

  def lossy(g):
    return sent and jnp.issubdtype(g.dtype, jnp.floating)

  def corrected(g, e):  # c = g + e, in g's dtype for the all-reduce
    return (g.astype(jnp.float32) + e).astype(g.dtype) if lossy(g) else g

  def left(g, c, e):  # e <- (g + e) - roundtrip(c), typed like the incoming residual
    if not lossy(g):
      r = jnp.zeros(g.shape, jnp.float32)
    else:
      flat = c.reshape(-1).astype(jnp.float32)
      r = g.astype(jnp.float32) + e - _wire.roundtrip(fmt, flat).reshape(g.shape)
    return _comm.make_varying(r, axis_name) if axes <= varying_axes(e) else r

  c = jax.tree.map(corrected, updates, residual)
  return c, jax.tree.map(left, updates, c, residual)


__all__ = ["AlreadyReducedError", "ErrorFeedbackState", "all_reduce_gradients"]
