"""Goodput's library parts and a restart that costs seconds.

Schedules are Poisson processes drawn from a seed (checked against the exponential's
mean and the uniform draws); a run's timeline is read from log folders written here in
the launcher's and the processes' formats (kept chunks, goodput, each recovery's parts,
by hand); a spare waits at idle priority and every one of its threads is raised back to
the launcher's when it is taken; and a real restart under ``launch --restarts`` takes its
spares, hits the compilation cache in every process, and resumes bitwise.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from launched import signal_when

from allreduce_jax import goodput
from allreduce_jax.tools import launch, spares

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "allreduce_jax"]


# ------------------------------------------------------------------ schedules


def test_a_schedule_is_a_poisson_process_of_its_mean_gap():
  sched = goodput.poisson_schedule(15.0, 30_000.0, hosts=4, seed=3)
  gaps = np.diff([0.0] + [f.at for f in sched])
  assert abs(gaps.mean() - 15.0) < 0.5  # ~2000 gaps: the mean within 3 %
  assert abs(np.median(gaps) - 15.0 * np.log(2)) < 0.7  # the exponential's median
  kinds = [f.kind for f in sched]
  assert {k: kinds.count(k) / len(kinds) for k in goodput.KINDS} == pytest.approx(
    {k: 1 / 3 for k in goodput.KINDS}, abs=0.04
  )
  assert {f.host for f in sched} == {0, 1, 2, 3}
  assert goodput.poisson_schedule(15.0, 30_000.0, 4, seed=3) == sched  # one seed, one schedule


def test_a_schedule_speaks_the_fault_grammar():
  from allreduce_jax.tools import faults

  for f in goodput.poisson_schedule(20.0, 300.0, hosts=8, seed=1):
    parsed = faults.parse(f.spec, 8)
    assert (parsed.kind, parsed.host, parsed.at) == (f.kind, f.host, f.at)
    assert (parsed.duration == float("inf")) == (f.kind == "down")
  with pytest.raises(ValueError, match="mtbf_s > 0"):
    goodput.poisson_schedule(0, 10, 4)


# ------------------------------------------------------------------ a run's timeline


def _attempt(folder: Path, started: float, ranks: list[list[str]], named=None, stopped=None):
  """Writes one attempt as the launcher and its processes would."""
  folder.mkdir(parents=True, exist_ok=True)
  events = [{"event": "started", "unix": started, "processes": len(ranks)}]
  if named is not None:
    events.append({"event": "named", "unix": named[0], "rank": named[1], "why": "..."})
  if stopped is not None:
    events.append({"event": "stopped", "unix": stopped, "code": 137})
  (folder / "launcher.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
  for r, lines in enumerate(ranks):
    (folder / f"progress-{r}").write_text("".join(x + "\n" for x in lines))


def test_kept_chunks_goodput_and_a_recovery_by_hand(tmp_path):
  # attempt 0: fresh at t=10, chunks of 10 steps every second from t=12 to t=16 (step 50);
  # host 1 is killed at t=16.5, named at 16.6, stopped at 16.7; the checkpoint is step 40.
  first = ["phase joining 10.0", "phase joined 10.5", "phase loading 10.6", "phase fresh 11.0",
           "mark backend_compile=0.5 11.5"] + [f"step {10 * k} {11.5 + k}" for k in range(1, 6)]  # fmt: skip
  _attempt(tmp_path, 9.0, [first, first], named=(16.6, 1), stopped=16.7)
  # attempt 1: started 16.8, joined 17.5, restored step 40 at 18.0, compiled by 18.4, chunks
  # to 60 at 19.4 and 20.4: step 50 redone, step 60 the first new one.
  second = ["phase taken 16.9", "phase joining 17.0", "phase joined 17.5", "phase loading 17.6",
            "phase restoring 17.7", "phase restored:40 18.0", "mark backend_compile=0.3 18.4",
            "step 50 19.4", "step 60 20.4", "phase finishing 20.5"]  # fmt: skip
  _attempt(tmp_path / "restart-1", 16.8, [second, second])
  (tmp_path / "faults.jsonl").write_text(
    json.dumps({"fault": "kill:1@6", "event": "kill", "host": 1, "unix_time": 16.5}) + "\n"
  )
  t = goodput.read_run(tmp_path)
  assert [a.restored for a in t.attempts] == [None, 40]
  assert [(c.first, c.last) for c in t.kept()] == [(0, 10), (10, 20), (20, 30), (30, 40),
                                                    (40, 50), (50, 60)]  # fmt: skip
  # kept compute: 4 chunks of 1 s in attempt 0 (from the compile mark at 11.5 on), then
  # 50 (from the compile mark at 18.4 to 19.4) and 60: 6 s of 20.4 - 11.5 = 8.9 s
  assert t.wall_s == pytest.approx(8.9) and t.goodput() == pytest.approx(6 / 8.9)
  assert t.kept_steps() == 60
  (r,) = t.recoveries()
  assert r.fault == "kill:1@6" and r.resumed_from == 40 and r.reached == 50
  assert (r.detect, r.stop, r.restart) == pytest.approx((0.1, 0.1, 0.1))
  assert (r.start, r.join, r.load_restore) == pytest.approx((0.2, 0.5, 0.4))
  assert r.first_chunk == pytest.approx(1.4) and r.compile == pytest.approx(0.3)
  assert r.redo == pytest.approx(1.0) and r.total == pytest.approx(20.4 - 16.5)


def test_a_chunk_is_done_when_every_process_reported_it(tmp_path):
  _attempt(tmp_path, 0.0, [["phase fresh 1.0", "step 10 2.0", "step 20 3.0"],
                           ["phase fresh 1.0", "step 10 2.5"]])  # fmt: skip
  (a,) = goodput.read_run(tmp_path).attempts
  assert [(c.last, c.end) for c in a.chunks] == [(10, 2.5)] and a.reached == 10


def test_an_attempt_that_never_trained_redoes_nothing(tmp_path):
  # attempt 0 trains to step 30; attempt 1 fails before it restores; attempt 2 resumes from
  # step 20 and finishes at 40; attempt 3 (a fault while the processes were exiting) finds
  # the run done and never trains: steps 10, 20 of attempt 0 and 30, 40 of attempt 2 are
  # kept, step 30 of attempt 0 is the only one redone.
  _attempt(tmp_path, 0.0, [["phase fresh 1.0", "step 10 2.0", "step 20 3.0", "step 30 4.0"]])
  _attempt(tmp_path / "restart-1", 5.0, [["phase joining 5.5"]])
  _attempt(tmp_path / "restart-2", 6.0, [["phase restored:20 7.0", "step 30 8.0", "step 40 9.0"]])
  _attempt(tmp_path / "restart-3", 10.0, [["phase joining 10.5", "phase joined 11.0"]])
  t = goodput.read_run(tmp_path)
  assert [a.trained for a in t.attempts] == [True, False, True, False]
  assert [t.resumed_after(k) for k in range(4)] == [20, 20, None, None]
  assert [(c.attempt, c.last) for c in t.kept()] == [(0, 10), (0, 20), (2, 30), (2, 40)]
  assert t.kept_steps() == 40 and t.summary()["redone_steps"] == 10
  assert t.goodput() == pytest.approx(4 / 8)  # 4 kept chunks of 1 s from t=1 to t=9


def test_median_range_leaves_nans_out():
  assert goodput.median_range([3.0, float("nan"), 1.0, 2.0]) == (2.0, 1.0, 3.0)
  assert all(x != x for x in goodput.median_range([float("nan")]))


def test_replaced_processes_come_back_after_their_delay(capsys):
  now = time.monotonic()
  left = {1: now - 10.0, 3: now - 1.0}
  assert launch._rejoined([0, 2], left, 5.0, "launch", sys.stderr) == [0, 1, 2]
  assert left == {3: pytest.approx(now - 1.0)}
  assert launch._rejoined([0, 2], {1: now}, None, "launch", sys.stderr) == [0, 2]
  with pytest.raises(launch.LaunchError, match=r"--replace-after.*with --elastic"):
    launch.launch_restarting(["verify"], 2, restarts=1, replace_after=3.0)


# ------------------------------------------------------------------ a real restart


#: A spare with a second thread: ready, then (taken) each thread's policy and nice.
_SPARE = """
import os, sys, threading, types
from allreduce_jax.tools import spares
threading.Thread(target=threading.Event().wait, daemon=True).start()
print("ready", flush=True)
spares.wait_if_spare(types.SimpleNamespace(), None)
for tid in sorted(os.listdir("/proc/self/task")):
  print(os.sched_getscheduler(int(tid)), os.getpriority(os.PRIO_PROCESS, int(tid)), flush=True)
