"""tables.md from rows/: the study's targets, measured, and how close the replay comes,
over every sweep (no measurement here; each cell's grid is in grids.md).

    python experiments/emulated_network/tables.py

Reads ``bench_NET_HOSTS.jsonl`` and ``blocks_NET_HOSTS.jsonl`` (``allreduce-jax bench`` on
``allreduce-jax cluster``, round robin and in blocks), the sets of :data:`SETS`, the
``run.py link-queue`` rows and ``wire_bytes.py``'s, all from ``run.py``. The model is
:func:`allreduce_jax.gloo_model.emulated_seconds` at the rows' own link rate (their key's
network): the replay of each algorithm's schedule on the emulated network, one α per network
fitted on the 4 and 64 KiB rows, at full duplex (the replay's own assumption) and at half
duplex for exchanges (one ppermute at a time, exchanges in turn, as XLA:CPU runs them over
gloo). One function per table; cells median [min–max] where several runs make one.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from allreduce_jax import cluster_rows, cost_model, gloo_model, results, units
from allreduce_jax.units import spread

HERE = Path(__file__).resolve().parent
NETS = (("switch", 4), ("switch", 8), ("fat_tree:4:2", 8), ("torus:8", 8))
TITLE = "# Measured on an emulated network (tables from the committed rows)\n"
SWEEP = "python experiments/emulated_network/run.py sweep"
LINK_QUEUE = "python experiments/emulated_network/run.py link-queue"


#: The sweep's sets timed in blocks at the 16 KiB TCP queue (folders under rows/; their grids
#: are in grids.md) and what tells their cells apart.
SETS = {
  "tcp_queue_16k": {"order": "blocks", "tcp_queue": "16KiB"},
  "tcp_queue_16k/repeat": {"order": "blocks", "tcp_queue": "16KiB", "run": "repeat"},
  "tcp_queue_16k/cubic": {"order": "blocks", "tcp_queue": "16KiB", "congestion_control": "cubic"},
  "tcp_queue_16k/cubic_finish": {"order": "blocks", "tcp_queue": "16KiB",
                                 "congestion_control": "cubic", "finish": "per slice"},
  "tcp_queue_16k/cubic_finish/repeat": {"order": "blocks", "tcp_queue": "16KiB",
                                        "congestion_control": "cubic", "finish": "per slice",
                                        "run": "repeat"},
}  # fmt: skip


def cells(
  root: Path, prefix: str, tags: dict, robin: str | None = None, bucket=False
) -> list[dict]:
  """Every network's cells of ``root/PREFIX_NET_HOSTS.jsonl`` beside the replay
  (``cluster_rows.replay_cells``), tagged; ``robin``: the rows α is fitted on instead."""
  out = []
  for net, p in NETS:
    name = f"{net.replace(':', '_')}_{p}.jsonl"
    rows = cluster_rows.bench_rows(root / (prefix + name))
    if rows:
      fit = cluster_rows.bench_rows(root / (robin + name)) if robin else None
      out += [
        c | tags for c in cluster_rows.replay_cells(rows, net, p, alpha_rows=fit, bucket=bucket)
      ]
  return out


def repeat_spread(
  first: list[dict], again: list[dict], label: str = "run to run (step 6 / step 5"
) -> list[str]:
  """How far one run's cells (≥ 1 MiB, every algorithm) land from the other's."""
  key = lambda s: (s["network"], s["p"], s["algorithm"], s["bytes"])  # noqa: E731
  one = {key(s): s["measured_s"] for s in first}
  ratios = sorted(s["measured_s"] / one[key(s)] for s in again if key(s) in one)
  if not ratios:
    return []
  close = sum(0.9 <= r <= 1.1 for r in ratios)
  return [
    f"- {label}, every network, algorithm and size ≥ 1 MiB): median"
    f" {statistics.median(ratios):.2f}, range {ratios[0]:.2f}–{ratios[-1]:.2f}; {close} of"
    f" {len(ratios)} cells within 10 %."
  ]


#: The rows measured per congestion control (``link_settings.md``) and their label here:
#: before and after ``all_reduce`` finished each reduced slice instead of the whole result.
CC_SETS = (("congestion_control.jsonl", ""), ("finish_per_slice.jsonl", ", finish per slice"))


def _congestion_control_lines(root: Path, p: int) -> list[str]:
  """The ring on the ``p``-host switch per congestion control, in each of ``CC_SETS``."""
  lines = []
  for name, label in CC_SETS:
    cells = cluster_rows.line_shares(
      results.read_rows(root / name, "bench"), ("congestion_control",)
    )
    for cc in sorted({k[1] for k in cells if k[0] == p}):
      v = {k[3]: x for k, x in cells.items() if k[:3] == (p, cc, "ring")}
      lines.append(_runs_line(f"with `--congestion-control {cc}`{label} (median of runs", v))
  return lines


def _runs_line(label: str, v: dict) -> str:
  """A target sub-line: the ring's busbw / line rate per size ``v`` (one value a run),
  median [min–max], and whether every run reached 0.90."""
  ok = all(min(x) >= 0.90 for x in v.values())
  return (
    f"  - {label} [min–max]):"
    + ",".join(f" {units.format_bytes(n)} {spread(x)}" for n, x in sorted(v.items()))
    + (": met in every run." if ok else ": not met.")
  )  # fmt: skip


def _jumbo_line(root: Path, p: int) -> list[str]:
  """The ring on the ``p``-host switch with jumbo frames (MTU 9000) at the 16 KiB TCP
  queue: ``mtu_16k.jsonl`` (4, 16 MiB) and ``jumbo_64mib/`` (64 MiB), medians over runs."""
  v = {n: x for (h, mtu, a, n), x in cluster_rows.line_shares(results.read_rows(root / "mtu_16k.jsonl", "bench"), ("mtu",)).items()
       if h == p and mtu == 9000 and a == "ring"}  # fmt: skip
  for path in sorted((root / "jumbo_64mib").glob(f"switch_{p}_run*.jsonl")):
    for r in results.read_rows(path, "bench"):
      if r["algorithm"] == "ring" and r.get("wrong") == 0:
        v.setdefault(r["bytes"], []).append(cluster_rows.line_share(r))
  return [_runs_line("with `--mtu 9000` (jumbo frames; median of runs", v)] if v else []


def two_run_model_lines(root: Path, first: Path, again: Path, what: str) -> list[str]:
  """The model against the mean of two runs of one sweep (``first``, ``again``): per
  cell the two runs' seconds averaged, α fitted on both runs' 4 and 64 KiB rows together."""
  lines = []
  for net, p in NETS:
    name = f"blocks_{net.replace(':', '_')}_{p}.jsonl"
    one, two = (
      cluster_rows.bench_rows(root / first / name),
      cluster_rows.bench_rows(root / again / name),
    )
    if not (one and two):
      continue
    rate = cluster_rows.link_rate(one + two)
    alpha = {"half": cluster_rows.fit_alpha(one + two, p, net, "half"), "full": 0.0}
    alpha["bucket"] = cluster_rows.fit_alpha(one + two, p, net, "half", bucket=True)
    t1, t2 = cluster_rows.seconds(one), cluster_rows.seconds(two)
    mean = [(a, n, (t1[(a, n)] + t2[(a, n)]) / 2) for a, n in t1
            if n >= 1 << 20 and a not in ("psum", "auto") and (a, n) in t2]  # fmt: skip
    both = [cluster_rows.replay_cell(a, p, n, net, m, alpha, rate) for a, n, m in mean]
    lines += _model_line(both, f"{net} ({p} hosts, {what}, the mean of both runs)")
  return lines


def _ring(cells: list[dict], p: int) -> list[dict]:
  """The ring's cells from 4 MiB on the ``p``-host switch."""
  return [s for s in cells if s["network"] == "switch" and s["p"] == p
          and s["algorithm"] == "ring" and s["bytes"] >= 4 << 20]  # fmt: skip


