"""Training that recovers, and faults on the emulated cluster.

``train sync --checkpoint-dir`` resumes bitwise (in one process, and under ``launch
--restarts`` after a process is killed); a kill during orbax saves never leaves a
partial checkpoint to restore; ``cluster --fault`` specs are checked in one line, a
killed host is named and every survivor stopped within 10 s, the other faults are
applied and logged, and nothing is left behind (namespaces, cgroups, temp folders).
"""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from launched import signal_when

from allreduce_jax import netns
from allreduce_jax.tools import faults

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "allreduce_jax"]


def _digest(text: str) -> list[str]:
  return [ln.split("parameters sha256 ")[1].strip() for ln in text.splitlines() if "sha256" in ln]


# ------------------------------------------------------------------ checkpoints, in process


def test_the_example_stream_continues_the_batches():
  from allreduce_jax.training import checkpoint, data

  full = data.batch_indices(1000, 48, 50, seed=7).ravel()  # 2.4 epochs
  assert np.array_equal(checkpoint.example_stream(1000, 0, full.size, 7), full)
  assert np.array_equal(checkpoint.example_stream(1000, 960, 1440, 7), full[960:])


def test_a_resumed_run_is_bitwise_the_uninterrupted_run(tmp_path):
  import shutil

  from allreduce_jax.training import checkpoint, configs
  from allreduce_jax.training import experiments as ex

  cfg = configs.SyncConfig.smoke(workers=4, steps=24, eval_every=8)
  plain = ex.run_sync(cfg, 0)
  saved = ex.run_sync(cfg, 0, checkpoint_dir=tmp_path, checkpoint_every=5)
  steps = sorted(int(p.name) for p in (tmp_path / "seed-0").iterdir() if p.name.isdigit())
  assert steps == [20, 24]  # two kept (the last step is saved too)
  shutil.rmtree(tmp_path / "seed-0" / "24")  # as if killed after step 20's save
  resumed = ex.run_sync(cfg, 0, checkpoint_dir=tmp_path, checkpoint_every=5)
  assert resumed["restarts"] == [20]
  assert plain["params_sha256"] == saved["params_sha256"] == resumed["params_sha256"]
  assert plain["test_acc"] == resumed["test_acc"] and plain["final_loss"] == resumed["final_loss"]
  # A checkpoint of another run, or of more workers without --elastic: one line naming it.
  with pytest.raises(checkpoint.CheckpointError, match=r"model='mlp'.*model='cnn'"):
    ex.run_sync(configs.SyncConfig.smoke(workers=4, steps=24, model="cnn"), 0,
                checkpoint_dir=tmp_path)  # fmt: skip
  three = configs.SyncConfig.smoke(workers=3, steps=24, eval_every=8)
  with pytest.raises(checkpoint.CheckpointError, match=r"4 workers.*--workers 3.*--elastic"):
    ex.run_sync(three, 0, checkpoint_dir=tmp_path, checkpoint_every=5)
  shutil.rmtree(tmp_path / "seed-0" / "24")  # resume from step 20, on 3 workers
  elastic = ex.run_sync(three, 0, checkpoint_dir=tmp_path, checkpoint_every=5, elastic=True)
  assert elastic["restarts"] == [20] and elastic["final_test_acc"] > 0.8


@pytest.mark.timeout(240)
def test_a_kill_during_saves_never_leaves_a_partial_checkpoint(tmp_path):
  from allreduce_jax.tools import saver  # saves 16 MiB checkpoints; step k's arrays hold k

  rng = random.Random(0)
  torn = 0
  for _ in range(5):
    proc = subprocess.Popen([*CLI[:1], "-m", "allreduce_jax.tools.saver", str(tmp_path)],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    assert proc.stdout.readline().strip() == "saving"
    time.sleep(rng.uniform(0.2, 1.5))
    proc.kill()
    proc.wait()
    proc.stdout.close()
    torn += any("tmp" in p.name for p in tmp_path.iterdir())
    state = saver.restore(tmp_path)
    assert state is not None
    assert state.losses == [float(state.step)] and state.examples == state.step
    assert np.all(state.params["w"] == state.step) and np.all(state.opt_state["m"] == state.step)
    assert not any("tmp" in p.name for p in tmp_path.iterdir())  # the torn save was removed
  print(f"{torn} of 5 kills left a torn save")


@pytest.mark.timeout(400)
def test_launch_restarts_a_killed_run_and_it_ends_bitwise_equal(tmp_path):
  from allreduce_jax.training import configs
  from allreduce_jax.training import experiments as ex

  logs, ck = tmp_path / "logs", tmp_path / "ck"
  argv = [*CLI, "launch", "-n", "2", "--restarts", "1", "--log-dir", str(logs), "--", "train",
          "sync", "--smoke", "--workers", "2", "--steps", "40", "--eval-every", "10",
          "--checkpoint-dir", str(ck), "--checkpoint-every", "5", "--out", str(tmp_path / "out")]  # fmt: skip
  proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)  # fmt: skip
  out, err, _ = signal_when(proc, (ck / "seed-0" / "10").exists, logs, 1, signal.SIGKILL)
  assert proc.returncode == 0, err[-3000:]
  assert "process 1 of 2" in err and "was killed by SIGKILL" in err
  assert "restart 1 of 1 after process 1 failed" in err
  assert "resumed from step [" in out
  plain = ex.run_sync(configs.SyncConfig.smoke(workers=2, steps=40, eval_every=10), 0)
  assert _digest(out) == [plain["params_sha256"][:16]]


