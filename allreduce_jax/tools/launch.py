"""``allreduce-jax launch``: run a subcommand on n local ``jax.distributed`` processes.

    allreduce-jax launch -n 4 [--local-devices 2] [--coordinator 127.0.0.1:PORT] \\
        [--timeout SECONDS] [--log-dir DIR] [--output 0|all|none] -- verify ...

Starts n processes on this machine, each with ``--local-devices`` emulated CPU
devices (p = n × local devices), joined into one JAX runtime through a coordinator
on process 0 (loopback, a free port unless ``--coordinator`` names one; gloo moves
the data between processes). The command after ``--`` is an ``allreduce-jax``
subcommand (``verify``, ``bench``, ``train``...) or any program that calls
:func:`allreduce_jax.distributed.initialize_from_env` itself.

The launcher watches its children. When one exits with an error or is killed, it
stops the others and exits non-zero naming that process: the first to die among
those whose failure is not a consequence of another's (peers of a dead process fail
within milliseconds with gloo's "Connection closed by peer" or JAX's SIGABRT; the
launcher collects exits for half a second before it names one, unless one was killed by a
signal other than SIGABRT, which no peer's failure causes; within one poll a kill
by SIGKILL/SIGSEGV/SIGINT comes before an error exit), or a stopped one (SIGSTOP)
that the others gave up on. An uncaught exception or a non-zero ``sys.exit`` in a
child ends it at once (:func:`allreduce_jax.distributed.exit_fast_on_error`), not
after JAX's shutdown barrier. ``--timeout`` ends a run whose participants are alive
but stuck (a JAX multi-host failure mode, jax#38503), naming the process that is not
waiting inside JAX (from a ``SIGUSR1`` stack dump). Each child runs in its own
process group, which a watchdog process kills if the launcher dies, even by
SIGKILL (and Linux ``PR_SET_PDEATHSIG`` kills the child itself), so nothing outlives
a success, a failure or Ctrl-C. Every process's output goes to
``DIR/process-R.log``; process 0's is also shown.

The no-progress watchdog (:mod:`allreduce_jax.tools.watchdog`, ``--watchdog``, on by
default) reads each process's progress reports (``DIR/progress-R``) and ends a run that
stops progressing within seconds, naming the process to blame and why (stopped, its link
down, stuck outside JAX, behind). A failed run's survivors are killed at once.

``--restarts N`` starts the whole job again after a failure, up to N times (torchrun's
``--max-restarts``; ``train sync --checkpoint-dir`` resumes from its newest checkpoint),
``--elastic`` on the processes that did not fail (:func:`launch_restarting`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from allreduce_jax import distributed, progress
from allreduce_jax.tools import engines, watchdog
from allreduce_jax.tools import spares as spare_pool
from allreduce_jax.tools._args import nonnegative_int, output_dir, positive_int, positive_seconds
from allreduce_jax.tools._proc import LaunchError as LaunchError
from allreduce_jax.tools._proc import command_argv as command_argv
from allreduce_jax.tools._proc import die_with_parent as die_with_parent
from allreduce_jax.units import seconds_problem

POLL_S = 0.05

#: Set in every process that ``--elastic`` starts: a restart may have fewer processes
#: than the first run (``train sync`` then trains on the devices left).
ENV_ELASTIC = "ALLREDUCE_JAX_ELASTIC"
#: The attempt a process belongs to: 0, then 1.. for each ``--restarts`` restart.
ENV_RESTART = "ALLREDUCE_JAX_RESTART"


def parse_coordinator(text: str) -> tuple[str, int]:
  """``HOST:PORT`` -> ``(host, port)``; ``ValueError`` naming ``--coordinator``."""
  host, sep, port = text.rpartition(":")
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(f"--coordinator {text!r}: expected HOST:PORT with a port in 1..65535.")
  return host.strip("[]"), int(port)


def free_port(host: str = "127.0.0.1") -> int:
  """A TCP port that is free on ``host`` right now."""
  with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
    s.bind((host, 0))
    return s.getsockname()[1]


def check_port(host: str, port: int) -> None:
  """Raises ``LaunchError`` if the coordinator could not listen on ``host:port``."""
  problem = distributed.listen_problem(
    f"--coordinator {host}:{port}", socket.AF_INET6 if ":" in host else socket.AF_INET,
    (host, port), in_use="pick another port or omit --coordinator to get a free one.",
    elsewhere="the local launcher runs the coordinator on this machine, e.g. 127.0.0.1.",
  )  # fmt: skip
  if problem is not None:
    raise LaunchError(problem)


def _status(rc: int) -> str:
  if rc < 0:
    try:
      return f"was killed by {signal.Signals(-rc).name}"
    except ValueError:
      return f"was killed by signal {-rc}"
  return f"exited with status {rc}"


def _tail(path: Path, lines: int = 15, max_bytes: int = 8192) -> str:
  try:
    text = path.read_bytes()[-max_bytes:].decode("utf-8", "replace")
  except OSError:
    return ""
  return "\n".join(text.splitlines()[-lines:])


@dataclass
class _Child:
  rank: int
  proc: subprocess.Popen
  log: Path
  offset: int = 0
  partial: bytes = b""
  rc: int | None = None
  ended: float | None = None
  shown: bool = field(default=False)
  spare: bool = False  # a spare process took this rank
  named: bool = False  # the launcher named it as the run's failure


def _child_env(
  rank: int,
  n: int,
  address: str,
  local_devices: int,
  platform: str,
  init_s: int,
  shutdown_s: int = 30,
  heartbeat_s: int | None = None,
):
  env = {k: v for k, v in os.environ.items() if k not in distributed.LAUNCHER_VARS}
  env.pop(distributed.ENV_MODE, None)
  env.update(
    {
      distributed.ENV_COORDINATOR: address,
      distributed.ENV_COORDINATOR_BIND: address,
      distributed.ENV_NUM_PROCESSES: str(n),
      distributed.ENV_PROCESS_ID: str(rank),
      distributed.ENV_INIT_TIMEOUT: str(init_s),
      distributed.ENV_SHUTDOWN_TIMEOUT: str(shutdown_s),
      "PYTHONUNBUFFERED": "1",
    }
  )
  if heartbeat_s is not None:
    env[distributed.ENV_HEARTBEAT_TIMEOUT] = str(heartbeat_s)
  if platform == "cpu":
    env["JAX_PLATFORMS"] = "cpu"
    env[distributed.ENV_LOCAL_DEVICES] = str(local_devices)
  else:  # one process per group of local_devices accelerators
    env["JAX_PLATFORMS"] = "cuda"
    ids = range(rank * local_devices, (rank + 1) * local_devices)
    env[distributed.ENV_LOCAL_DEVICE_IDS] = ",".join(map(str, ids))
  return env


# The watchdog: a separate process (its own session, so Ctrl-C does not reach it)
# that learns each child's process group on stdin. If its stdin reaches EOF without
# the word "done" (the launcher died, even by SIGKILL), it kills those groups, which
# also takes the grandchildren a wrapper such as `bash -c` started.
_WATCHDOG = """
import os, signal, sys
groups = []
for line in sys.stdin:
  line = line.strip()
  if line == "done":
    sys.exit(0)
  if line.isdigit():
    groups.append(int(line))
