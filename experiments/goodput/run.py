"""Training that keeps going while hosts keep failing: the measurements of this study.

    python experiments/goodput/run.py detect [--defaults] [--algorithms A,B] [--faults stop,down]
    python experiments/goodput/run.py recovery [--faults kill,stop] [--runs 6]
    python experiments/goodput/run.py bitwise [--seeds 0,1,2]
    python experiments/goodput/run.py goodput --hosts 4 [--mtbf 60,15] [--arms restarts,elastic]
    python experiments/goodput/run.py torchft --hosts 4 [--mtbf 60,15]   # the torchft extra
    python experiments/goodput/run.py simulate                           # no cluster: the model

Every cluster run is ``allreduce-jax cluster`` on hosts of a 200 Mbit/s switch (root or
rootless); its rows go to ``rows/`` through the row store, one per run, keyed so that a
campaign stopped midway resumes where it stopped (``--runs``, ``--seeds``: how many).
``tables.py`` writes ``tables.md`` from the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import simulated
import torchft_timeline

from allreduce_jax import goodput, registry, results

HERE = Path(__file__).resolve().parent
ROWS = HERE / "rows"
LINK = "200Mbit"
CLUSTER = [sys.executable, "-m", "allreduce_jax", "cluster", "--link", LINK]
#: The training every recovery and goodput run does: the digits MLP, 16 examples a worker.
TRAIN = ["train", "sync", "--eval-every", "10"]
#: Steps between checkpoints (about 0.9 s): within Young and Daly's sqrt(2 · save cost · MTBF)
#: for a background save's measured 36 ms, 1.0 s (MTBF 15 s) to 2.1 s (60 s).
CHECKPOINT_EVERY = 100
#: Steps of the goodput runs, per host count: about 2.5 minutes uninterrupted.
GOODPUT_STEPS = {4: 12000, 8: 6000}
#: Seconds of schedule drawn (longer than any run).
SCHEDULE_S = 900.0


def _store(name: str, kind: str) -> results.RowStore:
  return results.RowStore(ROWS / f"{name}.jsonl", kind, context={"link": LINK})


def _cluster(hosts: int, options: list[str], command: list[str], logs: Path, timeout: float,
             on_start=None) -> subprocess.CompletedProcess:  # fmt: skip
  """One cluster run; ``on_start(proc)`` runs beside it (a kill at the right moment)."""
  argv = [*CLUSTER, "--hosts", str(hosts), "--log-dir", str(logs), "--timeout", str(timeout),
          *options, "--", *command]  # fmt: skip
  proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  if on_start is not None:
    threading.Thread(target=on_start, args=(proc,), daemon=True).start()
  out, err = proc.communicate(timeout=timeout + 120)
  return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _jsonl(path: Path) -> list[dict]:
  return (
    [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
  )


# ------------------------------------------------------------------ detection


#: Each fault on host 1, 4 s after the hosts joined (2 s into the loop of calls), or later
#: where an algorithm's program takes longer to compile (:data:`DETECT_AT`).
DETECT_FAULTS = {"stop": "stop:1@{t}", "down": "down:1@{t}+inf", "spin": "spin:1@{t}",
                 "kill": "kill:1@{t}"}  # fmt: skip
DETECT_AT = {"double_binary_tree": 12}


def detect(args) -> None:
  """Every algorithm × fault: when the launcher names host 1 and why (bench: 1 MiB calls in
  a loop on 4 hosts); ``--defaults``: the watchdog off, JAX's own timeouts."""
  store = _store("detect", "goodput-detect")
  for algorithm in args.algorithms or registry.names():
    per_host = registry.ALGORITHMS[algorithm].axes
    for fault in args.faults:
      for run in range(args.runs):
        key = store.key(algorithm=algorithm, fault=fault, run=run, defaults=args.defaults)
        if key in store.done():
          continue
        spec = DETECT_FAULTS[fault].format(t=DETECT_AT.get(algorithm, 4))
        options = ["--devices-per-host", str(per_host), "--fault", spec]
        options += ["--watchdog", "0"] if args.defaults else []
        with tempfile.TemporaryDirectory() as tmp:
          logs = Path(tmp)
          res = _cluster(4, options, ["bench", "-n", "1000000", "-w", "1", "--no-uneven", "-g",
                                      str(per_host), "--algorithms", algorithm, "-b", "1MiB", "-e",
                                      "1MiB", "--out", str(logs / "rows.jsonl")],
                         logs, 2400 if args.defaults else 300)  # fmt: skip
          row = _detected(logs, res)
        store.append({"algorithm": algorithm, "fault": fault, "run": run, "spec": spec,
                      "defaults": args.defaults, **row}, key)  # fmt: skip
        print(
          f"{algorithm} {fault} {run}: named {row['named_rank']} after"
          f" {row['named_after_s']} s ({row['why'][:80]})",
          flush=True,
        )


