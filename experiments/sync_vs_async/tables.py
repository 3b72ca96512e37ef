"""Sync vs async: the study's tables from its committed rows (no training here).

    python experiments/sync_vs_async/tables.py [ROWS]

Every ``table_c.jsonl`` under ``ROWS`` (default ``rows/`` beside this script) gives its
``table_c.md`` (:func:`allreduce_jax.training.experiments.table_c_markdown`, the scenario
read back from the rows), every ``phase_cells.jsonl`` its ``phase.md``
(:func:`~allreduce_jax.training.experiments.phase_markdown`, the scenario read from the
``phase_runs.jsonl`` beside it, else from ``phase_all/``'s: ``phase/`` is its five-arm
subset). The same function serves the compression study's training rows. Rows are
measured by ``allreduce-jax train table-c`` and ``train phase`` (see the README).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

from allreduce_jax import results
from allreduce_jax.training import experiments as training

HERE = Path(__file__).resolve().parent
SCENARIO = ("workers", "batch_per_worker", "gradients", "compute", "compute_s", "speeds",
            "network", "algorithm", "model_params", "server_shards", "duplex")  # fmt: skip


def _rows(path: Path) -> list[dict]:
  return [results.upgrade(json.loads(x)) for x in path.read_text().splitlines() if x.strip()]


def scenario(row: dict, phase: bool = False) -> SimpleNamespace:
  """The settings every row of one table shares, as ``tables.setup_line`` reads them."""
  cfg = SimpleNamespace(**{k: row[k] for k in SCENARIO})
  # a row records the count it priced; its key, the option (0: the model's real count)
  cfg.model_params = json.loads(row["key"]).get("model_params", row["model_params"])
  if phase:
    cfg.sigmas = ()  # the phase diagram: σ per column, bandwidth per row
  else:
    cfg.bandwidth_GBps = row.get("bandwidth_GBps")
  return cfg


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  """``{path relative to root: text}`` of every table under ``root`` from its rows."""
  out = {}
  for path in sorted(root.rglob("table_c.jsonl")):
    rows = _rows(path)
    out[str(path.with_suffix(".md").relative_to(root))] = training.table_c_markdown(
      rows, scenario(rows[0])
    )
  for path in sorted(root.rglob("phase_cells.jsonl")):
    runs = path.parent / "phase_runs.jsonl"
    if not runs.exists():
      runs = path.parent.parent / "phase_all" / "phase_runs.jsonl"
    with runs.open() as f:
      first = results.upgrade(json.loads(f.readline()))
    out[str(path.parent.relative_to(root) / "phase.md")] = training.phase_markdown(
      _rows(path), scenario(first, phase=True)
    )
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("rows", nargs="?", type=Path, default=HERE / "rows", help="the rows' folder")
  args = ap.parse_args(argv)
  for name, text in tables(args.rows).items():
    (args.rows / name).write_text(text)
    print(f"wrote {args.rows / name}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
