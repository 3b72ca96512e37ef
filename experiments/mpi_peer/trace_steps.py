"""``steps.py --split``: halving-doubling's and recursive doubling's rounds traced step by
step, on every host of the launch, and what every timing of ``steps.py`` shares.

:func:`trace` runs the five ways of :data:`MODES` in turn (``docs/mpi_peer.md`` says more):
the whole jitted program; its message steps as separate jitted programs called back to back
(``split``); the same with a barrier before each step (``barriered``) or with 4 bytes
exchanged with the step's partner before each step (``paired``); and those paired steps in
one jitted program (``whole_paired``). Every process stamps each call's start, end and CPU
time (rows ``trace``). :func:`mpi_calls` reads what ``mpi_call_trace.c`` stamped of XLA's
MPI collectives (rows ``mpi_calls``). A module of the study, imported by ``steps.py``.
"""

from __future__ import annotations

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

from allreduce_jax import devices
from allreduce_jax.tools.bench import programs, verifiable_input

MODES = ("whole", "split", "barriered", "paired", "whole_paired")  # --split's ways to run them


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
