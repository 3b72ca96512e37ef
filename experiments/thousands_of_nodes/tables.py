"""Thousands of nodes: the study's tables from its committed rows (no replay here).

    python experiments/thousands_of_nodes/tables.py

Reads the ``allreduce-jax scaling --topology`` rows in ``rows/`` (each algorithm's
schedule replayed on a network: its predicted time per participant count and size) and
writes ``tables.md`` beside this script: per file, network and size, the fastest
algorithm at the largest p, the ring's time over it, and the largest p where the ring is
still within 5 % of the fastest.
"""

from __future__ import annotations

import json
from pathlib import Path

from allreduce_jax import results
from allreduce_jax.units import format_bytes

HERE = Path(__file__).resolve().parent


def _rows(path: Path) -> list[dict]:
  return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def winners(rows: list[dict]) -> list[str]:
  lines = [
    "| network | per participant | largest p | fastest | its time (ms) | ring / fastest |"
    " ring within 5 % up to p |",
    "|---|---|---|---|---|---|---|",
  ]
  for sc in dict.fromkeys(r["scenario"] for r in rows):
    for n in sorted({r["bytes"] for r in rows if r["scenario"] == sc}):
      mine = [r for r in rows if r["scenario"] == sc and r["bytes"] == n]
      t = {(r["algorithm"], r["p"]): r["predicted_us"] for r in mine}
      ps = sorted({r["p"] for r in mine})
      best = {p: min((a for a, q in t if q == p), key=lambda a, p=p: t[(a, p)]) for p in ps}
      top = ps[-1]
      close = [p for p in ps if ("ring", p) in t and t[("ring", p)] <= 1.05 * t[(best[p], p)]]
      ring = f"{t[('ring', top)] / t[(best[top], top)]:.2f}" if ("ring", top) in t else "—"
      lines.append(
        f"| {sc} | {format_bytes(n)} | {top} | {best[top]} | {t[(best[top], top)] / 1e3:.3f} |"
        f" {ring} | {close[-1] if close else '—'} |"
      )
  return lines


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  """``{path relative to the study folder: text}``."""
  lines = ["# Thousands of nodes (tables from the committed rows)", ""]
  for path in sorted(root.glob("*.jsonl")):
    rows = _rows(path)
    link = rows[0].get("link")
    lines += [f"## `{path.name}` (link `{link}`)", "", *winners(rows), ""]
  return {"tables.md": "\n".join(lines)}


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
