"""Figures drawn from result rows; every function returns a matplotlib Figure.

Nothing forces a backend: in a notebook the figures display inline, in a script
:func:`save` writes them (matplotlib picks a non-interactive backend when there is
no display). Legends sit beside the panels, off the curves; :func:`save` keeps them
in the image. Each arm keeps one colour within a figure (:func:`arm_colors`).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.colors import ListedColormap

from allreduce_jax import cost_model, palette


def _plt():
  import matplotlib.pyplot as plt  # here: pyplot picks a backend when imported

  return plt


def save(fig, path: str | Path, dpi: int = 110) -> Path:
  """Writes ``fig`` to ``path`` (folders created) and closes it."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.tight_layout()
  fig.savefig(path, dpi=dpi, bbox_inches="tight")  # the legends beside the panels kept
  _plt().close(fig)
  return path


def arm_colors(arms) -> dict[str, str]:
  """One distinct colour per arm of a figure, in the order given (the palette's
  colours: a figure of up to 12 arms repeats none)."""
  return {a: palette.COLORS[k % len(palette.COLORS)] for k, a in enumerate(dict.fromkeys(arms))}


def _legend_beside(ax) -> None:
  """The legend right of ``ax``, outside it: never over a curve."""
  ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)


def _mean_curve(rs: list[dict[str, Any]], x_field: str, y_field: str = "test_acc"):
  n = min(len(r[y_field]) for r in rs)
  x = np.mean([r[x_field][:n] for r in rs], axis=0)
  y = np.mean([r[y_field][:n] for r in rs], axis=0)
  return x, y


def staleness_figure(rows: list[dict[str, Any]]):
  """Test accuracy vs updates, one panel per τ > 0, one line per method (seed mean)."""
  plt = _plt()
  taus = sorted({r["tau"] for r in rows if r["tau"] > 0}) or [0]
  fig, axes = plt.subplots(1, len(taus), figsize=(3.2 * len(taus), 3), sharey=True, squeeze=False)
  sync = [r for r in rows if r["method"] == "sync"]
  color = arm_colors(r["method"] for r in rows if r["method"] != "sync")
  for ax, tau in zip(axes[0], taus):
    if sync:
      ax.plot(*_mean_curve(sync, "eval_updates"), "k--", label="sync (τ=0)")
    for method in dict.fromkeys(r["method"] for r in rows if r["method"] != "sync"):
      rs = [r for r in rows if r["method"] == method and r["tau"] == tau]
      if rs:
        ax.plot(*_mean_curve(rs, "eval_updates"), label=method, color=color[method])
    ax.set_title(f"τ = {tau}")
    ax.set_xlabel("updates")
    ax.set_ylim(0, 1)
  axes[0][0].set_ylabel("test accuracy")
  _legend_beside(axes[0][-1])
  return fig


def straggler_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
  """Table B's figures by name: accuracy vs simulated time and vs gradients per
  compute model, staleness histograms of plain async, and time to target vs N."""
  plt = _plt()
  n_main = max(r["n"] for r in rows)
  main = [r for r in rows if r["n"] == n_main]
  computes = list(dict.fromkeys(r["compute"] for r in main))
  color = arm_colors(r["arm"] for r in rows)
  figs = {}
  fig, axes = plt.subplots(2, len(computes), figsize=(3.2 * len(computes), 5.6), squeeze=False)
  for j, c in enumerate(computes):
    groups = defaultdict(list)
    for r in main:
      if r["compute"] == c:
        groups[r["arm"]].append(r)
    for arm, rs in groups.items():
      axes[0][j].plot(*_mean_curve(rs, "eval_time"), label=arm, color=color[arm])
      x, y = _mean_curve(rs, "eval_updates")
      axes[1][j].plot(x * rs[0]["gradients_per_update"], y, label=arm, color=color[arm])
    axes[1][j].set_xlim(0, 0.5 * axes[1][j].get_xlim()[1])
    reached = [r["time_to_target"] for r in main if r["compute"] == c and r["time_to_target"]]
    if reached:  # zoom on the part where the arms differ
      axes[0][j].set_xlim(0, 3 * max(reached))
    axes[0][j].set_title(f"{c}, N={n_main}")
    axes[0][j].set_xlabel("simulated time (mean-compute units)")
    axes[1][j].set_xlabel("gradients computed")
    for i in (0, 1):
      axes[i][j].set_ylim(0, 1)
  axes[0][0].set_ylabel("test accuracy")
  axes[1][0].set_ylabel("test accuracy")
  _legend_beside(axes[0][-1])
  figs["stragglers_accuracy"] = fig

  fig, axes = plt.subplots(1, len(computes), figsize=(3.2 * len(computes), 3), squeeze=False)
  for ax, c in zip(axes[0], computes):
    rs = [r for r in main if r["compute"] == c and r["arm"] == "async"]
    if rs:
      h = np.sum([r["staleness_hist"] for r in rs], axis=0)
      ax.bar(np.arange(h.size), h, width=1.0)
      ax.set_yscale("log")
    ax.set_title(f"{c}: async τ")
    ax.set_xlabel("staleness τ")
  figs["staleness_histograms"] = fig

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
      ax.plot(xs, ys, "o-", label=arm, color=color[arm])
    ax.set_xlabel("workers N")
    ax.set_ylabel("simulated time to target (mean-compute units)")
    ax.set_title("exponential compute times")
    _legend_beside(ax)
    figs["time_to_target_vs_n"] = fig
  return figs