def _detected(logs: Path, res: subprocess.CompletedProcess) -> dict:
  events = {e["event"]: e for e in _jsonl(logs / "launcher.jsonl")}
  faults = _jsonl(logs / "faults.jsonl")
  at = faults[0]["unix_time"] if faults else None
  named = events.get("named", {})
  after = lambda e: round(e["unix"] - at, 3) if e and at else None  # noqa: E731
  return {"returncode": res.returncode, "named_rank": named.get("rank"),
          "why": named.get("why", res.stderr.strip()[-300:]), "named_after_s": after(named),
          "stopped_after_s": after(events.get("stopped"))}  # fmt: skip


# ------------------------------------------------------------------ recovery


RECOVERY_STEPS = 2000


def recovery(args) -> None:
  """One failure at a random moment 20-30 s after the hosts joined, on a random host, then
  ``--restarts 1``: what each part of the recovery took (:class:`goodput.Recovery`)."""
  store = _store("recovery", "goodput-recovery")
  for fault in args.faults:
    for run in range(args.runs):
      key = store.key(fault=fault, run=run)
      if key in store.done():
        continue
      rng = random.Random(f"{fault}-{run}")
      spec = f"{fault}:{rng.randrange(4)}@{rng.uniform(20, 30):.2f}" + (
        "+inf" if fault == "down" else ""
      )
      row = _train_run(4, ["--fault", spec, "--restarts", "1"], RECOVERY_STEPS, seed=0)
      store.append({"fault": fault, "run": run, "spec": spec, **row}, key)
      rec = row["recoveries"][0] if row["recoveries"] else {}
      print(f"{spec}: failure to the first new step {rec.get('total')} s", flush=True)


def bitwise(args) -> None:
  """Per seed: uninterrupted, killed 20 s after joining, and killed while process 0's
  background save is writing (a temporary folder in the checkpoint folder): the digests."""
  store = _store("bitwise", "goodput-bitwise")
  for seed in args.seeds:
    for when in ("uninterrupted", "at 20 s", "during a save"):
      key = store.key(seed=seed, when=when)
      if key in store.done():
        continue
      options = {"uninterrupted": [], "at 20 s": ["--fault", "kill:1@20", "--restarts", "1"],
                 "during a save": ["--restarts", "1"]}[when]  # fmt: skip
      row = _train_run(4, options, RECOVERY_STEPS, seed, kill_in_save=when == "during a save")
      store.append({"seed": seed, "when": when, **row}, key)
      print(f"seed {seed} {when}: sha256 {row['params_sha256']}", flush=True)


def _kill_in_save(folder: Path, logs: Path, complete: int = 3):
  """Kills process 0 (the one that writes) while a save of its is under way (a temporary
  folder in ``folder``), once ``complete`` checkpoints are complete (``KEEP`` of them are
  kept: the next one removes the oldest)."""

  def watch(proc: subprocess.Popen) -> None:
    saved = set()
    while proc.poll() is None:
      names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
      saved |= {n for n in names if n.isdigit()}
      if len(saved) >= complete and any("tmp" in n for n in names):
        os.kill(json.loads((logs / "pids.json").read_text())["0"], signal.SIGKILL)
        (logs / "killed_in_save").write_text(str(time.time()))
        return
      time.sleep(0.001)

  return watch


