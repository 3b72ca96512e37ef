"""The emulated network's tables and figure from its committed rows (no measurement here).

    python experiments/emulated_network/network_tables.py [ROWS]

Reads ``ROWS`` (default ``rows/`` beside this script): ``bench_NET_HOSTS.jsonl`` and
``blocks_NET_HOSTS.jsonl`` (``allreduce-jax bench`` on ``allreduce-jax cluster``),
``link_queue.py``'s and ``wire_bytes.py``'s rows, all from ``network_sweep.sh``; writes
``tables.md``, ``token_bucket.md`` and ``time_vs_model.png`` beside this script. The
model is :func:`allreduce_jax.gloo_model.emulated_seconds`: the topology replay of each
algorithm's schedule on the emulated network, β from the link's payload rate, one α per
network fitted on the 4 and 64 KiB rows (:func:`allreduce_jax.gloo_model.fit_alpha`),
priced at full duplex (the replay's own assumption) and at half duplex for exchanges
(one ppermute at a time, exchanges in turn, as XLA:CPU runs them over gloo).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from allreduce_jax import cost_model, gloo_model, units
from allreduce_jax.tools import plot

HERE = Path(__file__).resolve().parent
RATE = 25e6  # 200 Mbit/s, every committed run's link rate
BUCKET_S = gloo_model.link_bucket_s(RATE)  # 4 ms: every emulated link's tbf bucket
NETS = (("switch", 4), ("switch", 8), ("fat_tree:4:2", 8), ("torus:8", 8))


def _rows(path: Path) -> list[dict]:
  """The JSON Lines rows of ``path`` ([] if it does not exist)."""
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fit_alpha(rows: list[dict], p: int, net: str, duplex: str, bucket_s: float = 0.0) -> float:
  """α per step on the 4 and 64 KiB rows at this study's link rate (``gloo_model.fit_alpha``)."""
  return gloo_model.fit_alpha(rows, p, net, rate=RATE, duplex=duplex, bucket_s=bucket_s)


def model(
  alg: str, p: int, n: int, net: str, duplex: str, alpha: float, bucket_s: float = 0.0
) -> float:
  """The replayed seconds at this study's link rate (``gloo_model.emulated_seconds``)."""
  return gloo_model.emulated_seconds(
    alg, p, n, net, rate=RATE, alpha=alpha, duplex=duplex, bucket_s=bucket_s
  )


def _cell(net: str, p: int, a: str, n: int, m: float, a_half: float, a_full: float) -> dict:
  """One summary cell: measured seconds ``m`` next to the model and the bounds."""
  return {
    "network": net, "p": p, "algorithm": a, "bytes": n, "measured_s": m,
    "model_half_s": model(a, p, n, net, "half", a_half),
    "model_full_s": model(a, p, n, net, "full", a_full),
    "bound_half_s": model(a, p, n, net, "half", 0.0),
    "bound_full_s": model(a, p, n, net, "full", 0.0),
    "busbw_over_line": n * 2 * (p - 1) / p / m / RATE,
  }  # fmt: skip


def _good(root: Path, name: str) -> list[dict]:
  return [r for r in _rows(root / name) if r.get("wrong") == 0]


def order_tables(root: Path) -> tuple[list[str], list[dict]]:
  """Each network timed in blocks (``bench --order blocks``, ``blocks_NET_HOSTS.jsonl``)
  against the round robin of the sweep: each algorithm's calls after its own warm-up
  instead of right after the previous algorithm's. α as in the round-robin tables
  (their 4 and 64 KiB rows)."""
  lines, summary = [], []
  for net, p in NETS:
    name = f"{net.replace(':', '_')}_{p}.jsonl"
    blocks, robin = _good(root, "blocks_" + name), _good(root, "bench_" + name)
    if not blocks:
      continue
    a_half, a_full = fit_alpha(robin, p, net, "half"), fit_alpha(robin, p, net, "full")
    sizes = sorted({r["bytes"] for r in blocks})
    algs = list(dict.fromkeys(r["algorithm"] for r in blocks))
    tb, tr = _times(blocks), _times(robin)

    def text(a, n, tb=tb, tr=tr, net=net, p=p, a_half=a_half, a_full=a_full):
      cell = {**_cell(net, p, a, n, tb[(a, n)], a_half, a_full), "order": "blocks"}
      summary.append(cell)
      ratio = f"{tr[(a, n)] / tb[(a, n)]:.2f}×" if (a, n) in tr else "—"
      return f"{tb[(a, n)]:.3g} s ({tb[(a, n)] / cell['model_half_s']:.2f}) {ratio}"

    lines += _grid(
      f"### {net}, {p} hosts, timed in blocks (`--order blocks`) vs round robin",
      "Each cell: seconds in blocks (median of 3, the slowest process), then measured / model"
      " at half duplex, then round robin's seconds / blocks' seconds (> 1: the round robin"
      " was slower).",
      sizes, algs, tb, text,
    )  # fmt: skip
  return lines, summary


