"""The launchers clusters use, run for real: ``mpirun`` (Open MPI) and ``srun`` (a private
SLURM, :mod:`allreduce_jax.tools.slurm_local`), each with one and two emulated devices
per process; and nothing of theirs left behind. Skipped, with the reason, where the
engine is missing. ``verify`` itself compares every result with a NumPy oracle.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from allreduce_jax.tools import slurm_local

ROOT = Path(__file__).resolve().parents[1]
ALLREDUCE_JAX = [sys.executable, "-m", "allreduce_jax"]
VERIFY = [
  "verify", "--algorithms", "ring,halving_doubling,psum", "--ops", "sum,max",
  "--dtypes", "float32", "--kinds", "verifiable", "--shapes", "13",
]  # fmt: skip


def _mpirun_problem() -> str | None:
  if shutil.which("mpirun") is None:
    return "needs Open MPI's mpirun on PATH (Debian: apt-get install openmpi-bin)"
  res = subprocess.run(["mpirun", "--version"], capture_output=True, text=True)
  if "Open MPI" not in res.stdout + res.stderr:
    return "needs Open MPI's mpirun (JAX detects Open MPI jobs; this mpirun is another MPI)"
  version = re.search(r"\(Open MPI\) (\d+)", res.stdout)
  if version and int(version.group(1)) >= 5:
    return "needs Open MPI 4 or older: JAX 0.10/0.11 does not detect Open MPI 5 jobs (jax#14576)"
  return None


def _check(out: str, p: int) -> None:
  """verify's table: every row of ``p`` participants passes, and none fails."""
  rows = [line for line in out.splitlines() if line.endswith(("PASS", "FAIL", "backend"))]
  assert rows, out[-3000:]
  assert all(line.split()[3] == str(p) and line.endswith("PASS") for line in rows), out[-3000:]
  assert " 0 failed" in out and "FAIL" not in out


def _session_left(pgid: int) -> list[int]:
  """Live processes still in session ``pgid`` (a command started with start_new_session)."""
  left = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if fields[0] != "Z" and int(fields[3]) == pgid:
      left.append(int(pid))
  return left


@pytest.mark.timeout(240)
@pytest.mark.parametrize("processes, devices", [(2, 1), (2, 2)])
def test_mpirun_verify(processes, devices):
  why = _mpirun_problem()
  if why:
    pytest.skip(why)
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(devices)}
  root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
  argv = ["mpirun", *root, "--oversubscribe", "-np", str(processes),
          "-x", "JAX_PLATFORMS", "-x", "JAX_NUM_CPU_DEVICES", *ALLREDUCE_JAX, *VERIFY]  # fmt: skip
  proc = subprocess.Popen(
    argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    start_new_session=True,
  )  # fmt: skip
  try:
    out, _ = proc.communicate(timeout=200)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, 9)
      proc.wait()
  assert proc.returncode == 0, out[-3000:]
  _check(out, processes * devices)
  assert out.count("# 6 passed, 0 failed") == processes  # every rank ran the whole check
  assert _session_left(proc.pid) == []


@pytest.mark.timeout(300)
def test_srun_verify_on_a_private_slurm_leaves_nothing_behind():
  why = slurm_local.problem()
  if why:
    pytest.skip(f"private SLURM: {why}")
  verify = " ".join([*ALLREDUCE_JAX, *VERIFY])
  # one device per task, then two: -c 2 makes the task's 2 CPUs its emulated devices
  script = (
    f"srun -n 2 --kill-on-bad-exit=1 {verify} && echo '### two' &&"
    f" srun -n 2 -c 2 --kill-on-bad-exit=1 {verify}"
  )
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env.pop("JAX_NUM_CPU_DEVICES", None)
  res = subprocess.run(
    [sys.executable, "-m", "allreduce_jax.tools.slurm_local", "--cpus", "4", "--", "sh", "-c",
     script],
    cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
  )  # fmt: skip
  assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
  one, two = res.stdout.split("### two")
  _check(one, 2)
  _check(two, 4)
  folder = re.search(r"SLURM up .* in (\S+)", res.stderr).group(1)
  assert slurm_local.leftovers(folder) == []  # no folder, key, spool, daemon or task


def test_slurm_config_names_every_node_and_keeps_state_in_its_folder(tmp_path):
  nodes = [slurm_local.Node("host0", "10.0.0.1"), slurm_local.Node("host1", "10.0.0.2")]
  text = slurm_local.config(tmp_path, nodes, 3, nodes[0])
  assert "SlurmctldHost=host0(10.0.0.1)" in text
  assert "NodeName=host1 NodeAddr=10.0.0.2 CPUs=3" in text
  paths = re.findall(r"=(/\S+)", text)
  assert paths and all(p.startswith(str(tmp_path)) for p in paths)


def test_without_the_engine_slurm_says_what_is_needed_in_one_line(monkeypatch):
  monkeypatch.setattr(shutil, "which", lambda name: None)
  why = slurm_local.problem()
  assert "munged" in why and "apt-get install slurm-wlm munge" in why and "\n" not in why
  with pytest.raises(slurm_local.SlurmError, match="needs munged"):
    slurm_local.Slurm()


def test_devices_per_process_under_a_cluster_launcher():
  from allreduce_jax.distributed import cpu_devices_from_env

  step = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"}
  assert cpu_devices_from_env({**step, "SLURM_CPUS_PER_TASK": "2"}) == 2  # srun -c 2
  assert cpu_devices_from_env(step) is None  # JAX's default, 1
  # JAX applies its own variable itself (mpirun -x JAX_NUM_CPU_DEVICES=2)
  assert (
    cpu_devices_from_env({**step, "SLURM_CPUS_PER_TASK": "2", "JAX_NUM_CPU_DEVICES": "3"}) is None
  )
  assert cpu_devices_from_env({"OMPI_COMM_WORLD_SIZE": "2", "SLURM_CPUS_PER_TASK": "2"}) is None
  with pytest.raises(ValueError, match="SLURM_CPUS_PER_TASK"):
    cpu_devices_from_env({**step, "SLURM_CPUS_PER_TASK": "two"})