def _train_run(hosts: int, options: list[str], steps: int, seed: int, kill_in_save=False) -> dict:
  """One ``train sync`` run on the cluster and its row: the timeline's summary (goodput,
  recoveries), the run's final accuracy and digest, and whether anything was lost."""
  with tempfile.TemporaryDirectory() as tmp:
    logs, ck, out = Path(tmp, "logs"), Path(tmp, "ck"), Path(tmp, "out")
    command = [*TRAIN, "--workers", str(hosts), "--steps", str(steps), "--seeds", str(seed),
               "--checkpoint-dir", str(ck), "--checkpoint-every", str(CHECKPOINT_EVERY),
               "--out", str(out)]  # fmt: skip
    watch = _kill_in_save(ck / f"seed-{seed}", logs) if kill_in_save else None
    res = _cluster(hosts, options, command, logs, 3600, watch)
    rows = _jsonl(out / "sync.jsonl")
    timeline = goodput.read_run(logs)
    torn = [p.name for p in (ck / f"seed-{seed}").iterdir() if not p.name.isdigit()]
    row = rows[0] if len(rows) == 1 else {}
    return {
      "hosts": hosts, "seed": seed, "options": options, "steps": steps,
      "returncode": res.returncode, "final_test_acc": row.get("final_test_acc"),
      "params_sha256": row.get("params_sha256"), "resumed_from": row.get("restarts"),
      "segments": row.get("segments"),
      "killed_in_save": (logs / "killed_in_save").exists(),
      "lost": {"rows": len(rows) != 1, "steps": timeline.kept_steps() != steps,
               "torn_folders_left": torn},
      **timeline.summary(),
      "stderr_tail": res.stderr.strip().splitlines()[-3:] if res.returncode else [],
    }  # fmt: skip


# ------------------------------------------------------------------ goodput


#: The arms of ``goodput``: ``restarts`` (the failed host replaced at once, spares
#: waiting at idle priority), ``elastic`` (on the survivors, the failed host's replacement
#: back at the first restart :data:`REPLACEMENT_S` or more after it failed), ``no-spares``
#: (``restarts`` without spares) and ``idle-spares`` (``--restarts`` and no failure: what
#: waiting spares and the compilation cache cost by themselves).
ARMS = ("restarts", "elastic", "no-spares", "idle-spares")
#: Seconds before a failed host's replacement is ready (``elastic``'s ``--replace-after``).
REPLACEMENT_S = 20.0


def goodput_runs(args) -> None:
  """Uninterrupted runs (a seed each), then each schedule (MTBF × seed) under each arm of
  :data:`ARMS` (``idle-spares``: without a schedule)."""
  if bad := [a for a in args.arms if a not in ARMS]:
    raise SystemExit(f"goodput --arms: {bad} not among {list(ARMS)}")
  store = _store("goodput", "goodput-run")
  steps = GOODPUT_STEPS[args.hosts]
  cases = [("uninterrupted", None, s) for s in args.seeds]
  cases += [("idle-spares", None, s) for s in args.seeds if "idle-spares" in args.arms]
  cases += [(arm, m, s) for m in args.mtbf for s in args.seeds for arm in args.arms
            if arm != "idle-spares"]  # fmt: skip
  for arm, mtbf, seed in cases:
    key = store.key(hosts=args.hosts, arm=arm, mtbf_s=mtbf, seed=seed, steps=steps)
    if key in store.done():
      continue
    schedule = (
      [] if mtbf is None else goodput.poisson_schedule(mtbf, SCHEDULE_S, args.hosts, seed=seed)
    )
    options = [a for f in schedule for a in ("--fault", f.spec)]
    if arm != "uninterrupted":
      options += ["--restarts", "1000"]
    if arm == "elastic":
      options += ["--elastic", "--replace-after", f"{REPLACEMENT_S:g}"]
    if arm == "no-spares":
      options += ["--no-spares"]
    row = _train_run(args.hosts, options, steps, seed)
    store.append({"arm": arm, "mtbf_s": mtbf, "schedule": [f.spec for f in schedule], **row}, key)
    print(
      f"{args.hosts} hosts {arm} MTBF {mtbf} seed {seed}: goodput {row['goodput']:.3f},"
      f" {len(row['recoveries'])} restarts, wall {row['wall_s']:.0f} s",
      flush=True,
    )


