"""The faults study's failure measurements: each subcommand runs an emulated cluster (root, or
rootless) with ``cluster --fault`` killing or stopping a host or taking its link down, or
trains through it, and appends one row a run to ``rows/`` (``run.py``: a slowed link).

    python experiments/faults/run_failures.py kill [ALGORITHMS]  # a host killed mid-collective
    python experiments/faults/run_failures.py stop [ALGORITHMS]  # SIGSTOPped, --heartbeat-timeout 5
    python experiments/faults/run_failures.py down [ALGORITHMS] [--for 10,20] [--runs N]  # a link down
    python experiments/faults/run_failures.py give-up  # a link down past the heartbeat timeout
    python experiments/faults/run_failures.py recovery [RUN ...] [--seeds 0,1] [--kill-at T | --kill-after-step K]
    python experiments/faults/run_failures.py slow-host [RUN ...] [--seeds 0,1]  # kept or isolated
    python experiments/faults/run_failures.py torn  # a saver SIGKILLed at 20 random moments

The campaigns are tables: :data:`FAULTS` (kill and stop: the fault, its moments, cluster
options), :data:`TRAIN_RUNS` (recovery: cluster options per run) and :data:`SLOW_HOST_RUNS`.
``--concurrent`` (``cluster --concurrent``: do not wait for another cluster run; the rows say
so) for down, recovery and slow-host.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import subcommands

from allreduce_jax import registry, results
from allreduce_jax.tools import saver

HERE = Path(__file__).resolve().parent
ROWS = HERE / "rows"
HOSTS = 4
LINK = "200Mbit"
CLUSTER = [sys.executable, "-m", "allreduce_jax", "cluster", "--hosts", str(HOSTS),
           "--link", LINK, "--timeout", "900"]  # fmt: skip
KILL_SIZE = "1MiB"
#: kill and stop: the fault on host 1, the moments after the hosts joined (kill: 1, 2.5, 4 s
#: into the calls), more cluster options.
FAULTS = {"kill": ("kill", (3.0, 4.5, 6.0), ()),
          "stop": ("stop", (4.5,) * 3, ("--heartbeat-timeout", "5"))}  # fmt: skip
DOWN_S = (0.5, 2.0, 5.0)
DOWN_ALGORITHMS = ("ring", "psum", "naive")
DOWN_AT = 4.0  # seconds after the hosts joined: about 2 s into the loop of calls
#: recovery: run -> cluster options (the kill added where the run has one).
TRAIN_RUNS = {"uninterrupted": (), "restart": ("--restarts", "1"),
              "elastic": ("--restarts", "1", "--elastic")}  # fmt: skip
SLOW_HOST_RUNS = {  # name -> (hosts, cluster options, train options)
  "healthy": (HOSTS, [], []),
  "slowed-kept": (HOSTS, ["--fault", "cpu:1=0.25@0"], []),
  "isolated": (HOSTS - 1, [], ["--learning-rate", f"{0.05 * (HOSTS - 1) / HOSTS:g}"]),
}


def append(kind: str, row: dict, *ident: str) -> None:
  """``row`` appended to ``rows/KIND.jsonl`` through the row store, keyed by ``ident``."""
  store = results.RowStore(ROWS / f"{kind}.jsonl", kind, context={"study": "faults"})
  store.append(row, store.key({k: row[k] for k in ident if k in row}))


def _read(path: Path) -> list[dict]:
  """A run's own JSON lines (bench's rows, the fault injector's log)."""
  return (
    [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
  )


def _launcher_named(stderr: str) -> tuple[None, str, str, str] | None:
  """Whom the launcher's message names: ``(None, rank, status, seconds)`` like a match of
  its "process R of N (pid P) STATUS after T s"; for a host that was stopped or stopped
  answering (JAX's heartbeat check), that host, at the time its peers gave up on it."""
  named = re.search(r"process (\d+) of \d+ \(pid \d+\) (.*?) after ([0-9.]+) s", stderr)
  stopped = re.search(r"process (\d+) \(pid \d+\) of \d+ (is stopped|stopped answering)", stderr)
  if named and stopped:
    return (None, stopped[1], stopped[2], named[3])
  return (None, named[1], named[2], named[3]) if named else None


GAVE_UP = re.compile(
  r"heartbeat|UNAVAILABLE|DEADLINE_EXCEEDED|[Tt]erminating|[Gg]loo.*(error|timed)"
)


def _down_run(algorithm: str, d: float, calls: str, extra: list[str]) -> dict:
  with tempfile.TemporaryDirectory() as logs:
    res = subprocess.run([*CLUSTER, *extra, "--log-dir", logs, "--fault",
                          f"down:1@{DOWN_AT:g}+{d:g}", "--", "bench", "-n", calls, "-w", "2",
                          "-I", "--no-uneven", "--algorithms", algorithm, "-b", "1MiB",
                          "-e", "1MiB", "--out", f"{logs}/rows.jsonl"],
                         capture_output=True, text=True)  # fmt: skip
    rows = _read(Path(logs, "rows.jsonl"))
    faults = _read(Path(logs, "faults.jsonl"))
    said = []  # each matching line, and the one after (the tasks a message lists)
    for p in sorted(Path(logs).glob("*.log")):
      text = p.read_text(errors="replace").splitlines()
      said += [f"{p.name}: {' '.join(text[i : i + 2]).strip()[:400]}"
               for i, x in enumerate(text) if GAVE_UP.search(x)]  # fmt: skip
    said = said[:6]
  named = _launcher_named(res.stderr)
  row = {"algorithm": algorithm, "hosts": HOSTS, "link": LINK, "bytes": 2**20,
         "options": extra, "down_s": d, "returncode": res.returncode,
         "faults": [{k: f[k] for k in ("event", "after_join_s", "after_start_s", "what")}
                    for f in faults],
         "named": f"process {named[1]} {named[2]} after {named[3]} s" if named else None,
         "named_after_down_s": float(named[3]) - faults[0]["after_start_s"]
         if named and faults else None,
         "logs_say": said,
         "stderr_tail": res.stderr.strip().splitlines()[-3:]}  # fmt: skip
  if rows:
    t = [x / 1e3 for x in rows[0]["times_us"]]
    med = sorted(t)[len(t) // 2]
    slow = [x for x in t if x > 3 * med]
    row.update({"wrong": rows[0]["wrong"], "calls": len(t), "median_ms": med,
                "slowest_ms": max(t), "calls_slowed": len(slow),
                "extra_s": sum(x - med for x in slow) / 1e3, "times_ms": t})  # fmt: skip
  return row


def _train(
  name: str, extra: list[str], tmp: Path, seed: int = 0, kill_after: int | None = None
) -> dict:
  """One cluster run of train sync (``kill_after``: host 2's process SIGKILLed as soon as
  the checkpoint of that step is complete) and its row."""
  ck = tmp / name
  argv = [*CLUSTER, "--log-dir", str(tmp / f"logs-{name}"), *extra, "--", "train", "sync",
          "--workers", str(HOSTS), "--steps", "1200", "--eval-every", "100", "--checkpoint-dir",
          str(ck), "--checkpoint-every", "50", "--seeds", str(seed),
          "--out", str(tmp / f"out-{name}")]  # fmt: skip
  t0 = time.monotonic()
  with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
    proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True)
    if kill_after is not None:
      _kill_when(proc, ck / f"seed-{seed}" / str(kill_after), tmp / f"logs-{name}" / "pids.json")
    proc.wait()
    wall = time.monotonic() - t0
    out.seek(0), err.seek(0)
    res = subprocess.CompletedProcess(argv, proc.returncode, out.read(), err.read())
  line = next((x for x in res.stdout.splitlines() if x.startswith(f"seed {seed}:")), "")
  restart = re.search(r"restart 1 of 1 after .*?\(([0-9.]+) s since the start\)", res.stderr)
  named = re.search(r"process (\d+) of \d+ \(pid \d+\) was killed by SIGKILL after ([0-9.]+)", res.stderr)  # fmt: skip
  joined = re.search(r"hosts joined ([0-9.]+) s after the start", res.stderr)
  resumed = re.search(r"resumed from step \[([0-9, ]+)\]", line)
  return {
    "run": name, "seed": seed, "hosts": HOSTS, "link": LINK, "options": extra,
    "killed_after_step": kill_after, "returncode": res.returncode,
    "final_test_acc": float(re.search(r"test acc ([0-9.]+)", line)[1]) if line else None,
    "params_sha256": line.split("sha256 ")[1].strip() if "sha256" in line else None,
    "resumed_from": [int(s) for s in resumed[1].split(",")] if resumed else [],
    "hosts_final": int(re.findall(r"# cluster: (\d+) process\(es\)", res.stderr)[-1]),
    "wall_s": wall,
    "hosts_joined_s": float(joined[1]) if joined else None,
    "named_after_s": float(named[2]) if named else None,
    "restarted_after_s": float(restart[1]) if restart else None,
  }  # fmt: skip


def _kill_when(proc: subprocess.Popen, path: Path, pids: Path) -> None:
  """SIGKILLs host 2's process (the launcher's ``pids.json``) once ``path`` exists (a
  complete checkpoint's folder), unless ``proc`` ended first."""
  while proc.poll() is None and not path.exists():
    time.sleep(0.02)
  if proc.poll() is None:
    os.kill(json.loads(pids.read_text())["2"], signal.SIGKILL)


# ------------------------------------------------------------------ the subcommands


def kill(args) -> None:
  """Host 1 SIGKILLed (``stop``: SIGSTOPped) at each of the moments of :data:`FAULTS`,
  during a bench loop of each algorithm (default: every one registered): when it is named
  and when every survivor has stopped (the cluster command returned), after the fault."""
  kind, at, extra = FAULTS[args.command]
  for algorithm in args.algorithms or registry.names():
    per_host = registry.ALGORITHMS[algorithm].axes  # hierarchical: 2 devices a host
    for t in at:
      with tempfile.TemporaryDirectory() as logs:
        res = subprocess.run([*CLUSTER, *extra, "--devices-per-host", str(per_host),
                              "--log-dir", logs, "--fault", f"{kind}:1@{t}", "--", "bench",
                              "-n", "100000", "-w", "1", "--no-uneven", "-g", str(per_host),
                              "--algorithms", algorithm, "-b", KILL_SIZE, "-e", KILL_SIZE,
                              "--out", f"{logs}/rows.jsonl"],
                             capture_output=True, text=True)  # fmt: skip
        ended = time.time()
        faults = _read(Path(logs, "faults.jsonl"))
      named = _launcher_named(res.stderr)
      fault = faults[0] if faults else None
      append("kill", {
        "algorithm": algorithm, "hosts": HOSTS, "devices_per_host": per_host, "link": LINK,
        "bytes": KILL_SIZE, "options": list(extra), "fault": f"{kind}:1@{t}",
        "returncode": res.returncode, "named_rank": int(named[1]) if named else None,
        "named_status": named[2] if named else None,
        "named_after_kill_s": float(named[3]) - fault["after_start_s"] if named and fault else None,
        "all_stopped_after_kill_s": ended - fault["unix_time"] if fault else None,
        "stderr_tail": [] if named and fault else res.stderr.strip().splitlines()[-3:],
      }, "algorithm", "hosts", "devices_per_host", "bytes", "options", "fault")  # fmt: skip


def down(args) -> None:
  """Host 1's link down for each outage (0.5, 2 and 5 s) about 2 s into a loop of
  back-to-back 1 MiB calls (bench -I: every call's time), ``--runs`` times, per algorithm
  (default: ring, psum, naive), JAX's heartbeat timeout at its default (100 s); without
  algorithms or ``--for``, then :func:`give_up`."""
  for algorithm in args.algorithms or DOWN_ALGORITHMS:
    calls = "40" if algorithm == "naive" else "120"
    for d in args.durations or DOWN_S:
      for _ in range(args.runs):
        append("link_down", _down_run(algorithm, d, calls, args.concurrent),
               "algorithm", "hosts", "bytes", "options", "down_s")  # fmt: skip
  if not args.algorithms and not args.durations:
    give_up(args)


def give_up(args) -> None:
  """Host 1's link down for 8 s, longer than JAX's heartbeat timeout (3 s): the run gives
  up; the row holds who was named, when, and what the hosts' logs say."""
  append("link_down", _down_run("ring", 8.0, "120", ["--heartbeat-timeout", "3"]),
         "algorithm", "hosts", "bytes", "options", "down_s")  # fmt: skip


def recovery(args) -> None:
  """train sync on 4 hosts: uninterrupted, host 2 killed ``--kill-at`` s after joining
  (``--kill-after-step``: instead, as soon as that step's checkpoint is complete) with
  --restarts 1, and the same with --elastic (it finishes on 3 hosts); one run each per
  seed (``runs``: only those)."""
  fault = ["--fault", f"kill:2@{args.kill_at:g}"] if args.kill_after_step is None else []
  for seed in args.seeds:
    for name in args.runs or TRAIN_RUNS:
      options = [*args.concurrent, *(fault if TRAIN_RUNS[name] else []), *TRAIN_RUNS[name]]
      after = None if name == "uninterrupted" else args.kill_after_step
      with tempfile.TemporaryDirectory() as tmp:
        append("recovery", _train(name, options, Path(tmp), seed, after),
               "run", "seed", "hosts", "options", "killed_after_step")  # fmt: skip


def slow_host(args) -> None:
  """train sync, 600 steps: on 4 healthy hosts, with host 1's process held to 1/4 of a
  core from the start (kept in the job), and on the 3 others alone (isolated: the learning
  rate scaled by 3/4, as ``--elastic`` does); the time to 95 % test accuracy of each, one
  run per seed (``runs``: only those)."""
  for seed, name in ((s, n) for s in args.seeds for n in args.runs or SLOW_HOST_RUNS):
    hosts, extra, train = SLOW_HOST_RUNS[name]
    extra = [*args.concurrent, *extra]
    with tempfile.TemporaryDirectory() as tmp:
      argv = [sys.executable, "-m", "allreduce_jax", "cluster", "--hosts", str(hosts), "--link",
              LINK, "--timeout", "900", "--log-dir", f"{tmp}/logs", *extra, "--", "train",
              "sync", "--workers", str(hosts), "--steps", "600", "--eval-every", "50",
              "--target", "0.95", "--seeds", str(seed), *train,
              "--out", f"{tmp}/out"]  # fmt: skip
      t0 = time.monotonic()
      res = subprocess.run(argv, capture_output=True, text=True)
      wall = time.monotonic() - t0
      rows = [r for p in Path(tmp, "out").rglob("*.jsonl") for r in _read(p)]
    if res.returncode or len(rows) != 1:
      raise SystemExit(
        f"run_failures.py slow-host {name}: exit {res.returncode}\n{res.stderr[-2000:]}"
      )
    (row,) = rows
    per_step = row["wall_s"] / row["config"]["steps"]
    hit = row["steps_to_target"]
    append("slow_host", {
      "run": name, "seed": seed, "hosts": hosts, "link": LINK, "options": extra + train,
      "returncode": res.returncode, "steps": row["config"]["steps"],
      "eval_steps": row["eval_steps"], "test_acc": row["test_acc"],
      "final_test_acc": row["final_test_acc"], "steps_to_target": hit,
      "train_s": row["wall_s"], "time_to_target_s": None if hit is None else hit * per_step,
      "cluster_wall_s": wall,
    }, "run", "seed", "hosts", "options")  # fmt: skip


def torn(args) -> None:
  """SIGKILLs the saver (``python -m allreduce_jax.tools.saver``: 16 MiB checkpoints, step
  k's values all k) at 20 random moments (0.1-2 s after it started saving); after each,
  whether a save was torn (a temporary folder left), and whether the restore succeeded
  from a complete checkpoint (every value its step's) leaving no torn folder."""
  rng = random.Random(1)
  with tempfile.TemporaryDirectory() as d:
    for i in range(20):
      p = subprocess.Popen([sys.executable, "-m", "allreduce_jax.tools.saver", d],
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
      assert p.stdout.readline().strip() == "saving"
      wait = rng.uniform(0.1, 2.0)
      time.sleep(wait)
      p.kill()
      p.wait()
      p.stdout.close()
      left = sorted(q.name for q in Path(d).iterdir() if "tmp" in q.name)
      state = saver.restore(d)
      append("torn_saves", {
        "kill": i, "after_s": wait, "torn_folders": left, "restored_step": state.step if state else None,
        "restore_complete": saver.complete(state),
        "torn_left_after": any("tmp" in q.name for q in Path(d).iterdir()),
      }, "kill")  # fmt: skip


# ------------------------------------------------------------------ the command line


def numbers(text: str) -> list[float]:
  try:
    return [float(x) for x in text.split(",") if x]
  except ValueError:
    raise argparse.ArgumentTypeError(f"expects a comma list of numbers, got {text!r}") from None


def algorithms(text: str) -> list[str]:
  names = [a for a in text.split(",") if a]
  unknown = [a for a in names if a not in registry.ALGORITHMS]
  if unknown:
    raise argparse.ArgumentTypeError(f"expects registered algorithms, got {', '.join(unknown)}")
  return names


def choice(table: dict, name: str) -> str:
  if name not in table:
    raise argparse.ArgumentTypeError(f"expects one of {', '.join(table)}, got {name!r}")
  return name


def parser() -> subcommands.Parser:
  """``run_failures.py``'s subcommands; each parsed command's ``run(args)`` measures."""
  p, add = subcommands.parser("run_failures.py", __doc__)
  algs = (["algorithms"], {"nargs": "?", "type": algorithms, "default": []})
  concurrent = (["--concurrent"], {"action": "store_const", "const": ["--concurrent"],
                                   "default": []})  # fmt: skip
  seeds = (["--seeds"], {"type": lambda t: [int(x) for x in numbers(t)], "default": [0]})
  add("kill", kill, algs)
  add("stop", kill, algs)
  add("down", down, algs, (["--for"], {"dest": "durations", "type": numbers, "default": None}),
      (["--runs"], {"type": int, "default": 1}), concurrent)  # fmt: skip
  add("give-up", give_up)
  add("recovery", recovery, (["runs"], {"nargs": "*", "type": functools.partial(choice, TRAIN_RUNS), "metavar": "RUN"}),
      seeds, (["--kill-at"], {"type": float, "default": 12.0}),
      (["--kill-after-step"], {"type": int, "default": None}), concurrent)  # fmt: skip
  add("slow-host", slow_host,
      (["runs"], {"nargs": "*", "type": functools.partial(choice, SLOW_HOST_RUNS),
                "metavar": "RUN"}), seeds,
      concurrent)  # fmt: skip
  add("torn", torn)
  return p


if __name__ == "__main__":
  args = parser().parse_args(sys.argv[1:])
  args.run(args)
