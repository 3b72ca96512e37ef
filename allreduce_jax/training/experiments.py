"""The experiments: one sync run, Table A (staleness), Table B (stragglers), Table C
(every arm × workload on one time model) and the phase diagram.

The configs live in :mod:`.configs` (re-exported here); the arms in :mod:`.arms`.

Each sweep is a list of runs identified by a key (config fields + arm + seed);
finished runs are appended to a JSONL file at once and skipped when the sweep is
started again (:class:`~allreduce_jax.training.results.Results`). Tables and figures
are drawn from the rows only (:mod:`.tables`, :mod:`.figures`).

Seeds: run ``seed`` initializes the model with ``seed``, orders mini-batches with
``1000 + seed`` and draws compute times with ``2000 + seed``, so every arm of a
seed starts from the same weights and sees the same data order, and the compute
times are independent of both.

Table B (kept for continuity) measures time in units of one mean gradient
computation and charges communication to sync only. Table C and the phase diagram
use the arms' common time model instead: simulated seconds of compute plus
communication priced by the cost model for every arm (:mod:`.arms`). All three run
through the arms: Table B's are ``families.sync_arm(b, time_unit_us=compute_us)``
and ``families.ps_arm(method, charged=False)`` (:func:`straggler_arm`), its rows
built from their timelines and curves (:func:`straggler_fields`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import numpy as np
from flax import nnx
from tqdm import tqdm

from allreduce_jax import devices, progress, results
from allreduce_jax.cost_model import predict_us
from allreduce_jax.devices import inner_size
from allreduce_jax.training import (
  arms,
  async_sim,
  checkpoint,
  data,
  families,
  figures,
  models,
  sync,
  tables,
)
from allreduce_jax.training.configs import (
  PhaseConfig,
  StalenessConfig,
  StragglerConfig,
  SyncConfig,
  TableCConfig,
  fields_of,
)
from allreduce_jax.training.results import Results, environment


def allreduce_time_us(algorithm: str, p: int, nbytes: int) -> tuple[float, str]:
  """Modelled time of one all-reduce, and where it came from.

  ``cost_model.predict_us`` with the documented defaults, the inner size of the
  algorithm's mesh for multi-axis ones; one participant needs no all-reduce (0 µs).
  An algorithm without a cost model is a ``ValueError`` naming it.

  Returns:
    ``(microseconds, "cost_model" | "none")``.
  """
  if p <= 1:
    return 0.0, "none"
  return float(predict_us(algorithm, p, nbytes, inner=inner_size(algorithm, p))), "cost_model"


def _mesh(n: int, algorithm: str = "ring"):
  """``(mesh, axis)`` of ``n`` participants for ``algorithm`` (``devices.mesh_for``)."""
  if n > len(jax.devices()):
    raise ValueError(f"workers={n} is invalid: only {len(jax.devices())} devices are available.")
  return devices.mesh_for(algorithm, n)


def run_sync(
  cfg: SyncConfig,
  seed: int = 0,
  *,
  checkpoint_dir: str | Path | None = None,
  checkpoint_every: int = 1,
  elastic: bool = False,
  overlap: bool = False,
) -> dict[str, Any]:
  """Trains once synchronously; returns a result row (accuracy, losses, timing).

  ``overlap``: each step's all-reduce overlapped with its backward pass
  (:func:`.sync.make_overlapped_chunk`; needs ``cfg.bucket_bytes`` > 0), the same
  parameters bit for bit.

  With ``checkpoint_dir`` the run is saved every ``checkpoint_every`` steps
  (:mod:`.checkpoint`) and resumes from the newest complete checkpoint there, with
  the same final parameters, bit for bit, as a run never interrupted; ``elastic``: a
  checkpoint of more workers is resumed too (same batch per worker, learning rate
  scaled with the global batch). The row's ``restarts`` lists the steps resumed from,
  its ``segments`` every step range with the workers and learning rate that trained it
  (``from_step``, ``to_step``, ``workers``, ``learning_rate``; one range unless resumed).

  Example:
    >>> row = run_sync(SyncConfig.smoke(workers=2, algorithm="psum"))
    >>> row["replicas_identical"]
    True
  """
  progress.phase("loading")  # a launcher's watchdog and the run's timeline
  d = data.load_digits()
  tx = models.make_optimizer(cfg.optimizer, cfg.learning_rate, cfg.momentum)
  resuming = checkpoint_dir is not None and _has_checkpoint(checkpoint_dir, seed)
  graphdef, params, rest = _model(cfg.model, seed, abstract=resuming)
  batch = cfg.workers * cfg.batch_per_worker
  ckpt = start = None
  if checkpoint_dir is not None:
    progress.phase("restoring")
    opt_state = _zeros(jax.eval_shape(tx.init, params)) if resuming else tx.init(params)
    ckpt, start = checkpoint.open_run(
      cfg, seed, checkpoint_dir, checkpoint_every, params, opt_state, elastic
    )
    if start is None and resuming:  # no complete step after all: start for real
      graphdef, params, rest = _model(cfg.model, seed)
    tx = models.make_optimizer(cfg.optimizer, ckpt.learning_rate, cfg.momentum)
  progress.phase(f"restored:{start.step}" if start is not None else "fresh")
  if start is None:
    idx = data.batch_indices(d.n_train, batch, cfg.steps, 1000 + seed)
  else:  # the example stream from where the checkpoint stopped
    left = cfg.steps - start.step
    idx = checkpoint.example_stream(d.n_train, start.examples, left * batch, 1000 + seed)
    idx = idx.reshape(left, batch)
  mesh, axis = _mesh(cfg.workers, cfg.algorithm)
  t0 = time.perf_counter()
  res = sync.train_sync(
    graphdef,
    params,
    rest,
    tx,
    data=d,
    idx=idx,
    mesh=mesh,
    axis=axis,
    algorithm=cfg.algorithm,
    eval_every=cfg.eval_every,
    bucket_bytes=cfg.bucket_bytes,
    start=start,
    checkpoints=ckpt,
    overlap=overlap,
  )
  wall = time.perf_counter() - t0
  segments = [{"from_step": 0, "to_step": cfg.steps, "workers": cfg.workers,
               "learning_rate": cfg.learning_rate}]  # fmt: skip
  if ckpt is not None:
    segments = ckpt.segments(cfg.steps, cfg.workers, ckpt.learning_rate)
    ckpt.close()
  return {
    "config": dataclasses.asdict(cfg),
    "seed": seed,
    **({"restarts": ckpt.restarts} if ckpt is not None else {}),
    "segments": segments,
    **({"overlap": True} if overlap else {}),
    "params_sha256": checkpoint.digest(res.params),
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


def _has_checkpoint(directory: str | Path, seed: int) -> bool:
  """Whether the run of ``seed`` has a complete checkpoint in ``directory`` (orbax renames
  a step's folder to its number once complete)."""
  folder = Path(directory) / f"seed-{seed}"
  return folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir())