def _lines(cells: list[dict]) -> str:
  """`` 4 MiB 0.92, 16 MiB 0.93``: each cell's busbw over the line rate."""
  return ",".join(f" {units.format_bytes(s['bytes'])} {s['busbw_over_line']:.2f}" for s in cells)


def small_queue_targets(
  root: Path,
  summary: list[dict],
  again: list[dict] = (),
  cubic: list[dict] = (),
  finish: list[dict] = (),
  finish_again: list[dict] = (),
) -> list[str]:
  """The targets again at ``cluster``'s default TCP queue (16 KiB a socket), in the
  sweep (``summary``), in its repeat (``again``), with the hosts at ``cubic`` and at
  ``cubic`` after the per-slice finish (``finish``, and its repeat ``finish_again``)."""
  if not summary:
    return []
  lines = ["### The targets at `--tcp-queue 16KiB` (cluster's default), timed in blocks", ""]
  cells = cluster_rows.line_shares(
    results.read_rows(root / "tcp_queue.jsonl", "bench"), ("tcp_queue",)
  )
  for p in (4, 8):
    v = {n: cells.get((p, "16KiB", "ring", n), []) for n in (4 << 20, 16 << 20)}
    sweep, repeat, fin, fin2 = (_ring(c, p) for c in (summary, again, finish, finish_again))
    if any(v.values()) or sweep:
      med = {n: statistics.median(x) for n, x in v.items() if x}
      ok = all(m >= 0.90 for m in med.values()) and all(
        s["busbw_over_line"] >= 0.90 for s in sweep + repeat
      )
      ok_fin = all(s["busbw_over_line"] >= 0.90 for s in fin)
      ok_fin2 = all(s["busbw_over_line"] >= 0.90 for s in fin2)
      lines.append(
        f"- ring busbw / line rate on the {p}-host switch (target ≥ 0.90 from 4 MiB):"
        + "".join(f" {units.format_bytes(n)} {m:.2f} (median of {len(v[n])})," for n, m in med.items())
        + f" in the sweep{_lines(sweep)}"
        + ("; in its repeat" if repeat else "")
        + f"{_lines(repeat)}: {'met' if ok else 'not met'}"
        + (f"; at cubic after the per-slice finish (step 8){_lines(fin)}:"
           f" {'met' if ok_fin else 'not met'}" if fin else "")
        + (f"; in its repeat (step 10){_lines(fin2)}: {'met' if ok_fin2 else 'not met'}"
           if fin2 else "")
        + "."
      )  # fmt: skip
    lines += _jumbo_line(root, p) + _congestion_control_lines(root, p)
    for a in ("halving_doubling", "recursive_doubling"):
      for c in (s for s in summary if s["network"] == "switch" and s["p"] == p
                and s["algorithm"] == a and s["bytes"] == 16 << 20):  # fmt: skip
        lines.append(
          f"- {a} at 16 MiB on the {p}-host switch: {c['measured_s'] / c['bound_full_s']:.2f}×"
          f" its full-duplex bound (target ≤ 1.2), {c['measured_s'] / c['bound_half_s']:.2f}× the"
          " half-duplex one."
        )
  runs = ((summary, ""), (again, ", the repeat"), (cubic, ", cubic"),
          (finish, ", cubic, each slice finished by its owner"),
          (finish_again, ", cubic, each slice finished by its owner, the repeat"))  # fmt: skip
  for cells, run in runs:
    for net, p in NETS:
      mine = [s for s in cells if s["network"] == net and s["p"] == p and s["algorithm"] != "psum"]
      lines += _model_line(mine, f"{net} ({p} hosts{run})")
  finish_dir = Path("tcp_queue_16k") / "cubic_finish"
  if finish_again:
    lines += two_run_model_lines(root, finish_dir, finish_dir / "repeat", "cubic, step 8 and 10")
  return [
    *lines,
    *repeat_spread(summary, again),
    *repeat_spread(summary, cubic, "the hosts at cubic against bbr (step 7 / step 5"),
    *repeat_spread(cubic, finish, "each slice finished by its owner, at cubic (step 8 / step 7"),
    *repeat_spread(finish, finish_again, "step 8 run again (step 10 / step 8"),
    "",
  ]


