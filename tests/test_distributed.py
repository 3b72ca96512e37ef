"""Multi-process runs through ``allreduce-jax launch`` on 127.0.0.1 (gloo over TCP).

Every test is bounded twice: by the launcher's ``--timeout`` and by pytest-timeout.
The verify runs use a reduced set (2 dtypes, 2 input kinds, few shapes) but every
algorithm, so each crosses process boundaries in both 2 × 2 and 4 × 1 layouts.
"""

from __future__ import annotations

import contextlib
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

from allreduce_jax import ALGORITHMS, distributed
from allreduce_jax.tools import launch
from allreduce_jax.tools.faults import alive

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = [sys.executable, "-m", "allreduce_jax", "launch"]
# special inputs (NaN, ±inf, ±0) included: gloo's pmax/pmin differ from the oracle there,
# which verify reports as backend findings while the hand-written algorithms pass.
QUICK = ["--dtypes", "float32,int32", "--kinds", "verifiable,special"]


def _launch(args: list[str], timeout: float) -> subprocess.CompletedProcess:
  return subprocess.run([*LAUNCH, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


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


@contextlib.contextmanager
def _launched(log_dir: Path, n: int, command: list[str], *, options=(), says="up", ranks=None,
              wait_s=30.0):  # fmt: skip
  """``launch -n N --log-dir LOG_DIR [options] -- command``, running: yields the launcher and
  its processes' pids once each of ``ranks`` (default all) has printed ``says``; on the way
  out the launcher is killed and reaped if it still runs."""
  argv = [*LAUNCH, "-n", str(n), *options, "--log-dir", str(log_dir), "--", *command]
  launcher = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  try:
    pids = _pids(log_dir, n)
    for r in range(n) if ranks is None else ranks:
      _wait_for(log_dir / f"process-{r}.log", says, wait_s=wait_s)
    yield launcher, pids
  finally:
    if launcher.poll() is None:
      launcher.kill()
      launcher.communicate()  # reap it, close its pipes: no ResourceWarning in a later test


def _check_verify(res: subprocess.CompletedProcess, processes: int, devices: int) -> None:
  assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
  out = res.stdout
  assert f"{devices} devices, {processes} process(es)" in out
  assert out.count("# verify:") == 1  # process 0's output only
  assert " 0 failed" in out and "FAIL" not in out
  for algorithm, record in ALGORITHMS.items():
    rows = [line for line in out.splitlines() if line.startswith(algorithm + " ")]
    ok = ("PASS",) if record.hand_written else ("PASS", "backend")
    assert rows and all(line.endswith(ok) for line in rows), algorithm
  for line in out.splitlines():
    if line.startswith("backend finding:"):
      assert re.match(r"backend finding: lax\.p\w+ \w+ p=\d+ \w+ inputs: .*, oracle ", line)
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


@pytest.mark.timeout(240)
def test_bench_a_3_reports_the_slowest_process_with_its_own_spread(tmp_path):
  """``bench -a 3`` on 2 processes: each row is the slowest process's median, tagged so,
  and lies inside its spread (the emulated-cluster sweep once died drawing rows whose
  median came from one process and whose spread from another)."""
  import json

  out = tmp_path / "rows.jsonl"
  bench = ["bench", "--algorithms", "ring,psum", "-b", "4KiB", "-e", "4KiB", "--no-uneven",
           "-n", "3", "-w", "1", "-a", "3", "--out", str(out)]  # fmt: skip
  res = _launch(["-n", "2", "--timeout", "200", "--", *bench], timeout=230)
  assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r["algorithm"] for r in rows] == ["ring", "psum"]
  for r in rows:
    assert r["process_count"] == 2 and r["time_from"] == "max" and r["wrong"] == 0
    assert r["time_us_min"] <= r["time_us"] <= r["time_us_max"]
  assert (tmp_path / "rows.png").stat().st_size > 0  # the figure of these rows was drawn


@pytest.mark.timeout(300)
@pytest.mark.parametrize("local", [1, 2])
def test_backend_oracle_across_processes(tmp_path, local):
  # XLA's own collectives over gloo against the NumPy oracle (jax#40830 reports
  # psum_scatter returning wrong values). A disagreement is a finding: exit 0, and the
  # line says which collective, dtype, how many elements and the first mismatch.
  args = ["-n", "2", "--local-devices", str(local), "--timeout", "240", "--log-dir", str(tmp_path)]
  verify = ["verify", "--backend-oracle", "--dtypes", "float32", "--shapes", "5"]
  res = _launch([*args, "--", *verify, "--kinds", "verifiable,random,special"], timeout=280)
  assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
  out = res.stdout
  p = 2 * local
  assert f"{p} devices, 2 process(es)" in out
  for name in ("psum", "pmean", "pmax", "pmin", "psum_scatter", "all_gather"):
    for kind in ("verifiable", "random", "special"):
      row = rf"^lax\.{name} +float32 +{p} +{kind} +\d+ +\d+ +ok +(agrees|DIFFERS)$"
      assert re.search(row, out, re.M), (name, kind)
  summary = re.search(
    r"^# backend oracle: (\d+) of 18 .* (\d+) differ; hand-written: 0 failed", out, re.M
  )
  assert summary, out
  findings = [line for line in out.splitlines() if line.startswith("backend finding:")]
  assert len(findings) == int(summary.group(2))
  for line in findings:
    assert re.match(
      rf"backend finding: lax\.\w+ float32 p={p} \w+ inputs: \d+ of \d+ elements differ from"
      r" the NumPy oracle.*; shape \[\d+\]: \d+ of \d+ elements differ; first at \[\d+, \d+\]"
      r".*: got \S+, oracle \S+",
      line,
    ), line


@pytest.mark.timeout(180)
def test_killed_participant_stops_the_run(tmp_path):
  verify = ["verify", *QUICK, "--shapes", "13"]
  joined = {"options": ("--timeout", "150"), "says": "# verify:", "ranks": (1,), "wait_s": 90}
  with _launched(tmp_path, 2, verify, **joined) as (launcher, pids):  # joined, mid-run
    os.kill(pids[1], signal.SIGKILL)
    t_kill = time.monotonic()
    _, err = launcher.communicate(timeout=60)
  elapsed = time.monotonic() - t_kill
  err = err.decode()
  assert launcher.returncode == 128 + signal.SIGKILL, err
  assert "process 1 of 2" in err and "SIGKILL" in err, err
  assert elapsed < 20, f"the launcher took {elapsed:.1f} s to stop the run"
  assert not any(alive(p) for p in pids)


def _child(process_1: str) -> str:
  """A child script: join the run, one psum over every device; then process 1 runs
  ``process_1`` (statements) before every process's second psum."""
  head = textwrap.dedent("""
    import os, signal, sys, time
    from allreduce_jax import distributed
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
  """)
  second = 'print("second all-reduce:", f(x).addressable_data(0), flush=True)\n'
  return head + textwrap.indent(textwrap.dedent(process_1).strip(), "  ") + "\n" + second


HANG = _child("""
  print("process 1 is stuck", flush=True)
  time.sleep(1000)  # alive, but never joins the next collective
""")


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
  assert "--timeout 20 s reached: process 1 is stuck outside JAX" in res.stderr, res.stderr
  assert "while process 0 wait(s) for it in a JAX call" in res.stderr
  assert "last output: process 1 is stuck" in res.stderr
  assert "first all-reduce: [2.]" in res.stdout  # the run really started across processes
  assert time.monotonic() - t0 < 60
  assert not any(alive(p) for p in _pids(logs, 2))


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
  # A wrapper (bash -c) whose own child is the real work: both must go, even when
  # the launcher dies by SIGKILL (PR_SET_PDEATHSIG alone reaches only the wrapper).
  wrapper = f"sleep 300 & echo $! > {tmp_path}/grandchild-$ALLREDUCE_JAX_PROCESS_ID; echo up; wait"
  with _launched(tmp_path, 3, ["bash", "-c", wrapper]) as (launcher, pids):
    pids += [int((tmp_path / f"grandchild-{r}").read_text()) for r in range(3)]
    launcher.send_signal(getattr(signal, how))
    _, err = launcher.communicate(timeout=30)
  if how == "SIGINT":
    assert launcher.returncode == 130
    assert b"interrupted" in err
  deadline = time.monotonic() + 10
  while any(alive(p) for p in pids) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not any(alive(p) for p in pids)


def test_a_second_ctrl_c_while_stopping_exits_quietly(tmp_path):
  # Children that ignore SIGTERM keep the launcher in its 3 s grace period, where a
  # second Ctrl-C must kill them at once, without a traceback.
  stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
  stubborn += " print('up', flush=True); time.sleep(300)"
  with _launched(tmp_path, 2, [sys.executable, "-c", stubborn]) as (launcher, pids):
    launcher.send_signal(signal.SIGINT)
    time.sleep(0.5)  # now in the grace period
    launcher.send_signal(signal.SIGINT)
    t = time.monotonic()
    _, err = launcher.communicate(timeout=30)
  assert launcher.returncode == 130, err
  assert b"Traceback" not in err and b"KeyboardInterrupt" not in err, err
  assert time.monotonic() - t < 2.5  # did not sit out the grace period
  assert not any(alive(p) for p in pids)


RAISE = textwrap.dedent(
  """
  import sys, time
  from allreduce_jax import distributed
  distributed.initialize_from_env()
  import jax
  print("joined", flush=True)
  if jax.process_index() == int(sys.argv[1]):
    time.sleep(1)
    raise RuntimeError(f"boom in process {jax.process_index()}")
  time.sleep(300)  # a healthy peer, as if blocked in a collective with the failed one
  """
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rank", [0, 1])
def test_an_uncaught_error_after_initialize_names_that_process_at_once(tmp_path, rank):
  # Without exit_fast_on_error the failed process waits in JAX's shutdown barrier
  # (300 s) and the launcher ends up naming a peer's SIGABRT.
  script = tmp_path / "raise.py"
  script.write_text(RAISE)
  logs = tmp_path / "logs"
  args = ["-n", "2", "--log-dir", str(logs), "--", sys.executable, str(script), str(rank)]
  t0 = time.monotonic()
  res = _launch(args, timeout=100)
  elapsed = time.monotonic() - t0
  assert res.returncode == 1, res.stderr
  assert f"launch: process {rank} of 2" in res.stderr and "exited with status 1" in res.stderr
  assert f"RuntimeError: boom in process {rank}" in res.stdout + res.stderr
  assert elapsed < 60, f"{elapsed:.0f} s"  # seconds of start-up on a busy machine, not 300
  assert not any(alive(p) for p in _pids(logs, 2))


STOP = _child("os.kill(os.getpid(), signal.SIGSTOP)")


@pytest.mark.timeout(120)
def test_a_stopped_process_is_blamed_not_the_peer_that_gave_up(tmp_path):
  script = tmp_path / "stop.py"
  script.write_text(STOP)
  logs = tmp_path / "logs"
  args = ["-n", "2", "--heartbeat-timeout", "5", "--timeout", "90", "--log-dir", str(logs)]
  res = _launch([*args, "--", sys.executable, str(script)], timeout=110)
  assert res.returncode != 0
  assert re.search(r"launch: process 1 \(pid \d+\) of 2 is stopped", res.stderr), res.stderr
  assert not any(alive(p) for p in _pids(logs, 2))


def test_blame_prefers_a_kill_then_an_error_exit_then_sigabrt(tmp_path):
  class P:
    pid = 0

  def child(rank, rc, log="", ended=1.0):
    (tmp_path / f"{rank}.log").write_text(log)
    return launch._Child(rank, P(), tmp_path / f"{rank}.log", rc=rc, ended=ended)

  seen = [child(0, -signal.SIGABRT), child(1, -signal.SIGKILL), child(2, 1)]
  assert min(seen, key=launch._blame_key).rank == 1
  assert min([seen[0], seen[2]], key=launch._blame_key).rank == 2
  # A peer that failed because the other went away is a consequence, even if it died first.
  peer = child(0, 1, "RuntimeError: ... Connection closed by peer [127.0.0.1]:4242", ended=0.9)
  assert launch._culprit([peer, child(1, 7)]).rank == 1
  assert launch._culprit([peer]).rank == 0  # nothing else to name


# Child script: after the first all-reduce, process 1 dies one way while 0 and 2 wait
# for it in the second; the launcher must name process 1, within seconds.
DIE = _child("""
  time.sleep(2)  # the others are inside the second all-reduce by now
  how = sys.argv[1]
  if how == "SIGKILL":
    os.kill(os.getpid(), signal.SIGKILL)
  elif how == "os._exit":
    os._exit(7)
  elif how == "sys.exit":
    sys.exit(3)
""")


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
  "how, status", [("SIGKILL", "was killed by SIGKILL"), ("sys.exit", "exited with status 3")]
)
def test_the_rank_that_died_is_named_not_its_peers(tmp_path, how, status):
  script = tmp_path / "die.py"
  script.write_text(DIE)
  logs = tmp_path / "logs"
  args = ["-n", "3", "--log-dir", str(logs), "--", sys.executable, str(script), how]
  res = _launch(args, timeout=140)
  assert re.search(rf"launch: process 1 of 3 \(pid \d+\) {status} after", res.stderr), res.stderr
  ended = float(re.search(r"after ([\d.]+) s", res.stderr).group(1))
  first = re.search(r"first all-reduce", res.stdout)
  assert first, res.stdout
  assert not any(alive(p) for p in _pids(logs, 3))
  if how == "sys.exit":  # the fast exit: not JAX's 30 s shutdown barrier
    log = (logs / "process-1.log").read_text()
    assert "exiting at once (status 3)" in log, log
  assert ended < 100


def test_timeout_frame_parsing():
  dump = textwrap.dedent(
    """
    Thread 0x00007f01 (most recent call first):
      File "/x/threading.py", line 331 in wait
      File "/x/threading.py", line 1002 in _bootstrap
    Current thread 0x00007f02 (most recent call first):
      File "/site-packages/jax/_src/array.py", line 9 in _value
      File "/x/hang.py", line 17 in <module>
    """
  )
  frame = launch._main_thread_top(dump)
  assert frame == 'File "/site-packages/jax/_src/array.py", line 9 in _value'
  assert launch._in_jax(frame) and not launch._in_jax('File "/x/hang.py", line 17 in <module>')


def _env_process0(port: int, names: str = "ours") -> dict:
  env = {k: v for k, v in os.environ.items() if not k.startswith(("ALLREDUCE_JAX_", "JAX_"))}
  env["JAX_PLATFORMS"] = "cpu"
  if names == "ours":
    env.update(
      {
        distributed.ENV_COORDINATOR: f"127.0.0.1:{port}",
        distributed.ENV_NUM_PROCESSES: "2",
        distributed.ENV_PROCESS_ID: "0",
        distributed.ENV_INIT_TIMEOUT: "30",
      }
    )
  else:
    env.update(
      {
        "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
        "JAX_NUM_PROCESSES": "2",
        "JAX_PROCESS_ID": "0",
      }
    )
  return env


@pytest.mark.parametrize("names", ["ours", "jax"])
def test_busy_coordinator_port_with_environment_variables_is_one_line(names):
  # docs/distributed.md's set-up without the launcher: JAX's coordinator used to
  # crash with SIGSEGV (exit 139) on a taken port.
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    res = subprocess.run(
      [sys.executable, "-m", "allreduce_jax", "verify", "--devices", "1"],
      cwd=ROOT,
      env=_env_process0(port, names),
      capture_output=True,
      text=True,
      timeout=60,
    )
  assert res.returncode == 1, res.stderr[-2000:]
  lines = res.stderr.strip().splitlines()
  assert len(lines) == 1 and f"127.0.0.1:{port}: port {port} is already in use" in lines[0]


def test_coordinator_listens_on_loopback_only():
  port = launch.free_port()
  script = "from allreduce_jax import distributed; distributed.initialize_from_env()"
  proc = subprocess.Popen(
    [sys.executable, "-c", script],
    cwd=ROOT,
    env=_env_process0(port),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  try:
    deadline, listening = time.monotonic() + 60, []
    while not listening and time.monotonic() < deadline:
      listening = _listeners(port)
      time.sleep(0.1)
  finally:
    proc.kill()
    proc.wait()
  loopback = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1, v4 or v4-mapped v6
  assert listening and set(listening) <= loopback, listening  # not 0.0.0.0 or [::]


def _listeners(port: int) -> list[str]:
  """Local addresses (hex, as in /proc/net/tcp*) listening on ``port``."""
  found = []
  for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
      rows = Path(table).read_text().splitlines()[1:]
    except OSError:
      continue
    for row in rows:
      local, state = row.split()[1], row.split()[3]
      host, _, hexport = local.partition(":")
      if state == "0A" and int(hexport, 16) == port:
        found.append(host)
  return found


def test_bad_arguments_are_named(tmp_path):
  cases = [
    ({"num_processes": 0}, "-n/--num-processes must be at least 1"),
    ({"local_devices": 0}, "--local-devices must be at least 1"),
    ({"coordinator": "localhost"}, "--coordinator 'localhost'"),
    ({"timeout": -1}, "--timeout: must be more than 0 seconds, got -1"),
    ({"timeout": float("nan")}, "--timeout: expected a finite number of seconds, got nan"),
    ({"init_timeout": 0}, "--init-timeout must be at least 1, got 0"),
    ({"shutdown_timeout": 0}, "--shutdown-timeout must be at least 1"),
    ({"heartbeat_timeout": 0}, "--heartbeat-timeout must be at least 1"),
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


def test_launching_from_a_process_where_jax_runs_does_not_fork_it(tmp_path):
  # The report runs `cluster` in-process after its other sections, so JAX runs here
  # (conftest started it) when the launcher starts its children: they must start
  # without a fork of this process (JAX's at-fork hook warns that it may deadlock;
  # preexec_fn forced one) and still get SIGKILL when their launcher dies.
  import io
  import warnings

  import jax

  jax.devices()
  child = (
    "import ctypes; sig = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(sig));"
    " print('pdeathsig', sig.value)"
  )  # PR_GET_PDEATHSIG
  out = io.StringIO()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    rc = launch.launch([sys.executable, "-c", child], 2, log_dir=tmp_path, output="all",
                       timeout=60, out=out, err=io.StringIO())  # fmt: skip
  assert rc == 0
  assert [str(w.message) for w in caught if "fork" in str(w.message)] == []
  assert sorted(out.getvalue().splitlines()) == [
    f"[{r}] pdeathsig {int(signal.SIGKILL)}" for r in (0, 1)
  ]
  with pytest.raises(launch.LaunchError, match="cannot start 'no-such-program-here'"):
    launch.launch(["no-such-program-here"], 1, log_dir=tmp_path)


@pytest.mark.parametrize("code", [0, 3])
def test_own_log_folder_removed_after_success_kept_after_failure(code):
  # Without --log-dir the launcher makes a temporary folder: a run that succeeds leaves
  # nothing behind; one that fails keeps each process's log and names the folder again.
  import io
  import shutil

  err = io.StringIO()
  child = f"import os, sys; print('rank', os.environ['ALLREDUCE_JAX_PROCESS_ID']); sys.exit({code})"
  rc = launch.launch([sys.executable, "-c", child], 2, timeout=60, out=io.StringIO(), err=err)
  banner = re.search(r"logs in (\S+) \(removed if every process succeeds\)", err.getvalue())
  assert banner, err.getvalue()
  logs = Path(banner.group(1))
  try:
    assert rc == code
    if code == 0:
      assert not logs.exists()
    else:
      assert f"each process's log is kept in {logs}" in err.getvalue()
      assert (logs / "process-0.log").read_text().strip() == "rank 0"
  finally:
    shutil.rmtree(logs, ignore_errors=True)


def test_the_host_jax_declares_unhealthy_is_named_not_the_survivor_that_aborted(tmp_path):
  """Under a launcher whose child is not the JAX process itself (a host's namespace, a
  wrapper), a stopped process is not seen stopped; JAX's coordination service names it in the
  survivors' logs, and the launcher names that rank, not the first survivor to abort."""
  said = (
    "E1205 03:27:56.113074 4841 coordination_service.cc:1549] Use error polling to propagate"
    " the following error to all tasks: UNAVAILABLE: The following tasks are unhealthy"
    " (stopped sending heartbeats):\n2\nThe tasks have crashed.\n"  # JAX 0.10's form
  )
  children = []
  for rank in range(4):
    log = tmp_path / f"process-{rank}.log"
    log.write_text(said if rank == 0 else "")
    if rank == 2:  # alive (a wrapper whose JAX process is stopped elsewhere)
      proc = subprocess.Popen(["sleep", "30"])
    else:  # the survivors: aborted by JAX's error polling
      proc = subprocess.Popen([sys.executable, "-c", "import os; os.abort()"])
    children.append(launch._Child(rank=rank, proc=proc, log=log))
  try:
    t0 = time.monotonic()
    while any(c.proc.poll() is None for c in children if c.rank != 2):
      time.sleep(0.05)
    newly = launch._reap(children, t0)
    message, _ = launch._failure(children, newly, t0)
  finally:
    children[2].proc.kill()
    children[2].proc.wait()
  assert message.startswith("process 2 (pid "), message
  assert "of 4 stopped answering; JAX's heartbeat check gave up on it" in message
  assert launch.unhealthy_ranks(said) == [2]
  # with no such line, the first survivor to abort is named, as before
  (tmp_path / "process-0.log").write_text("")
  for c in children:
    c.rc = c.ended = None
  children[2].proc = subprocess.Popen(["true"])
  children[2].proc.wait()
  children[2].rc, children[2].ended = 0, 0.0
  for c in children:
    if c.rank != 2:
      c.rc, c.ended = -signal.SIGABRT, 1.0
  message, _ = launch._failure(children, [c for c in children if c.rank != 2], t0)
  assert message.startswith("process 0 of 4"), message
