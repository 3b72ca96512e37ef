"""Multi-process runs through ``allreduce-jax launch`` on 127.0.0.1 (gloo over TCP).

Every test is bounded twice: by the launcher's ``--timeout`` and by pytest-timeout.
The verify runs use a reduced set (2 dtypes, 2 input kinds, few shapes) but every
algorithm, so each crosses process boundaries in both 2 × 2 and 4 × 1 layouts.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from allreduce_jax import distributed
from allreduce_jax._api import ALGORITHMS
from allreduce_jax.tools import launch

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = [sys.executable, "-m", "allreduce_jax", "launch"]
QUICK = ["--dtypes", "float32,int32", "--kinds", "verifiable,random"]


def _launch(args: list[str], timeout: float) -> subprocess.CompletedProcess:
  return subprocess.run([*LAUNCH, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _alive(pid: int) -> bool:
  """True if ``pid`` exists and is not a zombie."""
  try:
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
  except (FileNotFoundError, ProcessLookupError):
    return False
  return state != "Z"


def _pids(log_dir: Path, n: int, wait_s: float = 30.0) -> list[int]:
  path = log_dir / "pids.json"
  deadline = time.monotonic() + wait_s
  while not path.exists() or not path.read_text():
    assert time.monotonic() < deadline, "the launcher wrote no pids.json"
    time.sleep(0.05)
  import json

  pids = json.loads(path.read_text())
  return [pids[str(r)] for r in range(n)]


def _wait_for(path: Path, text: str, wait_s: float) -> None:
  deadline = time.monotonic() + wait_s
  while not (path.exists() and text in path.read_text(errors="replace")):
    assert time.monotonic() < deadline, f"{text!r} never appeared in {path}"
    time.sleep(0.1)


def _check_verify(res: subprocess.CompletedProcess, processes: int, devices: int) -> None:
  assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
  out = res.stdout
  assert f"{devices} devices, {processes} process(es)" in out
  assert out.count("# verify:") == 1  # process 0's output only
  assert " 0 failed" in out
  for algorithm in ALGORITHMS:
    rows = [line for line in out.splitlines() if line.startswith(algorithm + " ")]
    assert rows and all(line.endswith("PASS") for line in rows), algorithm
  assert f"all {processes} processes finished OK" in res.stderr


@pytest.mark.timeout(420)
def test_verify_2_processes_x_2_devices(tmp_path):
  args = "-n 2 --local-devices 2 --timeout 360 --log-dir".split()
  res = _launch([*args, str(tmp_path), "--", "verify", *QUICK, "--shapes", "3x7"], timeout=400)
  _check_verify(res, processes=2, devices=4)
  # every process ran the whole verification and kept its own log
  assert " 0 failed" in (tmp_path / "process-1.log").read_text()


@pytest.mark.timeout(300)
def test_verify_4_processes_x_1_device(tmp_path):
  args = "-n 4 --timeout 240 --log-dir".split()
  verify = ["verify", *QUICK, "--shapes", "3x7", "--ops", "sum,max"]
  res = _launch([*args, str(tmp_path), "--", *verify], timeout=280)
  _check_verify(res, processes=4, devices=4)


@pytest.mark.timeout(180)
def test_killed_participant_stops_the_run(tmp_path):
  cmd = [*LAUNCH, "-n", "2", "--timeout", "150", "--log-dir", str(tmp_path)]
  cmd += ["--", "verify", *QUICK, "--shapes", "13"]
  launcher = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  try:
    pids = _pids(tmp_path, 2)
    _wait_for(tmp_path / "process-1.log", "# verify:", wait_s=90)  # joined, mid-run
    os.kill(pids[1], signal.SIGKILL)
    t_kill = time.monotonic()
    _, err = launcher.communicate(timeout=60)
  finally:
    if launcher.poll() is None:
      launcher.kill()
  elapsed = time.monotonic() - t_kill
  err = err.decode()
  assert launcher.returncode == 128 + signal.SIGKILL, err
  assert "process 1 of 2" in err and "SIGKILL" in err, err
  assert elapsed < 20, f"the launcher took {elapsed:.1f} s to stop the run"
  assert not any(_alive(p) for p in pids)


HANG = textwrap.dedent(
  """
  import time
  from allreduce_jax import distributed
  from allreduce_jax.tools import launch
  distributed.initialize_from_env()
  import jax, jax.numpy as jnp
  from jax.sharding import PartitionSpec as P
  mesh = jax.make_mesh((jax.device_count(),), ("i",))
  f = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "i"), mesh=mesh, in_specs=P("i"),
                            out_specs=P()))
  x = jax.make_array_from_callback((jax.device_count(),), jax.NamedSharding(mesh, P("i")),
                                   lambda idx: jnp.ones(1))
  print("first all-reduce:", f(x).addressable_data(0), flush=True)
  if jax.process_index() == 1:
    print("process 1 is stuck", flush=True)
    time.sleep(1000)  # alive, but never joins the next collective
  print("second all-reduce:", f(x).addressable_data(0), flush=True)
  """
)


@pytest.mark.timeout(120)
def test_stuck_participant_ends_at_timeout(tmp_path):
  script = tmp_path / "hang.py"
  script.write_text(HANG)
  logs = tmp_path / "logs"
  t0 = time.monotonic()
  res = _launch(
    ["-n", "2", "--timeout", "20", "--log-dir", str(logs), "--", sys.executable, str(script)],
    timeout=90,
  )
  assert res.returncode == 124, res.stdout + res.stderr
  assert "--timeout 20 s reached" in res.stderr and "process 1: process 1 is stuck" in res.stderr
  assert "first all-reduce: [2.]" in res.stdout  # the run really started across processes
  assert time.monotonic() - t0 < 60
  assert not any(_alive(p) for p in _pids(logs, 2))


def test_coordinator_port_in_use(tmp_path):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    res = _launch(
      ["-n", "2", "--coordinator", f"127.0.0.1:{port}", "--log-dir", str(tmp_path), "--", "verify"],
      timeout=60,
    )
  assert res.returncode == 2
  assert f"--coordinator 127.0.0.1:{port}: port {port} is already in use" in res.stderr
  assert not (tmp_path / "pids.json").exists()  # nothing was started


@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_no_orphans_when_the_launcher_is_interrupted_or_killed(tmp_path, how):
  sleeper = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(300)"]
  launcher = subprocess.Popen(
    [*LAUNCH, "-n", "3", "--log-dir", str(tmp_path), "--", *sleeper],
    cwd=ROOT,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
  )
  try:
    pids = _pids(tmp_path, 3)
    for r in range(3):
      _wait_for(tmp_path / f"process-{r}.log", "up", wait_s=30)
    launcher.send_signal(getattr(signal, how))
    _, err = launcher.communicate(timeout=30)
  finally:
    if launcher.poll() is None:
      launcher.kill()
  if how == "SIGINT":
    assert launcher.returncode == 130
    assert b"interrupted" in err
  deadline = time.monotonic() + 10
  while any(_alive(p) for p in pids) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not any(_alive(p) for p in pids)


def test_bad_arguments_are_named(tmp_path):
  cases = [
    ({"num_processes": 0}, "-n/--num-processes must be at least 1"),
    ({"local_devices": 0}, "--local-devices must be at least 1"),
    ({"coordinator": "localhost"}, "--coordinator 'localhost'"),
    ({"timeout": -1}, "--timeout must be positive"),
    ({"output": "7"}, "--output must be all, none or a rank in 0..1"),
    ({"command": []}, "after '--'"),
    ({"command": ["launch"]}, "launch -- launch"),
  ]
  for kwargs, message in cases:
    kwargs = {"command": ["verify"], "num_processes": 2, "log_dir": tmp_path, **kwargs}
    with pytest.raises(launch.LaunchError, match=re.escape(message)):
      launch.launch(**kwargs)
  assert not (tmp_path / "pids.json").exists()


def test_environment_decides_whether_to_initialize():
  init = distributed.initialize_from_env
  assert init({}) is False
  assert init({distributed.ENV_MODE: "off", distributed.ENV_PROCESS_ID: "0"}) is False
  assert init({"SLURM_JOB_ID": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is False
  with pytest.raises(ValueError, match=distributed.ENV_NUM_PROCESSES):
    init({distributed.ENV_NUM_PROCESSES: "two"})
  with pytest.raises(ValueError, match="together"):
    init({distributed.ENV_COORDINATOR: "127.0.0.1:1234", distributed.ENV_PROCESS_ID: "0"})
  with pytest.raises(ValueError, match=distributed.ENV_MODE):
    init({distributed.ENV_MODE: "maybe"})