# ------------------------------------------------------------------ torchft


#: Steps of torchft's runs, per host count (about as long as ours uninterrupted).
TORCHFT_STEPS = {4: 7500}
#: torchft's Gloo and manager timeout here (its example's).
TORCHFT_GLOO_TIMEOUT_S = 5.0
#: What a torchft run's logs are searched for, counted: Gloo's set-up waiting on its store
#: past the timeout, a step on a process group whose set-up failed, Python errors.
TORCHFT_ERRORS = {"gloo_store_timeouts": "DistStoreError", "pg_not_initialized":
                  "process group not initialized", "tracebacks": "Traceback (most recent"}  # fmt: skip


def torchft(args) -> None:
  """torchft (its Manager, DDP wrapper, Optimizer and lighthouse over Gloo, the extra
  ``torchft``) on the same emulated hosts under the same schedules: one replica group per
  host, the lighthouse on one more host (:mod:`torchft_dp`)."""
  store = _store("torchft", "goodput-torchft")
  steps, gloo_s = TORCHFT_STEPS[args.hosts], TORCHFT_GLOO_TIMEOUT_S
  cases = [(None, s) for s in args.seeds] + [(m, s) for m in args.mtbf for s in args.seeds]
  for mtbf, seed in cases:
    key = store.key(hosts=args.hosts, mtbf_s=mtbf, seed=seed, steps=steps, gloo_timeout_s=gloo_s)
    if key in store.done():
      continue
    schedule = (
      [] if mtbf is None else goodput.poisson_schedule(mtbf, SCHEDULE_S, args.hosts, seed=seed)
    )
    with tempfile.TemporaryDirectory() as tmp:
      out, logs = Path(tmp, "out"), Path(tmp, "logs")
      command = [sys.executable, str(HERE / "torchft_dp.py"), "host", "--steps", str(steps),
                 "--out", str(out), "--schedule", json.dumps([f.spec for f in schedule]),
                 "--seed", str(seed), "--gloo-timeout", str(gloo_s)]  # fmt: skip
      res = _cluster(args.hosts + 1, ["--watchdog", "0"], command, logs, args.timeout)
      text = "\n".join(p.read_text(errors="replace") for p in sorted(logs.glob("process-*.log")))
      events = [line for line in text.splitlines() if line.startswith("supervisor ")]
      reports = "\n".join(p.read_text() for p in out.glob("progress-*"))
      errors = {name: text.count(pattern) for name, pattern in TORCHFT_ERRORS.items()}
      errors["replaced_no_progress"] = sum(e.split()[2] == "replaced" for e in events)
      errors["unreduced"] = reports.count("unreduced")
      clocks = [float(e.split()[3]) for e in events if e.split()[2] == "clock"]
      t0 = min(clocks) if clocks else 0.0
      got = goodput.committed(sorted(out.glob("progress-*")), t0)
      recoveries = torchft_timeline.recoveries(events, got["kept"], t0, out)
      accs = [float(w.split(":")[1]) for p in out.glob("progress-*")
              for line in p.read_text().splitlines() for w in line.split(" ")[1:2]
              if w.startswith("accuracy:")]  # fmt: skip
    kept = got["kept"]
    start = next((t for t, s in kept if s >= 1), None)
    wall = kept[-1][0] - start if kept and start is not None else None
    row = {"arm": "torchft", "system": "torchft", "mtbf_s": mtbf, "seed": seed, "hosts": args.hosts,
           "steps": steps, "schedule": [f.spec for f in schedule], "returncode": res.returncode,
           "kept_steps": kept[-1][1] if kept else 0, "wall_s": wall,
           "goodput": None, "committed": got["committed"],
           "dropped": got["dropped"], "final_test_acc": max(accs) if accs else None,
           "kept": kept, "supervisor": events, "recoveries": recoveries, "gloo_timeout_s": gloo_s,
           "floor_s": next((float(w[8:]) for e in events for w in e.split()
                            if w.startswith("floor_s=")), None), **errors,
           "faults": [{"fault": f.spec, "event": f.kind, "host": f.host, "at": f.at} for f in schedule
                      if wall is not None and start is not None and f.at < start + wall],
           "stderr_tail": res.stderr.strip().splitlines()[-3:] if res.returncode else []}  # fmt: skip
    if res.returncode == 124:  # the cap: stopped before its last step
      row["stopped_after_s"] = args.timeout
    store.append(row, key)
    print(
      f"torchft {args.hosts} hosts MTBF {mtbf} seed {seed}: {row['kept_steps']} steps in"
      f" {wall} s, {row['committed']} committed, {row['dropped']} dropped",
      flush=True,
    )


