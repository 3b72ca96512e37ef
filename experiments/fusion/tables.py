"""Tensor fusion: the study's table from its committed rows (no measurement here).

    python experiments/fusion/tables.py

Reads ``rows/fusion.jsonl`` (``allreduce-jax fusion``: a model's gradient pytree
all-reduced with ``all_reduce_tree`` one call per leaf, then packed into buckets of
64 KiB to 25 MiB, then one bucket) and writes ``tables.md``: per model and algorithm,
each setting's time and how many times faster than one call per leaf; then the gain of
one bucket over one call per leaf in each of the committed runs (``rows/fusion_run*.jsonl``
and ``rows/fusion.jsonl``), as median [min–max].
"""

from __future__ import annotations

import json
from pathlib import Path

from allreduce_jax import results
from allreduce_jax.units import spread

HERE = Path(__file__).resolve().parent


def _read(path: Path) -> list[dict]:
  rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
  return [r for r in rows if r.get("wrong") == 0]


def _gain(rows: list[dict], model: str, alg: str) -> float:
  """One call per leaf's time over one bucket's."""
  t = {r["bucket"]: r["time_us"] for r in rows if r["model"] == model and r["algorithm"] == alg}
  return t["per-leaf"] / t["one"]


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  """``{path relative to the study folder: text}``."""
  rows = _read(root / "fusion.jsonl")
  buckets = list(dict.fromkeys(r["bucket"] for r in rows))
  lines = [
    "# Tensor fusion (tables from the committed rows)",
    "",
    f"{rows[0]['n_devices']} emulated CPU devices; each cell: ms per all-reduce of the whole"
    " gradient (median of the timed calls), then per leaf's time / this one.",
    "",
    "| model (leaves, bytes) | algorithm | " + " | ".join(buckets) + " |",
    "|---|---|" + "---|" * len(buckets),
  ]
  for model in dict.fromkeys(r["model"] for r in rows):
    for alg in dict.fromkeys(r["algorithm"] for r in rows if r["model"] == model):
      t = {r["bucket"]: r for r in rows if r["model"] == model and r["algorithm"] == alg}
      base = t["per-leaf"]["time_us"]
      cells = [
        f"{t[b]['time_us'] / 1e3:.1f} ({base / t[b]['time_us']:.1f}×)" if b in t else "—"
        for b in buckets
      ]
      r0 = t["per-leaf"]
      lines.append(
        f"| {model} ({r0['n_leaves']}, {r0['bytes']:,}) | {alg} | " + " | ".join(cells) + " |"
      )
  runs = [_read(p) for p in sorted(root.glob("fusion_run*.jsonl"))] + [rows]
  lines += [
    "",
    f"One bucket against one call per leaf over the {len(runs)} committed runs"
    " (`fusion_run*.jsonl`, then `fusion.jsonl`): median [min–max].",
    "",
    "| model | algorithm | gain per run | median [min–max] |",
    "|---|---|---|---|",
  ]
  for model in dict.fromkeys(r["model"] for r in rows):
    for alg in dict.fromkeys(r["algorithm"] for r in rows if r["model"] == model):
      g = [_gain(run, model, alg) for run in runs]
      lines.append(
        f"| {model} | {alg} | "
        + ", ".join(f"{x:.1f}×" for x in g)
        + f" | {spread(g, '.1f', unit='×')} |"
      )
  return {"tables.md": "\n".join(lines) + "\n"}


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
