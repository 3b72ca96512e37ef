"""A private, real SLURM on this machine, started for one command and removed after.

    python -m allreduce_jax.tools.slurm_local [--cpus 4] -- srun -n 4 allreduce-jax verify

Starts Debian's ``munged`` (its own key, made by ``mungekey``, and its own socket),
``slurmctld`` and ``slurmd`` (``slurm-wlm``), all in one new temp folder (configuration,
key, state, spool, logs), runs the command with ``SLURM_CONF`` naming that configuration
(so ``srun``, ``sbatch``, ``sinfo`` talk to this SLURM and to no other), then stops the
daemons and every process they started and removes the folder. A job's tasks are JAX
processes that join through JAX's SLURM detection (:mod:`allreduce_jax.distributed`).

:class:`Slurm` also runs one ``slurmd`` per host of the emulated cluster
(``allreduce-jax cluster --launcher slurm``): each :class:`Node` carries the command
prefix that runs a program on its host (its network namespace, its host name).

No systemd, no cgroups: ``proctrack/linuxproc``, ``task/none``, no accounting. Needs root
(the daemons run as root and so do the jobs). Ports and the first job id are drawn at
random, so runs on one machine do not meet (JAX's SLURM coordinator port is
``61440 + job id % 4096``).

Nothing is left behind: every daemon and every process of a job carries a marker in its
environment (:data:`ENV_MARK`, the folder), and :meth:`Slurm.stop` kills each process
that has it (slurmd's step daemons, ``slurmstepd``, leave slurmd's process tree). A
watchdog process does the same and removes the folder if the process that started them
dies, even by SIGKILL. Importing this module runs nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

#: Every process of a private SLURM (daemons, step daemons, tasks) has this variable,
#: set to the SLURM's folder; how :meth:`Slurm.stop` and the watchdog find them.
ENV_MARK = "ALLREDUCE_JAX_SLURM"

TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "srun", "scontrol", "sinfo")


class SlurmError(RuntimeError):
  """The private SLURM cannot start (missing tools or privilege, a daemon that fails);
  the message is one line saying what is needed."""


def problem() -> str | None:
  """Why a private SLURM cannot run here (one line), or None."""
  missing = [t for t in TOOLS if shutil.which(t) is None]
  if missing:
    return (
      f"needs {', '.join(missing)} on PATH (Debian: apt-get install slurm-wlm munge;"
      " slurmctld and slurmd live in /usr/sbin)."
    )
  if os.geteuid() != 0:
    return "needs root: slurmd runs the job's tasks as their user, which only root may."
  return None


@dataclass(frozen=True)
class Node:
  """One SLURM node: its host ``name`` (what the job's node list says, and what JAX
  connects to for the coordinator), its ``address``, and ``enter``, the command prefix
  that runs a program on that host (empty: this machine as it is)."""

  name: str
  address: str
  enter: tuple[str, ...] = ()


def _free_ports(k: int) -> list[int]:
  """``k`` distinct ports in 20000..59999 (below JAX's 61440.. and Linux's ephemeral range)."""
  return random.sample(range(20000, 60000), k)


def config(folder: Path, nodes: list[Node], cpus: int, controller: Node) -> str:
  """The ``slurm.conf`` text of a private SLURM in ``folder``: ``controller`` runs
  slurmctld, each of ``nodes`` a slurmd with ``cpus`` CPUs (taken as configured, not
  as detected, so a small machine can run many tasks)."""
  ctl_port, d_port = _free_ports(2)
  first_job = random.randrange(1000, 1_000_000)
  lines = [
    "ClusterName=allreducejax",
    f"SlurmctldHost={controller.name}({controller.address})",
    "SlurmUser=root",
    "SlurmdUser=root",
    "AuthType=auth/munge",
    "CredType=cred/munge",
    f"AuthInfo=socket={folder / 'munge.socket'}",
    f"SlurmctldPort={ctl_port}",
    f"SlurmdPort={d_port}",
    f"FirstJobId={first_job}",
    f"StateSaveLocation={folder / 'state'}",
    f"SlurmdSpoolDir={folder / 'spool-%n'}",
    f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
    f"SlurmdPidFile={folder / 'slurmd-%n.pid'}",
    f"SlurmctldLogFile={folder / 'slurmctld.log'}",
    f"SlurmdLogFile={folder / 'slurmd-%n.log'}",
    "ProctrackType=proctrack/linuxproc",
    "TaskPlugin=task/none",
    "JobAcctGatherType=jobacct_gather/none",
    "AccountingStorageType=accounting_storage/none",
    "SchedulerType=sched/builtin",
    "SelectType=select/cons_tres",
    "SelectTypeParameters=CR_CPU",
    "SlurmdParameters=config_overrides",
    "ReturnToService=2",
    "MpiDefault=none",
    "KillWait=2",
    "InactiveLimit=0",
    "SlurmctldTimeout=30",
    "SlurmdTimeout=30",
  ]
  for n in nodes:
    lines.append(f"NodeName={n.name} NodeAddr={n.address} CPUs={cpus} State=UNKNOWN")
  lines.append("PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
  return "\n".join(lines) + "\n"


# The watchdog: its own session (Ctrl-C does not reach it); if its stdin reaches EOF
# without "done" (whoever started the SLURM died, even by SIGKILL), it kills every
# process marked with the folder and removes the folder. Standalone: imports nothing of ours.
_WATCHDOG = """
import os, shutil, signal, sys
folder = sys.argv[1]
for line in sys.stdin:
  if line.strip() == "done":
    sys.exit(0)
