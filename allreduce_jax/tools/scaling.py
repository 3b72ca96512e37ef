"""Scaling by model (``allreduce-jax scaling``): predicted all-reduce time up to 16384 devices.

Nothing here runs a collective: times come from the α-β-γ model
(:func:`allreduce_jax.cost_model.predict_two_level_seconds`) on two machines:

- ``gpu-cluster``: ``--per-node`` devices per node on NVLink (``--inner``, default
  the ``nvlink4`` preset: 3.4 µs, 450 GB/s per direction), nodes on InfiniBand
  (``--outer``, default ``ib_ndr``: 5 µs, 50 GB/s per NIC, one NIC per device);
- ``local-fit``: a flat machine with the parameters fitted on this platform
  (``results/cost_params.json``, shared fit), when that file exists.

Ring's 2(p-1) sequential steps make its latency term grow linearly with p, while
tree / halving-doubling need O(lg p) steps and hierarchical puts only 2(b-1) steps
on the slow links: the figure marks the participant count at which the flat ring
stops being the best choice, per message size, and by how much it loses at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

from tqdm import tqdm

from allreduce_jax import ALGORITHMS, cost_model, names, topology, units
from allreduce_jax.cost_model import params_to_dict
from allreduce_jax.results import fingerprint
from allreduce_jax.tools import plot
from allreduce_jax.tools._args import (
  add_rows_out,
  figure_path,
  nonempty,
  nonnegative_float,
  params_file,
  positive_int,
  row_store,
  size_list,
)
from allreduce_jax.units import format_bytes, parse_size

SIZES: tuple[int, ...] = (1 << 20, 100 << 20, 1 << 30)
PS: tuple[int, ...] = tuple(8 << k for k in range(12))  # 8 ... 16384


#: What ``--inner``, ``--outer`` and ``--link`` take (cost_model.parse_link).
LINK_HELP = "a preset ({presets}) or 'LATENCY_US,RATE' (5,400Gbit or 3.4,450GB/s), RATE " + (
  units.RATE_HELP
)

#: Defaults of the options that only one of the two models reads (None in the parser, so
#: that an option given to the other model is an error, not silently ignored).
TWO_LEVEL_DEFAULTS = {"inner": "nvlink4", "outer": "ib_ndr"}
TOPOLOGY_DEFAULTS = {"link": "ib_ndr", "hop_latency_us": 0.0, "algorithms": None, "ps": None}


def _only_with(args: argparse.Namespace, names, where: str) -> None:
  """Refuses an option of ``names`` that the chosen model does not read, naming it."""
  for name in names:
    if getattr(args, name) is not None:
      opt = "--" + name.replace("_", "-")
      raise SystemExit(f"{opt} applies only {where}; drop it or {_FIX[where]}.")


_FIX = {
  "with --topology": "add --topology SPEC (e.g. --topology fat_tree:8:7)",
  "without --topology": "use --link for the replay's links (islands take theirs in the spec)",
}


def _link(text: str, name: str):
  """``--inner/--outer/--link``: a preset or ``latency_us,bandwidth`` (cost_model.parse_link)."""
  try:
    return cost_model.parse_link(text, name)
  except ValueError as e:
    raise SystemExit(str(e)) from None


def two_level_algorithms() -> tuple[str, ...]:
  """The hand-written algorithms whose registry record has a two-level model (its
  ``two_level`` field) and is meant for scale (``at_scale``), in registry order: the
  default of :func:`sweep`."""
  return names(hand_written=True, two_level=True, at_scale=True)


def sweep(machine, scenario: str, ps=PS, sizes=SIZES, algorithms=None) -> list[dict]:
  """One row per (size, p, algorithm) with the predicted time, the best algorithm at
  that point and how much slower than it the flat ring is. ``algorithms``: default
  :func:`two_level_algorithms`."""
  algorithms = two_level_algorithms() if algorithms is None else tuple(algorithms)

  rows = []
  for n in sizes:
    for p in ps:
      t = {a: cost_model.predict_two_level_seconds(a, p, n, machine) for a in algorithms}
      best = min(t, key=t.get)
      for a in algorithms:
        rows.append(
          {
            "scenario": scenario,
            "algorithm": a,
            "p": p,
            "bytes": n,
            "predicted_us": t[a] * 1e6,
            "best": best,
            "ring_over_best": t["ring"] / t[best] if "ring" in t else None,
          }
        )
  return rows


def crossovers(rows: list[dict], tolerance: float = 0.05) -> list[dict]:
  """Per (scenario, size): the participant count from which on the flat ring is
  never again within ``tolerance`` of the best algorithm, what wins there, and
  ring's slowdown factor at the largest p."""
  out = []
  for key in sorted({(r["scenario"], r["bytes"]) for r in rows}):
    mine = sorted(
      (r for r in rows if (r["scenario"], r["bytes"]) == key and r["algorithm"] == "ring"),
      key=lambda r: r["p"],
    )
    competitive = [r["ring_over_best"] <= 1 + tolerance for r in mine]
    loses = None  # index of the first p of the final run where ring is not competitive
    for k in range(len(mine) - 1, -1, -1):
      if competitive[k]:
        break
      loses = k
    out.append(
      {
        "scenario": key[0],
        "bytes": key[1],
        "tolerance": tolerance,
        "ring_competitive_until": mine[loses - 1]["p"]
        if loses
        else (None if loses == 0 else mine[-1]["p"]),
        "ring_loses_at": mine[loses]["p"] if loses is not None else None,
        "winner_there": mine[loses]["best"] if loses is not None else "ring",
        "ring_over_best_there": mine[loses]["ring_over_best"] if loses is not None else 1.0,
        "ring_over_best_at_max_p": mine[-1]["ring_over_best"],
        "best_at_max_p": mine[-1]["best"],
        "max_p": mine[-1]["p"],
      }
    )
  return out


