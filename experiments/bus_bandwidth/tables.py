"""Bus bandwidth against XLA's own all-reduce: the study's tables from its committed rows.

    python experiments/bus_bandwidth/tables.py

Reads ``rows/headline16_run*.jsonl`` (the ring and ``psum`` at 16 MiB), the three size
sweeps of ``../latency_vs_bandwidth/rows/sweep_run*.jsonl`` (their 16 MiB rows) and
``rows/bench8_run*.jsonl`` (the algorithms large clusters use, 1 KiB-16 MiB); writes
``tables.md`` beside this script. Each cell: busbw of one algorithm over another's in
the same run (the same bytes, so the inverse of their time ratio), the median over runs
[min–max]. No measurement here.
"""

from __future__ import annotations

import json
from pathlib import Path

from allreduce_jax import results
from allreduce_jax.units import format_bytes, spread

HERE = Path(__file__).resolve().parent
PAIRS = (
  ("double_binary_tree", "tree"),
  ("swing", "halving_doubling"),
  ("halving_doubling_near", "halving_doubling"),
  ("double_binary_tree", "psum"),
  ("swing", "psum"),
)


def _times(path: Path) -> dict:
  """``(algorithm, bytes) -> seconds`` of one run's correct rows."""
  rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
  return {(r["algorithm"], r["bytes"]): r["time_us"] for r in rows if r.get("wrong") == 0}


def ring_over_psum(root: Path = HERE / "rows") -> list[float]:
  """The ring's busbw over ``psum``'s at 16 MiB, one value per run (headline runs first)."""
  runs = sorted(root.glob("headline16_run*.jsonl"))
  runs += sorted((root.parent.parent / "latency_vs_bandwidth" / "rows").glob("sweep_run*.jsonl"))
  n = 16 << 20
  return [t[("psum", n)] / t[("ring", n)] for t in map(_times, runs)]


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  """``{path relative to the study folder: text}``."""
  ratios = ring_over_psum(root)
  lines = [
    "# Bus bandwidth against psum (tables from the committed rows)",
    "",
    "## The ring's busbw / psum's at 16 MiB, 8 emulated CPU devices",
    "",
    f"{len(ratios)} runs (3 of `bench --algorithms ring,psum -b 16MiB -e 16MiB`, then the 16 MiB"
    " rows of the 3 size sweeps in ../latency_vs_bandwidth): "
    + ", ".join(f"{r:.2f}" for r in ratios)
    + f"; median [min–max] {spread(ratios)}.",
    "",
    "## The algorithms large clusters use: busbw ratios per size (3 runs)",
    "",
    "| per participant | " + " | ".join(f"{a} / {b}" for a, b in PAIRS) + " |",
    "|---|" + "---|" * len(PAIRS),
  ]
  runs = [_times(p) for p in sorted(root.glob("bench8_run*.jsonl"))]
  for n in sorted({n for t in runs for _, n in t}):
    cells = [spread([t[(b, n)] / t[(a, n)] for t in runs]) for a, b in PAIRS]
    lines.append(f"| {format_bytes(n)} | " + " | ".join(cells) + " |")
  return {"tables.md": "\n".join(lines) + "\n"}


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
