"""Results as data: one JSON Lines row per finished run, resumable.

A sweep asks :meth:`Results.done` which run keys already have a row and only runs
the others; each finished run is appended (and flushed to disk) at once, so an
interruption loses at most the run in progress. A half-written last line (the
process died while writing) is cut off before appending again.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any


def run_key(fields: dict[str, Any]) -> str:
  """A canonical string for a run's identifying fields (sorted JSON)."""
  return json.dumps(fields, sort_keys=True, default=list)


def environment() -> dict[str, Any]:
  """Versions, backend and device count, stored with every row."""
  import flax
  import jax
  import optax

  return {
    "jax": jax.__version__,
    "flax": flax.__version__,
    "optax": optax.__version__,
    "python": platform.python_version(),
    "backend": jax.default_backend(),
    "devices": len(jax.devices()),
  }


class Results:
  """An append-only JSONL file of run rows; each row has a ``"key"`` field.

  Example:
    >>> import tempfile, os
    >>> r = Results(os.path.join(tempfile.mkdtemp(), "rows.jsonl"))
    >>> _ = r.append({"key": run_key({"seed": 0}), "acc": 0.9})
    >>> sorted(r.done())
    ['{"seed": 0}']
  """

  def __init__(self, path: str | os.PathLike):
    self.path = Path(path)

  def rows(self) -> list[dict[str, Any]]:
    """Every complete row, in file order (a truncated last line is ignored)."""
    if not self.path.exists():
      return []
    rows = []
    for line in self.path.read_text().splitlines(keepends=True):
      if not line.endswith("\n"):
        break  # half-written by an interrupted run
      line = line.strip()
      if line:
        rows.append(json.loads(line))
    return rows

  def done(self) -> dict[str, dict[str, Any]]:
    """``key -> row`` of the finished runs."""
    return {row["key"]: row for row in self.rows()}

  def append(self, row: dict[str, Any]) -> dict[str, Any]:
    """Appends one finished run, syncs it to disk and returns the row as stored."""
    if "key" not in row:
      raise ValueError("row must have a 'key' field (see run_key).")
    self.path.parent.mkdir(parents=True, exist_ok=True)
    if self.path.exists():
      text = self.path.read_bytes()
      if text and not text.endswith(b"\n"):  # drop a half-written line
        with open(self.path, "r+b") as f:
          f.truncate(text.rfind(b"\n") + 1)
    row = {**row, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")
      f.flush()
      os.fsync(f.fileno())
    return row
