"""The experiments: one sync run, the staleness sweep (Table A), the straggler sweep (Table B).

Each sweep is a list of runs identified by a key (config fields + arm + seed);
finished runs are appended to a JSONL file at once and skipped when the sweep is
started again (:class:`~allreduce_jax.training.results.Results`). Tables and figures
are drawn from the rows only (:mod:`.tables`, :mod:`.figures`).

Seeds: run ``seed`` initializes the model with ``seed``, orders mini-batches with
``1000 + seed`` and draws compute times with ``2000 + seed``, so every arm of a
seed starts from the same weights and sees the same data order, and the compute
times are independent of both.

Simulated time is in units of one mean gradient computation (compute times have
mean 1), taken to last :attr:`StragglerConfig.compute_us` microseconds when adding
the modelled all-reduce time of a sync step (:func:`allreduce_time_us`). Async
updates pay no communication time in this model (a parameter-server push/pull
overlaps the next computation).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from allreduce_jax import ALGORITHMS
from allreduce_jax.training import async_sim, data, models, sync
from allreduce_jax.training.results import Results, environment

#: All-reduce time (µs) used when ``allreduce_jax.cost_model`` is not available:
#: a latency-bound all-reduce of ~40 KB across 8 accelerators (order of magnitude).
FALLBACK_ALLREDUCE_US = 50.0


def allreduce_time_us(algorithm: str, p: int, nbytes: int) -> tuple[float, str]:
  """Modelled time of one all-reduce, and where it came from.

  Uses ``allreduce_jax.cost_model.predict_us`` when that module exists, else
  :data:`FALLBACK_ALLREDUCE_US`. One participant needs no all-reduce (0 µs).

  Returns:
    ``(microseconds, "cost_model" | "constant" | "none")``.
  """
  if p <= 1:
    return 0.0, "none"
  try:
    from allreduce_jax.cost_model import predict_us
  except ImportError:
    return FALLBACK_ALLREDUCE_US, "constant"
  kwargs = {}
  if algorithm == "hierarchical":
    from allreduce_jax._devices import factor_2d

    kwargs["inner"] = factor_2d(p)[1]  # the mesh _mesh builds for it
  try:
    return float(predict_us(algorithm, p, nbytes, **kwargs)), "cost_model"
  except (TypeError, ValueError):  # an algorithm (or signature) the model does not know
    return FALLBACK_ALLREDUCE_US, "constant"


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

  @classmethod
  def smoke(cls, **overrides) -> SyncConfig:
    """A seconds-long preset for tests."""
    return cls(**{"steps": 40, "eval_every": 20, **overrides})


def _mesh(n: int, algorithm: str = "ring"):
  """``(mesh, axis)`` of ``n`` participants; a 2-D ``(outer, inner)`` mesh for
  ``hierarchical``, which reduces over two axes."""
  from allreduce_jax import _devices

  if n > len(jax.devices()):
    raise ValueError(f"workers={n} is invalid: only {len(jax.devices())} devices are available.")
  if algorithm == "hierarchical":
    shape = _devices.factor_2d(n)
    return _devices.submesh(shape, ("outer", "inner")), ("outer", "inner")
  return _devices.submesh((n,), ("data",)), "data"


def run_sync(cfg: SyncConfig, seed: int = 0) -> dict[str, Any]:
  """Trains once synchronously; returns a result row (accuracy, losses, timing).

  Example:
    >>> row = run_sync(SyncConfig.smoke(workers=2, algorithm="psum"))
    >>> row["replicas_identical"]
    True
  """
  d = data.load_digits()
  graphdef, params, rest = models.split(models.make_model(cfg.model, seed))
  tx = models.make_optimizer(cfg.optimizer, cfg.learning_rate, cfg.momentum)
  idx = data.batch_indices(d.n_train, cfg.workers * cfg.batch_per_worker, cfg.steps, 1000 + seed)
  mesh, axis = _mesh(cfg.workers, cfg.algorithm)
  t0 = time.perf_counter()
  res = sync.train_sync(
    graphdef,
    params,
    rest,
    tx,
    d,
    idx,
    mesh=mesh,
    axis=axis,
    algorithm=cfg.algorithm,
    eval_every=cfg.eval_every,
    bucket_bytes=cfg.bucket_bytes,
  )
  wall = time.perf_counter() - t0
  return {
    "config": dataclasses.asdict(cfg),
    "seed": seed,
    "final_test_acc": res.final_test_acc,
    "final_train_acc": res.final_train_acc,
    "eval_steps": res.eval_steps,
    "test_acc": res.test_acc,
    "steps_to_target": _first_reaching(res.eval_steps, res.test_acc, cfg.target),
    "final_loss": float(res.losses[-1]),
    "replicas_identical": res.replicas_identical,
    "wall_s": wall,
    "env": environment(),
  }


def _final_loss(losses) -> float:
  """Mean of the finite losses of the last window; NaN when the run diverged."""
  finite = np.asarray(losses, np.float64)
  finite = finite[np.isfinite(finite)]
  return float(finite.mean()) if finite.size else float("nan")


def _print(line: str) -> None:
  print(line, flush=True)


def _first_reaching(xs: list, accs: list[float], target: float):
  for x, a in zip(xs, accs):
    if a >= target:
      return x
  return None


# ------------------------------------------------------------------ Table A


@dataclass(frozen=True)
class StalenessConfig:
  """Table A: fixed staleness τ, equal updates, equal per-update batch.

  τ = 0 is the synchronous / sequential baseline (every method coincides there);
  each τ > 0 runs every method in ``methods``.
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