def _set_tables(
  where: Path, against: Path, title: str, versus: str, tags: dict
) -> tuple[list[str], list[dict]]:
  """Each network's blocks rows in ``where`` (``blocks_NET_HOSTS.jsonl``): per cell the
  seconds, measured / model at half duplex (α fitted from the set's own 4 and 64 KiB
  rows), and ``against``'s seconds for the same cell / these."""
  lines, summary = [], []
  for net, p in NETS:
    name = f"{net.replace(':', '_')}_{p}.jsonl"
    rows, other = _good(where, "blocks_" + name), _good(against, "blocks_" + name)
    if not rows:
      continue
    a_half, a_full = fit_alpha(rows, p, net, "half"), fit_alpha(rows, p, net, "full")
    a_tb = fit_alpha(rows, p, net, "half", BUCKET_S)
    sizes = sorted({r["bytes"] for r in rows if r["bytes"] >= 1 << 20})
    algs = list(dict.fromkeys(r["algorithm"] for r in rows))
    t, to = _times(rows), _times(other)

    def text(a, n, t=t, to=to, net=net, p=p, a_half=a_half, a_full=a_full, a_tb=a_tb):
      cell = {**_cell(net, p, a, n, t[(a, n)], a_half, a_full), **tags}
      cell["model_bucket_s"] = model(a, p, n, net, "half", a_tb, BUCKET_S)
      summary.append(cell)
      ratio = f"{to[(a, n)] / t[(a, n)]:.2f}×" if (a, n) in to else "—"
      return f"{t[(a, n)]:.3g} s ({t[(a, n)] / cell['model_half_s']:.2f}) {ratio}"

    lines += _grid(
      f"### {net}, {p} hosts, {title}",
      f"α fitted from this set's 4 and 64 KiB rows: {a_half * 1e3:.2f} ms per step (half"
      " duplex). Each cell: seconds (median of 3, the slowest process), then measured / model"
      f" at half duplex, then {versus}.",
      sizes, algs, t, text,
    )  # fmt: skip
  return lines, summary


def small_queue_tables(root: Path) -> tuple[list[str], list[dict]]:
  """Each network timed in blocks with 16 KiB of TCP queue a socket (``cluster``'s
  default since; ``tcp_queue_16k/blocks_NET_HOSTS.jsonl``, step 5 of the sweep) against
  the same in blocks at the kernel's 4 MiB (``blocks_NET_HOSTS.jsonl``)."""
  return _set_tables(
    root / "tcp_queue_16k", root, "in blocks with `--tcp-queue 16KiB` vs 4 MiB",
    "the 4 MiB TCP queue's seconds / these (> 1: 16 KiB is faster)",
    {"order": "blocks", "tcp_queue": "16KiB"},
  )  # fmt: skip


def repeat_tables(root: Path) -> tuple[list[str], list[dict]]:
  """Step 5 run again (``tcp_queue_16k/repeat/``, step 6 of the sweep) against the first
  run: the spread from one run to the next."""
  return _set_tables(
    root / "tcp_queue_16k" / "repeat", root / "tcp_queue_16k",
    "in blocks with `--tcp-queue 16KiB`, run again",
    "the first run's seconds / these (> 1: the repeat was faster)",
    {"order": "blocks", "tcp_queue": "16KiB", "run": "repeat"},
  )  # fmt: skip


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


def tcp_queue_table(root: Path) -> list[str]:
  """The ring and psum against line rate with the kernel's TCP queue (4 MiB a socket)
  and 16 KiB, in one run (``experiments/emulated_network/link_queue.py --tcp-queues``), and the incast."""
  rows = _rows(root / "tcp_queue.jsonl")
  cells = _queue_cells(rows, ("tcp_queue",))
  if not cells:
    return []
  lines = [
    "### The TCP queue: ring and psum busbw / line rate (switch, 200 Mbit/s, 100 ms link queue)",
    "",
    "`python experiments/emulated_network/link_queue.py --queues 100ms --tcp-queues 4MiB,16KiB --order blocks"
    " --incast` (`cluster --tcp-queue T -- bench --algorithms ring,psum -b 4MiB -e 16MiB -f 4"
    " -n 5 -a 3 --order blocks`), the two settings taking turns. Each cell: the median over"
    " repeats [min–max].",
    "",
    "| hosts | TCP queue | repeats | ring 4 MiB | ring 16 MiB | psum 4 MiB | psum 16 MiB |",
    "|---|---|---|---|---|---|---|",
  ]
  for config in sorted({k[:2] for k in cells}, key=lambda k: (k[0], -units.parse_size(k[1]))):
    lines.append(_config_line(cells, config))
  lines += _incast_lines(
    rows, "tcp_queue", "TCP queue", "Where messages converge (4 MiB on 8 hosts, median of 3 calls):"
  )
  return [*lines, ""]


def mtu_table(root: Path) -> list[str]:
  """The ring and psum against line rate at MTU 1500 and 9000, both with the cluster's
  16 KiB TCP queue (``mtu_16k.jsonl``, ``experiments/emulated_network/link_queue.py --mtus 1500,9000
  --tcp-queues 16KiB``). Line rate counts frames: 1500 carries at most 0.956 of it as
  TCP payload, 9000 0.993 (``gloo_model.payload_share``)."""
  cells = _queue_cells(_rows(root / "mtu_16k.jsonl"), ("mtu",))
  if not cells:
    return []
  return [
    "### Jumbo frames at `--tcp-queue 16KiB`: ring and psum busbw / line rate (switch, 200 Mbit/s)",
    "",
    "`python experiments/emulated_network/link_queue.py --hosts 4,8 --queues 100ms --mtus 1500,9000"
    " --tcp-queues 16KiB --order blocks --repeats 3` (`cluster --mtu M -- bench --algorithms"
    " ring,psum -b 4MiB -e 16MiB -f 4 -n 5 -a 3 --order blocks`), the MTUs taking turns. Each"
    " cell: the median over repeats [min–max]; the payload ceiling is 0.956 at MTU 1500, 0.993"
    " at 9000.",
    "",
    "| hosts | MTU | repeats | ring 4 MiB | ring 16 MiB | psum 4 MiB | psum 16 MiB |",
    "|---|---|---|---|---|---|---|",
    *(_config_line(cells, c) for c in sorted({k[:2] for k in cells})),
    "",
  ]