# ------------------------------------------------------------------ the parameter server, simulated


def simulate(args) -> None:
  """The asynchronous parameter server against synchronous all-reduce under the same
  schedules, simulated (:mod:`simulated`)."""
  simulated.simulate(args, _store("simulated", "goodput-simulated"))


def _csv(kind):
  return lambda text: [kind(x) for x in text.split(",") if x]


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  sub = p.add_subparsers(dest="what", required=True)
  d = sub.add_parser("detect", help=detect.__doc__.split(";")[0])
  d.add_argument("--algorithms", type=_csv(str), default=None)
  d.add_argument("--faults", type=_csv(str), default=list(DETECT_FAULTS))
  d.add_argument("--runs", type=int, default=3)
  d.add_argument("--defaults", action="store_true")
  d.set_defaults(run=detect)
  r = sub.add_parser("recovery", help="a failure, then --restarts 1: each part's seconds")
  r.add_argument("--faults", type=_csv(str), default=["kill", "stop"])
  r.add_argument("--runs", type=int, default=6)
  r.set_defaults(run=recovery)
  b = sub.add_parser("bitwise", help="killed runs against the uninterrupted, per seed")
  b.add_argument("--seeds", type=_csv(int), default=[0, 1, 2])
  b.set_defaults(run=bitwise)
  g = sub.add_parser("goodput", help="Poisson failure schedules under --restarts and --elastic")
  g.add_argument("--hosts", type=int, default=4, choices=sorted(GOODPUT_STEPS))
  g.add_argument("--mtbf", type=_csv(float), default=[60.0, 15.0])
  g.add_argument("--arms", type=_csv(str), default=["restarts", "elastic"])
  g.add_argument("--seeds", type=_csv(int), default=[0, 1, 2])
  g.set_defaults(run=goodput_runs)
  t = sub.add_parser("torchft", help="torchft on the same hosts and schedules (its extra)")
  t.add_argument("--hosts", type=int, default=4, choices=sorted(TORCHFT_STEPS))
  t.add_argument("--mtbf", type=_csv(float), default=[60.0, 15.0])
  t.add_argument("--seeds", type=_csv(int), default=[0, 1, 2])
  t.add_argument("--timeout", type=float, default=3600.0,
                 help="seconds after which a run is stopped (its row kept, marked stopped)")  # fmt: skip
  t.set_defaults(run=torchft)
  s = sub.add_parser("simulate", help="the parameter server against sync, simulated")
  s.add_argument("--hosts", type=int, default=4)
  s.add_argument("--mtbf", type=_csv(float), default=[60.0, 15.0, 5.0])
  s.add_argument("--seeds", type=_csv(int), default=[0, 1, 2])
  s.add_argument("--recovery-s", type=float, default=4.0)
  s.add_argument("--scale", type=_csv(float), default=[1.0, 10.0, 100.0])
  s.set_defaults(run=simulate)
  return p


if __name__ == "__main__":
  args = parser().parse_args()
  args.run(args)
