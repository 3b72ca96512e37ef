"""The no-progress watchdog of ``launch`` and ``cluster``: a hang named in seconds.

A multi-process JAX run that loses a peer without a crash does not end: the others wait
in their collective for it, up to XLA:CPU's collective timeout (1,800 s) or, for a
process that stopped answering, JAX's heartbeat timeout (100 s). The watchdog ends such
a run in seconds and says who is to blame.

Every launched process reports its progress (:mod:`allreduce_jax.progress`: training
each chunk of steps, ``bench`` each call) into a file the launcher reads at each poll.
A process whose last report is a ``step`` gets a bound: the larger of ``floor`` and
``factor`` × the longest of its last :data:`WINDOW` intervals between steps (the step
time measured in this run, saves and evaluations included). In a ``phase`` (starting,
compiling, finishing) the bound is ``phase_s`` (a restart: ``factor`` × the previous
attempt's time to its first step, if it made one), or none. A process in the kernel's stopped state
(``T``) for ``floor`` seconds, or whose place says it cannot progress (a cluster: its
link is down) for as long, trips the watchdog whatever it last reported; the first step
after a phase is bounded by ``factor`` × the phase's length. When one
passes its bound, the watchdog names the host that is not progressing and why
(:func:`name`): stopped (``/proc`` state ``T``), its link down (its interfaces say so),
stuck outside JAX (its main thread's Python stack is not in a JAX call while the others
wait in one), or behind the others' step; the others wait in a collective for it. The
launcher then stops the job and hands it to ``--restarts``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: The default floor (``--watchdog``): no bound is shorter.
FLOOR_S = 2.0
#: The bound is this many times the longest recent interval between steps.
FACTOR = 3.0
#: How many recent intervals between steps the bound looks at.
WINDOW = 20
#: How long the watchdog waits for the stack dumps it asked for.
DUMP_WAIT_S = 1.0
#: Seconds between two asks of the place's ``explain`` (a cluster reads its interfaces).
EXPLAIN_EVERY_S = 0.5


@dataclass(frozen=True)
class Settings:
  """What the watchdog of one attempt does.

  Attributes:
    floor: seconds; no bound is shorter (``launch|cluster --watchdog``; 0: no watchdog).
    factor: the bound after a step is this many times the longest recent interval.
    phase_s: the bound in a phase (starting, compiling, finishing), or None: none.
    explain: ``explain(rank) -> str | None``: why that process cannot progress, as the
      place it runs knows it (``cluster``: "its link is down"), or None.
  """

  floor: float = FLOOR_S
  factor: float = FACTOR
  phase_s: float | None = None
  explain: Callable[[int], str | None] | None = field(default=None, compare=False)

  def __post_init__(self):
    if not (isinstance(self.floor, (int, float)) and 0 <= self.floor < float("inf")):
      raise ValueError(f"--watchdog must be a number of seconds >= 0 (0: off), got {self.floor}.")
    if not self.factor >= 1:
      raise ValueError(f"the watchdog's factor must be at least 1, got {self.factor}.")

  @property
  def on(self) -> bool:
    return self.floor > 0


def attempt(settings: Settings, first_step_s: float | None, explain=None) -> Settings:
  """The settings of one attempt of a restarting run: in a phase the bound is
  ``factor`` × the previous attempt's time to its first step (``first_step_s``, if one
  was measured); ``explain``: from where this attempt runs."""
  phase_s = settings.factor * first_step_s if first_step_s else settings.phase_s
  return dataclasses.replace(settings, phase_s=phase_s, explain=explain or settings.explain)


# ------------------------------------------------------------------ what /proc says


def proc_state(pid: int) -> str:
  """The kernel's one-letter process state (R, S, D, T stopped, Z...), '' if gone."""
  try:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
  except (OSError, IndexError):
    return ""


def wchan(pid: int) -> str:
  """Where in the kernel the process's main thread sleeps ('futex_do_wait', ...)."""
  try:
    return Path(f"/proc/{pid}/wchan").read_text().strip()
  except OSError:
    return ""


def main_thread_top(dump: str) -> str | None:
  """From a faulthandler dump, the innermost frame of the thread whose outermost
  frame is ``<module>`` or, under ``python -m``, runpy's ``_run_module_as_main`` (the
  main thread): 'File "x.py", line 3 in f'."""
  blocks, current = [], []
  for line in dump.splitlines():
    if line.startswith(("Thread 0x", "Current thread 0x")):
      current = []
      blocks.append(current)
    elif line.strip().startswith("File ") and blocks:
      current.append(line.strip())
  for frames in blocks:
    if frames and frames[-1].endswith(("in <module>", "in _run_module_as_main")):
      return frames[0]
  return None


def in_jax(frame: str) -> bool:
  """Whether a stack frame is inside JAX (or Flax): a process waiting in a JAX call."""
  return any(part in frame for part in ("/jax/", "/jaxlib/", "/jax_plugins/", "/flax/"))


