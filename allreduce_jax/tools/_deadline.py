"""A per-run timeout that names the stuck participant (bench ``-T``, as nccl-tests' ``-T``).

Each process counts the calls it has made (:meth:`Deadline.call`) and remembers what it
was running. When the time is up, every process still running publishes that count
through ``jax.distributed``'s key-value store, and process 0 names the participant
that is behind: in a collective everyone waits for the slowest, so the process with
fewer calls than the others is the one not coming (stuck outside the collective:
sleeping, looping, blocked on input); one that does not answer is stopped or dead.
Then every process exits with status 124 (``timeout``'s), at once, not after JAX's
shutdown barrier. The watchdog is a daemon thread: a process blocked inside a
collective still answers, since a JAX call releases the GIL. Every call to the
key-value store is bounded (:data:`ANSWER_S`): process 0 holds the coordinator, so
when it is the one stopped or dead the others say so and exit 124 too, instead of
waiting in that call until JAX's heartbeat check ends them.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import jax

#: How long process 0 waits for the others' counts once the time is up.
ANSWER_S = 3.0
_KEY = "allreduce_jax/deadline"


class Deadline:
  """``seconds`` from :meth:`start` to :meth:`finish`, else the report and exit 124;
  ``what`` starts the report (``bench: -T 30``). A ``seconds`` of None does nothing."""

  def __init__(self, seconds: float | None, what: str):
    self.seconds = seconds
    self.what = what
    self.calls = 0
    self.where = "starting"
    self._done = threading.Event()

  def start(self) -> Deadline:
    if self.seconds is not None:
      threading.Thread(target=self._watch, name="deadline", daemon=True).start()
    return self

  def at(self, where: str) -> None:
    """What this process runs now (``ring 16 MiB float32 sum``)."""
    self.where = where

  def call(self, *_) -> None:
    """One more call made (a collective every participant makes)."""
    self.calls += 1

  def finish(self) -> None:
    self._done.set()

  def _watch(self) -> None:
    if self._done.wait(self.seconds):
      return
    me, n = jax.process_index(), jax.process_count()
    mine = f"{self.calls} {self.where}"
    if n == 1:
      report = f"{self.what} s reached after {self.calls} calls, during {self.where}; stopping."
    else:
      report = self._report(me, n, mine)
    if report:
      print(f"{report}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(124)

  def _report(self, me: int, n: int, mine: str) -> str | None:
    """Publishes this process's count; process 0 collects them and returns the report."""
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    answered, _ = bounded(lambda: client.key_value_set(f"{_KEY}/{me}", mine), ANSWER_S)
    if me != 0:
      if not answered:  # the coordinator (process 0) does not answer
        return (
          f"{self.what} s reached: process 0 did not answer (stopped or dead); process {me}"
          f" made {self.calls} calls, during {self.where}; stopping."
        )
      time.sleep(ANSWER_S + 1)  # process 0 reads the count, then ends the run
      return f"{self.what} s reached in process {me} after {self.calls} calls ({self.where})."
    time.sleep(ANSWER_S)
    _, got = bounded(lambda: client.key_value_dir_get(_KEY), ANSWER_S)
    counts = {int(key.rsplit("/", 1)[1]): value for key, value in got or []}
    return describe(self.what, counts, n)


def bounded(call, seconds: float) -> tuple[bool, object]:
  """``(True, call())``, or ``(False, None)`` if it raised or had not returned after
  ``seconds`` (it goes on in a daemon thread: a key-value call to a stopped coordinator
  blocks).

  Example:
    >>> bounded(lambda: 7, 1.0), bounded(lambda: 1 / 0, 1.0)
    ((True, 7), (False, None))
  """
  result = []

  def run():
    try:
      result.append(call())
    except Exception:  # the coordinator is gone: as if it did not answer
      pass

  thread = threading.Thread(target=run, name="deadline-call", daemon=True)
  thread.start()
  thread.join(seconds)
  return (True, result[0]) if result else (False, None)


def describe(what: str, counts: dict[int, str], n: int) -> str:
  """The report from each answering process's ``"CALLS WHERE"``.

  Example:
    >>> describe("-T 30", {0: "14 ring 1 KiB", 1: "13 ring 1 KiB", 2: "14 ring 1 KiB"}, 4)
    ... # doctest: +NORMALIZE_WHITESPACE
    '-T 30 s reached: process 3 did not answer (stopped or dead); process 1 is stuck: it
    made 13 calls, the others up to 14 (they wait for it in a collective), during ring
    1 KiB; stopping all.'
  """
  calls = {r: int(v.split(" ", 1)[0]) for r, v in counts.items()}
  parts = []
  silent = [r for r in range(n) if r not in counts]
  if silent:
    names = ", ".join(map(str, silent))
    parts.append(f"process {names} did not answer (stopped or dead)")
  if calls and min(calls.values()) < max(calls.values()):
    low = min(calls.values())
    behind = [r for r, c in sorted(calls.items()) if c == low]
    where = counts[behind[0]].split(" ", 1)[1] if " " in counts[behind[0]] else "?"
    parts.append(
      f"process {', '.join(map(str, behind))} is stuck: it made {low} calls, the others up to"
      f" {max(calls.values())} (they wait for it in a collective), during {where}"
    )
  elif calls and not silent:
    any_where = counts[min(counts)].split(" ", 1)[-1]
    parts.append(
      f"every process made {min(calls.values())} calls and waits in {any_where}"
      " (a collective that does not complete, or one too slow for the timeout)"
    )
  return f"{what} s reached: {'; '.join(parts)}; stopping all."
