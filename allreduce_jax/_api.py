"""The public entry point :func:`all_reduce` and its input checks.

Every algorithm is a per-shard function ``fn(flat, axis_name, combine) -> flat`` on a
1-D block ``T[n]``, registered in :mod:`allreduce_jax.registry` by its own module;
this module is the one place that flattens, checks, dispatches, finalizes (``mean``)
and restores the shape.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from allreduce_jax import _comm, _wire, cost_model
from allreduce_jax._comm import AxisName
from allreduce_jax._invariant import as_invariant
from allreduce_jax._ops import OPS, get_op
from allreduce_jax.registry import ALGORITHMS, Algorithm, check_algorithm, names, register

# The built-in algorithms: each module registers its own record when imported, and the
# order of these imports is the registry's order (tables list the algorithms in it, and
# auto's ties go to the earlier one).
# isort: off
from allreduce_jax import _ring, _tree, _recursive, _naive, _hierarchical  # noqa: F401
from allreduce_jax import _reference, _auto, _two_shot, _swing, _dbtree, _near  # noqa: F401
# isort: on


def check_axis_name(axis_name: AxisName, algorithm: str) -> None:
  axes = _comm.axes_tuple(axis_name)
  if not axes or not all(isinstance(a, str) for a in axes):
    raise TypeError(f"axis_name={axis_name!r} must be a mesh axis name (str) or a tuple of names.")
  if len(set(axes)) != len(axes):
    raise ValueError(f"axis_name={axis_name!r} names the same axis twice.")
  for a in axes:
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
  k = ALGORITHMS[algorithm].axes
  if k > 1 and (not isinstance(axis_name, (tuple, list)) or len(axes) < k):
    raise ValueError(
      f"algorithm={algorithm!r} needs axis_name as a tuple of at least {k} mesh axis names"
      f" (outer first, e.g. (outer, inner)); got {axis_name!r}."
    )


def keyword_only(n_positional: int, options: str):
  """Decorator: a clear ``TypeError`` when options are passed positionally.

  ``lax.psum``'s options are keyword-only; so are ours. The wrapped function keeps
  its signature (``inspect.signature`` shows the ``*``)."""

  def wrap(fn):
    @functools.wraps(fn)
    def checked(*args, **kwargs):
      if len(args) > n_positional:
        extra = ", ".join(repr(a) for a in args[n_positional:])
        raise TypeError(
          f"{fn.__name__}() takes {options} as keyword arguments only (like lax.psum's"
          f" options); got {len(args) - n_positional} more positional ({extra}). Call e.g."
          f" {fn.__name__}(x, 'i', op='sum', algorithm='ring')."
        )
      return fn(*args, **kwargs)

    return checked

  return wrap


def check_wire(wire: str | None, op: str, algorithm: str) -> _wire.WireFormat:
  """The :class:`~allreduce_jax._wire.WireFormat` named ``wire`` after checking it suits
  ``op`` and ``algorithm`` (whatever the data: ``all_reduce_tree`` checks it even when
  no leaf is floating)."""
  fmt = _wire.get(wire)
  if not fmt.lossy:
    return fmt
  if op not in ("sum", "mean"):
    raise ValueError(
      f"op={op!r} with wire={wire!r}: a lossy wire format changes values, so max/min"
      " could return a value no participant holds; use wire=None for op='max'/'min'."
    )
  if wire not in ALGORITHMS[algorithm].wires:
    raise ValueError(
      f"algorithm={algorithm!r} cannot send in wire={wire!r} (it sends in"
      f" {list(ALGORITHMS[algorithm].wires)}); use a hand-written algorithm."
    )
  return fmt


@keyword_only(2, "op, algorithm and wire (and cost_params)")
def all_reduce(
  x: jax.Array,
  axis_name: AxisName,
  *,
  op: str = "sum",
  algorithm: str = "ring",
  wire: str | None = None,
  cost_params: cost_model.AnyParams | None = None,
) -> jax.Array:
  """All-reduces the local block ``x`` over ``axis_name`` with a hand-written algorithm.

  Call it inside a ``jax.shard_map`` body, like ``lax.psum``. Every participant
  passes its block; every participant gets the same combined block back.

  Args:
    x: the local block: any shape (0-d too), a numeric dtype (float32, bfloat16,
      float16, int32, float64 under x64...).
    axis_name: a mesh axis name or a tuple of names (their product), as in
      ``lax.psum``. ``algorithm="hierarchical"`` takes ``(outer, inner)``.
    op: keyword-only, one of ``OPS`` = ``("sum", "mean", "max", "min")``. The
      default ``"sum"`` is ``lax.psum``'s meaning and the same default as
      :func:`~allreduce_jax.all_reduce_tree`; averaging gradients is
      :func:`~allreduce_jax.all_reduce_gradients` (``op="mean"`` by default).
    algorithm: keyword-only, a key of ``ALGORITHMS``. ``"psum"`` is XLA's own
      collective; ``"auto"`` the cost model's choice.
    wire: keyword-only, the format every message travels in (``_wire.WIRES``):
      None (default, exact: the input dtype), ``"bf16"`` (bfloat16 bits as uint16),
      ``"int8"`` (block-absmax int8, one float32 scale per 256 elements in the same
      message) or ``"fp8"`` (float8_e4m3fn, the same scales). Lossy formats are for
      ``op="sum"``/``"mean"`` on floating x; every participant still gets the same
      bits. The error per element is at most (quantizations on its path) x u x the
      block's absmax of the partial sums (``_wire.WireFormat.unit_error``); a ring
      re-encodes at every hop (error ~√p), ``"two_shot"`` twice whatever p.
    cost_params: keyword-only, for ``algorithm="auto"``: the parameters to choose
      with (a ``cost_model.Params`` or ``FittedParams``); None: the innermost
      ``cost_model.use_params`` block, else the running backend's shipped defaults.

  Returns:
    An array of ``x``'s shape and dtype, identical (bit for bit) on every
    participant, typed like ``lax.psum``'s result: under typed ``shard_map``
    (``check_vma=True``) it is *invariant* over ``axis_name``, so it may be
    returned with ``out_specs=P()``, used in a Python ``if`` in eager shard_map,
    and differentiated like ``psum`` (see below). Under ``check_vma=False``
    nothing is typed.

  Gradients (``op="sum"``/``"mean"``): ``jax.grad``, ``jax.jvp`` and second
  derivatives (Hessian-vector products) through ``all_reduce`` give
  ``lax.psum``'s/``lax.pmean``'s values, with the gradient taken inside or outside
  the ``shard_map`` body, for a
  per-participant or a replicated (``in_specs=P()``) input, under ``check_vma``
  True and False (``docs/gradients.md``; tested in ``tests/test_gradients.py``).
  Under ``check_vma=True`` the result is typed invariant by a cast that compiles
  to nothing; its transpose sends the cotangent through the same algorithm's
  ``ppermute``\\ s in reverse (psum's backward is a free ``pvary``: ours costs one
  more hand-written all-reduce). With a replicated input, JAX's own implicit
  ``pvary`` of the input transposes to an XLA all-reduce in the backward pass,
  exactly as it does for ``lax.psum``. ``op="max"``/``"min"``: ``lax.pmax``/``pmin``
  have no differentiation rule; ours differentiate through the algorithm's
  selections (the cotangent reaches the participant whose value was selected;
  under ``check_vma=False`` once per participant, i.e. p times).

  Linearity: with ``wire=None``, ``op="sum"``/``"mean"`` is a linear map for every
  algorithm: ``jax.linear_transpose`` and ``jax.vjp`` give ``lax.psum``'s/``pmean``'s
  (tested in ``tests/test_linearity.py``). A lossy ``wire`` is not linear (it
  rounds); its derivative is taken straight through: ``jax.grad``/``jax.jvp`` give
  the exact all-reduce of the (co)tangent, i.e. ``lax.psum``'s gradient, never the
  rounding's zeros. A ``bfloat16``/``float16`` ``x`` over a lossy wire is reduced in
  float32 and rounded to its dtype once.

  Raises:
    ValueError: unknown ``op``, ``algorithm`` or ``wire``, unbound ``axis_name``,
      ``hierarchical`` without two axes, a lossy ``wire`` with ``op="max"``/``"min"``
      or with ``algorithm="psum"``.
    TypeError: options passed positionally, non-numeric dtype, integer ``mean``,
      malformed ``axis_name``, a ``wire`` that is not None or a string, a lossy
      ``wire`` on a non-float dtype.

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
    >>> g = jax.shard_map(lambda b: all_reduce(b, "i", op="sum"),  # invariant, like psum
    ...                   mesh=mesh, in_specs=P("i"), out_specs=P())
    >>> print(g(x))
    [28.]
  """
  if cost_params is not None:
    with cost_model.use_params(cost_params):
      return all_reduce(x, axis_name, op=op, algorithm=algorithm, wire=wire)
  x = jnp.asarray(x)
  get_op(op, x.dtype)
  check_algorithm(algorithm)
  fmt = check_wire(wire, op, algorithm)
  if fmt.lossy and not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"wire={wire!r} needs a floating-point x, got dtype {x.dtype}.")
  check_axis_name(axis_name, algorithm)
  if isinstance(axis_name, list):
    axis_name = tuple(axis_name)
  if fmt.lossy:
    return _lossy(x, axis_name, op, algorithm, wire)
  return _reduce(x, axis_name, op, algorithm, None)


def _reduce(x: jax.Array, axis_name: AxisName, op: str, algorithm: str, wire) -> jax.Array:
  """The all-reduce itself, on checked arguments."""
  reduction = get_op(op, x.dtype)
  p = _comm.size(axis_name)
  flat = x.reshape(-1)  # T[n]
  record = ALGORITHMS[algorithm]
  if record.hand_written:
    flat = _comm.make_varying(flat, axis_name)
  finish = functools.partial(reduction.finalize, p=p)
  # An algorithm may finish each reduced slice before handing it out (_comm.finished),
  # a pass over n/p elements instead of n on every participant (at 64 MiB on 8 hosts
  # the whole-result pass cost 0.05 of line rate); otherwise the whole result here.
  with _comm.finishing(finish, axis_name) as fin:
    if p > 1 or not record.hand_written:
      with _wire.using(wire):  # _comm.send encodes every message in this format
        flat = ALGORITHMS[algorithm](flat, axis_name, reduction.combine)
  out = (flat if fin.applied else finish(flat)).reshape(x.shape)
  # Every participant holds the same bits: type the result like psum's (a no-op
  # under check_vma=False and for XLA's own collective).
  return as_invariant(out, axis_name)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3, 4))
def _lossy(x: jax.Array, axis_name: AxisName, op: str, algorithm: str, wire: str) -> jax.Array:
  """The all-reduce over a lossy wire. A float narrower than float32 (bfloat16,
  float16) is reduced in float32 and rounded to its dtype once at the end: its
  decoded messages (``q·s``, up to 23 significant bits) would not fit it, re-encoding
  a forwarded value would then change it, and participants would drift apart."""
  compute = jnp.float32 if jnp.finfo(x.dtype).bits < 32 else x.dtype
  return _reduce(x.astype(compute), axis_name, op, algorithm, wire).astype(x.dtype)


@_lossy.defjvp
def _lossy_jvp(axis_name, op, algorithm, wire, primals, tangents):
  # Straight-through: the rounding's derivative is zero almost everywhere, which
  # would make every gradient through a lossy wire silently zero. The tangent is
  # the exact all-reduce of the tangent instead (lax.psum's derivative; the same
  # algorithm with wire=None), so jax.grad/jax.jvp give psum's values.
  (x,), (t,) = primals, tangents
  return _lossy(x, axis_name, op, algorithm, wire), _reduce(t, axis_name, op, algorithm, None)


__all__ = ["ALGORITHMS", "OPS", "Algorithm", "all_reduce", "names", "register"]
