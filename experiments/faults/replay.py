"""The faults study's replay tables, ``replay.md`` from ``rows/``: every slow-link cell
against the replay of its schedule with the slow link (half duplex, α of a healthy run) and
the cut bound, the ring alone and every algorithm timed in blocks against the replay with each
link's token bucket, host 1's TCP during the runs, and ``auto`` told the link rates.

    python experiments/faults/replay.py   # writes replay.md
"""

from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path

from allreduce_jax import cluster_rows, cost_model, gloo_model, results, units
from allreduce_jax.tools import faults

HERE = Path(__file__).resolve().parent
ROWS = HERE / "rows"
EMULATED = HERE.parent / "emulated_network" / "rows" / "tcp_queue_16k"


def _cc(row: dict) -> str | None:
  """The congestion control a row's run asked for (``cluster --congestion-control``), or
  None: the hosts inherited the default of the machine running the study."""
  if row.get("kind") != "bench":  # host 1's TCP samples: their own field
    return row.get("cc")
  return json.loads(row["key"])["network"].get("congestion_control")


def _idle_label(row: dict) -> str:
  """``, tcp_slow_start_after_idle 1`` (or 0) for the ``slow-idle`` pairs' rows, and the
  congestion control where one was asked for (``, cubic``), else nothing."""
  cc = _cc(row)
  idle = row.get("slow_start_after_idle")
  return (f", tcp_slow_start_after_idle {idle}" if idle is not None else "") + (
    f", {cc}" if cc else ""
  )


def _slow_rows() -> list[dict]:
  """One cell per slow-link measurement (network, queue, ``tcp_slow_start_after_idle``,
  algorithm, size) over its runs (:func:`cluster_rows.runs`)."""
  rows = cluster_rows.bench_rows(ROWS / "slow_link.jsonl")
  return cluster_rows.runs(rows, "slow_start_after_idle")


def _traced():
  """``cost_model.use_params`` of the cost parameters the study's bench rows traced with
  (``gloo_model.traced_params``: checked on every row, once)."""
  return cost_model.use_params(_traced_params())


@functools.cache
def _traced_params():
  return gloo_model.traced_params(results.read_rows(ROWS / "slow_link.jsonl", "bench"))


def _within_20(ratio: float) -> bool:
  """A measured / replay ratio within 20 %."""
  return 0.8 <= ratio <= 1.2


@functools.lru_cache
def _alpha(net: str, p: int) -> float:
  """α per step of a healthy run of ``net`` on ``p`` hosts: ``gloo_model.fit_alpha`` on the
  emulated network study's 4 and 64 KiB rows (timed in blocks at the same 16 KiB TCP
  queue); the switch's of ``p`` hosts where that study has no such network; 0 if neither
  (:func:`allreduce_jax.cluster_rows.healthy_alpha`)."""
  return cluster_rows.healthy_alpha(EMULATED, net, p)


def _link_label(c: dict) -> str:
  return ", ".join(f"h{h} {v * 8 / 1e6:g} Mbit/s" for h, v in c["link_rates"].items()) or "healthy"


def _queue_order(c: dict) -> tuple:
  """The deeper queue first, then the study's runs before the ``slow-idle`` pairs (knob on,
  then off)."""
  return -c["queue_ms"], c["idle"] is not None, c["queue"].count(","), -(c["idle"] or 0)


