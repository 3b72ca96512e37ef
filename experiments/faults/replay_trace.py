"""When each process enters and leaves each call of the parameter server (``naive``) and of
``psum``, and each of the parameter server's ``ppermute`` steps, with host 1's link slowed:
what the replay of their schedules misprices.

Runs on every host of an emulated cluster (one process and one device per host), e.g.

    allreduce-jax cluster --hosts 4 --link 200Mbit --fault link:1=20Mbit@0 \\
      --congestion-control reno -- python experiments/faults/replay_trace.py run \\
      --out experiments/faults/rows/replay_trace.jsonl
    python experiments/faults/replay_trace.py table   # replay_trace.md from the rows

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
the first process started the first, and the network's key from the cluster.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS = HERE / "rows" / "replay_trace.jsonl"
SLOW_LINK = HERE / "rows" / "slow_link.jsonl"  # the study's bench rows: their traced parameters
EMULATED = HERE.parent / "emulated_network" / "rows" / "tcp_queue_16k"  # healthy runs: α


def _alpha(net: str, p: int) -> float:
  """α per step of a healthy run of ``net`` on ``p`` hosts, as the study's tables take it."""
  from allreduce_jax import cluster_rows

  return cluster_rows.healthy_alpha(EMULATED, net, p)


def naive_steps(p: int) -> list[tuple[int, int]]:
  """The parameter server's ``ppermute`` pairs in order: k → 0 for k = 1..p−1, then 0 → k.

  Example:
    >>> naive_steps(4)
    [(1, 0), (2, 0), (3, 0), (0, 1), (0, 2), (0, 3)]
  """
  return [(k, 0) for k in range(1, p)] + [(0, k) for k in range(1, p)]