mark = ("ALLREDUCE_JAX_SLURM=" + folder).encode()
for _ in range(3):
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      if mark in open(f"/proc/{pid}/environ", "rb").read().split(b"\\0"):
        os.kill(int(pid), signal.SIGKILL)
    except OSError:
      pass
shutil.rmtree(folder, ignore_errors=True)
"""


def marked(folder: str | os.PathLike) -> list[int]:
  """Live processes whose environment carries :data:`ENV_MARK` = ``folder``, or whose
  command line names the folder (this process excluded)."""
  mark, name = f"{ENV_MARK}={folder}".encode(), str(folder).encode()
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    with contextlib.suppress(OSError):
      if int(pid) == os.getpid():
        continue
      environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
      if mark in environ or name in Path(f"/proc/{pid}/cmdline").read_bytes():
        found.append(int(pid))
  return found


def leftovers(folder: str | os.PathLike) -> list[str]:
  """What a private SLURM in ``folder`` left: its folder, its processes."""
  found = [f"folder {folder}"] if Path(folder).exists() else []
  return found + [f"process {pid}" for pid in marked(folder)]


class Slurm:
  """A private SLURM: :meth:`start` it, run ``srun`` with :attr:`env`, :meth:`stop` it
  (also as a context manager). ``nodes``: one slurmd each (default: this machine as
  ``localhost``); ``controller``: where slurmctld runs (default the first node);
  ``cpus``: CPUs each node offers; ``enter_srun``: the prefix :meth:`srun_argv` puts
  before ``srun`` (the controller's host)."""

  def __init__(self, nodes: list[Node] | None = None, cpus: int = 8, controller=None):
    why = problem()
    if why:
      raise SlurmError(why)
    if cpus < 1:
      raise ValueError(f"--cpus must be at least 1, got {cpus}.")
    self.nodes = list(nodes or [Node("localhost", "127.0.0.1")])
    self.controller = controller or self.nodes[0]
    self.cpus = cpus
    self.folder: Path | None = None
    self._daemons: list[tuple[str, subprocess.Popen]] = []
    self._watchdog: subprocess.Popen | None = None

  @property
  def env(self) -> dict[str, str]:
    """The environment for ``srun``/``sinfo`` (and the tasks they start)."""
    return {**os.environ, "SLURM_CONF": str(self.folder / "slurm.conf"), ENV_MARK: str(self.folder)}

  def __enter__(self) -> Slurm:
    self.start()
    return self

  def __exit__(self, *exc) -> None:
    self.stop()

  def start(self, timeout: float = 60) -> None:
    """Writes the key and the configuration, starts munged, slurmctld and the slurmds,
    and waits until every node is idle; ``SlurmError`` (everything stopped) if not
    within ``timeout`` seconds."""
    # Unix socket addresses hold 108 bytes: munged's socket and each step's socket in the
    # slurmd spool folder (``spool-NODE/NODE_JOBID.STEP``) must fit, so a long TMPDIR
    # (pytest's per-worker folders) gives way to /tmp.
    base = tempfile.gettempdir()
    self.folder = Path(
      tempfile.mkdtemp(prefix="allreduce-jax-slurm-", dir=base if len(base) <= 20 else "/tmp")
    )
    self._watchdog = subprocess.Popen(
      [sys.executable, "-c", _WATCHDOG, str(self.folder)],
      stdin=subprocess.PIPE,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
      start_new_session=True,
    )
    try:
      self._start(timeout)
    except BaseException:
      self.stop()
      raise

  def _start(self, timeout: float) -> None:
    f = self.folder
    (f / "state").mkdir()
    for n in self.nodes:
      (f / f"spool-{n.name}").mkdir()
    key = f / "munge.key"
    _check_run(["mungekey", "-c", "-k", str(key)], "mungekey")
    (f / "slurm.conf").write_text(config(f, self.nodes, self.cpus, self.controller))
    self._spawn(
      "munged",
      [
        "munged", "-F", "-f", f"--socket={f / 'munge.socket'}", f"--key-file={key}",
        f"--pid-file={f / 'munged.pid'}", f"--log-file={f / 'munged.log'}",
        f"--seed-file={f / 'munged.seed'}",
      ],
    )  # fmt: skip
    _wait_for(lambda: (f / "munge.socket").exists(), 10, "munged did not open its socket", self)
    conf = str(f / "slurm.conf")
    self._spawn("slurmctld", [*self.controller.enter, "slurmctld", "-D", "-f", conf])
    for n in self.nodes:
      self._spawn(f"slurmd {n.name}", [*n.enter, "slurmd", "-D", "-f", conf, "-N", n.name])
    _wait_for(self._all_idle, timeout, "the nodes did not become idle", self)

  def _spawn(self, name: str, argv: list[str]) -> None:
    log = open(self.folder / f"{name.replace(' ', '-')}.out", "wb")
    with log:
      proc = subprocess.Popen(
        argv,
        env=self.env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
      )
    self._daemons.append((name, proc))

  def _all_idle(self) -> bool:
    for name, proc in self._daemons:
      if proc.poll() is not None:
        raise SlurmError(f"{name} exited with status {proc.returncode}: {self._tail(name)}")
    res = subprocess.run(
      [*self.controller.enter, "sinfo", "-h", "-N", "-o", "%N %t"],
      env=self.env,
      capture_output=True,
      text=True,
      timeout=30,
    )
    states = dict(line.split() for line in res.stdout.splitlines() if line.strip())
    return res.returncode == 0 and all(states.get(n.name) == "idle" for n in self.nodes)

  def _tail(self, name: str) -> str:
    for path in (f"{name.replace(' ', '-')}.out", f"{name.split()[0]}.log"):
      with contextlib.suppress(OSError):
        lines = (self.folder / path).read_text(errors="replace").strip().splitlines()
        if lines:
          return lines[-1]
    return "(no output)"

  def srun_argv(self, *args: str) -> list[str]:
    """``srun ARGS`` as it runs on the controller's host."""
    return [*self.controller.enter, "srun", *args]

  def stop(self) -> list[str]:
    """Cancels every job, stops the daemons and every process of theirs, removes the
    folder. Returns what could not be removed (empty when all is gone)."""
    if self.folder is None:
      return []
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
      if any(name == "slurmctld" and p.poll() is None for name, p in self._daemons):
        subprocess.run([*self.controller.enter, "scancel", "--full", "-u", "root"], env=self.env, capture_output=True,
                       timeout=10)  # fmt: skip
    for _, proc in reversed(self._daemons):
      if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
          os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for _, proc in self._daemons:
      try:
        proc.wait(max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
          os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    watchdog = {self._watchdog.pid} if self._watchdog is not None else set()
    for _ in range(50):  # step daemons and tasks: not in the daemons' process groups
      pids = set(marked(self.folder)) - watchdog
      if not pids:
        break
      for pid in pids:
        with contextlib.suppress(ProcessLookupError):
          os.kill(pid, signal.SIGKILL)
      time.sleep(0.1)
    if self._watchdog is not None:
      with contextlib.suppress(OSError, ValueError, subprocess.TimeoutExpired):
        self._watchdog.stdin.write(b"done\n")
        self._watchdog.stdin.close()
        self._watchdog.wait(5)
    shutil.rmtree(self.folder, ignore_errors=True)
    left = leftovers(self.folder)
    self._daemons = []
    return left


def _check_run(argv: list[str], what: str) -> None:
  res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
  if res.returncode != 0:
    why = (res.stderr.strip().splitlines() or [f"status {res.returncode}"])[-1]
    raise SlurmError(f"{what} failed: {why}")


def _wait_for(ready, timeout: float, what: str, slurm: Slurm) -> None:
  deadline = time.monotonic() + timeout
  while not ready():
    if time.monotonic() > deadline:
      raise SlurmError(f"{what} within {timeout:g} s (slurmctld: {slurm._tail('slurmctld')})")
    time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog="python -m allreduce_jax.tools.slurm_local",
    description="run COMMAND (srun ..., sbatch --wait ...) against a private SLURM on this"
    " machine, started for it and removed after",
  )
  parser.add_argument("--cpus", type=int, default=8, help="CPUs the node offers (default 8)")
  parser.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command")
  args = parser.parse_args(argv)
  command = args.command[1:] if args.command[:1] == ["--"] else args.command
  if not command:
    parser.error("give the command after '--', e.g. -- srun -n 2 allreduce-jax verify")
  try:
    slurm = Slurm(cpus=args.cpus)
    slurm.start()
  except (SlurmError, ValueError) as e:
    print(f"slurm_local: {e}", file=sys.stderr)
    return 2
  try:
    print(
      f"# slurm_local: SLURM up ({len(slurm.nodes)} node(s), {args.cpus} CPUs) in {slurm.folder}",
      file=sys.stderr,
      flush=True,
    )
    return subprocess.run(command, env=slurm.env).returncode
  except KeyboardInterrupt:
    return 130
  finally:
    left = slurm.stop()
    if left:
      print(f"slurm_local: could not remove {', '.join(left)}", file=sys.stderr)


if __name__ == "__main__":
  sys.exit(main())
