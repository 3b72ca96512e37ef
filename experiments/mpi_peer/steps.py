"""One message step of the hand-written algorithms alone, against the whole all-reduce: where
halving-doubling's and recursive doubling's time over the MPI backend goes.

Runs on every host of an emulated cluster (one process and one device per host), e.g.

    allreduce-jax cluster --hosts 4 --link 200Mbit --launcher mpirun --collectives mpi -- \\
      python experiments/mpi_peer/steps.py --out experiments/mpi_peer/rows/collectives_steps.jsonl

Times, each a jitted program called ``--reps`` times after one warm-up, every call after a
barrier; a call's time is the longest over the processes (the median and the spread of the
calls):

- ``one_way``: a ``ppermute`` of m bytes from host 2k to host 2k+1 only (one direction per pair);
- ``exchange``: the pairwise exchange, hosts r and r XOR 1 swap m bytes (both directions at once);
- ``exchange_add``: the exchange and the add of the received buffer to the kept one (a step of
  halving-doubling's reduce-scatter);
- ``shift``: every host sends m bytes to r+1 and receives from r-1 (a ring step);
- ``PATTERN_chained`` (m under 1 MiB): the same step called 20 times back to back, per call;
- ``add``: the jitted add of two m-byte buffers on one device, no message;
- ``halving_doubling``, ``recursive_doubling``, ``ring``: the whole all-reduce of n bytes.

With ``--split ALGS`` (halving_doubling, recursive_doubling; p a power of two) it also traces
each of them at n bytes, ``--reps`` rounds of five modes in turn (``MODES``), each after a
barrier: the whole jitted all-reduce (``whole``); its message steps as separate jitted programs
called back to back (``split``; the same slices, adds and copies as the whole program's steps,
the result checked against the whole program's); the same with a barrier before every step
(``barriered``); with 4 bytes exchanged with the step's partner before every step (``paired``);
and those steps and 4-byte exchanges in one jitted program (``whole_paired``). Every process
stamps the wall clock (one clock: the hosts are network namespaces of one machine) and its own
CPU time as it starts and ends each call; one row per (algorithm, mode, round) with every
process's stamps, seconds after the round's first start. ``--mpi-trace`` also stamps every
MPI call of XLA's MPI collectives inside them (``mpi_call_trace.c``, built by
``build_mpi_call_trace.sh``). ``--table ROWS`` prints one launch's stamps per step (the wait
for the partner, the time after both started, the gap between calls, CPU per wall, and the
MPI calls per collective and per exchange); ``--summary ROWS...`` the launches together, one
setting per file name (``collectives_trace[_SETTING]_runR``).

Each row names the collectives that carried it (``collectives``: gloo or mpi, from JAX's
config), Open MPI's ``btl_tcp_flags``, every ``OMPI_MCA_btl_tcp_*`` set,
``mpi_yield_when_idle``, ``--mca``, ``--sysctl`` and ``--xla-flag``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from allreduce_jax import distributed
from allreduce_jax.units import format_bytes

PATTERNS = ("one_way", "exchange", "exchange_add", "shift")
RATE = 25e6  # bytes/s each way: the emulated links' 200 Mbit/s
MODES = ("whole", "split", "barriered", "paired", "whole_paired")  # --split's ways to run them
HERE = Path(__file__).resolve().parent
TRACE_LIB = HERE.parent.parent / "build" / "mpi_call_trace" / "libmpiwrapper.so"


def pairs(pattern: str, p: int) -> list[tuple[int, int]]:
  """The ``(source, target)`` pairs of one step of ``pattern`` among ``p`` hosts.

  Example:
    >>> pairs("one_way", 4), pairs("exchange", 4)[:2], pairs("shift", 4)[-1]
    ([(0, 1), (2, 3)], [(0, 1), (1, 0)], (3, 0))
  """
  if pattern == "one_way":
    return [(r, r + 1) for r in range(0, p - 1, 2)]
  if pattern in ("exchange", "exchange_add"):
    return [(r, r ^ 1) for r in range(p)]
  if pattern == "shift":
    return [(r, (r + 1) % p) for r in range(p)]
  raise ValueError(f"pattern={pattern!r}: expected one of {', '.join(PATTERNS)}.")


def split_steps(algorithm: str, p: int) -> list[tuple[str, int]]:
  """The message steps of ``algorithm`` (p a power of two) as ``(kind, mask)``: the partner
  of r is r XOR mask; ``reduce`` keeps one half and adds the other half's partner copy,
  ``gather`` places the received range beside its own, ``exchange`` adds the whole buffer.

  Example:
    >>> split_steps("halving_doubling", 4), split_steps("recursive_doubling", 4)
    ([('reduce', 2), ('reduce', 1), ('gather', 1), ('gather', 2)], [('exchange', 1), ('exchange', 2)])
  """
  if p < 2 or p & (p - 1):
    raise ValueError(f"p={p}: --split needs a power of two of at least 2 hosts.")
  masks = [1 << k for k in range(p.bit_length() - 1)]  # 1, 2, ..., p/2
  if algorithm == "halving_doubling":  # far partners first (MPICH), as the library's
    return [("reduce", m) for m in masks[::-1]] + [("gather", m) for m in masks]
  if algorithm == "recursive_doubling":
    return [("exchange", m) for m in masks]
  raise ValueError(f"--split={algorithm!r}: expected halving_doubling or recursive_doubling.")


def step_stats(row: dict) -> list[dict]:
  """Per step of one traced round, over the processes: the wait for the partner (its later
  start), the time after both started (transfer, add, copies), the gap after the process's
  previous call, the CPU time per wall time (medians over the processes; the wait, the rest
  and the gap also their maxima).

  Example:
    >>> r = {"steps": ["reduce2"], "masks": [1], "start": [[0.0], [0.1]], "end": [[1.0], [1.0]],
    ...      "cpu": [[0.5], [0.9]]}
    >>> s = step_stats(r)[0]
    >>> (s["wait_max"], round(s["after_both_max"], 2), round(s["cpu_per_wall"], 2))
    (0.1, 0.9, 0.75)
  """
  start, end, cpu = (np.asarray(row[k]) for k in ("start", "end", "cpu"))
  p = start.shape[0]
  out = []
  for k, mask in enumerate(row["masks"]):
    partner = [r ^ mask if mask else r for r in range(p)]
    both = np.maximum(start[:, k], start[partner, k])
    wait, after = both - start[:, k], end[:, k] - both
    gap = start[:, k] - end[:, k - 1] if k else np.zeros(p)
    util = cpu[:, k] / np.maximum(end[:, k] - start[:, k], 1e-9)
    out.append({
      "step": row["steps"][k], "wait": float(np.median(wait)), "wait_max": float(wait.max()),
      "after_both": float(np.median(after)), "after_both_max": float(after.max()),
      "gap": float(np.median(gap)), "gap_max": float(gap.max()),
      "cpu_per_wall": float(np.median(util)),
    })  # fmt: skip
  return out


def mpi_call_stats(row: dict, calls: dict[int, list]) -> list[dict]:
  """Per collective-permute inside one traced round (``calls[process]``: that process's
  ``mpi_calls``, each ``[call, t0, t1, ...]`` on the round's clock): the time inside MPI (its
  MPI_Irecv's entry to its last MPI_Wait's exit) and the time before it since the process's
  previous collective ended (or its call started), medians and maxima over the processes;
  a last entry ``after`` for the time from the last collective to the call's end.

  Example:
    >>> row = {"origin_s": 10.0, "start": [[0.0]], "end": [[1.0]]}
    >>> c = {0: [["irecv", 10.1, 10.1], ["isend", 10.1, 10.1], ["wait", 10.1, 10.5],
    ...          ["wait", 10.5, 10.6]]}
    >>> [(s["step"], round(s["mpi"], 2), round(s["before"], 2)) for s in mpi_call_stats(row, c)]
    [(0, 0.5, 0.1), ('after', 0.0, 0.4)]
  """
  per = []  # per process: [(before, mpi)] per collective, then (after, 0)
  for r, (starts, ends) in enumerate(zip(row["start"], row["end"])):
    t_start, t_end = row["origin_s"] + starts[0], row["origin_s"] + ends[-1]
    mine = [c for c in calls.get(r, []) if t_start <= c[1] <= t_end]
    posts = [i for i, c in enumerate(mine) if c[0] == "irecv"]
    out, last = [], t_start
    for i, j in zip(posts, [*posts[1:], len(mine)]):
      done = max(c[2] for c in mine[i:j])
      out.append((mine[i][1] - last, done - mine[i][1]))
      last = done
    per.append([*out, (t_end - last, 0.0)])
  k = min(len(x) for x in per)
  stats = []
  for i in range(k):
    before = np.asarray([x[i][0] if i < k - 1 else x[-1][0] for x in per])
    mpi = np.asarray([x[i][1] if i < k - 1 else 0.0 for x in per])
    stats.append({
      "step": i if i < k - 1 else "after", "mpi": float(np.median(mpi)), "mpi_max": float(mpi.max()),
      "before": float(np.median(before)), "before_max": float(before.max()),
    })  # fmt: skip
  return stats


def exchanges(
  row: dict, calls: dict[int, list], rate: float = RATE, min_bytes: int = 1024
) -> list[dict]:
  """Every pairwise exchange inside one traced round (``calls[process]`` as
  :func:`mpi_call_stats` takes them): its collective's index, the pair, its time from the
  later of the two MPI_Irecv posts to the later of the two last MPI_Wait exits, that time over
  m/B (m the bytes each way, B ``rate``), and each process's time from its call's start to its
  first MPI_Irecv (``first_post``, the same for every exchange of the round), and each
  direction's rate (``rates``: r→q, q→r, bytes/s from the later post to the receiver's
  MPI_Wait on its MPI_Irecv) and the two MPI_Irecv posts (``posts``, r's and q's); messages
  under ``min_bytes`` are left out.

  Example:
    >>> row = {"origin_s": 0.0, "start": [[0.0], [0.0]], "end": [[1.0], [1.0]]}
    >>> c = {0: [["irecv", 0.01, 0.01, 1, 100], ["wait", 0.01, 0.2, -1, 0]],
    ...      1: [["irecv", 0.05, 0.05, 0, 100], ["wait", 0.05, 0.45, -1, 0]]}
    >>> e = exchanges(row, c, rate=1000.0, min_bytes=1)[0]
    >>> (e["pair"], round(e["s"], 2), round(e["over_mb"], 1), e["first_post"])
    ((0, 1), 0.4, 4.0, [0.01, 0.05])
    >>> [round(x) for x in e["rates"]]  # 0→1 done at 0.45, 1→0 at 0.2, both from 0.05
    [250, 667]
  """
  per = {}  # process -> [(post, done, peer, bytes)] per collective
  first = []
  for r, (starts, ends) in enumerate(zip(row["start"], row["end"])):
    t_start, t_end = row["origin_s"] + starts[0], row["origin_s"] + ends[-1]
    mine = [c for c in calls.get(r, []) if t_start <= c[1] <= t_end]
    posts = [i for i, c in enumerate(mine) if c[0] == "irecv"]
    per[r] = [
      (mine[i][1], max(c[2] for c in mine[i:j]), mine[i][3], mine[i][4], _recv_done(mine[i:j]))
      for i, j in zip(posts, [*posts[1:], len(mine)])
      if mine[i][4] >= min_bytes  # not the paired mode's 4-byte hellos
    ]
    first.append(round(per[r][0][0] - t_start, 6) if per[r] else None)
  out = []
  for r, colls in per.items():
    for k, (post, done, q, m, got) in enumerate(colls):
      if q <= r or q not in per or k >= len(per[q]):
        continue
      post_q, done_q, _, _, got_q = per[q][k]
      t0 = max(post, post_q)
      t = max(done, done_q) - t0
      out.append({
        "k": k, "pair": (r, q), "s": t, "over_mb": t / (m / rate), "first_post": first,
        "rates": (m / max(got_q - t0, 1e-9), m / max(got - t0, 1e-9)),  # r→q, q→r, B/s
        "posts": (post, post_q),
      })  # fmt: skip
  return out


def _recv_done(calls: list) -> float:
  """The exit of the MPI_Wait on a collective's MPI_Irecv (its request), else its last."""
  req = calls[0][5] if len(calls[0]) > 5 else None
  waits = [c for c in calls if c[0] == "wait"]
  match = [c[2] for c in waits if req is not None and len(c) > 5 and c[5] == req]
  return match[0] if match else max(c[2] for c in calls)


