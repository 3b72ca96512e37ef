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
five ways of :data:`MODES` (``docs/mpi_peer.md`` says what each is) with every process's
start, end and CPU time per call (rows ``trace``), and with ``--mpi-trace`` every MPI call
of XLA's MPI collectives (rows ``mpi_calls``, ``mpi_call_trace.c``). Process 0 appends the
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
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from allreduce_jax import devices, distributed, results
from allreduce_jax.tools.bench import programs, verifiable_input
from allreduce_jax.units import parse_size

PATTERNS = ("one_way", "exchange", "exchange_add", "shift")
MODES = ("whole", "split", "barriered", "paired", "whole_paired")  # --split's ways to run them
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


def split_steps(algorithm: str, p: int) -> list[tuple[str, int]]:
  """The message steps of ``algorithm`` (p a power of two) as ``(kind, mask)``: the partner
  of r is r XOR mask; ``reduce`` keeps one half and adds the other half's partner copy,
  ``gather`` places the received range beside its own, ``exchange`` adds the whole buffer.

  Example:
    >>> split_steps("halving_doubling", 4), split_steps("recursive_doubling", 4)
    ([('reduce', 2), ('reduce', 1), ('gather', 1), ('gather', 2)], [('exchange', 1), ('exchange', 2)])
  """
  if p < 2 or p & (p - 1):
    raise ValueError(f"p={p}: --split needs a power of two of at least 2 hosts.")
  masks = [1 << k for k in range(p.bit_length() - 1)]  # 1, 2, ..., p/2
  if algorithm == "halving_doubling":  # far partners first (MPICH), as the library's
    return [("reduce", m) for m in masks[::-1]] + [("gather", m) for m in masks]
  if algorithm == "recursive_doubling":
    return [("exchange", m) for m in masks]
  raise ValueError(f"--split={algorithm!r}: expected halving_doubling or recursive_doubling.")


@dataclass(frozen=True)
class Context:
  """What every timing of one launch shares: its mesh over the processes' devices, their
  count ``p``, the calls timed per measurement and the settings every row records."""

  mesh: Mesh
  p: int
  reps: int
  settings: dict

  @property
  def spec(self) -> P:
    return P("i")


def put(ctx: Context, count: int, mesh: Mesh | None = None, spec: P | None = None) -> jax.Array:
  """``f32[p, count]``, bench's verifiable input, one row on each device."""
  return verifiable_input(mesh or ctx.mesh, spec or ctx.spec, ctx.p, count)


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


