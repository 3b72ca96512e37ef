"""The public entry point :func:`all_reduce`, the algorithm registry and input checks.

Every algorithm is a per-shard function ``fn(flat, axis_name, combine) -> flat`` on a
1-D block ``T[n]``; this module is the one place that flattens, checks, dispatches,
finalizes (``mean``) and restores the shape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax

from allreduce_jax import _comm, _wire, cost_model, topology
from allreduce_jax._comm import AxisName
from allreduce_jax._dbtree import double_binary_tree, double_binary_tree_messages
from allreduce_jax._hierarchical import hierarchical, hierarchical_messages
from allreduce_jax._invariant import as_invariant
from allreduce_jax._naive import naive
from allreduce_jax._ops import OPS, XLA_COLLECTIVE, get_op
from allreduce_jax._recursive import (
  halving_doubling,
  halving_doubling_near,
  halving_doubling_near_messages,
  recursive_doubling,
)
from allreduce_jax._ring import bidirectional_ring, ring
from allreduce_jax._swing import swing, swing_messages
from allreduce_jax._tree import tree
from allreduce_jax._two_shot import two_shot, two_shot_messages


def xla_psum(flat: jax.Array, axis_name: AxisName, combine) -> jax.Array:
  """XLA's own all-reduce (``lax.psum``/``pmax``/``pmin``): the reference.

  Its result is *invariant* over ``axis_name`` (typed shard_map may return it with
  ``out_specs=P()``); :func:`all_reduce` types the hand-written results the same way.
  """
  return XLA_COLLECTIVE[combine](flat, _comm.axes_tuple(axis_name))


def auto(flat: jax.Array, axis_name: AxisName, combine) -> jax.Array:
  """The cost model's choice (NCCL-style argmin) for this participant count and size.

  Picks, at trace time, ``cost_model.choose(p, n_bytes, params)`` among the
  single-axis hand-written algorithms (never ``hierarchical`` or ``psum``), with
  explicit parameters: those of the innermost ``cost_model.use_params(...)`` block
  (or ``all_reduce(..., cost_params=...)``), else the defaults shipped for the
  running backend (``cost_model.backend_params``). Nothing is read from the working
  directory or the environment: the same code picks the same algorithm wherever it
  is launched. With fitted parameters, only the algorithms the fit measured are
  candidates. Inside ``cost_model.use_topology(net)`` the candidates are priced by
  replaying their message steps on that network (``allreduce_jax.topology``).
  """
  p = _comm.size(axis_name)
  nbytes = flat.shape[0] * flat.dtype.itemsize
  choice = cost_model.choose(
    p, nbytes, cost_model.current_params(), topology=cost_model.current_topology()
  )
  return ALGORITHMS[choice](flat, axis_name, combine)


#: A per-shard all-reduce: ``fn(flat: T[n], axis_name, combine) -> T[n]``.
ShardFn = Callable[[jax.Array, AxisName, Callable], jax.Array]


@dataclass(frozen=True)
class Algorithm:
  """One registry record: everything a consumer needs to know about an algorithm.

  Tools, tests, the report and the notebooks derive every subset of algorithms
  from these fields; nothing outside this module special-cases a name.

  Attributes:
    name: the registry key (``all_reduce(..., algorithm=name)``).
    fn: the per-shard function ``fn(flat: T[n], axis_name, combine) -> T[n]``.
    axes: how many mesh axes it takes: 1 means one axis name (or a tuple of names
      treated as their product, like ``lax.psum``); k > 1 means a tuple of at least
      k names, one per level, outer first (``hierarchical``: ``(outer, inner)``);
      ``mesh_for`` builds a k-axis mesh for it.
    hand_written: False for XLA's own collective (the reference).
    auto: a candidate for ``algorithm="auto"`` (needs ``axes == 1`` and ``schedule``).
    schedule: the closed-form cost, ``schedule(p, n_bytes, inner) -> cost_model.Schedule``
      (``inner`` = the inner axis size for multi-axis algorithms); None: not priced.
    messages: the step generator for topology replay, ``messages(sizes) -> steps``:
      ``sizes`` are the mesh axis sizes (``(p,)`` for one axis), each step is a list of
      ``(src, dst, fraction_of_n)`` with participants numbered in mesh (row-major)
      order; it must equal the schedule traced from ``fn``. None: not replayable.
    summary: one line for ``--help`` and tables.
    lossy: True if the result is not exact even with ``wire=None`` (then verify
      checks it against an error bound, and ``auto`` never picks it).
    wires: the wire formats (``all_reduce(..., wire=...)``) it can send in; every
      hand-written algorithm sends through ``_comm.send``, so all of ``_wire.WIRES``.
  """

  name: str
  fn: ShardFn
  axes: int = 1
  hand_written: bool = True
  auto: bool = True
  schedule: Callable[..., cost_model.Schedule] | None = None
  messages: Callable[[tuple[int, ...]], list[list[tuple[int, int, float]]]] | None = None
  summary: str = ""
  lossy: bool = False
  wires: tuple[str | None, ...] = _wire.WIRES

  def __call__(self, flat: jax.Array, axis_name: AxisName, combine) -> jax.Array:
    return self.fn(flat, axis_name, combine)

  def wire_bytes(self, p: int, wire: str | None = None, n: int = 1 << 20, itemsize: int = 4):
    """Bytes the busiest participant puts on the wire per input element, for an
    ``n``-element float input of ``itemsize`` bytes sent in format ``wire`` (scales
    included); None if the record has no schedule or cannot send in ``wire``.

    Example:
      >>> round(ALGORITHMS["ring"].wire_bytes(8, "int8") / ALGORITHMS["ring"].wire_bytes(8), 3)
      0.254
    """
    if self.schedule is None or wire not in self.wires:
      return None
    per_element = _wire.get(wire).bytes_per_element(max(1, n // max(p, 1)), itemsize)
    return self.schedule(p, n * per_element, None).max_sent_bytes / n


#: name -> :class:`Algorithm` record. :func:`register` adds one.
ALGORITHMS: dict[str, Algorithm] = {}


def register(record: Algorithm, *, replace: bool = False) -> Algorithm:
  """Adds ``record`` to :data:`ALGORITHMS`; verify, bench, audit, scaling and the
  report pick it up from there with no other change.

  Example:
    >>> from allreduce_jax import ALGORITHMS, Algorithm, register
    >>> def via_psum(flat, axis_name, combine):  # flat: T[n]
    ...   return ALGORITHMS["psum"](flat, axis_name, combine)
    >>> _ = register(Algorithm("my_psum", via_psum, auto=False, summary="a toy"))
    >>> "my_psum" in ALGORITHMS
    True
    >>> del ALGORITHMS["my_psum"]
  """
  if not isinstance(record, Algorithm):
    raise TypeError(f"register expects an Algorithm record, got {type(record).__name__}.")
  if not record.name or not isinstance(record.name, str):
    raise ValueError(f"Algorithm.name must be a non-empty str, got {record.name!r}.")
  if record.name in ALGORITHMS and not replace:
    raise ValueError(f"algorithm {record.name!r} is already registered (pass replace=True).")
  if record.axes < 1:
    raise ValueError(f"Algorithm.axes must be at least 1, got {record.axes}.")
  if record.auto and (record.axes != 1 or record.schedule is None):
    raise ValueError(
      f"algorithm {record.name!r}: auto=True needs axes=1 and a schedule (the cost model)."
    )
  if record.auto and record.lossy:
    raise ValueError(f"algorithm {record.name!r}: a lossy algorithm cannot be an auto candidate.")
  ALGORITHMS[record.name] = record
  return record


def names(
  *,
  axes: int | None = None,
  hand_written: bool | None = None,
  auto: bool | None = None,
  priced: bool | None = None,
) -> tuple[str, ...]:
  """Registry keys filtered by record fields, in registration order.

  Example:
    >>> names(axes=1, hand_written=True)[:3]
    ('ring', 'bidirectional_ring', 'tree')
  """
  return tuple(
    r.name
    for r in ALGORITHMS.values()
    if (axes is None or r.axes == axes)
    and (hand_written is None or r.hand_written == hand_written)
    and (auto is None or r.auto == auto)
    and (priced is None or (r.schedule is not None) == priced)
  )


for _record in (
  Algorithm(
    "ring",
    ring,
    schedule=cost_model.ring_schedule,
    messages=topology.ring_messages,
    summary="reduce-scatter + all-gather around a ring, 2(p-1) steps",
  ),
  Algorithm(
    "bidirectional_ring",
    bidirectional_ring,
    schedule=cost_model.bidirectional_ring_schedule,
    messages=topology.bidirectional_ring_messages,
    summary="two rings in opposite directions, half the buffer each",
  ),
  Algorithm(
    "tree",
    tree,
    schedule=cost_model.tree_schedule,
    messages=topology.tree_messages,
    summary="binomial reduce to a root, then binomial broadcast",
  ),
  Algorithm(
    "recursive_doubling",
    recursive_doubling,
    schedule=cost_model.recursive_doubling_schedule,
    messages=topology.recursive_doubling_messages,
    summary="lg p full-buffer exchanges with XOR partners",
  ),
  Algorithm(
    "halving_doubling",
    halving_doubling,
    schedule=cost_model.halving_doubling_schedule,
    messages=topology.halving_doubling_messages,
    summary="Rabenseifner: recursive-halving RS + recursive-doubling AG",
  ),
  Algorithm(
    "naive",
    naive,
    schedule=cost_model.naive_schedule,
    messages=topology.naive_messages,
    summary="parameter server: everyone to a root and back",
  ),
  Algorithm(
    "hierarchical",
    hierarchical,
    axes=2,
    auto=False,
    schedule=cost_model.hierarchical_schedule,
    messages=hierarchical_messages,
    summary="ring RS inside, all-reduce across on 1/a, AG inside",
  ),
  Algorithm(
    "psum",
    xla_psum,
    hand_written=False,
    auto=False,
    wires=(None,),
    schedule=cost_model.ring_schedule,
    messages=topology.ring_messages,  # modelled as a ring
    summary="XLA's own collective (the reference)",
  ),
  Algorithm("auto", auto, auto=False, summary="the cost model's choice for this p and size"),
):
  register(_record)

# Compressed all-reduce (issue 19): the quantize-once algorithm.
register(
  Algorithm(
    "two_shot",
    two_shot,
    auto=False,
    schedule=cost_model.ring_schedule,  # the same steps and bytes as the ring
    messages=two_shot_messages,
    summary="direct reduce-scatter + direct all-gather: a slice is quantized once",
  )
)

# The algorithms large clusters use (issue 12).
for _record in (
  Algorithm(
    "swing",
    swing,
    schedule=cost_model.swing_schedule,
    messages=swing_messages,
    summary="Swing: halving RS + doubling AG with partners r ± ρ(s), near-first",
  ),
  Algorithm(
    "double_binary_tree",
    double_binary_tree,
    schedule=cost_model.double_binary_tree_schedule,
    messages=double_binary_tree_messages,
    summary="NCCL's two complementary binary trees, half the buffer each, pipelined",
  ),
  Algorithm(
    "halving_doubling_near",
    halving_doubling_near,
    schedule=cost_model.halving_doubling_near_schedule,
    messages=halving_doubling_near_messages,
    summary="halving-doubling with the nearest partners first (big halves go near)",
  ),
):
  register(_record)


def _check_algorithm(algorithm: str) -> None:
  if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
    raise ValueError(
      f"algorithm={algorithm!r} is not supported; expected one of {sorted(ALGORITHMS)}."
    )


def _check_axis_name(axis_name: AxisName, algorithm: str) -> None:
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


def _check_wire(wire: str | None, op: str, algorithm: str, dtype) -> _wire.WireFormat:
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
  if not jnp.issubdtype(jnp.dtype(dtype), jnp.floating):
    raise TypeError(f"wire={wire!r} needs a floating-point x, got dtype {jnp.dtype(dtype)}.")
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

  Raises:
    ValueError: unknown ``op``, ``algorithm`` or ``wire``, unbound ``axis_name``,
      ``hierarchical`` without two axes, a lossy ``wire`` with ``op="max"``/``"min"``
      or with ``algorithm="psum"``.
    TypeError: options passed positionally, non-numeric dtype, integer ``mean``,
      malformed ``axis_name``, a lossy ``wire`` on a non-float dtype.

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
  reduction = get_op(op, x.dtype)
  _check_algorithm(algorithm)
  _check_wire(wire, op, algorithm, x.dtype)
  _check_axis_name(axis_name, algorithm)
  p = _comm.size(axis_name)
  flat = x.reshape(-1)  # T[n]
  record = ALGORITHMS[algorithm]
  if record.hand_written:
    flat = _comm.make_varying(flat, axis_name)
  if p > 1 or not record.hand_written:
    with _wire.using(wire):  # _comm.send encodes every message in this format
      flat = ALGORITHMS[algorithm](flat, axis_name, reduction.combine)
  out = reduction.finalize(flat, p).reshape(x.shape)
  # Every participant holds the same bits: type the result like psum's (a no-op
  # under check_vma=False and for XLA's own collective).
  return as_invariant(out, axis_name)


__all__ = ["ALGORITHMS", "OPS", "Algorithm", "all_reduce", "names", "register"]
