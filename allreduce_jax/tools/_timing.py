"""The one timer of the tools: compile apart, warm up, time round robin, return records.

Every measurement in ``bench``, ``fusion``, the report and
``experiments/training_step/ring_loop_choice.py`` goes through :func:`time_round_robin`:

- inputs are placed on their devices by the caller before timing;
- each program is lowered and compiled separately (compile time and XLA's
  temporary memory recorded), so no timed call includes compilation;
- ``warmup`` untimed rounds, then ``iters`` timed rounds in which each program runs
  once, **round robin** (call 1 of every program, then call 2, ...), every call ended
  by ``block_until_ready``: a slow spell of a shared machine hits all programs alike,
  so their ratios stay meaningful;
- ``trials`` repeats the timed rounds; the reported time is the median of the
  per-trial medians, with the spread (min, max, IQR) over every timed call.

``order="blocks"`` times one program after the other instead (its warm-up, then all
its timed calls): slower drift then hits programs unequally, but no program's calls
follow another's. On a network with deep queues that matters: measured on an
emulated 8-host switch, ``psum`` at 16 MiB took 1.3 s alone and 5.2 s when each of its
calls came right after a parameter server's (``naive``), whose incast left the
shared TCP connections slow; ``allreduce-jax bench --order blocks`` measures each
algorithm after its own warm-up.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import jax
import numpy as np

from allreduce_jax import progress


@dataclass(frozen=True)
class Timing:
  """Timed calls of one compiled program.

  Attributes:
    times_s: every timed call, in seconds, in order (``trials × iters`` of them).
    compile_s: lowering + compilation time, in seconds.
    temp_bytes: XLA's temporary buffer size per device (``memory_analysis``), or -1.
    trials: how many repetitions of the timed rounds ``times_s`` holds.
    compiled: the compiled program (call it again to check its result).
  """

  times_s: tuple[float, ...]
  compile_s: float
  temp_bytes: int = -1
  trials: int = 1
  compiled: Callable | None = field(default=None, repr=False, compare=False)

  def _per_trial(self) -> list[tuple[float, ...]]:
    k = len(self.times_s) // self.trials
    return [self.times_s[j * k : (j + 1) * k] for j in range(self.trials)]

  @property
  def median_s(self) -> float:
    """The median of the per-trial medians (the median of all calls for one trial)."""
    return statistics.median(statistics.median(t) for t in self._per_trial())

  @property
  def iqr_s(self) -> float:
    q = np.percentile(self.times_s, [25, 75])
    return float(q[1] - q[0])

  @property
  def min_s(self) -> float:
    return min(self.times_s)

  @property
  def max_s(self) -> float:
    return max(self.times_s)

  def row(self) -> dict:
    """The timing fields of a result row, in µs: ``time_us`` (median), ``time_us_min``,
    ``time_us_max``, ``time_us_iqr``, plus ``iters``, ``trials``, ``compile_s`` and
    ``temp_bytes``.

    Example:
      >>> Timing((1e-6, 3e-6, 2e-6), compile_s=0.5).row()["time_us"]
      2.0
    """
    return {
      "time_us": self.median_s * 1e6,
      "time_us_min": self.min_s * 1e6,
      "time_us_max": self.max_s * 1e6,
      "time_us_iqr": self.iqr_s * 1e6,
      "iters": len(self.times_s) // self.trials,
      "trials": self.trials,
      "compile_s": self.compile_s,
      "temp_bytes": self.temp_bytes,
    }


def compile_timed(jitted: Callable, *args) -> tuple[Callable, float, int]:
  """Lowers and compiles ``jitted`` for ``args``; returns ``(compiled, seconds, temp_bytes)``."""
  t0 = time.perf_counter()
  compiled = jitted.lower(*args).compile()
  compile_s = time.perf_counter() - t0
  temp = -1
  try:
    mem = compiled.memory_analysis()
    if mem is not None:
      temp = int(mem.temp_size_in_bytes)
  except Exception:  # pragma: no cover - not every backend reports it
    pass
  return compiled, compile_s, temp


ORDERS = ("round-robin", "blocks")


def time_round_robin(
  programs: Sequence[tuple[Callable, tuple]],
  iters: int = 10,
  warmup: int = 2,
  trials: int = 1,
  order: str = "round-robin",
  on_call: Callable[[int], None] | None = None,
) -> list[Timing]:
  """Compiles each ``(jitted, args)`` program, then times them side by side.
  ``on_call(k)``, if given, runs before each call of program ``k`` (a watchdog's count).

  Returns one :class:`Timing` per program, in order. ``order``: ``"round-robin"``
  (call k of every program, then call k + 1) or ``"blocks"`` (every call of one
  program, warm-up first, then the next program's); see the module's docstring.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> x = jnp.ones(4)
    >>> a, b = time_round_robin([(jax.jit(lambda v: v + 1), (x,)),
    ...                          (jax.jit(lambda v: v * 2), (x,))], iters=5, warmup=1)
    >>> len(a.times_s), a.median_s > 0, b.compile_s > 0
    (5, True, True)
  """

  if iters < 1 or warmup < 0 or trials < 1:
    raise ValueError(
      f"--iters and trials must be at least 1 and --warmup at least 0"
      f" (got iters={iters}, warmup={warmup}, trials={trials})."
    )
  if order not in ORDERS:
    raise ValueError(f"--order must be one of {', '.join(ORDERS)}, got {order!r}.")
  progress.phase("compiling")  # a launcher's watchdog: then a step a call, bounded
  built = [(compile_timed(fn, *args), args) for fn, args in programs]
  times: list[list[float]] = [[] for _ in built]
  # the calls in the order they run: (program, timed?)
  if order == "blocks":
    calls = [(k, j >= warmup) for k in range(len(built)) for j in range(warmup + trials * iters)]
  else:
    calls = [(k, j >= warmup) for j in range(warmup + trials * iters) for k in range(len(built))]
  for i, (k, timed) in enumerate(calls):
    (compiled, *_), args = built[k]
    if order == "blocks" and i and k != calls[i - 1][0]:
      progress.phase("warming up")  # another program: its first call sets the watchdog's scale
    if on_call is not None:
      on_call(k)
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    progress.step()
    if timed:
      times[k].append(time.perf_counter() - t0)
  progress.phase("timed")  # what the caller does next (checks, rows) is not a call
  return [
    Timing(tuple(ts), compile_s, temp, trials, compiled)
    for ((compiled, compile_s, temp), _), ts in zip(built, times)
  ]


def time_compiled(jitted: Callable, *args, iters: int = 10, warmup: int = 2) -> Timing:
  """:func:`time_round_robin` of one program."""
  (timing,) = time_round_robin([(jitted, args)], iters, warmup)
  return timing