def step_body(p: int, kind: str, mask: int, hello: bool = False):
  """The shard_map body of one of :func:`split_steps`' steps on this device's
  ``f32[1, c]``; ``hello``: 4 bytes with the partner first (the step's message waits for
  them)."""
  perm = [(r, r ^ mask) for r in range(p)]

  def body(x):  # x: this device's f32[1, c]
    v = x.reshape(-1)
    if hello:
      v, _ = lax.optimization_barrier((v, lax.ppermute(v[:1], "i", perm)))
    bit = (lax.axis_index("i") // mask) % 2  # which half this rank keeps or holds
    if kind == "exchange":
      out = v + lax.ppermute(v, "i", perm)
    elif kind == "reduce":
      half = v.shape[0] // 2
      keep = lax.dynamic_slice_in_dim(v, bit * half, half)
      give = lax.dynamic_slice_in_dim(v, (1 - bit) * half, half)
      out = keep + lax.ppermute(give, "i", perm)
    else:  # gather
      h = v.shape[0]
      got = lax.ppermute(v, "i", perm)
      out = lax.dynamic_update_slice_in_dim(jnp.zeros((2 * h,), v.dtype), v, bit * h, 0)
      out = lax.dynamic_update_slice_in_dim(out, got, (1 - bit) * h, 0)
    return out.reshape(1, -1)

  return body


def jitted(ctx: Context, body):
  return jax.jit(
    jax.shard_map(body, mesh=ctx.mesh, in_specs=ctx.spec, out_specs=ctx.spec, check_vma=False)
  )


def steps_in_one(ctx: Context, steps: list[tuple[str, int]]):
  """The steps in one jitted program, each after 4 bytes with its partner."""
  bodies = [step_body(ctx.p, kind, mask, hello=True) for kind, mask in steps]

  def body(x):
    for b in bodies:
      x = b(x)
    return x

  return jitted(ctx, body)


def hello_program(ctx: Context, mask: int):
  """4 bytes exchanged with the partner r XOR ``mask``."""
  perm = [(r, r ^ mask) for r in range(ctx.p)]
  return jitted(ctx, lambda v: lax.ppermute(v, "i", perm))


def stamped(fn, x):
  """``fn(x)`` and its stamps: start, end (ns of the one clock), this process's CPU ns."""
  t0, c0 = time.perf_counter_ns(), time.process_time_ns()
  y = jax.block_until_ready(fn(x))
  return y, (t0, time.perf_counter_ns(), time.process_time_ns() - c0)


def local(y) -> np.ndarray:
  return np.asarray(y.addressable_shards[0].data).reshape(-1)


def gathered(ctx: Context, stamps: list[tuple]) -> np.ndarray:
  """Every process's stamps, ``f64[p, calls, 3]`` in seconds, to the microsecond."""
  us = np.asarray(stamps, np.int64) // 1000
  seconds = (us // 10**6).astype(np.float64) + (us % 10**6) * 1e-6
  return devices.gather_float64(seconds).reshape(ctx.p, len(stamps), 3)


def trace(ctx: Context, algorithm: str, n: int) -> list[dict]:
  """``ctx.reps`` rounds of :data:`MODES` in turn, each after a barrier: one row per
  (mode, round) with every process's stamps, seconds after the round's first start."""
  steps = split_steps(algorithm, ctx.p)
  fns = [jitted(ctx, step_body(ctx.p, kind, mask)) for kind, mask in steps]
  mesh, spec, whole, _ = programs(algorithm, ctx.p, "sum")
  x = put(ctx, n // 4)
  y = x
  for f in fns:  # compile, connect
    y = jax.block_until_ready(f(y))
  want = local(jax.block_until_ready(whole(put(ctx, n // 4, mesh, spec))))
  got = local(y)
  if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-5):
    raise SystemExit(f"steps.py: --split {algorithm}: the steps' result differs from the whole's")
  xw = put(ctx, n // 4, mesh, spec)
  hello = {mask: hello_program(ctx, mask) for _, mask in steps}
  token = put(ctx, 1)
  for h in hello.values():  # compile, connect
    jax.block_until_ready(h(token))
  paired_whole = steps_in_one(ctx, steps)
  if not np.allclose(local(jax.block_until_ready(paired_whole(x))), want, rtol=1e-5, atol=1e-5):
    raise SystemExit(f"steps.py: --split {algorithm}: the paired program's result differs")
  out = []
  for k in range(ctx.reps):
    for mode in MODES:
      multihost_utils.sync_global_devices(f"{algorithm}{mode}{k}")
      if mode == "whole":
        stamps = [stamped(whole, xw)[1]]
      elif mode == "whole_paired":
        stamps = [stamped(paired_whole, x)[1]]
      else:
        y, stamps = x, []
        for i, f in enumerate(fns):
          if mode == "barriered":
            multihost_utils.sync_global_devices(f"{algorithm}{mode}{k}.{i}")
          if mode == "paired":  # the two partners start the step together
            jax.block_until_ready(hello[steps[i][1]](token))
          y, st = stamped(f, y)
          stamps.append(st)
      every = gathered(ctx, stamps)
      t0 = every[:, 0, 0].min()
      whole_mode = mode.startswith("whole")
      out.append({
        "what": "trace", "algorithm": algorithm, "mode": mode, "bytes": n, "p": ctx.p,
        "rep": k, "origin_s": float(t0),  # the one clock's (CLOCK_MONOTONIC) reading of the 0
        "steps": [algorithm] if whole_mode else [f"{k}{m}" for k, m in steps],
        "masks": [0] if whole_mode else [m for _, m in steps],
        "start": (every[:, :, 0] - t0).tolist(), "end": (every[:, :, 1] - t0).tolist(),
        "cpu": every[:, :, 2].tolist(), **ctx.settings,
      })  # fmt: skip
      if jax.process_index() == 0:
        span = every[:, :, 1].max() - t0
        print(f"trace {algorithm:20s} {mode:10s} round {k}: {span * 1e3:9.2f} ms", flush=True)
  return out


def mpi_calls(calls: str, p: int) -> list[dict]:
  """Every process's stamped MPI calls (``mpi_call_trace.c`` wrote ``CALLS.RANK``), one
  row per process; the files are removed."""
  out = []
  for r in range(p):
    path = Path(f"{calls}.{r}")
    lines = [ln.split() for ln in path.read_text().splitlines()] if path.exists() else []
    path.unlink(missing_ok=True)
    out.append({
      "what": "mpi_calls", "process": r, "fields": "call t0 t1 peer bytes request thread",
      "calls": [[c, float(a), float(b), int(q), int(m), req, int(t)]
                for c, a, b, q, m, req, t in lines],
    })  # fmt: skip
  return out


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