def _crossover_text(c: dict) -> str:
  """One line per crossover, with no ``p=None`` where ring always or never wins."""
  at_max = f"at p={c['max_p']} ring is {c['ring_over_best_at_max_p']:.2f}x the best"
  if c["ring_loses_at"] is None:
    return f"ring within 5% of the best at every p up to {c['max_p']}"
  lead = (
    f"ring within 5% of the best up to p={c['ring_competitive_until']}; from"
    f" p={c['ring_loses_at']} on"
    if c["ring_competitive_until"] is not None
    else f"ring never within 5% of the best (from p={c['ring_loses_at']});"
  )
  return (
    f"{lead} {c['winner_there']} is {c['ring_over_best_there']:.2f}x faster;"
    f" {at_max} ({c['best_at_max_p']})"
  )


def _append_new(store, rows: list[dict], extra: dict | None = None) -> None:
  """Appends the rows whose key (scenario, algorithm, p, size over the run's
  configuration, plus ``extra[scenario]``) is not in the file yet: a rerun resumes,
  another configuration adds its rows next to the earlier ones (none is deleted)."""
  extra = extra or {}
  keys = [
    store.key(scenario=r["scenario"], algorithm=r["algorithm"], p=r["p"], bytes=r["bytes"],
              **extra.get(r["scenario"], {}))
    for r in rows
  ]  # fmt: skip
  done = store.done()
  new = [(r, k) for r, k in zip(rows, keys) if k not in done]
  store.extend([r for r, _ in new], [k for _, k in new])


def configure(parser: argparse.ArgumentParser) -> None:
  presets = ", ".join(cost_model.PRESETS)
  parser.add_argument(
    "--inner",
    default=None,
    help="the link inside a node (two-level model; default nvlink4): "
    + LINK_HELP.format(presets=presets),
  )
  parser.add_argument(
    "--outer",
    default=None,
    help="the link between nodes (two-level model; default ib_ndr): the same forms as --inner",
  )
  parser.add_argument(
    "--per-node", type=positive_int, default=8, help="devices per node (default 8)"
  )
  parser.add_argument(
    "--nics-per-node", type=positive_int, default=8, help="NICs per node (default 8)"
  )
  parser.add_argument(
    "--max-p", type=positive_int, default=16384, help="the largest participant count modelled"
  )
  parser.add_argument(
    "--sizes", type=nonempty(size_list), default="1MiB,100MiB,1GiB", help="bytes per device"
  )
  parser.add_argument("--params", default=None, help="local fit file (default: auto's)")
  add_rows_out(parser, "results/scaling.jsonl")
  parser.add_argument(
    "--smoke", action="store_true", help="p up to 64 only (or up to --max-p where that is lower)"
  )
  parser.add_argument(
    "--topology",
    action="append",
    default=None,
    metavar="SPEC",
    help="replay every algorithm's message steps on a network instead of the two-level"
    " model (repeatable): switch[:ports], torus:16x16x16 | torus:3d, fat_tree:8:7,"
    " islands:8:nvlink4:ib_ndr",
  )
  parser.add_argument(
    "--link",
    default=None,
    help="with --topology: every link of the network (default ib_ndr): the same forms as --inner",
  )
  parser.add_argument(
    "--hop-latency-us",
    type=nonnegative_float,
    default=None,
    help="with --topology: latency per hop (µs, ≥ 0; default 0)",
  )
  parser.add_argument(
    "--algorithms", default=None, help="with --topology: comma-separated (default: all replayable)"
  )
  parser.add_argument(
    "--ps", default=None, help="with --topology: comma-separated participant counts (e.g. 24576)"
  )