def _cell(xs: list[float], scale: float = 1e3, f: str = "{:.1f}") -> str:
  """``median [min–max]`` of ``xs`` times ``scale`` (seconds to ms by default), each
  formatted by ``f``."""
  xs = [x * scale for x in xs]
  return f"{f.format(statistics.median(xs))} [{f.format(min(xs))}–{f.format(max(xs))}]"


def _median_max(stats: list[dict], name: str) -> str:
  """The table cell of ``name`` over the rounds' ``stats``: :func:`_cell` of its median
  over the hosts, then of its max over them (``name + "_max"``)."""
  return f"{_cell([x[name] for x in stats])}, {_cell([x[name + '_max'] for x in stats])}"


def _mpi_calls(rows: list[dict]) -> dict[int, list]:
  """Every process's stamped MPI calls (rows of kind ``mpi_calls``), by process."""
  calls: dict[int, list] = {}
  for r in rows:
    if r.get("kind") == "mpi_calls":
      calls.setdefault(r["process"], []).extend(r["calls"])
  return calls


def mpi_call_table(rows: list[dict]) -> str:
  """Markdown of :func:`mpi_call_stats` over the traced rounds of ``rows`` (ms, medians
  [min–max] over the rounds; rows of kind ``mpi_calls`` needed)."""
  import collections

  calls = _mpi_calls(rows)  # every file's: the clock's readings do not overlap between launches
  if not calls:
    return ""

  groups = collections.defaultdict(list)
  for r in rows:
    if r.get("kind") == "trace" and "origin_s" in r:  # a launch with --mpi-trace
      groups[(r["algorithm"], r["bytes"], r["mode"])].append(mpi_call_stats(r, calls))
  lines = [
    "| algorithm | n | mode | collective | before it (median, max over hosts) | inside MPI "
    "(median, max) |",
    "|---|---|---|---|---|---|",
  ]
  for (alg, n, mode), stats in sorted(groups.items()):
    for i in range(min(len(s) for s in stats)):
      s = [st[i] for st in stats]
      lines.append(
        f"| {alg} | {format_bytes(n)} | {mode} ({len(stats)}) | {s[0]['step']} |"
        f" {_median_max(s, 'before')} | {_median_max(s, 'mpi')} |"
      )
  lines += [
    "",
    "| algorithm | n | mode | exchanges | over 1.25 m/B | time / (m/B), median [min–max] "
    "| first MPI_Irecv after the call's start, ms, median [min–max] over rounds (latest host) |",
    "|---|---|---|---|---|---|---|",
  ]
  ex = collections.defaultdict(list)
  for r in rows:
    if r.get("kind") == "trace" and "origin_s" in r:
      ex[(r["algorithm"], r["bytes"], r["mode"])].append(exchanges(r, calls))
  for (alg, n, mode), rounds in sorted(ex.items()):
    every = [e for es in rounds for e in es]
    ratios = [e["over_mb"] for e in every]
    firsts = [max(f for f in es[0]["first_post"] if f is not None) for es in rounds if es]
    slow = sum(x > 1.25 for x in ratios)
    lines.append(
      f"| {alg} | {format_bytes(n)} | {mode} ({len(rounds)}) | {len(ratios)} | {slow} | "
      f"{statistics.median(ratios):.2f} [{min(ratios):.2f}–{max(ratios):.2f}] | "
      f"{_cell(firsts)} |"
    )
  return "\n".join(lines)


