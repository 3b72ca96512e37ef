"""When each process enters and leaves each call of the parameter server (``naive``) and of
``psum``, and each of the parameter server's ``ppermute`` steps, with host 1's link slowed:
what the replay of their schedules misprices.

Runs on every host of an emulated cluster (one process and one device per host), e.g.

    allreduce-jax cluster --hosts 4 --link 200Mbit --fault link:1=20Mbit@0 \\
      --congestion-control reno -- python experiments/faults/replay_trace.py run \\
      --out experiments/faults/rows/replay_trace.jsonl
    python experiments/faults/replay_trace.py         # replay_trace.md from the rows

Every process stamps the wall clock (one clock: the hosts are network namespaces of one
machine) as it starts and ends each call, after one warm-up round and a barrier, with no
barrier between the calls (as ``bench`` times them: a process's time of a call runs from the
end of its previous call):

- ``round-robin``: one call of each of ``--round-robin`` in turn, ``--reps`` rounds (bench's
  default order);
- ``blocks``: ``--reps`` calls of each of ``--alone`` back to back (bench's ``--order blocks``);
- ``steps`` (``naive`` among ``--alone``): its 2(p−1) ``ppermute`` steps, each its own jitted
  program, called in the schedule's order, ``--reps`` rounds (a step's program ends when its
  own process's part of it does: a sender's once gloo has written its last byte to the socket).

One row per (order, size, calls): every process's start and end of every call, seconds after
the first process started the first, and the network's key from the cluster (process 0 appends
them through the row store; the ``bench --order blocks`` rows beside them are in
``rows/replay_trace_bench.jsonl``).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from allreduce_jax import (
  cluster_rows,
  cost_model,
  devices,
  distributed,
  gloo_model,
  results,
  units,
)
from allreduce_jax.tools import faults
from allreduce_jax.tools.bench import programs, verifiable_input
from allreduce_jax.units import parse_size

HERE = Path(__file__).resolve().parent
ROWS = HERE / "rows" / "replay_trace.jsonl"
BENCH = HERE / "rows" / "replay_trace_bench.jsonl"  # bench --order blocks of naive and psum
IDENT = ("order", "calls", "bytes", "p", "reps")  # a row's key, with its network
SLOW_LINK = HERE / "rows" / "slow_link.jsonl"  # the study's bench rows: their traced parameters
EMULATED = HERE.parent / "emulated_network" / "rows" / "tcp_queue_16k"  # healthy runs: α


def _alpha(net: str, p: int) -> float:
  """α per step of a healthy run of ``net`` on ``p`` hosts, as the study's tables take it."""
  return cluster_rows.healthy_alpha(EMULATED, net, p)


def naive_steps(p: int) -> list[tuple[int, int]]:
  """The parameter server's ``ppermute`` pairs in order: k → 0 for k = 1..p−1, then 0 → k.

  Example:
    >>> naive_steps(4)
    [(1, 0), (2, 0), (3, 0), (0, 1), (0, 2), (0, 3)]
  """
  return [(k, 0) for k in range(1, p)] + [(0, k) for k in range(1, p)]


@dataclass(frozen=True)
class Trace:
  """What every traced call shares: the participants' mesh and its one axis's spec, their
  count ``p``, the rounds ``reps`` after the warm-up, and the run's context (the network's
  key from the cluster) that every row carries."""

  mesh: Mesh
  spec: P
  p: int
  reps: int
  context: dict


def put(tr: Trace, count: int, mesh: Mesh | None = None, spec: P | None = None):
  """A ``(p, count)`` float32 array of verifiable blocks, one row a participant."""
  return verifiable_input(mesh or tr.mesh, spec or tr.spec, tr.p, count)


def stamps(tr: Trace, calls, tag: str):
  """Calls ``calls`` (``(fn, x)``) in turn ``reps`` times after one warm-up round and a
  barrier; every process's (start, end) of each call: ``[process][rep][call][2]``."""
  for fn, x in calls:
    jax.block_until_ready(fn(x))
  multihost_utils.sync_global_devices(tag)
  out = []
  for _ in range(tr.reps):
    for fn, x in calls:
      t0 = time.time()
      jax.block_until_ready(fn(x))
      out.append((t0, time.time()))
  every = devices.gather_float64(out)  # one host a process
  return every.reshape(jax.process_count(), tr.reps, len(calls), 2)


def step(tr: Trace, pair: tuple[int, int]):
  """One ``ppermute`` of the parameter server's, its own jitted program."""
  body = functools.partial(lax.ppermute, axis_name="i", perm=[pair])
  return jax.jit(jax.shard_map(body, mesh=tr.mesh, in_specs=tr.spec, out_specs=tr.spec))