def _max_p(args: argparse.Namespace) -> int:
  """``--max-p``, lowered to 64 by ``--smoke``."""
  return min(64, args.max_p) if args.smoke else args.max_p


def run(args: argparse.Namespace) -> int:
  if args.topology:
    _only_with(args, TWO_LEVEL_DEFAULTS, "without --topology")
    for name, default in TOPOLOGY_DEFAULTS.items():
      setattr(args, name, default if getattr(args, name) is None else getattr(args, name))
    return run_topology(args)
  _only_with(args, TOPOLOGY_DEFAULTS, "with --topology")
  for name, default in TWO_LEVEL_DEFAULTS.items():
    setattr(args, name, default if getattr(args, name) is None else getattr(args, name))

  sizes = args.sizes
  max_p = _max_p(args)
  ps = [p for p in PS if p <= max_p and p % args.per_node == 0]
  if not ps:
    raise SystemExit(
      f"--max-p {max_p}: no participant count to model (multiples of --per-node"
      f" {args.per_node} among {PS[0]}, {PS[1]}, ... up to --max-p)."
    )
  machine = cost_model.TwoLevel(
    _link(args.inner, "--inner"), _link(args.outer, "--outer"), args.per_node, args.nics_per_node
  )
  # Every input and output problem is found here, before any row is computed.
  path = Path(args.params) if args.params else cost_model.default_fit_path()
  local = None
  if args.params or path.exists():  # a FIFO is refused unopened (no hang)
    local = params_file(path, "--params").shared
  context = {"per_node": args.per_node, "nics_per_node": args.nics_per_node}
  context |= {"inner": args.inner, "outer": args.outer}
  store = row_store(args.out, "scaling", fresh=args.fresh, context=context)
  fig = figure_path(args.plot or Path(args.out).with_suffix(".png"), "--plot")
  rows = sweep(machine, "gpu-cluster", ps, sizes)
  if local is not None:
    flat = cost_model.TwoLevel(local, local, args.per_node, 1)
    rows += sweep(flat, "local-fit", ps, sizes)
  for r in rows:
    r.update(per_node=args.per_node, inner=args.inner, outer=args.outer)
  out = Path(args.out)
  extra = {"local-fit": {"local_params": fingerprint(params_to_dict(local))}} if local else {}
  _append_new(store, rows, extra)
  print(f"# scaling by model: inner {args.inner}, outer {args.outer}, {args.per_node}/node")
  algorithms = two_level_algorithms()
  print(f"{'scenario':>12} {'size':>7} {'p':>6} " + " ".join(f"{a:>16}" for a in algorithms))
  for sc in dict.fromkeys(r["scenario"] for r in rows):
    for n in sizes:
      for p in ps:
        t = {
          r["algorithm"]: r["predicted_us"]
          for r in rows
          if (r["scenario"], r["bytes"], r["p"]) == (sc, n, p)
        }
        print(
          f"{sc:>12} {format_bytes(n):>7} {p:>6} "
          + " ".join(f"{t[a]:>14.1f}us" for a in algorithms)
        )
  print("# where the flat ring stops being the best choice:")
  for c in crossovers(rows):
    print(f"#   {c['scenario']:>12} {format_bytes(c['bytes']):>7}: {_crossover_text(c)}")

  plot.save(plot.scaling(rows, crossovers(rows)), fig, dpi=110)
  print(f"# rows: {out}  figure: {fig}")
  return 0