def _zeros(tree: Any) -> Any:
  """Host zeros of an abstract tree's shapes and dtypes."""
  return jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), tree)


def _model(name: str, seed: int, abstract: bool = False) -> tuple[Any, Any, Any]:
  """``models.split`` of a fresh model; ``abstract``: its parameters as host zeros, built
  without running (or compiling) its initializers, the structure a checkpoint restores
  into (a restart then compiles nothing to start); a model with state besides its
  parameters is always built for real."""
  if abstract:
    graphdef, params, rest = models.split(nnx.eval_shape(lambda: models.make_model(name, seed)))
    if not jax.tree.leaves(rest):
      return graphdef, _zeros(params), rest
  return models.split(models.make_model(name, seed))


def _print(line: str) -> None:
  print(line, flush=True)


def _first_reaching(xs: list, accs: list[float], target: float):
  for x, a in zip(xs, accs):
    if a >= target:
      return x
  return None


class _Resume:
  """One resumable sweep over a row store: which runs have to run now (finished ones are
  skipped, at most ``max_runs`` new ones per call) and this config's finished rows."""

  def __init__(self, path: Path, max_runs: int | None, total: int | None = None, desc: str = ""):
    self.store = Results(path)
    self.done = self.store.done()
    self.max_runs = max_runs
    self.keys: list[str] = []
    self.new = 0
    # Progress (count, rate, ETA) on stderr, only on a terminal; finished runs count too.
    self.bar = tqdm(total=total, desc=desc, unit="run", file=sys.stderr, disable=None, leave=False)

  def pending(self, fields: dict[str, Any]) -> str | None:
    """The run's key (``fields`` + jax version, backend) if it has to run now, else None."""
    key = self.store.key(fields)
    self.keys.append(key)
    if key in self.done or (self.max_runs is not None and self.new >= self.max_runs):
      self.bar.update(1)
      return None
    return key

  def add(self, key: str, row: dict[str, Any]) -> None:
    self.done[key] = self.store.append(row)
    self.new += 1
    self.bar.update(1)

  def rows(self) -> list[dict[str, Any]]:
    """This config's finished rows (old and new), in run order."""
    self.bar.close()
    return [self.done[k] for k in self.keys if k in self.done]


