"""Synchronous all-reduce against an asynchronous parameter server when workers die.

The claim this answers: all-reduce is fragile where a parameter server tolerates more.
With workers that *die* (killed, stopped, cut off), the two recover differently:

- **synchronous all-reduce** (multi-controller JAX cannot drop a process) stops every
  worker, restarts the job and resumes from the last checkpoint: its trajectory is the
  uninterrupted run's, bit for bit, and each failure costs the recovery time (detection,
  restart, join, compile, restore) plus the steps since that checkpoint, redone
  (:func:`sync_clock`);
- the **asynchronous parameter server** loses only the dead worker's gradient in flight
  and its pushes until a replacement joins, ``recovery_s`` later: the server goes on
  with the others (:func:`.async_sim.ps_schedule`'s ``outages``), at the price of stale
  gradients.

:func:`race` trains both on the same workload (the sync arm's learning rate scales with
its global batch, as in the sync-vs-async study) and puts each along its own clock under
one failure schedule: the time each reaches the target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from allreduce_jax import devices
from allreduce_jax.goodput import Failure
from allreduce_jax.training import async_sim, models, sync
from allreduce_jax.training import data as data_mod


def sync_clock(
  steps: int,
  failures: Sequence[Failure],
  step_s: float,
  recovery_s: float,
  checkpoint_every: int,
) -> np.ndarray:
  """f64[steps]: when each step (1..steps) is done for good, for a synchronous run of
  ``step_s`` seconds a step, checkpointed every ``checkpoint_every`` steps, that every
  failure sends back to its last checkpoint and holds still for ``recovery_s`` (a failure
  during a recovery starts it again).

  Example:
    >>> f = [Failure(2.5, "kill", 0)]
    >>> sync_clock(4, f, step_s=1.0, recovery_s=1.0, checkpoint_every=2).tolist()
    [1.0, 2.0, 4.5, 5.5]
  """
  done = np.full(steps, np.nan)
  at, t, ckpt = 0, 0.0, 0  # steps done, the clock, the last checkpoint
  pending = sorted(f.at for f in failures)
  k = 0
  while at < steps:
    while k < len(pending) and pending[k] < t:  # a failure while recovering restarts it
      t = max(t, pending[k] + recovery_s)
      k += 1
    fail = pending[k] if k < len(pending) else math.inf
    finish = t + (steps - at) * step_s
    if finish <= fail:
      done[at:] = t + step_s * np.arange(1, steps - at + 1)
      return done
    reached = at + int((fail - t) // step_s)
    done[at:reached] = t + step_s * np.arange(1, reached - at + 1)
    ckpt = reached // checkpoint_every * checkpoint_every
    at, t, k = max(ckpt, 0), fail + recovery_s, k + 1
    done[at:] = np.nan
  return done


def ps_outages(failures: Sequence[Failure], workers: int, recovery_s: float) -> list:
  """``(worker, start, end)`` for :func:`.async_sim.ps_schedule`: each failure's host is
  a dead worker until its replacement, ``recovery_s`` later."""
  return [(f.host % workers, f.at, f.at + recovery_s) for f in failures]


@dataclass(frozen=True)
class Race:
  """The clocks and the workload of :func:`race`.

  Attributes:
    workers: N, one per host.
    step_s: seconds per synchronous step (measured, the all-reduce included).
    compute_s: seconds per gradient of one worker (the parameter server's workers).
    message_s: seconds per push or pull through the server's link.
    recovery_s: seconds from a failure to the job (sync) or a replacement (PS) running.
    checkpoint_every: the sync run's steps between checkpoints.
    steps: synchronous steps trained (the PS applies ``workers`` times as many updates).
    eval_every: synchronous steps between test evaluations.
  """

  workers: int = 4
  step_s: float = 0.01
  compute_s: float = 0.008
  message_s: float = 0.0016
  recovery_s: float = 4.0
  checkpoint_every: int = 100
  steps: int = 600
  eval_every: int = 10


def _first(xs: Sequence[int], values: Sequence[float], target: float) -> int | None:
  return next((x for x, v in zip(xs, values) if v >= target), None)


def race(workload, failures: Sequence[Failure], clocks: Race, seed: int = 0) -> dict:
  """Time to ``workload.target`` for synchronous all-reduce and for the asynchronous
  parameter server under ``failures`` (and, for reference, without them).

  Returns a row: each arm's updates and seconds to the target (None: not reached within
  ``clocks.steps``), the failures that struck before it, and the PS's mean staleness.
  """
  n, d = clocks.workers, workload.data
  graphdef, params, rest = models.split(workload.make_model(seed))
  evaluate = sync.make_evaluator(graphdef, rest, workload.metric)
  # synchronous: the uninterrupted trajectory, then its clock under the failures
  mesh, axis = devices.mesh_for("ring", n)
  batch = n * 16
  idx = data_mod.batch_indices(d.n_train, batch, clocks.steps, 1000 + seed)
  res = sync.train_sync(graphdef, params, rest, workload.tx(workload.sync_lr(n)), d, idx,
                        mesh=mesh, axis=axis, eval_every=clocks.eval_every, evaluate=evaluate)  # fmt: skip
  s_hit = _first(res.eval_steps, res.test_acc, workload.target)
  healthy = sync_clock(clocks.steps, [], clocks.step_s, clocks.recovery_s, clocks.checkpoint_every)
  clock = sync_clock(
    clocks.steps, failures, clocks.step_s, clocks.recovery_s, clocks.checkpoint_every
  )
  # asynchronous: the schedule with the dead workers' pushes gone, replayed
  U = n * clocks.steps

  def ps(outages):
    times = async_sim.ComputeTimes("constant", n, seed, scale=[clocks.compute_s] * n)
    plan = async_sim.ps_schedule(times, U, push_s=clocks.message_s, pull_s=clocks.message_s,
                                 outages=outages)  # fmt: skip
    K = int(plan.staleness.max()) + 1
    tx = workload.tx(workload.lr)
    replay = async_sim.make_replay(graphdef, rest, tx, K)
    ib = data_mod.batch_indices(d.n_train, 16, U, 1000 + seed)
    out = async_sim.run_async(replay, params, tx, d, plan, ib, buffer_size=K,
                              chunk=clocks.eval_every * n, evaluate=evaluate)  # fmt: skip
    hit = _first(out.eval_updates, out.test_acc, workload.target)
    return plan, hit, (float(plan.time[hit - 1]) if hit else None)

  plan, p_hit, p_time = ps(ps_outages(failures, n, clocks.recovery_s))
  _, _, p_healthy = ps(None)
  s_time = float(clock[s_hit - 1]) if s_hit and s_hit <= clocks.steps else None
  before = lambda t: None if t is None else sum(f.at < t for f in failures)  # noqa: E731
  return {
    "target": workload.target,
    "sync_steps": s_hit,
    "sync_s": s_time,
    "sync_healthy_s": float(healthy[s_hit - 1]) if s_hit else None,
    "sync_failures": before(s_time),
    "ps_updates": p_hit,
    "ps_s": p_time,
    "ps_healthy_s": p_healthy,
    "ps_failures": before(p_time),
    "ps_staleness_mean": float(plan.staleness.mean()),
    "clocks": {k: getattr(clocks, k) for k in clocks.__dataclass_fields__},
  }
