"""The slow host as a pipelined leaf (:mod:`allreduce_jax.slow_leaf`) against the ring, the
tree and ``psum`` on the emulated 4-host switch, host 1's link healthy, at 1/10 and 1/100,
each time against the cut bound (:func:`allreduce_jax.gloo_model.cut_bound_seconds`).

    python experiments/faults/slow_leaf.py run [RUNS] [SLOW,...]  # as root: each cell RUNS times
    python experiments/faults/slow_leaf.py table        # the table from rows/slow_leaf.jsonl

``run`` starts ``allreduce-jax cluster --hosts 4 --link 200Mbit [--fault link:1=RATE@0] --
python slow_leaf.py measure ...`` once per run and cell; ``measure`` (on every host) times
the programs round robin (1 warm-up, 3 timed calls each; the slowest process's median),
checks every result against ``psum``'s, and process 0 appends one row per program.
"""

from __future__ import annotations

import functools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS = HERE / "rows" / "slow_leaf.jsonl"
EMULATED = HERE.parent / "emulated_network" / "rows" / "tcp_queue_16k"  # healthy, in blocks
HOSTS, LEAF, LINK = 4, 1, "200Mbit"  # every link's rate (cluster --link)
CELLS = {  # host 1's link at 1/k -> (its rate, sizes in MiB)
  10: ("20Mbit", (1, 4)),
  100: ("2Mbit", (1,)),
  1: (None, (1, 4)),
}
CHUNKS = (8, 32)
OTHERS = ("ring", "tree", "psum")


def alpha() -> float:
  """α per step: ``gloo_model.fit_alpha`` on the emulated network study's healthy 4-host
  switch rows (timed in blocks, 16 KiB TCP queue)."""
  from allreduce_jax import cluster_rows

  return cluster_rows.healthy_alpha(EMULATED, "switch", HOSTS)


