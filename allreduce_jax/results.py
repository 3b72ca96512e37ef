"""One row store: every command's results as JSON Lines, resumable and hard to corrupt.

Every command that measures or computes rows (``bench``, ``fusion``, ``audit``,
``scaling``, ``verify``, ``train``) writes them through :class:`RowStore`:

- **one JSON object per line**, each carrying ``"schema"`` (:data:`SCHEMA`),
  ``"kind"`` (``"bench"``, ``"fusion"``, ...) and ``"key"``, then the row's own
  fields, so the file stays readable by ``pandas.read_json(path, lines=True)``;
- **keyed on the full configuration**: ``key`` is the canonical JSON of the row's
  identifying fields merged with the store's ``context`` (by default the JAX
  version, backend and process count; tools add iterations, warm-up, dtype, device
  count, cost parameters, ...). A resumed run skips only the rows measured under
  the same configuration (:meth:`RowStore.done`);
- **truncation-safe**: each append is flushed and ``fsync``'d; a half-written last
  line (a run killed mid-write) is skipped by readers with a warning and cut off
  before the next append, which therefore always starts on a fresh line;
- **refusing files that are not its own**: a path that does not end in
  ``.jsonl``, a line that is not a row of this store (a stray JSON value, a row of
  another kind, a user's notes) raises :class:`RowsError`, a one-line message that
  names the file, before any work starts (:meth:`RowStore.check`), and ``--fresh``
  (:meth:`RowStore.reset`) empties only a file the store recognises as its own;
- **append-only**: no command deletes or rewrites rows; a file is only appended to
  (a rerun resumes or adds its rows), and emptied only by ``--fresh``;
- **one writer at a time**: a command holds an exclusive ``flock`` on the file for
  its whole run (:meth:`RowStore.lock`), so a second command writing the same file
  is refused with one line (:class:`RowsError`) instead of measuring everything twice.

Example:
  >>> import tempfile, os
  >>> store = RowStore(os.path.join(tempfile.mkdtemp(), "rows.jsonl"), "demo",
  ...                  context={"iters": 10})
  >>> key = store.key(algorithm="ring", bytes=1024)
  >>> _ = store.append({"algorithm": "ring", "bytes": 1024, "time_us": 5.0}, key)
  >>> key in store.done(), store.key(algorithm="ring", bytes=1024, iters=20) in store.done()
  (True, False)
  >>> [r["time_us"] for r in store.rows()]
  [5.0]
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib.metadata
import json
import os
import platform
import sys
import tempfile
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax

#: The value of every row's ``"schema"`` field (bumped when the row layout changes).
SCHEMA = "allreduce-jax/rows/1"
#: What every row line starts with (``json.dumps`` keeps insertion order).
_PREFIX = b'{"schema": "' + SCHEMA.encode() + b'"'


#: Fields renamed since the first row layout: old name -> new name. Reading an old row
#: adds the new name with the old value, so old files load as new ones.
RENAMED_FIELDS = {
  "algbw_gbps": "algbw_GBps",
  "busbw_gbps": "busbw_GBps",
  "bandwidth_gbps": "bandwidth_GBps",  # training rows and phase cells
}


_interrupted = False


def on_sigint(signum, frame) -> None:
  """SIGINT handler for the commands (``tools.dispatch.run`` installs it): KeyboardInterrupt, as
  Python's own, and a note of it. Where the KeyboardInterrupt lands in a
  garbage-collection callback (JAX registers one), Python prints "Exception ignored"
  and goes on; the next row written (:meth:`RowStore.extend`) then raises it again, so a
  sweep stops at the next row instead of running to its end."""
  global _interrupted
  _interrupted = True
  raise KeyboardInterrupt


def clear_interrupt() -> None:
  global _interrupted
  _interrupted = False


def upgrade(row: dict[str, Any]) -> dict[str, Any]:
  """``row`` with the current name of every renamed field (:data:`RENAMED_FIELDS`).

  Example:
    >>> upgrade({"busbw_gbps": 1.5})
    {'busbw_gbps': 1.5, 'busbw_GBps': 1.5}
  """
  for old, new in RENAMED_FIELDS.items():
    if old in row and new not in row:
      row[new] = row[old]
  return row


class RowsError(ValueError):
  """A results file that is not a row store of the expected kind, or cannot be
  written; the message is one line and names the file."""


#: Stores holding a lock (released by :func:`release_locks`, or when collected).
_LOCKED: weakref.WeakSet = weakref.WeakSet()


def _unlock(fd: int, path: Path, created: bool) -> None:
  try:
    if created and os.fstat(fd).st_size == 0:  # nothing written: leave no empty file
      path.unlink(missing_ok=True)
  except OSError:
    pass
  try:
    fcntl.flock(fd, fcntl.LOCK_UN)
  finally:
    os.close(fd)


def release_locks() -> None:
  """Releases every row-store lock this process holds (the end of a command)."""
  for store in list(_LOCKED):
    store.unlock()


def _write_error(path: Path, e: OSError) -> RowsError:
  why = "the disk is full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
  return RowsError(
    f"{path}: cannot be written ({why}); the rows written before are kept."
    " Free space (or fix the path) and rerun to resume."
  )


def run_key(fields: Mapping[str, Any]) -> str:
  """A canonical string for a run's identifying fields (sorted JSON).

  Example:
    >>> run_key({"b": 1, "a": [1, 2]})
    '{"a": [1, 2], "b": 1}'
  """
  return json.dumps(fields, sort_keys=True, default=list)


def fingerprint(obj: Any) -> str:
  """A short stable hash of a JSON-able object (e.g. cost parameters), for keys.

  Example:
    >>> fingerprint({"alpha_us": 1.0}) == fingerprint({"alpha_us": 1.0})
    True
  """
  return hashlib.sha256(run_key(obj).encode()).hexdigest()[:16]


#: The variable ``allreduce-jax cluster`` sets in every host's environment: its network
#: as JSON (:meth:`allreduce_jax.netns.Plan.describe`), which :func:`run_context` puts
#: in every row's key.
ENV_NETWORK = "ALLREDUCE_JAX_NETWORK"


def run_context() -> dict[str, Any]:
  """The configuration every key carries by default: JAX version, backend, processes,
  and on an emulated cluster (``allreduce-jax cluster``) its network: spec, hosts,
  link rate, queue, MTU and TCP queue (``$ALLREDUCE_JAX_NETWORK``), so rows measured
  on one network never resume or fit another's."""
  context = {
    "jax_version": jax.__version__,
    "backend": jax.default_backend(),
    "process_count": jax.process_count(),
  }
  network = os.environ.get(ENV_NETWORK)
  if network:
    try:
      context["network"] = json.loads(network)
    except ValueError:
      raise ValueError(
        f"${ENV_NETWORK} is not JSON ({network[:60]!r}); it is set by"
        " 'allreduce-jax cluster' for its hosts: unset it."
      ) from None
  return context


