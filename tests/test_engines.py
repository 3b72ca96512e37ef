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


def _run_in_session(argv: list[str], env: dict, timeout: float) -> tuple[subprocess.Popen, str]:
  """Runs ``argv`` from the checkout in a session of its own (stdout and stderr together);
  after ``timeout`` s, or any error, the whole session is killed. The process and its output."""
  proc = subprocess.Popen(
    argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    start_new_session=True,
  )  # fmt: skip
  try:
    out, _ = proc.communicate(timeout=timeout)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, 9)
      proc.wait()
  return proc, out


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
  proc, out = _run_in_session(argv, env, timeout=200)
  assert proc.returncode == 0, out[-3000:]
  _check(out, processes * devices)
  assert out.count(": 6 passed, 0 failed") == processes  # every rank ran the whole check
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


# ---- the emulated cluster under each launcher ---------------------------------------

PROBE = """
import os, socket, sys, time
import numpy as np
from allreduce_jax import distributed
distributed.initialize_from_env()
import jax
from jax.sharding import NamedSharding, PartitionSpec as P
from allreduce_jax import all_reduce
p = jax.device_count()
mesh = jax.make_mesh((p,), ("i",))
data = np.arange(p * 5, dtype=np.float32).reshape(p, 5)
x = jax.make_array_from_callback(data.shape, NamedSharding(mesh, P("i")), lambda i: data[i])
ring = jax.jit(jax.shard_map(lambda b: all_reduce(b, "i", algorithm="ring"), mesh=mesh,
                             in_specs=P("i"), out_specs=P("i")))
y = ring(x)
ok = all(np.array_equal(np.asarray(s.data)[0], data.sum(0)) for s in y.addressable_shards)
line = " ".join(map(str, ["probe", socket.gethostname(), jax.process_index(), jax.process_count(),
                          jax.local_device_count(), "ok" if ok else "WRONG"]))
os.write(1, (line + "\\n").encode())  # one write: lines of two hosts never interleave
if sys.argv[1:] == ["sleep"]:
  time.sleep(120)
"""


def _cluster_problem(name: str) -> str | None:
  from allreduce_jax import netns
  from allreduce_jax.tools import engines

  return netns.root_problem() or engines.problem(name, rootless=False)


