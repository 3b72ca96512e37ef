"""The no-progress watchdog: its reading of progress reports, its bound, its verdict, and
a stopped host named within the bound on a small emulated cluster.

The naming logic (:func:`watchdog.name`) is tested on facts; the reading and the bound on
progress files written here; a stopped process is a real one (``sleep`` under SIGSTOP);
the end-to-end tests start real runs: a process spinning in Python under ``launch``
(loopback), and a stopped host on a 3-host ``cluster``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from launched import says, signal_when

from allreduce_jax import netns, progress
from allreduce_jax.tools import watchdog
from allreduce_jax.tools.watchdog import Facts

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "allreduce_jax"]


# ------------------------------------------------------------------ naming


def test_a_stopped_process_is_named_before_anything_else():
  v = watchdog.name([Facts(0, in_jax=False, steps=3), Facts(1, "T", 4), Facts(2, in_jax=True)])
  assert v.rank == 1 and "stopped" in v.why and v.waiting == (2,)


def test_a_link_down_is_named_when_nobody_is_stopped():
  v = watchdog.name([Facts(0, steps=5, in_jax=True), Facts(1, steps=5, cannot="has its link down"),
                     Facts(2, steps=5, in_jax=True)])  # fmt: skip
  assert (v.rank, v.why, v.waiting) == (1, "has its link down", (0, 2))


def test_the_process_outside_jax_is_named_while_the_others_wait_in_jax():
  frame = 'File "/x/train.py", line 7 in spin'
  v = watchdog.name([Facts(0, steps=9, in_jax=True), Facts(1, steps=9, in_jax=True),
                     Facts(2, steps=9, in_jax=False, frame=frame)])  # fmt: skip
  assert v.rank == 2 and f"stuck outside JAX at {frame}" in v.why and v.waiting == (0, 1)
  # two outside: the one behind; everyone outside is no evidence (a slow host loop)
  v = watchdog.name([Facts(0, steps=9, in_jax=False), Facts(1, steps=8, in_jax=False),
                     Facts(2, steps=9, in_jax=True)])  # fmt: skip
  assert v.rank == 1
  v = watchdog.name([Facts(0, steps=9, in_jax=False), Facts(1, steps=8, in_jax=False)])
  assert v.rank == 1 and "behind: 8 step(s)" in v.why and "others' 9" in v.why


def test_nobody_is_named_when_every_process_waits_level_in_jax():
  v = watchdog.name([Facts(r, steps=4, in_jax=True) for r in range(3)])
  assert v.rank is None and "every process waits" in v.why


def test_the_message_names_the_process_its_reason_and_the_bound():
  stall = watchdog.Stall(1, 2.05, 2.0, "the floor")
  v = watchdog.Verdict(1, "is stopped (/proc state T: SIGSTOP?)", (0, 2, 3))
  text = watchdog.message(stall, v, 4, [10, 11, 12, 13])
  assert text.startswith("process 1 (pid 11) of 4 is stopped")
  assert "processes 0, 2, 3 wait in a collective for it" in text
  assert "no progress for 2.0 s (the watchdog's bound 2.0 s: the floor)" in text


def test_main_thread_top_under_python_m():
  dump = textwrap.dedent(
    """
    Thread 0x00007f01 (most recent call first):
      File "/x/threading.py", line 331 in wait
    Current thread 0x00007f02 (most recent call first):
      File "/x/allreduce_jax/progress.py", line 115 in _spin
      File "/x/allreduce_jax/cli.py", line 141 in main
      File "<frozen runpy>", line 198 in _run_module_as_main
    """
  )
  assert watchdog.main_thread_top(dump) == 'File "/x/allreduce_jax/progress.py", line 115 in _spin'


# ------------------------------------------------------------------ reading and bounds


def _report(path: Path, *lines: str) -> None:
  with open(path, "a") as f:
    f.write("".join(f"{x}\n" for x in lines))


def test_reports_set_the_bound_from_the_longest_recent_step(tmp_path):
  path = tmp_path / "progress-0"
  dog = watchdog.Watchdog([path], [os.getpid()], watchdog.Settings(floor=0.5, factor=3))
  t = time.time()
  dog.tracks[0].started = t - 9  # as if started 9 s ago
  _report(path, f"phase joined {t - 9:.4f}", f"step 10 {t - 5:.4f}", f"step 20 {t - 4.5:.4f}",
          f"mark compile=0.4 {t - 4.4:.4f}", f"step 30 {t - 3.5:.4f}")  # fmt: skip
  stall = dog.check()
  track = dog.tracks[0]
  assert track.steps == 3 and list(track.intervals) == pytest.approx([0.5, 1.0], abs=1e-3)
  assert track.first_step == pytest.approx(4.0, abs=0.1)  # from the start to step 10
  assert stall is not None and stall.bound_s == pytest.approx(3.0, abs=1e-3)  # 3 × 1.0 s
  assert stall.silent_s == pytest.approx(3.5, abs=0.1) and "longest recent step" in stall.how
  # a phase lifts the step bound: no phase bound in a first attempt, a multiple of the
  # last attempt's time to its first step in a restart
  _report(path, f"phase finishing {time.time():.4f}")
  assert dog.check() is None
  dog.settings = watchdog.attempt(dog.settings, 0.1, None)
  assert dog.settings.phase_s == pytest.approx(0.3)
  time.sleep(0.6)
  stall = dog.check()
  assert stall is not None and stall.bound_s == 0.5 and "finishing" in stall.how


def test_a_phase_starts_a_new_scale_a_longer_call_after_it_does_not_trip(tmp_path):
  path = tmp_path / "progress-0"
  dog = watchdog.Watchdog([path], [os.getpid()], watchdog.Settings(floor=0.5, factor=3))
  t = time.time()
  # 1 s calls, then another size: its phase (compile and a 4 s warm-up call), then 4 s calls
  _report(path, f"phase compiling {t - 13:.4f}", *(f"step {i} {t - 12 + i:.4f}" for i in range(4)),
          f"phase compiling {t - 8.5:.4f}", f"step 4 {t - 4:.4f}")  # fmt: skip
  assert dog.check() is None  # 4 s silent: within 3 × the 4.5 s phase, not 3 × 1 s
  assert dog.tracks[0].warmup == pytest.approx(4.5, abs=1e-3) and not dog.tracks[0].intervals
  _report(path, f"step 5 {time.time():.4f}")
  assert dog.check() is None and list(dog.tracks[0].intervals) == pytest.approx([4.0], abs=0.1)


def test_a_half_written_line_waits_for_its_end(tmp_path):
  path = tmp_path / "progress-0"
  dog = watchdog.Watchdog([path], [os.getpid()], watchdog.Settings())
  with open(path, "w") as f:
    f.write(f"step 1 {time.time():.4f}\nstep 2 17")
  dog.check()
  assert dog.tracks[0].steps == 1
  with open(path, "a") as f:
    f.write(f"{time.time():.4f}\n")
  dog.check()
  assert dog.tracks[0].steps == 2


def test_a_stopped_process_trips_the_watchdog_after_the_floor(tmp_path):
  proc = subprocess.Popen(["sleep", "60"])
  try:
    dog = watchdog.Watchdog([tmp_path / "p"], [proc.pid], watchdog.Settings(floor=0.3))
    os.kill(proc.pid, signal.SIGSTOP)
    while watchdog.proc_state(proc.pid) != "T":
      time.sleep(0.01)
    assert dog.check() is None  # stopped, but not for the floor yet
    time.sleep(0.4)
    stall = dog.check()
    assert stall is not None and stall.rank == 0 and stall.how == "stopped for the floor"
    (facts,) = dog.facts([(0, proc.pid, tmp_path / "log")])
    assert facts.state == "T"
  finally:
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("floor", [-1, float("nan"), float("inf")])
def test_a_bad_floor_is_one_line(floor):
  with pytest.raises(ValueError, match=r"--watchdog must be a number of seconds >= 0"):
    watchdog.Settings(floor=floor)


def test_progress_reports_nothing_outside_a_launcher_and_lines_inside(tmp_path, monkeypatch):
  monkeypatch.delenv(progress.ENV_PROGRESS, raising=False)
  progress.reset()
  progress.step(1)
  assert not progress.enabled()
  monkeypatch.setenv(progress.ENV_PROGRESS, str(tmp_path / "p"))
  progress.reset()
  try:
    progress.step(7), progress.phase("saving now"), progress.mark("compile", 0.25)
    lines = (tmp_path / "p").read_text().splitlines()
  finally:
    progress.reset()
  assert [ln.rsplit(" ", 1)[0] for ln in lines] == ["step 7", "phase saving_now",
                                                    "mark compile=0.2500"]  # fmt: skip


# ------------------------------------------------------------------ end to end

# Every process all-gathers in a loop, reporting each round.
LOOPER = """
import sys, time
from allreduce_jax import distributed, progress
distributed.initialize_from_env()
import numpy as np
from jax.experimental import multihost_utils
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[1])
x = np.ones(1001, np.float32)
k = 0
while True:
  x[-1] = time.monotonic() > end
  if multihost_utils.process_allgather(x)[:, -1].any():
    break
  k += 1
  progress.step(k)
