"""The training step: the study's table from its committed rows (no measurement here).

    python experiments/training_step/tables.py

Reads ``rows/optax_route_timing.jsonl`` (``optax_route_timing.py``: one data-parallel
training step with the gradient all-reduced by ``all_reduce_gradients`` with the ring or
``psum``, or by ``lax.pmean``) and writes ``tables.md``: each route's time per step over
``all_reduce_gradients(psum)``'s in the same run, the median over runs [min–max].
"""

from __future__ import annotations

import statistics
from pathlib import Path

from allreduce_jax import results
from allreduce_jax.units import spread

HERE = Path(__file__).resolve().parent


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  """``{path relative to the study folder: text}``."""
  path = root / "optax_route_timing.jsonl"
  rows = results.read_rows(path, "route_timing")
  variants = list(dict.fromkeys(r["variant"] for r in rows))
  runs = [rows[i : i + len(variants)] for i in range(0, len(rows), len(variants))]
  r0 = rows[0]
  lines = [
    "# The training step's all-reduce route (tables from the committed rows)",
    "",
    f"{len(runs)} runs of {r0['trials']} trials × {r0['iters']} steps, {r0['devices']} emulated"
    f" devices, an MLP of {r0['params']:,} parameters. Time per step over"
    " `all_reduce_gradients(psum)`'s in the same run; median over runs [min–max].",
    "",
    "| route | ms per step (median run) | × psum route |",
    "|---|---|---|",
  ]
  for v in variants:
    ratio = [r["vs_psum"] for run in runs for r in run if r["variant"] == v]
    ms = statistics.median(r["time_us"] for r in rows if r["variant"] == v) / 1e3
    lines.append(f"| {v} | {ms:.2f} | {spread(ratio)} |")
  return {"tables.md": "\n".join(lines) + "\n"}


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
