"""Progress reports a launcher's no-progress watchdog reads (``launch``/``cluster``).

A process started by ``allreduce-jax launch`` or ``cluster`` finds in
``$ALLREDUCE_JAX_PROGRESS`` the path of a file of its own; each report appends one line
to it::

    step 350 1718000000.1234        # a unit of work done (training: the step reached)
    phase restored:300 1718000000.0567  # entering a phase of unknown length
    mark compile=0.412 1718000000.0601  # a fact for the timeline (compile seconds)

The launcher's watchdog (:mod:`allreduce_jax.tools.watchdog`) only looks at the file's
size and new lines, so a report costs one ``write`` (a few microseconds): training reports
each chunk of steps, ``bench`` each call. A ``step`` bounds the next one (the watchdog
waits a multiple of the recent intervals between steps); a ``phase`` (compiling, saving,
shutting down) lifts that bound until the next ``step``. The same lines, with their
wall-clock times, are the run's timeline (:mod:`allreduce_jax.goodput`: the steps kept and
redone, each restart's phases). Outside a launcher (the variable unset) a report does
nothing.

A user script reports the same way::

    from allreduce_jax import progress
    for i in range(steps):
      train_step()
      progress.step(i + 1)

``$ALLREDUCE_JAX_FAULT_SPIN`` (set by ``cluster --fault spin:H@T``) makes ``SIGUSR2``
send this process's main thread into a Python loop that never ends: a process stuck
outside JAX, for the watchdog to find (:func:`install_spin`).
"""

from __future__ import annotations

import os
import signal
import time

ENV_PROGRESS = "ALLREDUCE_JAX_PROGRESS"
ENV_FAULT_SPIN = "ALLREDUCE_JAX_FAULT_SPIN"

#: The open report file (``None``: not opened yet; ``-1``: no launcher asked for reports).
_fd: int | None = None


def _file() -> int:
  global _fd
  if _fd is None:
    path = os.environ.get(ENV_PROGRESS, "")
    try:
      _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else -1
    except OSError:  # an unwritable path: reports are a convenience, never a failure
      _fd = -1
  return _fd


def _write(kind: str, what: str) -> None:
  fd = _file()
  if fd < 0:
    return
  try:
    os.write(fd, f"{kind} {what} {time.time():.4f}\n".encode())
  except OSError:  # pragma: no cover - a full disk must not stop training
    pass


def step(n: int | None = None) -> None:
  """Reports a unit of work done; ``n``: the count reached (training's global step),
  else one more than the last."""
  _write("step", "-" if n is None else str(int(n)))


def phase(name: str) -> None:
  """Reports entering a phase of unknown length (``compiling``, ``saving``,
  ``finishing``): the watchdog waits for the next :func:`step` without its step bound.
  ``name``: one word (spaces become ``_``)."""
  _write("phase", "_".join(str(name).split()) or "-")


def mark(name: str, value: float) -> None:
  """Records a fact for the run's timeline (``compile``: seconds a compilation took);
  the watchdog ignores it."""
  _write("mark", f"{'_'.join(str(name).split())}={value:.4f}")


def watch_compiles() -> None:
  """Marks every compilation JAX reports (``jax.monitoring``: tracing, lowering, the
  backend's compile or the persistent cache's retrieval) with its seconds."""
  if not enabled():
    return
  from jax import monitoring

  def listener(event: str, seconds: float, **_) -> None:
    if "/compile" in event or "cache" in event:
      mark(event.rsplit("/", 1)[-1].removesuffix("_duration"), seconds)

  monitoring.register_event_duration_secs_listener(listener)


def enabled() -> bool:
  """Whether a launcher reads this process's reports."""
  return _file() >= 0


def reset() -> None:
  """Forgets the open file (a test, or a process that changed ``$ALLREDUCE_JAX_PROGRESS``)."""
  global _fd
  if _fd is not None and _fd >= 0:
    os.close(_fd)
  _fd = None


def _spin(signum, frame) -> None:  # the spin fault: Python that never returns to JAX
  phase("spinning")
  x = 0
  while True:
    x += 1


def install_spin() -> bool:
  """Makes ``SIGUSR2`` start the spin fault where ``$ALLREDUCE_JAX_FAULT_SPIN`` asks for
  it (main thread only); returns whether it did."""
  if os.environ.get(ENV_FAULT_SPIN, "") in ("", "0"):
    return False
  try:
    signal.signal(signal.SIGUSR2, _spin)
  except ValueError:  # not the main thread
    return False
  return True