_STYLE = {"sync": "-", "ps": "--", "local": "-.", "gossip": ":"}


def workload_panels(rows: list[dict[str, Any]]):
  """Table C's layout: one panel per workload, titled with it and its target drawn as a
  grey line. Returns ``(fig, panels)``, ``panels`` a list of ``(ax, workload_rows,
  {arm: that arm's rows})`` in first-seen order."""
  plt = _plt()
  workloads = list(dict.fromkeys(r["workload"] for r in rows))
  fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 3.8), squeeze=False)
  panels = []
  for ax, w in zip(axes[0], workloads):
    rs_w = [r for r in rows if r["workload"] == w]
    by_arm = {a: [r for r in rs_w if r["arm"] == a] for a in dict.fromkeys(r["arm"] for r in rs_w)}
    ax.axhline(rs_w[0]["target"], color="0.5", lw=0.8)
    ax.set_title(w)
    panels.append((ax, rs_w, by_arm))
  return fig, panels


def table_c_figure(rows: list[dict[str, Any]]):
  """Test metric vs simulated seconds (compute + communication), one panel per
  workload, one line per arm (seed mean), the target as a grey line."""
  fig, panels = workload_panels(rows)
  color = arm_colors(r["arm"] for r in rows)
  for ax, rs_w, by_arm in panels:
    for arm, rs in by_arm.items():
      x, y = _mean_curve(rs, "eval_time", "test_metric")
      ax.plot(x, y, _STYLE.get(rs[0]["family"], "-"), label=arm, color=color[arm])
    reached = [r["time_to_target"] for r in rs_w if r["time_to_target"] is not None]
    if reached:
      ax.set_xlim(0, 2.5 * float(np.median(reached)))
    ax.set_xlabel("simulated time (s): compute + communication")
    ax.set_ylabel(f"test {rs_w[0]['metric']}")
    ax.grid(True, alpha=0.3)
  _legend_beside(panels[-1][0])
  return fig


def phase_figure(cells: list[dict[str, Any]]):
  """The phase diagram: fastest arm to the target by straggler heaviness (σ, x) and
  link bandwidth (y, log), coloured by arm; dashed lines mark the network presets."""

  plt = _plt()
  sigmas = sorted({c["sigma"] for c in cells})
  bws = sorted({c["bandwidth_GBps"] for c in cells})
  arms = list(dict.fromkeys(c["arm"] for c in cells))
  winners = {(c["sigma"], c["bandwidth_GBps"]): c["winner"] for c in cells}
  grid = np.full((len(bws), len(sigmas)), np.nan)
  for i, bw in enumerate(bws):
    for j, s in enumerate(sigmas):
      w = winners.get((s, bw))
      if w is not None:
        grid[i, j] = arms.index(w)
  colors = plt.get_cmap("tab10").colors
  cmap = ListedColormap([colors[k % 10] for k in range(len(arms))])
  fig, ax = plt.subplots(figsize=(6.4, 4.6))
  ax.pcolormesh(
    np.arange(len(sigmas) + 1) - 0.5,
    np.arange(len(bws) + 1) - 0.5,
    grid,
    cmap=cmap,
    vmin=-0.5,
    vmax=len(arms) - 0.5,
  )
  for i, bw in enumerate(bws):
    for j, s in enumerate(sigmas):
      here = [c for c in cells if c["sigma"] == s and c["bandwidth_GBps"] == bw]
      best = min(here, key=lambda c: c["time_to_target"])
      if np.isfinite(best["time_to_target"]):
        ax.text(j, i, f"{best['time_to_target']:.2g}s", ha="center", va="center", fontsize=7)
  ax.set_xticks(range(len(sigmas)), [f"{s:g}" for s in sigmas])
  ax.set_yticks(range(len(bws)), [f"{b:g}" for b in bws])
  for name in ("10gbe", "100gbe", "ib_ndr", "nvlink4"):
    bw = 1e-9 / cost_model.PRESETS[name].beta
    if bws[0] <= bw <= bws[-1]:
      y = np.interp(np.log(bw), np.log(bws), np.arange(len(bws)))
      ax.axhline(y, color="k", ls="--", lw=0.7)
      ax.text(len(sigmas) - 0.45, y, name, fontsize=7, va="bottom", ha="right")
  handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(k)) for k in range(len(arms))]
  ax.legend(handles, arms, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
  ax.set_xlabel("straggler heaviness: log-normal σ of the compute times")
  ax.set_ylabel("link bandwidth (GB/s)")
  p = cells[0]
  ax.set_title(
    f"fastest arm to the target (time in cell); compute {p['compute_s']:g} s / gradient",
    fontsize=9,
  )
  return fig