BOUND = {"halving_doubling": 2 * 3 / 4, "recursive_doubling": 2.0, "ring": 2 * 3 / 4}  # x n/B, p=4


def variant(path: str) -> str:
  """The setting a ``collectives.sh`` trace file was taken with, from its name.

  Example:
    >>> variant("rows/collectives_trace_run2.jsonl"), variant("collectives_trace_reno_run1.jsonl")
    ('default', 'reno')
  """
  stem = Path(path).name.removesuffix(".jsonl")
  middle = stem.removeprefix("collectives_trace").rsplit("_run", 1)[0]
  return middle.lstrip("_") or "default"


def summary_table(runs: list[tuple[str, list[dict]]]) -> str:
  """Markdown, one line per setting and algorithm over the launches ``runs`` (each a
  setting's name, :func:`variant`, and a file's rows): the timed whole all-reduce over its full-duplex bound (``BOUND`` · n/B),
  median [min–max] of the launches' medians; and from the traced rounds (where
  ``--mpi-trace`` ran), the first MPI_Irecv after the call's start (latest host, median of
  the rounds, then median [min–max] over launches) and the exchanges over 1.25 m/B in each
  mode (all launches together)."""
  import collections

  timed = collections.defaultdict(list)
  first = collections.defaultdict(list)
  slow = collections.defaultdict(lambda: [0, 0])
  spans = collections.defaultdict(list)  # (flags, algorithm, mode) -> each launch's median
  slow_dirs = collections.defaultdict(lambda: [0, 0])
  slow_rates = collections.defaultdict(list)
  for key, rows in runs:
    calls = _mpi_calls(rows)
    per_launch = collections.defaultdict(list)
    launch_spans = collections.defaultdict(list)
    for r in rows:
      if r.get("kind") in BOUND:
        timed[(key, r["kind"])].append(r["time_s"] / (BOUND[r["kind"]] * r["bytes"] / RATE))
      if r.get("kind") == "trace":
        span = float(np.max(r["end"]) - np.min(r["start"]))
        launch_spans[(key, r["algorithm"], r["mode"])].append(span)
      if r.get("kind") == "trace" and "origin_s" in r and calls:
        ex = exchanges(r, calls)
        if r["mode"] == "whole" and ex:
          per_launch[(key, r["algorithm"])].append(
            max(f for f in ex[0]["first_post"] if f is not None)
          )
        tally = slow[(key, r["algorithm"], r["mode"])]
        tally[0] += sum(e["over_mb"] > 1.25 for e in ex)
        tally[1] += len(ex)
        rates = [x for e in ex for x in e["rates"]]
        tally_d = slow_dirs[(key, r["algorithm"], r["mode"])]
        tally_d[0] += sum(x < 0.8 * RATE for x in rates)
        tally_d[1] += len(rates)
        slow_rates[(key, r["algorithm"])] += [x for x in rates if x < 0.8 * RATE]
    for k, v in per_launch.items():
      first[k].append(statistics.median(v))
    for k, v in launch_spans.items():
      spans[k].append(statistics.median(v))
  modes = " | ".join(MODES)
  lines = [
    f"| setting | algorithm | launches | whole / bound | round, ms: {modes} | first MPI_Irecv, ms "
    f"| exchanges over 1.25 m/B: {modes} | directions under 0.8 B: {modes} | their rate, MB/s |",
    "|---|---|---|---|" + "---|" * (3 * len(MODES) + 2),
  ]
  for (key, alg), ratios in sorted(timed.items()):
    tally = [slow.get((key, alg, m)) for m in MODES]
    lines.append(
      f"| {key} | {alg} | {len(ratios)} | {_cell(ratios, 1, '{:.2f}')}× | "
      + " | ".join(
        _cell(spans[(key, alg, m)], 1e3, "{:.0f}") if spans.get((key, alg, m)) else "—"
        for m in MODES
      )
      + " | "
      + (_cell(first[(key, alg)], 1e3, "{:.0f}") if first.get((key, alg)) else "—")
      + " | "
      + " | ".join(f"{t[0]} of {t[1]}" if t and t[1] else "—" for t in tally)
      + " | "
      + " | ".join(
        f"{t[0]} of {t[1]}" if t and t[1] else "—"
        for t in (slow_dirs.get((key, alg, m)) for m in MODES)
      )
      + " | "
      + (_cell([x / 1e6 for x in slow_rates[(key, alg)]], 1) if slow_rates.get((key, alg)) else "—")
      + " |"
    )
  return "\n".join(lines)


