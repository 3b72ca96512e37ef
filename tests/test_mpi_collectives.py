"""``launch|cluster --collectives mpi``: the hand-written algorithms with XLA's CPU collectives
(every ``ppermute``) over the local Open MPI, through jaxlib's MPItrampoline and the MPIwrapper
``experiments/mpi_peer/build_mpiwrapper.sh`` builds. ``verify`` compares every result with a NumPy
oracle. Skipped, with the reason, where Open MPI or the wrapper is missing; the bad inputs are
checked everywhere.
"""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest
from test_engines import (
  ALLREDUCE_JAX,
  _check,
  _cluster_problem,
  _mpirun_problem,
  _nothing_left,
  _run_in_session,
  _session_left,
)

from allreduce_jax import distributed
from allreduce_jax.tools import engines

ROOT = Path(__file__).resolve().parents[1]
# XLA's MPI collectives reduce no float16/bfloat16 ("Unsupported primitive type for reduction"),
# and verify's lax reference runs in the same program: float32 and int32 only.
VERIFY = [
  "verify", "--algorithms", "ring,halving_doubling,recursive_doubling,psum", "--ops", "sum,max",
  "--dtypes", "float32,int32", "--kinds", "verifiable", "--shapes", "13",
]  # fmt: skip


def _mpi_problem() -> str | None:
  why = _mpirun_problem()
  if why:
    return why
  try:
    distributed.mpiwrapper()
  except ValueError as e:
    return str(e)
  return None


@pytest.mark.timeout(300)
def test_launch_collectives_mpi_verify_passes_and_leaves_nothing():
  why = _mpi_problem()
  if why:
    pytest.skip(why)
  env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
  argv = [*ALLREDUCE_JAX, "launch", "-n", "2", "--collectives", "mpi", "--", *VERIFY]
  proc, out = _run_in_session(argv, env, timeout=280)
  assert proc.returncode == 0, out[-3000:]
  assert "mpirun -np 2, one device per rank, collectives over MPI" in out
  _check(out, 2)
  assert out.count(": 16 passed, 0 failed") == 2  # every rank ran the whole check
  assert "MPI_FINALIZE" not in out  # each rank left MPI cleanly
  assert _session_left(proc.pid) == []