# ------------------------------------------------------------------ Table A


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
  runs = len(cfg.seeds) * len(cfg.arms())
  sweep = _Resume(Path(out_dir) / "staleness.jsonl", max_runs, runs, "staleness")
  d = data.load_digits()
  K = max(cfg.taus) + 1
  tx = models.make_optimizer(cfg.optimizer, cfg.learning_rate, cfg.momentum)
  compiled: dict[str, Any] = {}  # one replay (and evaluator), built on first use
  for seed in cfg.seeds:
    for method, tau in cfg.arms():
      key = sweep.pending(cfg.run_fields(method, tau, seed))
      if key is None:
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
        "final_loss": arms.final_loss(res.losses[-cfg.eval_every :]),
        "wall_s": time.perf_counter() - t0,
        "env": environment(),
      }
      sweep.add(key, row)
      log(f"staleness {method:14s} tau={tau:3d} seed={seed}: acc {res.final_test_acc:.4f}")
  return sweep.rows()


# ------------------------------------------------------------------ Table B


def straggler_workload(cfg: StragglerConfig, d) -> arms.Workload:
  """Table B's task as an arms :class:`~.arms.Workload`: digits, ``cfg.model``, the
  parameter-server arms at ``async_lr``, sync at ``sync_lr`` (default N·async_lr)."""
  return arms.Workload(
    name=f"table_b_{cfg.model}_{cfg.optimizer}_{cfg.momentum:g}",  # the arms' compile cache key
    data=d,
    make_model=lambda seed: models.make_model(cfg.model, seed),
    target=cfg.target,
    optimizer=cfg.optimizer,
    lr=cfg.async_lr,
    sync_lr_scale="linear",
    momentum=cfg.momentum,
    fixed_sync_lr=cfg.sync_lr,
  )


def straggler_arm(cfg: StragglerConfig, name: str) -> arms.Arm:
  """Table B's arm ``name`` (``sync``, ``sync_b{b}``, an async method): the sync arm on
  the gradient clock (:func:`.families.sync_arm` with ``time_unit_us=compute_us``) or
  the parameter server with no communication charged (``ps_arm(charged=False)``)."""
  if name in cfg.async_methods:
    return families.ps_arm(name, charged=False)
  backups = {"sync": 0, **{f"sync_b{b}": b for b in cfg.backups}}  # the names cfg.runs() gives
  return families.sync_arm(backups[name], time_unit_us=cfg.compute_us)


