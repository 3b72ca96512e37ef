"""Sync vs async: the study's tables from its committed rows (no training here).

    python experiments/sync_vs_async/tables.py

Every ``table_c.md`` and ``phase.md`` under ``rows/`` regenerated from the rows beside it
(:func:`allreduce_jax.training.experiments.tables_from_rows`), and ``boundary.md``: where
the phase diagram's sync and parameter-server arms stop winning, with and without the
overlapped sync arms. The rows are measured by ``allreduce-jax train table-c`` and
``allreduce-jax train phase`` (see the README).
"""

from __future__ import annotations

from pathlib import Path

from allreduce_jax import results
from allreduce_jax.training.experiments import read_jsonl, tables_from_rows

HERE = Path(__file__).resolve().parent

#: The phase diagram's families that are not periodic averaging (Local SGD, DiLoCo, gossip).
STEPWISE = ("sync", "ps")

BOUNDARY = """\
# Where sync and the parameter server stop winning, with the all-reduce overlapped

From `rows/phase_all/phase_cells.jsonl`: per σ, the largest all-reduce / compute (one
all-reduce of the parameters over one mean gradient computation) at which an arm that
exchanges every step (sync or the parameter server) reaches the target first, and the
fastest arm one bandwidth row slower. "Without": the overlapped sync arms ({ov}) left out
of every cell, sync priced as compute + all-reduce; "with": every arm.

| σ | without: up to | then | with: up to | winner there | then |
|---|---|---|---|---|---|
{rows}
"""


def _winners(cells: list[dict], sigma: float, keep) -> list[tuple[float, dict]]:
  """(ratio, fastest cell) per bandwidth at ``sigma`` among the arms ``keep`` accepts."""
  out = []
  for bw in sorted({c["bandwidth_GBps"] for c in cells}, reverse=True):
    here = [c for c in cells if c["sigma"] == sigma and c["bandwidth_GBps"] == bw and keep(c)]
    out.append((here[0]["ratio"], min(here, key=lambda c: c["time_to_target"])))
  return out


def _edge(winners: list[tuple[float, dict]]) -> tuple[str, dict | None, str]:
  """(largest ratio a stepwise arm wins at, that cell, the winner one row beyond)."""
  won = [i for i, (_, c) in enumerate(winners) if c["family"] in STEPWISE]
  if not won:
    return "–", None, "–"
  i = max(won)
  beyond = winners[i + 1][1]["arm"] if i + 1 < len(winners) else "–"
  return f"{winners[i][0]:.3g}", winners[i][1], beyond


def boundary_table(cells: list[dict]) -> str:
  """``boundary.md``: per σ, where the stepwise arms stop winning, without and with the
  overlapped sync arms (names ending in ``_ov``)."""
  ov = sorted({c["arm"] for c in cells if c["arm"].endswith("_ov")})
  lines = []
  for s in dict.fromkeys(c["sigma"] for c in cells):
    r0, _, then0 = _edge(_winners(cells, s, lambda c: not c["arm"].endswith("_ov")))
    r1, cell, then1 = _edge(_winners(cells, s, lambda c: True))
    who = "–" if cell is None else f"{cell['arm']} ({cell['time_to_target']:.3g} s)"
    lines.append(f"| {s:g} | {r0} | {then0} | {r1} | {who} | {then1} |")
  return BOUNDARY.format(ov=", ".join(f"`{a}`" for a in ov), rows="\n".join(lines))


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  """``{path relative to the study folder: text}`` of every table of this study."""
  rel = root.relative_to(HERE) if root.is_relative_to(HERE) else root
  out = {str(rel / name): text for name, text in tables_from_rows(root).items()}
  cells = read_jsonl(root / "phase_all" / "phase_cells.jsonl")
  if any(c["arm"].endswith("_ov") for c in cells):
    out[str(rel.parent / "boundary.md")] = boundary_table(cells)
  return out


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
