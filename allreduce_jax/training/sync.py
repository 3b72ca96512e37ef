"""Synchronous data-parallel SGD over the hand-written all-reduce.

Each of the ``p`` participants of the ``data`` mesh axis holds its own copy of the
parameters and optimizer state (a leading axis of size ``p``, sharded over
``data``), takes its own shard of the global batch, computes its gradient, and
averages gradients with :func:`allreduce_jax.all_reduce_tree` using any algorithm
of ``ALGORITHMS``. Every participant then applies the same optax update to its
own copy. Nothing forces the copies to agree except the all-reduce itself, so
checking that they stay bitwise identical (:func:`replicas_identical`) checks the
algorithm.

Backup workers: a 0/1 mask per (step, participant) drops the slowest gradients;
the update then averages the kept ones, ``psum(m * g) / psum(m)``.

A chunk of steps runs as one ``lax.scan`` inside one ``jax.shard_map``: one
compiled program per (mesh, chunk length).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import ALGORITHMS, all_reduce_tree, devices, overlap, progress
from allreduce_jax.training import models
from allreduce_jax.training.checkpoint import State


def make_sync_chunk(
  graphdef: Any,
  rest: Any,
  tx: optax.GradientTransformation,
  mesh: jax.sharding.Mesh,
  algorithm: str = "ring",
  axis: str | tuple[str, ...] = "data",
  bucket_bytes: int | None = None,
  masked: bool = False,
  tx_reduces: bool = False,
) -> Callable:
  """Builds the jitted data-parallel training of a chunk of steps.

  Per step and participant: ``g_i = ∇ loss(w_i; batch_i)``; then
  ``g = all_reduce_tree(g_i, op="mean")`` (or ``sum(m_i g_i) / sum(m_i)`` when
  ``masked``); then ``w_i <- w_i + tx.update(g, ...)`` on every participant.
  With ``tx_reduces`` the optimizer averages the gradients itself (an
  ``optax.chain`` that starts with ``all_reduce_gradients(axis, wire=...)``,
  ``powersgd(axis, ...)`` or ``topk(axis, ...)``): the step hands it ``g_i`` and
  all-reduces only the loss.

  Args:
    graphdef: the model's graph definition (from :func:`models.split`).
    rest: the model's non-parameter state.
    tx: the optax optimizer.
    mesh: a mesh with axis ``axis`` (e.g. from ``devices.submesh``).
    algorithm: a key of ``allreduce_jax.ALGORITHMS``.
    axis: the data-parallel mesh axis, or a tuple of axes (their product; e.g.
      ``("outer", "inner")`` for ``algorithm="hierarchical"``).
    bucket_bytes: passed to ``all_reduce_tree`` (``None``: one fused bucket).
    masked: whether a per-step participant mask selects the gradients kept.
    tx_reduces: ``tx`` averages the per-participant gradients over ``axis`` (its
      first transformation is a compressed or exact all-reduce); not with ``masked``.

  Returns:
    ``chunk(params, opt_state, x_all, y_all, idx, mask) -> (params, opt_state,
    losses)`` where ``params``/``opt_state`` have a leading participant axis
    (``T[p, ...]``, sharded over ``axis``), ``x_all``: f32[n, 64] and ``y_all``:
    i32[n] are replicated, ``idx``: i32[steps, p * B] (sharded on its second
    axis: participant ``i`` reads columns ``i*B:(i+1)*B``), ``mask``:
    f32[steps, p] (ignored unless ``masked``), and ``losses``: f32[p, steps], the
    (kept-worker) mean training loss seen by each participant.
  """
  if algorithm not in ALGORITHMS:
    raise ValueError(
      f"algorithm={algorithm!r} is not supported; expected one of {sorted(ALGORITHMS)}."
    )
  if masked and tx_reduces:
    raise ValueError("masked=True with tx_reduces=True: a reducing optimizer takes no mask.")

  def per_device(params, opt_state, x_all, y_all, idx, mask):
    # params leaves: T[1, ...]; idx: i32[steps, B]; mask: f32[steps, 1]
    params = jax.tree.map(lambda a: a[0], params)
    opt_state = jax.tree.map(lambda a: a[0], opt_state)

    def step(carry, inp):
      w, s = carry
      ib, m = inp  # ib: i32[B], m: f32[1]
      xb, yb = x_all[ib], y_all[ib]  # f32[B, 64], i32[B]
      loss, g = jax.value_and_grad(lambda q: models.loss_fn(graphdef, q, rest, xb, yb))(w)
      if tx_reduces:  # tx averages g_i (all_reduce_gradients / powersgd / topk first)
        loss = all_reduce_tree(loss, axis, op="mean", algorithm=algorithm)
      elif masked:
        m0 = m[0]
        g = jax.tree.map(lambda a: a * m0, g)
        tot = all_reduce_tree(
          {"g": g, "loss": loss * m0, "kept": m0},
          axis,
          op="sum",
          algorithm=algorithm,
          bucket_bytes=bucket_bytes,
        )
        g = jax.tree.map(lambda a: a / tot["kept"], tot["g"])
        loss = tot["loss"] / tot["kept"]
      else:
        avg = all_reduce_tree(
          {"g": g, "loss": loss}, axis, op="mean", algorithm=algorithm, bucket_bytes=bucket_bytes
        )
        g, loss = avg["g"], avg["loss"]
      # A fusion boundary between the gradient and the update: the update rounds as it does
      # compiled on its own, as the overlapped step (make_overlapped_chunk) runs it.
      g = lax.optimization_barrier(g)
      updates, s = tx.update(g, s, w)
      w = optax.apply_updates(w, updates)
      return (w, s), loss

    (params, opt_state), losses = lax.scan(step, (params, opt_state), (idx, mask))
    stack = lambda t: jax.tree.map(lambda a: a[None], t)  # noqa: E731
    return stack(params), stack(opt_state), losses[None]

  fn = jax.shard_map(
    per_device,
    mesh=mesh,
    in_specs=(P(axis), P(axis), P(), P(), P(None, axis), P(None, axis)),
    out_specs=(P(axis), P(axis), P(axis)),
  )
  return jax.jit(fn)


def make_overlapped_chunk(
  graphdef: Any,
  rest: Any,
  tx: optax.GradientTransformation,
  mesh: jax.sharding.Mesh,
  algorithm: str = "ring",
  axis: str | tuple[str, ...] = "data",
  bucket_bytes: int | None = None,
  mechanism: str = "auto",
) -> Callable:
  """:func:`make_sync_chunk`'s chunk with each step's all-reduce overlapped with its
  backward pass (:func:`allreduce_jax.overlap.value_and_grad`), the same bits.

  A step is the overlapped gradient of ``{"g": grads, "loss": loss}`` packed as
  :func:`make_sync_chunk` packs it (the loss in the last bucket), then the optimizer
  update as one more program; steps run from Python, one after the other, instead of
  inside one ``lax.scan`` (the overlap needs several programs per step). Same call and
  result as :func:`make_sync_chunk`'s (no mask).
  """

  if not bucket_bytes:
    raise ValueError(
      f"bucket_bytes={bucket_bytes!r}: an overlapped step needs buckets of a positive"
      " size (--bucket-bytes N), or the whole gradient is one bucket sent at the end."
    )

  def loss_fn(w, x_all, y_all, ib):  # w leaves: T[1, ...]; ib: i32[B]
    w = jax.tree.map(lambda a: a[0], w)
    return models.loss_fn(graphdef, w, rest, x_all[ib], y_all[ib])

  grad = overlap.value_and_grad(
    loss_fn,
    axis,
    op="mean",
    algorithm=algorithm,
    bucket_bytes=bucket_bytes,
    reduce_loss=True,
    mechanism=mechanism,
  )

  def apply(w, s, g):  # leaves T[1, ...]: this participant's copy
    one = lambda t: jax.tree.map(lambda a: a[0], t)  # noqa: E731
    updates, s = tx.update(one(g), one(s), one(w))
    w = optax.apply_updates(one(w), updates)
    return jax.tree.map(lambda a: a[None], (w, s))

  update = jax.jit(
    jax.shard_map(apply, mesh=mesh, in_specs=(P(axis), P(axis), P(axis)), out_specs=P(axis))
  )
  row = jax.jit(lambda ib, t: ib[t], out_shardings=NamedSharding(mesh, P(axis)))

  def chunk(params, opt_state, x_all, y_all, idx, mask):
    del mask  # every worker's gradient is kept (no backup workers here)
    losses = []
    for t in range(idx.shape[0]):
      loss, g = grad(params, x_all, y_all, row(idx, t))
      params, opt_state = update(params, opt_state, g)
      losses.append(loss)
    return params, opt_state, jnp.stack(losses)[None]

  return chunk


def participants(mesh: jax.sharding.Mesh, axis: str | tuple[str, ...] = "data") -> int:
  """The number of participants along ``axis`` (a name or a tuple of names)."""
  names = (axis,) if isinstance(axis, str) else tuple(axis)
  return int(np.prod([mesh.shape[a] for a in names]))


def replicate(tree: Any, mesh: jax.sharding.Mesh, axis: str | tuple[str, ...] = "data") -> Any:
  """Stacks one copy of ``tree`` per participant: leaves ``T[...]`` -> ``T[p, ...]``."""
  p = participants(mesh, axis)
  sharding = NamedSharding(mesh, P(axis))

  def one(a):
    a = np.asarray(a)
    return devices.put(
      (p, *a.shape), a.dtype, sharding, lambda index: np.broadcast_to(a, (p, *a.shape))[index]
    )

  return jax.tree.map(one, tree)


def put_train_set(data, mesh: jax.sharding.Mesh) -> tuple[jax.Array, jax.Array]:
  """``data``'s whole training set, replicated on every device of ``mesh`` (the
  compiled chunks gather their batches from it on device)."""
  rep = NamedSharding(mesh, P())
  return devices.put_host(data.x_train, rep), devices.put_host(data.y_train, rep)


def concat_losses(chunks: list[np.ndarray]) -> np.ndarray:
  """The per-step training losses of a run from its chunks' (f32[0] if none ran)."""
  return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


