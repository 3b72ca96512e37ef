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
communication priced by the cost model for every arm (:mod:`.arms`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from allreduce_jax import devices
from allreduce_jax.cost_model import predict_us
from allreduce_jax.devices import inner_size
from allreduce_jax.training import arms, async_sim, data, figures, models, sync, tables
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
    data=d,
    idx=idx,
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


def _param_bytes(params) -> int:
  return int(sum(np.asarray(a).nbytes for a in jax.tree.leaves(params)))


def _straggler_sync(cfg, d, compiled, model, seed: int, n: int, compute: str, backups: int):
  """One Table B run of ``sync`` (``backups=0``) or ``sync_b{b}``: the masked sync schedule
  in units of one mean gradient, the all-reduce priced by the cost model. Returns
  ``(eval times, row fields)``."""
  graphdef, params, rest = model
  B, b = cfg.batch_per_worker, backups
  steps = max(1, cfg.sync_steps * cfg.workers // n)  # equal gradients at every N
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
  return times, {
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


def _straggler_async(cfg, d, compiled, model, seed: int, n: int, compute: str, arm: str):
  """One Table B run of the asynchronous method ``arm``: the event schedule (no
  communication charged), replayed on stale snapshots. Returns ``(eval times, row fields)``."""
  graphdef, params, rest = model
  B, K = cfg.batch_per_worker, cfg.max_staleness + 1
  steps = max(1, cfg.sync_steps * cfg.workers // n)  # equal gradients at every N
  async_tx = compiled.setdefault(
    "async_tx", models.make_optimizer(cfg.optimizer, cfg.async_lr, cfg.momentum)
  )
  evaluate = compiled["evaluate"]
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
  return times, {
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
  d = data.load_digits()
  compiled: dict[Any, Any] = {}
  for n, compute, arm, seed in cfg.runs():
    key = sweep.pending(cfg.run_fields(n, compute, arm, seed))
    if key is None:
      continue
    model = models.split(models.make_model(cfg.model, seed))
    if "evaluate" not in compiled:
      compiled["evaluate"] = sync.make_evaluator(model[0], model[2])
    t0 = time.perf_counter()
    row: dict[str, Any] = {"key": key, **cfg.run_fields(n, compute, arm, seed)}
    if arm.startswith("sync"):  # "sync" or "sync_b{b}" (StragglerConfig.runs names them)
      b = int(arm[len("sync_b") :]) if arm != "sync" else 0
      times, fields = _straggler_sync(cfg, d, compiled, model, seed, n, compute, b)
    else:
      times, fields = _straggler_async(cfg, d, compiled, model, seed, n, compute, arm)
    row |= fields
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
  for sigma in cfg.sigmas:
    for bw in cfg.bandwidths_GBps:
      setup = arms.setup_of(cfg, compute=cfg.compute_of(sigma), bandwidth_GBps=bw)
      cell = []
      for a in cfg.arms:
        arm = arms.get_arm(a)
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


def write_table_c_outputs(
  rows: list[dict[str, Any]], cfg: TableCConfig, out_dir: str | Path
) -> list[Path]:
  """Writes ``table_c.md`` and ``table_c_curves.png`` from Table C's rows."""
  title = "# Table C: every arm × workload on one time model"
  return _write_outputs(
    out_dir,
    "table_c.md",
    [title, tables.setup_line(cfg), tables.table_c(rows)],
    {"table_c_curves": figures.table_c_figure(rows)},
  )


def write_phase_outputs(
  cells: list[dict[str, Any]], cfg: PhaseConfig, out_dir: str | Path
) -> list[Path]:
  """Writes ``phase_cells.jsonl`` (derived, overwritten), ``phase.md`` and ``phase.png``."""

  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  cells_path = out_dir / "phase_cells.jsonl"
  cells_path.write_text("".join(json.dumps(c) + "\n" for c in cells))
  title = "# Phase diagram: fastest arm to the target"
  parts = [title, tables.setup_line(cfg), tables.phase_table(cells), tables.phase_boundary(cells)]
  return [
    cells_path,
    *_write_outputs(out_dir, "phase.md", parts, {"phase": figures.phase_figure(cells)}),
  ]