"""


@pytest.mark.timeout(120)
def test_a_process_spinning_in_python_is_named_with_its_frame(tmp_path, monkeypatch):
  script = tmp_path / "looper.py"
  script.write_text(LOOPER)
  logs = tmp_path / "logs"
  monkeypatch.setenv(progress.ENV_FAULT_SPIN, "1")
  argv = [*CLI, "launch", "-n", "2", "--watchdog", "1", "--timeout", "90", "--log-dir",
          str(logs), "--", sys.executable, str(script), "80"]  # fmt: skip
  proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)  # fmt: skip
  stepping = lambda: says(logs / "progress-1", "step 5 ")  # noqa: E731
  _, err, took = signal_when(proc, stepping, logs, 1, signal.SIGUSR2, within=60, wait=60)
  spun = time.time() - took
  assert proc.returncode == 124, err[-2000:]
  assert re.search(r"launch: process 1 \(pid \d+\) of 2 is stuck outside JAX at File \".*"
                   r"progress\.py\", line \d+ in _spin", err), err[-2000:]  # fmt: skip
  assert "process 0 waits in a collective for it" in err
  events = [json.loads(x) for x in (logs / "launcher.jsonl").read_text().splitlines()]
  named = next(e for e in events if e["event"] == "named")
  assert named["rank"] == 1 and named["unix"] - spun < 5, named["unix"] - spun


@pytest.fixture
def privileged():
  problem = netns.root_problem()
  if problem:
    pytest.skip(f"cluster as root: {problem}")


@pytest.mark.timeout(150)
def test_a_stopped_host_is_named_within_the_bound_on_a_cluster(privileged, tmp_path):
  script = tmp_path / "looper.py"
  script.write_text(LOOPER)
  logs = tmp_path / "logs"
  argv = [*CLI, "cluster", "--hosts", "3", "--concurrent", "--timeout", "120", "--log-dir",
          str(logs), "--fault", "stop:2@2", "--", sys.executable, str(script), "100"]  # fmt: skip
  res = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=140)
  assert res.returncode == 124, res.stderr[-2000:]
  assert re.search(r"cluster: process 2 \(pid \d+\) of 3 is stopped \(/proc state T",
                   res.stderr), res.stderr[-2000:]  # fmt: skip
  assert "processes 0, 1 wait in a collective for it" in res.stderr
  (fault,) = [json.loads(x) for x in (logs / "faults.jsonl").read_text().splitlines()]
  events = {
    e["event"]: e for e in map(json.loads, (logs / "launcher.jsonl").read_text().split("\n")[:-1])
  }
  named = events["named"]["unix"] - fault["unix_time"]
  # the floor (2 s) and a poll; a loaded machine delays the launcher's polls a little
  assert watchdog.FLOOR_S - 0.5 < named < watchdog.FLOOR_S + 1.5, named
  assert events["stopped"]["unix"] - fault["unix_time"] < named + 1.5
  tag = "arj-" + res.stderr.split("namespaces arj-")[1].split("-")[0]
  assert netns.leftovers(tag) == []


def test_a_place_that_says_a_process_cannot_progress_trips_it_after_the_floor(tmp_path):
  said = {"why": None}
  dog = watchdog.Watchdog([tmp_path / "p"], [os.getpid()],
                          watchdog.Settings(floor=0.3, explain=lambda rank: said["why"]))  # fmt: skip
  assert dog.check() is None  # in a phase (starting), no step bound: only the place's word
  said["why"] = "has its link down"
  assert dog.check() is None  # asked at most every EXPLAIN_EVERY_S
  time.sleep(watchdog.EXPLAIN_EVERY_S + 0.35)
  assert dog.check() is None  # down since this ask: not for the floor yet
  time.sleep(watchdog.EXPLAIN_EVERY_S)
  stall = dog.check()
  assert stall is not None and stall.how == "its link down for the floor"


def test_a_restart_that_made_no_step_leaves_the_next_without_the_first_attempts_bound(
  monkeypatch, tmp_path
):
  """Attempt 0 reached its first step after 0.5 s; attempt 1 passed that bound while
  starting (no spare ready) and made no step; attempt 2 must not be held to it again (a
  restart storm: every later start as slow, every one stopped)."""
  from allreduce_jax.tools import launch

  ends = [launch.Result(1, 0, first_step_s=0.5), launch.Result(124), launch.Result(0)]
  bounds = []

  def attempt(command, n, options, place, **kw):
    bounds.append(options.watch.phase_s)
    return ends[len(bounds) - 1]

  monkeypatch.setattr(launch, "run_attempt", attempt)
  with open(tmp_path / "err", "w") as err:
    rc = launch.launch_restarting(["true"], 2, restarts=2, spares=False, err=err)
  assert rc == 0 and bounds == [None, 0.5 * watchdog.Settings().factor, None], bounds
