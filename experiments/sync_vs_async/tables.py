"""Sync vs async: the study's tables from its committed rows (no training here).

    python experiments/sync_vs_async/tables.py

Every ``table_c.md`` and ``phase.md`` under ``rows/`` regenerated from the rows beside it
(:func:`allreduce_jax.training.experiments.tables_from_rows`). The rows are measured by
``allreduce-jax train table-c`` and ``allreduce-jax train phase`` (see the README).
"""

from __future__ import annotations

from pathlib import Path

from allreduce_jax import results
from allreduce_jax.training.experiments import tables_from_rows

HERE = Path(__file__).resolve().parent


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  """``{path relative to the study folder: text}`` of every table of this study."""
  rel = root.relative_to(HERE) if root.is_relative_to(HERE) else root
  return {str(rel / name): text for name, text in tables_from_rows(root).items()}


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
