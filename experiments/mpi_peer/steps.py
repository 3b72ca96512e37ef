"""One message step of the hand-written algorithms alone, against the whole all-reduce; and
halving-doubling's and recursive doubling's rounds traced step by step (``--split``).

Runs on every host of an emulated cluster (one process and one device per host), as
``run.py collectives steps|variants|mca|trace|ring8`` starts it, e.g.

    allreduce-jax cluster --hosts 4 --link 200Mbit --launcher mpirun --collectives mpi -- \\
      python experiments/mpi_peer/steps.py --out experiments/mpi_peer/rows/collectives_steps.jsonl

Every call runs after a barrier and its time is the longest over the processes (``what`` of
each row): ``one_way`` (host 2k to 2k+1), ``exchange`` (r and r XOR 1 swap m bytes),
``exchange_add`` (and add what arrived), ``shift`` (r to r+1), ``PATTERN_chained`` (m under
1 MiB: 20 calls back to back, per call), ``add`` (the jitted add alone) and the whole
``ring``, ``halving_doubling``, ``recursive_doubling``, ``psum``. ``--split`` traces the
five ways of ``trace_steps.MODES`` (``docs/mpi_peer.md`` says what each is) with every
process's start, end and CPU time per call (rows ``trace``), and with ``--mpi-trace`` every
MPI call of XLA's MPI collectives (rows ``mpi_calls``, ``mpi_call_trace.c``): the tracing is
``trace_steps.py``'s, beside this script, with what every timing shares. Process 0 appends the
rows through the row store (kind ``steps``); each names the collectives, Open MPI's
``btl_tcp_*`` settings, ``mpi_yield_when_idle``, ``--mca``, ``--sysctl`` and ``--xla-flag``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from trace_steps import Context, mpi_calls, put, trace

from allreduce_jax import distributed, results
from allreduce_jax.tools.bench import programs
from allreduce_jax.units import parse_size

PATTERNS = ("one_way", "exchange", "exchange_add", "shift")
HERE = Path(__file__).resolve().parent
TRACE_LIB = HERE.parent.parent / "build" / "mpi_call_trace" / "libmpiwrapper.so"
#: The fields that tell one row of a launch from another (its key, over the run's context:
#: the cluster's network), those a row has.
IDENTITY = ("what", "bytes", "algorithm", "mode", "rep", "process")


def pairs(pattern: str, p: int) -> list[tuple[int, int]]:
  """The ``(source, target)`` pairs of one step of ``pattern`` among ``p`` hosts.

  Example:
    >>> pairs("one_way", 4), pairs("exchange", 4)[:2], pairs("shift", 4)[-1]
    ([(0, 1), (2, 3)], [(0, 1), (1, 0)], (3, 0))
  """
  if pattern == "one_way":
    return [(r, r + 1) for r in range(0, p - 1, 2)]
  if pattern in ("exchange", "exchange_add"):
    return [(r, r ^ 1) for r in range(p)]
  if pattern == "shift":
    return [(r, (r + 1) % p) for r in range(p)]
  raise ValueError(f"pattern={pattern!r}: expected one of {', '.join(PATTERNS)}.")


def slowest(ctx: Context, times: list[float]) -> list[float]:
  """Each call's time, the longest over the processes (a receiver waits longest)."""
  every = np.asarray(multihost_utils.process_allgather(np.asarray(times)))
  return [float(t) for t in every.reshape(-1, len(times)).max(axis=0)]


def timed(ctx: Context, fn, x) -> list[float]:
  """``fn(x)`` called ``ctx.reps`` times after one warm-up, each after a barrier."""
  jax.block_until_ready(fn(x))  # compile, connect
  out = []
  for k in range(ctx.reps):
    multihost_utils.sync_global_devices(f"rep{k}")
    t0 = time.perf_counter()
    jax.block_until_ready(fn(x))
    out.append(time.perf_counter() - t0)
  return slowest(ctx, out)


