"""The sync and parameter-server families of training arms (:class:`~.arms.Arm` records).

``sync`` (equal batches), ``sync_b{b}`` (backup workers: the slowest b gradients
dropped), ``sync_balanced`` (batch ∝ speed), ``sync_isolate`` (slow-node isolation),
``sync_ov`` / ``sync_b1_ov`` (the same training, each step's all-reduce overlapped
with its backward pass: :func:`overlapped_sync_arm`), and ``async``, ``async_eta_tau``,
``dcasgd`` and ``ssp{s}`` on a parameter server: each constructor returns one record;
:mod:`.catalogue` registers them. Local SGD / DiLoCo (:mod:`.local`) and gossip
(:mod:`.gossip`) are the other families.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from allreduce_jax import devices, overlap
from allreduce_jax.training import async_sim, models, sync
from allreduce_jax.training import data as data_mod
from allreduce_jax.training.arms import (
  Arm,
  Curve,
  Setup,
  Timeline,
  Workload,
  allreduce_bytes,
  allreduce_seconds,
  allreduce_us,
  compute_times,
  final_loss,
  model_bytes,
  ps_message_seconds,
  speeds,
  sync_rounds,
)

# ------------------------------------------------------------------ schedules


def sync_timeline(
  setup: Setup,
  seed: int,
  backups: int = 0,
  work=None,
  time_unit_us: float = 0.0,
  comm: tuple[float, float] | None = None,
) -> Timeline:
  """``time_unit_us`` > 0: time in units of one mean gradient of that many µs (give
  ``compute_s=1``), the all-reduce :func:`~.arms.allreduce_us` in those units.
  ``comm``: (seconds, bytes all workers send) of one step's communication instead of
  one all-reduce of the parameters (the compressed arms, :mod:`.compressed`)."""
  n, S = setup.workers, sync_rounds(setup)
  if comm is not None:
    ar, sent = comm
  else:
    ar = allreduce_us(setup) / time_unit_us if time_unit_us else allreduce_seconds(setup)
    sent = allreduce_bytes(setup)
  s = async_sim.sync_schedule(
    setup.compute,
    n,
    S,
    seed,
    backups=backups,
    allreduce_time=ar,
    times=compute_times(setup, seed, work),
  )
  kept = int(n - backups)
  return Timeline(
    time=s.time,
    gradients=np.arange(1, S + 1) * n,
    samples=float(kept * setup.batch_per_worker),
    bytes_sent=S * sent,
    comm_s=S * ar,
    plan=s.mask,
    info={"dropped": backups * S, "allreduce_s": ar},
    step_time=s.step_time,
  )


#: The overlapped sync arms' schedule (:func:`overlapped_sync_arm`): DDP's default bucket
#: (``overlap.DEFAULT_BUCKET_BYTES``, 25 MiB), and two shares measured on the emulated cluster
#: (``experiments/overlap``, a 6-layer MLP, a bucket per layer): the backward pass is 0.69 of
#: a gradient computation (1 − forward/compute: 0.70 on 2 hosts, 0.69 on 4), and 0.67 of the
#: communication the two-stream schedule can hide did hide (the lowest of the ring's three runs
#: on 4 hosts, median 0.72; 0.75 on 2 hosts).
OVERLAP_BUCKET_BYTES = overlap.DEFAULT_BUCKET_BYTES
OVERLAP_BACKWARD = 0.69
OVERLAP_HIDDEN = 0.67


def overlap_buckets(setup: Setup, bucket_bytes: int = OVERLAP_BUCKET_BYTES) -> int:
  """Buckets of ``bucket_bytes`` the gradient is cut into: ``ceil(model bytes / bucket)``."""
  return max(1, math.ceil(model_bytes(setup) / bucket_bytes))


def bucket_allreduce(setup: Setup, buckets: int) -> float:
  """Seconds of one bucket's all-reduce: the setup's network model
  (:func:`~.arms.allreduce_seconds`) for ``1/buckets`` of the parameters."""
  return allreduce_seconds(
    dataclasses.replace(setup, model_params=math.ceil(setup.model_params / buckets))
  )


def exposed_seconds(
  setup: Setup,
  compute: np.ndarray,
  buckets: int,
  backward: float = OVERLAP_BACKWARD,
  hidden: float = OVERLAP_HIDDEN,
) -> np.ndarray:
  """f64[S] the communication left after the backward pass of steps whose slowest kept
  worker computes for ``compute`` (f64[S]) seconds.

  Each step is :func:`allreduce_jax.overlap.even_schedule`: the forward pass, then the
  backward (``backward`` of the compute) in ``buckets`` equal stages, each bucket's
  all-reduce (:func:`bucket_allreduce`) on a second stream as soon as its stage has ended
  on every kept worker (a worker's stages scale with its compute time, so the slowest
  kept worker's end last). Of what that schedule hides, ``hidden`` hides: the exposed
  time is ``T_comm − hidden × (T_comm − schedule.exposed_s)`` (``hidden = 1``: the
  schedule itself; 0: the buckets' all-reduces one after the backward).
  """
  a = bucket_allreduce(setup, buckets)
  comm = buckets * a
  sched = (overlap.even_schedule(float(c), comm, buckets, backward) for c in compute)
  return np.array([comm - hidden * (comm - s.exposed_s) for s in sched], np.float64)


def overlapped_sync_timeline(setup: Setup, seed: int, backups: int = 0) -> Timeline:
  """:func:`sync_timeline`'s steps (the same compute times, hence the same mask and
  training) with each step's all-reduce replaced by :func:`exposed_seconds`.

  The bucket count is fixed for the run: :func:`overlap_buckets`, or one bucket (sync's
  step, nothing hidden) where one all-reduce of the parameters is faster than that many
  buckets at the run's mean step, as a tuned ``bucket_bytes`` would be."""
  tl = sync_timeline(setup, seed, backups)
  compute = tl.step_time - tl.info["allreduce_s"]  # f64[S]: the slowest kept worker
  k = overlap_buckets(setup)
  mean = np.array([compute.mean()])
  if k > 1 and exposed_seconds(setup, mean, k)[0] >= tl.info["allreduce_s"]:
    k = 1
  exposed = exposed_seconds(setup, compute, k)
  step = compute + exposed
  return dataclasses.replace(
    tl,
    time=np.cumsum(step),
    comm_s=float(exposed.sum()),
    info={**tl.info, "buckets": k, "exposed_s": float(exposed.mean())},
    step_time=step,
  )


def balanced_batches(total: int, speed: np.ndarray) -> np.ndarray:
  """i64[N] batch sizes ∝ speed summing to ``total`` (largest remainders, each >= 1).

  Example:
    >>> balanced_batches(64, np.array([1.0, 1.0, 1.0, 0.25])).tolist()
    [20, 20, 19, 5]
  """
  want = total * speed / speed.sum()
  b = np.maximum(np.floor(want).astype(np.int64), 1)
  order = np.argsort(-(want - np.floor(want)), kind="stable")
  k = 0
  while b.sum() < total:
    b[order[k % len(b)]] += 1
    k += 1
  while b.sum() > total:
    b[np.argmax(b)] -= 1
  return b


def _balanced_timeline(setup: Setup, seed: int) -> Timeline:
  B = setup.batch_per_worker
  batches = balanced_batches(setup.workers * B, speeds(setup))
  tl = sync_timeline(setup, seed, work=batches / B)
  return dataclasses.replace(tl, info={**tl.info, "batches": batches.tolist()})


def _isolate_timeline(setup: Setup, seed: int, threshold: float, window: int = 10) -> Timeline:
  """Slow-node isolation: after ``window`` steps, a worker whose mean compute time
  over the last ``window`` steps exceeds ``threshold ×`` the median of the active
  workers' is removed; the global batch is redistributed over the others (each
  takes N/n_active as many samples, and as much longer), at most N/2 removed."""
  n, S = setup.workers, sync_rounds(setup)
  rows = compute_times(setup, seed).rows(S)  # f64[S, N], per-worker time at batch B
  active = np.ones(n, bool)
  step = np.empty(S)
  removed_at: dict[int, int] = {}
  comm = 0.0
  sent = 0.0
  ar = {p: (allreduce_seconds(setup, p), allreduce_bytes(setup, p)) for p in range(1, n + 1)}
  for k in range(S):
    p = int(active.sum())
    step[k] = (rows[k, active] * (n / p)).max() + ar[p][0]
    comm += ar[p][0]
    sent += ar[p][1]
    if k + 1 >= window and p > n // 2:
      recent = rows[k + 1 - window : k + 1].mean(axis=0)
      med = np.median(recent[active])
      slow = np.flatnonzero(active & (recent > threshold * med))
      if slow.size:
        worst = int(slow[np.argmax(recent[slow])])
        active[worst] = False
        removed_at[worst] = k + 1
  return Timeline(
    time=np.cumsum(step),
    gradients=np.arange(1, S + 1) * n,
    samples=float(n * setup.batch_per_worker),
    bytes_sent=sent,
    comm_s=comm,
    plan=np.ones((S, n), np.float32),  # the whole global batch is used every step
    info={"isolated": {str(w): k for w, k in removed_at.items()}},
  )


def _ps_timeline(
  setup: Setup, seed: int, staleness_bound: int | None, charged: bool = True
) -> Timeline:
  msg = ps_message_seconds(setup) if charged else 0.0
  U = setup.gradients
  s = async_sim.ps_schedule(
    compute_times(setup, seed),
    U,
    staleness_bound=staleness_bound,
    max_staleness=setup.max_staleness,
    push_s=msg,
    pull_s=msg,
    duplex=setup.duplex,
  )
  return Timeline(
    time=s.time,
    gradients=np.arange(1, U + 1),
    samples=float(setup.batch_per_worker),
    bytes_sent=2.0 * model_bytes(setup) * (U + s.dropped),
    comm_s=(2.0 if not setup.duplex else 1.0) * msg * (U + s.dropped),
    plan=s,
    info={
      "staleness_mean": float(s.staleness.mean()),
      "staleness_p95": float(np.percentile(s.staleness, 95)),
      "staleness_max": int(s.staleness.max()),
      "dropped": int(s.dropped),
      "message_s": msg,
    },
  )


# ------------------------------------------------------------------ training along a timeline


_compiled: dict[Any, Any] = {}


def run_sync_curve(setup: Setup, workload: Workload, timeline: Timeline, seed: int) -> Curve:
  """Synchronous data-parallel training on the emulated devices along ``timeline.plan``
  (an f32[S, N] mask of the gradients kept), with the workload's sync learning rate."""

  n = setup.workers
  mask = np.asarray(timeline.plan, np.float32)
  graphdef, params, rest = models.split(workload.make_model(seed))
  lr = workload.sync_lr(n)
  key = ("sync", workload.name, n, setup.algorithm, lr)
  if key not in _compiled:
    mesh, axis = devices.mesh_for(setup.algorithm, n)
    tx = workload.tx(lr)
    chunk = sync.make_sync_chunk(graphdef, rest, tx, mesh, setup.algorithm, axis=axis, masked=True)
    _compiled[key] = (mesh, axis, tx, chunk, sync.make_evaluator(graphdef, rest, workload.metric))
  return train_curve(setup, workload, seed, (graphdef, params, rest), _compiled[key],
                     setup.algorithm, mask.shape[0], mask=mask)  # fmt: skip


def train_curve(setup, workload, seed, model, compiled, algorithm, steps, mask=None) -> Curve:
  """``steps`` updates of :func:`.sync.train_sync` from ``model`` = (graphdef, params,
  rest) with ``compiled`` = (mesh, axis, tx, chunk, evaluate), on the seed's batches
  (``mask``: the gradients kept per step, None for all), as a :class:`Curve`."""
  mesh, axis, tx, chunk, evaluate = compiled
  n, d = setup.workers, workload.data
  idx = data_mod.batch_indices(d.n_train, n * setup.batch_per_worker, steps, 1000 + seed)
  res = sync.train_sync(
    *model, tx, d, idx, mesh=mesh, axis=axis, algorithm=algorithm, mask=mask,
    eval_every=setup.eval_every, chunk_fn=chunk, evaluate=evaluate,
  )  # fmt: skip
  return Curve(
    eval_updates=res.eval_steps,
    metric=res.test_acc,
    diverged=bool(not np.isfinite(res.losses).all()),
    final_loss=final_loss(res.losses[-setup.eval_every :]),
    info={"replicas_identical": res.replicas_identical},
  )


def run_ps_curve(
  setup: Setup, workload: Workload, timeline: Timeline, seed: int, method: str = "async"
) -> Curve:
  """Replays the parameter-server schedule ``timeline.plan`` (stale gradients from a
  ring buffer of snapshots, :func:`.async_sim.make_replay`) with ``method``."""

  d = workload.data
  sched = timeline.plan
  K = setup.max_staleness + 1
  graphdef, params, rest = models.split(workload.make_model(seed))
  key = ("ps", workload.name, K, workload.lr)
  if key not in _compiled:
    tx = workload.tx(workload.lr)
    _compiled[key] = (
      tx,
      async_sim.make_replay(graphdef, rest, tx, K),
      sync.make_evaluator(graphdef, rest, workload.metric),
    )
  tx, replay, evaluate = _compiled[key]
  T = len(sched.staleness)
  idx = data_mod.batch_indices(d.n_train, setup.batch_per_worker, T, 1000 + seed)
  res = async_sim.run_async(
    replay,
    params,
    tx,
    d,
    sched,
    idx,
    buffer_size=K,
    method=method,
    chunk=setup.eval_every * setup.workers,
    evaluate=evaluate,
  )
  return Curve(
    eval_updates=res.eval_updates,
    metric=res.test_acc,
    diverged=res.diverged,
    final_loss=final_loss(res.losses[-setup.eval_every * setup.workers :]),
  )


# ------------------------------------------------------------------ the arms


def _sync_bytes(setup: Setup, backups: int = 0) -> float:
  return allreduce_bytes(setup) / ((setup.workers - backups) * setup.batch_per_worker)


def _ps_bytes(setup: Setup) -> float:
  return 2.0 * model_bytes(setup) / setup.batch_per_worker


def sync_arm(backups: int = 0, time_unit_us: float = 0.0) -> Arm:
  """Synchronous all-reduce SGD with ``backups`` backup workers (Chen et al. 2016:
  each step keeps the fastest N - b gradients of a fixed pool of N).

  ``time_unit_us`` > 0 (Table B): the timeline counts time in mean gradient
  computations of that many µs (the setup's ``compute_s`` is 1) and prices the
  all-reduce with the cost model's defaults (:func:`~.arms.allreduce_us`) in them."""
  name = "sync" if backups == 0 else f"sync_b{backups}"

  def schedule(setup: Setup, seed: int) -> Timeline:
    if not 0 <= backups < setup.workers:
      raise ValueError(f"arm {name}: backups must be in 0..{setup.workers - 1}.")
    return sync_timeline(setup, seed, backups, time_unit_us=time_unit_us)

  def comm(setup: Setup) -> float:
    return allreduce_us(setup) / time_unit_us if time_unit_us else allreduce_seconds(setup)

  return Arm(
    name,
    "sync",
    schedule,
    comm,
    lambda setup: _sync_bytes(setup, backups),
    run_sync_curve,
    "all-reduce SGD" + (f", {backups} backup worker(s)" if backups else ", equal batches"),
  )


def overlapped_sync_arm(backups: int = 0) -> Arm:
  """:func:`sync_arm` with each step's gradient all-reduce overlapped with its backward
  pass, bucket by bucket (:func:`allreduce_jax.overlap.value_and_grad`): the same updates
  bit for bit (the same mask and run), priced by :func:`overlapped_sync_timeline`; the
  bytes are sync's (the buckets carry the same gradient)."""
  base = sync_arm(backups)

  def comm(setup: Setup) -> float:  # the exposed part of a step of one mean gradient
    exposed = exposed_seconds(setup, np.array([setup.compute_s]), overlap_buckets(setup))[0]
    return min(float(exposed), allreduce_seconds(setup))

  return dataclasses.replace(
    base,
    name=f"{base.name}_ov",
    make_schedule=lambda setup, seed: overlapped_sync_timeline(setup, seed, backups),
    comm_seconds=comm,
    summary=base.summary + ", all-reduce overlapped with the backward pass",
  )


def balanced_arm() -> Arm:
  """Sync with batch sizes ∝ worker speed (the global batch, hence the training, is
  the same as ``sync``'s; only the step time changes)."""
  return Arm(
    "sync_balanced",
    "sync",
    _balanced_timeline,
    allreduce_seconds,
    _sync_bytes,
    run_sync_curve,
    "all-reduce SGD, batch per worker ∝ its speed",
  )


def isolate_arm(threshold: float = 2.0) -> Arm:
  """Sync with slow-node isolation (``threshold ×`` the median running mean)."""
  return Arm(
    "sync_isolate",
    "sync",
    lambda setup, seed: _isolate_timeline(setup, seed, threshold),
    allreduce_seconds,
    _sync_bytes,
    run_sync_curve,
    f"all-reduce SGD, a worker > {threshold:g}× the median is isolated, its data redistributed",
  )


def ps_arm(
  method: str = "async", staleness_bound: int | None = None, name: str = "", charged: bool = True
) -> Arm:
  """A parameter-server arm: ``method`` in ``async_sim.ASYNC_METHODS`` on the SSP
  schedule with ``staleness_bound`` (``None``: fully asynchronous). ``charged=False``:
  no communication is charged (pushes and pulls take no time: Table B's event
  schedule, :func:`.async_sim.event_schedule`)."""
  name = name or (method if staleness_bound is None else f"ssp{staleness_bound}")
  bound = "" if staleness_bound is None else f", SSP s={staleness_bound}"
  return Arm(
    name,
    "ps",
    lambda setup, seed: _ps_timeline(setup, seed, staleness_bound, charged),
    ps_message_seconds if charged else (lambda setup: 0.0),
    _ps_bytes,
    lambda setup, wl, tl, seed: run_ps_curve(setup, wl, tl, seed, method),
    f"parameter server, {method}{bound}" + ("" if charged else ", communication free"),
  )
