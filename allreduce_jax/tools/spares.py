"""Spare processes: a restart that does not wait for Python and JAX to start.

A restarted job's processes spend seconds before they join the run: Python starts, imports
JAX and the subcommand, the subcommand loads its data. A **spare** does all of that ahead
of time. ``launch|cluster --restarts N`` keeps one spare per host: the same command, in
the same place, started with ``$ALLREDUCE_JAX_SPARE`` set, so ``allreduce-jax`` imports the
subcommand, runs its ``prepare(args)`` if it has one (``train sync``: the data, orbax) and
then waits on its standard input (:func:`wait_if_spare`). When the job restarts, the
launcher hands each spare its process's environment (coordinator, rank, progress file)
and log file in one line (:meth:`Spares.take`); the spare sets them and goes on as if it
had just started, into ``jax.distributed.initialize``. The launcher refills the spares once
the restarted job has made its first step (:meth:`Spares.refill`), so that their start
does not slow the restart's own.

A spare's start costs seconds of CPU (Python, JAX, the data), and on hosts whose cores the
job keeps busy that slows the job's steps while it lasts, at every restart. So a taken
spare first **forks its successor**: a copy of itself, made before it becomes the job's
process, that waits for the next line on the same pipe (:func:`wait_if_spare`). A refill
then costs a fork, not a start. The first attempt's processes are spares too, started at
the launcher's priority and taken at once, so no spare starts beside a running job
(unless a successor died).
The launcher becomes the successors' parent once the job's processes that forked them
have gone (it is their subreaper), so it can reap them as its own children.

Where cores are shared, a spare's start (Python, JAX, the data: seconds of CPU) would slow
the running job's steps. So a spare starts at idle priority (``SCHED_IDLE``, nice 19: it
runs only on a core that nothing else wants) and, when taken, raises every one of its
threads back to the launcher's priority (:func:`wait_if_spare`). Raising needs
``CAP_SYS_NICE`` (root); where the launcher cannot raise a thread's priority, spares start
at its own priority instead (:func:`can_raise_priority`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from allreduce_jax import progress
from allreduce_jax.tools._proc import die_with_parent

ENV_SPARE = "ALLREDUCE_JAX_SPARE"

#: The nice value a spare waits at (with ``SCHED_IDLE``).
IDLE_NICE = 19

#: Execs ``argv`` at idle priority: ``SCHED_IDLE`` and nice 19 (inherited by its threads).
_AT_IDLE = """
import os, sys
os.setpriority(os.PRIO_PROCESS, 0, int(sys.argv[1]))
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
os.execvp(sys.argv[2], sys.argv[2:])
"""


def at_idle(argv: list[str]) -> list[str]:
  """``argv`` run at idle priority (``SCHED_IDLE``, nice :data:`IDLE_NICE`)."""
  return [sys.executable, "-S", "-c", _AT_IDLE, str(IDLE_NICE), *argv]


@functools.cache
def can_raise_priority() -> bool:
  """Whether this process may take a thread out of ``SCHED_IDLE`` and nice 19 back to its
  own priority (root, ``CAP_SYS_NICE``): tried on a thread of its own that then ends."""
  if not hasattr(os, "SCHED_IDLE"):
    return False
  policy, nice, ok = os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0), []

  def probe():
    tid = threading.get_native_id()
    try:
      os.setpriority(os.PRIO_PROCESS, tid, IDLE_NICE)
      os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
      os.sched_setscheduler(tid, policy, os.sched_param(0))
      os.setpriority(os.PRIO_PROCESS, tid, nice)
      ok.append(True)
    except OSError:
      pass

  thread = threading.Thread(target=probe)
  thread.start(), thread.join()
  return bool(ok)


def raise_priority(policy: int, nice: int) -> None:
  """Every thread of this process to scheduling ``policy`` and ``nice`` (a taken spare:
  the launcher's own)."""
  for tid in os.listdir("/proc/self/task"):
    with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
      os.sched_setscheduler(int(tid), policy, os.sched_param(0))
      os.setpriority(os.PRIO_PROCESS, int(tid), nice)


#: ``prctl`` option: orphaned descendants are reparented to this process (not init).
_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
  """Makes this process the parent of its orphaned descendants (Linux); False elsewhere."""
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
  except (OSError, AttributeError):
    return False


def _state(pid: int) -> str:
  """The state letter of process ``pid`` (``Z``: a zombie), or "" if it is gone."""
  try:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
  except (OSError, IndexError):
    return ""


class Successor:
  """A spare forked by a taken one (:func:`wait_if_spare`): what the launcher needs of a
  :class:`subprocess.Popen` (``pid``, ``stdin``, ``poll``, ``wait``, ``returncode``).
  It is reaped as a child once the process that forked it has gone (the launcher is its
  subreaper); until then it is running while ``/proc`` has it."""

  def __init__(self, pid: int, stdin):
    self.pid, self.stdin, self.returncode = pid, stdin, None

  def poll(self) -> int | None:
    if self.returncode is None:
      try:
        pid, status = os.waitpid(self.pid, os.WNOHANG)
      except ChildProcessError:  # not ours yet (its parent lives) or reaped elsewhere
        if _state(self.pid) in ("", "Z"):
          self.returncode = -9
        return self.returncode
      if pid:
        self.returncode = os.waitstatus_to_exitcode(status)
    return self.returncode

  def wait(self, timeout: float | None = None) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    while self.poll() is None:
      if deadline is not None and time.monotonic() > deadline:
        raise subprocess.TimeoutExpired(str(self.pid), timeout)
      time.sleep(0.01)
    return self.returncode


class Spares:
  """One spare process per host, for the next attempt of a restarting job.

  ``argv``: the command; ``env``: the environment every spare starts with (what the
  job's processes share: ``JAX_PLATFORMS``, the compilation cache...);
  ``host_argv(host)``: the prefix that runs a process on that host (None: here);
  ``logs``: where each spare writes until it is taken (``spare-H.log``). Spares wait at
  idle priority where the launcher can raise them back (:func:`can_raise_priority`);
  ``fork``: a taken spare forks its successor (where this process can be the
  successors' subreaper), so a refill starts nothing.
  """

  def __init__(
    self,
    argv: list[str],
    env: dict[str, str],
    hosts: list[int],
    logs: Path,
    host_argv: Callable[[int], list[str]] | None = None,
    fork: bool = True,
  ):
    self.argv, self.env, self.hosts, self.logs = argv, env, list(hosts), Path(logs)
    self.host_argv = host_argv
    self.ready: dict[int, subprocess.Popen | Successor] = {}
    self.pipes: dict[int, object] = {}  # host -> the pipe its spares read their lines from
    self.started = self.forked = 0
    self.idle = can_raise_priority()
    self.fork = fork and hasattr(os, "fork") and become_subreaper()

  def refill(self, hosts: list[int] | None = None, idle: bool = True) -> None:
    """A spare on every host of ``hosts`` (default: all) that has none: the successor its
    last taken spare forked, or else one started (at idle priority where it can be raised
    back, unless not ``idle``: spares to be taken at once)."""
    self.logs.mkdir(parents=True, exist_ok=True)
    for host in self.hosts if hosts is None else hosts:
      spare = self.ready.get(host)
      if spare is not None and spare.poll() is None:
        continue
      if (successor := self._successor(host)) is not None:
        self.ready[host] = successor
        self.forked += 1
        continue
      prefix = self.host_argv(host) if self.host_argv else []
      argv = at_idle(self.argv) if self.idle and idle else self.argv
      with open(self.logs / f"spare-{host}.log", "ab") as log:
        self.ready[host] = subprocess.Popen(
          die_with_parent([*prefix, *argv]),
          env={**self.env, ENV_SPARE: "1"},
          stdin=subprocess.PIPE,
          stdout=log,
          stderr=subprocess.STDOUT,
          start_new_session=True,
        )
      self.pipes[host] = self.ready[host].stdin
      self.started += 1

  def _successor(self, host: int) -> Successor | None:
    """The spare the last taken one of ``host`` forked, if it wrote its pid and lives."""
    path = self.logs / f"successor-{host}"
    try:
      pid = int(path.read_text())
    except (OSError, ValueError):
      return None
    path.unlink()
    successor = Successor(pid, self.pipes[host])
    return successor if successor.poll() is None else None

  def take(self, host: int, env: dict[str, str], log: Path) -> subprocess.Popen | None:
    """The spare of ``host``, told to go on as a process with ``env`` writing to
    ``log``: the spare ready there, or else the successor its last taken spare forked (no
    refill adopted it: the attempt failed before its first step); None if it has none (or
    it died)."""
    spare = self.ready.pop(host, None)
    if spare is None or spare.poll() is not None:
      spare = self._successor(host)
      if spare is None:
        return None
      self.forked += 1
    go = {"env": env, "log": str(log)}
    if self.idle:  # back to the launcher's priority
      go["priority"] = [os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)]
    if self.fork:  # the successor reads the next line from the same pipe
      go["successor"] = str(self.logs / f"successor-{host}")
    go = json.dumps(go) + "\n"
    try:
      spare.stdin.write(go.encode())
      spare.stdin.flush() if self.fork else spare.stdin.close()
    except OSError:
      return None
    return spare

  def close(self) -> None:
    """Kills the spares not taken (and successors forked since the last refill) and
    closes their pipes."""
    for spare in self.ready.values():
      with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(spare.pid, 9)
      spare.wait()
    for pipe in self.pipes.values():
      with contextlib.suppress(OSError, ValueError):
        pipe.close()
    self.ready.clear()
    for host in self.pipes:  # successors forked since the last refill
      if (successor := self._successor(host)) is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
          os.killpg(successor.pid, 9)
        with contextlib.suppress(subprocess.TimeoutExpired):
          successor.wait(5)