# ----------------------------------------------------------------------------------------
# --topology: replay each algorithm's message steps on a network (allreduce_jax.topology).
# ----------------------------------------------------------------------------------------


def topology_algorithms(wanted=None) -> tuple[str, ...]:
  """``wanted`` (default: every hand-written algorithm meant for scale, in registry
  order) that are registered with a message generator: the ones ``--topology`` replays."""
  replayable = names(replayable=True)
  wanted = names(hand_written=True, at_scale=True) if wanted is None else tuple(wanted)
  return tuple(a for a in wanted if a in replayable)


#: The most messages one replayed schedule may have (about 150 bytes each in Python).
REPLAY_MESSAGES = 50_000_000


def replay_messages_at(algorithm: str, p: int) -> float:
  """About how many messages ``algorithm``'s schedule has at ``p``: counted at p = 64
  and 128 and extrapolated as a power of p (exact for the p·steps schedules here)."""
  if ALGORITHMS[algorithm].axes > 1:  # per-axis rings: never more than p·lg p·2 here
    return 2 * p * math.log2(max(p, 2))
  if p <= 128:
    return topology.distinct_messages(topology.messages(algorithm, (p,)))
  a, b = (topology.distinct_messages(topology.messages(algorithm, (q,))) for q in (64, 128))
  return b * (p / 128) ** math.log2(max(b / a, 1.0))