#: The rows measured per congestion control, and what changed in between: before and
#: after ``all_reduce`` finished each reduced slice instead of the whole result.
CC_SETS = (
  ("congestion_control.jsonl", "the whole result finished on every participant", "",
   "--hosts 8 (then --hosts 4) --congestion-controls bbr,cubic", ""),
  ("finish_per_slice.jsonl", "each reduced slice finished by its owner", ", finish per slice",
   "--hosts 8,4 --congestion-controls cubic,bbr --repeats 2",
   " Then the same with `--hosts 4 --congestion-controls cubic --repeats 4`: two more runs"
   " at 4 hosts and cubic."),
)  # fmt: skip


def congestion_control_table(root: Path) -> list[str]:
  """The ring and psum against line rate with the hosts' TCP congestion control chosen
  (``experiments/emulated_network/link_queue.py --congestion-controls``), at MTU 1500 and the 16 KiB TCP
  queue, 4 to 64 MiB: ``congestion_control.jsonl``, then ``finish_per_slice.jsonl``
  (the same runs after ``all_reduce`` finished each reduced slice, ``_comm.finished``)."""
  sizes = (4 << 20, 16 << 20, 64 << 20)
  head = " | ".join(f"{a} {_mib(n)}" for a in ("ring", "psum") for n in sizes)
  lines = []
  for name, what, _, args, then in CC_SETS:
    cells = _queue_cells(_rows(root / name), ("congestion_control",))
    if not cells:
      continue
    lines += [
      f"### The hosts' TCP congestion control, {what}: ring and psum busbw / line rate"
      " (switch, 200 Mbit/s)",
      "",
      f"`python experiments/emulated_network/link_queue.py {args} --queues 100ms --tcp-queues 16KiB"
      f" --max-bytes 64MiB --order blocks --out experiments/emulated_network/rows/{name}`"
      " (`cluster --congestion-control C -- bench --algorithms ring,psum -b 4MiB -e 64MiB -f 4"
      " -n 5 -a 3 --order blocks`), the two taking turns; bbr was the hosts' default, which"
      f" every other table here ran with.{then} Each cell: the median over repeats [min–max].",
      "",
      f"| hosts | congestion control | repeats | {head} |",
      "|---|---|---|" + "---|" * len(head.split(" | ")),
      *(_config_line(cells, c, sizes) for c in sorted({k[:2] for k in cells})),
      "",
    ]
  return lines


def _congestion_control_lines(root: Path, p: int) -> list[str]:
  """The ring on the ``p``-host switch per congestion control, in each of ``CC_SETS``."""
  lines = []
  for name, _, label, _, _ in CC_SETS:
    cells = _queue_cells(_rows(root / name), ("congestion_control",))
    for cc in sorted({k[1] for k in cells if k[0] == p}):
      v = {k[3]: x for k, x in cells.items() if k[:3] == (p, cc, "ring")}
      lines.append(_runs_line(f"with `--congestion-control {cc}`{label} (median of runs", v))
  return lines


def _spread(xs, fmt: str = "{:.2f}") -> str:
  """``median [min–max]`` of ``xs``, each number in ``fmt``."""
  m, lo, hi = (fmt.format(f(xs)) for f in (statistics.median, min, max))
  return f"{m} [{lo}–{hi}]"


def _runs_line(label: str, v: dict) -> str:
  """A target sub-line: the ring's busbw / line rate per size ``v`` (one value a run),
  median [min–max], and whether every run reached 0.90."""
  ok = all(min(x) >= 0.90 for x in v.values())
  return (
    f"  - {label} [min–max]):"
    + ",".join(f" {_mib(n)} {_spread(x)}" for n, x in sorted(v.items()))
    + (": met in every run." if ok else ": not met.")
  )  # fmt: skip


def _jumbo_line(root: Path, p: int) -> list[str]:
  """The ring on the ``p``-host switch with jumbo frames (MTU 9000) at the 16 KiB TCP
  queue: ``mtu_16k.jsonl`` (4, 16 MiB) and ``jumbo_64mib/`` (64 MiB), medians over runs."""
  v = {n: x for (h, mtu, a, n), x in _queue_cells(_rows(root / "mtu_16k.jsonl"), ("mtu",)).items()
       if h == p and mtu == 9000 and a == "ring"}  # fmt: skip
  for path in sorted((root / "jumbo_64mib").glob(f"switch_{p}_run*.jsonl")):
    for r in _rows(path):
      if r["algorithm"] == "ring" and r.get("wrong") == 0:
        v.setdefault(r["bytes"], []).append(r["busbw_GBps"] * 1e9 / RATE)
  return [_runs_line("with `--mtu 9000` (jumbo frames; median of runs", v)] if v else []


def cubic_tables(root: Path) -> tuple[list[str], list[dict]]:
  """Step 5 with the hosts at ``cubic`` (``tcp_queue_16k/cubic/``, step 7 of the sweep)
  against the first run, whose hosts ran their default, ``bbr``."""
  return _set_tables(
    root / "tcp_queue_16k" / "cubic", root / "tcp_queue_16k",
    "in blocks with `--tcp-queue 16KiB`, the hosts at `--congestion-control cubic`",
    "the first run's seconds (at bbr) / these (> 1: cubic was faster)",
    {"order": "blocks", "tcp_queue": "16KiB", "congestion_control": "cubic"},
  )  # fmt: skip