def chained(ctx: Context, fn, x, calls: int = 20) -> list[float]:
  """Per call over ``calls`` calls back to back after a barrier (no barrier skew in a
  small step's time)."""
  jax.block_until_ready(fn(x))
  out = []
  for k in range(ctx.reps):
    multihost_utils.sync_global_devices(f"chain{k}")
    t0 = time.perf_counter()
    for _ in range(calls):
      x = fn(x)
    jax.block_until_ready(x)
    out.append((time.perf_counter() - t0) / calls)
  return slowest(ctx, out)


def step_program(ctx: Context, pattern: str):
  """One ``ppermute`` of ``pattern`` (and the add, for ``exchange_add``), jitted."""
  perm = pairs(pattern, ctx.p)

  def body(b):
    got = lax.ppermute(b, "i", perm)
    return b + got if pattern == "exchange_add" else got

  return jax.jit(jax.shard_map(body, mesh=ctx.mesh, in_specs=ctx.spec, out_specs=ctx.spec))


def row(ctx: Context, what: str, m: int, ts: list[float]) -> dict:
  """One timing's row: the median [min–max] of its calls and every call (printed by
  process 0 as it is taken)."""
  if jax.process_index() == 0:
    print(f"{what:20s} {m:>10d} B  {statistics.median(ts) * 1e3:9.2f} ms", flush=True)
  return {
    "what": what, "bytes": m, "p": ctx.p, "reps": len(ts), **ctx.settings,
    "time_s": statistics.median(ts), "time_s_min": min(ts), "time_s_max": max(ts),
    "times_s": ts,
  }  # fmt: skip