def replicas_identical(stacked: Any) -> bool:
  """Whether every participant's copy (row of the leading axis) is bitwise identical."""
  for leaf in jax.tree.leaves(stacked):
    a = devices.fetch(leaf)
    if not all(np.array_equal(a[k], a[0]) for k in range(1, a.shape[0])):
      return False
  return True


def first_replica(stacked: Any) -> Any:
  """Participant 0's copy as host arrays: ``T[p, ...]`` -> ``T[...]``."""
  return jax.tree.map(lambda a: devices.fetch(a)[0], stacked)


@dataclass(frozen=True)
class SyncResult:
  """What a synchronous run produced.

  ``losses``: f32[steps] training loss per step; ``eval_steps``/``test_acc``: test
  accuracy after those many steps (0 = initial); ``params``: final parameters
  (participant 0); ``replicas_identical``: checked after every chunk.
  """

  losses: np.ndarray
  eval_steps: list[int]
  test_acc: list[float]
  final_test_acc: float
  final_train_acc: float
  replicas_identical: bool
  params: Any


def train_sync(
  graphdef: Any,
  params: Any,
  rest: Any,
  tx: optax.GradientTransformation,
  data,
  idx: np.ndarray,
  *,
  mesh: jax.sharding.Mesh,
  algorithm: str = "ring",
  mask: np.ndarray | None = None,
  eval_every: int = 50,
  bucket_bytes: int | None = None,
  axis: str | tuple[str, ...] = "data",
  chunk_fn: Callable | None = None,
  evaluate: Callable[..., float] | None = None,
  start: Any = None,
  checkpoints: Any = None,
  overlap: bool = False,
) -> SyncResult:
  """Trains synchronously over ``mesh`` on the batches ``idx``.

  Args:
    graphdef, params, rest: the model (from :func:`models.split`).
    tx: the optax optimizer.
    data: a :class:`~allreduce_jax.training.data.Digits`.
    idx: i32[steps, p * B] global batches (participant ``i`` takes block ``i``).
    mesh: the data-parallel mesh (``p`` participants along ``axis``).
    algorithm: the all-reduce algorithm (a key of ``ALGORITHMS``).
    mask: optional f32[steps, p] of 0/1: the gradients kept at each step (backup
      workers drop the slowest). Every step must keep at least one.
    eval_every: steps per compiled chunk; test accuracy is measured after each.
    bucket_bytes: passed to ``all_reduce_tree``.
    axis: the mesh axis (or tuple of axes, as in :func:`make_sync_chunk`).
    chunk_fn: a prebuilt :func:`make_sync_chunk` for this mesh/algorithm/masking,
      reused across runs so it compiles once (built here if ``None``).
    evaluate: ``evaluate(params, x, y) -> float`` (default: test accuracy,
      :func:`make_evaluator`); ``test_acc`` holds what it returns.
    start: a :class:`~allreduce_jax.training.checkpoint.State` to resume from
      (``idx``/``mask`` then hold the steps after ``start.step`` only), or None.
    checkpoints: a :class:`~allreduce_jax.training.checkpoint.Checkpoints`: the run is
      saved after every ``checkpoints.every``-th step (chunks also end there) and after
      its last step, or None.
    overlap: each step's all-reduce overlapped with its backward pass
      (:func:`make_overlapped_chunk`; ``bucket_bytes`` > 0, no ``mask``): the same
      parameters, bit for bit.

  Returns:
    A :class:`SyncResult`.

  Raises:
    ValueError: malformed ``idx``/``mask``/``eval_every``.
    RuntimeError: participants' parameters stopped being identical.
  """
  p = participants(mesh, axis)
  idx = np.asarray(idx, np.int32)
  if idx.ndim != 2 or idx.shape[1] % p:
    raise ValueError(f"idx must be i32[steps, p * B] with p={p}; got shape {idx.shape}.")
  if eval_every < 1:
    raise ValueError(f"eval_every must be >= 1, got {eval_every}.")
  steps = idx.shape[0]
  masked = mask is not None
  if masked:
    mask = np.asarray(mask, np.float32)
    if mask.shape != (steps, p):
      raise ValueError(f"mask must have shape (steps, p) = {(steps, p)}; got {mask.shape}.")
    if (mask.sum(axis=1) < 1).any():
      raise ValueError("mask must keep at least one participant per step.")
  else:
    mask = np.ones((steps, p), np.float32)
  if overlap and masked:
    raise ValueError("overlap=True with a mask: backup workers are not overlapped here.")
  if chunk_fn is not None:
    chunk = chunk_fn
  elif overlap:
    chunk = make_overlapped_chunk(graphdef, rest, tx, mesh, algorithm, axis, bucket_bytes)
  else:
    chunk = make_sync_chunk(graphdef, rest, tx, mesh, algorithm, axis, bucket_bytes, masked)
  col = NamedSharding(mesh, P(None, axis))
  x_all, y_all = put_train_set(data, mesh)
  evaluate = evaluate or make_evaluator(graphdef, rest)
  if start is None:
    w = replicate(params, mesh, axis)
    s = replicate(tx.init(params), mesh, axis)
    eval_steps, test_acc, losses = [0], [evaluate(params, data.x_test, data.y_test)], []
    first, examples = 0, 0
  else:
    w = replicate(start.params, mesh, axis)
    s = replicate(start.opt_state, mesh, axis)
    eval_steps, test_acc = list(start.eval_steps), list(start.test_acc)
    losses = [np.asarray(start.losses, np.float32)]
    first, examples = start.step, start.examples
  end = first + steps
  every = checkpoints.every if checkpoints is not None else end
  identical = True
  at = first
  while at < end:
    stop = min((at // eval_every + 1) * eval_every, (at // every + 1) * every, end)
    ib = devices.put_host(idx[at - first : stop - first], col)
    mb = devices.put_host(mask[at - first : stop - first], col)
    w, s, chunk_losses = chunk(w, s, x_all, y_all, ib, mb)
    losses.append(devices.fetch(chunk_losses)[0])
    progress.step(stop)  # a launcher's watchdog and the run's timeline
    examples += (stop - at) * idx.shape[1]
    identical = replicas_identical(w)
    if not identical:
      raise RuntimeError(f"participants' parameters differ after step {stop} ({algorithm=}).")
    if stop % eval_every == 0 or stop == end:
      eval_steps.append(stop)
      test_acc.append(evaluate(first_replica(w), data.x_test, data.y_test))
    last = stop == end  # saved whatever --checkpoint-every is
    if checkpoints is not None and (stop % every == 0 or last) and checkpoints.writes:
      began = time.perf_counter()
      checkpoints.save(
        _checkpoint_state(stop, w, s, examples, p, checkpoints, losses, eval_steps, test_acc)
      )
      progress.mark("save", time.perf_counter() - began)  # what the save held training up
    at = stop
  final = first_replica(w)
  return SyncResult(
    losses=concat_losses(losses),
    eval_steps=eval_steps,
    test_acc=test_acc,
    final_test_acc=test_acc[-1],
    final_train_acc=evaluate(final, data.x_train, data.y_train),
    replicas_identical=identical,
    params=final,
  )


def _local_copy(stacked: Any) -> Any:
  """This process's first participant's copy as host arrays (``T[p, ...]`` -> ``T[...]``),
  read without a collective: every copy is bitwise identical (checked after every chunk)."""
  return jax.tree.map(lambda a: np.asarray(a.addressable_shards[0].data)[0], stacked)


def _checkpoint_state(step, w, s, examples, p, checkpoints, losses, eval_steps, test_acc):
  return State(
    step=step,
    params=_local_copy(w),
    opt_state=_local_copy(s),
    examples=examples,
    workers=p,
    learning_rate=checkpoints.learning_rate,
    losses=concat_losses(losses).tolist(),
    eval_steps=eval_steps,
    test_acc=test_acc,
    restarts=checkpoints.restarts,
  )


def make_evaluator(graphdef: Any, rest: Any, metric: str = "accuracy") -> Callable[..., float]:
  """``evaluate(params, x, y) -> float``: accuracy (``metric="accuracy"``) or mean
  loss (``"loss"``), jitted (one compile per shape)."""
  fns = {"accuracy": models.accuracy, "loss": models.loss_fn}
  if metric not in fns:
    raise ValueError(f"metric={metric!r} is not supported; expected one of {sorted(fns)}.")
  acc = jax.jit(lambda w, x, y: fns[metric](graphdef, w, rest, x, y))

  def evaluate(params, x, y) -> float:
    return float(acc(params, jnp.asarray(x), jnp.asarray(y)))

  return evaluate


def train_single_device(
  graphdef: Any, params: Any, rest: Any, tx: optax.GradientTransformation, data, idx: np.ndarray
) -> tuple[np.ndarray, Any]:
  """The reference: plain single-device training on the full global batches ``idx``.

  Returns ``(losses f32[steps], final params)``.
  """

  @jax.jit
  def run(w, s, x_all, y_all, idx):
    def step(carry, ib):
      w, s = carry
      loss, g = jax.value_and_grad(
        lambda q: models.loss_fn(graphdef, q, rest, x_all[ib], y_all[ib])
      )(w)
      updates, s = tx.update(g, s, w)
      return (optax.apply_updates(w, updates), s), loss

    (w, s), losses = lax.scan(step, (w, s), idx)
    return w, losses

  w, losses = run(
    params, tx.init(params), jnp.asarray(data.x_train), jnp.asarray(data.y_train), jnp.asarray(idx)
  )
  return np.asarray(losses), w
