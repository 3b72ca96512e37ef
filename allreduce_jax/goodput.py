"""Goodput under a failure schedule: schedules, a run's timeline, and the arithmetic.

A **schedule** draws failures as a Poisson process (exponential gaps of mean ``mtbf_s``),
each of a kind (``kill``, ``stop``, ``down`` for good) and on a host drawn uniformly;
:meth:`Failure.spec` writes it as ``cluster --fault``. The same schedule drives the
restarting run, the elastic run, a peer framework's run and the simulated parameter
server, so their figures are of the same failures.

A run's **timeline** is read from its log folder (:func:`read_run`): each attempt's
launcher events (``launcher.jsonl``: started, named, stopped), each process's progress
reports (``progress-R``, :mod:`allreduce_jax.progress`: phases, compile marks and the
step reached at the end of every chunk of training steps) and the faults applied
(``faults.jsonl``). A chunk is **kept** when no later attempt redid it: every chunk of the
last attempt that trained, and of an earlier attempt those that end at or before the step
the next attempt that trained resumed from (an attempt that failed before it restored or
started afresh, or found the run already done, redoes nothing). Then:

- **goodput** = the time spent computing kept chunks / the wall time from the first
  chunk's start to the last chunk's end (a chunk's time runs from the previous report
  or the last compilation before it, whichever is later, to its own report);
- each **recovery** splits the time from a failure to the first new step (a step past
  the one the failed attempt had reached) into detection (the fault to the launcher
  naming it), stop, restart (the next attempt started), start (its processes imported),
  join (``jax.distributed``), load and restore (the data, the checkpoint), compile and
  first chunk, and redo (the steps since the checkpoint, done again).

Example:
  >>> sched = poisson_schedule(60.0, 180.0, hosts=4, seed=0)
  >>> [f.spec for f in sched][:2]
  ['stop:1@40.80', 'kill:0@41.98']
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: The compile events :mod:`.progress` marks that are time spent compiling.
COMPILE_MARKS = ("jaxpr_trace", "jaxpr_to_mlir_module", "backend_compile")

#: The kinds of failure a schedule draws from: a killed process, a stopped one, a host
#: whose links go down for good.
KINDS = ("kill", "stop", "down")


@dataclass(frozen=True)
class Failure:
  """One failure of a schedule: ``kind`` on ``host`` at ``at`` seconds."""

  at: float
  kind: str
  host: int

  @property
  def spec(self) -> str:
    """As ``cluster --fault`` takes it (a link down is down for good)."""
    return f"{self.kind}:{self.host}@{self.at:.2f}" + ("+inf" if self.kind == "down" else "")


def poisson_schedule(
  mtbf_s: float, duration_s: float, hosts: int, kinds: tuple[str, ...] = KINDS, seed: int = 0
) -> list[Failure]:
  """Failures in ``[0, duration_s)`` as a Poisson process of mean gap ``mtbf_s``, each of
  a kind drawn uniformly from ``kinds`` on a host drawn uniformly from ``0..hosts-1``.

  The draws come from ``numpy.random.default_rng(seed)`` in a fixed order (gap, kind,
  host), so one seed gives one schedule on every machine.
  """
  if not mtbf_s > 0 or not duration_s > 0 or hosts < 1 or not kinds:
    raise ValueError(
      f"a schedule needs mtbf_s > 0, duration_s > 0, hosts >= 1 and kinds; got {mtbf_s},"
      f" {duration_s}, {hosts}, {kinds}."
    )
  rng = np.random.default_rng(seed)
  out, t = [], 0.0
  while True:
    t += float(rng.exponential(mtbf_s))
    kind = kinds[int(rng.integers(len(kinds)))]
    host = int(rng.integers(hosts))
    if t >= duration_s:
      return out
    out.append(Failure(round(t, 2), kind, host))


# ------------------------------------------------------------------ a run's timeline


@dataclass(frozen=True)
class Chunk:
  """Steps ``(first, last]`` of one attempt, computed from ``start`` to ``end`` (unix)."""

  attempt: int
  first: int
  last: int
  start: float
  end: float

  @property
  def seconds(self) -> float:
    return self.end - self.start


@dataclass
class Attempt:
  """One attempt of a restarting run, as its log folder tells it.

  Attributes:
    index: 0, then 1.. for each restart.
    events: the launcher's events by name (``started``, ``named``, ``stopped``).
    named_rank: the process the launcher named when it failed (None: none or it ended well).
    reports: per rank, its progress lines as ``(kind, what, unix)``.
    restored: the step it resumed from (None: it started afresh or never got there).
    trained: whether it got to training (it reported ``restored:S`` or ``fresh``).
    chunks: the chunks of steps it completed (every process had reported them).
    hosts: how many processes it ran.
  """

  index: int
  events: dict[str, dict]
  named_rank: int | None
  reports: list[list[tuple[str, str, float]]]
  restored: int | None = None
  trained: bool = False
  chunks: list[Chunk] = field(default_factory=list)
  hosts: int = 0

  def phase(self, name: str, last: bool = True) -> float | None:
    """When the slowest process (``last``; else the quickest) reported the phase
    ``name`` (a prefix: ``restored`` matches ``restored:300``), None if none did."""
    times = []
    for lines in self.reports:
      hit = [t for kind, what, t in lines if kind == "phase" and what.startswith(name)]
      if hit:
        times.append(hit[0])
    if not times or (last and len(times) < len(self.reports)):
      return None
    return max(times) if last else min(times)

  def compile_s(self, until: float | None = None) -> float:
    """Seconds the slowest process spent compiling up to ``until`` (unix; None: the whole
    attempt): JAX's tracing, lowering and backend compiles (or cache reads) it marked."""
    per = [
      sum(
        float(what.split("=")[1])
        for kind, what, t in lines
        if kind == "mark" and what.split("=")[0] in COMPILE_MARKS and (until is None or t <= until)
      )
      for lines in self.reports
    ]
    return max(per, default=0.0)

  @property
  def reached(self) -> int | None:
    """The last step every process completed in this attempt."""
    return self.chunks[-1].last if self.chunks else None