def run(argv) -> int:
  ap = argparse.ArgumentParser(prog="replay_trace.py run")
  ap.add_argument("--sizes", default="1MiB,4MiB", help="bytes per host")
  ap.add_argument(
    "--round-robin",
    default="ring,bidirectional_ring,tree,halving_doubling,naive,psum",
    help="algorithms called in turn, as bench's default order calls them ('' : none)",
  )
  ap.add_argument("--alone", default="naive,psum", help="algorithms called alone, in blocks")
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--out", required=True)
  args = ap.parse_args(argv)
  from allreduce_jax import distributed

  distributed.initialize_from_env()
  import jax
  import numpy as np
  from jax import lax
  from jax.experimental import multihost_utils
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  from allreduce_jax import devices, results
  from allreduce_jax.tools.bench import programs, verifiable_block
  from allreduce_jax.units import parse_size

  p = jax.device_count()
  mesh = Mesh(np.array(jax.devices()), ("i",))
  spec = P("i")
  context = results.run_context()

  def put(count: int, mesh=mesh, spec=spec):
    return devices.put(
      (p, count), "float32", NamedSharding(mesh, spec), lambda idx: verifiable_block(idx, p, count)
    )

  def stamps(calls, tag: str):
    """Calls ``calls`` (``(fn, x)``) in turn ``--reps`` times after one warm-up round and
    a barrier; every process's (start, end) of each call: ``[process][rep][call][2]``."""
    for fn, x in calls:
      jax.block_until_ready(fn(x))
    multihost_utils.sync_global_devices(tag)
    out = []
    for _ in range(args.reps):
      for fn, x in calls:
        t0 = time.time()
        jax.block_until_ready(fn(x))
        out.append((t0, time.time()))
    # float64 seconds travel as int32 pairs: JAX would narrow them to float32
    bits = np.asarray(out, np.float64).view(np.int32)
    every = np.asarray(multihost_utils.process_allgather(bits)).view(np.float64)
    return every.reshape(p, args.reps, len(calls), 2)

  def step(pair):
    body = lambda b: lax.ppermute(b, "i", [pair])  # noqa: E731
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))

  def whole(alg: str, n: int):
    alg_mesh, alg_spec, fn, _ = programs(alg, p, "sum")
    return fn, put(n // 4, alg_mesh, alg_spec)

  rows = []

  def record(order: str, names: list[str], n: int, t) -> None:
    t0 = float(t.min())
    rows.append({
      "kind": "replay_trace", "order": order, "calls": names, "bytes": n, "p": p,
      "reps": args.reps, "stamps": np.round(t - t0, 5).tolist(), **context,
    })  # fmt: skip
    if jax.process_index() == 0:
      own = np.median(t[..., 1] - t[..., 0], axis=1)  # [process][call]: each one's median
      for k, name in enumerate(names):
        print(f"{order:11s} {name:20s} {n:>8d} B  slowest process's median"
              f" {own[:, k].max() * 1e3:8.1f} ms  (each: {np.round(own[:, k] * 1e3)})",
              flush=True)  # fmt: skip

  for n in (parse_size(s) for s in args.sizes.split(",")):
    order = [a for a in args.round_robin.split(",") if a]
    if order:
      record("round-robin", order, n, stamps([whole(a, n) for a in order], f"rr-{n}"))
    for alg in (a for a in args.alone.split(",") if a):
      record("blocks", [alg], n, stamps([whole(alg, n)], f"alone-{alg}-{n}"))
      if alg == "naive":
        x = put(n // 4)
        names = [f"{s}->{d}" for s, d in naive_steps(p)]
        record("steps", names, n, stamps([(step(pr), x) for pr in naive_steps(p)], f"st-{n}"))
  if jax.process_index() == 0:
    with open(args.out, "a") as f:
      for r in rows:
        f.write(json.dumps(r) + "\n")
  return 0


def _cells(rows: list[dict]) -> dict:
  """``{(order, bytes, calls, call): [run, ...]}``, a run: ``(each process's median time of
  that call, its entry spread)``: the median over the run's reps of how much later the last
  process started the call than the first, and which process was last most often."""
  import numpy as np

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


def _span(xs, scale: float = 1e3) -> str:
  xs = sorted(xs)
  mid = statistics.median(xs) * scale
  return f"{mid:.0f}" if len(xs) == 1 else f"{mid:.0f} ({xs[0] * scale:.0f}–{xs[-1] * scale:.0f})"


def table(rows: list[dict]) -> str:
  """The calls' table: per order, size and algorithm, each process's median time (the
  median over runs), the slowest process's against the replay, and the entry spread."""
  from allreduce_jax import cost_model, gloo_model, results
  from allreduce_jax.tools import faults

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
        f" {', '.join(f'{e * 1e3:.0f}' for e in each)} | {_span(slowest)} |"
        f" {'–' if replay is None else f'{replay * 1e3:.0f}'} | {ratio} | host {last} |"
        f" {_span([run[1] for run in runs])} |"
      )
  return "\n".join(lines)


def bench_table(rows: list[dict]) -> str:
  """``bench --order blocks`` rows (every call of one algorithm back to back) against the
  replay: the slowest process's median of the calls."""
  from allreduce_jax import cluster_rows, cost_model, gloo_model, results
  from allreduce_jax.tools import faults

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


def markdown(rows: list[dict]) -> str:
  """``replay_trace.md``: the traced calls, then the bench rows in blocks."""
  traced = [r for r in rows if r.get("kind") == "replay_trace"]
  bench = [r for r in rows if r.get("kind") == "bench"]
  return "\n".join(
    [
      "# The parameter server and `psum` traced: every process's time of each call",
      "",
      "Generated by `python experiments/faults/replay_trace.py table` from"
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


def main(argv: list[str]) -> int:
  if argv[:1] == ["table"]:
    rows = [json.loads(x) for x in ROWS.read_text().splitlines() if x.strip()]
    (HERE / "replay_trace.md").write_text(markdown(rows))
    print(f"# wrote {HERE / 'replay_trace.md'}")
    return 0
  if argv[:1] == ["run"]:
    return run(argv[1:])
  raise SystemExit("replay_trace.py: expected 'run' (on a cluster's hosts) or 'table'.")


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