def straggler_setup(cfg: StragglerConfig, n: int, compute: str) -> arms.Setup:
  """The arms' setup of one Table B cell: ``n`` workers, the same gradients at every
  N (``sync_steps × workers``), time in mean gradients (``compute_s = 1``)."""
  steps = max(1, cfg.sync_steps * cfg.workers // n)
  return arms.Setup(
    workers=n,
    batch_per_worker=cfg.batch_per_worker,
    gradients=steps * n,
    compute=compute,
    compute_s=1.0,
    algorithm=cfg.algorithm,
    max_staleness=cfg.max_staleness,
    eval_every=cfg.eval_every,
  )


def straggler_fields(
  arm: arms.Arm, setup: arms.Setup, workload: arms.Workload, tl: arms.Timeline, curve: arms.Curve
) -> dict[str, Any]:
  """Table B's row fields of one arm's timeline and curve (the rows' format of before
  the arms: ``time_per_update`` in mean gradients, the all-reduce in µs...)."""
  n, steps = setup.workers, arms.sync_rounds(setup)
  if arm.family == "sync":
    ar_us, ar_source = allreduce_time_us(setup.algorithm, n, arms.model_bytes(setup))
    return {
      "sync_lr": workload.sync_lr(n),
      "updates": steps,
      "eval_updates": curve.eval_updates,
      "gradients_per_update": n,
      "time_per_update": float(tl.step_time.mean()),
      "allreduce_us": ar_us,
      "allreduce_source": ar_source,
      "staleness_mean": 0.0,
      "staleness_p95": 0.0,
      "staleness_hist": [steps],
      "dropped": tl.info["dropped"],
      "replicas_identical": curve.info["replicas_identical"],
      "final_test_acc": curve.metric[-1],
      "test_acc": curve.metric,
      "diverged": curve.diverged,
    }
  sched, T = tl.plan, len(tl.time)
  return {
    "updates": T,
    "eval_updates": curve.eval_updates,
    "gradients_per_update": 1,
    "time_per_update": float(sched.time[-1] / T),
    "allreduce_us": 0.0,
    "allreduce_source": "none",
    "staleness_mean": tl.info["staleness_mean"],
    "staleness_p95": tl.info["staleness_p95"],
    "staleness_hist": np.bincount(sched.staleness, minlength=setup.max_staleness + 1).tolist(),
    "dropped": tl.info["dropped"],
    "final_test_acc": curve.metric[-1],
    "test_acc": curve.metric,
    "diverged": curve.diverged,
  }


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
  sweep = _Resume(Path(out_dir) / "stragglers.jsonl", max_runs, len(cfg.runs()), "stragglers")
  workload = straggler_workload(cfg, data.load_digits())
  for n, compute, arm, seed in cfg.runs():
    key = sweep.pending(cfg.run_fields(n, compute, arm, seed))
    if key is None:
      continue
    t0 = time.perf_counter()
    record = straggler_arm(cfg, arm)
    if record.family == "sync":
      _mesh(n, cfg.algorithm)  # more workers than devices: one line naming workers
    setup = arms.with_real_size(straggler_setup(cfg, n, compute), workload, seed)
    tl = record.make_schedule(setup, seed)
    curve = record.run(setup, workload, tl, seed)
    times = [tl.time_at(u) for u in curve.eval_updates]
    row: dict[str, Any] = {"key": key, **cfg.run_fields(n, compute, arm, seed)}
    row |= straggler_fields(record, setup, workload, tl, curve)
    row |= {
      "eval_time": times,
      "time_to_target": _first_reaching(times, row["test_acc"], cfg.target),
      "wall_s": time.perf_counter() - t0,
      "env": environment(),
    }
    sweep.add(key, row)
    log(
      f"stragglers N={n} {compute:11s} {arm:14s} seed={seed}: acc {row['final_test_acc']:.4f},"
      f" time to target {row['time_to_target']}"
    )
  return sweep.rows()


# ------------------------------------------------------------------ Table C


def _setup_fields(cfg) -> dict[str, Any]:
  return fields_of(arms.setup_of(cfg))


#: Per-evaluation fields the phase sweep does not keep (a cell needs the time to target).
PHASE_DROP = ("eval_gradients", "eval_time", "eval_updates", "test_metric")


def compact(row: dict[str, Any], digits: int = 5, drop=("eval_gradients",)) -> dict[str, Any]:
  """``row`` with its curves rounded to ``digits`` significant digits (metrics are
  float32, times simulated) and the fields ``drop`` left out, so committed rows stay
  small (the phase sweep keeps no curves, :data:`PHASE_DROP`)."""

  def r(x):
    return float(f"{x:.{digits}g}") if isinstance(x, float) else x

  out = {k: v for k, v in row.items() if k not in drop}
  for k in ("eval_time", "test_metric"):
    if k in out:
      out[k] = [r(x) for x in out[k]]
  return out


def run_table_c(
  cfg: TableCConfig,
  out_dir: str | Path,
  *,
  smoke: bool = False,
  max_runs: int | None = None,
  log: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
  """Runs Table C (resuming), appends to ``table_c.jsonl``; returns this config's rows.

  Every (workload, arm, seed) is one :func:`arms.run_arm` on the config's setup.

  Args:
    cfg: the sweep.
    out_dir: where ``table_c.jsonl`` lives.
    smoke: build the workloads' smoke variants (smaller targets).
    max_runs: stop after this many new runs (``None``: all).
    log: progress printer.
  """
  log = log or _print
  sweep = _Resume(Path(out_dir) / "table_c.jsonl", max_runs, len(cfg.runs()), "table-c")
  setup = arms.setup_of(cfg)
  workloads: dict[str, arms.Workload] = {}
  for w, a, seed in cfg.runs():
    fields = {"sweep": "table_c", **_setup_fields(cfg), "workload": w, "arm": a, "seed": seed}
    fields["smoke"] = smoke
    key = sweep.pending(fields)
    if key is None:
      continue
    if w not in workloads:
      workloads[w] = arms.get_workload(w, smoke)
    t0 = time.perf_counter()
    row = compact(arms.run_arm(arms.get_arm(a), setup, workloads[w], seed))
    row = {"key": key, **fields, **row, "wall_s": time.perf_counter() - t0, "env": environment()}
    sweep.add(key, row)
    ttt = row["time_to_target"]
    log(
      f"table-c {w} {a:14s} seed={seed}: {row['metric']} {row['final_metric']:.4f},"
      f" time to target {'-' if ttt is None else f'{ttt:.2f} s'}"
    )
  return sweep.rows()


# ------------------------------------------------------------------ phase diagram


def run_phase(
  cfg: PhaseConfig,
  out_dir: str | Path,
  *,
  smoke: bool = False,
  max_runs: int | None = None,
  log: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
  """Trains every (σ, bandwidth, arm, seed) of the phase diagram (resuming,
  ``phase_runs.jsonl``); returns this config's rows.

  Each cell's setup prices ``cfg.model_params`` parameters on a link of that
  bandwidth with log-normal(σ) compute times, and each arm is trained along its
  own timeline there (communication changes a parameter server's staleness). A
  timeline that replays the same training as one already run (a sync arm's mask
  does not depend on the bandwidth) reuses its curve (:func:`arms.run_arm`).
  """
  log = log or _print
  total = len(cfg.sigmas) * len(cfg.bandwidths_GBps) * len(cfg.arms) * len(cfg.seeds)
  sweep = _Resume(Path(out_dir) / "phase_runs.jsonl", max_runs, total, "phase")
  wl = None
  curves: dict[Any, Any] = {}
  for sigma in cfg.sigmas:
    for bw in cfg.bandwidths_GBps:
      setup = arms.setup_of(cfg, compute=cfg.compute_of(sigma), bandwidth_GBps=bw)
      for a in cfg.arms:
        for seed in cfg.seeds:
          fields = {"sweep": "phase", **fields_of(setup), "workload": cfg.workload, "arm": a}
          fields |= {"seed": seed, "sigma": sigma, "smoke": smoke}
          key = sweep.pending(fields)
          if key is None:
            continue
          wl = wl or arms.get_workload(cfg.workload, smoke)
          t0 = time.perf_counter()
          row = arms.run_arm(arms.get_arm(a), setup, wl, seed, curves)
          row = compact(row, drop=PHASE_DROP)
          row = {"key": key, **fields, **row, "wall_s": time.perf_counter() - t0}
          sweep.add(key, {**row, "env": environment()})
          ttt = row["time_to_target"]
          log(
            f"phase σ={sigma:g} {bw:g} GB/s {a:14s} seed={seed}: time to target"
            f" {'-' if ttt is None else f'{ttt:.3g} s'} ({row['updates_to_target']} updates)"
          )
  return sweep.rows()


def phase_cells(cfg: PhaseConfig, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Time to target of every (σ, bandwidth, arm), and the winner of each (σ, bandwidth).

  The cell's time is the median over seeds (a seed that never reached the target
  counts as infinitely slow, so a majority must reach it).

  Returns:
    One dict per (σ, bandwidth, arm): ``sigma, bandwidth_GBps, arm, family,
    time_to_target`` (s, ``inf`` if not reached), ``reached`` (seeds),
    ``updates_to_target`` (median), ``comm_event_s``, ``compute_s``, ``winner``
    (the cell's fastest arm or ``None``), and ``ratio`` = one all-reduce / one mean
    gradient computation.
  """
  out = []
  smoke = bool(rows and rows[0].get("smoke"))
  wl = None  # the workload, built only for an arm priced by its shapes (compressed arms)
  for sigma in cfg.sigmas:
    for bw in cfg.bandwidths_GBps:
      setup = arms.setup_of(cfg, compute=cfg.compute_of(sigma), bandwidth_GBps=bw)
      cell = []
      for a in cfg.arms:
        arm = arms.get_arm(a)
        if arm.bind is not None:
          wl = wl or arms.get_workload(cfg.workload, smoke)
          arm = arms.bound(arm, wl)
        rs = [
          r for r in rows if r["arm"] == a and r["sigma"] == sigma and r["bandwidth_GBps"] == bw
        ]
        ts = [np.inf if r["time_to_target"] is None else r["time_to_target"] for r in rs]
        us = [r["updates_to_target"] for r in rs if r["updates_to_target"] is not None]
        cell.append(
          {
            "sigma": sigma,
            "bandwidth_GBps": bw,
            "arm": a,
            "family": arm.family,
            "time_to_target": float(np.median(ts)) if ts else float("inf"),
            "reached": f"{len(us)}/{len(rs)}",
            "updates_to_target": float(np.median(us)) if us else None,
            "comm_event_s": arm.comm_seconds(setup),
            "compute_s": cfg.compute_s,
            "ratio": arms.allreduce_seconds(setup) / cfg.compute_s,
          }
        )
      best = min(cell, key=lambda c: c["time_to_target"])
      winner = best["arm"] if np.isfinite(best["time_to_target"]) else None
      out += [{**c, "winner": winner} for c in cell]
  return out


# ------------------------------------------------------------------ outputs


def _write_outputs(
  out_dir: str | Path, md_name: str, parts: list[str], figs: dict[str, Any]
) -> list[Path]:
  """Writes ``md_name`` (``parts`` separated by blank lines) and each figure as
  ``<name>.png`` under ``out_dir`` (created); returns the paths written."""
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  md = out_dir / md_name
  md.write_text("\n\n".join(parts) + "\n")
  return [md, *(figures.save(f, out_dir / f"{name}.png") for name, f in figs.items())]


def write_staleness_outputs(rows: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
  """Writes ``table_a.md`` and ``staleness_curves.png`` from Table A's rows."""
  return _write_outputs(
    out_dir,
    "table_a.md",
    ["# Table A: staleness sweep", tables.staleness_table(rows)],
    {"staleness_curves": figures.staleness_figure(rows)},
  )


def write_straggler_outputs(rows: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
  """Writes ``table_b.md`` and the straggler figures from Table B's rows."""
  parts = ["# Table B: straggler sweep", tables.straggler_table(rows)]
  parts += ["## Time to target vs N", tables.time_to_target_vs_n_table(rows)]
  return _write_outputs(out_dir, "table_b.md", parts, figures.straggler_figures(rows))


def table_c_markdown(rows: list[dict[str, Any]], cfg) -> str:
  """``table_c.md``'s text from Table C's rows (with a section on the compressed arms next
  to sync when there are any); ``cfg``: the scenario (a :class:`TableCConfig`, or any
  object with its fields, e.g. read back from a row)."""
  title = "# Table C: every arm × workload on one time model"
  parts = [title, tables.setup_line(cfg), tables.table_c(rows)]
  if any("compression" in r for r in rows):
    parts += [
      "## Compressed all-reduce next to sync",
      "Bytes are what all workers put on the wire per training sample (scales, P and Q,"
      " values and indices included); the codecs' compute is not priced.",
      tables.compression_table(rows),
    ]
  return "\n\n".join(parts) + "\n"


def write_table_c_outputs(
  rows: list[dict[str, Any]], cfg: TableCConfig, out_dir: str | Path
) -> list[Path]:
  """Writes ``table_c.md`` (:func:`table_c_markdown`) and ``table_c_curves.png`` from
  Table C's rows."""
  return _write_text_and_figures(
    out_dir, "table_c.md", table_c_markdown(rows, cfg),
    {"table_c_curves": figures.table_c_figure(rows)},
  )  # fmt: skip


def _write_text_and_figures(
  out_dir: str | Path, md_name: str, text: str, figs: dict[str, Any]
) -> list[Path]:
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  md = out_dir / md_name
  md.write_text(text)
  return [md, *(figures.save(f, out_dir / f"{name}.png") for name, f in figs.items())]


def phase_markdown(cells: list[dict[str, Any]], cfg) -> str:
  """``phase.md``'s text from the phase diagram's cells (:func:`phase_cells`); ``cfg``:
  the scenario (a :class:`PhaseConfig`, or any object with its fields and ``sigmas``)."""
  title = "# Phase diagram: fastest arm to the target"
  parts = [title, tables.setup_line(cfg), tables.phase_table(cells), tables.phase_boundary(cells)]
  return "\n\n".join(parts) + "\n"


def write_phase_outputs(
  cells: list[dict[str, Any]], cfg: PhaseConfig, out_dir: str | Path
) -> list[Path]:
  """Writes ``phase_cells.jsonl`` (derived, overwritten), ``phase.md`` and ``phase.png``."""

  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  cells_path = out_dir / "phase_cells.jsonl"
  cells_path.write_text("".join(json.dumps(c) + "\n" for c in cells))
  return [
    cells_path,
    *_write_text_and_figures(
      out_dir, "phase.md", phase_markdown(cells, cfg), {"phase": figures.phase_figure(cells)}
    ),
  ]


_SCENARIO = ("workers", "batch_per_worker", "gradients", "compute", "compute_s", "speeds",
             "network", "algorithm", "model_params", "server_shards", "duplex")  # fmt: skip


def scenario_of(row: dict[str, Any], phase: bool = False) -> SimpleNamespace:
  """The scenario one table's rows share, read back from one of its rows, as
  :func:`tables.setup_line` reads a config (``phase``: σ per column, bandwidth per row).
  A row records the parameter count it priced; its key, the option (0: the real count)."""
  cfg = SimpleNamespace(**{k: row[k] for k in _SCENARIO})
  cfg.model_params = json.loads(row["key"]).get("model_params", row["model_params"])
  if phase:
    cfg.sigmas = ()
  else:
    cfg.bandwidth_GBps = row.get("bandwidth_GBps")
  return cfg


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
  """The rows of a JSON-lines file this module writes whole (``table_c.jsonl``,
  ``phase_cells.jsonl``), each with renamed fields upgraded (:func:`results.upgrade`)."""
  return [results.upgrade(json.loads(x)) for x in Path(path).read_text().splitlines() if x.strip()]


def tables_from_rows(root: str | Path) -> dict[str, str]:
  """``{path relative to root: text}``: every ``table_c.md`` and ``phase.md`` under
  ``root`` regenerated from the rows beside it (``table_c.jsonl``; ``phase_cells.jsonl``
  with the scenario from the ``phase_runs.jsonl`` beside it, else from a sibling
  ``phase_all/``'s, of which a ``phase/`` folder is a subset). No training runs."""
  root = Path(root)
  out = {}
  for path in sorted(root.rglob("table_c.jsonl")):
    rows = read_jsonl(path)
    out[str(path.with_suffix(".md").relative_to(root))] = table_c_markdown(
      rows, scenario_of(rows[0])
    )
  for path in sorted(root.rglob("phase_cells.jsonl")):
    runs = path.parent / "phase_runs.jsonl"
    if not runs.exists():
      runs = path.parent.parent / "phase_all" / "phase_runs.jsonl"
    with runs.open() as f:
      first = results.upgrade(json.loads(f.readline()))
    out[str(path.parent.relative_to(root) / "phase.md")] = phase_markdown(
      read_jsonl(path), scenario_of(first, phase=True)
    )
  return out
