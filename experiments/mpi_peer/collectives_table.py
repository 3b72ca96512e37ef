"""The tables of "The hand-written algorithms over MPI" (README) from rows/collectives_*.jsonl:

- each hand-written algorithm's time with XLA's collectives over MPI (Open MPI's default TCP
  flags, and sending large messages) and over gloo, beside its full-duplex bound (every host
  sends and receives its schedule's bytes at the link's rate at once);
- one message step alone (``steps.py``), against m/B and 2m/B;
- halving-doubling's, recursive doubling's and the ring's whole time against the sum of their
  steps' measured times;
- every hand-written algorithm over MPI at 1 KiB-64 MiB, p = 4 and 8;
- the 8-host ring over gloo against the sum of its steps, and what they cost above the wire.

A cell is the median [min–max] over the runs of each run's median (one run: its median).

    python experiments/mpi_peer/collectives_table.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from allreduce_jax import gloo_model

HERE = Path(__file__).resolve().parent
ALGORITHMS = ("ring", "halving_doubling", "recursive_doubling")
RATE = 25e6  # bytes/s each way: the 200 Mbit/s links of collectives.sh
ARMS = {"mpi": "over MPI", "mpi_send": "over MPI, TCP send", "gloo": "over gloo"}
FLAGS = {  # steps.py's arms: Open MPI's TCP flags, and what else differed from the default
  "mpi": "put (Open MPI's default)",
  "mpi_send": "send, 128 KiB fragments",
  "mpi_send_noidle": "send, no slow start after idle",
  "mpi_send_reno": "send, TCP reno",
  "mpi_send_1MiBfrag": "send, 1 MiB fragments",
  "mpi_send_32KiBfrag": "send, 32 KiB fragments",
  "mpi_send_8KiBfrag": "send, 8 KiB fragments",
  "mpi_send_32KiBfrag_progress": "send, 32 KiB, TCP progress thread",
  "mpi_send_32KiBfrag_links2": "send, 32 KiB, two TCP connections a pair",
  "mpi_send_32KiBfrag_buf256k": "send, 32 KiB, 256 KiB socket buffers",
  "mpi_send_32KiBfrag_yield": "send, 32 KiB, yield when idle (the launcher's)",
}
STEPS = ("one_way", "exchange", "exchange_add", "shift", "add")


def bound_s(algorithm: str, p: int, n: int) -> float | None:
  """The full-duplex bound: the busiest host's schedule bytes at the link's rate, each way
  at once (:func:`allreduce_jax.gloo_model.schedule_bytes`); None for ``psum``, whose
  schedule is the MPI library's. The ring and halving-doubling 2(p-1)/p·n, recursive
  doubling n·lg p."""
  if algorithm == "psum":
    return None
  return float(max(gloo_model.schedule_bytes(algorithm, p, float(n)))) / RATE


def _rows(pattern: str):
  """(run file stem, row) for every row of rows/PATTERN."""
  for path in sorted((HERE / "rows").glob(pattern)):
    for line in path.read_text().splitlines():
      yield path.stem, json.loads(line)


def _arm(stem: str, prefix: str) -> str:
  return stem.removeprefix(prefix).rsplit("_run", 1)[0]


def times() -> dict[tuple[str, str, int], list[float]]:
  """(collectives, algorithm, bytes) -> seconds, one per run (bench rows at p = 4)."""
  cells: dict[tuple[str, str, int], list[float]] = {}
  for stem, r in _rows("collectives_*_run*.jsonl"):
    arm = _arm(stem, "collectives_")  # mpi, gloo, mpi_send
    if arm in ARMS and r.get("algorithm") in ALGORITHMS:
      cells.setdefault((arm, r["algorithm"], r["bytes"]), []).append(r["time_us"] * 1e-6)
  return cells


def step_times() -> dict[tuple[str, str, int], list[float]]:
  """(flags arm, kind, bytes) -> seconds, one median per run (``steps.py`` rows)."""
  cells: dict[tuple[str, str, int], list[float]] = {}
  for stem, r in _rows("collectives_steps_*_run*.jsonl"):
    cells.setdefault((_arm(stem, "collectives_steps_"), r["kind"], r["bytes"]), []).append(
      r["time_s"]
    )
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
      bound = bound_s(name, p, n)
      row = [_size(n), name, f"{bound * 1e3:.0f}"]
      for a in arms:
        ts = cells.get((a, name, n))
        row += [_cell(ts), _ratio(ts, bound)]
      lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


def steps_table() -> str:
  """One step alone, ms, against m/B (one direction) and 2m/B (the two taking turns)."""
  cells = step_times()
  lines = [
    "| TCP flags | m | m/B, ms | one way | exchange | exchange + add | shift | add alone"
    " | exchange / one way | exchange / shift |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for arm in FLAGS:
    for m in sorted({n for a, k, n in cells if a == arm and k in STEPS}):
      row = [FLAGS[arm], _size(m), f"{m / RATE * 1e3:.1f}"]
      row += [_cell(cells.get((arm, k, m)), 1) for k in STEPS]
      ex = cells.get((arm, "exchange", m))
      for other in ("one_way", "shift"):
        t = cells.get((arm, other, m))
        row.append(f"{statistics.median(ex) / statistics.median(t):.2f}" if t and ex else "—")
      lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


def chained_table() -> str:
  """The per-step cost: a small step called 20 times back to back, per call, ms."""
  cells = step_times()
  kinds = [k for k in STEPS[:-1] if any(c[1] == f"{k}_chained" for c in cells)]
  lines = ["| TCP flags | m | " + " | ".join(kinds) + " |", "|---|---|" + "---|" * len(kinds)]
  for arm in FLAGS:
    for m in sorted({n for a, k, n in cells if a == arm and k.endswith("_chained")}):
      row = [FLAGS[arm], _size(m)] + [_cell(cells.get((arm, f"{k}_chained", m)), 2) for k in kinds]
      lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


def step_sums(p: int = 4) -> dict[str, list[tuple[str, int]]]:
  """Each algorithm's steps at p = 4 as (steps.py kind, bytes) for n = 16 MiB: halving-doubling
  exchanges n/2 and n/4 adding, then n/4 and n/2; recursive doubling exchanges n twice adding;
  the ring shifts n/p 2(p-1) times (the first p-1 adding; shift with the add is not timed
  apart, so the ring's sum is a lower bound by p-1 adds)."""
  n = 16 << 20
  return {
    "halving_doubling": [("exchange_add", n // 2), ("exchange_add", n // 4),
                         ("exchange", n // 4), ("exchange", n // 2)],
    "recursive_doubling": [("exchange_add", n), ("exchange_add", n)],
    "ring": [("shift", n // p)] * (2 * (p - 1)),
  }  # fmt: skip


def sums_table(p: int = 4) -> str:
  """The whole all-reduce (same launch as its steps) against the sum of its steps' medians."""
  cells = step_times()
  lines = [
    "| TCP flags | algorithm, 16 MiB | whole, ms | sum of its steps, ms | whole / sum |"
    " full-duplex bound, ms | whole / bound | sum / bound |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for arm in FLAGS:
    for name, steps in step_sums(p).items():
      whole = cells.get((arm, name, 16 << 20))
      parts = [cells.get((arm, k, m)) for k, m in steps]
      if not whole or not all(parts):
        continue
      total = sum(statistics.median(t) for t in parts)
      bound = bound_s(name, p, 16 << 20)
      w = statistics.median(whole)
      lines.append(
        f"| {FLAGS[arm]} | {name} | {_cell(whole)} | {total * 1e3:.0f} | {w / total:.2f} |"
        f" {bound * 1e3:.0f} | {w / bound:.2f}× | {total / bound:.2f}× |"
      )
  return "\n".join(lines) + "\n"


def full_table() -> str:
  """Every hand-written algorithm (and psum) over MPI, the launcher's Open MPI settings: one
  row per (p, algorithm), ms per size (median [min–max] over the runs), and the time over
  the full-duplex bound at each size from 16 MiB up."""
  cells: dict[tuple[int, str, int], list[float]] = {}
  for _, r in _rows("collectives_table_run*.jsonl"):
    cells.setdefault((r["n_devices"], r["algorithm"], r["bytes"]), []).append(r["time_us"] * 1e-6)
  lines = []
  for p in sorted({k[0] for k in cells}):
    sizes = sorted({n for q, _, n in cells if q == p})
    big = [n for n in sizes if n >= 16 << 20]
    runs = max(len(ts) for k, ts in cells.items() if k[0] == p)
    lines += [
      f"| p = {p}, runs: {runs} | "
      + " | ".join(_size(n) for n in sizes)
      + "".join(f" | {_size(n)} / bound" for n in big)
      + " |",
      "|---|" + "---|" * (len(sizes) + len(big)),
    ]
    for name in sorted({a for q, a, _ in cells if q == p}):
      row = [_cell(cells.get((p, name, n)), 1 if n < 1 << 20 else 0) for n in sizes]
      row += [_ratio(cells.get((p, name, n)), bound_s(name, p, n)) for n in big]
      lines.append(f"| {name} | " + " | ".join(row) + " |")
    lines.append("")
  return "\n".join(lines)


def ring_steps_table() -> str:
  """The 8-host ring over gloo against its steps (``collectives.sh``'s ``ring8`` arm): per
  launch the whole ring and ``psum``, the sum of the ring's 2(p-1) shifts and p-1 adds of
  m = n/p, and what those steps cost above the wire (each shift's time over m/B, each add):
  median [min–max] over the launches."""
  launches: dict[str, list[dict]] = {}
  for stem, r in _rows("collectives_ring8*_run*.jsonl"):
    launches.setdefault(stem, []).append(r)
  by_n: dict[int, list[dict[str, float]]] = {}
  for rows in launches.values():
    whole = {r["kind"]: r for r in rows if r["kind"] in ("ring", "psum")}
    n, p = whole["ring"]["bytes"], whole["ring"]["p"]
    m = n // p
    step = {r["kind"]: r["time_s"] for r in rows if r["bytes"] == m}
    floor = next(r["time_s"] for r in rows if r["kind"] == "shift_chained")
    cost = 2 * (p - 1) * (step["shift"] - m / RATE) + (p - 1) * step["add"]
    total = 2 * (p - 1) * step["shift"] + (p - 1) * step["add"]
    ring, psum = whole["ring"]["time_s"], whole["psum"]["time_s"]
    by_n.setdefault(n, []).append({
      "ring": ring, "psum": psum, "psum/ring": psum / ring, "shift": step["shift"],
      "add": step["add"], "ring/sum": ring / total, "cost": cost, "cost/ring": cost / ring,
      "floor": floor, "p": p,
    })  # fmt: skip
  lines = [
    "| n per host | p | launches | ring, ms | psum, ms | psum / ring | shift of n/p, ms (m/B)"
    " | add of n/p, ms | ring / steps' sum | steps' cost above the wire, ms | cost / ring"
    " | 1 KiB shift back to back, ms |",
    "|---" * 12 + "|",
  ]
  for n, ls in sorted(by_n.items()):
    p = ls[0]["p"]
    c = {k: _cell([x[k] for x in ls], 1) for k in ("shift", "add", "floor")}
    c |= {k: _cell([x[k] for x in ls]) for k in ("ring", "psum", "cost")}
    c |= {k: _cell([x[k] for x in ls], 2, 1) for k in ("psum/ring", "ring/sum")}
    c["cost/ring"] = _cell([x["cost/ring"] for x in ls], 1, 100)
    lines.append(
      f"| {_size(n)} | {p} | {len(ls)} | {c['ring']} | {c['psum']} | {c['psum/ring']}"
      f" | {c['shift']} ({n / p / RATE * 1e3:.1f}) | {c['add']} | {c['ring/sum']}"
      f" | {c['cost']} | {c['cost/ring']} % | {c['floor']} |"
    )
  return "\n".join(lines) + "\n"


def _size(n: int) -> str:
  return f"{n / 2**20:g} MiB" if n >= 1 << 20 else f"{n / 2**10:g} KiB"


def _cell(ts: list[float] | None, digits: int = 0, scale: float = 1e3) -> str:
  """median [min–max] of ``ts`` times ``scale`` (default: seconds as ms)."""
  if not ts:
    return "—"
  med, lo, hi = (v * scale for v in (statistics.median(ts), min(ts), max(ts)))
  if len(ts) == 1:  # one run: its median alone
    return f"{med:.{digits}f}"
  return f"{med:.{digits}f} [{lo:.{digits}f}–{hi:.{digits}f}]"


def _ratio(ts: list[float] | None, bound: float | None) -> str:
  return f"{statistics.median(ts) / bound:.2f}×" if ts and bound else "—"


if __name__ == "__main__":
  print(table(), end="")
  for title, text in [
    ("One step alone, ms", steps_table()),
    ("Per-step cost (20 calls back to back), ms per call", chained_table()),
    ("Whole against the sum of its steps", sums_table()),
    ("Every hand-written algorithm over MPI (TCP send)", full_table()),
    ("The 8-host ring over gloo against its steps", ring_steps_table()),
  ]:
    print(f"\n{title}\n\n{text}", end="")