for g in groups:
  try:
    os.killpg(g, signal.SIGKILL)
  except OSError:
    pass
"""


def _start_watchdog() -> subprocess.Popen | None:
  try:
    return subprocess.Popen(
      [sys.executable, "-c", _WATCHDOG],
      stdin=subprocess.PIPE,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
      start_new_session=True,
    )
  except OSError:  # pragma: no cover - PR_SET_PDEATHSIG still covers the children
    return None


def _tell(watchdog: subprocess.Popen | None, text: str) -> None:
  if watchdog is None:
    return
  with contextlib.suppress(OSError, ValueError):
    watchdog.stdin.write(f"{text}\n".encode())
    watchdog.stdin.flush()


_state = watchdog.proc_state
_wchan = watchdog.wchan
_main_thread_top = watchdog.main_thread_top
_in_jax = watchdog.in_jax


def _blame_key(c: _Child) -> tuple:
  """Who to name among processes seen failing in the same poll: a kill by a signal
  other than SIGABRT first (SIGKILL, SIGSEGV, SIGINT: nothing in a run sends those as
  a consequence), then an error exit (peers of a dead process fail with one: gloo's
  "Connection closed by peer"), SIGABRT last (how JAX ends the peers of a failed
  process), then the lowest rank."""
  if c.rc > 0:
    return (1, c.rank)
  return (2 if -c.rc == signal.SIGABRT else 0, c.rank)


#: What a process's log says when it failed because a peer went away mid-collective
#: (gloo's TCP pairs, JAX's coordination service): a consequence, not the cause.
CONSEQUENCES = re.compile(
  r"Connection closed by peer|Connection reset by peer|Broken pipe|Connection refused"
  r"|gloo[^\n]*(?:closed|reset|timed out|Timed out)|another task|task[^\n]*(?:died|unhealthy)"
  r"|heartbeat",
  re.IGNORECASE,
)

#: How long after the first failure the launcher keeps collecting exits before it
#: names one (peers failing because of it die within milliseconds).
SETTLE_S = 0.5


def _is_consequence(c: _Child) -> bool:
  """A failure its log attributes to a peer that went away (see :data:`CONSEQUENCES`)."""
  return -c.rc == signal.SIGABRT or bool(CONSEQUENCES.search(_tail(c.log, 40)))


#: What JAX's coordination service writes when its heartbeat check gives up on processes
#: (a stopped process, a link down past the timeout): the ranks it names.
UNHEALTHY = re.compile(r"stopped sending heartbeats\):\s*(\d+(?:[ \t]*,[ \t]*\d+)*)")


def unhealthy_ranks(text: str) -> list[int]:
  """The ranks JAX's coordination service declared unhealthy in a log, in order, once each.

  >>> said = "UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats): "
  >>> unhealthy_ranks(said + "1"), unhealthy_ranks(said.strip() + "\\n1\\nThe tasks have crashed.")
  ([1], [1])
  >>> unhealthy_ranks(said + "2, 3 ... " + said + "2")
  [2, 3]
  """
  found = [int(r) for m in UNHEALTHY.finditer(text) for r in m[1].split(",")]
  return list(dict.fromkeys(found))


def _culprit(failed: list[_Child]) -> _Child:
  """The process to name among those that failed: the first to die (by the poll that
  saw it) among those whose failure is not a consequence of a peer's, ties broken by
  :func:`_blame_key`; if every one reads as a consequence, the first of them all."""
  causes = [c for c in failed if not _is_consequence(c)] or failed
  return min(causes, key=lambda c: (c.ended, *_blame_key(c)))


def _stacks(children: list[_Child], wait_s: float = 1.5) -> dict[int, str]:
  """Per running child, the innermost frame of its main thread's Python stack
  (:func:`watchdog.stack_tops`), or nothing for a child that printed none."""
  return watchdog.stack_tops([(c.rank, c.proc.pid, c.log) for c in children if c.rc is None],
                             wait_s)  # fmt: skip


@dataclass(frozen=True)
class Options:
  """How a job's processes are supervised: the options ``launch`` and ``cluster`` share
  (:func:`add_launch_options` declares them, :func:`launch_options` reads them back).

  Attributes:
    timeout: seconds after which a run still going is stopped (124), or None.
    log_dir: per-process logs (None: a folder of the launcher's own, removed after success).
    output: whose output to show: a rank, ``all`` (prefixed) or ``none``.
    init_timeout, shutdown_timeout, heartbeat_timeout: JAX's, in seconds (None: JAX's 100).
    watch: the no-progress watchdog (:mod:`allreduce_jax.tools.watchdog`; None: its defaults).
    restarts, elastic, spares, replace_after: :func:`launch_restarting`'s.
  """

  timeout: float | None = None
  log_dir: str | os.PathLike | None = None
  output: str = "0"
  init_timeout: int = 120
  shutdown_timeout: int = 30
  heartbeat_timeout: int | None = None
  watch: watchdog.Settings | None = None
  restarts: int = 0
  elastic: bool = False
  spares: bool = True
  replace_after: float | None = None


@dataclass(frozen=True)
class Place:
  """Where one attempt's processes run: this machine (the defaults) or a cluster's hosts.

  Attributes:
    local_devices: devices per process; platform: ``cpu`` or ``gpu``.
    coordinator: ``HOST:PORT`` (None: 127.0.0.1 and a free port).
    host_argv: ``rank -> list[str]``, the command prefix that runs process ``rank`` where it
      belongs (``cluster``: in its host's network namespace; each step must exec the next,
      so the pid the launcher watches is the program's); with it ``coordinator`` is an
      address on process 0's host and is not checked from here.
    extra_env: set in every process.
    on_start: ``on_start(pids, t0)``, called once every process has started (``pids[rank]``,
      ``t0`` on ``time.monotonic``'s clock) before supervision.
    explain: ``explain(rank) -> str | None``, why that process cannot progress (the watchdog's).
  """

  local_devices: int = 1
  coordinator: str | None = None
  platform: str = "cpu"
  host_argv: Callable[[int], list[str]] | None = None
  extra_env: Mapping[str, str] = field(default_factory=dict)
  on_start: Callable | None = None
  explain: Callable[[int], str | None] | None = None


@dataclass(frozen=True)
class Result:
  """How one attempt ended: ``code`` (0: every process exited 0), the process the launcher
  named (``failed_rank``, or None), whether the launcher itself was stopped
  (``interrupted``), its ``seconds`` and the time to the first step (``first_step_s``, from
  the watchdog's reports; None when unwatched or never reached)."""

  code: int
  failed_rank: int | None = None
  interrupted: bool = False
  seconds: float = 0.0
  first_step_s: float | None = None


class _Terminated(Exception):
  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


def _raise_terminated(signum, frame):
  raise _Terminated(signum)


def launch(command: list[str], num_processes: int, *, out=None, err=None, **fields) -> int:
  """Runs ``command`` in ``num_processes`` local processes joined by ``jax.distributed``,
  once (:func:`run_attempt`); ``fields``: those of :class:`Options` and :class:`Place` by
  name (``timeout=60``, ``local_devices=2``...). Returns the attempt's status."""
  place_names = {f.name for f in dataclasses.fields(Place)}
  place = Place(**{k: v for k, v in fields.items() if k in place_names})
  options = Options(**{k: v for k, v in fields.items() if k not in place_names})
  return run_attempt(command, num_processes, options, place, out=out, err=err).code


def run_attempt(
  command: list[str],
  num_processes: int,
  options: Options = Options(),
  place: Place = Place(),
  *,
  label: str = "launch",
  out=None,
  err=None,
  spares=None,
  stop_grace: float = 3.0,
) -> Result:
  """Runs ``command`` in ``num_processes`` processes joined by ``jax.distributed``, where
  ``place`` puts them, supervised as ``options`` say (their restart fields aside).

  The result's code is 0 if every process exited with status 0; otherwise the failed
  process's status (128 + signal if it was killed), 124 on ``options.timeout``, 130/143 if
  the launcher was interrupted/terminated. Raises ``LaunchError`` for a launch that cannot
  start, with the offending option in the message. ``label`` starts the launcher's own
  messages.

  ``options.watch``: the no-progress watchdog (None: its defaults, on): every process
  reports its progress to ``log_dir/progress-R``, and a run that stops progressing is
  stopped with status 124, naming the process to blame (the result's ``failed_rank``). The
  launcher's own events (started, named, stopped) go to ``log_dir/launcher.jsonl``, for a
  run's timeline.

  ``spares``: ready processes to take the ranks' places (``spares.take(rank, env, log)``,
  :mod:`allreduce_jax.tools.spares`), and ``spares.refill()`` once the run has made its
  first step (its own start done); ``stop_grace``: seconds an interrupted launcher gives
  the processes to end by SIGTERM.
  """
  out = out or sys.stdout
  err = err or sys.stderr
  o, local_devices, platform = options, place.local_devices, place.platform
  _check_options(
    num_processes, local_devices, o.timeout, o.shutdown_timeout, o.heartbeat_timeout,
    o.init_timeout,
  )  # fmt: skip
  _check_choices(platform, o.output, num_processes)
  argv = command_argv(list(command))
  host_argv = place.host_argv
  if host_argv is None and shutil.which(argv[0]) is None:
    raise LaunchError(f"cannot start {argv[0]!r}: no such program, or not executable.")
  address = _coordinator_address(place.coordinator, checked=host_argv is None)
  made = not o.log_dir  # the launcher's own folder: removed after success, kept after failure
  logs = Path(o.log_dir) if o.log_dir else Path(tempfile.mkdtemp(prefix="allreduce-jax-launch-"))
  logs.mkdir(parents=True, exist_ok=True)
  shown = set(range(num_processes)) if o.output == "all" else set()
  shown |= {int(o.output)} if o.output.isdigit() else set()
  print(
    f"# {label}: {num_processes} process(es) × {local_devices} local {platform} device(s),"
    f" coordinator {address}, logs in {logs}"
    + (" (removed if every process succeeds)" if made else ""),
    file=err,
    flush=True,
  )
  children: list[_Child] = []
  old_handlers = _catch_termination()
  t0 = time.monotonic()
  failure: str | None = None
  code = 0
  interrupted = False
  reaper = _start_watchdog()
  watch = o.watch if o.watch is not None else watchdog.Settings()
  dog = None
  try:
    for rank in range(num_processes):
      env = _child_env(
        rank,
        num_processes,
        address,
        local_devices,
        platform,
        o.init_timeout,
        o.shutdown_timeout,
        o.heartbeat_timeout,
      )
      env.update(place.extra_env)
      env[progress.ENV_PROGRESS] = str(_fresh(logs / f"progress-{rank}"))
      child = _spawn(rank, [*host_argv(rank), *argv] if host_argv else argv, env, logs, spares)
      child.shown = rank in shown
      _tell(reaper, str(child.proc.pid))  # its process group id (a new session)
      children.append(child)
    (logs / "pids.json").write_text(json.dumps({c.rank: c.proc.pid for c in children}))
    taken = sum(c.spare for c in children)
    _event(_fresh(logs / "launcher.jsonl"), "started", processes=num_processes, spares=taken)
    if watch.on:
      dog = watchdog.Watchdog(
        [logs / f"progress-{c.rank}" for c in children], [c.proc.pid for c in children], watch
      )
    if place.on_start is not None:
      place.on_start([c.proc.pid for c in children], t0)
    failure, code = _supervise(
      children, t0, o.timeout, out, prefix=o.output == "all", dog=dog, spares=spares
    )
  except LaunchError:
    if made:
      shutil.rmtree(logs, ignore_errors=True)
    raise
  except KeyboardInterrupt:
    failure, code, interrupted = "interrupted (Ctrl-C); stopping all processes.", 130, True
  except _Terminated as e:
    failure = f"got {signal.Signals(e.signum).name}; stopping all processes."
    code, interrupted = 128 + e.signum, True
  finally:
    named = next((c.rank for c in children if c.named), None)
    result = Result(
      code,
      failed_rank=named,
      interrupted=interrupted,
      seconds=time.monotonic() - t0,
      first_step_s=dog.first_step_s() if dog is not None else None,
    )
    if failure:
      print(f"{label}: {failure}", file=err, flush=True)
      _event(logs / "launcher.jsonl", "named", rank=named, why=failure.split("\n")[0][:500])
    # A failed run's survivors wait in a collective that cannot complete, and JAX catches
    # SIGTERM (its preemption notifier) without leaving it: they are killed at once. An
    # interrupted launcher gives them stop_grace seconds to end by SIGTERM.
    also = _stop(children, stop_grace if interrupted or not failure else 0)
    _event(logs / "launcher.jsonl", "stopped", code=code)
    _close_watchdog(reaper)
    for s, h in old_handlers.items():
      signal.signal(s, h)
    _stream(children, out, prefix=o.output == "all", final=True)
  if failure:
    if also:
      print(f"{label}: while stopping: {'; '.join(also)}", file=err, flush=True)
    if made:
      print(f"{label}: each process's log is kept in {logs}", file=err, flush=True)
    return result
  if made:
    shutil.rmtree(logs, ignore_errors=True)
  print(
    f"# {label}: all {num_processes} processes finished OK in {time.monotonic() - t0:.1f} s",
    file=err,
    flush=True,
  )
  return result


def launch_restarting(
  command: list[str],
  num_processes: int,
  options: Options | None = None,
  *,
  place: Place | Callable[[list[int], int], Place] = Place(),
  label: str = "launch",
  err=None,
  **fields,
) -> int:
  """:func:`run_attempt`, started again after a failure up to ``options.restarts`` times
  (torchrun's ``--max-restarts``): every process is stopped and the whole job starts
  afresh (a program that saves checkpoints, such as ``train sync --checkpoint-dir``,
  resumes from its newest). ``options.elastic``: a restart leaves out the process that was
  named and runs on the survivors (ranks renumbered), and every process sees
  ``$ALLREDUCE_JAX_ELASTIC``; ``options.replace_after``: a process left out comes back (a
  replacement) at the first restart at least that many seconds after it was left out
  (None: never). A launcher stopped by Ctrl-C or SIGTERM is not restarted. ``fields``:
  :class:`Options`' fields by name, over ``options``.

  What a restart costs is cut where it can be: every attempt's processes share one JAX
  persistent compilation cache (a folder of the run's own, unless
  ``$JAX_COMPILATION_CACHE_DIR`` names one), so a restart reads what the first attempt
  compiled; with ``options.spares`` and a command that is an ``allreduce-jax`` subcommand,
  every process starts as a spare (the first attempt's are taken at once), each forks the
  spare that takes a restarted process's place (:mod:`allreduce_jax.tools.spares`).

  ``place``: a :class:`Place`, or ``place(alive, attempt) -> Place`` that puts the
  processes of ``alive`` (the original ranks still in the job) where they belong (a
  cluster's ``host_argv`` and ``coordinator``). Each restart's logs go to
  ``log_dir/restart-K``. Returns the last attempt's status.
  """
  err = err or sys.stderr
  o = dataclasses.replace(options or Options(), **fields)
  where = place if callable(place) else (lambda alive, attempt: place)
  if o.restarts < 0:
    raise LaunchError(f"--restarts must be at least 0, got {o.restarts}.")
  if o.replace_after is not None and not (o.elastic and 0 <= o.replace_after < float("inf")):
    raise LaunchError(
      f"--replace-after must be a number of seconds >= 0, with --elastic; got {o.replace_after}"
      + ("" if o.elastic else " without --elastic")
      + "."
    )
  alive = list(range(num_processes))
  left_out: dict[int, float] = {}  # rank -> when it was left out (--elastic)
  t0 = time.monotonic()
  watch = o.watch or watchdog.Settings()
  first_step_s = None  # the last attempt's time to its first step: a restart's phase bound
  with _restart_kit(command, num_processes, o.restarts, o.spares, where) as kit:
    for attempt in range(o.restarts + 1):
      alive = _rejoined(alive, left_out, o.replace_after, label, err)
      env = {ENV_RESTART: str(attempt), **({ENV_ELASTIC: "1"} if o.elastic else {}), **kit.env}
      logs = (
        o.log_dir if o.log_dir is None or attempt == 0 else Path(o.log_dir) / f"restart-{attempt}"
      )
      placed = where(alive, attempt)
      result = run_attempt(
        command,
        len(alive),
        dataclasses.replace(
          o, log_dir=logs, watch=watchdog.attempt(watch, first_step_s, placed.explain)
        ),
        dataclasses.replace(placed, extra_env={**env, **placed.extra_env}),
        label=label,
        err=err,
        spares=kit.spares_for(alive),
      )
      rc = result.code
      # an attempt that made no step (its bound passed while starting: no spare was ready)
      # leaves the next unbounded while starting, as the first, not held to a faster start's
      first_step_s = result.first_step_s
      if rc == 0 or attempt == o.restarts or result.interrupted:
        return rc
      failed = result.failed_rank
      who = f"process {alive[failed]}" if failed is not None else "a process"
      if o.elastic and failed is not None:
        if len(alive) == 1:
          return rc
        left_out[alive.pop(failed)] = time.monotonic()
      print(
        f"{label}: restart {attempt + 1} of {o.restarts} after {who} failed"
        f" ({time.monotonic() - t0:.1f} s since the start): {len(alive)} process(es)"
        + (f", original ranks {', '.join(map(str, alive))} (--elastic)" if o.elastic else ""),
        file=err,
        flush=True,
      )
  return rc


def _rejoined(alive, left_out, replace_after, label, err) -> list[int]:
  """``alive`` with the processes left out at least ``replace_after`` seconds ago back."""
  if replace_after is None:
    return alive
  back = [r for r, t in left_out.items() if time.monotonic() - t >= replace_after]
  for r in back:
    del left_out[r]
  if back:
    print(f"{label}: process(es) {', '.join(map(str, sorted(back)))} replaced: back in the job",
          file=err, flush=True)  # fmt: skip
  return sorted(alive + back)


class _RestartKit:
  """What every attempt of a restarting job shares: the environment of its compilation
  cache and the spare processes (:meth:`spares_for` an attempt's processes)."""

  def __init__(self, env: dict[str, str], pool):
    self.env, self.pool = env, pool

  def spares_for(self, alive: list[int]):
    if self.pool is None:
      return None
    pool = self.pool

    class _Attempt:  # ranks of this attempt -> the hosts' spares
      def take(self, rank, env, log):
        return pool.take(alive[rank], env, log)

      def refill(self):
        pool.refill()

    return _Attempt()


@contextlib.contextmanager
def _restart_kit(command, num_processes, restarts, use_spares, where):
  """A :class:`_RestartKit` for a job of ``restarts`` restarts (none for 0): a compilation
  cache folder of its own (removed after) unless ``$JAX_COMPILATION_CACHE_DIR`` is set,
  and, with ``use_spares``, a spare pool (killed after) on the hosts ``where(hosts, 0)``
  places."""
  if restarts == 0:
    yield _RestartKit({}, None)
    return
  made = None
  env = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    made = tempfile.mkdtemp(prefix="allreduce-jax-compile-")
    env["JAX_COMPILATION_CACHE_DIR"] = made
  pool = spare_logs = None
  argv = command_argv(list(command))
  if use_spares and argv[1:3] == ["-m", "allreduce_jax"]:  # a subcommand waits as a spare
    hosts = list(range(num_processes))
    placed = where(hosts, 0)
    host_argv = placed.host_argv
    base = _child_env(0, num_processes, "127.0.0.1:1", placed.local_devices, placed.platform, 1)
    base.update(env)
    spare_logs = tempfile.mkdtemp(prefix="allreduce-jax-spares-")
    pool = spare_pool.Spares(argv, base, hosts, Path(spare_logs), host_argv)
    pool.refill(idle=False)  # the first attempt's processes: taken at once, each forks its next
  try:
    yield _RestartKit(env, pool)
  finally:
    if pool is not None:
      pool.close()
    for folder in (made, spare_logs):
      if folder:
        shutil.rmtree(folder, ignore_errors=True)


def check_options(options: Options, num_processes: int) -> None:
  """``options`` for ``num_processes`` processes (hosts), checked before anything starts
  (``cluster``: before its namespaces are built): a ``LaunchError`` naming the first out
  of range."""
  o = options
  _check_options(
    num_processes, 1, o.timeout, o.shutdown_timeout, o.heartbeat_timeout, o.init_timeout
  )
  _check_choices("cpu", o.output, num_processes)
  if o.restarts < 0:
    raise LaunchError(f"--restarts must be at least 0, got {o.restarts}.")


def _check_options(
  num_processes, local_devices, timeout, shutdown_timeout, heartbeat_timeout, init_timeout=120
):
  """``LaunchError`` naming the first numeric option out of range."""
  if num_processes < 1:
    raise LaunchError(f"-n/--num-processes must be at least 1, got {num_processes}.")
  if local_devices < 1:
    raise LaunchError(f"--local-devices must be at least 1, got {local_devices}.")
  if timeout is not None and (why := seconds_problem(timeout)):
    raise LaunchError(f"--timeout: {why}.")
  if init_timeout < 1:
    raise LaunchError(f"--init-timeout must be at least 1, got {init_timeout}.")
  if shutdown_timeout < 1:
    raise LaunchError(f"--shutdown-timeout must be at least 1, got {shutdown_timeout}.")
  if heartbeat_timeout is not None and heartbeat_timeout < 1:
    raise LaunchError(f"--heartbeat-timeout must be at least 1, got {heartbeat_timeout}.")


def _check_choices(platform: str, output: str, num_processes: int) -> None:
  """``LaunchError`` for a ``--platform`` or ``--output`` outside its choices."""
  if platform not in ("cpu", "gpu"):
    raise LaunchError(f"--platform must be cpu or gpu, got {platform!r}.")
  if output not in ("all", "none") and not (output.isdigit() and int(output) < num_processes):
    raise LaunchError(
      f"--output must be all, none or a rank in 0..{num_processes - 1}, got {output!r}."
    )


def _coordinator_address(coordinator: str | None, checked: bool) -> str:
  """``HOST:PORT`` (``[HOST]:PORT`` for IPv6): 127.0.0.1 and a free port by default;
  a given port is checked free here unless not ``checked`` (it is on another host)."""
  if coordinator is None:
    host = "127.0.0.1"
    port = free_port(host)
  else:
    try:
      host, port = parse_coordinator(coordinator)
    except ValueError as e:
      raise LaunchError(str(e)) from None
    if checked:
      check_port(host, port)
  return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _spawn(rank: int, argv: list[str], env: dict, logs: Path, spares=None) -> _Child:
  """Starts process ``rank`` (its own session, output to ``logs/process-RANK.log``), or
  has a spare of its host become it (``spares.take(rank, env, log)``)."""
  log = logs / f"process-{rank}.log"
  with open(log, "wb") as f:
    proc = spares.take(rank, env, log) if spares is not None else None
    if proc is not None:
      return _Child(rank, proc, log, spare=True)
    try:
      proc = subprocess.Popen(
        die_with_parent(argv),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=f,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, killed as a whole
      )
    except OSError as e:
      raise LaunchError(f"cannot start {argv[0]!r}: {e.strerror}") from None
  return _Child(rank, proc, log)


def _supervise(
  children, t0, timeout, out, prefix: bool, dog=None, spares=None
) -> tuple[str | None, int]:
  """Polls until every process exited 0 (``(None, 0)``), one failed (its message and
  status), the watchdog ``dog`` tripped or ``timeout`` passed (the stuck ones named, 124).
  ``spares`` are refilled once a process made its first step (or at once, unwatched)."""
  while True:
    if spares is not None and (dog is None or dog.first_step_s() is not None):
      spares.refill()
      spares = None
    _stream(children, out, prefix=prefix)
    newly = _reap(children, t0)
    if newly:
      return _failure(children, newly, t0)
    if all(c.rc == 0 for c in children):
      return None, 0
    stall = dog.check(lambda rank: children[rank].rc is None) if dog is not None else None
    if stall is not None:
      return _stalled(children, dog, stall)
    if timeout is not None and time.monotonic() - t0 > timeout:
      return _timeout_report(children, timeout), 124
    time.sleep(POLL_S)


def _stalled(children, dog, stall) -> tuple[str, int]:
  """The watchdog tripped: the message naming the process to blame (:func:`watchdog.name`
  from each running process's state, reports, stack and place; marked ``named``), and 124."""
  running = [c for c in children if c.rc is None]
  verdict = watchdog.name(dog.facts([(c.rank, c.proc.pid, c.log) for c in running]))
  for c in children:
    c.named = c.rank == verdict.rank
  return watchdog.message(stall, verdict, len(children), [c.proc.pid for c in children]), 124


def _fresh(path: Path) -> Path:
  """``path``, removed if a run before this one left it (a reused ``--log-dir``)."""
  with contextlib.suppress(FileNotFoundError):
    path.unlink()
  return path


def _event(path: Path, event: str, **facts) -> None:
  """Appends one event of the launcher's timeline (wall-clock ``unix`` time) to ``path``."""
  with contextlib.suppress(OSError), open(path, "a") as f:
    f.write(json.dumps({"event": event, "unix": round(time.time(), 4), **facts}) + "\n")


def _failure(children, newly, t0) -> tuple[str, int]:
  """The message and status of a failed run: collects the failures that follow within
  SETTLE_S (a dead process's peers fail with connection errors at once), then names the
  first that is not one of those (marked ``named``)."""
  num_processes = len(children)
  # a kill by a signal other than SIGABRT is never a peer's consequence: no need to wait
  certain = any(c.rc < 0 and -c.rc != signal.SIGABRT for c in newly)
  settle = time.monotonic() + (0 if certain else SETTLE_S)
  while time.monotonic() < settle and any(c.rc is None for c in children):
    time.sleep(POLL_S)
    newly += _reap(children, t0)
  first = _culprit(newly)
  failure = (
    f"process {first.rank} of {num_processes} (pid {first.proc.pid}) {_status(first.rc)}"
    f" after {first.ended:.1f} s; stopping the other processes. Its log: {first.log}"
  )
  stopped = [c for c in children if c.rc is None and _state(c.proc.pid) == "T"]
  if not stopped and (first.rc > 0 or -first.rc == signal.SIGABRT):  # not killed: JAX may know
    said = [r for c in children for r in unhealthy_ranks(_tail(c.log, 10**4, 1 << 18))]
    stopped = [c for c in children if c.rank in said[:1] and c is not first]
  for c in children:
    c.named = c is (stopped[0] if stopped else first)
  if stopped:  # e.g. SIGSTOP: its peers' heartbeat check gave up on it
    names = ", ".join(f"{c.rank} (pid {c.proc.pid})" for c in stopped)
    how = "is stopped (SIGSTOP?) and stopped" if _state(stopped[0].proc.pid) == "T" else "stopped"
    failure = (
      f"process {names} of {num_processes} {how} answering; JAX's heartbeat check gave up"
      f" on it: {failure}"
    )
  code = first.rc if first.rc > 0 else 128 - first.rc
  if not first.shown:
    failure += f"\n--- last lines of process {first.rank} ---\n{_tail(first.log)}"
  return failure, code


def _catch_termination() -> dict:
  """SIGTERM and SIGHUP raise :class:`_Terminated` (so the processes are stopped);
  returns the handlers they had (outside the main thread: none changed)."""
  old = {}
  for s in (signal.SIGTERM, signal.SIGHUP):
    with contextlib.suppress(ValueError):  # not the main thread: leave handlers alone
      old[s] = signal.signal(s, _raise_terminated)
  return old


def _close_watchdog(watchdog: subprocess.Popen | None) -> None:
  _tell(watchdog, "done")
  if watchdog is not None:
    with contextlib.suppress(OSError, ValueError, subprocess.TimeoutExpired):
      watchdog.stdin.close()
      watchdog.wait(5)


def _reap(children: list[_Child], t0: float) -> list[_Child]:
  """Records the exits since the last poll (one time for all: the order within a poll
  is unknown) and returns the children among them that failed."""
  now = time.monotonic() - t0
  failed = []
  for c in children:
    if c.rc is None and (rc := c.proc.poll()) is not None:
      c.rc, c.ended = rc, now
      if rc != 0:
        failed.append(c)
  return failed


def _timeout_report(children: list[_Child], timeout: float) -> str:
  """The --timeout message: which process is stuck (its main thread is not inside a
  JAX call, from a SIGUSR1 stack dump), which are waiting for it, and each one's
  last log line."""
  running = [c for c in children if c.rc is None]
  # Blocked in a JAX call = its main thread waits on a futex (a JAX computation or
  # collective, which releases the GIL) or its Python stack ends inside JAX. A
  # process sleeping, computing, reading input or stopped is the one not coming.
  waits = {c.rank: _wchan(c.proc.pid).startswith("futex") for c in running}
  frames = _stacks(running)
  for rank, frame in frames.items():
    waits[rank] = waits[rank] or _in_jax(frame)
  stuck = [c.rank for c in running if not waits[c.rank]]
  waiting = [c.rank for c in running if waits[c.rank]]
  if stuck and waiting:
    who = (
      f"process {', '.join(map(str, stuck))} is stuck outside JAX while process"
      f" {', '.join(map(str, waiting))} wait(s) for it in a JAX call"
    )
  elif waiting:
    who = f"processes {', '.join(map(str, waiting))} all wait in JAX calls (a collective mismatch?)"
  else:
    who = f"process(es) {', '.join(map(str, stuck))} still running, none inside a JAX call"
  lines = []
  for c in running:
    where = f" at {frames[c.rank]}" if c.rank in frames else ""
    last = (_tail(c.log, 1) or "(no output)")[:200]
    if c.rank in frames:  # the dump is now the log's tail: show the line before it
      last = _last_line_before_dump(c.log) or last
    lines.append(f"  process {c.rank} (pid {c.proc.pid}){where}; last output: {last}")
  return (
    f"--timeout {timeout:g} s reached: {who} (a stuck participant blocks every"
    " collective, cf. jax#38503); stopping them.\n" + "\n".join(lines)
  )


def _last_line_before_dump(path: Path) -> str:
  text = _tail(path, 400)
  lines = text.splitlines()
  for k, line in enumerate(lines):
    if line.startswith(("Thread 0x", "Current thread 0x")):
      before = [x for x in lines[:k] if x.strip()]
      return before[-1][:200] if before else ""
  return ""


def _kill_groups(children: list[_Child], sig: int) -> None:
  for c in children:
    if c.proc.poll() is None:  # the leader is not reaped yet, so its group id is ours
      with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(c.proc.pid, sig)


def _stop(children: list[_Child], grace: float) -> list[str]:
  """SIGTERM to every still-running child's process group, SIGKILL after ``grace``
  seconds; reaps them all. A Ctrl-C meanwhile sends SIGKILL at once, quietly.
  Returns notes on those that had already failed."""
  running = [c for c in children if c.proc.poll() is None]
  previous = None
  with contextlib.suppress(ValueError):  # not the main thread: leave SIGINT alone
    previous = signal.signal(signal.SIGINT, lambda *_: _kill_groups(running, signal.SIGKILL))
  try:
    _kill_groups(running, signal.SIGTERM if grace > 0 else signal.SIGKILL)
    deadline = time.monotonic() + grace
    for c in running:
      try:
        c.proc.wait(max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
          os.killpg(c.proc.pid, signal.SIGKILL)
        c.proc.wait()
  finally:
    if previous is not None:
      signal.signal(signal.SIGINT, previous)
  notes = []
  for c in children:
    if c.rc is None:
      c.rc = c.proc.returncode
      if c not in running and c.rc != 0:
        notes.append(f"process {c.rank} {_status(c.rc)}")
  return notes


def _stream(children: list[_Child], out, prefix: bool, final: bool = False) -> None:
  """Copies new output of the shown processes' logs to ``out``."""
  for c in children:
    if not c.shown:
      continue
    try:
      with open(c.log, "rb") as f:
        f.seek(c.offset)
        data = f.read()
    except OSError:
      continue
    c.offset += len(data)
    if not data and not (final and c.partial):
      continue
    if prefix:
      data = c.partial + data
      lines = data.split(b"\n")
      c.partial = b"" if final else lines.pop()
      text = "".join(f"[{c.rank}] {line.decode('utf-8', 'replace')}\n" for line in lines if line)
    else:
      text = data.decode("utf-8", "replace")
    out.write(text)
    out.flush()


def add_launch_options(parser: argparse.ArgumentParser, who: str = "process") -> None:
  """The supervision options ``launch`` and ``cluster`` share (``who``: what one of the
  supervised processes is called in the help, ``process`` or ``host``); read them back
  with :func:`launch_options`."""
  whos = f"{who}es" if who.endswith("s") else f"{who}s"
  parser.add_argument(
    "--timeout",
    type=positive_seconds,
    default=None,
    help=f"seconds after which a run still going is stopped, naming the stuck {who}"
    " (exit 124; default: none)",
  )
  parser.add_argument(
    "--log-dir",
    default=None,
    help=f"per-{who} logs go here (default: a new temp dir, removed if all succeed)",
  )
  parser.add_argument(
    "--output",
    default="0",
    help=f"whose output to show: a {who} rank, 'all' (prefixed) or 'none' (default 0)",
  )
  parser.add_argument(
    "--init-timeout",
    type=positive_int,
    default=120,
    help=f"seconds the {whos} wait for each other to connect (default 120)",
  )
  parser.add_argument(
    "--shutdown-timeout",
    type=positive_int,
    default=30,
    help=f"seconds a finished {who} waits for the others at exit (JAX's default 300)",
  )
  parser.add_argument(
    "--heartbeat-timeout",
    type=positive_int,
    default=None,
    help=f"seconds without a heartbeat after which JAX declares a {who} dead (default: JAX's, 100)",
  )
  parser.add_argument(
    "--watchdog",
    type=float,
    default=watchdog.FLOOR_S,
    metavar="SECONDS",
    help=f"the no-progress watchdog's floor: a {who} that reports no progress for the larger"
    f" of this and {watchdog.FACTOR:g}× its longest recent step (training: a chunk of steps;"
    f" bench: a call) is named, why (stopped, its link down, stuck outside JAX, behind),"
    " and the job stopped (exit 124) and handed to --restarts; 0: off (JAX's own timeouts:"
    " a 100 s heartbeat, XLA:CPU's 1800 s collective timeout)",
  )
  parser.add_argument(
    "--restarts",
    type=nonnegative_int,
    default=0,
    metavar="N",
    help="start the job again after a failure, up to N times (torchrun's --max-restarts;"
    " train sync --checkpoint-dir resumes from its newest checkpoint; default 0)",
  )
  parser.add_argument(
    "--spares",
    action=argparse.BooleanOptionalAction,
    default=True,
    help=f"with --restarts: keep one spare process per {who}, started ahead (Python, JAX and"
    " the subcommand imported, its data loaded), to take a restarted process's place (the"
    " restarts also share a JAX compilation cache either way)",
  )
  parser.add_argument(
    "--replace-after",
    type=float,
    default=None,
    metavar="SECONDS",
    help=f"with --elastic: a {who} left out comes back (a replacement) at the first restart at"
    " least SECONDS after it was left out (default: never)",
  )
  parser.add_argument(
    "--elastic",
    action="store_true",
    help=f"a restart leaves out the failed {who} and runs on the survivors (train sync keeps"
    " each worker's batch and scales the learning rate with the global batch)",
  )


def add_collectives_option(parser: argparse.ArgumentParser, mpi_needs: str) -> None:
  """``--collectives {gloo,mpi}`` (``mpi_needs``: what the mpi choice implies here)."""
  parser.add_argument(
    "--collectives",
    default="gloo",
    choices=distributed.COLLECTIVES,
    help="what moves the data between processes on CPU: gloo (the default; TCP) or mpi"
    f" (XLA's MPI collectives over the local Open MPI; {mpi_needs}; Open MPI gets "
    + " ".join(f"{k}={v}" for k, v in engines.MPI_MCA.items())
    + ", large messages sent in small fragments rather than put and waiting ranks yielding the"
    " CPU, so the two directions of a pairwise exchange overlap; OMPI_MCA_<name> in the"
    " environment wins; build MPIwrapper first:"
    f" {distributed.BUILD_MPIWRAPPER})",
  )


def launch_options(args: argparse.Namespace) -> Options:
  """The :class:`Options` that :func:`add_launch_options` declared (each its option's
  ``dest``; ``watch`` from ``--watchdog``)."""
  fields = [f.name for f in dataclasses.fields(Options) if f.name != "watch"]
  return Options(
    **{f: getattr(args, f) for f in fields}, watch=watchdog.Settings(floor=args.watchdog)
  )


def configure(parser: argparse.ArgumentParser) -> None:
  parser.usage = "%(prog)s -n N [options] -- COMMAND [ARGS...]"
  parser.add_argument(
    "-n", "--num-processes", type=int, required=True, help="processes to start on this machine"
  )
  parser.add_argument(
    "--local-devices",
    type=int,
    default=1,
    help="devices per process (emulated CPU devices; GPUs with --platform gpu; default 1)",
  )
  parser.add_argument(
    "--coordinator",
    default=None,
    help="HOST:PORT of the coordinator (default: 127.0.0.1 and a free port)",
  )
  parser.add_argument("--platform", default="cpu", choices=("cpu", "gpu"), help="default cpu")
  add_launch_options(parser, "process")
  add_collectives_option(parser, "the processes start under mpirun -np N, --local-devices 1")
  parser.add_argument(
    "command",
    nargs=argparse.REMAINDER,
    help="after --: an allreduce-jax subcommand (verify, bench, train...) or a program",
  )


def run(args: argparse.Namespace) -> int:
  if args.log_dir:  # an unwritable --log-dir: one line, before any process starts
    output_dir(args.log_dir, "--log-dir")
  try:
    if args.collectives == "mpi":
      return _launch_mpi(args)
    return launch_restarting(
      args.command,
      args.num_processes,
      launch_options(args),
      place=Place(
        local_devices=args.local_devices, coordinator=args.coordinator, platform=args.platform
      ),
    )
  except (LaunchError, ValueError) as e:
    print(f"allreduce-jax launch: {e}", file=sys.stderr)
    return 2


def _launch_mpi(args: argparse.Namespace) -> int:
  """``--collectives mpi``: the processes must be MPI ranks, so Open MPI's ``mpirun``
  starts them (:func:`allreduce_jax.tools.engines.mpirun_local`)."""
  if args.platform != "cpu":
    raise LaunchError("--collectives mpi is for CPU collectives: --platform must be cpu.")
  distributed.check_collectives("mpi", args.local_devices, "--local-devices")
  if args.num_processes < 1:
    raise LaunchError(f"-n must be at least 1, got {args.num_processes}.")
  if args.restarts or args.elastic or args.coordinator:
    raise LaunchError(
      "--collectives mpi: --restarts, --elastic and --coordinator need the builtin launcher"
      " (--collectives gloo); mpirun starts the ranks."
    )
  return engines.mpirun_local(args.command, args.num_processes, "mpi", args.timeout, sys.stderr)