def measure(slow: int, sizes: list[int], out: Path, run: int) -> None:
  """On every host of a cluster: time the slow leaf (each of CHUNKS) and OTHERS."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.experimental import multihost_utils
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from allreduce_jax import all_reduce, devices, distributed, gloo_model, units
  from allreduce_jax.results import run_context
  from allreduce_jax.slow_leaf import slow_leaf_all_reduce, slow_leaf_seconds
  from allreduce_jax.tools.bench import time_round_robin

  if not distributed.initialize_from_env():
    devices.use_cpu_devices(HOSTS)  # a dry run in one process
  p = jax.device_count()
  mesh = jax.make_mesh((p,), ("i",))
  sharding = NamedSharding(mesh, P("i"))
  programs, names = [], []
  for mib in sizes:
    n = mib * 2**20 // 4  # float32 elements per host
    x = devices.put((p * n,), np.float32, sharding, functools.partial(_block, n=n))
    bodies = {
      f"slow_leaf:{k}": functools.partial(slow_leaf_all_reduce, axis_name="i", leaf=LEAF, chunks=k)
      for k in CHUNKS
    }
    bodies |= {a: functools.partial(all_reduce, axis_name="i", algorithm=a) for a in OTHERS}
    for name, body in bodies.items():
      f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
      programs.append((f, (x,)))
      names.append((name, mib))
  timings = time_round_robin(programs, iters=3, warmup=1)
  mine = np.array([[t.median_s, t.min_s, t.max_s] for t in timings])
  every = np.asarray(multihost_utils.process_allgather(mine.astype(np.float32)), np.float64)
  slowest = every.reshape(jax.process_count(), *mine.shape).max(axis=0)  # the slowest process
  # Every result against psum's, bit for bit (small integers: exact in any order).
  results = {k: jnp.asarray(t.compiled(*programs[i][1])) for i, (k, t) in
             enumerate(zip(names, timings))}  # fmt: skip
  wrong = {
    k: int(np.sum(multihost_utils.process_allgather(
      np.asarray(jnp.sum(v.addressable_data(0) != results[("psum", k[1])].addressable_data(0)))
    )))
    for k, v in results.items()
  }  # fmt: skip
  if jax.process_index() != 0:
    return
  a = alpha()
  rate = (run_context().get("network") or {}).get("link_Bps") or units.parse_rate(LINK)
  rates = {LEAF: rate / slow} if slow > 1 else None
  with open(out, "a") as f:
    for (name, mib), (med, lo, hi) in zip(names, slowest):
      n_bytes = mib * 2**20
      algo, _, k = name.partition(":")
      if algo == "slow_leaf":
        replay = slow_leaf_seconds(p, n_bytes, leaf=LEAF, chunks=int(k), rate=rate, alpha=a,
                                   link_rates=rates)  # fmt: skip
      elif algo == "psum":
        replay = None
      else:
        replay = gloo_model.emulated_seconds(algo, p, n_bytes, "switch", rate=rate, alpha=a,
                                             link_rates=rates)  # fmt: skip
      bound = gloo_model.cut_bound_seconds(n_bytes, p, rate=rate, link_rates=rates)
      row = {"study": "slow_leaf", "algorithm": algo, "chunks": int(k) if k else None,
             "hosts": p, "network": "switch", "link": LINK, "slow_host": LEAF,
             "slow": slow, "bytes": n_bytes, "run": run, "time_s": med, "time_min_s": lo,
             "time_max_s": hi, "calls": 3, "time_from": "slowest process, median of 3 calls",
             "bound_s": bound, "replay_s": replay, "alpha_s": a, "wrong": wrong[(name, mib)],
             "jax_version": jax.__version__,
             "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S")}  # fmt: skip
      f.write(json.dumps(row) + "\n")


def _block(index, n: int):
  """This host's block: small integers (every sum exact in any order), by host."""
  import numpy as np

  start = index[0].start or 0
  rng = np.random.default_rng(start // n)
  return rng.integers(-8, 9, size=n).astype(np.float32)


def run(runs: int = 3, slows: list[int] | None = None) -> None:
  """The cells of CELLS (``slows``: those of host 1 at these 1/k) until each has ``runs``
  runs in the rows, one cluster each."""
  ROWS.parent.mkdir(exist_ok=True)
  for slow in slows or list(CELLS):
    rate, sizes = CELLS[slow]
    done = {r["run"] for r in _rows() if r["slow"] == slow}
    for r in sorted(set(range(runs)) - done):
      fault = ["--fault", f"link:{LEAF}={rate}@0"] if rate else []
      cmd = [sys.executable, "-m", "allreduce_jax", "cluster", "--hosts", str(HOSTS), "--link",
             LINK, "--timeout", "900", *fault, "--", sys.executable, str(Path(__file__)),
             "measure", str(slow), ",".join(map(str, sizes)), str(ROWS), str(r)]  # fmt: skip
      t0 = time.time()
      subprocess.run(cmd, check=True)
      print(f"# 1/{slow} run {r}: {time.time() - t0:.0f} s", flush=True)


def _rows() -> list[dict]:
  return (
    [json.loads(x) for x in ROWS.read_text().splitlines() if x.strip()] if ROWS.exists() else []
  )


def table() -> str:
  """Median over runs (and min–max) of each cell's time, and its ratio to the bound."""
  rows = _rows()
  cells: dict[tuple, list[dict]] = {}
  for r in rows:
    name = r["algorithm"] + (f" k={r['chunks']}" if r["chunks"] else "")
    cells.setdefault((r["slow"], r["bytes"], name), []).append(r)
  lines = ["| host 1 | MiB | algorithm | runs | time (s) | × bound | × replay | wrong |",
           "|---|---|---|---|---|---|---|---|"]  # fmt: skip
  for (slow, nb, name), rs in sorted(cells.items()):
    ts = [r["time_s"] for r in rs]
    ratio = [r["time_s"] / r["bound_s"] for r in rs]
    rep = [r["time_s"] / r["replay_s"] for r in rs if r["replay_s"]]
    lines.append(
      f"| {'healthy' if slow == 1 else f'1/{slow}'} | {nb >> 20} | {name} | {len(rs)} |"
      f" {_mid(ts, '.3f')} | {_mid(ratio, '.2f')} | {_mid(rep, '.2f') if rep else '–'} |"
      f" {sum(r['wrong'] for r in rs)} |"
    )
  return "\n".join(lines)


def _mid(xs: list[float], fmt: str) -> str:
  """median (min–max)."""
  m = format(statistics.median(xs), fmt)
  return m if len(xs) == 1 else f"{m} ({format(min(xs), fmt)}–{format(max(xs), fmt)})"


def main(argv: list[str]) -> None:
  if argv[:1] == ["measure"]:
    measure(int(argv[1]), [int(s) for s in argv[2].split(",")], Path(argv[3]), int(argv[4]))
  elif argv[:1] == ["run"]:
    slows = [int(k) for k in argv[2].split(",")] if len(argv) > 2 else None
    run(int(argv[1]) if len(argv) > 1 else 3, slows)
  elif argv[:1] == ["table"]:
    print(table())
  else:
    sys.exit(__doc__)


if __name__ == "__main__":
  main(sys.argv[1:])