def step_slow_table(runs: list[tuple[str, list[dict]]], apart: float = 0.005) -> str:
  """Markdown: per setting, algorithm, mode and message step, the exchanges whose partners
  posted their MPI_Irecv more than ``apart`` seconds apart, and of those the directions under
  0.8 of the line rate from the later partner to the earlier and the other way; then the
  same for the exchanges whose partners started together (``runs`` as :func:`summary_table`
  takes them)."""
  import collections

  tally = collections.defaultdict(lambda: [0, 0, 0, 0, 0])  # apart: n, late→, early→; together
  width = 0
  for key, rows in runs:
    calls = _mpi_calls(rows)
    for r in rows:
      if r.get("kind") != "trace" or "origin_s" not in r or not calls:
        continue
      for e in exchanges(r, calls):
        late_a = e["posts"][0] > e["posts"][1]  # the pair's first posted later than its second
        to_early, to_late = e["rates"] if late_a else e["rates"][::-1]
        t = tally[(key, r["algorithm"], r["mode"], e["k"])]
        if abs(e["posts"][0] - e["posts"][1]) > apart:
          t[0] += 1
          t[1] += to_early < 0.8 * RATE
          t[2] += to_late < 0.8 * RATE
        else:
          t[3] += 1
          t[4] += min(e["rates"]) < 0.8 * RATE
        width = max(width, e["k"] + 1)
  lines = [
    f"| setting | algorithm | mode | partners over {apart * 1e3:.0f} ms apart, per step: slow "
    "later→earlier / slow earlier→later / exchanges | partners together: exchanges with a slow "
    "direction / exchanges |",
    "|---|---|---|---|---|",
  ]
  for key, alg, mode in sorted({k[:3] for k in tally}):
    ts = [tally.get((key, alg, mode, k)) for k in range(width)]
    lines.append(
      f"| {key} | {alg} | {mode} | "
      + "; ".join(f"{t[1]}/{t[2]}/{t[0]}" for t in ts if t)
      + " | "
      + "; ".join(f"{t[4]}/{t[3]}" for t in ts if t)
      + " |"
    )
  return "\n".join(lines)