"""


def _sched(pid: int) -> list[tuple[int, int]]:
  return [(os.sched_getscheduler(int(t)), os.getpriority(os.PRIO_PROCESS, int(t)))
          for t in sorted(os.listdir(f"/proc/{pid}/task"))]  # fmt: skip


@pytest.mark.skipif(not spares.can_raise_priority(), reason="needs CAP_SYS_NICE (root)")
def test_a_spare_waits_at_idle_priority_and_is_raised_to_the_launchers_when_taken(tmp_path):
  pool = spares.Spares([sys.executable, "-c", _SPARE], dict(os.environ), [0], tmp_path)
  try:
    pool.refill()
    pid, log = pool.ready[0].pid, tmp_path / "spare-0.log"
    deadline = time.monotonic() + 30
    while "ready" not in (log.read_text() if log.exists() else ""):
      assert time.monotonic() < deadline and pool.ready[0].poll() is None, log.read_text()
      time.sleep(0.05)
    waiting = _sched(pid)  # every thread (ours and any the imports started)
    assert len(waiting) >= 2 and set(waiting) == {(os.SCHED_IDLE, spares.IDLE_NICE)}
    taken = pool.take(0, {}, tmp_path / "taken.log")
    assert taken.wait(30) == 0
  finally:
    pool.close()
  mine = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
  lines = (tmp_path / "taken.log").read_text().split("\n")
  taken = [tuple(map(int, x.split())) for x in lines if x]
  # ours and the test's thread at least (a BLAS pool stops its threads at the successor's fork)
  assert len(taken) >= 2 and set(taken) == {mine}


#: A spare that, taken, says who it became, its pid and its parent's.
_TAKEN = """
import os, types
from allreduce_jax.tools import spares
print("ready", flush=True)
spares.wait_if_spare(types.SimpleNamespace(), None)
print(os.environ["WHO"], os.getpid(), flush=True)
"""


def _wait_for(path: Path, text: str, timeout: float = 30) -> str:
  deadline = time.monotonic() + timeout
  while text not in (got := path.read_text() if path.exists() else ""):
    assert time.monotonic() < deadline, got
    time.sleep(0.02)
  return got


def test_a_taken_spare_forks_its_successor_so_a_refill_starts_nothing(tmp_path):
  pool = spares.Spares([sys.executable, "-c", _TAKEN], dict(os.environ), [0], tmp_path)
  try:
    pool.refill()
    first = pool.ready[0]
    _wait_for(tmp_path / "spare-0.log", "ready")
    assert pool.take(0, {"WHO": "a"}, tmp_path / "a.log").wait(30) == 0
    pool.refill()  # the successor the taken spare forked, no new start
    assert (pool.started, pool.forked) == (1, 1)
    second = pool.ready[0]
    assert isinstance(second, spares.Successor) and second.pid != first.pid
    if pool.idle:  # it waits at the priority it was forked at
      assert set(_sched(second.pid)) == {(os.SCHED_IDLE, spares.IDLE_NICE)}
    assert pool.take(0, {"WHO": "b"}, tmp_path / "b.log") is second
    assert second.wait(30) == 0  # reaped by us: its parent, the first, had gone
    # no refill (an attempt that failed before its first step): a take finds the successor
    third = pool.take(0, {"WHO": "c"}, tmp_path / "c.log")
    assert isinstance(third, spares.Successor) and third.pid not in (first.pid, second.pid)
    assert third.wait(30) == 0 and (pool.started, pool.forked) == (1, 2)
    pool.refill()
    assert (pool.started, pool.forked) == (1, 3)
    fourth = pool.ready[0].pid
  finally:
    pool.close()
  assert _wait_for(tmp_path / "a.log", "\n").split() == ["a", str(first.pid)]
  assert _wait_for(tmp_path / "b.log", "\n").split() == ["b", str(second.pid)]
  assert _wait_for(tmp_path / "c.log", "\n").split() == ["c", str(third.pid)]
  assert not Path(f"/proc/{fourth}").exists() or spares._state(fourth) == "Z"


@pytest.mark.timeout(400)
def test_a_restart_takes_spares_hits_the_cache_everywhere_and_resumes_bitwise(tmp_path):
  from allreduce_jax.training import configs
  from allreduce_jax.training import experiments as ex

  logs, ck = tmp_path / "logs", tmp_path / "ck"
  argv = [*CLI, "launch", "-n", "2", "--restarts", "1", "--log-dir", str(logs), "--", "train",
          "sync", "--workers", "2", "--steps", "300", "--eval-every", "10",
          "--checkpoint-dir", str(ck), "--checkpoint-every", "20", "--out", str(tmp_path / "out")]  # fmt: skip
  proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)  # fmt: skip
  saved = (ck / "seed-0" / "100").exists  # spares are started after the first step
  out, err, _ = signal_when(proc, saved, logs, 0, signal.SIGKILL)
  assert proc.returncode == 0, err[-3000:]
  assert "restart 1 of 1 after process 0 failed" in err
  plain = ex.run_sync(configs.SyncConfig(workers=2, steps=300, eval_every=10), 0)
  assert f"parameters sha256 {plain['params_sha256'][:16]}" in out
  restart = logs / "restart-1"
  for attempt in (logs, restart):  # the first attempt's processes are spares taken at once
    started = json.loads((attempt / "launcher.jsonl").read_text().splitlines()[0])
    assert started["spares"] == 2, (attempt, started)
  for r in range(2):  # every process read what the first attempt compiled
    assert "mark compile_time_saved_sec=" in (restart / f"progress-{r}").read_text(), r
  (rec,) = goodput.read_run(logs).recoveries()
  assert rec.resumed_from is not None and rec.resumed_from >= 100 and rec.total > 0


# ------------------------------------------------------------------ the parameter server, simulated


def test_a_dead_workers_pushes_are_lost_and_the_server_goes_on():
  from allreduce_jax.training import async_sim

  times = async_sim.ComputeTimes("constant", 4, 0)
  plan = async_sim.ps_schedule(times, 16, outages=[(1, 2.5, 5.5)])
  # every worker pushes at t = 1, 2, 3...; worker 1's push of t = 3 (begun at 2) is lost and
  # it is back at 5.5: pushes at 3, 4 and 5 come from the three others
  assert plan.time.tolist() == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5]
  assert 1 not in plan.worker[8:].tolist()
  # overlapping outages: back when the last one ends
  plan = async_sim.ps_schedule(times, 12, outages=[(0, 0.5, 2.5), (0, 1.5, 4.5)])
  assert 0 not in plan.worker[: 3 * 4].tolist()
  with pytest.raises(ValueError, match="staleness_bound"):
    async_sim.ps_schedule(times, 4, staleness_bound=1, outages=[(0, 1.0, 2.0)])


def test_the_sync_clock_rolls_back_to_the_checkpoint_and_waits_out_the_recovery():
  from allreduce_jax.training import failures

  f = goodput.Failure
  clock = failures.sync_clock(10, [f(3.5, "kill", 0)], 1.0, 2.0, 2)
  # steps 1-3 by t = 3, the failure at 3.5 sends it back to step 2, running again at 5.5
  assert clock.tolist() == [1.0, 2.0, 6.5, 7.5, 8.5, 9.5, 10.5, 11.5, 12.5, 13.5]
  # a second failure during the recovery starts it again
  twice = failures.sync_clock(4, [f(3.5, "kill", 0), f(4.5, "stop", 1)], 1.0, 2.0, 2)
  assert twice.tolist() == [1.0, 2.0, 7.5, 8.5]
  assert failures.ps_outages([f(3.5, "kill", 5)], 4, 2.0) == [(1, 3.5, 5.5)]


# ------------------------------------------------------------------ torchft's rows


def test_a_torchft_failure_is_timed_to_the_pause_it_caused_and_to_its_hosts_return(tmp_path):
  import study_script

  study = Path(__file__).resolve().parents[1] / "experiments/goodput"
  timeline = study_script.load(study / "torchft_timeline.py")
  # steps every 10 ms from t = 0 to 1, a pause to 4.5 (a kill on host 1 at 0.995), then on
  kept = [[round(0.01 * i, 3), i] for i in range(1, 101)]
  kept += [[round(4.5 + 0.01 * i, 3), 100 + i] for i in range(1, 101)]
  (tmp_path / "progress-1-0").write_text("step 1 100.5\nstep 99 100.99\n")
  (tmp_path / "progress-1-1").write_text("step 150 106.0\n")  # its replacement, 5.005 s on
  events = ["supervisor 1 fault 100.995 kill", "supervisor 1 started 101.0 pid=7",
            "supervisor 2 fault 105.0 stop"]  # fmt: skip
  got = timeline.recoveries(events, kept, 100.0, tmp_path)
  assert got[0] == {"fault": "kill", "host": 1, "at": 0.995, "total": 3.515, "rejoined": 5.005}
  # a stop among steady steps: no pause, and its host has no later process
  assert got[1] == {"fault": "stop", "host": 2, "at": 5.0, "total": 0.0, "rejoined": None}


def test_a_step_on_fewer_hosts_counts_its_share_of_the_examples_and_its_hosts_time():
  row = {"hosts": 4, "kept_steps": 300, "segments": [
    {"from_step": 0, "to_step": 100, "workers": 4}, {"from_step": 100, "to_step": 200, "workers": 3},
    {"from_step": 200, "to_step": 300, "workers": 2}]}  # fmt: skip
  assert goodput.full_steps(row) == 100 + 75 + 50
  assert goodput.full_steps({**row, "segments": None}) == 300  # rows from before segments
  # priced for hosts of their own: steps 100-300 on 2 of 4 hosts ran at 200 steps/s here,
  # 1 s faster than at the uninterrupted 100 steps/s: 200 full steps in 3 + 1 s
  kept = [[0.01 * s, s] for s in range(10, 101, 10)]
  kept += [[2 + (s - 100) / 200, s] for s in range(110, 301, 10)]
  row = {"hosts": 4, "kept_steps": 300, "wall_s": 3.0, "kept": kept, "segments": [
    {"from_step": 0, "to_step": 100, "workers": 4}, {"from_step": 100, "to_step": 300, "workers": 2}]}  # fmt: skip
  assert goodput.priced_on_own_hosts(row, 100.0) == pytest.approx(200 / (100 * 4.0))
  assert goodput.priced_on_own_hosts({**row, "segments": row["segments"][:1]}, 100.0) is None