@pytest.mark.timeout(300)
def test_cluster_collectives_mpi_verify_on_every_host_leaves_nothing(tmp_path):
  why = _mpi_problem() or _cluster_problem("mpirun")
  if why:
    pytest.skip(f"cluster --launcher mpirun --collectives mpi: {why}")
  mark = f"ARJ_ENGINE_TEST={tmp_path.name}"
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "ALLREDUCE_JAX_CLUSTER_CONCURRENT": "1",
         "TMPDIR": str(tmp_path), mark.split("=")[0]: tmp_path.name}  # fmt: skip
  argv = [*ALLREDUCE_JAX, "cluster", "--hosts", "2", "--launcher", "mpirun", "--collectives",
          "mpi", "--", *VERIFY]  # fmt: skip
  res = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
  assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
  _check(res.stdout, 2)
  assert res.stdout.count(": 16 passed, 0 failed") == 2, res.stdout[-3000:]
  _nothing_left(None, mark, tmp_path, res.stderr)  # no namespace, orted or rank


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
  return subprocess.run(
    [*ALLREDUCE_JAX, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
    env={**os.environ, **(env or {})},
  )  # fmt: skip


@pytest.mark.parametrize(
  "args, says",
  [
    (["launch", "-n", "2", "--local-devices", "2", "--collectives", "mpi"], "--local-devices must be 1"),
    (["cluster", "--hosts", "2", "--devices-per-host", "2", "--launcher", "mpirun",
      "--collectives", "mpi"], "--devices-per-host must be 1"),
    (["cluster", "--hosts", "2", "--collectives", "mpi"], "--launcher mpirun, got --launcher builtin"),
    (["launch", "-n", "2", "--collectives", "nccl"], "invalid choice: 'nccl'"),
  ],
)  # fmt: skip
def test_bad_collectives_input_is_one_line(args, says):
  res = _run(*args, "--", "verify")
  assert res.returncode == 2, res.stderr
  assert says in res.stderr and len(res.stderr.strip().splitlines()) <= 3, res.stderr


def test_without_the_wrapper_the_error_names_collectives_and_the_build(monkeypatch, tmp_path):
  monkeypatch.setattr(distributed, "MPIWRAPPER_BUILT", str(tmp_path / "libmpiwrapper.so"))
  with pytest.raises(ValueError, match="--collectives mpi needs MPIwrapper") as e:
    distributed.mpiwrapper({})
  assert distributed.BUILD_MPIWRAPPER in str(e.value) and "\n" not in str(e.value)
  with pytest.raises(ValueError, match="is not a file"):
    distributed.mpiwrapper({distributed.ENV_MPIWRAPPER: str(tmp_path / "missing.so")})


def test_collectives_environment_is_checked():
  with pytest.raises(ValueError, match="ALLREDUCE_JAX_COLLECTIVES='nccl' must be one of gloo, mpi"):
    distributed.initialize_from_env(
      {distributed.ENV_COLLECTIVES: "nccl", "OMPI_COMM_WORLD_SIZE": "2"}
    )
  assert engines.collectives_env("gloo") == {}


def test_bench_rows_and_json_name_the_collectives(tmp_path, monkeypatch):
  import json

  import jax

  from allreduce_jax import cost_model
  from allreduce_jax.cli import main

  jax.devices()  # the backend starts now: the flag changed below no longer picks it
  monkeypatch.setenv(cost_model.FIT_ENV_VAR, str(tmp_path / "none.json"))
  before = jax.config.jax_cpu_collectives_implementation
  seen = {}
  try:
    for name in (before, "mpi"):
      jax.config.update("jax_cpu_collectives_implementation", name)
      out, doc = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.json"
      argv = ["bench", "--algorithms", "ring", "-b", "4KiB", "-e", "4KiB", "-n", "2", "-w", "1",
              "--no-uneven", "--out", str(out), "-J", str(doc)]  # fmt: skip
      assert main(argv) == 0
      rows = [json.loads(line) for line in out.read_text().splitlines()]
      assert rows and {r["collectives"] for r in rows} == {name}
      assert json.loads(doc.read_text())["config"]["collectives"] == name
      assert {json.loads(r["key"]).get("collectives") for r in rows} == {
        "mpi" if name == "mpi" else None
      }
      seen[name] = rows
  finally:
    jax.config.update("jax_cpu_collectives_implementation", before)
  assert before == "gloo" and set(seen) == {"gloo", "mpi"}


@pytest.mark.parametrize("user", [None, "send,put,inplace,need-ack,need-csum"])
def test_collectives_mpi_gives_the_ranks_tcp_send_settings_unless_the_user_set_them(
  monkeypatch, tmp_path, user
):
  from allreduce_jax import netns

  wrapper = tmp_path / "libmpiwrapper.so"
  wrapper.write_bytes(b"")
  monkeypatch.setenv(distributed.ENV_MPIWRAPPER, str(wrapper))
  monkeypatch.delenv("OMPI_MCA_btl_tcp_max_send_size", raising=False)
  monkeypatch.delenv("OMPI_MCA_mpi_yield_when_idle", raising=False)
  if user:
    monkeypatch.setenv("OMPI_MCA_btl_tcp_flags", user)
  else:
    monkeypatch.delenv("OMPI_MCA_btl_tcp_flags", raising=False)
  # no put, 32 KiB fragments, yield while waiting: see engines.MPI_MCA; the user's flags win
  want = {"OMPI_MCA_btl_tcp_flags": user or "send,inplace,need-ack,need-csum",
          "OMPI_MCA_btl_tcp_max_send_size": "32768",
          "OMPI_MCA_mpi_yield_when_idle": "1"}  # fmt: skip
  env = engines.collectives_env("mpi")
  assert {k: env[k] for k in want} == want
  runs = []
  monkeypatch.setattr(engines, "_run", lambda argv, env, *rest: runs.append((argv, env)) or 0)
  monkeypatch.setattr(engines.shutil, "which", lambda name: f"/usr/bin/{name}")
  err = io.StringIO()
  assert engines.mpirun_local(["verify"], 2, "mpi", None, err) == 0  # launch --collectives mpi
  plan = netns.plan("switch", 2, 25e6)
  assert engines.mpirun(plan, ["verify"], 1, None, err, "mpi") == 0  # cluster
  (local, local_env), (cluster, _) = runs
  for k, v in want.items():
    assert local[local.index(k) - 1] == "-x" and local_env[k] == v
    assert cluster[cluster.index(f"{k}={v}") - 1] == "-x"
  assert engines.collectives_env("gloo") == {}
