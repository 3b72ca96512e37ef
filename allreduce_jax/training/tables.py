"""Markdown tables drawn from result rows (never from in-memory runs)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np


def _mean_std(xs: list[float]) -> str:
  a = np.asarray(xs, np.float64)
  return f"{a.mean():.4f} ± {a.std():.4f}" if a.size > 1 else f"{a.mean():.4f}"


def _reached(xs: list, fmt: str = "{:.0f}") -> str:
  got = [x for x in xs if x is not None]
  if not got:
    return f"not reached (0/{len(xs)})"
  s = fmt.format(float(np.mean(got)))
  return s if len(got) == len(xs) else f"{s} ({len(got)}/{len(xs)})"


def staleness_table(rows: list[dict[str, Any]]) -> str:
  """Table A: per (method, τ): final test accuracy, updates to target, diverged runs.

  Example:
    >>> rows = [dict(method="sync", tau=0, final_test_acc=0.9, updates_to_target=None,
    ...              diverged=False, target=0.95)]
    >>> print(staleness_table(rows).splitlines()[2])
    | sync | 0 | 0.9000 | not reached (0/1) | 0/1 |
  """
  if not rows:
    return "(no rows)"
  groups: dict[tuple[str, int], list] = defaultdict(list)
  for r in rows:
    groups[r["method"], r["tau"]].append(r)
  target = rows[0]["target"]
  lines = [
    f"| method | τ | final test acc (mean ± std) | updates to {target:.0%} | diverged |",
    "|---|---|---|---|---|",
  ]
  order = {"sync": 0, "async": 1, "async_eta_tau": 2, "dcasgd": 3}
  for (method, tau), rs in sorted(
    groups.items(), key=lambda kv: (kv[0][1], order.get(kv[0][0], 9))
  ):
    lines.append(
      f"| {method} | {tau} | {_mean_std([r['final_test_acc'] for r in rs])}"
      f" | {_reached([r['updates_to_target'] for r in rs])}"
      f" | {sum(r['diverged'] for r in rs)}/{len(rs)} |"
    )
  return "\n".join(lines)


def straggler_table(rows: list[dict[str, Any]], n: int | None = None) -> str:
  """Table B: per (compute model, arm) at ``n`` workers (default: the largest N)."""
  if not rows:
    return "(no rows)"
  n = n or max(r["n"] for r in rows)
  rows = [r for r in rows if r["n"] == n]
  groups: dict[tuple[str, str], list] = defaultdict(list)
  for r in rows:
    groups[r["compute"], r["arm"]].append(r)
  target = rows[0]["target"]
  lines = [
    f"N = {n} workers. Time in units of one mean gradient computation.",
    "",
    f"| compute | arm | time / update | mean τ | p95 τ | dropped | final test acc"
    f" | time to {target:.0%} | × sync |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  computes = list(dict.fromkeys(r["compute"] for r in rows))
  for c in computes:
    sync_t = [r["time_to_target"] for r in groups.get((c, "sync"), [])]
    sync_t = [t for t in sync_t if t is not None]
    for arm in dict.fromkeys(r["arm"] for r in rows if r["compute"] == c):
      rs = groups[c, arm]
      ttt = [r["time_to_target"] for r in rs]
      got = [t for t in ttt if t is not None]
      rel = f"{np.mean(got) / np.mean(sync_t):.2f}" if got and sync_t else "–"
      lines.append(
        f"| {c} | {arm} | {np.mean([r['time_per_update'] for r in rs]):.3f}"
        f" | {np.mean([r['staleness_mean'] for r in rs]):.2f}"
        f" | {np.mean([r['staleness_p95'] for r in rs]):.1f}"
        f" | {np.mean([r['dropped'] for r in rs]):.0f}"
        f" | {_mean_std([r['final_test_acc'] for r in rs])}"
        f" | {_reached(ttt, '{:.1f}')} | {rel} |"
      )
  return "\n".join(lines)


def time_to_target_vs_n_table(rows: list[dict[str, Any]], compute: str = "exponential") -> str:
  """Mean simulated time to target per (N, arm) for one compute model."""
  rows = [r for r in rows if r["compute"] == compute]
  if not rows:
    return "(no rows)"
  ns = sorted({r["n"] for r in rows})
  arms = list(dict.fromkeys(r["arm"] for r in rows))
  lines = [
    f"| arm ({compute}) | " + " | ".join(f"N={n}" for n in ns) + " |",
    "|---|" + "---|" * len(ns),
  ]
  for arm in arms:
    cells = []
    for n in ns:
      ttt = [r["time_to_target"] for r in rows if r["n"] == n and r["arm"] == arm]
      cells.append(_reached(ttt, "{:.1f}") if ttt else "–")
    lines.append(f"| {arm} | " + " | ".join(cells) + " |")
  return "\n".join(lines)
