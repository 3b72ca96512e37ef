"""The goodput study's tables from its committed rows (``rows/``).

    python experiments/goodput/tables.py

One function per table; ``tables()`` returns ``{"tables.md": text}``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from allreduce_jax import goodput, registry, results
from allreduce_jax.units import spread

HERE = Path(__file__).resolve().parent
ROWS = HERE / "rows"

FAULTS = ("stop", "down", "spin", "kill")
#: What JAX's defaults leave to end a run, per fault (the watchdog off).
DEFAULT_BOUND = {
  "stop": "JAX's heartbeat timeout, 100 s",
  "down": "JAX's heartbeat timeout, 100 s",
  "spin": "XLA:CPU's collective timeout, 1,800 s",
  "kill": "the launcher sees the exit (no timeout)",
}
#: The goodput table's arms in this order (any other after them).
ARMS = ("uninterrupted", "restarts", "elastic", "no-spares", "idle-spares", "torchft")
#: torchft's published figures (PyTorch blog, 300 L40S GPUs in 30 replica groups).
TORCHFT_PUBLISHED = {
  60.0: "82.3 % of steps committed (ideal 83.3 %)",
  15.0: "training efficiency 13.4 %",
}


def _rows(name: str, kind: str) -> list[dict]:
  path = ROWS / f"{name}.jsonl"
  return results.read_rows(path, kind) if path.exists() else []


def _cell(xs: list[float], fmt: str = ".2f") -> str:
  return spread(xs, fmt, alone=True)


def detection_table(defaults: bool = False) -> str:
  """Per algorithm and fault: seconds from the fault to the launcher naming host 1, median
  [min–max] over the runs, and how many named host 1."""
  rows = [r for r in _rows("detect", "goodput-detect") if r["defaults"] == defaults]
  if not rows:
    return "(not measured)"
  faults = [f for f in FAULTS if defaults or any(r["fault"] == f for r in rows)]
  head = "| algorithm | " + " | ".join(faults) + " |"
  lines = [head, "|---" * (len(faults) + 1) + "|"]
  unmeasured = set()
  for alg in registry.names():
    cells = []
    for f in faults:
      rs = [r for r in rows if r["algorithm"] == alg and r["fault"] == f]
      if not rs:
        cells.append("–")
        unmeasured.add(f)
        continue
      right = sum(r["named_rank"] == 1 for r in rs)
      times = [r["named_after_s"] for r in rs if r["named_after_s"] is not None]
      cells.append(f"{_cell(times)} s, {right}/{len(rs)}")
    if any(c != "–" for c in cells):
      lines.append(f"| {alg} | " + " | ".join(cells) + " |")
  if defaults and unmeasured:
    bounds = "; ".join(f"{f}, {DEFAULT_BOUND[f]}" for f in FAULTS if f in unmeasured)
    lines += ["", f"–: not measured; what would end the run: {bounds}."]
  return "\n".join(lines)


def detection_summary() -> str:
  """Per fault, over every algorithm: the seconds to name the host, and the reasons given."""
  rows = [r for r in _rows("detect", "goodput-detect") if not r["defaults"]]
  if not rows:
    return "(not measured)"
  lines = ["| fault | runs | named host 1 | seconds to name it | all stopped after (s) | reason |",
           "|---|---|---|---|---|---|"]  # fmt: skip
  for f in FAULTS:
    rs = [r for r in rows if r["fault"] == f]
    if not rs:
      continue
    why = statistics.mode(_reason(r["why"]) for r in rs)
    lines.append(
      f"| {f} | {len(rs)} | {sum(r['named_rank'] == 1 for r in rs)} |"
      f" {_cell([r['named_after_s'] for r in rs if r['named_after_s'] is not None])} |"
      f" {_cell([r['stopped_after_s'] for r in rs if r['stopped_after_s'] is not None])} | {why} |"
    )
  return "\n".join(lines)


def _reason(why: str) -> str:
  for words in ("is stopped", "has its link down", "is stuck outside JAX", "was killed by",
                "stopped answering", "is behind", "every process waits"):  # fmt: skip
    if words in why:
      return words
  return why[:40]


RECOVERY_PARTS = (("detect", "detect"), ("stop", "stop"), ("restart", "restart"),
                  ("start", "start (spares)"), ("join", "join"), ("load_restore", "load, restore"),
                  ("first_chunk", "first chunk"), ("compile", "of it compiling"),
                  ("redo", "redo"), ("total", "failure to the first new step"))  # fmt: skip


def recovery_table() -> str:
  """Per fault: each part of a restart (seconds), median [min–max] over the runs."""
  rows = _rows("recovery", "goodput-recovery")
  if not rows:
    return "(not measured)"
  lines = ["| fault | runs | " + " | ".join(name for _, name in RECOVERY_PARTS) + " |",
           "|---|---|" + "---|" * len(RECOVERY_PARTS)]  # fmt: skip
  for f in FAULTS:
    recs = [x for r in rows if r["fault"] == f for x in r["recoveries"][:1]]
    if recs:
      cells = [_cell([x[k] for x in recs if x[k] is not None]) for k, _ in RECOVERY_PARTS]
      lines.append(f"| {f} | {len(recs)} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def bitwise_table() -> str:
  """Per seed: the uninterrupted run's digest and, for each kill, the step it resumed from
  and whether its digest is the same."""
  rows = _rows("bitwise", "goodput-bitwise")
  if not rows:
    return "(not measured)"
  lines = ["| seed | uninterrupted sha256 | killed at 20 s: resumed from, equal | killed during"
           " a save: resumed from, equal |", "|---|---|---|---|"]  # fmt: skip
  for seed in sorted({r["seed"] for r in rows}):
    by = {r["when"]: r for r in rows if r["seed"] == seed}
    plain = by.get("uninterrupted", {}).get("params_sha256")

    cells = [
      _bitwise_cell(by.get(w), plain, w == "during a save") for w in ("at 20 s", "during a save")
    ]
    lines.append(f"| {seed} | {(plain or '–')[:16]} | {cells[0]} | {cells[1]} |")
  return "\n".join(lines)


def _bitwise_cell(r: dict | None, plain: str | None, in_save: bool) -> str:
  if r is None:
    return "–"
  torn = "" if not in_save else (" (a save torn)" if r["killed_in_save"] else " (no save caught)")
  return f"{r['resumed_from']}, {'yes' if r['params_sha256'] == plain else 'NO'}{torn}"


def _rate(rows: list[dict]) -> float | None:
  """Steps a second of the uninterrupted runs (median over them)."""
  rates = [r["kept_steps"] / r["wall_s"] for r in rows if r["wall_s"]]
  return statistics.median(rates) if rates else None


def _attempt_rates(row: dict, settle_s: float = 2.0) -> list[float]:
  """Steps a second of each attempt of a run that made steps (after its first
  ``settle_s``: the start and compile left out), the first attempt first."""
  out = []
  for a in row["attempts"]:
    if a["start"] is None:
      continue
    t0 = a["start"] + settle_s
    pts = [(t, n) for t, n in row["kept"] if t0 <= t <= a["end"] + 1e-3]
    if len(pts) > 1 and pts[-1][0] > pts[0][0]:
      out.append((pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]))
  return out


def goodput_table() -> str:
  """Per host count, arm and MTBF: failures, goodput (steps against the uninterrupted runs
  in the same wall time), the share of the wall time on kept steps, the ideal, seconds lost
  per failure, accuracy, bitwise, nothing lost."""
  rows = _rows("goodput", "goodput-run") + _rows("torchft", "goodput-torchft")
  if not rows:
    return "(not measured)"
  lines = ["| hosts | arm | MTBF (s) | runs | failures | goodput: steps vs uninterrupted,"
           " same wall time | share of the wall time on kept steps | ideal |"
           " steps committed of those tried |"
           " failure to the first new step (s) | wall time lost per failure (s) |"
           " steps/s after a restart (uninterrupted: the run's) |"
           " final test acc | within the uninterrupted spread |"
           " parameters bitwise its seed's uninterrupted run's | nothing lost |",
           "|---" * 16 + "|"]  # fmt: skip
  for hosts in sorted({r["hosts"] for r in rows}):
    mine = [r for r in rows if r["hosts"] == hosts]
    for system in ("ours", "torchft"):
      sys_rows = [r for r in mine if (r["arm"] == "torchft" or r.get("system") == "torchft")
                  == (system == "torchft")]  # fmt: skip
      plain = [
        r for r in sys_rows if r["mtbf_s"] is None and r["arm"] in ("uninterrupted", "torchft")
      ]
      rate, accs = _rate(plain), [r["final_test_acc"] for r in plain if r["final_test_acc"]]
      digests = {r["seed"]: r.get("params_sha256") for r in plain}
      for arm in sorted(
        {r["arm"] for r in sys_rows},
        key=lambda a: (a not in ARMS, ARMS.index(a) if a in ARMS else a),
      ):
        for mtbf in sorted(
          {r["mtbf_s"] for r in sys_rows if r["arm"] == arm}, key=lambda m: m or 1e9
        ):
          rs = [r for r in sys_rows if r["arm"] == arm and r["mtbf_s"] == mtbf]
          lines.append(_goodput_line(hosts, arm, mtbf, rs, rate, accs, digests))
  lines += ["", "torchft's steps vs its uninterrupted runs and its wall time lost per failure are"
            " left out here: a step its quorum commits without a failed group trains on fewer"
            " examples and, on shared cores, runs faster, so those two figures would count it as"
            " a gain (its table below has them); its goodput is the share of the steps each"
            " group took part in.", "",
            "torchft's published figures: " + "; ".join(
    f"one failure every {m:g} s: {t}" for m, t in TORCHFT_PUBLISHED.items())]  # fmt: skip
  return "\n".join(lines)


def _goodput_line(hosts, arm, mtbf, rs, rate, accs, digests) -> str:
  fails = [len([f for f in r["faults"] if f["event"] in FAULTS and f["at"] >= 0]) for r in rs]
  early = sum(f["event"] in FAULTS and f["at"] < 0 for r in rs for f in r["faults"])
  ratio = [goodput.full_steps(r) / (rate * r["wall_s"]) for r in rs if rate and r["wall_s"]]
  per_fail = [
    (r["wall_s"] - goodput.full_steps(r) / rate) / n for r, n in zip(rs, fails) if rate and n
  ]
  speeds = [x for r in rs if "attempts" in r for x in _attempt_rates(r)[mtbf is not None :]]
  lost = [x["total"] for r in rs for x in r.get("recoveries", []) if x["total"] == x["total"]]
  within = [lo <= r["final_test_acc"] <= hi for r in rs if r["final_test_acc"]
            for lo, hi in [(min(accs), max(accs))] if accs]  # fmt: skip
  ok = [not (r["lost"]["rows"] or r["lost"]["steps"] or r["lost"]["torn_folders_left"])
        for r in rs if "lost" in r]  # fmt: skip
  same = [r["params_sha256"] == digests.get(r["seed"]) for r in rs if r.get("params_sha256")]
  ideal = "100 %" if mtbf is not None else "–"
  # torchft's: the share of the steps each group took part in
  share = [r["committed"] / (r["hosts"] * r["kept_steps"]) for r in rs
           if r.get("committed") is not None and r["kept_steps"]]  # fmt: skip
  if share:  # its steps without a failed group train on fewer examples, faster: not comparable
    ratio, per_fail = [], []
  own = [goodput.priced_on_own_hosts(r, rate) for r in rs] if rate else []
  priced = any(x is not None for x in own)
  if priced:  # steps on fewer hosts ran faster on the shared cores: priced at the full step time
    ratio = [
      goodput.full_steps(r) / (rate * r["wall_s"]) if x is None else x for r, x in zip(rs, own)
    ]
    per_fail = []
  pct = lambda xs: spread([100 * x for x in xs], ".1f", unit=" %", alone=True) if xs else "–"  # noqa: E731
  return (
    f"| {hosts} | {arm} | {'–' if mtbf is None else f'{mtbf:g}'} | {len(rs)} |"
    f" {_cell(fails, '.0f')}{f' (+{early} before)' if early else ''} |"
    f" {pct(ratio)}{' (priced)' if priced else ''} | {pct([r['goodput'] for r in rs if r['goodput'] is not None])} | {ideal} |"
    f" {pct(share)} | {_cell(lost, '.1f') if lost else '–'} |"
    f" {_cell(per_fail, '.1f') if per_fail else '–'} |"
    f" {_cell(speeds, '.0f') if speeds else '–'} |"
    f" {_cell([r['final_test_acc'] for r in rs if r['final_test_acc']], '.4f')} |"
    f" {sum(within)}/{len(within)} | {f'{sum(same)}/{len(same)}' if same else '–'} |"
    f" {f'{sum(ok)}/{len(ok)}' if ok else '–'} |"
  )


def torchft_table() -> str:
  """torchft per MTBF: steps against its uninterrupted runs in the same wall time, and the
  share of the steps each group took part in (torchft's "steps committed")."""
  rows = _rows("torchft", "goodput-torchft")
  if not rows:
    return "(not measured)"
  lines = ["| hosts | MTBF (s) | runs | failures | steps/s | steps vs uninterrupted, same wall"
           " time | group-steps committed of groups × steps | group-steps dropped |"
           " final test acc |", "|---" * 9 + "|"]  # fmt: skip
  for hosts in sorted({r["hosts"] for r in rows}):
    mine = [r for r in rows if r["hosts"] == hosts]
    rate = _rate([r for r in mine if r["mtbf_s"] is None])
    for mtbf in sorted({r["mtbf_s"] for r in mine}, key=lambda m: -(m or 1e9)):
      rs = [r for r in mine if r["mtbf_s"] == mtbf]
      pct = lambda xs: spread([100 * x for x in xs], ".1f", unit=" %", alone=True)  # noqa: E731
      lines.append(
        f"| {hosts} | {'–' if mtbf is None else f'{mtbf:g}'} | {len(rs)} |"
        f" {_cell([len(r.get('recoveries', [])) for r in rs], '.0f')} |"
        f" {_cell([r['kept_steps'] / r['wall_s'] for r in rs], '.0f')} |"
        f" {pct([r['kept_steps'] / (rate * r['wall_s']) for r in rs])} |"
        f" {pct([r['committed'] / (hosts * r['kept_steps']) for r in rs])} |"
        f" {_cell([r['dropped'] for r in rs], '.0f')} |"
        f" {_cell([r['final_test_acc'] for r in rs if r['final_test_acc']], '.4f')} |"
      )
  return "\n".join(lines)


def torchft_recovery_table() -> str:
  """torchft's failures per MTBF and kind: seconds from each to the first step the quorum
  committed after the pause it caused, and to the failed host's next process's first step."""
  rows = [r for r in _rows("torchft", "goodput-torchft") if "recoveries" in r and r["mtbf_s"]]
  if not rows:
    return "(not measured)"
  lines = ["| hosts | MTBF (s) | failure | failures | to the quorum's first new step (s) |"
           " to the failed host's first step again (s) |", "|---" * 6 + "|"]  # fmt: skip
  for hosts, mtbf in sorted({(r["hosts"], r["mtbf_s"]) for r in rows}, key=lambda k: (k[0], -k[1])):
    xs = [x for r in rows if (r["hosts"], r["mtbf_s"]) == (hosts, mtbf) for x in r["recoveries"]]
    for kind in [f for f in FAULTS if any(x["fault"] == f for x in xs)]:
      ys = [x for x in xs if x["fault"] == kind]
      total = [x["total"] for x in ys if x["total"] is not None]
      back = [x["rejoined"] for x in ys if x["rejoined"] is not None]
      lines.append(f"| {hosts} | {mtbf:g} | {kind} | {len(ys)} | {_cell(total) if total else '–'} |"
                   f" {_cell(back, '.1f') if back else '–'} ({len(back)} of {len(ys)}) |")  # fmt: skip
  return "\n".join(lines)


def simulated_table() -> str:
  """Per MTBF and step time: seconds to the target accuracy, synchronous all-reduce
  (restart from a checkpoint) against the asynchronous parameter server (a dead worker's
  pushes lost), median [min–max] over the schedules."""
  rows = _rows("simulated", "goodput-simulated")
  if not rows:
    return "(not measured)"
  lines = ["| MTBF (s) | s a step | schedules | sync: s to target | failures before |"
           " PS: s to target | failures before | sync / PS | without failures: sync, PS |",
           "|---" * 9 + "|"]  # fmt: skip
  keys = sorted({(r["mtbf_s"], r["clocks"]["step_s"]) for r in rows}, key=lambda k: (-k[0], k[1]))
  for mtbf, step in keys:
    rs = [r for r in rows if r["mtbf_s"] == mtbf and r["clocks"]["step_s"] == step]
    sync_s = [r["sync_s"] for r in rs if r["sync_s"] is not None]
    ps_s = [r["ps_s"] for r in rs if r["ps_s"] is not None]
    ratio = [r["sync_s"] / r["ps_s"] for r in rs if r["sync_s"] and r["ps_s"]]
    lines.append(
      f"| {mtbf:g} | {step:g} | {len(rs)} | {_cell(sync_s)} | {_cell([r['sync_failures'] for r in rs if r['sync_failures'] is not None], '.0f')} |"
      f" {_cell(ps_s)} | {_cell([r['ps_failures'] for r in rs if r['ps_failures'] is not None], '.0f')} |"
      f" {spread(ratio, '.2f', unit='×', alone=True)} | {_cell([r['sync_healthy_s'] for r in rs])}, {_cell([r['ps_healthy_s'] for r in rs])} |"
    )  # fmt: skip
  return "\n".join(lines)


def timeline_table(hosts: int = 4, arm: str = "restarts", mtbf: float = 60.0, seed: int = 0) -> str:
  """One run's failures: when, what, the step resumed from, the steps redone, the seconds
  from the failure to the first new step."""
  rs = [r for r in _rows("goodput", "goodput-run")
        if (r["hosts"], r["arm"], r["mtbf_s"], r["seed"]) == (hosts, arm, mtbf, seed)]  # fmt: skip
  if not rs:
    return "(not measured)"
  r = rs[-1]
  lines = ["| failure | at (s) | resumed from | reached | redone | failure to the first new step (s) |",
           "|---|---|---|---|---|---|"]  # fmt: skip
  for x in r["recoveries"]:
    redone = (x["reached"] or 0) - (x["resumed_from"] or 0)
    lines.append(f"| {x['fault'] or '(watchdog)'} | {x['at']:.1f} | {x['resumed_from']} |"
                 f" {x['reached']} | {redone} | {x['total']:.2f} |")  # fmt: skip
  return "\n".join(lines)


def tables() -> dict[str, str]:
  """``{"tables.md": text}`` from the committed rows."""
  parts = [
    "# Goodput: tables (generated by tables.py from rows/)", "",
    "## A hang found in seconds: the watchdog, every algorithm (4 hosts, 1 MiB calls)", "",
    "Seconds from the fault on host 1 (4 s after the hosts joined, during back-to-back 1 MiB"
    " calls) to the launcher naming a host, median [min–max] over the runs, and how many"
    " runs named host 1. The project's settings: the watchdog on (floor 2 s).", "",
    detection_table(False), "", detection_summary(), "",
    "JAX's defaults (`--watchdog 0`: a 100 s heartbeat, XLA:CPU's 1,800 s collective"
    " timeout):", "",
    detection_table(True), "",
    "## Recovery: one failure, then `--restarts 1` (4 hosts, the digits MLP)", "",
    "Seconds, median [min–max] over the runs (a fault at a random moment 20-30 s after the"
    " hosts joined, on a random host; checkpoints every 100 steps, saved in the"
    " background).", "", recovery_table(), "",
    "## Bitwise resume (4 hosts, 2000 steps)", "", bitwise_table(), "",
    "## Goodput under Poisson failure schedules", "",
    "Goodput: the steps kept over what the same system's uninterrupted runs make in the"
    " same wall time (from the first committed step to the last; their median steps a"
    " second; a step `--elastic` trained on fewer hosts counts as the share of the examples"
    " it took). Failures: those applied within the wall time (+ those before the first step,"
    " outside it, over all runs of the cell). Share of the wall time on kept steps: the"
    " seconds spent computing steps that were kept, over the wall time (evaluations, saves,"
    " recoveries and redone steps left out; it does not count steps run slower, so it is"
    " not compared across arms). Ideal: what a recovery of no cost keeps. Wall time lost"
    " per failure: the wall time over what the uninterrupted runs take for the same steps,"
    " per failure.",
    "", goodput_table(), "",
    "`--elastic` trains on the surviving hosts until a replacement is back (20 s after the"
    " failure, at the next restart). Here fewer processes share the machine's two cores and"
    " step faster than on hosts of their own, so its goodput is priced (each step on fewer"
    " hosts at the uninterrupted step time, counting its share of the examples), and it is"
    " optimistic: on hosts of their own the run would last longer and meet more failures.",
    "",
    "torchft beside it (4 replica groups, one a host, its lighthouse on a fifth; the same"
    " schedules, counted from each host's first committed step). A group-step is one group's"
    " 16 examples in a committed step; a step the quorum commits without a failed group"
    " trains on fewer examples, and on these shared cores runs faster.", "",
    torchft_table(), "",
    "torchft's failures: seconds from each to the first step the quorum committed after the"
    " pause it caused (0 when there was none), and to the failed host's replacement process's"
    " first step (a stopped or cut-off process is replaced after 15 s without a step):", "",
    torchft_recovery_table(), "",
    "One run's failures (4 hosts, `--restarts`, one failure a minute, seed 0):", "",
    timeline_table(), "",
    "## Synchronous all-reduce against the asynchronous parameter server, workers dying", "",
    "Simulated (`allreduce_jax.training.failures.race`): the digits MLP to 95 % test"
    " accuracy, 4 workers, the same schedules.", "", simulated_table(), "",
  ]  # fmt: skip
  return {"tables.md": "\n".join(parts)}


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