def _read_lines(path: Path) -> list[tuple[str, str, float]]:
  out = []
  if not path.exists():
    return out
  for line in path.read_text(errors="replace").splitlines():
    parts = line.split(" ")
    if len(parts) == 3:
      try:
        out.append((parts[0], parts[1], float(parts[2])))
      except ValueError:
        continue
  return out


def _jsonl(path: Path) -> list[dict]:
  if not path.exists():
    return []
  return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def read_attempt(folder: Path, index: int) -> Attempt:
  """The attempt whose launcher wrote ``folder`` (``launcher.jsonl``, ``progress-R``)."""
  events = {e["event"]: e for e in _jsonl(folder / "launcher.jsonl")}
  n = events.get("started", {}).get("processes", 0)
  reports = [_read_lines(folder / f"progress-{r}") for r in range(n)]
  a = Attempt(index, events, events.get("named", {}).get("rank"), reports, hosts=n)
  restored = [
    w for lines in reports for k, w, _ in lines if k == "phase" and w.startswith("restored:")
  ]
  a.restored = int(restored[0].split(":")[1]) if restored else None
  a.trained = bool(restored) or any(
    k == "phase" and w == "fresh" for lines in reports for k, w, _ in lines
  )
  a.chunks = _chunks(index, reports)
  return a


def _chunks(index: int, reports: list[list[tuple[str, str, float]]]) -> list[Chunk]:
  """The chunks every process reported: a chunk ends at its step's last report and
  starts at the previous step's last report, or, for the first chunk after a phase,
  at the latest report or compile mark before it."""
  if not reports or any(not lines for lines in reports):
    return []
  ends: dict[int, list[float]] = {}
  for lines in reports:
    for kind, what, t in lines:
      if kind == "step" and what.lstrip("-").isdigit():
        ends.setdefault(int(what), []).append(t)
  done = sorted(s for s, ts in ends.items() if len(ts) == len(reports))
  chunks: list[Chunk] = []
  prev_step, prev_t = None, None
  for s in done:
    end = max(ends[s])
    if prev_step is None:  # after the phases: from the last thing any process did before
      before = [t for lines in reports for kind, _, t in lines if kind != "step" and t < end]
      start = max(before) if before else end
      first = _restored(reports) or 0
    else:
      marks = [
        t for lines in reports for kind, _, t in lines if kind == "mark" and prev_t < t < end
      ]
      start, first = max([prev_t, *marks]), prev_step
    chunks.append(Chunk(index, first, s, start, end))
    prev_step, prev_t = s, end
  return chunks


def _restored(reports) -> int | None:
  for lines in reports:
    for kind, what, _ in lines:
      if kind == "phase" and what.startswith("restored:"):
        return int(what.split(":")[1])
  return None