def _model_line(mine: list[dict], where: str) -> list[str]:
  """How many of the cells ``mine`` the half-duplex model prices within 20 %, and which
  not; again with each link's token bucket priced where the cells carry that model."""
  if not mine:
    return []

  def line(key, what):
    off = [s for s in mine if not 0.8 <= s["measured_s"] / s[key] <= 1.2]
    names = ", ".join(f"{s['algorithm']} {units.format_bytes(s['bytes'])} {s['measured_s'] / s[key]:.2f}"
                      for s in off)  # fmt: skip
    return (f"{what} within 20 % on {where}, hand-written algorithms at ≥ 1 MiB:"
            f" {len(mine) - len(off)} of {len(mine)} cells"
            + (f"; outside: {names}." if off else "."))  # fmt: skip

  out = [line("model_half_s", "- model (half duplex, α fitted)")]
  if all("model_bucket_s" in s for s in mine):
    bucket_ms = gloo_model.link_bucket_s(mine[0]["rate"]) * 1e3
    out.append(line("model_bucket_s", f"  - with each link's {bucket_ms:g} ms token bucket priced"
                                      " (`bucket_s`, α fitted likewise)"))  # fmt: skip
  return out


def targets(root: Path, summary: list[dict]) -> list[str]:
  """The study's targets (line rate, the exchanges' bound, bytes on the wire, the model),
  measured: one line each."""
  lines = ["### The targets, measured", ""]
  for p in (4, 8):
    for order in (None, "blocks"):
      ring = [s for s in summary if s["network"] == "switch" and s["p"] == p
              and s["algorithm"] == "ring" and s["bytes"] >= 4 << 20
              and s.get("order") == order]  # fmt: skip
      if ring:
        cells = ", ".join(
          f"{units.format_bytes(s['bytes'])} {s['busbw_over_line']:.2f}" for s in ring
        )
        ok = all(s["busbw_over_line"] >= 0.90 for s in ring)
        lines.append(f"{'  - timed in blocks' if order else '- ring busbw / line rate on the'}"
                     f"{'' if order else f' {p}-host switch (target ≥ 0.90 from 4 MiB)'}:"
                     f" {cells}: {'met' if ok else 'not met'}.")  # fmt: skip
    queued = cluster_rows.line_shares(results.read_rows(root / "link_queue.jsonl", "bench"))
    for q, m in sorted({(k[1], k[2]) for k in queued if k[0] == p and k[1] != "100ms"}):
      med = {
        n: statistics.median(queued.get((p, q, m, "ring", n), [0])) for n in (4 << 20, 16 << 20)
      }
      lines.append(
        f"  - with `--queue {q} --mtu {m}` (median of repeats): "
        + ", ".join(f"{units.format_bytes(n)} {v:.2f}" for n, v in med.items())
        + (": met." if all(v >= 0.90 for v in med.values()) else ": not met.")
      )
    for a in ("halving_doubling", "recursive_doubling"):
      c = [s for s in summary if s["network"] == "switch" and s["p"] == p
           and s["algorithm"] == a and s["bytes"] == 16 << 20 and not s.get("order")]  # fmt: skip
      if c:
        c = c[0]
        lines.append(
          f"- {a} at 16 MiB on the {p}-host switch: {c['measured_s'] / c['model_full_s']:.2f}×"
          f" its full-duplex bound (target ≤ 1.2), {c['measured_s'] / c['model_half_s']:.2f}× the"
          " half-duplex one: the exchange runs half duplex in gloo (see above), not fixable from"
          " JAX; the reproduction is experiments/gloo_pair_order/gloo_exchange_half_duplex.py, and gloo alone with"
          " the receive posted first runs the exchange at full duplex (experiments/gloo_pair_order/,"
          " in its tables)."
        )
  wire_rows = results.read_rows(root / "wire_bytes.jsonl", "wire")
  if wire_rows:
    worst = max(wire_rows, key=lambda r: abs(r["ratio"] - 1))
    lines.append(
      f"- bytes on the wire vs the schedule, every algorithm and host at p = 2, 4, 8: worst"
      f" {worst['ratio']:.3f} ({worst['algorithm']}, p = {worst['p']}, host {worst['host']})"
      f" (target within 10 %): {'met' if abs(worst['ratio'] - 1) <= 0.10 else 'not met'}."
    )
  for net, p, order in [(net, p, o) for o in (None, "blocks") for net, p in NETS]:
    mine = [s for s in summary if s["network"] == net and s["p"] == p
            and s["algorithm"] != "psum" and s.get("order") == order]  # fmt: skip
    lines += _model_line(mine, f"{net} ({p} hosts{', timed in blocks' if order else ''})")
  return [*lines, ""]


