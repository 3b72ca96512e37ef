"""tables.md and mpi_peer.png from rows/: MPI_Allreduce (Open MPI's algorithms, forced one
per launch) beside the hand-written algorithms and psum over gloo, per size, one table per
network (:func:`network_table`: the 4-host switch, its 1 KiB-64 MiB sweep, the 2:1 fat tree,
the 8-host switch and ring of links; ``run.py compare``), the 4-host switch again under
Linux's defaults beside its set-up (:func:`settings_table`, ``run.py compare linux``), and the
bytes on the wire (:func:`wire_table`, ``run.py wire``).

    python experiments/mpi_peer/tables.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from allreduce_jax import gloo_model, results
from allreduce_jax.units import format_bytes, spread

HERE = Path(__file__).resolve().parent
#: Column order: the hand-written algorithms, then the peers (psum over gloo, Open MPI's).
ORDER = ("ring", "bidirectional_ring", "halving_doubling", "recursive_doubling", "tree", "psum",
         "mpi(default)", "mpi(recursive_doubling)", "mpi(ring)", "mpi(segmented_ring)",
         "mpi(rabenseifner)")  # fmt: skip
#: Each network's runs: (rows' file pattern, heading, what ran; None: the first table's heading).
NETWORKS = (
  ("run*_alg*.jsonl", None, "Emulated 4-host switch, 200 Mbit/s links, one device per host"),
  ("sweep_run*_alg*.jsonl", "The 4-host switch, 1 KiB to 64 MiB (run.py compare sweep)",
   "Emulated 4-host switch, 200 Mbit/s links"),
  ("fat_tree_run*_alg*.jsonl", "The 2:1 fat tree (run.py compare fat_tree)",
   "Emulated 4 hosts, 2 per leaf, 200 Mbit/s links, leaf uplinks oversubscribed 2:1"),
  ("switch8_run*_alg*.jsonl", "The 8-host switch (run.py compare eight_hosts)",
   "Emulated 8-host switch, 200 Mbit/s links"),
  ("torus8_run*_alg*.jsonl", "The 8-host ring of links (run.py compare eight_hosts)",
   "Emulated 8 hosts joined in a ring of 200 Mbit/s links (torus:8: each host linked to its two"
   " neighbours, the others' traffic forwarded by the hosts between)"),
)  # fmt: skip


def rows(pattern: str = "run*_alg*.jsonl", root: Path = HERE / "rows") -> list[dict]:
  """Every bench row of ``root/pattern``, with its ``run`` (the repetition: run1_alg6 ->
  run1) and ``launch`` (its file)."""
  out = []
  for path in sorted(root.glob(pattern)):
    run = path.stem.split("_alg")[0]
    out += [{**r, "run": run, "launch": path.stem} for r in results.read_rows(path, "bench")]
  return out


def label(r: dict) -> str:
  return f"mpi({r['mpi_algorithm']})" if r["algorithm"] == "mpi" else r["algorithm"]


def is_peer(name: str) -> bool:
  return name == "psum" or name.startswith("mpi(")


def launches(data: list[dict]) -> dict[tuple[str, int], dict[str, dict[str, float]]]:
  """(label, bytes) -> {rep: {launch: seconds}}: one launch per Open MPI algorithm forced,
  each timing its hand-written algorithms, psum and MPI side by side. Where a rep has
  launches timed in blocks (``--order blocks``) that timed the label, only those: in round
  robin each algorithm's calls start after the previous algorithm's, and an algorithm whose
  hosts finish apart (the tree, Open MPI's slower ones) passes that skew on."""
  out: dict[tuple[str, int], dict[str, dict[str, float]]] = {}
  blocks = {r["launch"] for r in data if r.get("order") == "blocks"}
  for r in data:
    out.setdefault((label(r), r["bytes"]), {}).setdefault(r["run"], {})[r["launch"]] = (
      r["time_us"] * 1e-6
    )
  for reps in out.values():
    for run, ts in reps.items():
      if blocks & set(ts):
        reps[run] = {k: t for k, t in ts.items() if k in blocks}
  return out


def times(data: list[dict], per=None) -> dict[tuple[str, int], dict[str, float]]:
  """(label, bytes) -> {rep: seconds} (the hand-written algorithms and psum ran beside
  each of Open MPI's forced algorithms: the median of a rep's launches, so every cell is
  over the reps); ``per``: :func:`launches` of ``data``, where already made."""
  return {
    key: {run: statistics.median(ts.values()) for run, ts in reps.items()}
    for key, reps in (per or launches(data)).items()
  }


def _runs(data: list[dict]) -> str:
  """How many runs the cells are over: "3 runs", or "3 runs (4 at 16 MiB)" where some
  sizes were repeated more."""
  per = {n: len({r["run"] for r in data if r["bytes"] == n}) for n in {r["bytes"] for r in data}}
  base = min(per.values())
  more = [f"{k} at {format_bytes(n)}" for n, k in sorted(per.items()) if k != base]
  return f"{base} run{'s' * (base != 1)}" + (f" ({', '.join(more)})" if more else "")


def best_ratio(data: list[dict], n: int, per=None) -> tuple[str, str, list[float]] | None:
  """The best peer and best hand-written algorithm at ``n`` (by their medians over the
  reps) and, per rep, the peer's time over the hand-written one's *within the same launch*
  (the median over the rep's launches that timed both; ≥ 1: the hand-written one is at
  least as fast). Pairing within a launch keeps one launch's conditions, e.g. a slow MPI
  algorithm's skew carried into the next algorithm's calls, out of the other's time.
  ``per``: :func:`launches` of ``data``, where already made."""
  per = per or launches(data)
  cells = times(data, per)
  med = {k: statistics.median(v.values()) for (k, m), v in cells.items() if m == n}
  own = [k for k in med if not is_peer(k)]
  peers = [k for k in med if is_peer(k)]
  if not own or not peers:
    return None
  a, b = min(own, key=med.get), min(peers, key=med.get)
  ratios = []
  for rep in sorted(set(per[(a, n)]) & set(per[(b, n)])):
    ta, tb = per[(a, n)][rep], per[(b, n)][rep]
    both = sorted(set(ta) & set(tb))
    if both:
      ratios.append(statistics.median(tb[k] / ta[k] for k in both))
  return a, b, ratios


def _order(data: list[dict]) -> str:
  """Which launches were timed in blocks: "; the launches forcing X, Y (at 1 KiB–256 KiB)
  timed in blocks ..." (the sizes, where the same algorithm ran round robin at others)."""
  sizes: dict[tuple[str, str], set[int]] = {}
  for r in data:
    if r["algorithm"] == "mpi":
      sizes.setdefault((r["mpi_algorithm"], r.get("order", "round-robin")), set()).add(r["bytes"])
  blocks = []
  for alg in sorted({a for a, o in sizes if o == "blocks"}):
    at = sorted(sizes[(alg, "blocks")])
    rr = sizes.get((alg, "round-robin"))
    if not rr:
      blocks.append(alg)
    elif rr == set(at):
      blocks.append(f"{alg} (in other launches also round robin)")
    else:
      blocks.append(f"{alg} (at {format_bytes(at[0])}–{format_bytes(at[-1])})")
  if not blocks:
    return "; every launch timed round robin"
  return (
    f"; the launches forcing {', '.join(blocks)} timed in blocks (`--order blocks`), the others"
    " round robin; an algorithm that ran in both takes only its blocks launches"
  )


NETWORK = """\
{head}{what}; time per all-reduce in ms, median [min–max] over {runs} (each the median of \
{iters} calls after 1 warm-up); Open MPI's algorithm forced per launch through coll_tuned\
{order}; taken beside other work on the same CPU.

| size | {columns} | best hand-written | best peer | best peer ÷ best hand-written, per run |
{rule}|
{lines}"""

CLOSING = """

The last column is, per run (rep), the best peer's time over the best hand-written \
algorithm's (the two chosen by their medians over the runs) within the same launch, the \
median over the run's launches that timed both; median [min–max] over the runs: at 1.00 \
or above the hand-written one is at least as fast. A hand-written algorithm's or psum's \
cell takes, per run, the median over that run's launches (its launches timed in blocks, \
where it has some)."""


def network_table(pattern: str, heading: str | None, what: str, root: Path = HERE / "rows") -> str:
  """One network's table: every algorithm's time per size, and the best peer over the
  best hand-written algorithm (:func:`best_ratio`)."""
  data = rows(pattern, root)
  if not data:
    return ""
  per = launches(data)
  cells = times(data, per)
  present = {k for k, _ in cells}
  names = [k for k in ORDER if k in present] + sorted(present - set(ORDER))
  lines = []
  for n in sorted({n for _, n in cells}):
    best = best_ratio(data, n, per)
    tail = f"`{best[0]}` | `{best[1]}` | {spread(best[2])}×" if best else "— | — | —"
    sizes = " | ".join(spread(cells.get((k, n), {}).values(), "auto", scale=1e3) for k in names)
    lines.append(f"| {format_bytes(n)} | {sizes} | {tail} |")
  return NETWORK.format(
    head=f"\n## {heading}\n\n" if heading else "", what=what, runs=_runs(data),
    iters="/".join(map(str, sorted({r["iters"] for r in data}))), order=_order(data),
    columns=" | ".join(f"`{n}`" for n in names), rule="|---" * (len(names) + 4),
    lines="\n".join(lines),
  )  # fmt: skip


#: The repetition of the 4-host switch under Linux's defaults (``run.py compare linux``).
LINUX = ("linux_run*_alg*.jsonl", "The 4-host switch under Linux's defaults (run.py compare linux)",
         "Emulated 4-host switch, 200 Mbit/s links, a 4 MiB per-socket TCP queue (Linux's"
         " default), 500 ms link queues, each row the slowest host's time (bench -a 3)")  # fmt: skip
PATHS = ("ring", "halving_doubling", "psum", "mpi(default)", "mpi(recursive_doubling)",
         "mpi(ring)", "mpi(segmented_ring)", "mpi(rabenseifner)")  # fmt: skip

SETTINGS = """

## What Linux's defaults change (the 4-host switch, round robin)

Each path's share of the 200 Mbit/s line rate (the ring's bound 2(p−1)/p · n / B over the \
time; TCP/IP headers not priced) and its time over the hand-written ring's in the same launch, \
median [min–max] over the runs: **set-up as above** (a 16 KiB per-socket TCP queue, 100 ms link \
queues, process 0's time; its {tuned}, round robin only) beside **Linux's defaults** (a 4 MiB \
TCP queue, 500 ms link queues, the slowest host's time; {linux}). Both time calls back to \
back, round robin, after 1 warm-up.

| size | path | share of line rate, set-up as above | under Linux's defaults | defaults ÷ \
set-up | ÷ ring in its launch, set-up as above | under Linux's defaults |
|---|---|---|---|---|---|---|
{lines}"""


def _shares(data: list[dict]) -> tuple[dict, dict]:
  """(label, bytes) -> per run: the share of line rate, and the time over the ring's
  within each launch (the median over the run's launches)."""
  per = launches(data)
  p, link = data[0]["n_devices"], json.loads(data[0]["key"])["network"]["link_Bps"]
  share = {(k, n): [2 * (p - 1) / p * n / link / t for t in v.values()]
           for (k, n), v in times(data, per).items()}  # fmt: skip
  ratio = {}
  for (k, n), reps in per.items():
    ring = per.get(("ring", n), {})
    ratio[(k, n)] = [statistics.median(ts[x] / ring[run][x] for x in ts if x in ring[run])
                     for run, ts in reps.items() if run in ring and set(ts) & set(ring[run])]  # fmt: skip
  return share, ratio


def settings_table(root: Path = HERE / "rows") -> str:
  """The 4-host switch's round-robin launches as set up (``run*_alg*``) beside its
  repetition under Linux's defaults (:data:`LINUX`): each path's share of line rate and
  its time over the ring's in the same launch."""
  tuned = [r for r in rows("run*_alg*.jsonl", root) if r.get("order") == "round-robin"]
  linux = rows(LINUX[0], root)
  if not tuned or not linux:
    return ""
  (s0, r0), (s1, r1) = _shares(tuned), _shares(linux)
  lines = []
  for n in sorted({n for _, n in s1}):
    for k in (k for k in PATHS if (k, n) in s0 and (k, n) in s1):
      moved = statistics.median(s1[(k, n)]) / statistics.median(s0[(k, n)])
      ratios = ("—", "—") if k == "ring" else (spread(r0[(k, n)]), spread(r1[(k, n)]))
      lines.append(f"| {format_bytes(n)} | `{k}` | {spread(s0[(k, n)])} | {spread(s1[(k, n)])} |"
                   f" {moved:.2f} | {ratios[0]} | {ratios[1]} |")  # fmt: skip
  return SETTINGS.format(tuned=_runs(tuned), linux=_runs(linux), lines="\n".join(lines))


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  if not rows(root=root):
    return {}
  parts = ["# MPI_Allreduce beside the hand-written algorithms (generated by tables.py)\n"]
  parts += [network_table(*net, root=root) for net in (*NETWORKS, LINUX)]
  wires = "".join(wire_table(root, pattern) for pattern in WIRES)
  settings = settings_table(root)
  return {"tables.md": "\n".join(p for p in parts if p) + CLOSING + settings + wires + "\n"}


# Bytes on the wire (run.py wire, wire.py): rows/wire_run*.jsonl, one row per (algorithm, host).

WIRE_ORDER = ("mpi(ring)", "mpi(segmented_ring)", "mpi(rabenseifner)", "mpi(recursive_doubling)",
              "mpi(default)", "ring", "halving_doubling", "recursive_doubling", "psum")  # fmt: skip
FORMULA = {"mpi(recursive_doubling)": "lg p · n", "recursive_doubling": "lg p · n"}

WIRE = """

## {heading}

{network}, p = {p}, n = {mib} MiB per host; bytes each host's interfaces sent \
and received per call ({reps} calls counted, an idle interval subtracted), median [min–max] \
over the hosts of {runs} runs; schedule: the closed form (Thakur, Rabenseifner & Gropp 2005) \
or the library's schedule_bytes. The last column prices TCP/IP/Ethernet headers per \
1500-byte frame (schedule ÷ payload_share = schedule ÷ {share:.3f}).

| algorithm | schedule | schedule (MB) | sent (MB) | received (MB) | sent ÷ schedule \
| sent ÷ framed schedule | #wrong |
|---|---|---|---|---|---|---|---|
{lines}"""


#: The bytes-on-the-wire runs: rows' file pattern -> (heading, network).
WIRES = {
  "wire_run*.jsonl": ("Bytes on the wire (run.py wire)", "Emulated 4-host switch"),
  "wire_torus8_alg4.jsonl": ("Bytes on the wire on the 8-host ring of links (wire.py, Open MPI's"
                             " ring forced, once)", "Emulated 8 hosts in a ring of links (torus:8)"),
}  # fmt: skip


def wire_rows(root: Path = HERE / "rows", pattern: str = "wire_run*.jsonl") -> list[dict]:
  paths = sorted(root.glob(pattern))
  return [{**r, "run": path.stem} for path in paths for r in results.read_rows(path, "wire")]


def wire_table(root: Path = HERE / "rows", pattern: str = "wire_run*.jsonl") -> str:
  """Each host's interface bytes per call over the schedule's (``mpi(default)``, whose
  algorithm Open MPI picks, over the ring's ``2 (p-1)/p · n``), for the runs of
  ``pattern`` (:data:`WIRES`)."""
  data = wire_rows(root, pattern)
  if not data:
    return ""
  share = gloo_model.payload_share(1500)
  by: dict[str, list[dict]] = {}
  for r in data:
    by.setdefault(r["algorithm"], []).append(r)
  lines = []
  for name in [*WIRE_ORDER, *sorted(set(by) - set(WIRE_ORDER))]:
    rs = by.get(name)
    if not rs:
      continue
    p, n = rs[0]["p"], rs[0]["bytes"]
    schedule = rs[0]["schedule_bytes"] or 2 * (p - 1) / p * n
    formula = FORMULA.get(name, "2 (p−1)/p · n")
    if rs[0]["schedule_bytes"] is None:
      formula = "its pick (ring's " + formula + " shown)"
    sent = [r["sent"] for r in rs]
    ratio = [s / schedule for s in sent]
    lines.append(
      f"| `{name}` | {formula} | {schedule / 1e6:.3f} | {spread(sent, '.3f', scale=1e-6)}"
      f" | {spread((r['received'] for r in rs), '.3f', scale=1e-6)}"
      f" | {spread(ratio, '.4f')} | {statistics.median(ratio) * share:.3f} |"
      f" {sum(r['wrong'] for r in rs)} |"
    )
  first = data[0]
  heading, network = WIRES[pattern]
  return WIRE.format(
    heading=heading, network=network, p=first["p"], mib=first["bytes"] >> 20, reps=first["reps"], runs=len({r["run"] for r in data}),
    share=share, lines="\n".join(lines),
  )  # fmt: skip


#: Open MPI's algorithm beside the hand-written one it runs (the same colour, dashed).
MPI_KIN = {"mpi(ring)": "ring", "mpi(segmented_ring)": "ring",
           "mpi(recursive_doubling)": "recursive_doubling", "mpi(rabenseifner)": "halving_doubling"}  # fmt: skip


def look(name: str) -> dict:
  """A series' look: the hand-written algorithms in the project's palette (solid), psum
  black with hollow markers (it lies on the ring where both run gloo's ring), Open MPI's
  algorithms dashed in the colour of the hand-written one they run (segmented ring
  dotted), Open MPI's own choice dark grey."""
  from allreduce_jax.palette import style

  if name == "psum":
    return {"color": "black", "marker": "o", "mfc": "none", "ms": 6, "linestyle": "-", "lw": 1}
  if name in MPI_KIN:
    dots = ":" if name == "mpi(segmented_ring)" else "--"
    return {"color": style(MPI_KIN[name])["color"], "marker": "x", "ms": 5, "linestyle": dots}
  if name.startswith("mpi("):
    return {"color": "#4d4d4d", "marker": "x", "ms": 5, "linestyle": "-."}
  return {**style(name), "linestyle": "-", "ms": 3}


def figure(path: Path):
  """Every network's times against the size, one panel each and one legend for all (each
  series in its :func:`look`, sizes in bytes as measured); saved to ``path``, returned."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  nets = [(heading or "The 4-host switch, Open MPI's algorithms", rows(pattern))
          for pattern, heading, _ in NETWORKS]  # fmt: skip
  nets = [(h, d) for h, d in nets if d]
  cols = 3 if len(nets) > 4 else 2
  n_rows = -(-(len(nets) + 1) // cols)  # and a panel for the legend
  fig, axes = plt.subplots(n_rows, cols, figsize=(6 * cols, 4.2 * n_rows), squeeze=False)
  handles: dict = {}
  for ax, (heading, data) in zip(axes.flat, nets):
    cells = times(data)
    sizes = [n for _, n in cells]
    for name in ("psum", *(n for n in ORDER if n != "psum")):  # psum under the ring
      pts = sorted((n, statistics.median(v.values())) for (k, n), v in cells.items() if k == name)
      if pts:
        (line,) = ax.plot([n for n, _ in pts], [t * 1e3 for _, t in pts], label=name,
                          **look(name))  # fmt: skip
        handles.setdefault(name, line)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted(set(sizes))
    ticks = ticks[:: -(-len(ticks) // 6)]  # at most 6 labels: the sizes measured
    ax.set_xticks(ticks, [format_bytes(n) for n in ticks], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("bytes per host")
    ax.set_ylabel("time per all-reduce (ms)")
    ax.set_title(heading.split(" (")[0], fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
  spare = list(axes.flat)[len(nets)]
  names = [n for n in ORDER if n in handles]
  spare.legend([handles[n] for n in names], names, loc="center", fontsize=9, frameon=False,
               title="solid: hand-written (psum: XLA's, over gloo)\ndashed, x: Open MPI's"
               " MPI_Allreduce, forced\nto the algorithm of that colour", title_fontsize=9)  # fmt: skip
  for ax in list(axes.flat)[len(nets) :]:
    ax.set_axis_off()
  fig.suptitle("MPI_Allreduce vs hand-written vs psum over gloo, 200 Mbit/s links", fontsize=11)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  return fig


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
  figure(HERE / "mpi_peer.png")
