"""Simulated asynchronous SGD on stale gradients, and the straggler schedules.

Parameter-server-style asynchrony: worker ``i`` reads the parameters (version
``v``), computes a gradient for a random compute time, and the server applies it
as soon as it arrives, at version ``v + τ``: τ (the staleness) is the number of
updates applied in between. ``w_{t+1} = w_t - η · g(w_{t-τ_t})``.

The schedule (which worker finishes when, with which staleness) does not depend on
the parameters, so it is built first in NumPy (:func:`event_schedule`,
:func:`fixed_tau_schedule`, :func:`sync_schedule`) and then replayed by one jitted
step over a ring buffer of the last ``K`` parameter snapshots (:func:`make_replay`):
the gradient is evaluated at snapshot ``t - τ_t`` and applied to the current
parameters. The method (plain, staleness-aware η/τ, DC-ASGD-a) is a traced argument,
so one compiled program serves every method, staleness and seed of a sweep.

Compute times have mean 1 (the unit of simulated time is one mean gradient
computation). Gradients older than the buffer (τ > K - 1) are dropped, as in
Ringmaster ASGD; the schedule counts them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from allreduce_jax.training import models

#: Per-worker compute-time models, all with mean 1. A model may carry a parameter
#: after a colon: ``lognormal:1.0`` (σ), ``pareto:1.2`` (α > 1), ``slow:8`` (factor).
COMPUTE_MODELS = ("constant", "exponential", "lognormal", "pareto", "slow")

#: Methods of the async replay: the gradient transform applied before the optimizer.
ASYNC_METHODS = ("async", "async_eta_tau", "dcasgd")

#: DC-ASGD's adaptive λ (DC-ASGD-a, Zheng et al. 2017): λ_t = λ0 / sqrt(MS_t + ε) per
#: element, MS_t = m·MS_{t-1} + (1 - m)·g_t² a running mean square of the gradients, so
#: the correction λ_t·g⊙g⊙Δw ≈ λ0·|g|⊙Δw follows the gradient's own scale. λ0 = 2 and
#: m = 0.95 are the defaults of an open implementation; ε is Multiverso's. (A constant
#: λ must be tuned to the gradient's scale and the staleness: on the digits MLP at τ = 8
#: MXNet's 0.04 changed nothing (Table C's dcasgd rows equalled plain async's), λ = 16
#: (its batch) helped at τ = 8 and diverged at τ = 16; DC-ASGD-a helped at both,
#: ``notebooks/07_sync_vs_async.py``.)
DC_LAMBDA0 = 2.0
DC_DECAY = 0.95
DC_EPS = 1e-7

_DEFAULT_PARAM = {"lognormal": 0.5, "pareto": 1.5, "slow": 4.0}


def parse_compute_model(spec: str) -> tuple[str, float | None]:
  """``"lognormal:1.0"`` -> ``("lognormal", 1.0)``; ``"exponential"`` -> ``("exponential", None)``.

  Example:
    >>> parse_compute_model("pareto:1.2"), parse_compute_model("lognormal")
    (('pareto', 1.2), ('lognormal', 0.5))
  """
  name, _, arg = str(spec).partition(":")
  if name not in COMPUTE_MODELS:
    raise ValueError(
      f"compute model {spec!r} is not supported; expected one of {COMPUTE_MODELS}"
      " (optionally with a parameter, e.g. lognormal:1.0)."
    )
  if not arg:
    return name, _DEFAULT_PARAM.get(name)
  if name not in _DEFAULT_PARAM:
    raise ValueError(f"compute model {spec!r}: {name} takes no parameter.")
  try:
    value = float(arg)
  except ValueError:
    raise ValueError(f"compute model {spec!r}: the parameter must be a number.") from None
  ok = {"lognormal": value >= 0, "pareto": value > 1, "slow": value >= 1}[name]
  if not ok:
    raise ValueError(
      f"compute model {spec!r}: expected σ >= 0 (lognormal), α > 1 (pareto), factor >= 1 (slow)."
    )
  return name, value


def draw_compute_times(model: str, rng: np.random.Generator, workers: np.ndarray) -> np.ndarray:
  """One compute time per entry of ``workers`` (i32[...] worker ids), mean 1.

  * ``constant``: 1.
  * ``exponential``: Exp(mean 1).
  * ``lognormal[:σ]``: LogNormal(μ=-σ²/2, σ), σ = 0.5 by default.
  * ``pareto[:α]``: Pareto with shape α (1.5 by default) and x_min = (α-1)/α
    (α <= 2: infinite variance).
  * ``slow[:k]``: worker 0 takes k (4) times as long; all times are jittered by
    U(0.9, 1.1). Its mean is not 1 (it is (N+k-1)/N); the others' is.

  Example:
    >>> t = draw_compute_times("exponential", np.random.default_rng(0), np.zeros(100_000, int))
    >>> bool(abs(t.mean() - 1) < 0.02)
    True
  """
  name, param = parse_compute_model(model)
  workers = np.asarray(workers)
  shape = workers.shape
  if name == "constant":
    return np.ones(shape)
  if name == "exponential":
    return rng.exponential(1.0, shape)
  if name == "lognormal":
    return rng.lognormal(-0.5 * param * param, param, shape)
  if name == "pareto":
    return (rng.pareto(param, shape) + 1.0) * ((param - 1.0) / param)
  return np.where(workers == 0, param, 1.0) * rng.uniform(0.9, 1.1, shape)


class ComputeTimes:
  """The compute times of N workers: ``times(i, k)`` is worker ``i``'s k-th gradient.

  Drawn row by row from one generator (row k = every worker's k-th time) and
  multiplied by a per-worker ``scale`` (seconds per mean gradient, slower workers
  or larger batches). The synchronous and the event-driven schedules read the same
  rows, so they see the same compute times for the same seed.

  Example:
    >>> c = ComputeTimes("constant", 2, seed=0, scale=(1.0, 3.0))
    >>> c(1, 5), c.rows(2).tolist()
    (3.0, [[1.0, 3.0], [1.0, 3.0]])
  """

  def __init__(self, model: str, n_workers: int, seed: int, scale=None, block: int = 256):
    parse_compute_model(model)
    if n_workers < 1:
      raise ValueError(f"n_workers must be >= 1, got {n_workers}.")
    self.model, self.n = model, n_workers
    self.scale = np.ones(n_workers) if scale is None else np.asarray(scale, np.float64)
    if self.scale.shape != (n_workers,) or not (self.scale >= 0).all():
      raise ValueError(f"scale must be {n_workers} numbers >= 0, got {scale!r}.")
    self._rng = np.random.default_rng(seed)
    self._block = block
    self._rows = np.zeros((0, n_workers))

  def _grow(self, k: int) -> None:
    while self._rows.shape[0] <= k:
      more = max(self._block, self._rows.shape[0])
      ids = np.broadcast_to(np.arange(self.n), (more, self.n))
      base = draw_compute_times(self.model, self._rng, ids)
      self._rows = np.concatenate([self._rows, base * self.scale])

  def rows(self, k: int) -> np.ndarray:
    """f64[k, N]: the first ``k`` rows."""
    if k > 0:
      self._grow(k - 1)
    return self._rows[:k]

  def __call__(self, i: int, k: int) -> float:
    self._grow(k)
    return float(self._rows[k, i])


@dataclass(frozen=True)
class AsyncSchedule:
  """An async replay schedule of ``T`` applied updates.

  ``staleness``: i32[T] (τ of update t); ``worker``: i32[T]; ``time``: f64[T] the
  simulated time at which update t is applied; ``dropped``: gradients discarded
  because they were staler than the buffer allows; ``read``: i32[T] the version
  the gradient was computed at (``t - staleness``); ``clock``: i32[T] the
  worker's iteration count of that gradient (0-based).
  """

  staleness: np.ndarray
  worker: np.ndarray
  time: np.ndarray
  dropped: int = 0
  read: np.ndarray | None = None
  clock: np.ndarray | None = None


def fixed_tau_schedule(tau: int, n_updates: int) -> AsyncSchedule:
  """Constant staleness τ: round-robin over ``τ + 1`` equally fast workers.

  The first τ updates have staleness ``t`` (every worker started from ``w_0``);
  afterwards every update is τ old. Time: unit compute, ``τ + 1`` workers.

  Example:
    >>> fixed_tau_schedule(2, 5).staleness.tolist()
    [0, 1, 2, 2, 2]
  """
  if tau < 0:
    raise ValueError(f"tau must be >= 0, got {tau}.")
  if n_updates < 1:
    raise ValueError(f"n_updates must be >= 1, got {n_updates}.")
  t = np.arange(n_updates)
  return AsyncSchedule(
    staleness=np.minimum(t, tau).astype(np.int32),
    worker=(t % (tau + 1)).astype(np.int32),
    time=(t // (tau + 1) + 1).astype(np.float64),
  )


def ps_schedule(
  times: ComputeTimes,
  n_updates: int,
  *,
  staleness_bound: int | None = None,
  max_staleness: int | None = None,
  push_s: float = 0.0,
  pull_s: float = 0.0,
  duplex: bool = True,
  outages: list[tuple[int, float, float]] | None = None,
) -> AsyncSchedule:
  """Event simulation of N workers around a parameter server, with bounded staleness.

  Each worker loops: pull the parameters (their version is the number of updates
  applied when the pull starts), compute a gradient (``times(i, k)``), push it;
  the server applies it the moment the push has arrived. Pushes and pulls cross
  the server's link one at a time in arrival order (a FIFO queue): a push takes
  ``push_s`` and a pull ``pull_s`` seconds on it. On a full-duplex link
  (``duplex=True``) pushes and pulls have a queue each; otherwise they share one.
  With S server shards, each holding 1/S of the parameters on its own link, every
  shard sees the same queue, so the caller passes ``α + β·M/S`` per message.

  SSP (Ho et al. 2013): a worker that has finished c iterations starts the next
  only if ``c - min_j c_j <= staleness_bound``; ``0`` is bulk-synchronous,
  ``None`` (∞) is plain asynchronous SGD. Gradients staler than
  ``max_staleness`` are dropped (not applied; the worker carries on).

  ``outages``: ``(worker, start, end)`` spans in which a worker is dead (killed, stopped
  or cut off): what it was computing or pushing is lost, the server goes on with the
  others, and at ``end`` (a replacement) it pulls the parameters and starts again. Not
  with ``staleness_bound`` (a dead worker would hold every other back).

  Closed forms (tested): with zero compute and one full-duplex link the server
  applies ``1 / max(push_s, pull_s)`` updates per second, ``1 / (push_s +
  pull_s)`` when the link is shared; with ``staleness_bound=0`` and no
  communication, the k-th round ends at the sync schedule's time of step k.

  Ties are broken by stage (an arriving push is applied, and its worker's next
  pull starts, before another worker's gradient finishing at the same instant is
  queued) and then by worker id.

  Returns:
    An :class:`AsyncSchedule` of ``n_updates`` applied updates.
  """
  if n_updates < 1:
    raise ValueError(f"n_updates must be >= 1, got {n_updates}.")
  if staleness_bound is not None and staleness_bound < 0:
    raise ValueError(f"staleness_bound must be >= 0 or None, got {staleness_bound}.")
  if push_s < 0 or pull_s < 0:
    raise ValueError(f"push_s and pull_s must be >= 0, got {push_s}, {pull_s}.")
  n = times.n
  if outages and staleness_bound is not None:
    raise ValueError("outages with a staleness_bound: a dead worker would hold the others back.")
  READY, APPLY, PULL, DOWN, UP = 0, 1, 2, 3, 4  # stages; a later one goes first at equal times
  free = {"in": 0.0, "out": 0.0}
  out_q = "out" if duplex else "in"
  heap: list = []
  version, dropped = 0, 0
  done_iters = np.zeros(n, np.int64)  # c_i: finished (pushed and applied) iterations
  read_v = np.zeros(n, np.int64)
  waiting: set[int] = set()
  stal = np.empty(n_updates, np.int32)
  who = np.empty(n_updates, np.int32)
  when = np.empty(n_updates, np.float64)
  read = np.empty(n_updates, np.int32)
  clock = np.empty(n_updates, np.int32)

  epoch = np.zeros(n, np.int64)  # bumped when a worker dies: its events in flight are void
  down = np.zeros(n, np.int64)  # outages under way per worker (they may overlap)

  def start_pull(i: int, now: float) -> None:
    begin = max(now, free[out_q])
    free[out_q] = begin + pull_s
    heapq.heappush(heap, (begin, -PULL, i, int(epoch[i])))

  for i, start, end in outages or ():
    heapq.heappush(heap, (start, -DOWN, i, -1))
    heapq.heappush(heap, (end, -UP, i, -1))

  def may_start(i: int) -> bool:
    return staleness_bound is None or done_iters[i] - done_iters.min() <= staleness_bound

  for i in range(n):
    start_pull(i, 0.0)
  while version < n_updates:
    if not heap:
      raise ValueError(f"every worker is dead for good after {version} updates.")
    now, stage, i, ep = heapq.heappop(heap)
    stage = -stage
    if stage == DOWN:  # what it computes or pushes is lost
      epoch[i] += 1
      down[i] += 1
      continue
    if stage == UP:  # a replacement: pulls and starts once its last outage is over
      down[i] -= 1
      if down[i] == 0:
        epoch[i] += 1
        start_pull(i, now)
      continue
    if ep != epoch[i]:
      continue
    if stage == PULL:  # parameters leave the server now: the worker computes on them
      read_v[i] = version
      heapq.heappush(heap, (now + pull_s + times(i, int(done_iters[i])), -READY, i, ep))
    elif stage == READY:  # gradient done: queue the push
      begin = max(now, free["in"])
      free["in"] = begin + push_s
      heapq.heappush(heap, (begin + push_s, -APPLY, i, ep))
    else:  # the push has arrived: apply it
      tau = version - int(read_v[i])
      if max_staleness is not None and tau > max_staleness:
        dropped += 1
      else:
        stal[version], who[version], when[version] = tau, i, now
        read[version], clock[version] = read_v[i], done_iters[i]
        version += 1
      done_iters[i] += 1
      for j in sorted(waiting | {i}):
        if may_start(j):
          waiting.discard(j)
          start_pull(j, now)
        else:
          waiting.add(j)
  return AsyncSchedule(
    staleness=stal, worker=who, time=when, dropped=dropped, read=read, clock=clock
  )


def event_schedule(
  model: str, n_workers: int, n_updates: int, seed: int, max_staleness: int | None = None
) -> AsyncSchedule:
  """Event-driven async schedule from per-worker compute times (no communication).

  All workers read ``w_0`` at time 0; whenever one finishes, its gradient is
  applied (unless staler than ``max_staleness``: dropped), and it reads the new
  parameters and starts again. Mean staleness in steady state is ``N - 1``.
  (:func:`ps_schedule` with unit-mean compute times and free communication.)

  Args:
    model: a key of :data:`COMPUTE_MODELS` (optionally ``name:param``).
    n_workers: N >= 1.
    n_updates: number of applied updates to schedule.
    seed: seed of the compute times (independent of data and init).
    max_staleness: drop gradients with τ above this (``None``: keep all).

  Returns:
    An :class:`AsyncSchedule`.

  Example:
    >>> s = event_schedule("exponential", 8, 20_000, seed=0)
    >>> bool(abs(s.staleness.mean() - 7) < 0.3)
    True
  """
  if n_workers < 1:
    raise ValueError(f"n_workers must be >= 1, got {n_workers}.")
  if n_updates < 1:
    raise ValueError(f"n_updates must be >= 1, got {n_updates}.")
  return ps_schedule(ComputeTimes(model, n_workers, seed), n_updates, max_staleness=max_staleness)


@dataclass(frozen=True)
class SyncSchedule:
  """A synchronous schedule of ``S`` steps over a fixed pool of N workers.

  ``mask``: f32[S, N], 1 for the ``N - b`` gradients kept (the fastest);
  ``step_time``: f64[S] = the (N - b)-th fastest compute time + all-reduce time;
  ``time``: f64[S] cumulative.
  """

  mask: np.ndarray
  step_time: np.ndarray
  time: np.ndarray


def sync_schedule(
  model: str,
  n_workers: int,
  n_steps: int,
  seed: int,
  backups: int = 0,
  allreduce_time: float = 0.0,
  times: ComputeTimes | None = None,
) -> SyncSchedule:
  """Sync steps with ``b = backups`` backup workers (the slowest ``b`` dropped).

  Convention: a fixed pool of N workers, each step waits for the fastest
  ``N - b`` ("K-sync" with K = N - b); for Exp(1) compute times
  ``E[step] = H_N - H_b``, so ``H_N`` with no backups.

  Args:
    model: a key of :data:`COMPUTE_MODELS` (ignored when ``times`` is given).
    n_workers: N.
    n_steps: S.
    seed: seed of the compute times (ignored when ``times`` is given).
    backups: b in ``0..N-1``.
    allreduce_time: modelled all-reduce time per step, in the unit of the times.
    times: the compute times (row k = step k); default ``ComputeTimes(model, N, seed)``.

  Example:
    >>> s = sync_schedule("constant", 4, 3, seed=0, backups=1, allreduce_time=0.5)
    >>> s.step_time.tolist(), s.mask.sum(axis=1).tolist()
    ([1.5, 1.5, 1.5], [3.0, 3.0, 3.0])
  """
  if n_workers < 1:
    raise ValueError(f"n_workers must be >= 1, got {n_workers}.")
  if not 0 <= backups < n_workers:
    raise ValueError(f"backups must be in 0..{n_workers - 1} (n_workers - 1), got {backups}.")
  if n_steps < 1:
    raise ValueError(f"n_steps must be >= 1, got {n_steps}.")
  if allreduce_time < 0:
    raise ValueError(f"allreduce_time must be >= 0, got {allreduce_time}.")
  times = times or ComputeTimes(model, n_workers, seed)
  if times.n != n_workers:
    raise ValueError(f"times has {times.n} workers, expected n_workers={n_workers}.")
  t = times.rows(n_steps)  # f64[S, N]
  order = np.argsort(t, axis=1, kind="stable")
  kept = order[:, : n_workers - backups]
  mask = np.zeros((n_steps, n_workers), np.float32)
  np.put_along_axis(mask, kept, 1.0, axis=1)
  step = np.take_along_axis(t, order[:, n_workers - backups - 1 : n_workers - backups], 1)[:, 0]
  step = step + allreduce_time
  return SyncSchedule(mask=mask, step_time=step, time=np.cumsum(step))


def harmonic(n: int) -> float:
  """``H_n = 1 + 1/2 + ... + 1/n`` (``H_0 = 0``)."""
  return float(sum(1.0 / k for k in range(1, n + 1)))


def make_replay(
  graphdef: Any, rest: Any, tx: optax.GradientTransformation, buffer_size: int
) -> Callable:
  """Builds the jitted replay of a chunk of async updates over a parameter ring buffer.

  The step, with ``K = buffer_size`` snapshots ``buf[v % K] = w_v``::

    w_read = buf[(t - τ_t) % K]
    g = ∇ loss(w_read; batch_t)
    ms = m · ms + (1 - m) · g ⊙ g                  # the gradients' running mean square
    g = g + λ0 / sqrt(ms + ε) ⊙ g ⊙ g ⊙ (w_t - w_read)   # DC-ASGD-a (λ0 = 0 for the others)
    g = g / max(τ_t, 1)                            # staleness-aware η/τ (if enabled)
    w_{t+1} = w_t + tx.update(g)                   # padding steps (valid = 0) change nothing
    buf[(t + 1) % K] = w_{t+1}

  Args:
    graphdef, rest: the model (from :func:`models.split`).
    tx: the optax optimizer (its state is the server's).
    buffer_size: K; staleness must stay below K.

  Returns:
    ``replay(state, x_all, y_all, tau, idx, valid, eta_tau, dc_lambda) -> (state,
    losses)``. ``state = (params, opt_state, buf, t, ms)`` (from :func:`init_state`);
    ``tau``: i32[C]; ``idx``: i32[C, B]; ``valid``: f32[C]; ``eta_tau``: f32 scalar
    (1: divide by max(τ, 1)); ``dc_lambda``: f32 scalar, DC-ASGD-a's λ0 (0: no
    correction); ``losses``: f32[C] loss at the stale parameters. One compile per
    (chunk length, batch size).
  """
  if buffer_size < 1:
    raise ValueError(f"buffer_size must be >= 1, got {buffer_size}.")
  K = buffer_size

  def step(carry, inp, x_all, y_all, eta_tau, dc_lambda):
    w, s, buf, t, ms = carry
    tau, ib, valid = inp
    read = jax.tree.map(lambda b: b[(t - tau) % K], buf)
    loss, g = jax.value_and_grad(lambda q: models.loss_fn(graphdef, q, rest, x_all[ib], y_all[ib]))(
      read
    )
    ms_new = jax.tree.map(lambda m, gi: DC_DECAY * m + (1 - DC_DECAY) * gi * gi, ms, g)
    g = jax.tree.map(
      lambda gi, wi, ri, m: gi + dc_lambda / jnp.sqrt(m + DC_EPS) * gi * gi * (wi - ri),
      g,
      w,
      read,
      ms_new,
    )
    scale = jnp.where(eta_tau > 0, 1.0 / jnp.maximum(tau, 1).astype(jnp.float32), 1.0)
    g = jax.tree.map(lambda gi: gi * scale, g)
    updates, s_new = tx.update(g, s, w)
    w_new = optax.apply_updates(w, updates)
    keep = valid > 0
    w = jax.tree.map(lambda a, b: jnp.where(keep, a, b), w_new, w)
    s = jax.tree.map(lambda a, b: jnp.where(keep, a, b), s_new, s)
    ms = jax.tree.map(lambda a, b: jnp.where(keep, a, b), ms_new, ms)
    t = t + keep.astype(jnp.int32)
    buf = jax.tree.map(lambda b, a: b.at[t % K].set(a), buf, w)
    return (w, s, buf, t, ms), loss

  @jax.jit
  def replay(state, x_all, y_all, tau, idx, valid, eta_tau, dc_lambda):
    body = lambda c, i: step(c, i, x_all, y_all, eta_tau, dc_lambda)  # noqa: E731
    return lax.scan(body, state, (tau, idx, valid))

  return replay


def init_state(params: Any, tx: optax.GradientTransformation, buffer_size: int) -> tuple:
  """``(params, opt_state, buf, t=0, ms=0)`` with every snapshot of ``buf`` equal to
  ``params`` and DC-ASGD-a's mean square of the gradients at zero."""
  buf = jax.tree.map(lambda a: jnp.broadcast_to(a, (buffer_size, *a.shape)), params)
  ms = jax.tree.map(jnp.zeros_like, params)
  return (params, tx.init(params), buf, jnp.zeros((), jnp.int32), ms)


@dataclass(frozen=True)
class AsyncResult:
  """What an async replay produced: ``losses`` f32[T]; test accuracy after
  ``eval_updates`` updates (0 = initial); ``diverged``: a non-finite loss was seen."""

  losses: np.ndarray
  eval_updates: list[int]
  test_acc: list[float]
  final_test_acc: float
  diverged: bool
  params: Any


def run_async(
  replay: Callable,
  params: Any,
  tx: optax.GradientTransformation,
  data,
  schedule: AsyncSchedule,
  idx: np.ndarray,
  *,
  buffer_size: int,
  method: str = "async",
  chunk: int = 50,
  evaluate: Callable[..., float],
) -> AsyncResult:
  """Replays ``schedule`` with ``replay`` (from :func:`make_replay`).

  Args:
    replay: the compiled replay (reuse it across runs: compiled once).
    params: initial parameters.
    tx: the optimizer ``replay`` was built with.
    data: a :class:`~allreduce_jax.training.data.Digits`.
    schedule: the async schedule (T updates).
    idx: i32[T, B] the batch of each update.
    buffer_size: the ``K`` of ``replay``.
    method: one of :data:`ASYNC_METHODS`.
    chunk: updates per call (fixed, the last chunk is padded, so one compile).
    evaluate: ``evaluate(params, x, y) -> accuracy``, called after each chunk.

  Returns:
    An :class:`AsyncResult`.
  """
  if method not in ASYNC_METHODS:
    raise ValueError(f"method={method!r} is not supported; expected one of {ASYNC_METHODS}.")
  tau_all = np.asarray(schedule.staleness, np.int32)
  T = tau_all.shape[0]
  if idx.shape[0] != T:
    raise ValueError(f"idx has {idx.shape[0]} batches for a schedule of {T} updates.")
  if tau_all.max(initial=0) >= buffer_size:
    raise ValueError(
      f"schedule staleness reaches {int(tau_all.max())} but buffer_size={buffer_size}"
      " keeps only staleness < buffer_size; drop stale gradients (max_staleness)."
    )
  if chunk < 1:
    raise ValueError(f"chunk must be >= 1, got {chunk}.")
  eta_tau = jnp.asarray(1.0 if method == "async_eta_tau" else 0.0, jnp.float32)
  dc = jnp.asarray(DC_LAMBDA0 if method == "dcasgd" else 0.0, jnp.float32)
  x_all, y_all = jnp.asarray(data.x_train), jnp.asarray(data.y_train)
  state = init_state(params, tx, buffer_size)
  eval_updates, test_acc, losses = [0], [evaluate(params, data.x_test, data.y_test)], []
  for start in range(0, T, chunk):
    n = min(chunk, T - start)
    pad = chunk - n
    tau = np.pad(tau_all[start : start + n], (0, pad))
    ib = np.pad(idx[start : start + n], ((0, pad), (0, 0)))
    valid = np.pad(np.ones(n, np.float32), (0, pad))
    state, chunk_losses = replay(
      state, x_all, y_all, jnp.asarray(tau), jnp.asarray(ib), jnp.asarray(valid), eta_tau, dc
    )
    losses.append(np.asarray(chunk_losses)[:n])
    eval_updates.append(start + n)
    test_acc.append(evaluate(state[0], data.x_test, data.y_test))
  losses = np.concatenate(losses)
  return AsyncResult(
    losses=losses,
    eval_updates=eval_updates,
    test_acc=test_acc,
    final_test_acc=test_acc[-1],
    diverged=bool(not np.isfinite(losses).all()),
    params=state[0],
  )