def torus_lesson(summary: list[dict]) -> list[str]:
  """Far-first vs near-first halving-doubling vs Swing vs the ring on the 8-host ring."""
  mine = [s for s in summary if s["network"] == "torus:8" and s["algorithm"] in LESSON]
  if not mine:
    return []
  sizes = sorted({s["bytes"] for s in mine})
  t = {(s["algorithm"], s["bytes"]): s for s in mine}
  lines = [
    "### The ring of 8 hosts (torus:8): far-first vs near-first halving-doubling, Swing, ring",
    "",
    "Measured seconds; in brackets the half-duplex model's seconds (α fitted).",
    "",
    "| algorithm | " + " | ".join(units.format_bytes(n) for n in sizes) + " |",
    "|---|" + "---|" * len(sizes),
  ]
  for a in LESSON:
    cells = [
      f"{t[(a, n)]['measured_s']:.3g} s [{t[(a, n)]['model_half_s']:.3g}]" if (a, n) in t else "—"
      for n in sizes
    ]
    lines.append(f"| {a} | " + " | ".join(cells) + " |")
  return [*lines, ""]


LESSON = ("ring", "halving_doubling", "halving_doubling_near", "swing")


def headline(sweeps: list[list[dict]]) -> list[str]:
  """Over the sweeps at the 16 KiB TCP queue (each a list of cells): the ring's busbw /
  line rate on the switches, and how many hand-written cells at ≥ 1 MiB the replay prices
  within 20 %, median [min–max] over the sweeps."""
  cells = [c for sweep in sweeps for c in sweep]
  if not cells:
    return []
  lines = [f"### Over the {len(sweeps)} sweeps at `--tcp-queue 16KiB` (steps 5–8 and 10)", ""]
  for p in (4, 8):
    v = {
      n: [c["busbw_over_line"] for c in cells if c["network"] == "switch" and c["p"] == p
          and c["algorithm"] == "ring" and c["bytes"] == n]
      for n in (4 << 20, 16 << 20, 64 << 20)
    }  # fmt: skip
    lines.append(
      f"- ring busbw / line rate, {p}-host switch, median [min–max] over the sweeps:"
      + ",".join(f" {units.format_bytes(n)} {spread(x)}" for n, x in v.items() if x)
      + "."
    )
  for p in (4, 8):
    hd = [c["measured_s"] / c["bound_full_s"] for c in cells if c["network"] == "switch"
          and c["p"] == p and c["algorithm"] == "halving_doubling" and c["bytes"] == 16 << 20]  # fmt: skip
    if hd:
      lines.append(
        f"- halving_doubling at 16 MiB, {p}-host switch: {spread(hd)}× its full-duplex bound."
      )
  mine = [c for c in cells if c["algorithm"] not in ("psum", "auto")]
  half = sum(0.8 <= c["measured_s"] / c["model_half_s"] <= 1.2 for c in mine)
  bucket = sum(0.8 <= c["measured_s"] / c["model_bucket_s"] <= 1.2 for c in mine)
  share = []
  for sweep in sweeps:
    for net, p in NETS:
      m = [c for c in sweep if c["network"] == net and c["p"] == p and c in mine]
      if m:
        share.append(sum(0.8 <= c["measured_s"] / c["model_half_s"] <= 1.2 for c in m) / len(m))
  lines += [
    f"- the replay at half duplex (α fitted) within 20 %: {half} of {len(mine)} hand-written"
    f" cells at ≥ 1 MiB; per network and sweep {spread(share)} of the cells; with each"
    f" link's token bucket priced: {bucket} of {len(mine)}.",
    "",
  ]
  return lines


def _all_rows(root: Path) -> list[dict]:
  """Every bench row the tables price (each network's, round robin and in blocks)."""
  paths = sorted([*root.rglob("bench_*.jsonl"), *root.rglob("blocks_*.jsonl")])
  return [r for path in paths for r in results.read_rows(path, "bench")]


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  """``{file name: text}`` from the rows under ``root``, priced with the cost parameters
  the rows traced with (``gloo_model.traced_params``: the schedules as they ran)."""
  with cost_model.use_params(gloo_model.traced_params(_all_rows(root))):
    summary = cells(root, "bench_", {})
    in_blocks = cells(root, "blocks_", {"order": "blocks"}, robin="bench_")
    sets = [cells(root / folder, "blocks_", tags, bucket=True) for folder, tags in SETS.items()]
    text = [TITLE, *headline(sets), *small_queue_targets(root, *sets)]
    text += targets(root, summary + in_blocks) + torus_lesson(summary)
  return {"tables.md": "\n".join(text)}


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
