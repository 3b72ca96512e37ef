"""A ``launch`` or ``cluster`` run as a child process, and a signal sent to one of its
processes once the run has got somewhere: what the tests of kills, stops and restarts share."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def signal_when(
  proc: subprocess.Popen, ready: Callable[[], bool], logs: Path, rank: int, sig: int, *,
  within: float = 300, settle: float = 0, wait: float = 300,
) -> tuple[str, str, float]:  # fmt: skip
  """Once ``ready()`` holds (``proc`` still running, at most ``within`` s), ``settle`` s
  later sends ``sig`` to process ``rank`` of ``proc`` (read from ``logs/pids.json``, its
  ``--log-dir``) and waits at most ``wait`` s for ``proc`` to end. Returns its ``(stdout,
  stderr, seconds from the signal to the end)``; ``proc`` is killed if it still runs when
  this returns or fails."""
  try:
    deadline = time.monotonic() + within
    while not ready():
      assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
      time.sleep(0.05)
    time.sleep(settle)
    os.kill(json.loads((logs / "pids.json").read_text())[str(rank)], sig)
    sent = time.monotonic()
    out, err = proc.communicate(timeout=wait)
    return out, err, time.monotonic() - sent
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()


def says(path: Path, text: str) -> bool:
  """Whether the file ``path`` exists and holds ``text``."""
  return path.exists() and text in path.read_text(errors="replace")