def replay_tables() -> list[str]:
  """Every slow-link cell (the median of its runs) against the replay with that link's rate
  (half duplex, α of a healthy run) and the cut bound, then ``auto`` told the rates against
  the best measured, per queue."""
  rows = _slow_rows()
  cells = []
  with _traced():
    for row in rows:
      for c in cluster_rows.link_rate_cells([row], faults.row_links, _alpha):
        queue = json.loads(row["key"])["network"]["queue_s"] * 1e3
        cells.append({**c, "queue_ms": queue, "queue": f"{queue:g}{_idle_label(row)}",
                      "idle": row.get("slow_start_after_idle"),
                      "times_s": [t / 1e6 for t in row["times_us"]]})  # fmt: skip
    queues = list(dict.fromkeys(c["queue"] for c in sorted(cells, key=_queue_order)))
    picks = {(q, d): cluster_rows.auto_picks([c for c in cells if c["queue"] == q], _alpha, d)
             for q in queues for d in ("half", "full")}  # fmt: skip
  f = lambda v: "–" if v is None else f"{v * 1e3:.0f}"  # noqa: E731
  r = lambda a, b: "–" if b is None else f"{a / b:.2f}"  # noqa: E731
  lines = ["| network | queue ms | slow link | algorithm | MiB | runs | measured ms (min–max) |"
           " replay ms | measured / replay | bound ms | measured / bound |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
  order = lambda c: (c["network"], c["hosts"], *_queue_order(c), c["bytes"],  # noqa: E731
                     -min(c["link_rates"].values(), default=float("inf")))  # fmt: skip
  for c in sorted(cells, key=order):
    lines.append(f"| {c['network']}, {c['hosts']} hosts | {c['queue']} | {_link_label(c)} |"
                 f" {c['algorithm']} | {c['bytes'] / 2**20:g} | {len(c['times_s'])} |"
                 f" {units.spread(c['times_s'], '.0f', scale=1e3, alone=True, brackets='()')} | {f(c['replay_s'])} |"
                 f" {r(c['measured_s'], c['replay_s'])} | {f(c['bound_s'])} |"
                 f" {r(c['measured_s'], c['bound_s'])} |")  # fmt: skip
  near = lambda cs: sum(_within_20(c["measured_s"] / c["replay_s"]) for c in cs)  # noqa: E731
  summary = []
  for net, p, q in dict.fromkeys((c["network"], c["hosts"], c["queue"]) for c in cells):
    mine = [c for c in cells if c["replay_s"] and c["algorithm"] != "psum" and c["bytes"] >= 2**20
            and (c["network"], c["hosts"], c["queue"]) == (net, p, q)]  # fmt: skip
    slow = [c for c in mine if c["link_rates"]]
    per_alg = ", ".join(
      f"{a} {near([c for c in slow if c['algorithm'] == a])} of"
      f" {sum(c['algorithm'] == a for c in slow)}"
      for a in dict.fromkeys(c["algorithm"] for c in slow)
    )
    if not mine:
      continue
    head, _, tail = q.partition(",")
    summary += [f"{net}, {p} hosts, queues of {head} ms{tail and ',' + tail}: measured within"
                f" 20 % of the replay in {near(mine)} of"
                f" {len(mine)} hand-written cells (healthy {near(mine) - near(slow)} of"
                f" {len(mine) - len(slow)}, with the slow link {near(slow)} of {len(slow)});"
                f" with the slow link, per algorithm: {per_alg or '–'}.", ""]  # fmt: skip
  alphas = ", ".join(f"{n}, {p} hosts {_alpha(n, p) * 1e3:.2f} ms"
                     for n, p in dict.fromkeys((c["network"], c["hosts"]) for c in cells))  # fmt: skip
  auto = ["| network | queue ms | slow link | MiB | auto's pick (half-duplex replay) | its time"
          " / best measured | best measured | best / best candidate | pick of the full-duplex"
          " replay / best |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
  for q in queues:
    for h, full in zip(picks[q, "half"], picks[q, "full"], strict=True):
      auto.append(f"| {h['network']}, {h['hosts']} hosts | {q} | {_link_label(h)} |"
                  f" {h['bytes'] / 2**20:g} | {h['pick']} | {h['pick_s'] / h['best_s']:.2f} |"
                  f" {h['best']} | {h['best_s'] / h['best_candidate_s']:.2f} | {full['pick']}"
                  f" {full['pick_s'] / full['best_s']:.2f} |")  # fmt: skip
  return [
    "## The replay with the slow link, and the bound any exact algorithm meets", "",
    "Replay: `gloo_model.emulated_seconds(..., link_rates={host: bytes/s})`, the algorithm's"
    " schedule as XLA:CPU runs it over gloo (one ppermute at a time, an exchange's two"
    " directions in turn) on the network with the host's links at the fault's rate both ways"
    " (a link between two hosts at its slower end's),"
    f" β from each link's payload rate, α per step of a healthy run ({alphas}; the emulated"
    " network study's 4 and 64 KiB rows of that network, else of the switch with as many"
    " hosts), no token bucket. `psum` is replayed as a ring"
    " (its record's model). Bound: `gloo_model.cut_bound_seconds`, T ≥ max_h n / (c_h · s):"
    " every other host's result needs host h's n bytes and h's result the others' sum, so n"
    " bytes cross h's links each way (c_h: their rate together, one link on a switch or a"
    " fat tree, two on a ring of links; s = 0.956, the payload share at a 1500-byte MTU);"
    " on a switch the ring moves 2(p−1)/p·n through the slow link (1.5× at p = 4).", "",
    "Measured: the median of the cell's runs (each the median of 3 calls of the slowest"
    " process).", "",
    *summary,
    *lines, "",
    "### The ring alone, host 1 at 1/10", "",
    "`run.py slow-alone`: 6 calls of the ring back to back (bench `--order blocks`: no"
    " other algorithm's calls between them), 4 MiB per host, 4-host switch.", "",
    alone_table(), "",
    "### Every algorithm alone, host 1 slowed", "",
    "`run.py slow-alone every RUNS [CC] [--slow K] [--net NET]`: every algorithm in blocks (bench"
    " `--order blocks`: each algorithm's 3 calls back to back, after its warm-up), 1 and 4 MiB"
    " per host (1 MiB only at 1/100) on the 4-host switch, 1 MiB with `--net switch-8|fat-tree|torus`"
    " (8 hosts of a switch, fat_tree:2:1, torus:4 with both of host 1's links slowed), host 1's link at 1/K; a run the median of 3 calls of the slowest process, a cell the median of its runs"
    " (min–max over them), taken beside other work on the same CPU. Replay: as above, with"
    " each link's token bucket as the cluster shapes it (`emulated_seconds(..., buckets=True)`,"
    " `gloo_model.link_buckets`: 4 ms of a link's rate but at least 64 KiB, so the slow link's"
    " holds 26 ms at 20 Mbit/s, 5.2 ms at 100 Mbit/s, 262 ms at 2 Mbit/s, and passes that much"
    " at once after each pause; a healthy link's 4 ms). Round-robin / replay: the"
    " same cell of the round-robin runs above (same network, rate, congestion control and queue), whose calls"
    " each start with the skew between the processes that the call before left"
    " ([replay_trace.md](replay_trace.md)). `auto` as in the section below, its candidates"
    " priced by this replay, each link's bucket included (`cluster_rows.auto_picks(...,"
    " buckets=True)`); beside it what it picks priced without the buckets.", "",
    *blocks_tables(),
    "### Host 1's TCP and the slow link's queues during the slow-link runs", "",
    "Sampled every 0.25 s in host 1's namespace while a run went on (its algorithms and sizes;"
    " host 1's link: the column): `ss -tin` of its sockets with data unacknowledged or waiting (smoothed RTT,"
    " cwnd, delivery rate) and `tc -s qdisc` of the slow link's two ends (the switch's port"
    " toward host 1 and host 1's `eth0`); one row a run.", "",
    tcp_table(), "",
    "### `auto` told the link rates", "",
    "`cost_model.use_topology(topology.with_link_rates(topology.switch(1), {1: 0.1}),"
    ' duplex="half")` around the tracing: `choose` among the measured candidates of `auto`,'
    " priced by the replay above; beside it the pick of the replay at full duplex (the"
    " topology replay's own assumption). Best measured includes `psum`.", "",
    *auto, "",
  ]  # fmt: skip


def alone_table() -> str:
  """The ring alone (:func:`slow_alone`): each run against the replay."""
  rows = [
    r for r in results.read_rows(ROWS / "slow_link_alone.jsonl", "bench") if r["iters"] == 6
  ]  # every's: 3 calls
  if not rows:
    return "(not measured)"
  lines = ["| queue ms | algorithm | MiB | calls | measured ms (median; min–max of the calls) |"
           " replay ms | measured / replay |", "|---|---|---|---|---|---|---|"]  # fmt: skip
  with _traced():
    for r in rows:
      (c,) = cluster_rows.link_rate_cells([r], faults.row_links, _alpha)
      q = json.loads(r["key"])["network"]["queue_s"] * 1e3
      lines.append(f"| {q:g} | {c['algorithm']} | {c['bytes'] / 2**20:g} | {r['iters']} |"
                   f" {r['time_us'] / 1e3:.0f}; {r['time_us_min'] / 1e3:.0f}–"
                   f"{r['time_us_max'] / 1e3:.0f} | {c['replay_s'] * 1e3:.0f} |"
                   f" {c['measured_s'] / c['replay_s']:.2f} |")  # fmt: skip
  return "\n".join(lines)


def _blocks_cells() -> list[dict]:
  """``slow-alone every``'s rows (3 calls a run, unlike the ring alone's 6), one dict a cell
  (host 1's slow factor k, congestion control, queue, algorithm, size) of :func:`~allreduce_jax.cluster_rows.link_rate_cells`
  (replayed with each link's own token bucket, ``buckets=True``: the slow link's 64 KiB)
  with ``k``, ``cc``, ``queue_ms``, ``runs_s`` (each run's measured seconds; a key's n-th row is run
  n), ``measured_s`` their median and ``rr`` the round-robin cell's measured / replay (the
  median of its runs in ``slow_link.jsonl``, same k, congestion control and queue; None if
  none)."""
  rows = [r for r in cluster_rows.bench_rows(ROWS / "slow_link_alone.jsonl") if r["iters"] != 6]
  cells: dict[str, dict] = {}
  with _traced():
    for r in rows:
      if r["key"] not in cells:
        (c,) = cluster_rows.link_rate_cells(
          [r], faults.row_links, _alpha, buckets=True
        )  # each link's own bucket
        cells[r["key"]] = {**c, "cc": _cc(r), "k": cluster_rows.slowdown(r, faults.row_links), "runs_s": [],
                           "queue_ms": json.loads(r["key"])["network"]["queue_s"] * 1e3}  # fmt: skip
      cells[r["key"]]["runs_s"].append(r["time_us"] / 1e6)
    rr = {}
    for r in _slow_rows():
      if r.get("slow_start_after_idle") is None:
        for c in cluster_rows.link_rate_cells([r], faults.row_links, _alpha):
          q = json.loads(r["key"])["network"]["queue_s"] * 1e3
          rr[
            cluster_rows.slowdown(r, faults.row_links),
            _cc(r),
            q,
            c["network"],
            c["hosts"],
            c["algorithm"],
            c["bytes"],
          ] = c
  for c in cells.values():
    c["measured_s"] = statistics.median(c["runs_s"])
    o = rr.get(
      (c["k"], c["cc"], c["queue_ms"], c["network"], c["hosts"], c["algorithm"], c["bytes"])
    )
    c["rr"] = o["measured_s"] / o["replay_s"] if o and o["replay_s"] else None
  return list(cells.values())


def blocks_tables() -> list[str]:
  """Every algorithm timed in blocks (:func:`slow_alone` ``every``) against the replay, per
  host 1's rate, congestion control and queue: each cell's runs, the within-20 % count per algorithm, and ``auto``
  told the rates against the best measured in the same runs."""
  cells = _blocks_cells()
  if not cells:
    return ["(not measured)", ""]
  f = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
  out = []
  group = lambda c: (c["network"], c["hosts"], c["k"], c["cc"], c["queue_ms"])  # noqa: E731
  for net, p, k, cc, q in sorted(
    dict.fromkeys(map(group, cells)),
    key=lambda g: (g[0] != "switch", g[1], g[0], g[2], g[3] or "", -g[4]),  # switches first
  ):
    mine = [c for c in cells if group(c) == (net, p, k, cc, q)]
    hand = [c for c in mine if c["replay_s"] and c["algorithm"] != "psum"]
    per_alg = ", ".join(
      f"{a} {sum(_within_20(c['measured_s'] / c['replay_s']) for c in hand if c['algorithm'] == a)} of"
      f" {sum(c['algorithm'] == a for c in hand)}"
      for a in dict.fromkeys(c["algorithm"] for c in hand)
    )
    n_rr = [c for c in hand if c["rr"] is not None]
    rr_near = f"{sum(_within_20(c['rr']) for c in n_rr)} of {len(n_rr)}" if n_rr else "not measured"
    lines = ["| algorithm | MiB | runs | measured ms (min–max) | replay ms | measured / replay"
             " (min–max over runs) | round-robin / replay |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in sorted(mine, key=lambda c: c["bytes"]):
      ratios = [t / c["replay_s"] for t in c["runs_s"]] if c["replay_s"] else []
      span = f" ({units.span(ratios)})" if len(ratios) > 1 else ""
      lines.append(f"| {c['algorithm']} | {c['bytes'] / 2**20:g} | {len(c['runs_s'])} |"
                   f" {units.spread(c['runs_s'], '.0f', scale=1e3, alone=True, brackets='()')} |"
                   f" {'–' if not c['replay_s'] else format(c['replay_s'] * 1e3, '.0f')} |"
                   f" {f(c['measured_s'] / c['replay_s']) if c['replay_s'] else '–'}{span} |"
                   f" {f(c['rr'])} |")  # fmt: skip
    runs = max(len(c["runs_s"]) for c in mine)
    auto = ["| MiB | auto's pick (the replay with each link's bucket) | its time / best measured"
            " (min–max over runs) | best measured | best / best candidate | pick priced without"
            " buckets / best measured (min–max) |", "|---|---|---|---|---|---|"]  # fmt: skip
    with _traced():
      without = {h["bytes"]: h["pick"] for h in cluster_rows.auto_picks(mine, _alpha)}
      for h in cluster_rows.auto_picks(mine, _alpha, buckets=True):
        same = [c for c in mine if c["bytes"] == h["bytes"]]
        t = {c["algorithm"]: c["measured_s"] for c in same}
        b = without[h["bytes"]]
        each = {h["pick"]: [], b: []}
        for i in range(runs):
          run = {c["algorithm"]: c["runs_s"][i] for c in same if len(c["runs_s"]) > i}
          for a in each:
            if a in run:
              each[a].append(run[a] / min(run.values()))
        auto.append(f"| {h['bytes'] / 2**20:g} | {h['pick']} | {h['pick_s'] / h['best_s']:.2f}"
                    f" ({units.span(each[h['pick']])}) | {h['best']} | {h['best_s'] / h['best_candidate_s']:.2f} |"
                    f" {b} {t[b] / h['best_s']:.2f} ({units.span(each[b])}) |")  # fmt: skip
    out += [
      f"#### {net}, {p} hosts, host 1 at 1/{k} ({mine[0]['rate'] * 8e-6 / k:g} Mbit/s), queues of {q:g} ms, {f'`{cc}`' if cc else 'no `--congestion-control` (the hosts inherit the machine' + chr(39) + 's)'}", "",
      f"Measured within 20 % of the replay (medians over runs) in"
      f" {sum(_within_20(c['measured_s'] / c['replay_s']) for c in hand)} of {len(hand)} hand-written"
      f" cells; per algorithm: {per_alg}. The same cells in round-robin order:"
      f" {rr_near}.", "",
      *lines, "", "`auto` told the rates (as below), against the same runs:", "", *auto, "",
    ]  # fmt: skip
  return out


def tcp_table() -> str:
  """Host 1's sending sockets and the slow link's two queues while the runs went on."""
  rows = results.read_rows(ROWS / "slow_link_tcp.jsonl", "slow_link_tcp")
  if not rows:
    return "(not measured)"
  p = lambda d, f=".0f": "–" if not d else "/".join(format(d[q], f) for q in ("10", "50", "90"))  # noqa: E731
  lines = ["| hosts | host 1's link | queue | samples | RTT ms (p10/50/90) | cwnd (segments) |"
           " delivery rate Mbit/s | backlog toward host 1, kB (p10/50/90; max) |"
           " backlog from host 1, kB | drops toward / from host 1 |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
  kb = lambda d: {q: v / 1e3 for q, v in d.items()}  # noqa: E731
  for r in rows:
    bl, mx, dr = r["backlog_bytes"], r["backlog_max"], r["drops"]
    queue = r["queue"] + _idle_label(r) + (", in blocks" if "blocks" in r.get("bench", []) else "")
    lines.append(f"| {r['hosts']} | {r['slow']} | {queue} | {r['socket_samples']} |"
                 f" {p(r['rtt_ms'], '.1f')} | {p(r['cwnd'])} | {p(r['delivery_Mbps'], '.1f')} |"
                 f" {p(kb(bl.get('p1', {})))}; {(mx.get('p1') or 0) / 1e3:.0f} |"
                 f" {p(kb(bl.get('eth0', {})))}; {(mx.get('eth0') or 0) / 1e3:.0f} |"
                 f" {dr.get('p1')} / {dr.get('eth0')} |")  # fmt: skip
  return "\n".join(lines)


def tables() -> dict[str, str]:
  """``{"replay.md": text}`` from the committed rows."""
  parts = ["# Faults: the replay with the slow link (generated by replay.py from rows/)", "",
           *replay_tables()]  # fmt: skip
  return {"replay.md": "\n".join(parts).rstrip("\n") + "\n"}


if __name__ == "__main__":
  results.write_tables(tables(), HERE)
