"""Training arms as records: one interface for sync, backups, async, SSP, and the rest.

An :class:`Arm` is one way of training N data-parallel workers. Every arm answers
the same four questions, so a sweep loops over arms without branching on names
(optax's ``GradientTransformation`` is the model: many methods, one shape):

* ``make_schedule(setup, seed) -> Timeline``: when each update is applied, in
  simulated seconds, compute (the straggler model) plus communication priced by
  the cost model, and what the training replays (a mask, a staleness schedule...);
* ``comm_seconds(setup) -> float``: the time of one communication event (one
  all-reduce, one push or pull through the server's link, one neighbour exchange);
* ``bytes_per_sample(setup) -> float``: bytes all workers send per training sample;
* ``run(setup, workload, timeline, seed) -> Curve``: trains the workload along the
  timeline and returns the metric after every ``eval_every`` rounds.

The time model (one for every arm). A worker's k-th gradient takes
``compute_s × scale_i × x`` seconds, ``x`` drawn from the compute model (mean 1,
:class:`~.async_sim.ComputeTimes`), ``scale_i`` = its batch share over its speed.
Messages are priced by :mod:`allreduce_jax.cost_model` on a network preset
(``cost_model.PRESETS``) for ``model_params × bytes_per_param`` bytes, the model's
real size or a larger *virtual* one:

* sync all-reduce: the step ends when the kept workers are done, plus
  ``cost_model.predict_seconds(algorithm, p, bytes)``;
* parameter server: every gradient is pushed and the parameters pulled through the
  server's link, one message at a time (a FIFO queue; :func:`.async_sim.ps_schedule`),
  ``α + β·bytes/S`` each with S server shards;
* gossip: one neighbour exchange per step; Local SGD / DiLoCo: one all-reduce every
  H steps;
* compressed sync (:mod:`.compressed`): the collectives of what is sent instead (an
  all-reduce in bf16/int8, PowerSGD's two small all-reduces, top-k's all-gather).

This module is the interface: the setup, the records (:class:`Timeline`,
:class:`Curve`, :class:`Workload`, :class:`Arm`), the registries and :func:`run_arm`.
The families are :mod:`.families` (sync, backups, balanced, isolation, parameter
server), :mod:`.local` (Local SGD, DiLoCo), :mod:`.gossip` and :mod:`.compressed`
(sync through a compressed all-reduce: bf16/int8 wire, PowerSGD, top-k); :mod:`.catalogue`
registers them all. :func:`register` adds one arm.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from allreduce_jax import ALGORITHMS, cost_model, devices
from allreduce_jax.training import async_sim, models

# ------------------------------------------------------------------ the setup every arm reads


@dataclass(frozen=True)
class Setup:
  """What every arm is priced and scheduled on (the config classes extend it).

  Attributes:
    workers: N data-parallel workers.
    batch_per_worker: samples per worker per gradient (B); a sync step uses N·B.
    gradients: the budget: per-worker gradients computed in all (sync: steps × N).
    compute: compute-time model, e.g. ``lognormal:0.5`` (see ``async_sim``).
    speeds: relative worker speeds, comma-separated (empty: all 1); 1,1,1,1,1,1,1,0.25 is
      eight workers, one of them 4× slower.
    compute_s: seconds of one mean gradient computation on B samples at speed 1.
    network: a link preset: 10gbe, 100gbe, ib_ndr, nvlink4, tpu_v5e_ici or default
      (latency and bandwidth in ``cost_model.PRESETS``).
    bandwidth_GBps: overrides the preset's link bandwidth, per direction (held in GB/s).
    algorithm: the all-reduce algorithm of the sync arms (a key of ``ALGORITHMS``).
    model_params: parameters priced (0: the workload's real count).
    bytes_per_param: 4 (float32 gradients and parameters).
    server_shards: S parameter-server shards, each with its own link.
    duplex: whether the server's link carries pushes and pulls at once.
    max_staleness: asynchronous gradients staler than this are dropped.
    eval_every: sync rounds (N gradients) between evaluations.
  """

  workers: int = 8
  batch_per_worker: int = 16
  gradients: int = 1600
  compute: str = "lognormal:0.5"
  speeds: tuple[float, ...] = ()
  compute_s: float = 0.025
  network: str = "100gbe"
  bandwidth_GBps: float | None = None
  algorithm: str = "ring"
  model_params: int = 0
  bytes_per_param: int = 4
  server_shards: int = 1
  duplex: bool = True
  max_staleness: int = 64
  eval_every: int = 10

  def check(self) -> None:
    """Raises ``ValueError`` naming the first bad field."""

    def need(ok: bool, name: str, expected: str) -> None:
      if not ok:
        raise ValueError(f"{name}={getattr(self, name)!r} is invalid: expected {expected}.")

    need(self.workers >= 1, "workers", "an integer >= 1")
    need(self.batch_per_worker >= 1, "batch_per_worker", "an integer >= 1")
    need(self.gradients >= self.workers, "gradients", "at least `workers`")
    async_sim.parse_compute_model(self.compute)
    need(
      not self.speeds or (len(self.speeds) == self.workers and min(self.speeds) > 0),
      "speeds",
      f"empty or {self.workers} positive numbers",
    )
    need(self.compute_s > 0, "compute_s", "a number > 0")
    need(self.network in cost_model.PRESETS, "network", f"one of {sorted(cost_model.PRESETS)}")
    need(self.bandwidth_GBps is None or self.bandwidth_GBps > 0, "bandwidth_GBps", "None or > 0")
    need(self.algorithm in ALGORITHMS, "algorithm", f"one of {sorted(ALGORITHMS)}")
    need(self.model_params >= 0, "model_params", "an integer >= 0")
    need(self.bytes_per_param >= 1, "bytes_per_param", "an integer >= 1")
    need(self.server_shards >= 1, "server_shards", "an integer >= 1")
    need(self.max_staleness >= 1, "max_staleness", "an integer >= 1")
    need(self.eval_every >= 1, "eval_every", "an integer >= 1")


def setup_of(cfg: Any, **overrides) -> Setup:
  """The :class:`Setup` fields of ``cfg`` (any config that extends it), with overrides."""
  names = {f.name for f in dataclasses.fields(Setup)}
  return Setup(**{**{k: v for k, v in dataclasses.asdict(cfg).items() if k in names}, **overrides})


def link(setup: Setup) -> cost_model.Params:
  """The α-β-γ parameters of the setup's network (preset, bandwidth override)."""
  p = cost_model.PRESETS[setup.network]
  if setup.bandwidth_GBps is not None:
    p = dataclasses.replace(p, beta=1.0 / (setup.bandwidth_GBps * 1e9))
  return p


def model_bytes(setup: Setup) -> float:
  """Bytes of one copy of the parameters (or of one gradient) as priced."""
  if setup.model_params < 1:
    raise ValueError("model_params is 0: the harness fills in the workload's parameter count.")
  return float(setup.model_params * setup.bytes_per_param)


def speeds(setup: Setup) -> np.ndarray:
  """f64[N] relative speeds (all 1 by default)."""
  return np.asarray(setup.speeds or (1.0,) * setup.workers, np.float64)


def allreduce_seconds(setup: Setup, p: int | None = None) -> float:
  """One all-reduce of the parameters over ``p`` (default N) workers, in seconds."""
  p = setup.workers if p is None else p
  if p <= 1:
    return 0.0
  inner = devices.inner_size(setup.algorithm, p)
  return cost_model.predict_seconds(setup.algorithm, p, model_bytes(setup), link(setup), inner)


def allreduce_us(setup: Setup, p: int | None = None) -> float:
  """One all-reduce of the parameters over ``p`` (default N) workers priced with the
  cost model's documented defaults (``cost_model.predict_us``, ``DEFAULT_PARAMS``), in
  µs: Table B's clock, which counts time in mean gradient computations; 0 for p <= 1."""
  p = setup.workers if p is None else p
  if p <= 1:
    return 0.0
  inner = devices.inner_size(setup.algorithm, p)
  return float(cost_model.predict_us(setup.algorithm, p, model_bytes(setup), inner=inner))


def allreduce_bytes(setup: Setup, p: int | None = None) -> float:
  """Bytes all ``p`` participants send in one all-reduce (p × the busiest sender's)."""
  p = setup.workers if p is None else p
  if p <= 1:
    return 0.0
  inner = devices.inner_size(setup.algorithm, p)
  return p * cost_model.schedule(setup.algorithm, p, model_bytes(setup), inner).max_sent_bytes


def ps_message_seconds(setup: Setup) -> float:
  """One push (or pull) through one server shard's link: ``α + β·bytes/S``."""
  q = link(setup)
  return q.alpha + q.beta * model_bytes(setup) / setup.server_shards


# ------------------------------------------------------------------ records


@dataclass(frozen=True)
class Timeline:
  """When an arm's updates happen and what its training replays.

  Attributes:
    time: f64[U] simulated seconds at which update u (0-based) is applied.
    gradients: i64[U] cumulative per-worker gradients *computed* by update u.
    samples: float, training samples consumed per update (for bytes per sample).
    bytes_sent: float, bytes all workers send over the U updates.
    comm_s: float, communication seconds on the critical path over the U updates
      (sync arms; for the server it is the busiest link's busy time).
    plan: what ``run`` replays (a f32[U, N] mask, an ``AsyncSchedule``, ...).
    info: numbers for the result row (mean staleness, isolated workers, ...).
    step_time: f64[U] the length of each update's step (sync arms; None otherwise).
  """

  time: np.ndarray
  gradients: np.ndarray
  samples: float
  bytes_sent: float
  comm_s: float
  plan: Any = None
  info: dict[str, Any] = field(default_factory=dict)
  step_time: np.ndarray | None = None

  def time_at(self, update: int) -> float:
    """Simulated seconds when ``update`` updates (1-based count) have been applied."""
    return 0.0 if update <= 0 else float(self.time[update - 1])


@dataclass(frozen=True)
class Curve:
  """What training along a timeline produced: ``metric`` after ``eval_updates``
  updates (0 = initial), ``diverged`` (a non-finite loss), ``final_loss``."""

  eval_updates: list[int]
  metric: list[float]
  diverged: bool
  final_loss: float
  info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Workload:
  """A training task: data, model, optimizer and the target that counts as trained.

  Attributes:
    name: registry key (``digits_mlp``, ...).
    data: an object with ``x_train, y_train, x_test, y_test`` arrays and ``n_train``.
    make_model: ``seed -> nnx.Module`` mapping ``x`` batches to logits.
    metric: ``"accuracy"`` (higher is better) or ``"loss"`` (test loss, lower is better).
    target: the metric value that counts as reached.
    optimizer: ``models.make_optimizer`` name for every arm's per-gradient optimizer.
    lr: per-gradient learning rate (parameter-server arms; batch B).
    sync_lr_scale: ``"linear"`` (sync uses N·lr for its N·B batch, Goyal et al.) or
      ``"none"`` (the same lr, e.g. for Adam).
    momentum: for ``optimizer="momentum"``.
    fixed_sync_lr: the sync learning rate at every N (None: ``sync_lr_scale`` decides).
  """

  name: str
  data: Any
  make_model: Callable[[int], Any]
  metric: str = "accuracy"
  target: float = 0.95
  optimizer: str = "momentum"
  lr: float = 0.02
  sync_lr_scale: str = "linear"
  momentum: float = 0.9
  fixed_sync_lr: float | None = None

  def reached(self, value: float) -> bool:
    """Whether ``value`` meets the target."""
    if not math.isfinite(value):
      return False
    return value >= self.target if self.metric == "accuracy" else value <= self.target

  def sync_lr(self, n: int) -> float:
    if self.fixed_sync_lr is not None:
      return self.fixed_sync_lr
    return self.lr * n if self.sync_lr_scale == "linear" else self.lr

  def tx(self, lr: float):
    return models.make_optimizer(self.optimizer, lr, self.momentum)


@dataclass(frozen=True)
class Arm:
  """One training arm (see the module docstring for the interface).

  Attributes:
    name: unique label, also the row's ``arm`` field.
    family: ``"sync"``, ``"ps"``, ``"local"`` or ``"gossip"``: plot style only.
    make_schedule: ``(setup, seed) -> Timeline``.
    comm_seconds: ``setup -> seconds`` of one communication event.
    bytes_per_sample: ``setup -> bytes`` all workers send per training sample.
    run: ``(setup, workload, timeline, seed) -> Curve``.
    summary: one line for tables and ``--help``.
    bind: ``workload -> Arm``: the arm priced for that workload's parameter shapes
      (compressed arms: PowerSGD's and top-k's bytes depend on them); None: the
      arm's pricing needs only the setup. :func:`bound` applies it.
  """

  name: str
  family: str
  make_schedule: Callable[[Setup, int], Timeline]
  comm_seconds: Callable[[Setup], float]
  bytes_per_sample: Callable[[Setup], float]
  run: Callable[[Setup, Workload, Timeline, int], Curve]
  summary: str = ""
  bind: Callable[[Workload], Arm] | None = None


def bound(arm: Arm, workload: Workload) -> Arm:
  """``arm`` priced for ``workload`` (``arm.bind(workload)``; ``arm`` itself if it
  needs no binding)."""
  return arm if arm.bind is None else arm.bind(workload)


ARMS: dict[str, Arm] = {}
WORKLOADS: dict[str, Callable[[bool], Workload]] = {}


def register(arm: Arm) -> Arm:
  """Adds ``arm`` to :data:`ARMS` (replacing one of the same name) and returns it."""
  ARMS[arm.name] = arm
  return arm


def register_workload(name: str, build: Callable[[bool], Workload]) -> None:
  """Adds a workload builder ``build(smoke) -> Workload`` (a function object) to
  :data:`WORKLOADS`."""
  WORKLOADS[name] = build


#: prefix -> ``make(k)``: the arm families :func:`get_arm` builds on demand.
_FAMILIES: dict[str, Callable[[int], Arm]] = {}


def register_family(prefix: str, make: Callable[[int], Arm]) -> None:
  """Arms named ``{prefix}{k}`` (k an int) are built on demand by ``make(k)``
  (:func:`get_arm`); the first family registered for a prefix is kept."""
  _FAMILIES.setdefault(prefix, make)


def get_arm(name: str) -> Arm:
  """The registered arm ``name``; ``ssp{s}`` and ``sync_b{b}`` are built on demand."""
  if name not in ARMS:
    for prefix, make in _FAMILIES.items():
      rest = name[len(prefix) :]
      if name.startswith(prefix) and rest.isdigit():
        return register(make(int(rest)))
    raise ValueError(f"arm={name!r} is not registered; expected one of {sorted(ARMS)}.")
  return ARMS[name]


def get_workload(name: str, smoke: bool = False) -> Workload:
  if name not in WORKLOADS:
    raise ValueError(f"workload={name!r} is not registered; expected one of {sorted(WORKLOADS)}.")
  return WORKLOADS[name](smoke)


# ------------------------------------------------------------------ schedules


def sync_rounds(setup: Setup) -> int:
  """Sync steps in the budget: ``gradients // N``."""
  return max(1, setup.gradients // setup.workers)


def compute_times(
  setup: Setup, seed: int, work: np.ndarray | None = None
) -> async_sim.ComputeTimes:
  scale = setup.compute_s / speeds(setup)
  if work is not None:
    scale = scale * work
  return async_sim.ComputeTimes(setup.compute, setup.workers, 2000 + seed, scale=scale)


# ------------------------------------------------------------------ training along a timeline


def param_count(params: Any) -> int:
  return int(sum(np.size(a) for a in jax.tree.leaves(params)))


def final_loss(losses) -> float:
  """Mean of the finite losses of the last window; NaN when the run diverged."""
  finite = np.asarray(losses, np.float64)
  finite = finite[np.isfinite(finite)]
  return float(finite.mean()) if finite.size else float("nan")


def periodic_curve(res, workload: Workload, tail: int, **info) -> Curve:
  """The :class:`Curve` of a :class:`~allreduce_jax.training.local.PeriodicResult`
  (Local SGD, DiLoCo, gossip): the workload's test metric at each evaluation, the mean
  finite training loss over the last ``tail`` steps, ``info`` plus the final test loss."""
  return Curve(
    eval_updates=res.eval_steps,
    metric=res.test_acc if workload.metric == "accuracy" else res.test_loss,
    diverged=res.diverged,
    final_loss=final_loss(res.losses[-tail:]),
    info={**info, "final_test_loss": res.final_test_loss},
  )


# ------------------------------------------------------------------ one run -> one row


def plan_digest(plan: Any) -> str:
  """A digest of what training replays (arrays and fields of ``plan``, without the
  event times), so two timelines that train identically share one curve."""
  h = hashlib.sha256()

  def feed(x: Any) -> None:
    if isinstance(x, np.ndarray):
      h.update(str((x.dtype, x.shape)).encode())
      h.update(np.ascontiguousarray(x).tobytes())
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
      for f in dataclasses.fields(x):
        if f.name != "time":
          h.update(f.name.encode())
          feed(getattr(x, f.name))
    else:
      h.update(repr(x).encode())

  feed(plan)
  return h.hexdigest()


def with_real_size(setup: Setup, workload: Workload, seed: int = 0) -> Setup:
  """``setup`` with ``model_params`` set to the workload model's count if it is 0."""
  if setup.model_params:
    return setup
  _, params, _ = models.split(workload.make_model(seed))
  return dataclasses.replace(setup, model_params=param_count(params))


def run_arm(
  arm: Arm,
  setup: Setup,
  workload: Workload,
  seed: int,
  curves: dict[Any, Curve] | None = None,
) -> dict[str, Any]:
  """Schedules and trains ``arm`` once; returns the result row (without key/env).

  ``setup.model_params = 0`` is replaced by the workload model's real count.
  Time to target: the simulated seconds at the first evaluation that meets the
  workload's target (None if never). ``curves``: a cache of trained curves keyed
  by (arm, workload, seed, :func:`plan_digest`): a timeline that replays the same
  training as an earlier one (e.g. a sync mask at another bandwidth) reuses it.
  """
  setup = with_real_size(setup, workload, seed)
  setup.check()
  arm = bound(arm, workload)
  tl = arm.make_schedule(setup, seed)
  key = (arm.name, workload.name, seed, setup.eval_every, plan_digest(tl.plan))
  curve = None if curves is None else curves.get(key)
  if curve is None:
    curve = arm.run(setup, workload, tl, seed)
    if curves is not None:
      curves[key] = curve
  times = [tl.time_at(u) for u in curve.eval_updates]
  hit = next((i for i, m in enumerate(curve.metric) if workload.reached(m)), None)
  return {
    "arm": arm.name,
    "family": arm.family,
    "workload": workload.name,
    "metric": workload.metric,
    "target": workload.target,
    "seed": seed,
    "model_params": setup.model_params,
    "final_metric": curve.metric[-1],
    "best_metric": (max if workload.metric == "accuracy" else min)(curve.metric),
    "eval_updates": curve.eval_updates,
    "eval_gradients": [int(tl.gradients[u - 1]) if u else 0 for u in curve.eval_updates],
    "eval_time": times,
    "test_metric": curve.metric,
    "updates_to_target": None if hit is None else curve.eval_updates[hit],
    "time_to_target": None if hit is None else times[hit],
    "total_time": float(tl.time[-1]),
    "comm_s": tl.comm_s,
    "comm_event_s": arm.comm_seconds(setup),
    "bytes_per_sample": arm.bytes_per_sample(setup),
    "bytes_per_sample_measured": tl.bytes_sent / (len(tl.time) * tl.samples),
    "diverged": curve.diverged,
    "final_loss": curve.final_loss,
    **{k: v for k, v in tl.info.items()},
    **curve.info,
  }
