"""time_vs_model.png and each blocks file's figure, from rows/ (no measurement here).

    python experiments/emulated_network/figures.py

``time_vs_model.png``: the first round-robin sweep's measured seconds against the
half-duplex replay (α fitted per network on its 4 and 64 KiB rows), one panel per network.
``rows/**/blocks_*.png``: each blocks file drawn from all its rows (``bench`` draws only one
run's rows), dashed: the α-β-γ model fitted on its rows from 1 MiB (as ``bench --fit
--fit-min-bytes 1MiB`` would).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from allreduce_jax import cluster_rows, cost_model, gloo_model, results
from allreduce_jax.tools import plot

HERE = Path(__file__).resolve().parent
NETS = (("switch", 4), ("switch", 8), ("fat_tree:4:2", 8), ("torus:8", 8))


def model_cells(root: Path) -> list[dict]:
  """Every round-robin cell ≥ 1 MiB beside its replay (``cluster_rows.replay_cell``)."""
  cells = []
  for net, p in NETS:
    rows = cluster_rows.bench_rows(root / f"bench_{net.replace(':', '_')}_{p}.jsonl")
    if not rows:
      continue
    rate = cluster_rows.link_rate(rows)
    alpha = {d: cluster_rows.fit_alpha(rows, p, net, d) for d in ("half", "full")}
    for (a, n), t in {(r["algorithm"], r["bytes"]): r["time_us"] * 1e-6 for r in rows}.items():
      if n >= 1 << 20:
        cells.append(cluster_rows.replay_cell(a, p, n, net, t, alpha, rate))
  return cells


def time_vs_model(cells: list[dict]) -> Figure:
  """One panel per network: each algorithm measured (line) and replayed (dots)."""
  nets = list(dict.fromkeys((s["network"], s["p"]) for s in cells))
  fig = Figure(figsize=(4.2 * len(nets), 3.6))
  axes = fig.subplots(1, len(nets), squeeze=False)[0]
  for ax, (net, p) in zip(axes, nets):
    mine = [s for s in cells if s["network"] == net and s["p"] == p]
    for a in dict.fromkeys(s["algorithm"] for s in mine):
      rs = sorted((s for s in mine if s["algorithm"] == a), key=lambda s: s["bytes"])
      x = [s["bytes"] / 2**20 for s in rs]
      (line,) = ax.plot(x, [s["measured_s"] for s in rs], "o-", ms=3, label=a)
      ax.plot(x, [s["model_half_s"] for s in rs], ":", color=line.get_color())
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("MiB per participant")
    ax.set_title(f"{net}, {p} hosts (dots: model)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
  axes[0].set_ylabel("seconds (measured, median of 3)")
  axes[0].legend(fontsize=6)
  fig.tight_layout()
  return fig


def blocks_figure(path: Path) -> Figure | None:
  """One blocks file's rows, the α-β-γ model fitted on them from 1 MiB dashed."""
  rows = cluster_rows.bench_rows(path)
  sample = [(r["algorithm"], r["n_devices"], r["bytes"], r["time_us"] * 1e-6)
            for r in rows if r["bytes"] >= 1 << 20]  # fmt: skip
  return plot.bench(rows, cost_model.fit_all(sample), title=f"{path.parent.name}/{path.stem}")


def draw(root: Path = HERE / "rows") -> None:
  paths = sorted([*root.rglob("bench_*.jsonl"), *root.rglob("blocks_*.jsonl")])
  traced = gloo_model.traced_params(r for path in paths for r in results.read_rows(path, "bench"))
  with cost_model.use_params(traced):
    plot.save(time_vs_model(model_cells(root)), HERE / "time_vs_model.png")
  for path in sorted(root.glob("blocks_*.jsonl")) + sorted(
    root.glob("tcp_queue_16k/**/blocks_*.jsonl")
  ):
    if (fig := blocks_figure(path)) is not None:
      plot.save(fig, path.with_suffix(".png"))


if __name__ == "__main__":
  draw()
