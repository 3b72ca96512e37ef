"""Tensor fusion: the study's table from its committed rows (no measurement here).

    python experiments/fusion/tables.py

Reads ``rows/fusion.jsonl`` (``allreduce-jax fusion``: a model's gradient pytree
all-reduced with ``all_reduce_tree`` one call per leaf, then packed into buckets of
64 KiB to 25 MiB, then one bucket) and writes ``tables.md``: per model and algorithm,
each setting's time and how many times faster than one call per leaf.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  """``{path relative to the study folder: text}``."""
  rows = [json.loads(x) for x in (root / "fusion.jsonl").read_text().splitlines() if x.strip()]
  rows = [r for r in rows if r.get("wrong") == 0]
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
  return {"tables.md": "\n".join(lines) + "\n"}


def main(argv=None) -> int:
  for name, text in tables().items():
    (HERE / name).write_text(text)
    print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
