"""The table of "The hand-written algorithms over MPI" (README) from rows/collectives_*.jsonl:
each hand-written algorithm's time with XLA's collectives over MPI and over gloo, beside its
full-duplex bound (every host sends and receives its schedule's bytes at the link's rate at once).

    python experiments/mpi_peer/collectives_table.py
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
ALGORITHMS = ("ring", "halving_doubling", "recursive_doubling")
RATE = 25e6  # bytes/s each way: the 200 Mbit/s links of collectives.sh
ARMS = {"mpi": "over MPI", "mpi_send": "over MPI, TCP send", "gloo": "over gloo"}


def bytes_each_way(algorithm: str, p: int, n: int) -> float:
  """Bytes one host sends (and receives) in the schedule: the ring and halving-doubling
  2(p-1)/p·n (a reduce-scatter and an all-gather), recursive doubling n·lg p."""
  if algorithm == "recursive_doubling":
    return n * math.log2(p)
  return 2 * (p - 1) / p * n


def times() -> dict[tuple[str, str, int], list[float]]:
  """(collectives, algorithm, bytes) -> seconds, one per run."""
  cells: dict[tuple[str, str, int], list[float]] = {}
  for path in sorted((HERE / "rows").glob("collectives_*_run*.jsonl")):
    collectives = path.stem.removeprefix("collectives_").rsplit("_run", 1)[0]  # mpi, gloo, mpi_send
    for line in path.read_text().splitlines():
      r = json.loads(line)
      if r.get("algorithm") in ALGORITHMS:
        key = (collectives, r["algorithm"], r["bytes"])
        cells.setdefault(key, []).append(r["time_us"] * 1e-6)
  return cells


def table(p: int = 4) -> str:
  cells = times()
  sizes = sorted({n for _, _, n in cells})
  arms = [a for a in ARMS if any(k[0] == a for k in cells)]
  lines = [
    "| size per host | algorithm | full-duplex bound, ms | "
    + " | ".join(f"{ARMS[a]}, ms | {ARMS[a]} / bound" for a in arms)
    + " |",
    "|---|---|---|" + "---|---|" * len(arms),
  ]
  for n in sizes:
    for name in ALGORITHMS:
      bound = bytes_each_way(name, p, n) / RATE
      row = [f"{n / 2**20:g} MiB", name, f"{bound * 1e3:.0f}"]
      for a in arms:
        ts = cells.get((a, name, n))
        row += [_cell(ts), _ratio(ts, bound)]
      lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


def _cell(ts: list[float] | None) -> str:
  if not ts:
    return "—"
  return f"{statistics.median(ts) * 1e3:.0f} [{min(ts) * 1e3:.0f}–{max(ts) * 1e3:.0f}]"


def _ratio(ts: list[float] | None, bound: float) -> str:
  return f"{statistics.median(ts) / bound:.2f}×" if ts else "—"


if __name__ == "__main__":
  print(table(), end="")