def cubic_finish_tables(root: Path) -> tuple[list[str], list[dict]]:
  """Step 7 again after ``all_reduce`` finished each reduced slice before the all-gather
  (``tcp_queue_16k/cubic_finish/``, step 8 of the sweep), against step 7."""
  return _set_tables(
    root / "tcp_queue_16k" / "cubic_finish", root / "tcp_queue_16k" / "cubic",
    "in blocks with `--tcp-queue 16KiB`, the hosts at `cubic`, each reduced slice finished by its owner",
    "step 7's seconds (the whole result finished after the collective) / these (> 1: faster now)",
    {"order": "blocks", "tcp_queue": "16KiB", "congestion_control": "cubic", "finish": "per slice"},
  )  # fmt: skip


def cubic_finish_repeat_tables(root: Path) -> tuple[list[str], list[dict]]:
  """Step 8 run again (``tcp_queue_16k/cubic_finish/repeat/``, step 10 of the sweep)
  against step 8: the spread from one run to the next at ``cubic``."""
  return _set_tables(
    root / "tcp_queue_16k" / "cubic_finish" / "repeat", root / "tcp_queue_16k" / "cubic_finish",
    "in blocks with `--tcp-queue 16KiB`, the hosts at `cubic`, each reduced slice finished by its owner, run again",
    "step 8's seconds / these (> 1: the repeat was faster)",
    {"order": "blocks", "tcp_queue": "16KiB", "congestion_control": "cubic", "finish": "per slice",
     "run": "repeat"},
  )  # fmt: skip