def source_commit() -> str:
  """The git commit this package is imported from, short, with ``-dirty`` for uncommitted changes.

  ``""`` where the package is not in a git checkout (an installed wheel) or git is missing. The
  executed notebooks and the report print it, so a reader knows which code made them.
  """
  import subprocess

  try:
    out = subprocess.run(
      ["git", "describe", "--always", "--dirty", "--abbrev=7"],
      cwd=Path(__file__).resolve().parent,
      capture_output=True,
      text=True,
      timeout=10,
    )
  except (OSError, subprocess.SubprocessError):
    return ""
  return out.stdout.strip() if out.returncode == 0 else ""


def environment() -> dict[str, Any]:
  """Versions, backend and device count, stored with every training row."""
  return {
    "jax": jax.__version__,
    "flax": importlib.metadata.version("flax"),
    "optax": importlib.metadata.version("optax"),
    "python": platform.python_version(),
    "backend": jax.default_backend(),
    "devices": len(jax.devices()),
  }


def _warn(message: str) -> None:
  print(f"# warning: {message}", file=sys.stderr, flush=True)


class RowStore:
  """An append-only JSON Lines file of rows of one ``kind``, resumable by key.

  Args:
    path: the file; must end in ``.jsonl``.
    kind: the kind of row (``"bench"``, ``"fusion"``, ...); a file holding rows of
      another kind is refused.
    context: the run-level configuration merged into every :meth:`key`; ``None``
      means :func:`run_context` (JAX version, backend, process count).
  """

  def __init__(self, path: str | os.PathLike, kind: str, context: Mapping | None = None):
    self.path = Path(path)
    self.kind = kind
    self._context = None if context is None else dict(context)
    self._lock = None  # weakref.finalize releasing the flock, while held

  def __repr__(self) -> str:
    return f"RowStore({str(self.path)!r}, {self.kind!r})"

  @property
  def context(self) -> dict[str, Any]:
    if self._context is None:
      self._context = run_context()
    return self._context

  def key(self, fields: Mapping[str, Any] | None = None, /, **more: Any) -> str:
    """The key of a row: its identifying ``fields`` (and ``more``) over the context."""
    return run_key({**self.context, **(fields or {}), **more})

  # -- reading ---------------------------------------------------------------------------

  def _error(self, what: str) -> RowsError:
    return RowsError(f"{self.path}: {what}")

  def _parse(self, data: bytes) -> tuple[list[dict[str, Any]], int | None]:
    """``(rows, torn)``: the rows of ``data``, and the byte offset of a half-written
    last line (``None`` if the file ends cleanly). Raises :class:`RowsError` for
    any complete line that is not a row of this store."""
    rows: list[dict[str, Any]] = []
    end = data.rfind(b"\n") + 1
    torn = end if end < len(data) else None
    if torn is not None:
      tail = data[torn:]
      ours = tail.startswith(_PREFIX[: len(tail)])  # a prefix of a row, or a row cut short
      if not ours and not data[:torn].strip():
        raise self._error(
          "is not an allreduce-jax row file (its first line is not a row);"
          " choose another path or move it aside."
        )
    for n, line in enumerate(data[:end].split(b"\n")[:-1], 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except (json.JSONDecodeError, UnicodeDecodeError):
        raise self._error(
          f"line {n} is not JSON, so this is not an allreduce-jax row file;"
          " choose another path or move it aside."
        ) from None
      if not isinstance(row, dict) or row.get("schema") != SCHEMA:
        raise self._error(
          f'line {n} is not an allreduce-jax row (no "schema": {SCHEMA!r});'
          " choose another path or move the file aside."
        )
      if row.get("kind") != self.kind:
        raise self._error(
          f"holds {row.get('kind')!r} rows, not {self.kind!r} rows; choose another path."
        )
      rows.append(upgrade(row))
    return rows, torn

  def _read(self) -> tuple[list[dict[str, Any]], int | None]:
    if self.path.suffix != ".jsonl":
      raise self._error("rows are written to .jsonl files only; use a path ending in .jsonl.")
    if self.path.is_dir():
      raise self._error("is a folder; expected a .jsonl file.")
    try:
      data = self.path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # absent (check() says why)
      return [], None
    except OSError as e:
      raise self._error(f"cannot be read ({e.strerror or e}).") from None
    return self._parse(data)

  def rows(self) -> list[dict[str, Any]]:
    """Every complete row, in file order; a half-written last line is skipped with a
    warning on stderr. Raises :class:`RowsError` for a file that is not ours."""
    rows, torn = self._read()
    if torn is not None:
      _warn(f"{self.path}: skipping a half-written last line (an interrupted run).")
    return rows

  def done(self) -> dict[str, dict[str, Any]]:
    """``key -> row`` of the finished rows (the last one wins)."""
    return {row["key"]: row for row in self.rows() if "key" in row}

  def current(self) -> list[dict[str, Any]]:
    """The rows measured under this store's configuration: those whose key carries
    every field of :attr:`context` with the same value (e.g. the rows to fit)."""
    ctx = json.loads(run_key(self.context))
    out = []
    for row in self.rows():
      try:
        key = json.loads(row.get("key", ""))
      except (TypeError, ValueError):
        continue
      if isinstance(key, dict) and all(key.get(k) == v for k, v in ctx.items()):
        out.append(row)
    return out

  # -- writing ---------------------------------------------------------------------------

  def check(self) -> None:
    """Before any work: the file is ours (or absent) and can be written.

    Creates missing parent folders; raises :class:`RowsError` otherwise.
    """
    self._read()
    try:
      self.path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
      raise self._error(f"cannot create its folder ({e.strerror or e}).") from None
    # An absent file is probed with a file of this process's own beside it, never by
    # creating and removing the path itself: every process of a multi-process run
    # checks the same path, and one process's removal could delete the file another
    # had just created (and locked), or make that one's own removal fail.
    try:
      try:
        os.close(os.open(self.path, os.O_WRONLY | os.O_APPEND))  # never creates it
      except FileNotFoundError:
        fd, probe = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
      raise self._error(f"cannot be written ({e.strerror or e}).") from None

  def lock(self) -> None:
    """Takes an exclusive lock on the file for this run (``flock``, released by
    :meth:`unlock`, :func:`release_locks` or when the store is collected); creates
    the file if needed (removed again if nothing was written). Raises
    :class:`RowsError` if another run holds it."""
    if self._lock is not None:
      return
    try:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      created = not self.path.exists()
      fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
      raise self._error(f"cannot be written ({e.strerror or e}).") from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      os.close(fd)
      raise self._error(
        "another allreduce-jax run is writing this file right now (it holds its lock);"
        " wait for it to finish or choose another path."
      ) from None
    self._lock = weakref.finalize(self, _unlock, fd, self.path, created)
    _LOCKED.add(self)

  def unlock(self) -> None:
    """Releases :meth:`lock` (nothing if not held)."""
    if self._lock is not None:
      self._lock()
      self._lock = None
    _LOCKED.discard(self)

  def reset(self) -> None:
    """Empties the file (``--fresh``, the only way rows are ever removed) if it is
    one of ours; refuses anything else. The file (and a held lock) stays."""
    self._read()
    if self.path.exists():
      try:
        with open(self.path, "r+b") as f:
          f.truncate(0)
      except OSError as e:
        raise self._error(f"cannot be emptied ({e.strerror or e}).") from None

  def append(self, row: Mapping[str, Any], key: str | None = None) -> dict[str, Any]:
    """Appends one row, syncs it to disk and returns it as stored (see :meth:`extend`)."""
    return self.extend([row], None if key is None else [key])[0]

  def extend(
    self,
    rows: Iterable[Mapping[str, Any]],
    keys: Iterable[str] | None = None,
    *,
    by: Sequence[str] | None = None,
  ) -> list[dict[str, Any]]:
    """Appends rows in one write, syncs them to disk, returns them as stored.

    Each row gets ``schema``, ``kind``, ``key`` (from ``keys`` if given; else, with
    ``by``, :meth:`key` of those of the fields ``by`` names that the row has; else the
    row's own ``"key"`` field, which is then required) and ``finished_at``. A
    half-written last line left by an interrupted run is cut off first, so the new
    rows start on a fresh line.
    """
    if _interrupted:  # a Ctrl-C that was lost where Python ignores exceptions
      raise KeyboardInterrupt
    rows = list(rows)
    if keys is None and by is not None:
      keys = [self.key({f: r[f] for f in by if f in r}) for r in rows]
    keys = [r.get("key") for r in rows] if keys is None else list(keys)
    if len(keys) != len(rows) or any(k is None for k in keys):
      raise ValueError("every row needs a key: pass keys=[store.key(...)] or a 'key' field.")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    stored = [
      {
        "schema": SCHEMA,
        "kind": self.kind,
        "key": k,
        **{f: v for f, v in row.items() if f not in ("schema", "kind", "key")},
        "finished_at": row.get("finished_at") or stamp,
      }
      for row, k in zip(rows, keys)
    ]
    if not stored:
      return stored
    _, torn = self._read()  # refuses a foreign file before touching it
    text = "".join(json.dumps(r, default=_jsonable) + "\n" for r in stored)
    try:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      if torn is not None:
        _warn(f"{self.path}: cutting off a half-written last line (an interrupted run).")
        with open(self.path, "r+b") as f:
          f.truncate(torn)
      data = text.encode()
      fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
      try:
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
          view = memoryview(data)
          while view:
            view = view[os.write(fd, view) :]
          os.fsync(fd)
        except OSError:
          os.ftruncate(fd, start)  # no half row left behind (a full disk)
          raise
      finally:
        os.close(fd)
    except OSError as e:
      raise _write_error(self.path, e) from None
    return stored


def _jsonable(value: Any) -> Any:
  """numpy scalars and tuples in rows -> plain JSON values."""
  if hasattr(value, "item"):
    return value.item()
  if isinstance(value, (set, frozenset, tuple)):
    return list(value)
  raise TypeError(f"{type(value).__name__} is not JSON serializable")


def read_rows(path: str | os.PathLike, kind: str) -> list[dict[str, Any]]:
  """The rows of ``kind`` in ``path`` (none if it does not exist); see :class:`RowStore`."""
  return RowStore(path, kind, context={}).rows()


def write_tables(tables: Mapping[str, str], folder: str | os.PathLike) -> list[Path]:
  """Writes a study's tables, ``{path relative to folder: text}`` (what its ``tables()``
  regenerates from its committed rows), and says which; the one entry point of every
  study's ``tables.py``::

    if __name__ == "__main__":
      results.write_tables(tables(), HERE)
  """
  written = []
  for name, text in tables.items():
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")
    written.append(path)
  return written


# ----------------------------------------------------------------------------------------
# Small state files (JSON, not rows): written atomically, read forgivingly.
# ----------------------------------------------------------------------------------------


def save_json(path: str | os.PathLike, obj: Any) -> None:
  """Writes ``obj`` as JSON atomically: a temporary file, fsync'd, then renamed, so an
  interrupted write leaves the previous content, never half a file."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  with open(tmp, "w") as f:
    f.write(json.dumps(obj, indent=1, default=_jsonable))
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def load_json(path: str | os.PathLike, default: Any = None) -> Any:
  """The JSON in ``path``; ``default`` if it is missing, or (with a warning on stderr)
  unreadable or truncated."""
  path = Path(path)
  try:
    return json.loads(path.read_text())
  except FileNotFoundError:
    return default
  except (OSError, ValueError) as e:
    _warn(f"{path}: ignoring an unreadable state file ({e}); starting it over.")
    return default
