"""Latency vs bandwidth: the study's tables from its committed rows (no measurement here).

    python experiments/latency_vs_bandwidth/tables.py

Reads ``rows/`` beside this script and writes ``tables.md``:

- the ring against recursive doubling and ``psum`` in three size sweeps
  (``sweep_run*.jsonl``: 8 emulated CPU devices, 1 KiB-16 MiB);
- the α-β-γ fit refitted from its rows (``cost_model.fit_all``) beside the parameters
  shipped or saved from them: the CPU defaults (``cpu_fit_bench.jsonl`` →
  ``cost_model.backend_params("cpu")``) and the 4-process gloo fit (``gloo4_fit.jsonl`` →
  ``gloo4_cost_params.json``);
- ``auto`` with a gloo fit against ``psum`` across 4 processes (``gloo4_auto*.jsonl``).
"""

from __future__ import annotations

import json
from pathlib import Path

from allreduce_jax import cost_model, results
from allreduce_jax.units import format_bytes, spread

HERE = Path(__file__).resolve().parent


def _rows(path: Path) -> list[dict]:
  rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
  return [r for r in rows if r.get("wrong") == 0]


def _times(rows: list[dict]) -> dict:
  return {(r["algorithm"], r["bytes"]): r["time_us"] for r in rows}


def sweep_table(root: Path) -> list[str]:
  runs = [_times(_rows(p)) for p in sorted(root.glob("sweep_run*.jsonl"))]
  lines = [
    f"## The ring against recursive doubling and psum ({len(runs)} sweeps, 8 devices)",
    "",
    "Time of the ring / time of recursive doubling (> 1: the ring is slower; 14 message"
    " steps against 3), and the ring's busbw / psum's; median over sweeps [min–max].",
    "",
    "| per participant | ring / recursive_doubling (time) | ring / psum (busbw) |",
    "|---|---|---|",
  ]
  for n in sorted({n for t in runs for _, n in t}):
    rd = [t[("ring", n)] / t[("recursive_doubling", n)] for t in runs]
    ps = [t[("psum", n)] / t[("ring", n)] for t in runs]
    lines.append(f"| {format_bytes(n)} | {spread(rd)} | {spread(ps)} |")
  return [*lines, ""]


def _fit(rows: list[dict]):
  """``cost_model.fit_all`` of the rows, every schedule priced as it ran: the rows traced on
  CPU with the shipped CPU parameters, which chose e.g. the double binary tree's chunks."""
  sample = [(r["algorithm"], r["n_devices"], r["bytes"], r["time_us"] * 1e-6) for r in rows]
  with cost_model.use_params(cost_model.backend_params("cpu")):
    return cost_model.fit_all(sample)


def _param_cells(q) -> str:
  return f"{q.alpha * 1e6:.1f} | {q.beta * 1e9:.4f} | {q.gamma * 1e9:.4f}"


def fit_table(title: str, rows: list[dict], saved) -> list[str]:
  """The fit refitted from ``rows`` beside ``saved`` (a ``FittedParams``), per algorithm."""
  refit = _fit(rows)
  lines = [
    f"## {title}",
    "",
    "α in µs per step, β and γ in ns per byte; refitted from the rows, then as shipped/saved.",
    "",
    "| fit | α | β | γ | saved α | saved β | saved γ |",
    "|---|---|---|---|---|---|---|",
    f"| shared | {_param_cells(refit.shared)} | {_param_cells(saved.shared)} |",
  ]
  for a in sorted(refit.per_algorithm):
    have = saved.per_algorithm.get(a)
    lines.append(
      f"| {a} | {_param_cells(refit.per_algorithm[a])} | "
      + (_param_cells(have) if have else "— | — | —")
      + " |"
    )
  return [*lines, ""]


def auto_table(root: Path) -> list[str]:
  lines = [
    "## auto with a gloo fit against psum (4 processes, 1 device each)",
    "",
    "auto's busbw / psum's per size and the algorithm auto chose; `gloo4_auto`: the fit on"
    " 4 KiB-64 MiB (`gloo4_cost_params.json`), `fit1to64`: the fit on 1-64 MiB only"
    " (`gloo4_cost_params_1to64MiB.json`), `order2`: the same run again in another order.",
    "",
    "| rows | " + " | ".join(format_bytes(1 << k) for k in (20, 22, 24, 26)) + " |",
    "|---|---|---|---|---|",
  ]
  for path in sorted(root.glob("gloo4_auto*.jsonl")):
    rows = _rows(path)
    t = _times(rows)
    chose = {r["bytes"]: r.get("chosen") for r in rows if r["algorithm"] == "auto"}
    cells = [
      f"{t[('psum', n)] / t[('auto', n)]:.2f} ({chose[n]})" if ("auto", n) in t else "—"
      for n in (1 << 20, 1 << 22, 1 << 24, 1 << 26)
    ]
    lines.append(f"| {path.stem} | " + " | ".join(cells) + " |")
  best = []
  fit_rows = _times(_rows(root / "gloo4_fit.jsonl"))
  for n in sorted({n for _, n in fit_rows if n >= 1 << 20}):
    ours = {a: t for (a, m), t in fit_rows.items() if m == n and a != "psum"}
    a = min(ours, key=ours.get)
    best.append(f"{format_bytes(n)} {fit_rows[('psum', n)] / ours[a]:.2f} ({a})")
  return [*lines, "", "Best hand-written algorithm's busbw / psum's in `gloo4_fit.jsonl`: "
          + ", ".join(best) + ".", ""]  # fmt: skip


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  """``{path relative to the study folder: text}``."""
  lines = ["# Latency vs bandwidth (tables from the committed rows)", ""]
  lines += sweep_table(root)
  lines += fit_table(
    'The shipped CPU fit (`cost_model.backend_params("cpu")`) from `cpu_fit_bench.jsonl`',
    _rows(root / "cpu_fit_bench.jsonl"),
    cost_model.backend_params("cpu"),
  )
  lines += fit_table(
    "The gloo fit (`gloo4_cost_params.json`) from `gloo4_fit.jsonl`",
    _rows(root / "gloo4_fit.jsonl"),
    cost_model.load_params(root / "gloo4_cost_params.json"),
  )
  lines += auto_table(root)
  return {"tables.md": "\n".join(lines)}


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