def stack_tops(procs: Sequence[tuple[int, int, Path]], wait_s: float = DUMP_WAIT_S) -> dict:
  """Asks each ``(rank, pid, log)`` process for its Python stacks (SIGUSR1: faulthandler,
  set up by ``distributed.exit_fast_on_error``) and returns, per rank, the innermost frame
  of its main thread, for those that printed one within ``wait_s`` seconds."""
  sizes = {}
  for rank, pid, log in procs:
    sizes[rank] = log.stat().st_size if log.exists() else 0
    with contextlib.suppress(ProcessLookupError, PermissionError):
      os.kill(pid, signal.SIGUSR1)
  logs = {rank: log for rank, _, log in procs}
  frames: dict[int, str] = {}
  deadline = time.monotonic() + wait_s
  while True:
    for rank in sizes.keys() - frames.keys():
      try:
        with open(logs[rank], "rb") as f:
          f.seek(sizes[rank])
          text = f.read().decode("utf-8", "replace")
      except OSError:
        continue
      frame = main_thread_top(text)
      if frame:
        frames[rank] = frame
    if len(frames) == len(sizes) or time.monotonic() > deadline:
      return frames
    time.sleep(0.05)


# ------------------------------------------------------------------ naming


@dataclass(frozen=True)
class Facts:
  """What the launcher knows of one process when the watchdog trips.

  Attributes:
    rank: the process.
    state: its kernel state letter (``T``: stopped), '' if gone.
    steps: the step reports read from it.
    in_jax: whether its main thread waits in a JAX call (None: unknown).
    frame: its main thread's innermost Python frame, if it printed one.
    cannot: why the place it runs says it cannot progress ("its link is down"), or None.
  """

  rank: int
  state: str = "S"
  steps: int = 0
  in_jax: bool | None = None
  frame: str | None = None
  cannot: str | None = None


@dataclass(frozen=True)
class Verdict:
  """Whom the watchdog names (``rank``, None: nobody) and ``why``; ``waiting``: the
  processes that wait in a collective for it."""

  rank: int | None
  why: str
  waiting: tuple[int, ...] = ()


def name(facts: Sequence[Facts]) -> Verdict:
  """The process that keeps the others from progressing, and why, from what each
  process's facts say, first match wins: stopped (state ``T``); a reason its place gives
  (its link down); stuck outside JAX (its main thread is not in a JAX call while others
  wait in one; the one behind first); behind the others' step count. Otherwise nobody.

  Example:
    >>> v = name([Facts(0, in_jax=True, steps=9), Facts(1, state="T", steps=9),
    ...           Facts(2, in_jax=True, steps=9)])
    >>> v.rank, v.why, v.waiting
    (1, 'is stopped (/proc state T: SIGSTOP?)', (0, 2))
  """
  facts = list(facts)
  top = max((f.steps for f in facts), default=0)

  def verdict(f: Facts, why: str) -> Verdict:
    waiting = tuple(g.rank for g in facts if g.rank != f.rank and g.in_jax is not False)
    return Verdict(f.rank, why, waiting)

  def behind(group: list[Facts]) -> Facts:
    return min(group, key=lambda f: (f.steps, f.rank))

  stopped = [f for f in facts if f.state == "T"]
  if stopped:
    return verdict(behind(stopped), "is stopped (/proc state T: SIGSTOP?)")
  cannot = [f for f in facts if f.cannot]
  if cannot:
    f = behind(cannot)
    return verdict(f, f.cannot)
  outside = [f for f in facts if f.in_jax is False]
  if outside and len(outside) < len(facts):
    f = behind(outside)
    where = f" at {f.frame}" if f.frame else ""
    return verdict(f, f"is stuck outside JAX{where} (its main thread is not in a JAX call)")
  late = [f for f in facts if f.steps < top]
  if late:
    f = behind(late)
    return verdict(f, f"is behind: {f.steps} step(s) reported against the others' {top}")
  return Verdict(None, "every process waits in a JAX call (a collective no peer completes)")


# ------------------------------------------------------------------ watching


@dataclass
class _Track:
  """One process's reports as read so far."""

  path: Path
  started: float  # wall clock
  offset: int = 0
  partial: bytes = b""
  steps: int = 0
  last: float = 0.0  # wall time of the last report (or the start)
  phase: str | None = "starting"
  intervals: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
  first_step: float | None = None  # seconds from the start to the first step
  warmup: float | None = None  # the phase that ended with the last step (seconds)
  stopped_since: float | None = None
  cannot_since: float | None = None

  def read(self) -> None:
    try:
      size = os.stat(self.path).st_size
    except OSError:
      return
    if size == self.offset:
      return
    with open(self.path, "rb") as f:
      f.seek(self.offset)
      data = self.partial + f.read(size - self.offset)
    self.offset = size
    lines = data.split(b"\n")
    self.partial = lines.pop()
    for line in lines:
      kind, _, rest = line.decode("utf-8", "replace").partition(" ")
      try:
        at = float(rest.rsplit(" ", 1)[1])
      except (IndexError, ValueError):
        continue
      if kind == "step":
        if self.phase is None:
          self.intervals.append(at - self.last)
        else:  # a phase starts a new scale (another size, another program): its steps
          self.intervals.clear()  # are bounded by the phase's length until they are timed
          self.warmup = at - self.last
          if self.first_step is None:
            self.first_step = at - self.started
        self.steps += 1
        self.phase = None
        self.last = at
      elif kind == "phase":
        self.phase = rest.rsplit(" ", 1)[0]
        self.last = at