# ------------------------------------------------------------------ faults


@pytest.mark.parametrize(
  "spec, message",
  [("kill:1", "not a fault"), ("explode:1@2", "not a fault"), ("kill:5@1", "host 5"),
   ("link:1@2", "link takes =VALUE"), ("link:1=fast@2", "rate 'fast'"),
   ("down:1@2", "down takes +DURATION"), ("cpu:1=0@1", "CPU fraction '0'"),
   ("kill:1=3@1", "kill takes no =VALUE"), ("stop:0@1+2", "stop takes no +DURATION")],
)  # fmt: skip
def test_a_bad_fault_is_one_line_naming_it(spec, message, capsys):
  with pytest.raises(ValueError, match=re.escape(message)) as e:
    faults.parse(spec, 4)
  assert f"--fault {spec!r}" in str(e.value) and "\n" not in str(e.value)
  res = subprocess.run([*CLI, "cluster", "--hosts", "4", "--fault", spec, "--", "verify"],
                       capture_output=True, text=True, cwd=ROOT)  # fmt: skip
  assert res.returncode == 2 and res.stderr.strip().count("\n") == 0, res.stderr
  assert f"--fault {spec!r}" in res.stderr


def test_good_faults_parse():
  assert faults.parse("link:2=20Mbit@1.5", 4) == faults.Fault("link:2=20Mbit@1.5", "link", 2,
                                                                1.5, 2.5e6)  # fmt: skip
  assert faults.parse("down:0@3+0.5", 4).duration == 0.5
  assert faults.parse("cpu:3=0.25@0", 4).value == 0.25


@pytest.fixture
def privileged():
  problem = netns.root_problem()
  if problem:
    pytest.skip(f"cluster as root: {problem}")


# Every host all-gathers in a loop for about `seconds` (collectives under way when a fault hits).
LOOPER = """
import sys, time
from allreduce_jax import distributed
distributed.initialize_from_env()
import numpy as np
from jax.experimental import multihost_utils
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[1])
x = np.ones(100_001, np.float32)
while True:  # every host stops after the same iteration: the first whose time is up says so
  x[-1] = time.monotonic() > end
  if multihost_utils.process_allgather(x)[:, -1].any():
    break
"""


def _cluster(tmp_path, hosts, specs, seconds, timeout=150):
  script = tmp_path / "looper.py"
  script.write_text(LOOPER)
  logs = tmp_path / "logs"
  argv = [*CLI, "cluster", "--hosts", str(hosts), "--concurrent", "--log-dir", str(logs),
          *[a for s in specs for a in ("--fault", s)], "--", sys.executable, str(script),
          str(seconds)]  # fmt: skip
  res = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
  ended = time.time()
  rows = [json.loads(x) for x in (logs / "faults.jsonl").read_text().splitlines()]
  tag = next(x for x in res.stderr.splitlines() if "namespaces arj-" in x)
  tag = "arj-" + tag.split("namespaces arj-")[1].split("-")[0]
  assert netns.leftovers(tag) == []
  assert not [p for p in Path(faults.CGROUP).rglob(f"{tag}-*") if p.is_dir()]
  return res, rows, ended


@pytest.mark.timeout(200)
def test_a_killed_host_stops_every_survivor_and_is_named_within_10_s(privileged, tmp_path):
  res, rows, ended = _cluster(tmp_path, 3, ["kill:1@2"], 120)
  assert res.returncode == 128 + signal.SIGKILL, res.stderr[-2000:]
  assert "cluster: process 1 of 3" in res.stderr and "was killed by SIGKILL" in res.stderr
  assert "fault kill:1@2: SIGKILL to pid" in res.stderr
  (row,) = rows
  assert row["event"] == "kill" and 1.9 < row["after_join_s"] < 3
  assert ended - row["unix_time"] < 10, f"{ended - row['unix_time']:.1f} s"


@pytest.mark.timeout(200)
def test_link_down_and_cpu_faults_are_applied_logged_and_undone(privileged, tmp_path):
  specs = ["link:1=20Mbit@1", "cpu:1=0.5@1", "down:1@2+0.5", "kill:1@600"]  # kill: after the run
  res, rows, _ = _cluster(tmp_path, 2, specs, 6)
  assert res.returncode == 0, res.stderr[-2000:]
  assert [r["event"] for r in rows] == ["link", "cpu", "down", "up", "not applied"], rows
  assert rows[4]["fault"] == "kill:1@600" and "the run ended first" in rows[4]["what"]
  assert not any("failed" in r["what"] for r in rows), rows
  up, down = rows[3], rows[2]
  assert 0.45 < up["after_join_s"] - down["after_join_s"] < 1.0
  for r in rows:
    assert f"fault {r['fault']}: " in res.stderr
