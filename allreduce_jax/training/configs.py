"""The frozen configs of every training experiment, one dataclass per mode.

``allreduce-jax train <mode>`` generates one option per field (``--field-name``) with
the default shown in ``--help``; ``<Config>.smoke()`` is the seconds-long preset
for tests and CI. The configs validate themselves on construction, naming the
field that is wrong.

* :class:`SyncConfig`: one synchronous data-parallel run (``train sync``).
* :class:`StalenessConfig`: Table A, fixed staleness τ (``train staleness``).
* :class:`StragglerConfig`: Table B, straggler models × sync/async (``train stragglers``).
* :class:`TableCConfig`: Table C, every arm × workload on one time model (``train table-c``).
* :class:`PhaseConfig`: the phase diagram, straggler heaviness × bandwidth (``train phase``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from allreduce_jax import ALGORITHMS
from allreduce_jax.training import async_sim, models
from allreduce_jax.training.arms import ARMS, WORKLOADS, Setup, get_arm


def _require(ok: bool, name: str, value: Any, expected: str) -> None:
  if not ok:
    raise ValueError(f"{name}={value!r} is invalid: expected {expected}.")


def _check_common(cfg) -> None:
  _require(cfg.model in models.MODELS, "model", cfg.model, f"one of {models.MODELS}")
  _require(
    cfg.optimizer in models.OPTIMIZERS, "optimizer", cfg.optimizer, f"one of {models.OPTIMIZERS}"
  )
  _require(0 <= cfg.momentum < 1, "momentum", cfg.momentum, "a number in [0, 1)")
  _require(len(cfg.seeds) >= 1, "seeds", cfg.seeds, "at least one seed")
  _require(0 < cfg.target <= 1, "target", cfg.target, "an accuracy in (0, 1]")
  _require(cfg.eval_every >= 1, "eval_every", cfg.eval_every, "an integer >= 1")


@dataclass(frozen=True)
class SyncConfig:
  """One synchronous data-parallel run (the ``train sync`` subcommand).

  The defaults reach ~97% test accuracy on the digits in 300 steps.

  Attributes:
    model: the network trained on the digits: mlp, cnn or lm.
    optimizer: sgd, momentum, adam or adamw (optax).
    learning_rate: the optimizer's step size.
    momentum: the momentum coefficient, in [0, 1) (momentum optimizer).
    workers: data-parallel workers, one device each.
    batch_per_worker: samples per worker per step; a step averages workers × this.
    steps: synchronous steps (each one all-reduce of the gradients).
    algorithm: the all-reduce algorithm of the gradients (a key of ALGORITHMS).
    bucket_bytes: gradient bucket size in bytes (none: one bucket per dtype; 0: one
      all-reduce per leaf).
    eval_every: steps between two test-accuracy evaluations.
    seeds: one run per seed (initialization and data order), comma-separated.
    target: the test accuracy whose first step is reported (steps to target).
  """

  model: str = "mlp"
  optimizer: str = "momentum"
  learning_rate: float = 0.05
  momentum: float = 0.9
  workers: int = 8
  batch_per_worker: int = 16
  steps: int = 300
  algorithm: str = "ring"
  bucket_bytes: int | None = None
  eval_every: int = 50
  seeds: tuple[int, ...] = (0,)
  target: float = 0.95

  def __post_init__(self):
    _check_common(self)
    _require(self.learning_rate > 0, "learning_rate", self.learning_rate, "a number > 0")
    _require(self.workers >= 1, "workers", self.workers, "an integer >= 1")
    _require(
      self.batch_per_worker >= 1, "batch_per_worker", self.batch_per_worker, "an integer >= 1"
    )
    _require(self.steps >= 1, "steps", self.steps, "an integer >= 1")
    _require(
      self.algorithm in ALGORITHMS, "algorithm", self.algorithm, f"one of {sorted(ALGORITHMS)}"
    )
    _require(
      self.bucket_bytes is None or self.bucket_bytes >= 0,
      "bucket_bytes",
      self.bucket_bytes,
      "none or an integer >= 0 (0: one all-reduce per leaf)",
    )

  @classmethod
  def smoke(cls, **overrides) -> SyncConfig:
    """A seconds-long preset for tests."""
    return cls(**{"steps": 40, "eval_every": 20, **overrides})


@dataclass(frozen=True)
class StalenessConfig:
  """Table A: fixed staleness τ, equal updates, equal per-update batch.

  τ = 0 is the synchronous / sequential baseline (every method coincides there);
  each τ > 0 runs every method in ``methods``.

  Attributes:
    model: the network trained on the digits: mlp, cnn or lm.
    optimizer: sgd, momentum, adam or adamw (optax).
    learning_rate: the optimizer's step size.
    momentum: the momentum coefficient, in [0, 1) (momentum optimizer).
    batch_size: samples per update.
    updates: updates per run, the same for every method and τ.
    taus: staleness values τ (updates between reading the parameters and applying the
      gradient), comma-separated; 0 is the synchronous baseline.
    methods: asynchronous methods run at every τ > 0: async (plain), async_eta_tau
      (step size divided by τ), dcasgd (delay-compensated, DC-ASGD-a: λ adapts to the
      gradients' running mean square).
    seeds: one run per seed and (method, τ), comma-separated.
    target: the test accuracy whose first update is reported (updates to target).
    eval_every: updates between two test-accuracy evaluations.
  """

  model: str = "mlp"
  optimizer: str = "momentum"
  learning_rate: float = 0.02
  momentum: float = 0.9
  batch_size: int = 16
  updates: int = 1500
  taus: tuple[int, ...] = (0, 1, 2, 4, 8, 16)
  methods: tuple[str, ...] = async_sim.ASYNC_METHODS
  seeds: tuple[int, ...] = (0, 1, 2)
  target: float = 0.95
  eval_every: int = 50

  def __post_init__(self):
    _check_common(self)
    _require(self.learning_rate > 0, "learning_rate", self.learning_rate, "a number > 0")
    _require(self.batch_size >= 1, "batch_size", self.batch_size, "an integer >= 1")
    _require(self.updates >= 1, "updates", self.updates, "an integer >= 1")
    _require(
      len(self.taus) >= 1 and all(t >= 0 for t in self.taus), "taus", self.taus, "integers >= 0"
    )
    _require(
      all(m in async_sim.ASYNC_METHODS for m in self.methods),
      "methods",
      self.methods,
      f"some of {async_sim.ASYNC_METHODS}",
    )

  @classmethod
  def smoke(cls, **overrides) -> StalenessConfig:
    """A seconds-long preset for tests."""
    return cls(**{"updates": 60, "taus": (0, 4), "seeds": (0,), "eval_every": 30, **overrides})

  def arms(self) -> list[tuple[str, int]]:
    """``(method, τ)`` pairs: ``("sync", 0)`` then every method at every τ > 0."""
    arms = [("sync", 0)] if 0 in self.taus else []
    return arms + [(m, t) for t in self.taus if t > 0 for m in self.methods]

  def run_fields(self, method: str, tau: int, seed: int) -> dict[str, Any]:
    base = {
      k: v for k, v in dataclasses.asdict(self).items() if k not in ("taus", "methods", "seeds")
    }
    return {"sweep": "staleness", **base, "method": method, "tau": tau, "seed": seed}


@dataclass(frozen=True)
class StragglerConfig:
  """Table B: per compute-time model, sync (± backups) vs async (± η/τ) on N workers.

  Every arm computes the same number of gradients (``sync_steps × workers``): sync
  takes ``sync_steps`` steps of ``workers × batch_per_worker`` examples (those of
  the ``workers - b`` fastest kept), async applies ``sync_steps × workers`` updates
  of ``batch_per_worker`` examples. Async uses ``async_lr``; sync uses ``sync_lr``,
  by default ``N × async_lr`` (Goyal et al.'s linear scaling: its batch is N times
  larger).
  ``n_sweep`` adds runs at other worker counts (exponential times only) for the
  time-to-target vs N figure.

  Attributes:
    model: the network trained on the digits: mlp, cnn or lm.
    optimizer: sgd, momentum, adam or adamw (optax).
    momentum: the momentum coefficient, in [0, 1) (momentum optimizer).
    sync_lr: the synchronous arms' step size (none: workers × async_lr).
    async_lr: the asynchronous arms' step size.
    batch_per_worker: samples per gradient.
    workers: N workers.
    sync_steps: synchronous steps; every arm computes sync_steps × workers gradients.
    compute_models: compute-time models, comma-separated: constant, exponential,
      lognormal[:σ], pareto[:α], slow[:factor] (one worker that many times slower).
    backups: backup-worker counts b of the sync_b arms (each step keeps the N - b
      fastest gradients), comma-separated.
    async_methods: asynchronous methods: async, async_eta_tau, dcasgd.
    seeds: one run per seed and cell, comma-separated.
    algorithm: the all-reduce algorithm whose modelled time is charged to sync.
    compute_us: µs of one mean gradient computation, the unit the all-reduce time is
      charged in.
    max_staleness: asynchronous gradients staler than this are dropped.
    target: the test accuracy whose first time is reported (time to target).
    eval_every: updates between two test-accuracy evaluations.
    n_sweep: other worker counts run with exponential times, comma-separated.
  """

  model: str = "mlp"
  optimizer: str = "momentum"
  momentum: float = 0.9
  sync_lr: float | None = None
  async_lr: float = 0.02
  batch_per_worker: int = 16
  workers: int = 8
  sync_steps: int = 200
  compute_models: tuple[str, ...] = async_sim.COMPUTE_MODELS
  backups: tuple[int, ...] = (1, 2)
  async_methods: tuple[str, ...] = ("async", "async_eta_tau")
  seeds: tuple[int, ...] = (0, 1, 2)
  algorithm: str = "ring"
  compute_us: float = 1000.0
  max_staleness: int = 64
  target: float = 0.95
  eval_every: int = 5
  n_sweep: tuple[int, ...] = (2, 4)

  def __post_init__(self):
    _check_common(self)
    _require(
      self.sync_lr is None or self.sync_lr > 0, "sync_lr", self.sync_lr, "None or a number > 0"
    )
    _require(self.async_lr > 0, "async_lr", self.async_lr, "a number > 0")
    _require(
      self.batch_per_worker >= 1, "batch_per_worker", self.batch_per_worker, "an integer >= 1"
    )
    _require(self.workers >= 2, "workers", self.workers, "an integer >= 2")
    _require(self.sync_steps >= 1, "sync_steps", self.sync_steps, "an integer >= 1")
    _require(
      len(self.compute_models) >= 1
      and all(m in async_sim.COMPUTE_MODELS for m in self.compute_models),
      "compute_models",
      self.compute_models,
      f"some of {async_sim.COMPUTE_MODELS}",
    )
    _require(
      all(0 < b < self.workers for b in self.backups),
      "backups",
      self.backups,
      f"integers in 1..{self.workers - 1}",
    )
    _require(
      all(m in async_sim.ASYNC_METHODS for m in self.async_methods),
      "async_methods",
      self.async_methods,
      f"some of {async_sim.ASYNC_METHODS}",
    )
    _require(
      self.algorithm in ALGORITHMS, "algorithm", self.algorithm, f"one of {sorted(ALGORITHMS)}"
    )
    _require(self.compute_us > 0, "compute_us", self.compute_us, "a number > 0")
    _require(self.max_staleness >= 1, "max_staleness", self.max_staleness, "an integer >= 1")
    _require(all(1 <= n for n in self.n_sweep), "n_sweep", self.n_sweep, "worker counts >= 1")

  @classmethod
  def smoke(cls, **overrides) -> StragglerConfig:
    """A seconds-long preset for tests."""
    base = {
      "workers": 4,
      "sync_steps": 20,
      "compute_models": ("exponential", "slow"),
      "backups": (1,),
      "seeds": (0,),
      "eval_every": 10,
      "n_sweep": (2,),
      "max_staleness": 32,
    }
    return cls(**{**base, **overrides})

  def runs(self) -> list[tuple[int, str, str, int]]:
    """``(N, compute model, arm, seed)`` of every run."""
    out = []
    for n in (self.workers, *[n for n in self.n_sweep if n != self.workers]):
      compute = self.compute_models if n == self.workers else ("exponential",)
      arms = ["sync", *[f"sync_b{b}" for b in self.backups if b < n], *self.async_methods]
      out += [(n, c, a, s) for c in compute for a in arms for s in self.seeds]
    return out

  def run_fields(self, n: int, compute: str, arm: str, seed: int) -> dict[str, Any]:
    skip = ("compute_models", "backups", "async_methods", "seeds", "n_sweep", "workers")
    base = {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}
    return {"sweep": "stragglers", **base, "n": n, "compute": compute, "arm": arm, "seed": seed}


def _check_setup(cfg) -> None:
  cfg.check()
  for a in cfg.arms:
    get_arm(a)  # raises naming the arm
  _require(len(cfg.seeds) >= 1, "seeds", cfg.seeds, "at least one seed")


#: Table C's default arms: every arm of the harness (Local SGD, DiLoCo and gossip
#: come from ``training.local`` / ``training.gossip``).
TABLE_C_ARMS = (
  "sync",
  "sync_b1",
  "sync_ov",
  "sync_b1_ov",
  "sync_balanced",
  "sync_isolate",
  "async",
  "async_eta_tau",
  "dcasgd",
  "ssp1",
  "ssp4",
  "local_sgd_h8",
  "diloco_h50",
  "gossip",
)


@dataclass(frozen=True)
class TableCConfig(Setup):
  """Table C: every arm × workload under one straggler scenario and one network.

  The default scenario: log-normal (σ = 0.5) compute times on 8 workers, one of them
  4× slower (``speeds``), 25 ms per mean gradient, communication priced on 100 GbE at
  the model's real size (``--model-params 100000000`` prices a 100 M-parameter model
  instead). Every arm computes the same number of per-worker gradients.

  Attributes:
    workloads: registered workloads (``arms.WORKLOADS``): digits_mlp, digits_cnn98, lm.
    arms: registered arms (``arms.ARMS``; ``ssp{s}``, ``sync_b{b}``, ``local_sgd_h{H}``,
      ``diloco_h{H}`` for any number).
    seeds: one run per seed (model init, data order and compute times).
  """

  speeds: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.25)
  workloads: tuple[str, ...] = ("digits_mlp",)
  arms: tuple[str, ...] = TABLE_C_ARMS
  seeds: tuple[int, ...] = (0, 1, 2)

  def __post_init__(self):
    _check_setup(self)
    for w in self.workloads:
      _require(w in WORKLOADS, "workloads", self.workloads, f"some of {sorted(WORKLOADS)}")

  @classmethod
  def smoke(cls, **overrides) -> TableCConfig:
    """A seconds-long preset for tests."""
    base = {
      "workers": 4,
      "speeds": (1.0, 1.0, 1.0, 0.25),
      "gradients": 160,
      "eval_every": 10,
      "arms": ("sync", "sync_b1", "sync_isolate", "async", "ssp1"),
      "seeds": (0,),
    }
    return cls(**{**base, **overrides})

  def runs(self) -> list[tuple[str, str, int]]:
    """``(workload, arm, seed)`` of every run."""
    return [(w, a, s) for w in self.workloads for a in self.arms for s in self.seeds]


@dataclass(frozen=True)
class PhaseConfig(Setup):
  """The phase diagram: which arm reaches the target first, by straggler heaviness
  (log-normal σ of the compute times) × network bandwidth, for a priced model size.

  Updates to target are *measured* per (σ, arm, seed) by training ``workload`` with
  the model's real size (communication negligible); the time to reach them is then
  read off each arm's schedule at every bandwidth, pricing ``model_params``
  parameters (100 M by default) on links of ``bandwidths_GBps`` with the
  latency of the preset named by the network field.

  Attributes:
    workload: the registered workload whose updates to target are measured.
    sigmas: log-normal σ of the compute times (columns; 0 = no stragglers).
    bandwidths_GBps: link bandwidths priced (rows), per direction (held in GB/s),
      comma-separated: 1Gbit,10Gbit,100Gbit or 0.1GB/s,1GB/s.
    arms: the arms competing in every cell.
    seeds: one measured run per seed and (σ, arm).
  """

  model_params: int = 100_000_000
  eval_every: int = 5
  workload: str = "digits_mlp"
  sigmas: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 1.5)
  bandwidths_GBps: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)
  arms: tuple[str, ...] = ("sync", "sync_b1", "async", "async_eta_tau", "ssp4")
  seeds: tuple[int, ...] = (0, 1, 2)

  def __post_init__(self):
    _check_setup(self)
    _require(self.workload in WORKLOADS, "workload", self.workload, f"one of {sorted(WORKLOADS)}")
    _require(len(self.sigmas) >= 1 and min(self.sigmas) >= 0, "sigmas", self.sigmas, "numbers >= 0")
    _require(
      len(self.bandwidths_GBps) >= 1 and min(self.bandwidths_GBps) > 0,
      "bandwidths_GBps",
      self.bandwidths_GBps,
      "numbers > 0",
    )

  @classmethod
  def smoke(cls, **overrides) -> PhaseConfig:
    """A seconds-long preset for tests."""
    base = {
      "workers": 4,
      "gradients": 160,
      "eval_every": 10,
      "sigmas": (0.0, 1.0),
      "bandwidths_GBps": (0.1, 100.0),
      "arms": ("sync", "async"),
      "seeds": (0,),
    }
    return cls(**{**base, **overrides})

  def compute_of(self, sigma: float) -> str:
    return f"lognormal:{sigma:g}"


def fields_of(cfg) -> dict[str, Any]:
  """The config as a JSON-ready dict (tuples become lists)."""
  return json_ready(dataclasses.asdict(cfg))


def json_ready(x):
  if isinstance(x, dict):
    return {k: json_ready(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [json_ready(v) for v in x]
  return x


__all__ = [
  "ARMS",
  "PhaseConfig",
  "StalenessConfig",
  "StragglerConfig",
  "SyncConfig",
  "TableCConfig",
]