def sweep_topology(top, params, ps=PS, sizes=SIZES, algorithms=None) -> list[dict]:
  """One row per (topology, size, p, algorithm): the replayed time on ``top`` (one
  topology or a list), the flat model's (the same steps on ``topology.switch()``), the
  bandwidth term in units of n·β, the best algorithm there and the ring's slowdown
  against it. ``params``: one link's α, β, γ (islands use their own α, β per level)."""
  algorithms = topology_algorithms(algorithms)
  tops = list(top) if isinstance(top, (list, tuple)) else [top]
  flat = topology.switch()
  rows = []
  # Replaying to 16384 participants takes minutes: count, rate and ETA on stderr, only
  # on a terminal (p doubles, so the last steps take the longest).
  bar = tqdm(ps, desc="replay", unit="p", file=sys.stderr, disable=None, leave=False)
  for p in bar:  # p outermost: one schedule serves every size and topology
    for n in sizes:
      for top in tops:
        if top.capacity() is not None and p > top.capacity():
          continue
        t = {a: topology.predict_seconds(a, p, n, params, top) for a in algorithms}
        best = min(t, key=t.get)
        for a in algorithms:
          prof = topology.algorithm_profile(a, p, top, n)
          sizes_here = topology.axis_sizes(a, p, top)  # the flat model on the same mesh
          flat_s = topology.predict_seconds(a, p, n, params, flat, sizes_here)
          rows.append(
            {
              "scenario": top.name,
              "algorithm": a,
              "p": p,
              "bytes": n,
              "predicted_us": t[a] * 1e6,
              "flat_us": flat_s * 1e6,
              "over_flat": t[a] / flat_s if flat_s else None,
              "bandwidth_nbeta": float(prof.max_load().sum()),
              # the first half of the steps: the reduce-scatter of an RS + AG schedule
              "first_half_nbeta": float(prof.max_load()[: prof.steps // 2].sum()),
              "steps": prof.steps,
              "sizes": list(sizes_here),
              "best": best,
              "ring_over_best": t["ring"] / t[best] if "ring" in t else None,
            }
          )
  return rows


def run_topology(args: argparse.Namespace) -> int:
  """``scaling --topology ...``: the replayed sweep, its JSONL rows and figure."""

  tops = []
  for text in args.topology:
    try:
      top = topology.parse(text)
    except ValueError as e:
      raise SystemExit(str(e)) from None
    if hasattr(top, "hop_latency"):
      top = dataclasses.replace(top, hop_latency=args.hop_latency_us * 1e-6)
    tops.append(top)
  params = _link(args.link, "--link")
  sizes = args.sizes
  if isinstance(sizes, str):  # not yet parsed by the argument type
    try:
      sizes = [parse_size(s, "--sizes") for s in sizes.split(",") if s.strip()]
    except ValueError as e:
      raise SystemExit(str(e)) from None
  wanted = [a.strip() for a in args.algorithms.split(",")] if args.algorithms else None
  algorithms = topology_algorithms(wanted)
  if wanted and set(wanted) - set(algorithms):
    raise SystemExit(
      f"--algorithms: {', '.join(sorted(set(wanted) - set(algorithms)))} cannot be replayed;"
      f" choose from {', '.join(topology_algorithms())}."
    )
  if "ring" not in algorithms:
    raise SystemExit("--algorithms must include ring (the figure marks where it loses).")
  max_p = _max_p(args)
  ps = [p for p in PS if p <= max_p]
  if args.ps:
    try:
      ps = sorted({int(v) for v in args.ps.split(",") if v.strip()})
      if not ps or ps[0] < 2:
        raise ValueError
    except ValueError:
      raise SystemExit(
        f"--ps {args.ps!r}: expected comma-separated counts of at least 2."
      ) from None
  big = {a: n for a in algorithms if (n := replay_messages_at(a, max(ps))) > REPLAY_MESSAGES}
  if big:
    raise SystemExit(
      "--algorithms: "
      + ", ".join(f"{a} has about {n / 1e6:.0f}M messages at p={max(ps)}" for a, n in big.items())
      + f"; the replay holds at most {REPLAY_MESSAGES / 1e6:.0f}M: lower --max-p or --ps."
    )
  context = {"topology": [t.name for t in tops], "link": args.link}
  context |= {"hop_latency_us": args.hop_latency_us}
  store = row_store(args.out, "scaling", fresh=args.fresh, context=context)
  fig = figure_path(args.plot or Path(args.out).with_suffix(".png"), "--plot")
  rows = sweep_topology(tops, params, ps, sizes, algorithms)
  rows.sort(key=lambda r: (r["scenario"], r["bytes"], r["p"]))
  for r in rows:
    r.update(link=args.link, hop_latency_us=args.hop_latency_us)
  _append_new(store, rows)
  print(f"# scaling by replay: link {args.link}, topologies {', '.join(t.name for t in tops)}")
  print("# predicted µs replayed on each topology; '(flat)': the flat α-β model at the largest p")
  width = max(len(a) for a in algorithms) + 1
  print(f"{'p':>6} " + " ".join(f"{a:>{width}}" for a in algorithms))
  for sc in dict.fromkeys(r["scenario"] for r in rows):
    for n in sizes:
      mine = [r for r in rows if (r["scenario"], r["bytes"]) == (sc, n)]
      print(f"# {sc}, {format_bytes(n)} per participant")
      for p in sorted({r["p"] for r in mine}):
        t = {r["algorithm"]: r["predicted_us"] for r in mine if r["p"] == p}
        print(f"{p:>6} " + " ".join(f"{t[a]:>{width}.1f}" for a in algorithms))
      last = max(r["p"] for r in mine)
      flat = {r["algorithm"]: r["flat_us"] for r in mine if r["p"] == last}
      print(f"{'(flat)':>6} " + " ".join(f"{flat[a]:>{width}.1f}" for a in algorithms))
  print("# bandwidth term at the largest p, × n·β: all-reduce (its first half of the steps,")
  print("# the reduce-scatter of ring / halving-doubling / Swing):")
  for sc in dict.fromkeys(r["scenario"] for r in rows):
    mine = [r for r in rows if r["scenario"] == sc and r["bytes"] == sizes[0]]
    last = max(r["p"] for r in mine)
    at = {r["algorithm"]: r for r in mine if r["p"] == last}
    print(
      f"# {sc} p={last}: "
      + ", ".join(
        f"{a} {at[a]['bandwidth_nbeta']:.4g} ({at[a]['first_half_nbeta']:.4g})" for a in algorithms
      )
    )
  print("# the best algorithm at each topology's largest p, and the ring's slowdown there:")
  for c in crossovers(rows):
    print(
      f"#   {c['scenario']:>24} {format_bytes(c['bytes']):>7}: p={c['max_p']}: {c['best_at_max_p']};"
      f" ring {c['ring_over_best_at_max_p']:.2f}x; "
      + (
        f"ring last within 5% of the best at p={c['ring_competitive_until']}"
        if c["ring_competitive_until"] is not None
        else "ring never within 5% of the best"
      )
    )

  plot.save(plot.scaling(rows, crossovers(rows)), fig, dpi=110)
  print(f"# rows: {args.out}  figure: {fig}")
  return 0
