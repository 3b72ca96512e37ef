"""Figures drawn from result rows with matplotlib's Agg backend (no display needed)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np


def _plt():
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def _mean_curve(rs: list[dict[str, Any]], x_field: str) -> tuple[np.ndarray, np.ndarray]:
  n = min(len(r["test_acc"]) for r in rs)
  x = np.mean([r[x_field][:n] for r in rs], axis=0)
  y = np.mean([r["test_acc"][:n] for r in rs], axis=0)
  return x, y


def staleness_figure(rows: list[dict[str, Any]], path: str | Path) -> Path:
  """Test accuracy vs updates, one panel per τ > 0, one line per method (seed mean)."""
  plt = _plt()
  taus = sorted({r["tau"] for r in rows if r["tau"] > 0}) or [0]
  fig, axes = plt.subplots(1, len(taus), figsize=(3.2 * len(taus), 3), sharey=True, squeeze=False)
  sync = [r for r in rows if r["method"] == "sync"]
  for ax, tau in zip(axes[0], taus):
    if sync:
      ax.plot(*_mean_curve(sync, "eval_updates"), "k--", label="sync (τ=0)")
    for method in dict.fromkeys(r["method"] for r in rows if r["method"] != "sync"):
      rs = [r for r in rows if r["method"] == method and r["tau"] == tau]
      if rs:
        ax.plot(*_mean_curve(rs, "eval_updates"), label=method)
    ax.set_title(f"τ = {tau}")
    ax.set_xlabel("updates")
    ax.set_ylim(0, 1)
  axes[0][0].set_ylabel("test accuracy")
  axes[0][-1].legend(fontsize=7)
  return _save(fig, path)


def straggler_figures(rows: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
  """Accuracy vs simulated time and vs updates per compute model, staleness
  histograms of plain async, and time to target vs N."""
  plt = _plt()
  out_dir = Path(out_dir)
  n_main = max(r["n"] for r in rows)
  main = [r for r in rows if r["n"] == n_main]
  computes = list(dict.fromkeys(r["compute"] for r in main))
  paths = []
  fig, axes = plt.subplots(2, len(computes), figsize=(3.2 * len(computes), 5.6), squeeze=False)
  for j, c in enumerate(computes):
    groups = defaultdict(list)
    for r in main:
      if r["compute"] == c:
        groups[r["arm"]].append(r)
    for arm, rs in groups.items():
      axes[0][j].plot(*_mean_curve(rs, "eval_time"), label=arm)
      x, y = _mean_curve(rs, "eval_updates")
      axes[1][j].plot(x * rs[0]["gradients_per_update"], y, label=arm)
    axes[1][j].set_xlim(0, 0.5 * axes[1][j].get_xlim()[1])
    reached = [r["time_to_target"] for r in main if r["compute"] == c and r["time_to_target"]]
    if reached:  # zoom on the part where the arms differ
      axes[0][j].set_xlim(0, 3 * max(reached))
    axes[0][j].set_title(f"{c}, N={n_main}")
    axes[0][j].set_xlabel("simulated time")
    axes[1][j].set_xlabel("gradients computed (updates × per-update)")
    for i in (0, 1):
      axes[i][j].set_ylim(0, 1)
  axes[0][0].set_ylabel("test accuracy")
  axes[1][0].set_ylabel("test accuracy")
  axes[0][-1].legend(fontsize=7)
  paths.append(_save(fig, out_dir / "stragglers_accuracy.png"))

  fig, axes = plt.subplots(1, len(computes), figsize=(3.2 * len(computes), 3), squeeze=False)
  for ax, c in zip(axes[0], computes):
    rs = [r for r in main if r["compute"] == c and r["arm"] == "async"]
    if rs:
      h = np.sum([r["staleness_hist"] for r in rs], axis=0)
      ax.bar(np.arange(h.size), h, width=1.0)
      ax.set_yscale("log")
    ax.set_title(f"{c}: async τ")
    ax.set_xlabel("staleness τ")
  paths.append(_save(fig, out_dir / "staleness_histograms.png"))

  exp_rows = [r for r in rows if r["compute"] == "exponential"]
  ns = sorted({r["n"] for r in exp_rows})
  if len(ns) > 1:
    fig, ax = plt.subplots(figsize=(4, 3))
    for arm in dict.fromkeys(r["arm"] for r in exp_rows):
      xs, ys = [], []
      for n in ns:
        t = [r["time_to_target"] for r in exp_rows if r["n"] == n and r["arm"] == arm]
        t = [v for v in t if v is not None]
        if t:
          xs.append(n)
          ys.append(np.mean(t))
      ax.plot(xs, ys, "o-", label=arm)
    ax.set_xlabel("workers N")
    ax.set_ylabel("simulated time to target")
    ax.set_title("exponential compute times")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out_dir / "time_to_target_vs_n.png"))
  return paths


def _save(fig, path: str | Path) -> Path:
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  _plt().close(fig)
  return path
