"""The faults study's figure, ``slow_link.png`` from ``rows/``: each algorithm timed in blocks
on the 4-host switch with host 1's link slowed, in units of the bound n·k/B.

    python experiments/faults/figures.py   # writes slow_link.png
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from matplotlib.figure import Figure

from allreduce_jax import cluster_rows
from allreduce_jax.tools import faults

HERE = Path(__file__).resolve().parent
ROWS = HERE / "rows"


def figure(path: Path):
  """Each algorithm timed in blocks (as the answer's numbers) on the 4-host switch, 1 MiB per
  host, host 1's link at 1/2, 1/10 and 1/100: its time in units of the bound n·k/B (the
  median of its runs, a bar from the fastest to the slowest), one marker per slowdown."""
  n, inf = 2**20, math.inf
  rows = [r for r in cluster_rows.bench_rows(ROWS / "slow_link_alone.jsonl")
          if r.get("wrong") == 0 and r["iters"] != 6 and r["bytes"] == n
          and (net := cluster_rows.network(r))["network"] == "switch" and net["hosts"] == 4
          and not net.get("congestion_control")]  # fmt: skip
  rate = cluster_rows.link_rate(rows)
  runs: dict[tuple[str, int], list[float]] = {}
  for r in rows:
    k = cluster_rows.slowdown(r, faults.row_links)
    runs.setdefault((r["algorithm"], k), []).append(r["time_us"] * 1e-6 / (n * k / rate))
  ks = sorted({k for _, k in runs})
  by = max(ks[:-1] or ks)  # the order: by the time at 1/10
  algs = sorted({a for a, _ in runs}, key=lambda a: statistics.median(runs.get((a, by), [inf])))
  looks = {2: ("o", "#1f77b4"), 10: ("s", "#d62728"), 100: ("^", "#2ca02c")}
  fig = Figure(figsize=(6.4, 4.6))
  ax = fig.subplots()
  for j, k in enumerate(ks):
    marker, color = looks.get(k, ("D", "#7f7f7f"))
    ys = [i + (j - (len(ks) - 1) / 2) * 0.22 for i, a in enumerate(algs) if (a, k) in runs]
    got = [runs[a, k] for a in algs if (a, k) in runs]
    mid = [statistics.median(v) for v in got]
    err = [[m - min(v) for m, v in zip(mid, got)], [max(v) - m for m, v in zip(mid, got)]]
    counts = sorted({len(v) for v in got})
    ax.errorbar(mid, ys, xerr=err, fmt=marker, color=color, markersize=5, capsize=2,
                linewidth=1, label=f"link at 1/{k} ({'–'.join(map(str, counts))} run"
                f"{'s' if counts[-1] > 1 else ''} each)")  # fmt: skip
  ax.axvline(1.0, color="black", linestyle="--", linewidth=1, label="bound n·k/B")
  ax.set_yticks(range(len(algs)), algs, fontsize=8)
  ax.invert_yaxis()
  ax.set_xlabel("all-reduce time / (n·k/B): n = 1 MiB through the slow link at B/k")
  ax.set_xlim(left=0)
  ax.grid(axis="x", alpha=0.3)
  ax.set_title("One slow link, 4 hosts on a 200 Mbit/s switch, each algorithm in blocks",
               fontsize=10)  # fmt: skip
  ax.legend(fontsize=7, loc="lower left", framealpha=1)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  return fig


if __name__ == "__main__":
  figure(HERE / "slow_link.png")