def _marked(mark: str) -> list[int]:
  """Live processes whose environment carries ``mark`` (the run's own variable)."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      if mark.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        found.append(int(pid))
    except OSError:
      continue
  return found


def _cluster(
  name: str, tmp_path: Path, *args: str, topology: str = "switch"
) -> tuple[subprocess.Popen, str, dict]:
  why = _cluster_problem(name)
  if why:
    pytest.skip(f"cluster --launcher {name}: {why}")
  script = tmp_path / "probe.py"
  script.write_text(PROBE)
  mark = f"ARJ_ENGINE_TEST={tmp_path.name}"
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "ALLREDUCE_JAX_CLUSTER_CONCURRENT": "1",
         "TMPDIR": str(tmp_path), mark.split("=")[0]: tmp_path.name}  # fmt: skip
  argv = [*ALLREDUCE_JAX, "cluster", "--hosts", "2", "--topology", topology, "--devices-per-host",
          "2", "--launcher", name, "--", sys.executable, str(script), *args]  # fmt: skip
  proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)  # fmt: skip
  return proc, mark, env


def _nothing_left(proc: subprocess.Popen, mark: str, tmp_path: Path, err: str) -> None:
  import time

  from allreduce_jax import netns

  tag = re.search(r"namespaces (arj-\d+)-", err).group(1)
  assert netns.leftovers(tag) == []
  deadline = time.monotonic() + 10  # killed daemons are zombies for a moment
  while _marked(mark) and time.monotonic() < deadline:
    time.sleep(0.2)
  assert _marked(mark) == []  # no daemon, orted, slurmstepd or task
  assert [p.name for p in tmp_path.iterdir() if p.name != "probe.py"] == []  # no spool, key


@pytest.mark.timeout(200)
# torus:2: hosts joined point to point, each address on its loopback device (Open MPI's TCP
# components skip loopback devices: the launcher puts the address on a link too)
@pytest.mark.parametrize("name, topology", [("mpirun", "switch"), ("slurm", "switch"),
                                            ("mpirun", "torus:2")])  # fmt: skip
def test_cluster_under_a_launcher_runs_on_every_host_and_leaves_nothing(name, topology, tmp_path):
  proc, mark, _ = _cluster(name, tmp_path, topology=topology)
  try:
    out, err = proc.communicate(timeout=180)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
  assert proc.returncode == 0, out[-2000:] + err[-3000:]
  probes = sorted(line for line in out.splitlines() if line.startswith("probe"))
  assert probes == ["probe host0 0 2 2 ok", "probe host1 1 2 2 ok"], out[-2000:]
  _nothing_left(proc, mark, tmp_path, err)


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
  "name, named",
  [
    ("mpirun", r"process rank 1 with PID \d+ on node 10\.213\.0\.2 exited on signal 9"),
    ("slurm", r"srun: error: host1: task 1: Killed"),
  ],
)
def test_a_host_killed_under_a_launcher_is_named_and_nothing_is_left(name, named, tmp_path):
  import time

  proc, mark, _ = _cluster(name, tmp_path, "sleep")
  try:
    deadline = time.monotonic() + 150
    lines = []
    while not any(line.startswith("probe host1") for line in lines):
      assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
      lines.append(proc.stdout.readline())
    rank = "SLURM_PROCID=1" if name == "slurm" else "OMPI_COMM_WORLD_RANK=1"
    victims = [
      pid for pid in _marked(mark)
      if rank.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
      and b"probe.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]  # fmt: skip
    assert len(victims) == 1
    t0 = time.monotonic()
    os.kill(victims[0], 9)
    out, err = proc.communicate(timeout=60)
    elapsed = time.monotonic() - t0
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
  assert proc.returncode != 0
  assert re.search(named, out + err), (out + err)[-3000:]
  assert elapsed < 20, f"took {elapsed:.1f} s"
  _nothing_left(proc, mark, tmp_path, err)


# ---- MPI_Allreduce as a peer (bench --algorithms mpi) -------------------------------


def test_bench_mpi_outside_an_mpi_launch_is_one_line(capsys):
  from allreduce_jax.cli import main

  env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_"))}
  with pytest.MonkeyPatch.context() as m:
    for k in set(os.environ) - set(env):
      m.delenv(k)
    with pytest.raises(SystemExit) as e:
      main(["bench", "--algorithms", "ring,mpi", "--smoke", "--out", os.devnull])
  assert "under mpirun" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.timeout(240)
def test_bench_mpi_beside_ring_and_psum_under_mpirun_names_open_mpis_algorithm(tmp_path):
  why = _mpirun_problem()
  if why:
    pytest.skip(why)
  try:
    import mpi4jax  # noqa: F401
  except ImportError as e:
    pytest.skip(f"needs the extra mpi (pip install -e '.[mpi]'): {e}")
  import json

  out = tmp_path / "bench.jsonl"
  root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env.pop("JAX_NUM_CPU_DEVICES", None)
  argv = ["mpirun", *root, "--oversubscribe", "-np", "2", "-x", "JAX_PLATFORMS",
          "--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm",
          "6", *ALLREDUCE_JAX, "bench", "--algorithms", "ring,psum,mpi", "--smoke", "-o", "sum,max",
          "--out", str(out)]  # fmt: skip
  res = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=220)
  assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  mpi = [r for r in rows if r["algorithm"] == "mpi"]
  assert len(mpi) == 6 and len(rows) == 18  # 3 sizes × 2 ops each
  assert all(r["mpi_algorithm"] == "rabenseifner" and r["wrong"] == 0 for r in mpi)
  assert all(r["process_count"] == 2 and r["n_devices"] == 2 for r in rows)
  assert "mpi(rabenseifner)" in res.stdout


def test_a_launcher_that_cannot_run_is_one_line_before_anything_is_built(monkeypatch, capsys):
  from allreduce_jax import netns
  from allreduce_jax.tools import cluster, dispatch, engines

  assert engines.problem("builtin", rootless=True) is None
  assert "needs root" in engines.problem("mpirun", rootless=True)
  monkeypatch.setattr(shutil, "which", lambda name: None)
  assert "apt-get install openmpi-bin" in engines.problem("mpirun", rootless=False)
  monkeypatch.setattr(netns, "choose", lambda rootless: (False, None))
  monkeypatch.setattr(netns, "up", lambda plan: pytest.fail("built a cluster"))
  args = dispatch.subcommand_parser("cluster").parse_args(
    ["--hosts", "2", "--launcher", "slurm", "--", "verify"]
  )
  assert cluster.run(args) == 1
  err = capsys.readouterr().err.strip()
  assert err.startswith("allreduce-jax cluster: --launcher slurm needs munged") and "\n" not in err