def time_steps(ctx: Context, m: int) -> list[dict]:
  """Every pattern's step of ``m`` bytes (back to back too below 1 MiB) and the add."""
  x = put(ctx, m // 4)
  out = []
  for pattern in PATTERNS:
    out.append(row(ctx, pattern, m, timed(ctx, step_program(ctx, pattern), x)))
    if m < 1 << 20:  # the per-step cost alpha: back to back
      out.append(row(ctx, f"{pattern}_chained", m, chained(ctx, step_program(ctx, pattern), x)))
  add = jax.jit(jnp.add)
  a = jnp.ones((m // 4,), jnp.float32)
  b = jnp.ones((m // 4,), jnp.float32)
  out.append(row(ctx, "add", m, timed(ctx, lambda _: add(a, b), None)))
  return out


def time_allreduce(ctx: Context, algorithm: str, n: int) -> dict:
  """The whole all-reduce of ``n`` bytes per host, as bench runs it."""
  mesh, spec, fn, _ = programs(algorithm, ctx.p, "sum")
  return row(ctx, algorithm, n, timed(ctx, fn, put(ctx, n // 4, mesh, spec)))


def prepare(args: argparse.Namespace) -> tuple[dict, str]:
  """Before MPI and XLA start: the ``--mca`` parameters, ``--sysctl`` values and
  ``--xla-flag`` flags set, MPIwrapper's stamping copy loaded for ``--mpi-trace`` (this
  process started again with it); the settings every row records and the path prefix of
  the processes' MPI call files."""
  sysctls = dict(kv.split("=", 1) for kv in args.sysctl)
  mca = dict(kv.split("=", 1) for kv in args.mca)
  for name, value in mca.items():  # read by Open MPI when XLA's collectives start it
    os.environ[f"OMPI_MCA_{name}"] = value
  for name, value in sysctls.items():  # the namespace's own copy: gone with the cluster
    Path("/proc/sys/net/ipv4", name).write_text(value)
  if args.xla_flag:  # read when XLA's CPU client starts (distributed.initialize_from_env)
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *args.xla_flag]).strip()
  # + .RANK: each process's MPI calls, folded into the rows at the end (one /tmp for all hosts)
  calls = os.path.join(tempfile.gettempdir(), f"steps-{Path(args.out).name}.mpicalls")
  if args.mpi_trace:  # before MPI starts: MPIwrapper's copy that stamps its MPI calls
    if not TRACE_LIB.is_file():
      raise SystemExit(f"steps.py: --mpi-trace needs {TRACE_LIB}: build_mpi_call_trace.sh")
    if os.environ.get(distributed.ENV_MPIWRAPPER) != str(TRACE_LIB):  # read when MPI starts
      env = {**os.environ, distributed.ENV_MPIWRAPPER: str(TRACE_LIB), "MPI_CALL_TRACE": calls}
      os.execve(sys.executable, [sys.executable, *sys.argv], env)
  settings = {
    "collectives": None, "btl_tcp_flags": os.environ.get("OMPI_MCA_btl_tcp_flags"),
    "tcp_mca": {k: v for k, v in os.environ.items() if k.startswith("OMPI_MCA_btl_tcp_")},
    "mca": mca or None, "sysctl": sysctls or None,
    "yield_when_idle": os.environ.get("OMPI_MCA_mpi_yield_when_idle"),
    "xla_flags": args.xla_flag or None,
  }  # fmt: skip
  return settings, calls


def measure(args: argparse.Namespace) -> None:
  """Every timing ``args`` asks for, on this process's host; process 0 appends the rows."""
  settings, calls = prepare(args)
  distributed.initialize_from_env()
  settings["collectives"] = jax.config.jax_cpu_collectives_implementation
  ctx = Context(Mesh(np.array(jax.devices()), ("i",)), jax.device_count(), args.reps, settings)
  rows = []
  for m in (parse_size(s) for s in args.sizes.split(",") if s):
    rows += time_steps(ctx, m)
  n = parse_size(args.allreduce)
  rows += [time_allreduce(ctx, a, n) for a in filter(None, args.algorithms.split(","))]
  for algorithm in filter(None, args.split.split(",")):
    rows += trace(ctx, algorithm, n)
  multihost_utils.sync_global_devices("done")
  if jax.process_index() == 0:
    if args.mpi_trace:
      rows += mpi_calls(calls, ctx.p)
    store = results.RowStore(args.out, "steps")
    store.extend(rows, by=IDENTITY)


#: The settings a launch may change, each given as often as needed and recorded in the rows:
#: ``(option, metavar, help)``.
RECORDED = (
  ("--sysctl", "NAME=VALUE", "set a net.ipv4 sysctl of this host's network namespace first"
   " (as root), e.g. tcp_slow_start_after_idle=0; recorded in the rows"),
  ("--mca", "NAME=VALUE", "an Open MPI MCA parameter for this rank (OMPI_MCA_NAME, set before"
   " MPI starts), e.g. mpi_yield_when_idle=1; recorded in the rows"),
  ("--xla-flag", "FLAG", "add to XLA_FLAGS before XLA starts, e.g."
   " --xla_cpu_enable_concurrency_optimized_scheduler=false; recorded in the rows"),
)  # fmt: skip


def parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--sizes", default="1KiB,2MiB,4MiB,8MiB,16MiB", help="message bytes m")
  ap.add_argument("--allreduce", default="16MiB", help="bytes per host of the whole all-reduces")
  ap.add_argument("--algorithms", default="halving_doubling,recursive_doubling,ring")
  ap.add_argument("--reps", type=int, default=5)
  for flag, metavar, text in RECORDED:
    ap.add_argument(flag, action="append", default=[], metavar=metavar, help=text)
  ap.add_argument("--split", default="", help="trace these algorithms whole and step by step")
  ap.add_argument(
    "--mpi-trace", action="store_true",
    help="stamp every MPI_Irecv, MPI_Isend and MPI_Wait of XLA's MPI collectives too"
    " (mpi_call_trace.c, built by build_mpi_call_trace.sh; --collectives mpi)",
  )  # fmt: skip
  ap.add_argument("--out", required=True, help="the rows' file (.jsonl, appended)")
  return ap


if __name__ == "__main__":
  measure(parser().parse_args())
