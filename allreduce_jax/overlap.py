"""The data-parallel gradient with its all-reduce hidden behind the backward pass.

Data-parallel systems start each gradient bucket's all-reduce as soon as the backward
pass has produced it, while the backward goes on with the layers below (PyTorch DDP's
``bucket_cap_mb``; XLA's latency-hiding scheduler on GPU and TPU). The last layer's
gradient exists first, so its bucket travels while the earlier layers' gradients are
still being computed, and a step pays the compute plus only the communication the
backward could not cover: at least the last bucket's.

:func:`value_and_grad` does this for any registered algorithm and wire. Its backward
is cut into stages, one per bucket of :func:`~allreduce_jax.fusion.plan_buckets`
(:mod:`allreduce_jax._staging`: the pullback's jaxpr split by what each bucket needs,
readiest bucket first, nothing recomputed), and each bucket is all-reduced by
:func:`~allreduce_jax.fusion.reduce_bucket`, the code :func:`all_reduce_tree` runs, so
the gradients are bit for bit ``all_reduce_tree(jax.grad(loss_fn)(params, *batch),
bucket_bytes=...)``: the same leaves in the same buckets at the same offsets; only
*when* each bucket is sent changes.

How the all-reduces run beside the backward (``mechanism``), from what XLA does:

- ``"streams"`` (the default on CPU, called outside ``jit``): the forward pass and each
  stage are one compiled program on the device's default execution stream; each
  bucket's all-reduce is its own program dispatched on execution stream 1
  (``jaxlib.xla_client.execution_stream_id``), so it runs while the next stage
  computes. XLA:CPU has no asynchronous collectives, and within one program a
  collective whose input is computed mid-program runs in line with the compute, while
  two programs on one stream run one after the other: a second stream is what lets a
  bucket's transfer and the next stage overlap. Every process dispatches the
  all-reduces in the same order on the same stream.
- ``"thread"``: the same programs, the all-reduces dispatched from a second Python
  thread (measured beside ``"streams"`` in ``experiments/overlap``).
- ``"one_program"`` (the default on GPU/TPU, and what runs when the function is
  called inside a ``jax.shard_map`` body): one program that issues each bucket's
  all-reduce right after its stage; XLA's latency-hiding scheduler overlaps them there.
  On XLA:CPU it is correct but runs the all-reduces in line.

``experiments/overlap`` measures the mechanisms against one another and against the
floor no schedule can beat.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxlib import xla_client

from allreduce_jax import _comm, _staging
from allreduce_jax._api import check_axis_name, check_wire, keyword_only
from allreduce_jax._comm import AxisName
from allreduce_jax._invariant import varying_axes
from allreduce_jax._ops import OPS
from allreduce_jax.fusion import reduce_bucket
from allreduce_jax.registry import check_algorithm

#: PyTorch DDP's default bucket (``bucket_cap_mb=25``).
DEFAULT_BUCKET_BYTES = 25 * 2**20

#: The ways to run the all-reduces beside the backward (see the module's docstring).
MECHANISMS = ("auto", "streams", "thread", "one_program")


@keyword_only(2, "op, algorithm, bucket_bytes, wire, reduce_loss, mechanism and check_vma")
def value_and_grad(
  loss_fn: Callable[..., jax.Array],
  axis_name: AxisName,
  *,
  op: str = "mean",
  algorithm: str = "ring",
  bucket_bytes: int = DEFAULT_BUCKET_BYTES,
  wire: str | None = None,
  reduce_loss: bool = False,
  mechanism: str = "auto",
  check_vma: bool = True,
) -> OverlappedGrad:
  """``loss_fn``'s loss and its gradient all-reduced over ``axis_name``, each bucket's
  all-reduce started as soon as the backward pass has produced that bucket.

  ``fn = value_and_grad(loss_fn, "data", bucket_bytes=...)``; then
  ``loss, grads = fn(params, *batch)``, where ``loss_fn(params, *batch)`` is one
  participant's scalar loss on its batch shard. Call ``fn`` either

  - outside ``jit``, on arrays placed on a mesh with an ``axis_name`` axis
    (``jax.device_put(x, NamedSharding(mesh, spec))``; the batch usually
    ``P("data")``, the parameters replicated ``P()`` or one copy per participant):
    each participant's ``loss_fn`` sees its blocks, as in a ``jax.shard_map`` with
    those specs, and the step runs as several programs that overlap (``"streams"`` on
    CPU); or
  - inside a ``jax.shard_map`` body (``axis_name`` bound): one program
    (``"one_program"``), for GPU/TPU or to put it in a larger step.

  Each participant differentiates its own loss (replicated parameters are made
  varying first, as ``jax.lax.pcast(params, axis_name, to="varying")`` does), so the
  gradients are per participant until the all-reduce.

  Args:
    loss_fn: ``loss_fn(params, *batch) -> scalar`` (a float 0-d array).
    axis_name: the data-parallel mesh axis, or a tuple of axes (their product).
    op: keyword-only; ``"mean"`` (default) or any of ``OPS``.
    algorithm: keyword-only; a key of ``ALGORITHMS``.
    bucket_bytes: keyword-only; at most this many bytes per bucket, > 0 (DDP's
      ``bucket_cap_mb``; default 25 MiB). Smaller buckets start sooner and pay the
      per-message latency more often.
    wire: keyword-only; the wire format, as in :func:`allreduce_jax.all_reduce`.
    reduce_loss: keyword-only; also all-reduce the loss (with ``op``), packed after
      the gradients, as ``all_reduce_tree({"g": grads, "loss": loss})`` packs it.
    mechanism: keyword-only; ``"auto"`` (``"streams"`` on CPU, ``"one_program"``
      elsewhere), ``"streams"``, ``"thread"`` or ``"one_program"``; inside a
      ``shard_map`` body it is always one program.
    check_vma: keyword-only; ``jax.shard_map``'s ``check_vma`` for the programs
      built outside ``jit`` (inside a body the body's own typing applies).

  Returns:
    An :class:`OverlappedGrad` ``fn``; ``fn(params, *batch)`` returns ``(loss,
    grads)``: ``grads`` has ``params``' structure, bit for bit
    ``all_reduce_tree(jax.grad(loss_fn)(params, *batch), axis_name, op=op,
    algorithm=algorithm, bucket_bytes=bucket_bytes, wire=wire)`` on every participant
    (with ``reduce_loss``: the tree ``{"g": grads, "loss": loss}``'s). ``loss`` is
    this participant's loss (outside ``jit``: one per participant, stacked along
    the axis), or with ``reduce_loss`` the reduced loss.

  Raises:
    ValueError: a ``bucket_bytes`` that is not a positive integer, an unknown
      ``op``/``algorithm``/``wire``/``mechanism`` (here); from ``fn``: a loss that is
      not a scalar, an ``axis_name`` that is not bound (not an axis of the body or
      of the arrays' mesh).
    TypeError: options passed positionally; from ``fn``: parameters that are not a
      pytree of floating-point arrays, arrays not placed on a mesh outside ``jit``.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> from allreduce_jax import overlap
    >>> mesh = jax.make_mesh((8,), ("data",))
    >>> params = {"w": jnp.ones((4, 2)), "b": jnp.zeros(2)}
    >>> params = jax.device_put(params, NamedSharding(mesh, P()))
    >>> x = jax.device_put(jnp.ones((16, 4)), NamedSharding(mesh, P("data")))
    >>> loss_fn = lambda p, x: jnp.mean((x @ p["w"] + p["b"]) ** 2)
    >>> fn = overlap.value_and_grad(loss_fn, "data", bucket_bytes=8)
    >>> loss, grads = fn(params, x)  # buckets [b] and [w], each sent once it exists
    >>> print(loss, grads["b"])  # one loss per participant; the mean gradient
    [16. 16. 16. 16. 16. 16. 16. 16.] [4. 4.]
  """
  return OverlappedGrad(
    loss_fn, axis_name, op, algorithm, bucket_bytes, wire, reduce_loss, mechanism, check_vma
  )


def _check_options(op, algorithm, bucket_bytes, wire, mechanism) -> None:
  if op not in OPS:
    raise ValueError(f"op={op!r} is not supported; expected one of {OPS}.")
  check_algorithm(algorithm)
  check_wire(wire, op, algorithm)
  if (
    isinstance(bucket_bytes, bool)
    or not isinstance(bucket_bytes, (int, np.integer))
    or bucket_bytes <= 0
  ):
    raise ValueError(
      f"bucket_bytes={bucket_bytes!r} must be a positive number of bytes (the most one"
      " bucket holds, as DDP's bucket_cap_mb); the whole gradient in one bucket leaves"
      " nothing to overlap."
    )
  if mechanism not in MECHANISMS:
    raise ValueError(f"mechanism={mechanism!r} is not supported; expected one of {MECHANISMS}.")


def _check_params(params: Any) -> int:
  """The number of parameter leaves; a ``TypeError`` naming a leaf that is not a
  floating-point array."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  if not flat:
    raise TypeError("params has no arrays: expected a pytree of floating-point arrays.")
  for path, leaf in flat:
    dtype = getattr(leaf, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
      raise TypeError(
        f"params{jax.tree_util.keystr(path)} is {type(leaf).__name__}"
        f"{f' of dtype {dtype}' if dtype is not None else ''}: expected a pytree of"
        " floating-point arrays (the gradient is taken with respect to every leaf)."
      )
  return len(flat)


def _spec(x) -> P:
  return x.sharding.spec


def _varying(aval) -> frozenset:
  mat = getattr(aval, "mat", None) or getattr(aval, "manual_axis_type", None)
  if mat is not None:
    return frozenset(mat.varying)
  return frozenset(getattr(aval, "vma", frozenset()))


@dataclass(frozen=True)
class _Transport:
  """How a per-participant value crosses from one program to the next: stacked along
  a new leading axis sharded over the mesh axes it varies over (all of them without
  typing), or as it is where typed ``shard_map`` says it is the same everywhere."""

  axes: tuple

  @property
  def spec(self) -> P:
    return P(self.axes) if self.axes else P()

  def out(self, x):  # per participant -> the block of a global array
    return x[None] if self.axes else x

  def into(self, x):  # the block of a global array -> per participant
    return x[0] if self.axes else x


class OverlappedGrad:
  """What :func:`value_and_grad` returns: ``fn(params, *batch) -> (loss, grads)``.

  Outside ``jit`` the programs of one step are compiled on the first call for each
  set of argument shapes, dtypes and shardings, and kept (:meth:`programs`)."""

  def __init__(
    self, loss_fn, axis_name, op, algorithm, bucket_bytes, wire, reduce_loss, mechanism, check_vma
  ):
    _check_options(op, algorithm, bucket_bytes, wire, mechanism)
    self.loss_fn = loss_fn
    self.axis_name = tuple(axis_name) if isinstance(axis_name, list) else axis_name
    self.op, self.algorithm, self.wire = op, algorithm, wire
    self.bucket_bytes = int(bucket_bytes)
    self.reduce_loss = bool(reduce_loss)
    self.mechanism = mechanism
    self.check_vma = bool(check_vma)
    self._programs: dict = {}

  def __call__(self, params: Any, *batch: Any) -> tuple[jax.Array, Any]:
    _check_params(params)
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((params, batch))):
      return self.in_body(params, *batch)
    return self.programs(params, *batch).run(params, *batch)

  def _vjp(self, params: Any, batch: tuple):
    """Inside a ``shard_map`` body: this participant's loss and pullback."""
    mine = jax.tree.map(lambda a: _comm.make_varying(jnp.asarray(a), self.axis_name), params)
    loss, pullback = jax.vjp(lambda q: self.loss_fn(q, *batch), mine)
    loss = jnp.asarray(loss)
    if loss.shape != () or not jnp.issubdtype(loss.dtype, jnp.floating):
      raise ValueError(
        f"loss_fn must return a scalar floating-point loss; it returned"
        f" {loss.dtype}{list(loss.shape)}."
      )
    return loss, pullback

  def _backward(self, pullback, loss) -> _staging.Backward:
    return _staging.stage_backward(pullback, loss, self.bucket_bytes, self.reduce_loss)

  def _reduce(self, leaves: list) -> list:
    return reduce_bucket(
      leaves, self.axis_name, op=self.op, algorithm=self.algorithm, wire=self.wire
    )

  def _result(self, params, loss, leaves: list):
    treedef = jax.tree.structure(params)
    if self.reduce_loss:
      return leaves[-1], jax.tree.unflatten(treedef, leaves[:-1])
    return loss, jax.tree.unflatten(treedef, leaves)

  def in_body(self, params: Any, *batch: Any) -> tuple[jax.Array, Any]:
    """The one-program form, inside a ``jax.shard_map`` body: each stage of the
    backward, then its bucket's all-reduce, in the order the buckets are ready."""
    _check_params(params)
    check_axis_name(self.axis_name, self.algorithm)
    loss, pullback = self._vjp(params, batch)
    backward = self._backward(pullback, loss)
    env = backward.start_env([*jax.tree.leaves(pullback), _one(loss), loss])
    leaves: list = [None] * sum(len(b) for b in backward.buckets)
    for stage in backward.stages:
      _staging.evaluate(stage.eqns, env)
      reduced = self._reduce([_staging.read(env, a) for a in stage.outputs])
      for k, leaf in zip(backward.buckets[stage.bucket], reduced):
        leaves[k] = leaf
    return self._result(params, loss, leaves)

  def programs(self, params: Any, *batch: Any) -> Programs:
    """The compiled programs for these arguments (built on first use)."""
    _check_params(params)
    leaves, treedef = jax.tree.flatten((params, batch))
    mesh = _mesh_of(params, batch, self.axis_name)
    key = (treedef, tuple((x.shape, x.dtype, x.sharding) for x in leaves))
    if key not in self._programs:
      self._programs[key] = Programs(self, mesh, params, batch)
    return self._programs[key]


def _one(loss: jax.Array) -> jax.Array:
  """The cotangent 1 of ``loss``, typed like it (varying where it varies)."""
  one = jnp.ones_like(loss)
  axes = tuple(varying_axes(loss) - varying_axes(one))
  return jax.lax.pcast(one, axes, to="varying") if axes else one


def _mesh_of(params, batch, axis_name):
  """The one mesh every argument is placed on; errors name what is wrong."""
  mesh = None
  for path, x in jax.tree_util.tree_flatten_with_path({"params": params, "batch": batch})[0]:
    name = jax.tree_util.keystr(path)
    sharding = getattr(x, "sharding", None)
    if not isinstance(x, jax.Array) or not isinstance(sharding, NamedSharding):
      raise TypeError(
        f"{name} is {type(x).__name__}"
        f"{f' with {type(sharding).__name__}' if sharding is not None else ''}: outside"
        " jax.shard_map, value_and_grad's function needs every argument placed on one"
        " mesh, jax.device_put(x, NamedSharding(mesh, spec)) (or call it inside a"
        " jax.shard_map body)."
      )
    if mesh is None:
      mesh = sharding.mesh
    elif sharding.mesh != mesh:
      raise ValueError(f"{name} is placed on another mesh than the first argument's.")
  axes = axis_name if isinstance(axis_name, (tuple, list)) else (axis_name,)
  missing = [a for a in axes if a not in mesh.axis_names]
  if missing:
    raise ValueError(
      f"axis_name {missing[0]!r} is not bound: the arguments' mesh has axes"
      f" {tuple(mesh.axis_names)} (inside jax.shard_map: the body's mesh axes)."
    )
  return mesh


class Programs:
  """The compiled programs of one overlapped step: ``forward`` (the loss and the
  residuals), one program per backward stage (``stages``) and one all-reduce per
  bucket (``reduces``), in the order :meth:`run` dispatches them; ``backward`` is
  the staged backward they were built from."""

  def __init__(self, grad: OverlappedGrad, mesh, params, batch):
    self.grad, self.mesh = grad, mesh
    self.platform = mesh.devices.flat[0].platform
    self.n_params = len(jax.tree.leaves(params))
    self.params_def = jax.tree.structure(params)
    self.param_specs = jax.tree.map(_spec, params)
    self.batch_specs = tuple(jax.tree.map(_spec, b) for b in batch)
    self.in_specs = (self.param_specs, *self.batch_specs)
    # Several devices of the mesh in this process (emulated CPU devices): XLA's CPU client
    # runs such programs one at a time whatever the stream, and many dispatched ahead can
    # leave a collective waiting for a thread that never comes (seen with lax.psum alone
    # dispatched in a loop on 8 emulated devices). Nothing overlaps there, so each program
    # is waited for before the next is dispatched.
    self.serial = len(mesh.local_devices) > 1
    self.mechanism = grad.mechanism
    if self.mechanism == "auto":
      self.mechanism = "streams" if self.platform == "cpu" else "one_program"
    self.backward = self._plan(params, batch)
    self._build()

  def _shard_map(self, body, in_specs, out_specs):
    fn = jax.shard_map(
      body, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=self.grad.check_vma
    )
    return jax.jit(fn)

  def _transport(self, atom) -> _Transport:
    if self.grad.check_vma:
      varying = _varying(atom.aval)
      return _Transport(tuple(a for a in self.mesh.axis_names if a in varying))
    return _Transport(tuple(self.mesh.axis_names))

  def _plan(self, params, batch) -> _staging.Backward:
    box = []

    def planner(params, *batch):
      loss, pullback = self.grad._vjp(params, batch)
      box.append(self.grad._backward(pullback, loss))
      return jnp.zeros(())

    jax.eval_shape(self._shard_map(planner, self.in_specs, P()), params, *batch)
    return box[0]

  def _leaf_specs(self) -> list:
    """The out spec of each reduced leaf: its parameter's (the loss: replicated)."""
    specs = jax.tree.leaves(self.param_specs, is_leaf=lambda s: isinstance(s, P))
    return specs + ([P()] if self.grad.reduce_loss else [])

  def _build(self) -> None:
    grad, backward = self.grad, self.backward
    loss_var = backward.invars[-1]
    loss_out = _Transport(()) if grad.reduce_loss else self._transport(loss_var)
    if self.mechanism == "one_program":

      def whole(params, *batch):
        loss, grads = grad.in_body(params, *batch)
        return (loss if grad.reduce_loss else loss_out.out(loss)), grads

      self.whole = self._shard_map(whole, self.in_specs, (loss_out.spec, self.param_specs))
      return
    needed = set().union(*(s.inputs for s in backward.stages))
    self.forward_vars = [v for v in backward.invars if v in needed]
    fwd_t = [self._transport(v) for v in self.forward_vars]

    def forward(params, *batch):
      loss, pullback = grad._vjp(params, batch)
      values = [*jax.tree.leaves(pullback), _one(loss), loss]
      if len(values) != len(backward.invars):
        raise RuntimeError("the forward pass traced differently from its plan")
      env = dict(zip(backward.invars, values))
      local = () if grad.reduce_loss else (loss_out.out(loss),)  # reduced: in its bucket
      return local, [t.out(env[v]) for v, t in zip(self.forward_vars, fwd_t)]

    local_spec = () if grad.reduce_loss else (loss_out.spec,)
    self.forward = self._shard_map(forward, self.in_specs, (local_spec, [t.spec for t in fwd_t]))
    specs = self._leaf_specs()
    self.stages, self.reduces = [], []
    for stage in backward.stages:
      self.stages.append(self._stage_program(stage))
      self.reduces.append(
        self._reduce_program(stage, [specs[k] for k in backward.buckets[stage.bucket]])
      )

  def _stage_program(self, stage: _staging.Stage):
    backward = self.backward
    ins = [self._transport(v) for v in stage.inputs]
    exs = [self._transport(v) for v in stage.exports]
    outs = [self._transport(a) for a in stage.outputs]

    def body(*values):
      env = backward.start_env({v: t.into(x) for v, t, x in zip(stage.inputs, ins, values)})
      _staging.evaluate(stage.eqns, env)
      return (
        [t.out(env[v]) for v, t in zip(stage.exports, exs)],
        [t.out(_staging.read(env, a)) for a, t in zip(stage.outputs, outs)],
      )

    return self._shard_map(
      body, tuple(t.spec for t in ins), ([t.spec for t in exs], [t.spec for t in outs])
    )

  def _reduce_program(self, stage: _staging.Stage, out_specs: list):
    ins = [self._transport(a) for a in stage.outputs]

    def body(leaves):
      return self.grad._reduce([t.into(x) for t, x in zip(ins, leaves)])

    return self._shard_map(body, ([t.spec for t in ins],), out_specs)

  def run(self, params: Any, *batch: Any, on_dispatch: Callable | None = None):
    """One step: ``(loss, grads)``. ``on_dispatch(kind, index, outputs)``, if given,
    is called right after each program is dispatched (``kind``: ``"forward"``,
    ``"stage"``, ``"reduce"``; for timelines)."""
    hook = on_dispatch or (lambda kind, index, outputs: None)

    def note(kind, index, outputs):
      if self.serial:
        jax.block_until_ready(outputs)
      hook(kind, index, outputs)

    if self.mechanism == "one_program":
      loss, grads = self.whole(params, *batch)
      note("step", 0, grads)
      return loss, grads
    local, values = self.forward(params, *batch)
    note("forward", 0, values)
    env = dict(zip(self.forward_vars, values))
    leaves: list = [None] * (self.n_params + self.grad.reduce_loss)
    issued = []
    with (
      concurrent.futures.ThreadPoolExecutor(1) if self.mechanism == "thread" else _Inline() as pool
    ):
      for s, (stage, program, reduce) in enumerate(
        zip(self.backward.stages, self.stages, self.reduces)
      ):
        exports, outs = program(*[env[v] for v in stage.inputs])
        note("stage", s, outs)
        env.update(zip(stage.exports, exports))
        issued.append(pool.submit(_dispatch_reduce, reduce, outs, s, note))
      for stage, future in zip(self.backward.stages, issued):
        for k, leaf in zip(self.backward.buckets[stage.bucket], future.result()):
          leaves[k] = leaf
    loss = leaves.pop() if self.grad.reduce_loss else local[0]
    return loss, jax.tree.unflatten(self.params_def, leaves)


@dataclass(frozen=True)
class Schedule:
  """The times of one overlapped step on two streams: the forward pass, then the
  backward stages one after the other on one; on the other, each bucket's all-reduce
  as soon as its stage has ended and the previous all-reduce is done.

  Attributes:
    forward_s: the forward pass.
    stage_s: each backward stage, in the order they run (the readiest bucket first).
    comm_s: each bucket's all-reduce, in the same order.
  """

  forward_s: float
  stage_s: tuple[float, ...]
  comm_s: tuple[float, ...]

  @property
  def compute_s(self) -> float:
    """Forward and backward: the step without communication."""
    return self.forward_s + sum(self.stage_s)

  @property
  def step_s(self) -> float:
    """When the last all-reduce ends (or the backward, if later)."""
    t = end = self.forward_s
    for stage, comm in zip(self.stage_s, self.comm_s, strict=True):
      t += stage
      end = max(end, t) + comm
    return max(t, end)

  @property
  def exposed_s(self) -> float:
    """Communication after the backward pass: from its end to the last all-reduce's."""
    return self.step_s - self.compute_s

  @property
  def floor_s(self) -> float:
    """What no schedule can beat: no all-reduce starts before its bucket exists, the
    last bucket's cannot hide, none overlaps the forward pass:
    ``T_forward + max(T_backward + T_last, T_first_stage + T_comm)``."""
    backward = sum(self.stage_s)
    return self.forward_s + max(backward + self.comm_s[-1], self.stage_s[0] + sum(self.comm_s))

  @property
  def hideable_s(self) -> float:
    """The communication that can hide: ``min(T_comm - T_last, T_backward - T_first_stage)``."""
    return max(0.0, min(sum(self.comm_s) - self.comm_s[-1], sum(self.stage_s) - self.stage_s[0]))


def even_schedule(
  compute_s: float, comm_s: float, buckets: int, backward: float = 2 / 3
) -> Schedule:
  """The :class:`Schedule` of a step whose backward (``backward`` of ``compute_s``; about
  twice the forward's flops) is cut into ``buckets`` equal stages, each sending an equal
  share of ``comm_s``. A priced model of a network of equal layers (per-bucket latency
  aside: give ``comm_s`` as ``buckets`` times one bucket's all-reduce to count it).

  Example:
    >>> s = even_schedule(3.0, 2.0, buckets=4)
    >>> round(s.step_s, 3), round(s.exposed_s, 3)  # compute 3 s: 1 forward, 4 x 0.5 backward
    (3.5, 0.5)
  """
  stage = compute_s * backward / buckets
  return Schedule(compute_s * (1 - backward), (stage,) * buckets, (comm_s / buckets,) * buckets)


def _dispatch_reduce(reduce, outs, s, note):
  reduced = reduce(outs)
  note("reduce", s, reduced)
  return reduced


class _Inline:
  """The ``"streams"`` dispatcher: each all-reduce dispatched at once, on stream 1."""

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False

  def submit(self, fn, *args):
    with xla_client.execution_stream_id(1):
      result = fn(*args)
    future = concurrent.futures.Future()
    future.set_result(result)
    return future


__all__ = [
  "DEFAULT_BUCKET_BYTES",
  "MECHANISMS",
  "OverlappedGrad",
  "Programs",
  "Schedule",
  "even_schedule",
  "value_and_grad",
]