def trace_table(rows: list[dict]) -> str:
  """Markdown of the traced rounds: per algorithm, mode and step the medians [min–max] over
  the rounds of :func:`step_stats` (ms), and each mode's span (the round's first start to
  its last end)."""
  import collections

  groups = collections.defaultdict(list)
  for r in rows:
    if r.get("kind") == "trace":
      groups[(r["algorithm"], r["bytes"], r["mode"])].append(r)
  lines = [
    "| algorithm | n | mode | step | wait for partner (median, max over hosts) | after both "
    "started (median, max) | gap before (median, max) | CPU / wall | span |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for (alg, n, mode), rs in sorted(groups.items()):
    spans = [float(np.max(r["end"]) - np.min(r["start"])) for r in rs]
    stats = [step_stats(r) for r in rs]
    for k in range(len(stats[0])):
      s = [st[k] for st in stats]
      lines.append(
        f"| {alg} | {format_bytes(n)} | {mode} ({len(rs)}) | {s[0]['step']} |"
        f" {_median_max(s, 'wait')} | {_median_max(s, 'after_both')} | {_median_max(s, 'gap')} |"
        f" {_cell([x['cpu_per_wall'] for x in s], 1)} | "
        + (f"{_cell(spans)} |" if k == 0 else " |")
      )
  return "\n".join(lines)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--sizes", default="1KiB,2MiB,4MiB,8MiB,16MiB", help="message bytes m")
  ap.add_argument("--allreduce", default="16MiB", help="bytes per host of the whole all-reduces")
  ap.add_argument("--algorithms", default="halving_doubling,recursive_doubling,ring")
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument(
    "--sysctl",
    action="append",
    default=[],
    metavar="NAME=VALUE",
    help="set a net.ipv4 sysctl of this host's network namespace first (as root), e.g."
    " tcp_slow_start_after_idle=0; recorded in the rows",
  )
  ap.add_argument(
    "--mca",
    action="append",
    default=[],
    metavar="NAME=VALUE",
    help="an Open MPI MCA parameter for this rank (OMPI_MCA_NAME, set before MPI starts), e.g."
    " mpi_yield_when_idle=1; recorded in the rows",
  )
  ap.add_argument(
    "--split", default="", help="trace these algorithms whole and step by step (see above)"
  )
  ap.add_argument(
    "--xla-flag",
    action="append",
    default=[],
    metavar="FLAG",
    help="add to XLA_FLAGS before XLA starts, e.g."
    " --xla_cpu_enable_concurrency_optimized_scheduler=false; recorded in the rows",
  )
  ap.add_argument(
    "--mpi-trace",
    action="store_true",
    help="stamp every MPI_Irecv, MPI_Isend and MPI_Wait of XLA's MPI collectives too (a PMPI"
    " shim, mpi_call_trace.c, built by build_mpi_call_trace.sh; --collectives mpi); rows of kind"
    " mpi_calls",
  )
  ap.add_argument(
    "--table", metavar="ROWS", nargs="+", help="print the traced rounds of ROWS and exit"
  )
  ap.add_argument(
    "--summary", metavar="ROWS", nargs="+", help="print the launches' summary (one file each)"
  )
  ap.add_argument("--out")
  args = ap.parse_args(argv)
  if args.summary:
    runs = [(variant(f), [json.loads(x) for x in open(f) if x.strip()]) for f in args.summary]
    print(summary_table(runs))
    print()
    print(step_slow_table(runs))
    return 0
  if args.table:
    rows = [json.loads(line) for path in args.table for line in open(path) if line.strip()]
    print(trace_table(rows))
    print()
    print(mpi_call_table(rows))
    return 0
  if not args.out:
    ap.error("--out is required (or --table ROWS)")
  sysctls = dict(kv.split("=", 1) for kv in args.sysctl)
  mca = dict(kv.split("=", 1) for kv in args.mca)
  for name, value in mca.items():  # read by Open MPI when XLA's collectives start it
    os.environ[f"OMPI_MCA_{name}"] = value
  for name, value in sysctls.items():  # the namespace's own copy: gone with the cluster
    Path("/proc/sys/net/ipv4", name).write_text(value)
  if args.xla_flag:  # read when XLA's CPU client starts (distributed.initialize_from_env)
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *args.xla_flag]).strip()
  # + .RANK: each process's MPI calls, folded into the rows at the end (one /tmp for all hosts)
  calls = os.path.join(tempfile.gettempdir(), f"steps-{Path(args.out).name}.mpicalls")
  if args.mpi_trace:  # before MPI starts: MPIwrapper's copy that stamps its MPI calls
    if not TRACE_LIB.is_file():
      raise SystemExit(
        f"steps.py: --mpi-trace needs {TRACE_LIB}: bash experiments/mpi_peer/build_mpi_call_trace.sh"
      )
    if os.environ.get(distributed.ENV_MPIWRAPPER) != str(TRACE_LIB):  # read when jax loads
      env = {**os.environ, distributed.ENV_MPIWRAPPER: str(TRACE_LIB), "MPI_CALL_TRACE": calls}
      os.execve(sys.executable, [sys.executable, *sys.argv], env)  # MPI not started yet
  distributed.initialize_from_env()
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax import lax
  from jax.experimental import multihost_utils
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  from allreduce_jax import devices
  from allreduce_jax.tools.bench import programs, verifiable_block
  from allreduce_jax.units import parse_size

  p = jax.device_count()
  mesh = Mesh(np.array(jax.devices()), ("i",))
  spec = P("i")
  collectives = jax.config.jax_cpu_collectives_implementation
  flags = os.environ.get("OMPI_MCA_btl_tcp_flags")
  tcp = {k: v for k, v in os.environ.items() if k.startswith("OMPI_MCA_btl_tcp_")}

  def timed(fn, x) -> list[float]:
    """Each call's time, the longest over the processes (a receiver waits longest)."""
    jax.block_until_ready(fn(x))  # compile, connect
    out = []
    for k in range(args.reps):
      multihost_utils.sync_global_devices(f"rep{k}")
      t0 = time.perf_counter()
      jax.block_until_ready(fn(x))
      out.append(time.perf_counter() - t0)
    every = np.asarray(multihost_utils.process_allgather(np.asarray(out)))
    return [float(t) for t in every.reshape(-1, len(out)).max(axis=0)]

  def step(pattern: str):
    perm = pairs(pattern, p)

    def body(b):
      got = lax.ppermute(b, "i", perm)
      return b + got if pattern == "exchange_add" else got

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))

  def put(count: int, mesh=mesh, spec=spec):
    return devices.put(
      (p, count), "float32", NamedSharding(mesh, spec), lambda idx: verifiable_block(idx, p, count)
    )

  def chained(fn, x, calls: int = 20) -> list[float]:
    """Per call over ``calls`` calls back to back after a barrier (no barrier skew in a
    small step's time), the longest over the processes."""
    jax.block_until_ready(fn(x))
    out = []
    for k in range(args.reps):
      multihost_utils.sync_global_devices(f"chain{k}")
      t0 = time.perf_counter()
      for _ in range(calls):
        x = fn(x)
      jax.block_until_ready(x)
      out.append((time.perf_counter() - t0) / calls)
    every = np.asarray(multihost_utils.process_allgather(np.asarray(out)))
    return [float(t) for t in every.reshape(-1, len(out)).max(axis=0)]

  rows = []

  def record(kind: str, m: int, ts: list[float]) -> None:
    rows.append({
      "kind": kind, "bytes": m, "p": p, "reps": len(ts), "collectives": collectives,
      "btl_tcp_flags": flags, "tcp_mca": tcp, "mca": mca or None, "sysctl": sysctls or None,
      "yield_when_idle": os.environ.get("OMPI_MCA_mpi_yield_when_idle"),
      "xla_flags": args.xla_flag or None, "time_s": statistics.median(ts),
      "time_s_min": min(ts), "time_s_max": max(ts), "times_s": ts,
    })  # fmt: skip
    if jax.process_index() == 0:
      print(f"{kind:20s} {m:>10d} B  {statistics.median(ts) * 1e3:9.2f} ms", flush=True)

  for m in (parse_size(s) for s in args.sizes.split(",") if s):
    x = put(m // 4)
    for pattern in PATTERNS:
      record(pattern, m, timed(step(pattern), x))
      if m < 1 << 20:  # the per-step cost alpha: back to back
        record(f"{pattern}_chained", m, chained(step(pattern), x))
    local = jax.jit(jnp.add)
    a = jnp.ones((m // 4,), jnp.float32)
    b = jnp.ones((m // 4,), jnp.float32)
    record("add", m, timed(lambda _, a=a, b=b, f=local: f(a, b), None))
  n = parse_size(args.allreduce)
  for alg in filter(None, args.algorithms.split(",")):
    alg_mesh, alg_spec, fn, _ = programs(alg, p, "sum")
    record(alg, n, timed(fn, put(n // 4, alg_mesh, alg_spec)))

  def step_body(kind: str, mask: int, hello: bool = False):
    perm = [(r, r ^ mask) for r in range(p)]

    def body(x):  # x: this device's f32[1, c]
      v = x.reshape(-1)
      if hello:  # 4 bytes with the partner first; the step's message waits for them
        v, _ = lax.optimization_barrier((v, lax.ppermute(v[:1], "i", perm)))
      bit = (lax.axis_index("i") // mask) % 2  # which half this rank keeps or holds
      if kind == "exchange":
        out = v + lax.ppermute(v, "i", perm)
      elif kind == "reduce":
        half = v.shape[0] // 2
        keep = lax.dynamic_slice_in_dim(v, bit * half, half)
        give = lax.dynamic_slice_in_dim(v, (1 - bit) * half, half)
        out = keep + lax.ppermute(give, "i", perm)
      else:  # gather
        h = v.shape[0]
        got = lax.ppermute(v, "i", perm)
        out = lax.dynamic_update_slice_in_dim(jnp.zeros((2 * h,), v.dtype), v, bit * h, 0)
        out = lax.dynamic_update_slice_in_dim(out, got, (1 - bit) * h, 0)
      return out.reshape(1, -1)

    return body

  def split_program(kind: str, mask: int):
    body = step_body(kind, mask)
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))

  def whole_paired(steps):
    """The steps in one jitted program, each after 4 bytes with its partner."""
    bodies = [step_body(kind, mask, hello=True) for kind, mask in steps]

    def body(x):
      for b in bodies:
        x = b(x)
      return x

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))

  def step_hello(mask: int):
    perm = [(r, r ^ mask) for r in range(p)]
    return jax.jit(
      jax.shard_map(lambda v: lax.ppermute(v, "i", perm), mesh=mesh, in_specs=spec, out_specs=spec)
    )

  def stamped(fn, x):  # start, end (ns of the one clock), this process's CPU ns
    t0, c0 = time.perf_counter_ns(), time.process_time_ns()
    y = jax.block_until_ready(fn(x))
    return y, (t0, time.perf_counter_ns(), time.process_time_ns() - c0)

  def local(y) -> np.ndarray:
    return np.asarray(y.addressable_shards[0].data).reshape(-1)

  for alg in filter(None, args.split.split(",")):
    steps = split_steps(alg, p)
    fns = [split_program(kind, mask) for kind, mask in steps]
    alg_mesh, alg_spec, whole, _ = programs(alg, p, "sum")
    x = put(n // 4)
    y = x
    for f in fns:  # compile, connect
      y = jax.block_until_ready(f(y))
    want = local(jax.block_until_ready(whole(put(n // 4, alg_mesh, alg_spec))))
    got = local(y)
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-5):
      raise SystemExit(f"steps.py: --split {alg}: the steps' result differs from the whole's")
    xw = put(n // 4, alg_mesh, alg_spec)
    hello = {mask: step_hello(mask) for _, mask in steps}  # 4 bytes with the step's partner
    token = put(1)
    for h in hello.values():  # compile, connect
      jax.block_until_ready(h(token))
    paired_whole = whole_paired(steps)
    if not np.allclose(local(jax.block_until_ready(paired_whole(x))), want, rtol=1e-5, atol=1e-5):
      raise SystemExit(f"steps.py: --split {alg}: the paired program's result differs")
    for k in range(args.reps):
      for mode in MODES:
        multihost_utils.sync_global_devices(f"{alg}{mode}{k}")
        if mode == "whole":
          stamps = [stamped(whole, xw)[1]]
        elif mode == "whole_paired":
          stamps = [stamped(paired_whole, x)[1]]
        else:
          y, stamps = x, []
          for i, f in enumerate(fns):
            if mode == "barriered":
              multihost_utils.sync_global_devices(f"{alg}{mode}{k}.{i}")
            if mode == "paired":  # the two partners start the step together
              jax.block_until_ready(hello[steps[i][1]](token))
            y, st = stamped(f, y)
            stamps.append(st)
        us = np.asarray(stamps, np.int64) // 1000  # gathered as int32 s and us (no x64)
        parts = (us // 10**6, us % 10**6)
        s_, u_ = (np.asarray(multihost_utils.process_allgather(a.astype(np.int32))) for a in parts)
        every = (s_.astype(np.float64) + u_ * 1e-6).reshape(p, len(stamps), 3)
        t0 = every[:, 0, 0].min()
        rows.append({
          "kind": "trace", "algorithm": alg, "mode": mode, "bytes": n, "p": p, "rep": k,
          "origin_s": float(t0),  # the one clock's (CLOCK_MONOTONIC) reading of the 0
          "steps": [alg] if mode.startswith("whole") else [f"{k}{m}" for k, m in steps],
          "masks": [0] if mode.startswith("whole") else [m for _, m in steps],
          "start": (every[:, :, 0] - t0).tolist(), "end": (every[:, :, 1] - t0).tolist(),
          "cpu": every[:, :, 2].tolist(), "collectives": collectives, "btl_tcp_flags": flags,
          "tcp_mca": tcp, "mca": mca or None, "sysctl": sysctls or None,
          "yield_when_idle": os.environ.get("OMPI_MCA_mpi_yield_when_idle"),
          "xla_flags": args.xla_flag or None,
        })  # fmt: skip
        if jax.process_index() == 0:
          span = every[:, :, 1].max() - t0
          print(f"trace {alg:20s} {mode:10s} round {k}: {span * 1e3:9.2f} ms", flush=True)
  multihost_utils.sync_global_devices("done")
  if jax.process_index() == 0:
    if args.mpi_trace:
      for r in range(p):
        path = Path(f"{calls}.{r}")
        lines = [ln.split() for ln in path.read_text().splitlines()] if path.exists() else []
        path.unlink(missing_ok=True)
        rows.append({
          "kind": "mpi_calls", "process": r, "fields": "call t0 t1 peer bytes request thread",
          "calls": [[c, float(a), float(b), int(q), int(m), req, int(t)]
                    for c, a, b, q, m, req, t in lines],
        })  # fmt: skip
    with open(args.out, "a") as f:
      for r in rows:
        f.write(json.dumps(r) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