def two_run_model_lines(root: Path, first: Path, again: Path, what: str) -> list[str]:
  """The model against the mean of two runs of one sweep (``first``, ``again``): per
  cell the two runs' seconds averaged, α fitted on both runs' 4 and 64 KiB rows together."""
  lines = []
  for net, p in NETS:
    name = f"blocks_{net.replace(':', '_')}_{p}.jsonl"
    one, two = _good(root / first, name), _good(root / again, name)
    if not (one and two):
      continue
    a_half = fit_alpha(one + two, p, net, "half")
    a_tb = fit_alpha(one + two, p, net, "half", BUCKET_S)
    t1, t2 = _times(one), _times(two)
    cells = []
    for a, n in t1:
      if n >= 1 << 20 and a not in ("psum", "auto") and (a, n) in t2:
        m = (t1[(a, n)] + t2[(a, n)]) / 2
        cells.append({"algorithm": a, "bytes": n, "measured_s": m,
                      "model_half_s": model(a, p, n, net, "half", a_half),
                      "model_bucket_s": model(a, p, n, net, "half", a_tb, BUCKET_S)})  # fmt: skip
    lines += _model_line(cells, f"{net} ({p} hosts, {what}, the mean of both runs)")
  return lines


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
  cells = _queue_cells(_rows(root / "tcp_queue.jsonl"), ("tcp_queue",))
  for p in (4, 8):
    v = {n: cells.get((p, "16KiB", "ring", n), []) for n in (4 << 20, 16 << 20)}

    def ring(cells, p=p):
      return [s for s in cells if s["network"] == "switch" and s["p"] == p
              and s["algorithm"] == "ring" and s["bytes"] >= 4 << 20]  # fmt: skip

    sweep, repeat, fin, fin2 = ring(summary), ring(again), ring(finish), ring(finish_again)
    if any(v.values()) or sweep:
      med = {n: statistics.median(x) for n, x in v.items() if x}
      ok = all(m >= 0.90 for m in med.values()) and all(
        s["busbw_over_line"] >= 0.90 for s in sweep + repeat
      )
      ok_fin = all(s["busbw_over_line"] >= 0.90 for s in fin)
      ok_fin2 = all(s["busbw_over_line"] >= 0.90 for s in fin2)
      lines.append(
        f"- ring busbw / line rate on the {p}-host switch (target ≥ 0.90 from 4 MiB):"
        + "".join(f" {_mib(n)} {m:.2f} (median of {len(v[n])})," for n, m in med.items())
        + " in the sweep"
        + ",".join(f" {_mib(s['bytes'])} {s['busbw_over_line']:.2f}" for s in sweep)
        + ("; in its repeat" if repeat else "")
        + ",".join(f" {_mib(s['bytes'])} {s['busbw_over_line']:.2f}" for s in repeat)
        + f": {'met' if ok else 'not met'}"
        + ("; at cubic after the per-slice finish (step 8)"
           + ",".join(f" {_mib(s['bytes'])} {s['busbw_over_line']:.2f}" for s in fin)
           + f": {'met' if ok_fin else 'not met'}" if fin else "")
        + ("; in its repeat (step 10)"
           + ",".join(f" {_mib(s['bytes'])} {s['busbw_over_line']:.2f}" for s in fin2)
           + f": {'met' if ok_fin2 else 'not met'}" if fin2 else "")
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
    names = ", ".join(f"{s['algorithm']} {_mib(s['bytes'])} {s['measured_s'] / s[key]:.2f}"
                      for s in off)  # fmt: skip
    return (f"{what} within 20 % on {where}, hand-written algorithms at ≥ 1 MiB:"
            f" {len(mine) - len(off)} of {len(mine)} cells"
            + (f"; outside: {names}." if off else "."))  # fmt: skip

  out = [line("model_half_s", "- model (half duplex, α fitted)")]
  if all("model_bucket_s" in s for s in mine):
    out.append(line("model_bucket_s", f"  - with each link's {BUCKET_S * 1e3:g} ms token bucket priced"
                                      " (`bucket_s`, α fitted likewise)"))  # fmt: skip
  return out


def _times(rows: list[dict]) -> dict:
  """``(algorithm, bytes) -> seconds`` of bench rows."""
  return {(r["algorithm"], r["bytes"]): r["time_us"] * 1e-6 for r in rows}


def _grid(title: str, caption: str, sizes, algs, have: dict, text) -> list[str]:
  """A markdown table of algorithms × sizes: ``text(a, n)`` in each cell ``have`` holds."""
  lines = [title, "", caption, "", "| algorithm | " + " | ".join(_mib(n) for n in sizes) + " |",
           "|---|" + "---|" * len(sizes)]  # fmt: skip
  for a in algs:
    cells = [text(a, n) if (a, n) in have else "—" for n in sizes]
    lines.append(f"| {a} | " + " | ".join(cells) + " |")
  return [*lines, ""]


def _mib(n: int) -> str:
  return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def bench_tables(root: Path) -> tuple[list[str], list[dict]]:
  lines, summary = [], []
  for net, p in NETS:
    rows = [
      r for r in _rows(root / f"bench_{net.replace(':', '_')}_{p}.jsonl") if r.get("wrong") == 0
    ]
    if not rows:
      continue
    a_half = fit_alpha(rows, p, net, "half")
    a_full = fit_alpha(rows, p, net, "full")
    sizes = sorted({r["bytes"] for r in rows if r["bytes"] >= 1 << 20})
    algs = list(dict.fromkeys(r["algorithm"] for r in rows))
    t = _times(rows)

    def text(a, n, t=t, net=net, p=p, a_half=a_half, a_full=a_full):
      cell = _cell(net, p, a, n, t[(a, n)], a_half, a_full)
      summary.append(cell)
      m, half, full = cell["measured_s"], cell["model_half_s"], cell["model_full_s"]
      return f"{m:.3g} s ({m / half:.2f}) [{m / full:.2f}]"

    lines += _grid(
      f"### {net}, {p} hosts, 200 Mbit/s links",
      f"α fitted from 4 KiB and 64 KiB: {a_half * 1e3:.2f} ms per step (half-duplex model),"
      f" {a_full * 1e3:.2f} ms (full-duplex model). Each cell: measured seconds (median of 3),"
      " then measured / model at half duplex and [at full duplex].",
      sizes, algs, t, text,
    )  # fmt: skip
    # the model's pick vs the best measured, per size
    picks = []
    for n in sizes:
      have = [a for a in algs if (a, n) in t and a != "psum"]
      if not have:
        continue
      best = min(have, key=lambda a: t[(a, n)])
      pick = min(have, key=lambda a: model(a, p, n, net, "half", a_half))
      picks.append(
        f"{_mib(n)}: model picks {pick} ({t[(pick, n)] / t[(best, n)]:.2f}× the best measured, {best})"
      )
    lines += [
      "Model's choice among the measured hand-written algorithms: " + "; ".join(picks) + ".",
      "",
    ]
  return lines, summary


def wire_table(root: Path) -> list[str]:
  rows = _rows(root / "wire_bytes.jsonl")
  if not rows:
    return []
  lines = [
    "### Bytes on the wire per host (4 MiB per participant, switch)",
    "",
    "Each host's interface counter (tx_bytes) per call / the schedule's bytes for that host:"
    " host 0 (the root of naive and tree) and the range over all hosts.",
    "",
    "| algorithm | p | host 0 sent (MB) | schedule (MB) | host 0 ratio | min–max ratio over hosts |",
    "|---|---|---|---|---|---|",
  ]
  keys = list(dict.fromkeys((r["algorithm"], r["p"]) for r in rows))
  for a, p in sorted(keys, key=lambda k: (k[0], k[1])):
    mine = [r for r in rows if r["algorithm"] == a and r["p"] == p]
    h0 = next(r for r in mine if r["host"] == 0)
    ratios = [r["ratio"] for r in mine if r["ratio"]]
    lines.append(
      f"| {a} | {p} | {h0['wire_bytes'] / 1e6:.2f} | {h0['schedule_bytes'] / 1e6:.2f} |"
      f" {h0['ratio']:.3f} | {min(ratios):.3f}–{max(ratios):.3f} |"
    )
  return [*lines, ""]


def ring_alone_table(root: Path) -> list[str]:
  """The ring alone at ``cubic`` (4-host switch, 16 MiB; ``ring_alone_cubic/``, step 12 of
  ``network_sweep.sh``), and after ``naive``'s incast on the same connections: busbw /
  line rate per run (median of its calls [slowest–fastest call]) and the TCP segments the
  hosts retransmitted (``retransmissions.txt``)."""
  d = root / "ring_alone_cubic"
  files = sorted(d.glob("*_run*.jsonl"))
  if not files:
    return []
  retrans: dict[str, int] = {}
  for line in (d / "retransmissions.txt").read_text().splitlines():
    run, counts = line.split()[0], dict(f.split("=") for f in line.split()[3:])
    retrans[run] = retrans.get(run, 0) + int(counts.get("TcpRetransSegs", 0))
  lines = [
    "### The ring alone at `cubic`, and after an incast (4-host switch, 16 MiB)",
    "",
    "`STEPS=12 bash experiments/emulated_network/network_sweep.sh`: 5 runs of the ring alone, then 3 of"
    " `naive`, the ring and `tree` in blocks (the ring's connections carried `naive`'s incast"
    " just before), 5 timed calls each, nothing else running. busbw / line rate of the median"
    " call [slowest–fastest call]; retransmitted: TCP segments all four hosts retransmitted"
    " in the whole run (`nstat`).",
    "",
    "| run | ring busbw / line rate | retransmitted |",
    "|---|---|---|",
  ]
  for f in files:
    r = next(r for r in _good(d, f.name) if r["algorithm"] == "ring")
    bus = r["bytes"] * 2 * 3 / 4 / RATE * 1e6  # 4 hosts: 2(p-1)/p n at the line rate, in us
    lines.append(
      f"| {f.stem} | {bus / r['time_us']:.3f} [{bus / r['time_us_max']:.3f}–"
      f"{bus / r['time_us_min']:.3f}] | {retrans.get(f.stem, 0)} |"
    )
  return [*lines, ""]


def rootless_table(root: Path) -> list[str]:
  """The same bench on the 4-host switch built as root and rootless (``cluster
  --rootless``: in a user namespace), alternating, runs in ``rootless/`` (step 11 of
  ``network_sweep.sh``): each time as the median over runs [min–max], and per run the
  rootless time over the root time of the run beside it."""
  runs = {
    (mode, int(f.stem.rsplit("run", 1)[1])): _times(_good(f.parent, f.name))
    for mode in ("root", "rootless")
    for f in sorted((root / "rootless").glob(f"{mode}_run*.jsonl"))
  }
  if not runs:
    return []
  ids = sorted({i for _, i in runs if ("root", i) in runs and ("rootless", i) in runs})
  cells = sorted({c for i in ids for c in runs[("root", i)]}, key=lambda c: (c[1], c[0]))

  lines = [
    f"### Built as root and rootless: the same cluster (4-host switch, {len(ids)} runs each)",
    "",
    "`STEPS=11 bash experiments/emulated_network/network_sweep.sh`: the same bench (`--order blocks -a 3`,"
    " 200 Mbit/s, 16 KiB TCP queue, the hosts' default congestion control) with the cluster built"
    " as root and with `--rootless` (in a user namespace, as a user without root gets it),"
    " alternating. Seconds, median over runs [min–max]; the ratio is per run, rootless over"
    " the root run just before it.",
    "",
    "| algorithm | per host | root (s) | rootless (s) | rootless / root |",
    "|---|---|---|---|---|",
  ]
  for alg, n in cells:
    if not all((alg, n) in runs[(m, i)] for m in ("root", "rootless") for i in ids):
      continue
    root_t = [runs[("root", i)][(alg, n)] for i in ids]
    less = [runs[("rootless", i)][(alg, n)] for i in ids]
    ratio = [b / a for a, b in zip(root_t, less)]
    lines.append(
      f"| {alg} | {_mib(n)} | {_spread(root_t, '{:.3f}')} | {_spread(less, '{:.3f}')} |"
      f" {_spread(ratio)} |"
    )
  return [*lines, ""]


def _queue_cells(rows: list[dict], fields: tuple[str, ...] = ("queue", "mtu")) -> dict:
  """(hosts, *fields, algorithm, bytes) -> busbw / line rate of each repeat
  (``experiments/emulated_network/link_queue.py``'s ring rows)."""
  cells: dict = {}
  for r in rows:
    if r.get("set") == "ring" and r.get("wrong") == 0:
      key = (r["hosts"], *(r[f] for f in fields), r["algorithm"], r["bytes"])
      cells.setdefault(key, []).append(r["busbw_GBps"] * 1e9 / RATE)
  return cells


def _config_line(cells: dict, config: tuple, sizes=(4 << 20, 16 << 20)) -> str:
  """One table line of a configuration (hosts first): its repeats, then ring and psum at
  ``sizes`` (4 and 16 MiB), each the median over repeats [min–max]."""
  row = []
  for a in ("ring", "psum"):
    for n in sizes:
      v = cells.get((*config, a, n), [])
      row.append(_spread(v) if v else "—")
  reps = len(cells.get((*config, "ring", 4 << 20), []))
  return "| " + " | ".join(map(str, config)) + f" | {reps} | " + " | ".join(row) + " |"


def _incast_lines(rows: list[dict], field: str, label: str, caption: str) -> list[str]:
  """The incast rows of ``experiments/emulated_network/link_queue.py``: each algorithm's seconds per value
  of ``field``, one column each headed ``label value``."""
  incast = [r for r in rows if r.get("set") == "incast" and r.get("wrong") == 0]
  if not incast:
    return []
  qs = list(dict.fromkeys(r[field] for r in incast))
  lines = ["", caption, "", "| algorithm | " + " | ".join(f"{label} {q}" for q in qs) + " |",
           "|---|" + "---|" * len(qs)]  # fmt: skip
  for a in dict.fromkeys(r["algorithm"] for r in incast):
    t = {r[field]: r["time_us"] * 1e-6 for r in incast if r["algorithm"] == a}
    lines.append(f"| {a} | " + " | ".join(f"{t[q]:.2f} s" if q in t else "—" for q in qs) + " |")
  return lines


def queue_table(root: Path) -> list[str]:
  """The ring and psum against line rate as the links' queue and MTU change
  (``experiments/emulated_network/link_queue.py``), and what a short queue costs at an incast."""
  rows = _rows(root / "link_queue.jsonl")
  cells = _queue_cells(rows)
  if not cells:
    return []
  lines = [
    "### The links' queue and MTU: ring and psum busbw / line rate (switch, 200 Mbit/s)",
    "",
    "`python experiments/emulated_network/link_queue.py` (`cluster --queue Q --mtu M -- bench --algorithms"
    " ring,psum -b 4MiB -e 16MiB -f 4 -n 5 -a 3`). Each cell: the median over repeats"
    " [min–max], the slowest process's time (`-a 3`).",
    "",
    "| hosts | queue | MTU | repeats | ring 4 MiB | ring 16 MiB | psum 4 MiB | psum 16 MiB |",
    "|---|---|---|---|---|---|---|---|",
  ]
  configs = sorted({k[:3] for k in cells}, key=lambda k: (k[0], k[2], float(k[1][:-2])))
  lines += [_config_line(cells, config) for config in configs]
  lines += _incast_lines(
    rows, "queue", "queue",
    "Where messages converge on one port a short queue drops packets (incast): 4 MiB on 8"
    " hosts, the slowest process's median of 3 calls:",
  )  # fmt: skip
  return [*lines, ""]


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
        cells = ", ".join(f"{_mib(s['bytes'])} {s['busbw_over_line']:.2f}" for s in ring)
        ok = all(s["busbw_over_line"] >= 0.90 for s in ring)
        lines.append(f"{'  - timed in blocks' if order else '- ring busbw / line rate on the'}"
                     f"{'' if order else f' {p}-host switch (target ≥ 0.90 from 4 MiB)'}:"
                     f" {cells}: {'met' if ok else 'not met'}.")  # fmt: skip
    queued = _queue_cells(_rows(root / "link_queue.jsonl"))
    for q, m in sorted({(k[1], k[2]) for k in queued if k[0] == p and k[1] != "100ms"}):
      med = {
        n: statistics.median(queued.get((p, q, m, "ring", n), [0])) for n in (4 << 20, 16 << 20)
      }
      lines.append(
        f"  - with `--queue {q} --mtu {m}` (median of repeats): "
        + ", ".join(f"{_mib(n)} {v:.2f}" for n, v in med.items())
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
  wire_rows = _rows(root / "wire_bytes.jsonl")
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
    "| algorithm | " + " | ".join(_mib(n) for n in sizes) + " |",
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


def figure(summary: list[dict], path: Path) -> None:
  from matplotlib.figure import Figure

  nets = list(dict.fromkeys((s["network"], s["p"]) for s in summary))
  if not nets:
    return
  fig = Figure(figsize=(4.2 * len(nets), 3.6))
  axes = fig.subplots(1, len(nets), squeeze=False)[0]
  for ax, (net, p) in zip(axes, nets):
    mine = [s for s in summary if s["network"] == net and s["p"] == p]
    for a in dict.fromkeys(s["algorithm"] for s in mine):
      rs = sorted((s for s in mine if s["algorithm"] == a), key=lambda s: s["bytes"])
      x = [s["bytes"] / 2**20 for s in rs]
      (line,) = ax.plot(x, [s["measured_s"] for s in rs], "o-", ms=3, label=a)
      ax.plot(x, [s["model_half_s"] for s in rs], ":", color=line.get_color())
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("MiB per participant")
    ax.set_title(f"{net}, {p} hosts (dots: model)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
  axes[0].set_ylabel("seconds (measured, median of 3)")
  axes[0].legend(fontsize=6)
  fig.tight_layout()
  plot.save(fig, path)


def redraw(root: Path) -> None:
  """Each blocks file's figure from all its rows (``bench`` draws only one run's rows),
  dashed: the α-β-γ model fitted on its rows from 1 MiB (as ``bench --fit --fit-min-bytes
  1MiB`` would), not the in-process defaults."""
  for path in sorted(root.glob("blocks_*.jsonl")) + sorted(
    root.glob("tcp_queue_16k/**/blocks_*.jsonl")
  ):
    rows = [r for r in _rows(path) if r.get("wrong") == 0]
    sample = [(r["algorithm"], r["n_devices"], r["bytes"], r["time_us"] * 1e-6)
              for r in rows if r["bytes"] >= 1 << 20]  # fmt: skip
    fig = plot.bench(rows, cost_model.fit_all(sample), title=f"{path.parent.name}/{path.stem}")
    if fig is not None:
      plot.save(fig, path.with_suffix(".png"))


def token_bucket_set(where: Path, title: str) -> list[str]:
  """One set's cells (hand-written algorithms, ≥ 1 MiB) against the half-duplex replay with
  and without each link's token bucket, α fitted for each model on the set's own 4 and
  64 KiB rows: how many each prices within 20 %, and every cell's measured / model."""
  lines = [f"## {title}", "", "| network | α (no bucket / bucket) | within 20 %: no bucket | with the bucket |",
           "|---|---|---|---|"]  # fmt: skip
  cells = []
  for net, p in NETS:
    rows = _good(where, "blocks_" + f"{net.replace(':', '_')}_{p}.jsonl")
    if not rows:
      continue
    a0, a1 = fit_alpha(rows, p, net, "half"), fit_alpha(rows, p, net, "half", BUCKET_S)
    good = [0, 0]
    mine = [(a, n, t) for (a, n), t in _times(rows).items() if n >= 1 << 20 and a != "psum"]
    for a, n, t in mine:
      r0 = t / model(a, p, n, net, "half", a0)
      r1 = t / model(a, p, n, net, "half", a1, BUCKET_S)
      good[0] += 0.8 <= r0 <= 1.2
      good[1] += 0.8 <= r1 <= 1.2
      cells.append(f"| {net}, {p} hosts | {a} | {_mib(n)} | {r0:.2f} | {r1:.2f} |")
    lines.append(
      f"| {net}, {p} hosts | {a0 * 1e3:.2f} / {a1 * 1e3:.2f} ms | {good[0]} of {len(mine)}"
      f" | {good[1]} of {len(mine)} |"
    )
  return [*lines, "", "<details><summary>every cell: measured / model</summary>", "",
          "| network | algorithm | size | no bucket | bucket |", "|---|---|---|---|---|",
          *cells, "", "</details>", ""]  # fmt: skip


def token_bucket_text(root: Path) -> str:
  """Does pricing each link's token bucket bring the replay closer to the wire? Each
  shaped link of ``allreduce-jax cluster`` is a ``tbf`` bucket holding 4 ms of its rate:
  a link idle for 4 ms passes its next 100 KB (at 200 Mbit/s) at veth speed. The sets
  timed in blocks with ``--tcp-queue 16KiB``, with and without the bucket priced."""
  lines = [
    "# The replay with each link's token bucket",
    "",
    f"Every link a bucket of {BUCKET_S * 1e3:g} ms of its rate; measured / model within"
    " 0.8–1.2 counts as within 20 %. Hand-written algorithms, sizes ≥ 1 MiB.",
    "",
  ]
  q = root / "tcp_queue_16k"
  lines += token_bucket_set(q, "`tcp_queue_16k/` (step 5 of the sweep)")
  lines += token_bucket_set(q / "repeat", "`tcp_queue_16k/repeat/` (step 6)")
  lines += token_bucket_set(q / "cubic", "`tcp_queue_16k/cubic/` (step 7: cubic)")
  lines += token_bucket_set(
    q / "cubic_finish",
    "`tcp_queue_16k/cubic_finish/` (step 8: cubic, each reduced slice finished by its owner)",
  )
  lines += token_bucket_set(
    q / "cubic_finish" / "repeat",
    "`tcp_queue_16k/cubic_finish/repeat/` (step 10: step 8 run again)",
  )
  return "\n".join(lines) + "\n"


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
      + ",".join(f" {_mib(n)} {_spread(x)}" for n, x in v.items() if x)
      + "."
    )
  for p in (4, 8):
    hd = [c["measured_s"] / c["bound_full_s"] for c in cells if c["network"] == "switch"
          and c["p"] == p and c["algorithm"] == "halving_doubling" and c["bytes"] == 16 << 20]  # fmt: skip
    if hd:
      lines.append(
        f"- halving_doubling at 16 MiB, {p}-host switch: {_spread(hd)}× its full-duplex bound."
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
    f" cells at ≥ 1 MiB; per network and sweep {_spread(share)} of the cells; with each"
    f" link's token bucket priced: {bucket} of {len(mine)}.",
    "",
  ]
  return lines


def _all_rows(root: Path) -> list[dict]:
  return [r for path in sorted(root.rglob("*.jsonl")) for r in _rows(path)]


def tables(root: Path = HERE / "rows") -> dict[str, str]:
  """``{file name: text}`` of every table this study writes, from the rows under ``root``
  (no measurement, no figure), priced with the cost parameters the rows traced with
  (``gloo_model.traced_params``: the schedules as they ran)."""
  return _build(root)[0]


def _build(root: Path) -> tuple[dict[str, str], list[dict]]:
  with cost_model.use_params(gloo_model.traced_params(_all_rows(root))):
    text, summary = _tables(root)
    return {"tables.md": text, "token_bucket.md": token_bucket_text(root)}, summary


def _tables(root: Path) -> tuple[str, list[dict]]:
  bench, summary = bench_tables(root)
  blocks, in_blocks = order_tables(root)
  small, in_small = small_queue_tables(root)
  again, in_again = repeat_tables(root)
  cubic, in_cubic = cubic_tables(root)
  finish, in_finish = cubic_finish_tables(root)
  finish2, in_finish2 = cubic_finish_repeat_tables(root)
  text = ["# Measured on an emulated network (tables from the committed rows)", ""]
  text += headline([in_small, in_again, in_cubic, in_finish, in_finish2])
  text += small_queue_targets(root, in_small, in_again, in_cubic, in_finish, in_finish2)
  text += tcp_queue_table(root) + mtu_table(root)
  text += congestion_control_table(root)
  text += targets(root, summary + in_blocks) + queue_table(root)
  text += ring_alone_table(root)
  text += rootless_table(root)
  text += wire_table(root) + torus_lesson(summary) + bench + blocks + small + again + cubic
  text += finish + finish2
  return "\n".join(text) + "\n", summary


def main(argv=None) -> int:
  import argparse

  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("rows", nargs="?", type=Path, default=HERE / "rows", help="the rows' folder")
  ap.add_argument("--out", type=Path, default=HERE, help="where the tables and figure go")
  args = ap.parse_args(argv)
  texts, summary = _build(args.rows)
  for name, text in texts.items():
    (args.out / name).write_text(text)
  figure(summary, args.out / "time_vs_model.png")
  redraw(args.rows)
  print(f"wrote {', '.join(texts)} and time_vs_model.png to {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