@dataclass(frozen=True)
class Stall:
  """The watchdog tripped: ``rank`` passed its bound (or was stopped) after ``silent_s``
  seconds without a report; ``bound_s`` and how it was derived (``how``)."""

  rank: int
  silent_s: float
  bound_s: float
  how: str


class Watchdog:
  """Reads the progress files ``paths[rank]`` at each :meth:`check`; the launcher's side.

  ``pids[rank]``: the processes, for their kernel state. ``started``: the wall-clock
  time they were started.
  """

  def __init__(self, paths: Sequence[Path], pids: Sequence[int], settings: Settings):
    now = time.time()
    self.settings = settings
    self.pids = list(pids)
    self.tracks = [_Track(Path(p), started=now, last=now) for p in paths]
    self.explained = 0.0  # when the place was last asked

  def bound(self, t: _Track) -> tuple[float | None, str]:
    """The seconds ``t`` may stay silent, and how that was derived."""
    s = self.settings
    if t.phase is None and t.intervals:
      longest = max(t.intervals)
      if s.factor * longest > s.floor:
        return s.factor * longest, f"{s.factor:g} × its longest recent step, {longest:.2f} s"
      return s.floor, f"the floor; its longest recent step took {longest:.2f} s"
    if t.phase is None:  # one step since the phase: the phase's length sets the scale
      return max(s.floor, s.factor * t.warmup), f"{s.factor:g} × the phase before its first step"
    if s.phase_s is None:
      return None, f"none while {t.phase}"
    return max(s.floor, s.phase_s), f"the bound while {t.phase}"

  def check(self, alive: Callable[[int], bool] = lambda rank: True) -> Stall | None:
    """Reads new reports; the first process (among those ``alive``) past its bound, or
    stopped for the floor, else None."""
    now = time.time()
    ask = self.settings.explain is not None and now - self.explained >= EXPLAIN_EVERY_S
    self.explained = now if ask else self.explained
    for rank, t in enumerate(self.tracks):
      if not alive(rank):
        continue
      t.read()
      if proc_state(self.pids[rank]) == "T":
        t.stopped_since = t.stopped_since or now
        if now - t.stopped_since >= self.settings.floor:
          return Stall(rank, now - t.last, self.settings.floor, "stopped for the floor")
      else:
        t.stopped_since = None
      if ask:  # e.g. a link down while the run is in a phase, where no step bound holds
        t.cannot_since = (t.cannot_since or now) if self.settings.explain(rank) else None
      if t.cannot_since is not None and now - t.cannot_since >= self.settings.floor:
        return Stall(rank, now - t.last, self.settings.floor, "its link down for the floor")
      bound, how = self.bound(t)
      if bound is not None and now - t.last > bound:
        return Stall(rank, now - t.last, bound, how)
    return None

  def first_step_s(self) -> float | None:
    """Seconds from the start to the first step of the quickest process (a restart's
    phase bound is a multiple of it), None if none reported a step."""
    firsts = [t.first_step for t in self.tracks if t.first_step is not None]
    return min(firsts) if firsts else None

  def facts(self, procs: Sequence[tuple[int, int, Path]]) -> list[Facts]:
    """What each running ``(rank, pid, log)`` process's state, reports, stack and place
    say; stacks are asked for only when neither a stopped state nor the place names one."""
    explain = self.settings.explain
    base = []
    for rank, pid, _ in procs:
      why = explain(rank) if explain is not None else None
      base.append(Facts(rank, proc_state(pid), self.tracks[rank].steps, cannot=why))
    if any(f.state == "T" or f.cannot for f in base):
      return base
    frames = stack_tops(procs)
    out = []
    for f, (rank, pid, _) in zip(base, procs):
      frame = frames.get(rank)
      waits = wchan(pid).startswith("futex") or (frame is not None and in_jax(frame))
      out.append(Facts(rank, f.state, f.steps, waits, frame, None))
    return out


def message(stall: Stall, verdict: Verdict, n: int, pids: Sequence[int]) -> str:
  """The launcher's one paragraph: whom it names and why, who waits for it, the bound."""
  bound = (
    f"no progress for {stall.silent_s:.1f} s (the watchdog's bound {stall.bound_s:.1f} s:"
    f" {stall.how})"
  )
  if verdict.rank is None:
    return f"{bound}: {verdict.why}; stopping the processes."
  waiting = ""
  if verdict.waiting:
    many = len(verdict.waiting) > 1
    waiting = (f"; process{'es' if many else ''} {', '.join(map(str, verdict.waiting))}"
               f" wait{'' if many else 's'} in a collective for it")  # fmt: skip
  return (
    f"process {verdict.rank} (pid {pids[verdict.rank]}) of {n} {verdict.why}{waiting}; {bound};"
    " stopping the processes."
  )
