"""The overlap study's tables and figures, from its committed rows (no measurement here).

    python experiments/overlap/tables.py     # tables.md, timeline.png, sweep.png

Reads ``rows/cells.jsonl`` (the grid) and ``rows/sweep.jsonl`` (the bucket sizes), both
written by ``measure.py``. Per run of a cell, each variant's time is the median of its
trials (a trial: the slowest host's); every figure below is computed per run from those,
then shown as the median [min–max] over the runs:

- ``T_compute`` (the fused gradient), ``T_forward``, ``T_backward = T_compute − T_forward``,
  ``T_comm`` (the buckets' all-reduces alone, back to back), ``T_last`` (the last one's),
  ``T_first_stage`` (the first backward stage's share of the staged backward, times
  ``T_backward``), ``T_step`` (the overlapped step, mechanism ``streams``);
- the overlap fraction ``(T_compute + T_comm − T_step) / min(T_compute, T_comm)``;
- the floor ``T_forward + max(T_backward + T_last, T_first_stage + T_comm)`` and the
  hideable communication ``min(T_comm − T_last, T_backward − T_first_stage)``;
- the exposed communication: from the last stage's end to the last all-reduce's (timeline);
- what each stream lost to the other in the overlapped step: its all-reduce stream's busy
  time over ``T_comm`` (``wire ×``), its backward's end over the staged backward's alone
  (``backward ×``);
- the model: :class:`allreduce_jax.overlap.Schedule` of the measured forward and stages
  (the staged programs' timeline) against each bucket's all-reduce priced by the replay
  of the emulated network (:func:`allreduce_jax.gloo_model.emulated_seconds`, α fitted
  on the cell's all-reduces alone).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from allreduce_jax import ALGORITHMS, gloo_model, results, units
from allreduce_jax.overlap import Schedule, even_schedule
from allreduce_jax.results import read_rows

HERE = Path(__file__).resolve().parent
NETWORK = "switch"


def _cell(row: dict) -> tuple:
  rate = row["network"]["link_Bps"]
  return (row["hosts"], rate, row["algorithm"], row["wire"], row["bucket_layers"])


def runs(rows: list[dict]) -> dict[tuple, list[dict[str, dict]]]:
  """``{cell: [{variant: row} per run]}``."""
  out: dict = defaultdict(lambda: defaultdict(dict))
  for r in rows:
    out[_cell(r)][r["run"]][r["variant"]] = r
  return {cell: [by_run[k] for k in sorted(by_run)] for cell, by_run in out.items()}


def _median(row: dict) -> float:
  return statistics.median(row["times_s"])


def _per_trial(row: dict, fn) -> float:
  """The median over trials of ``fn(host's events)`` taken at the slowest host."""
  return statistics.median(
    max(fn(trial[t]) for trial in row["timeline"]) for t in range(len(row["timeline"][0]))
  )


def _ready(events, kind: str) -> list[float]:
  return [e[3] for e in sorted((e for e in events if e[0] == kind), key=lambda e: e[1])]


def stage_times(row: dict) -> tuple[float, list[float]]:
  """(forward, [stage durations]) from the ``stages`` variant's timeline (slowest host)."""
  k = len(_ready(row["timeline"][0][0], "stage"))
  forward = _per_trial(row, lambda ev: _ready(ev, "forward")[0])
  ends = [_per_trial(row, lambda ev, j=j: _ready(ev, "stage")[j]) for j in range(k)]
  return forward, list(np.diff([forward, *ends]))


def comm_times(row: dict) -> list[float]:
  """Each bucket's all-reduce alone (the ``comm`` variant's timeline, back to back)."""
  k = len(_ready(row["timeline"][0][0], "reduce"))
  ends = [_per_trial(row, lambda ev, j=j: _ready(ev, "reduce")[j]) for j in range(k)]
  return list(np.diff([0.0, *ends]))


def exposed(row: dict) -> float:
  """From the last stage's end to the last all-reduce's, in the overlapped step."""
  return _per_trial(row, lambda ev: max(_ready(ev, "reduce")) - max(_ready(ev, "stage")))


def wire_busy(events) -> float:
  """The seconds the overlapped step's all-reduce stream was busy: each bucket's all-reduce
  from when it could start (sent, its stage ready, the previous one done) to its result."""
  stage = dict(zip(range(len(_ready(events, "stage"))), _ready(events, "stage")))
  busy = end = 0.0
  for _, i, sent, ready, _ in sorted((e for e in events if e[0] == "reduce"), key=lambda e: e[1]):
    start = max(sent, end, stage.get(i, 0.0))
    busy, end = busy + max(ready - start, 0.0), ready
  return busy


def replay(row: dict, n_bytes: float, alpha: float) -> float:
  """One bucket's all-reduce on the cell's emulated network, by the replay."""
  rate = row["network"]["link_Bps"]
  alg = ALGORITHMS[row["algorithm"]]
  wire = (
    1.0
    if row["wire"] is None
    else alg.wire_bytes(row["hosts"], row["wire"]) / alg.wire_bytes(row["hosts"])
  )
  name = "ring" if row["algorithm"] == "psum" else row["algorithm"]  # gloo's own: a ring
  return gloo_model.emulated_seconds(
    name, row["hosts"], n_bytes * wire, NETWORK, rate=rate, alpha=alpha,
    bucket_s=gloo_model.link_bucket_s(rate),
  )  # fmt: skip


def fit_alpha(rows: list[dict]) -> float:
  """α per message step fitting the replay to the measured all-reduces alone (least squares)."""
  num = den = 0.0
  for r in rows:
    for n_bytes, t in zip(r["bucket_sizes"], comm_times(r)):
      k = gloo_model.replay_steps(
        "ring" if r["algorithm"] == "psum" else r["algorithm"], r["hosts"], n_bytes, NETWORK
      )
      b = replay(r, n_bytes, 0.0)
      num, den = num + k * (t - b), den + k * k
  return max(num / den, 0.0) if den else 0.0


def derived(v: dict[str, dict], alpha: float) -> dict[str, float]:
  """Every figure of one run of one cell (``v``: its rows by variant)."""
  compute, comm = _median(v["compute"]), _median(v["comm"])
  forward = _median(v["forward"])
  backward = compute - forward
  staged_forward, stages = stage_times(v["stages"])
  first = backward * stages[0] / sum(stages)
  buckets = comm_times(v["comm"])
  last = buckets[-1]
  step = _median(v["streams"])
  floor = forward + max(backward + last, first + comm)
  hideable = max(min(comm - last, backward - first), 1e-9)
  hidden = compute + comm - step
  priced = [replay(v["comm"], b, alpha) for b in v["comm"]["bucket_sizes"]]
  model = Schedule(staged_forward, tuple(stages), tuple(priced)).step_s
  parts = Schedule(staged_forward, tuple(stages), tuple(buckets)).step_s
  out = {
    "compute": compute, "comm": comm, "ratio": comm / compute, "after": _median(v["after"]),
    "step": step, "fraction": hidden / min(compute, comm), "hidden": hidden / hideable,
    "floor": step / floor, "ideal": step / max(compute, comm), "exposed": exposed(v["streams"]),
    "model": model / step, "parts": parts / step, "staged": staged_forward + sum(stages),
    "buckets": len(buckets),
    "wire_x": _per_trial(v["streams"], wire_busy) / comm,
    "backward_x": _per_trial(v["streams"], lambda ev: max(_ready(ev, "stage")))
    / _per_trial(v["stages"], lambda ev: max(_ready(ev, "stage"))),
  }  # fmt: skip
  for m in ("thread", "one_program"):
    if m in v:
      out[m] = _median(v[m])
  return out


def _fmt(values: list[float]) -> str:
  return units.spread(values, ".2f", alone=True)


def summary(rows: list[dict]) -> dict[tuple, dict[str, list[float]]]:
  """``{cell: {figure: [one value per run]}}`` for every complete run."""
  cells = runs(rows)
  by_net: dict = defaultdict(list)
  for cell, rs in cells.items():
    by_net[(cell[0], cell[1])] += [r["comm"] for r in rs if "comm" in r]
  alphas = {net: fit_alpha(rs) for net, rs in by_net.items()}
  out = {}
  for cell, rs in cells.items():
    full = [r for r in rs if {"compute", "forward", "comm", "stages", "after", "streams"} <= set(r)]
    if full:
      figures = [derived(r, alphas[cell[:2]]) for r in full]
      out[cell] = {k: [f[k] for f in figures] for k in figures[0]}
      for name in ("compute", "comm", "after", "streams", "thread", "one_program"):
        if name in full[0]:  # every trial of every run: the spread a reader sees
          out[cell][f"{name}_trials"] = [t for r in full for t in r[name]["times_s"]]
  return out


def _label(cell: tuple) -> str:
  hosts, rate, alg, wire, layers = cell
  return f"{hosts} | {rate * 8 / 1e6:.0f} Mbit/s | {alg}{'/' + wire if wire else ''} | {layers:g}"


def best(table: dict) -> dict[tuple, tuple]:
  """For each (hosts, rate, algorithm, wire), the bucket size with the fastest median step."""
  choice: dict = {}
  for cell, f in table.items():
    key = cell[:4]
    if key not in choice or statistics.median(f["step"]) < statistics.median(
      table[choice[key]]["step"]
    ):
      choice[key] = cell
  return choice


def cells_table(rows: list[dict]) -> str:
  table = summary(rows)
  lines = [
    "## The grid: each cell at its best bucket size",
    "",
    "Seconds: median [min–max] over every trial (a trial: the slowest host's time); ratios:"
    " from each run's medians, median [min–max] over the runs. comm/compute: `T_comm / T_compute`;"
    " fraction: the overlap fraction; hidden: the hidden communication over the hideable;"
    " /floor and /ideal: `T_step` over the schedule's floor and over `max(T_compute, T_comm)`;"
    " model: the replay-priced schedule over `T_step`; wire ×: the overlapped step's all-reduce"
    " stream busy over `T_comm`; backward ×: its backward's end over the staged backward alone.",
    "",
    "| hosts | link | algorithm | bucket (layers) | runs | comm/compute | T_compute | T_comm | after | T_step | fraction | hidden | /floor | /ideal | exposed | model | wire × | backward × |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for cell in sorted(best(table).values()):
    f = table[cell]
    lines.append(
      f"| {_label(cell)} | {len(f['step'])} | {_fmt(f['ratio'])} | {_fmt(f['compute_trials'])}"
      f" | {_fmt(f['comm_trials'])} | {_fmt(f['after_trials'])} | {_fmt(f['streams_trials'])} | {_fmt(f['fraction'])} | {_fmt(f['hidden'])}"
      f" | {_fmt(f['floor'])} | {_fmt(f['ideal'])} | {_fmt(f['exposed'])} | {_fmt(f['model'])}"
      f" | {_fmt(f['wire_x'])} | {_fmt(f['backward_x'])} |"
    )
  return "\n".join(lines) + "\n"


def mechanisms_table(rows: list[dict]) -> str:
  table = summary(rows)
  lines = [
    "## The mechanism against its alternatives (seconds, median [min–max] over every trial)",
    "",
    "| hosts | link | algorithm | bucket (layers) | after | streams | thread | one program | staged, no all-reduce | T_compute |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for cell, f in sorted(table.items()):
    if "thread" in f:
      lines.append(
        f"| {_label(cell)} | {_fmt(f['after_trials'])} | {_fmt(f['streams_trials'])}"
        f" | {_fmt(f['thread_trials'])} | {_fmt(f['one_program_trials'])} | {_fmt(f['staged'])}"
        f" | {_fmt(f['compute_trials'])} |"
      )
  return "\n".join(lines) + "\n"


def sweep_table(rows: list[dict], grid: list[dict]) -> str:
  """The swept bucket sizes, with the grid's ring at the same hosts and link beside them."""
  swept = {(r["hosts"], r["network"]["link_Bps"]) for r in rows}
  same = [
    r for r in grid
    if r["algorithm"] == "ring" and r["wire"] is None
    and (r["hosts"], r["network"]["link_Bps"]) in swept
  ]  # fmt: skip
  table = summary(rows + same)
  lines = [
    "## Bucket sizes (the ring; seconds, median [min–max] over every trial; ratios: median"
    " [min–max] over the runs; one layer per bucket: the grid's cell)",
    "",
    "| hosts | link | algorithm | bucket (layers) | T_step | after | T_comm | exposed | /floor | model |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for cell, f in sorted(table.items()):
    lines.append(
      f"| {_label(cell)} | {_fmt(f['streams_trials'])} | {_fmt(f['after_trials'])}"
      f" | {_fmt(f['comm_trials'])} | {_fmt(f['exposed'])} | {_fmt(f['floor'])} | {_fmt(f['model'])} |"
    )
  return "\n".join(lines) + "\n"


#: sync_vs_async's boundary: sync (priced compute + all-reduce) wins only where one all-reduce
#: costs at most this share of a gradient computation.
SYNC_BOUNDARY = 0.3


def boundary(hidden: float, buckets: int, backward: float = 2 / 3) -> float:
  """The all-reduce (as a share of the compute) whose overlapped step pays
  :data:`SYNC_BOUNDARY` of exposed communication, when ``hidden`` of the hideable part hides
  (:func:`allreduce_jax.overlap.even_schedule`'s equal stages and buckets; bisection)."""
  lo, hi = 0.0, 100.0
  for _ in range(60):
    r = (lo + hi) / 2
    s = even_schedule(1.0, r, buckets, backward)
    (lo, hi) = (r, hi) if r - hidden * s.hideable_s <= SYNC_BOUNDARY else (lo, r)
  return lo


def boundary_table(rows: list[dict]) -> str:
  table = summary(rows)
  lines = [
    "## The sync-vs-async boundary re-priced (model)",
    "",
    f"Sync priced as compute + all-reduce wins only where one all-reduce costs at most"
    f" {SYNC_BOUNDARY} of a gradient computation. Priced as compute + the exposed"
    " communication, with the hidden share measured here and the cell's buckets as equal"
    " stages (the backward 2/3 of the compute), the all-reduce that leaves the same"
    f" {SYNC_BOUNDARY} exposed:",
    "",
    "| hosts | link | algorithm | bucket (layers) | buckets | hidden/hideable | boundary | perfect overlap |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for cell in sorted(best(table).values()):
    f, k = table[cell], table[cell]["buckets"][0]
    h = statistics.median(f["hidden"])
    lines.append(
      f"| {_label(cell)} | {k} | {h:.2f} | {boundary(h, k):.2f} | {boundary(1.0, k):.2f} |"
    )
  return "\n".join(lines) + "\n"


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  """``{path relative to the study folder: text}``."""
  cells = read_rows(root / "cells.jsonl", "overlap")
  sweep = read_rows(root / "sweep.jsonl", "overlap")
  text = "# Hiding the wire (tables from the committed rows)\n\n"
  text += cells_table(cells) + "\n" + mechanisms_table(cells) + "\n" + sweep_table(sweep, cells)
  text += "\n" + boundary_table(cells)
  return {"tables.md": text}


def timeline(rows: list[dict], path: Path) -> Path | None:
  """The overlapped step's programs per host, from the timestamps the hosts recorded: the
  forward pass and each backward stage on one line, each bucket's all-reduce on the line
  below (its trial: the median one of the first cell with a ``streams`` row)."""
  found = [r for r in rows if r["variant"] == "streams"]
  if not found:
    return None
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  row = sorted(found, key=lambda r: (r["hosts"], r["bucket_layers"], r["run"]))[0]
  trial = int(np.argsort(row["times_s"])[len(row["times_s"]) // 2])
  hosts = row["timeline"]
  fig, ax = plt.subplots(figsize=(9, 0.9 + 0.8 * len(hosts)))
  colors = {"forward": "#999999", "stage": "#4477aa", "reduce": "#ee6677"}
  for h, events in enumerate(hosts):
    ends = {"compute": 0.0, "reduce": 0.0}
    stage_end = {}
    for kind, i, sent, ready, _ in sorted(events[trial], key=lambda e: e[3]):
      lane = "reduce" if kind == "reduce" else "compute"
      start = max(sent, ends[lane], stage_end.get(i, 0.0) if kind == "reduce" else 0.0)
      y = 2 * h + (1 if kind == "reduce" else 0)
      ax.barh(y, ready - start, left=start, color=colors[kind], edgecolor="white", height=0.8)
      if kind != "forward":
        ax.text((start + ready) / 2, y, str(i), ha="center", va="center", fontsize=7, color="w")
      ends[lane] = ready
      if kind == "stage":
        stage_end[i] = ready
  labels = [f"host {h} {lane}" for h in range(len(hosts)) for lane in ("backward", "all-reduce")]
  ax.set_yticks(range(2 * len(hosts)), labels, fontsize=8)
  ax.invert_yaxis()
  ax.set_xlabel("seconds from the step's start")
  handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
  ax.legend(handles, ["forward", "backward stage k", "bucket k's all-reduce"], fontsize=8,
            loc="upper left", bbox_to_anchor=(1.0, 1.0))  # fmt: skip
  link = row["network"]["link_Bps"] * 8 / 1e6
  ax.set_title(
    f"The overlapped step, {row['hosts']} hosts, {link:.0f} Mbit/s switch, {row['algorithm']},"
    f" {row['buckets']} buckets (the median trial)", fontsize=10,
  )  # fmt: skip
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
  timeline(read_rows(HERE / "rows" / "cells.jsonl", "overlap"), HERE / "timeline.png")