def wait_if_spare(module, args) -> None:
  """In a spare (``$ALLREDUCE_JAX_SPARE``): runs ``module.prepare(args)`` if the
  subcommand has one, then waits for the launcher's line (the environment and log file of
  the process it becomes and, where it waited at idle priority, the priority to raise its
  threads to), applies it and returns. Elsewhere: returns at once."""
  if os.environ.get(ENV_SPARE, "") in ("", "0"):
    return
  prepare = getattr(module, "prepare", None)
  if prepare is not None:
    prepare(args)
  while True:
    line = sys.stdin.readline()
    if not line:  # the launcher went away without taking this spare
      os._exit(0)
    go = json.loads(line)
    if "successor" not in go or not _forked_successor(go["successor"]):
      break
  if "priority" in go:
    raise_priority(*go["priority"])
  for key in [k for k in os.environ if k.startswith("ALLREDUCE_JAX_") and k not in go["env"]]:
    del os.environ[key]
  os.environ.update(go["env"])
  os.environ.pop(ENV_SPARE, None)
  sys.stdout.flush(), sys.stderr.flush()
  fd = os.open(go["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
  os.dup2(fd, 1), os.dup2(fd, 2)
  os.close(fd)
  progress.reset()  # the report file is this process's now
  progress.phase("taken")


def _forked_successor(path: str) -> bool:
  """Forks this spare's successor: True in it (a spare in a session of its own, at this
  priority, waiting for the next line); in the taken one, writes the successor's pid to
  ``path`` for the launcher, leaves the pipe to it and returns False."""
  pid = os.fork()
  if pid == 0:
    os.setsid()
    return True
  tmp = f"{path}.tmp"
  Path(tmp).write_text(str(pid))
  os.replace(tmp, path)
  fd = os.open(os.devnull, os.O_RDONLY)
  os.dup2(fd, 0)
  os.close(fd)
  return False