def run_staleness_sweep(
  cfg: StalenessConfig,
  out_dir: str | Path,
  *,
  max_runs: int | None = None,
  log: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
  """Runs Table A's sweep (resuming), writes ``staleness.jsonl``; returns this config's rows.

  Args:
    cfg: the sweep.
    out_dir: where ``staleness.jsonl`` lives.
    max_runs: stop after this many new runs (``None``: all); the rest is picked up
      by the next call.
    log: progress printer.

  Returns:
    The rows of this config's runs that are finished (old and new).
  """
  log = log or _print
  store = Results(Path(out_dir) / "staleness.jsonl")
  done = store.done()
  d = data.load_digits()
  K = max(cfg.taus) + 1
  tx = models.make_optimizer(cfg.optimizer, cfg.learning_rate, cfg.momentum)
  compiled: dict[str, Any] = {}  # one replay (and evaluator), built on first use
  new = 0
  keys = []
  for seed in cfg.seeds:
    for method, tau in cfg.arms():
      key = store.key(cfg.run_fields(method, tau, seed))  # + jax version, backend
      keys.append(key)
      if key in done or (max_runs is not None and new >= max_runs):
        continue
      graphdef, params, rest = models.split(models.make_model(cfg.model, seed))
      if not compiled:
        compiled["replay"] = async_sim.make_replay(graphdef, rest, tx, K)
        compiled["evaluate"] = sync.make_evaluator(graphdef, rest)
      idx = data.batch_indices(d.n_train, cfg.batch_size, cfg.updates, 1000 + seed)
      t0 = time.perf_counter()
      res = async_sim.run_async(
        compiled["replay"],
        params,
        tx,
        d,
        async_sim.fixed_tau_schedule(tau, cfg.updates),
        idx,
        buffer_size=K,
        method="async" if method == "sync" else method,
        chunk=cfg.eval_every,
        evaluate=compiled["evaluate"],
      )
      row = {
        "key": key,
        **cfg.run_fields(method, tau, seed),
        "final_test_acc": res.final_test_acc,
        "eval_updates": res.eval_updates,
        "test_acc": res.test_acc,
        "updates_to_target": _first_reaching(res.eval_updates, res.test_acc, cfg.target),
        "diverged": res.diverged,
        "final_loss": _final_loss(res.losses[-cfg.eval_every :]),
        "wall_s": time.perf_counter() - t0,
        "env": environment(),
      }
      done[key] = store.append(row)
      new += 1
      log(f"staleness {method:14s} tau={tau:3d} seed={seed}: acc {res.final_test_acc:.4f}")
  return [done[k] for k in keys if k in done]


# ------------------------------------------------------------------ Table B


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


def _param_bytes(params) -> int:
  return int(sum(np.asarray(a).nbytes for a in jax.tree.leaves(params)))


def run_straggler_sweep(
  cfg: StragglerConfig,
  out_dir: str | Path,
  *,
  max_runs: int | None = None,
  log: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
  """Runs Table B's sweep (resuming), writes ``stragglers.jsonl``; returns this config's rows.

  Args and Returns: as :func:`run_staleness_sweep`.
  """
  log = log or _print
  store = Results(Path(out_dir) / "stragglers.jsonl")
  done = store.done()
  d = data.load_digits()
  B = cfg.batch_per_worker
  async_tx = models.make_optimizer(cfg.optimizer, cfg.async_lr, cfg.momentum)
  K = cfg.max_staleness + 1
  compiled: dict[Any, Any] = {}
  new = 0
  keys = []
  for n, compute, arm, seed in cfg.runs():
    key = store.key(cfg.run_fields(n, compute, arm, seed))  # + jax version, backend
    keys.append(key)
    if key in done or (max_runs is not None and new >= max_runs):
      continue
    graphdef, params, rest = models.split(models.make_model(cfg.model, seed))
    if "evaluate" not in compiled:
      compiled["evaluate"] = sync.make_evaluator(graphdef, rest)
    evaluate = compiled["evaluate"]
    steps = max(1, cfg.sync_steps * cfg.workers // n)  # equal gradients at every N
    t0 = time.perf_counter()
    row: dict[str, Any] = {"key": key, **cfg.run_fields(n, compute, arm, seed)}
    if arm.startswith("sync"):
      b = int(arm[len("sync_b") :]) if arm != "sync" else 0
      ar_us, ar_source = allreduce_time_us(cfg.algorithm, n, _param_bytes(params))
      sched = async_sim.sync_schedule(
        compute, n, steps, 2000 + seed, backups=b, allreduce_time=ar_us / cfg.compute_us
      )
      sync_lr = cfg.sync_lr or n * cfg.async_lr
      sync_tx = models.make_optimizer(cfg.optimizer, sync_lr, cfg.momentum)
      if ("sync", n) not in compiled:
        mesh, axis = _mesh(n, cfg.algorithm)
        chunk_fn = sync.make_sync_chunk(
          graphdef, rest, sync_tx, mesh, cfg.algorithm, axis=axis, masked=True
        )
        compiled["sync", n] = (mesh, axis, chunk_fn, sync_tx)
      mesh, axis, chunk_fn, sync_tx = compiled["sync", n]
      idx = data.batch_indices(d.n_train, n * B, steps, 1000 + seed)
      res = sync.train_sync(
        graphdef,
        params,
        rest,
        sync_tx,
        d,
        idx,
        mesh=mesh,
        axis=axis,
        algorithm=cfg.algorithm,
        mask=sched.mask,
        eval_every=cfg.eval_every,
        chunk_fn=chunk_fn,
      )
      times = [0.0, *[float(sched.time[k - 1]) for k in res.eval_steps[1:]]]
      row |= {
        "sync_lr": sync_lr,
        "updates": steps,
        "eval_updates": res.eval_steps,
        "gradients_per_update": n,
        "time_per_update": float(sched.step_time.mean()),
        "allreduce_us": ar_us,
        "allreduce_source": ar_source,
        "staleness_mean": 0.0,
        "staleness_p95": 0.0,
        "staleness_hist": [steps],
        "dropped": b * steps,
        "replicas_identical": res.replicas_identical,
        "final_test_acc": res.final_test_acc,
        "test_acc": res.test_acc,
        "diverged": bool(not np.isfinite(res.losses).all()),
      }
    else:
      T = steps * n
      sched = async_sim.event_schedule(compute, n, T, 2000 + seed, max_staleness=cfg.max_staleness)
      if "replay" not in compiled:
        compiled["replay"] = async_sim.make_replay(graphdef, rest, async_tx, K)
      idx = data.batch_indices(d.n_train, B, T, 1000 + seed)
      res = async_sim.run_async(
        compiled["replay"],
        params,
        async_tx,
        d,
        sched,
        idx,
        buffer_size=K,
        method=arm,
        chunk=cfg.eval_every * n,
        evaluate=evaluate,
      )
      times = [0.0, *[float(sched.time[k - 1]) for k in res.eval_updates[1:]]]
      row |= {
        "updates": T,
        "eval_updates": res.eval_updates,
        "gradients_per_update": 1,
        "time_per_update": float(sched.time[-1] / T),
        "allreduce_us": 0.0,
        "allreduce_source": "none",
        "staleness_mean": float(sched.staleness.mean()),
        "staleness_p95": float(np.percentile(sched.staleness, 95)),
        "staleness_hist": np.bincount(sched.staleness, minlength=K).tolist(),
        "dropped": sched.dropped,
        "final_test_acc": res.final_test_acc,
        "test_acc": res.test_acc,
        "diverged": res.diverged,
      }
    row |= {
      "eval_time": times,
      "time_to_target": _first_reaching(times, row["test_acc"], cfg.target),
      "wall_s": time.perf_counter() - t0,
      "env": environment(),
    }
    done[key] = store.append(row)
    new += 1
    log(
      f"stragglers N={n} {compute:11s} {arm:14s} seed={seed}: acc {row['final_test_acc']:.4f},"
      f" time to target {row['time_to_target']}"
    )
  return [done[k] for k in keys if k in done]


# ------------------------------------------------------------------ outputs


def write_staleness_outputs(rows: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
  """Writes ``table_a.md`` and ``staleness_curves.png`` from Table A's rows."""
  from allreduce_jax.training import figures, tables

  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  md = out_dir / "table_a.md"
  md.write_text("# Table A: staleness sweep\n\n" + tables.staleness_table(rows) + "\n")
  return [md, figures.staleness_figure(rows, out_dir / "staleness_curves.png")]


def write_straggler_outputs(rows: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
  """Writes ``table_b.md`` and the straggler figures from Table B's rows."""
  from allreduce_jax.training import figures, tables

  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  md = out_dir / "table_b.md"
  md.write_text(
    "# Table B: straggler sweep\n\n"
    + tables.straggler_table(rows)
    + "\n\n## Time to target vs N\n\n"
    + tables.time_to_target_vs_n_table(rows)
    + "\n"
  )
  return [md, *figures.straggler_figures(rows, out_dir)]


# ------------------------------------------------------------------ command-line helpers


def _field_parser(name: str, default: Any) -> Callable[[str], Any]:
  if isinstance(default, tuple):
    elem = type(default[0]) if default else int

    def parse_tuple(text: str) -> tuple:
      try:
        return tuple(elem(v.strip()) for v in text.split(",") if v.strip())
      except ValueError:
        raise argparse.ArgumentTypeError(
          f"--{name.replace('_', '-')}: expected comma-separated {elem.__name__} values, got {text!r}"
        ) from None

    return parse_tuple
  kind = int if default is None else type(default)

  def parse(text: str) -> Any:
    try:
      return kind(text)
    except ValueError:
      raise argparse.ArgumentTypeError(
        f"--{name.replace('_', '-')}: expected {kind.__name__}, got {text!r}"
      ) from None

  return parse


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
  """Adds one ``--field-name`` option per field of the config dataclass ``cls``."""
  for f in dataclasses.fields(cls):
    parser.add_argument(
      "--" + f.name.replace("_", "-"),
      dest=f.name,
      type=_field_parser(f.name, f.default),
      default=None,
      help=f"default {f.default!r}",
    )


def config_from_arguments(cls: type, args: argparse.Namespace, smoke: bool = False):
  """The frozen config from parsed options (unset options keep the default or smoke preset)."""
  overrides = {
    f.name: getattr(args, f.name)
    for f in dataclasses.fields(cls)
    if getattr(args, f.name, None) is not None
  }
  return cls.smoke(**overrides) if smoke else cls(**overrides)