@dataclass(frozen=True)
class Recovery:
  """One failure and what it cost, in seconds (see the module's docstring); ``total``:
  the failure to the first new step."""

  fault: str | None
  at: float
  detect: float
  stop: float
  restart: float
  start: float
  join: float
  load_restore: float
  first_chunk: float
  compile: float
  redo: float
  total: float
  resumed_from: int | None
  reached: int | None


@dataclass
class Timeline:
  """A run's attempts (in order) and the faults applied to it (``faults.jsonl`` rows)."""

  attempts: list[Attempt]
  faults: list[dict]

  def resumed_after(self, k: int) -> int | None:
    """The step the first attempt after attempt ``k`` that trained resumed from (0:
    afresh); None when none did, so nothing attempt ``k`` did was redone."""
    later = [b for b in self.attempts[k + 1 :] if b.trained]
    return (later[0].restored or 0) if later else None

  def kept(self) -> list[Chunk]:
    """The chunks no later attempt redid."""
    out = []
    for k, a in enumerate(self.attempts):
      limit = self.resumed_after(k)
      out += [c for c in a.chunks if limit is None or c.last <= limit]
    return out

  @property
  def start(self) -> float | None:
    firsts = [a.chunks[0].start for a in self.attempts if a.chunks]
    return min(firsts) if firsts else None

  @property
  def end(self) -> float | None:
    lasts = [a.chunks[-1].end for a in self.attempts if a.chunks]
    return max(lasts) if lasts else None

  @property
  def wall_s(self) -> float:
    return (self.end - self.start) if self.start is not None else 0.0

  def goodput(self) -> float:
    """The share of the wall time spent computing chunks that were kept."""
    wall = self.wall_s
    return sum(c.seconds for c in self.kept()) / wall if wall > 0 else math.nan

  def kept_steps(self) -> int:
    """Steps done and kept (the last step of the run's last chunk)."""
    kept = self.kept()
    return max((c.last for c in kept), default=0)

  def summary(self) -> dict:
    """The run in a row: its goodput, wall time, steps kept and redone, each attempt's
    span (``launched``: when the launcher started it) and each recovery (seconds relative to
    the first chunk's start: the wall time counts from it), and the kept
    steps over time (``kept``: ``[seconds, step]`` at each kept chunk's end)."""
    t0 = self.start or 0.0
    rel = lambda t: None if t is None else round(t - t0, 3)  # noqa: E731
    kept = self.kept()
    limits = [self.resumed_after(k) for k in range(len(self.attempts))]
    redone = sum(
      max(0, (a.reached or 0) - limit)
      for a, limit in zip(self.attempts, limits)
      if limit is not None
    )
    return {
      "goodput": round(self.goodput(), 5),
      "wall_s": round(self.wall_s, 3),
      "kept_steps": self.kept_steps(),
      "redone_steps": redone,
      "attempts": [
        {
          "hosts": a.hosts,
          "launched": rel(a.events.get("started", {}).get("unix")),
          "restored": a.restored,
          "reached": a.reached,
          "start": rel(a.chunks[0].start if a.chunks else None),
          "end": rel(a.chunks[-1].end if a.chunks else None),
        }
        for a in self.attempts
      ],
      "recoveries": [
        {
          k: (rel(v) if k == "at" else round(v, 4) if isinstance(v, float) else v)
          for k, v in dataclasses.asdict(r).items()
        }
        for r in self.recoveries()
      ],
      "faults": [
        {"fault": f["fault"], "event": f["event"], "host": f.get("host"), "at": rel(f["unix_time"])}
        for f in self.faults
      ],
      "kept": [[rel(c.end), c.last] for c in kept],
    }

  def recoveries(self) -> list[Recovery]:
    """One :class:`Recovery` per restart (attempt k failed, attempt k + 1 resumed)."""
    out = []
    for a, b in zip(self.attempts, self.attempts[1:]):
      named = a.events.get("named", {}).get("unix")
      stopped = a.events.get("stopped", {}).get("unix")
      fault = self._fault_before(named, a)
      at = fault["unix_time"] if fault else named
      started = b.events.get("started", {}).get("unix")
      joining, joined = b.phase("joining"), b.phase("joined")
      restored = b.phase("restored") or b.phase("fresh")
      loading = b.phase("loading")
      first = b.chunks[0].end if b.chunks else None
      new = next((c.end for c in b.chunks if a.reached is None or c.last > a.reached), None)
      diff = lambda x, y: (x - y) if x is not None and y is not None else math.nan  # noqa: E731
      out.append(Recovery(
        fault=fault["fault"] if fault else None, at=at,
        detect=diff(named, at), stop=diff(stopped, named), restart=diff(started, stopped),
        start=diff(joining, started), join=diff(joined, joining),
        load_restore=diff(restored, loading), first_chunk=diff(first, restored),
        compile=b.compile_s(first), redo=diff(new, first), total=diff(new, at),
        resumed_from=b.restored, reached=a.reached,
      ))  # fmt: skip
    return out

  def _fault_before(self, named: float | None, a: Attempt) -> dict | None:
    """The last fault applied before the launcher named attempt ``a``'s failure, and
    after it started."""
    if named is None:
      return None
    start = a.events.get("started", {}).get("unix", -math.inf)
    hits = [f for f in self.faults if f.get("event") != "up" and start <= f["unix_time"] <= named]
    return hits[-1] if hits else None


