"""torchft's failures read from its runs: each one's pause in the committed steps and the
failed host's return (what ``run.py torchft`` records per run)."""

from __future__ import annotations

import itertools
from pathlib import Path

#: A pause in torchft's committed steps this long (its steps take ~15 ms) is a failure's.
TORCHFT_STALL_S = 0.25


def recoveries(events: list[str], kept: list, t0: float, out: Path) -> list[dict]:
  """Per fault the supervisors applied: seconds from it to the first step the quorum committed
  after the pause it caused (``total``; 0 when the steps did not pause) and to the first step
  the failed host's next process committed (``rejoined``)."""
  firsts = {}  # (host, process) -> its first committed step's time
  for path in out.glob("progress-*"):
    steps = [ln.split() for ln in path.read_text().splitlines() if ln.startswith("step ")]
    if steps:
      firsts[tuple(int(x) for x in path.name.split("-")[1:])] = float(steps[0][2]) - t0
  rows = []
  for e in events:
    _, host, what, unix, kind = [*e.split(" ", 4), ""][:5]
    if what != "fault":
      continue
    at = float(unix) - t0
    gaps = [b[0] for a, b in itertools.pairwise(kept)
            if b[0] > at and a[0] <= at + 10 and b[0] - a[0] > TORCHFT_STALL_S]  # fmt: skip
    after = [t for t, _ in kept if t > at]
    back = sorted(t for (h, _), t in firsts.items() if h == int(host) and t > at)
    rows.append({"fault": kind, "host": int(host), "at": round(at, 3),
                 "total": round(gaps[0] - at, 3) if gaps else (0.0 if after else None),
                 "rejoined": round(back[0] - at, 3) if back else None})  # fmt: skip
  return rows