def whole(tr: Trace, alg: str, n: int):
  """``alg``'s all-reduce of ``n`` bytes a participant, and its input."""
  alg_mesh, alg_spec, fn, _ = programs(alg, tr.p, "sum")
  return fn, put(tr, n // 4, alg_mesh, alg_spec)


def record(tr: Trace, order: str, names: list[str], n: int, t) -> dict:
  """The row of one traced sequence (stamps from the first process's first start), and on
  process 0 each call's slowest median printed."""
  if jax.process_index() == 0:
    own = np.median(t[..., 1] - t[..., 0], axis=1)  # [process][call]: each one's median
    for k, name in enumerate(names):
      print(f"{order:11s} {name:20s} {n:>8d} B  slowest process's median"
            f" {own[:, k].max() * 1e3:8.1f} ms  (each: {np.round(own[:, k] * 1e3)})",
            flush=True)  # fmt: skip
  return {"kind": "replay_trace", "order": order, "calls": names, "bytes": n, "p": tr.p,
          "reps": tr.reps, "stamps": np.round(t - float(t.min()), 5).tolist(), **tr.context}  # fmt: skip


def run(args) -> None:
  """On every host: the traced sequences of ``args`` (see the module's docstring); process 0
  appends their rows to ``args.out`` through the row store."""
  distributed.initialize_from_env()
  tr = Trace(Mesh(np.array(jax.devices()), ("i",)), P("i"), jax.device_count(), args.reps,
             results.run_context())  # fmt: skip
  rows = []
  for n in (parse_size(s) for s in args.sizes.split(",")):
    order = [a for a in args.round_robin.split(",") if a]
    if order:
      calls = [whole(tr, a, n) for a in order]
      rows.append(record(tr, "round-robin", order, n, stamps(tr, calls, f"rr-{n}")))
    for alg in (a for a in args.alone.split(",") if a):
      rows.append(
        record(tr, "blocks", [alg], n, stamps(tr, [whole(tr, alg, n)], f"alone-{alg}-{n}"))
      )
      if alg == "naive":
        x = put(tr, n // 4)
        names = [f"{s}->{d}" for s, d in naive_steps(tr.p)]
        calls = [(step(tr, pair), x) for pair in naive_steps(tr.p)]
        rows.append(record(tr, "steps", names, n, stamps(tr, calls, f"st-{n}")))
  if jax.process_index() == 0:
    store = results.RowStore(args.out, "replay_trace", context={})
    store.extend(
      rows, [store.key({k: r[k] for k in IDENT}, network=r.get("network")) for r in rows]
    )


def _cells(rows: list[dict]) -> dict:
  """``{(order, bytes, calls, call): [run, ...]}``, a run: ``(each process's median time of
  that call, its entry spread)``: the median over the run's reps of how much later the last
  process started the call than the first, and which process was last most often."""
  out: dict = {}
  for r in rows:
    t = np.asarray(r["stamps"])  # [process][rep][call][start, end]
    for k, name in enumerate(r["calls"]):
      own = np.median(t[:, :, k, 1] - t[:, :, k, 0], axis=1)
      starts = t[:, :, k, 0]
      spread = float(np.median(starts.max(axis=0) - starts.min(axis=0)))
      last = int(np.bincount(starts.argmax(axis=0)).argmax())
      net = json.dumps(r["network"], sort_keys=True)
      out.setdefault((net, r["order"], r["bytes"], tuple(r["calls"]), name), []).append(
        (own, spread, last, r)
      )
  return out


def _links(net: dict) -> str:
  """``20Mbit, reno`` / ``healthy, the default (bbr)``: host 1's link and the hosts'
  congestion control."""
  links = ", ".join(f.split("=")[1].split("@")[0] for f in net.get("faults", [])) or "healthy"
  return f"{links}, {net.get('congestion_control') or 'the default (bbr)'}"


#: Seconds as ``median (min–max)`` in ms, a single value alone.
_ms = functools.partial(units.spread, fmt=".0f", scale=1e3, alone=True, brackets="()")


def table(rows: list[dict]) -> str:
  """The calls' table: per order, size and algorithm, each process's median time (the
  median over runs), the slowest process's against the replay, and the entry spread."""
  lines = [
    "| host 1's link, TCP | order | MiB | call | runs |"
    " each process's median ms (host 0, 1, 2, 3) |"
    " slowest process ms (min–max) | replay ms | slowest / replay | last to start |"
    " entry spread ms |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  with cost_model.use_params(gloo_model.traced_params(results.read_rows(SLOW_LINK, "bench"))):
    for (_, order, n, _, name), runs in _cells(rows).items():
      r = runs[0][3]
      net, p, rate, slow = faults.row_links({"key": json.dumps({"network": r["network"]})})
      each = [statistics.median(float(run[0][h]) for run in runs) for h in range(p)]
      slowest = [float(run[0].max()) for run in runs]
      replay = None
      if order != "steps":
        replay = gloo_model.emulated_seconds(
          name, p, n, net, rate=rate, alpha=_alpha(net, p), link_rates=slow
        )
      ratio = "–" if replay is None else f"{statistics.median(slowest) / replay:.2f}"
      last = statistics.mode(run[2] for run in runs)
      lines.append(
        f"| {_links(r['network'])} | {order} | {n / 2**20:g} | {name} | {len(runs)} |"
        f" {', '.join(f'{e * 1e3:.0f}' for e in each)} | {_ms(slowest)} |"
        f" {'–' if replay is None else f'{replay * 1e3:.0f}'} | {ratio} | host {last} |"
        f" {_ms([run[1] for run in runs])} |"
      )
  return "\n".join(lines)


def bench_table(rows: list[dict]) -> str:
  """``bench --order blocks`` rows (every call of one algorithm back to back) against the
  replay: the slowest process's median of the calls."""
  lines = [
    "| algorithm | MiB | calls | measured ms (median; min–max of the calls) | replay ms |"
    " measured / replay |",
    "|---|---|---|---|---|---|",
  ]
  with cost_model.use_params(gloo_model.traced_params(results.read_rows(SLOW_LINK, "bench"))):
    for r in rows:
      (c,) = cluster_rows.link_rate_cells([r], faults.row_links, _alpha)
      lines.append(
        f"| {c['algorithm']} | {c['bytes'] / 2**20:g} | {r['iters']} |"
        f" {r['time_us'] / 1e3:.0f}; {r['time_us_min'] / 1e3:.0f}–{r['time_us_max'] / 1e3:.0f} |"
        f" {c['replay_s'] * 1e3:.0f} | {c['measured_s'] / c['replay_s']:.2f} |"
      )
  return "\n".join(lines)


def markdown(traced: list[dict], bench: list[dict]) -> str:
  """``replay_trace.md``: the traced calls, then the bench rows in blocks."""
  return "\n".join(
    [
      "# The parameter server and `psum` traced: every process's time of each call",
      "",
      "Generated by `python experiments/faults/replay_trace.py` from"
      " `rows/replay_trace.jsonl`. 4-host switch, 200 Mbit/s links (host 1's at 20 Mbit/s"
      " where the table says so: `cluster --fault link:1=20Mbit@0`), queues of 100 ms, the"
      " hosts' TCP congestion control as the table says (`cluster --congestion-control`);"
      " taken beside other work on the same CPU, other clusters' runs waiting their turn.",
      "",
      "`replay_trace.py run` (see its docstring): each process stamps the wall clock as it"
      " starts and ends each call, with no barrier between calls (as `bench` times them)."
      " *round-robin*: one call of each algorithm in turn, in `bench`'s order, 3 rounds after"
      " a warm-up; *blocks*: 3 calls of one algorithm back to back; *steps*: the parameter"
      " server's 6 `ppermute`s, each its own program, called in turn (0 ms: a process with no"
      " part in that step). A process's time of a call runs from the end of its previous"
      " call, so it includes its wait for the processes that finished the previous call"
      " later. Per cell: each process's median over a run's 3 calls (the median over runs);"
      " the slowest process's (`bench -a 3`'s figure: the median over runs, min–max); the"
      " replay (`gloo_model.emulated_seconds`, as the study's tables take it); the process"
      " that started the call last most often, and how much later than the first (the median"
      " over calls, then over runs, min–max).",
      "",
      table(traced),
      "",
      "## In blocks, with `bench`",
      "",
      "`cluster --hosts 4 --link 200Mbit --fault link:1=20Mbit@0 --congestion-control reno --"
      " bench --algorithms naive,psum -b 1MiB -e 4MiB -f 4 -n 3 -w 1 -a 3 --order blocks`:",
      "",
      bench_table(bench),
      "",
    ]
  )


def tables() -> dict[str, str]:
  """``{"replay_trace.md": text}`` from the committed rows."""
  traced = results.read_rows(ROWS, "replay_trace")
  return {"replay_trace.md": markdown(traced, results.read_rows(BENCH, "bench"))}


def parser() -> argparse.ArgumentParser:
  """``run`` (on every host of a cluster); nothing: ``replay_trace.md``."""
  p = argparse.ArgumentParser(prog="replay_trace.py", description=__doc__.split("\n\n")[0])
  p.set_defaults(run=lambda args: results.write_tables(tables(), HERE))
  s = p.add_subparsers(dest="command").add_parser("run", help="on every host: trace the calls")
  s.add_argument("--sizes", default="1MiB,4MiB", help="bytes per host")
  s.add_argument(
    "--round-robin",
    default="ring,bidirectional_ring,tree,halving_doubling,naive,psum",
    help="algorithms called in turn, as bench's default order calls them ('' : none)",
  )
  s.add_argument("--alone", default="naive,psum", help="algorithms called alone, in blocks")
  s.add_argument("--reps", type=int, default=3)
  s.add_argument("--out", required=True)
  s.set_defaults(run=run)
  return p


if __name__ == "__main__":
  args = parser().parse_args()
  args.run(args)