def read_run(log_dir: str | Path) -> Timeline:
  """The timeline of the run whose launcher wrote ``log_dir`` (attempt 0 there, restart K
  in ``restart-K``)."""
  root = Path(log_dir)
  attempts = [read_attempt(root, 0)]
  k = 1
  while (root / f"restart-{k}").is_dir():
    attempts.append(read_attempt(root / f"restart-{k}", k))
    k += 1
  return Timeline(attempts, _jsonl(root / "faults.jsonl"))


def committed(paths: list[Path], t0: float) -> dict:
  """The steps a peer framework committed, from progress files in :mod:`.progress`'s line
  format (``step S`` when step S was committed, ``mark dropped=S`` when a step was not):
  ``kept``, ``[seconds since t0, step]`` each time the highest step rose; ``committed`` and
  ``dropped``, the reports of each kind over every file (torchft's share of steps
  committed is ``committed / (committed + dropped)``)."""
  reports, n_ok, n_dropped = [], 0, 0
  for path in paths:
    for kind, what, t in _read_lines(Path(path)):
      if kind == "step" and what.isdigit():
        reports.append((t - t0, int(what)))
        n_ok += 1
      elif kind == "mark" and what.startswith("dropped="):
        n_dropped += 1
  kept, top = [], 0
  for t, s in sorted(reports):
    if s > top:
      kept.append([round(t, 3), s])
      top = s
  return {"kept": kept, "committed": n_ok, "dropped": n_dropped}


def full_steps(row: dict) -> float:
  """A run's row's kept steps, a step trained by fewer workers than the run's hosts
  (``--elastic``) counted as the share of the examples it took (the row's ``segments``:
  ``from_step``, ``to_step``, ``workers``; the kept steps as they are without them)."""
  segments = row.get("segments") or []
  if not segments:
    return row["kept_steps"]
  return sum((g["to_step"] - g["from_step"]) * g["workers"] for g in segments) / row["hosts"]


def priced_on_own_hosts(row: dict, rate: float) -> float | None:
  """The goodput of an ``--elastic`` run's row (:meth:`Timeline.summary` with its
  ``segments``) priced for hosts with cores of their own: each step trained on fewer hosts
  than the run's takes the uninterrupted runs' step time (``1 / rate``, ``rate`` their
  steps a second; emulated hosts that share cores step faster when fewer), and its
  :func:`full_steps` are set against what the uninterrupted runs train in that wall time.
  None: no step on fewer hosts."""
  short = [g for g in row.get("segments") or [] if g["workers"] < row["hosts"]]
  if not short:
    return None
  extra = 0.0  # seconds the short segments would take more at the uninterrupted step time
  for g in short:
    pts = [(t, s) for t, s in row["kept"] if g["from_step"] < s <= g["to_step"]]
    if len(pts) > 1 and pts[-1][0] > pts[0][0]:
      measured = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
      extra += (g["to_step"] - g["from_step"]) * (1 / rate - 1 / measured)
  return full_steps(row) / (rate * (row["wall_s"] + extra))


def median_range(xs: list[float]) -> tuple[float, float, float]:
  """``(median, min, max)`` of the finite values (NaNs left out), all NaN if none."""
  xs = [x for x in xs if x == x]
  if not xs:
    return (math.nan, math.nan, math.nan)
  return (statistics.median(xs), min(xs), max(xs))
