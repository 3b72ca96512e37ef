"""One message step of the hand-written algorithms alone, against the whole all-reduce: where
halving-doubling's and recursive doubling's time over the MPI backend goes.

Runs on every host of an emulated cluster (one process and one device per host), e.g.

    allreduce-jax cluster --hosts 4 --link 200Mbit --launcher mpirun --collectives mpi -- \\
      python experiments/mpi_peer/steps.py --out experiments/mpi_peer/rows/collectives_steps.jsonl

Times, each a jitted program called ``--reps`` times after one warm-up, every call after a
barrier; a call's time is the longest over the processes (the median and the spread of the
calls):

- ``one_way``: a ``ppermute`` of m bytes from host 2k to host 2k+1 only (one direction per pair);
- ``exchange``: the pairwise exchange, hosts r and r XOR 1 swap m bytes (both directions at once);
- ``exchange_add``: the exchange and the add of the received buffer to the kept one (a step of
  halving-doubling's reduce-scatter);
- ``shift``: every host sends m bytes to r+1 and receives from r-1 (a ring step);
- ``PATTERN_chained`` (m under 1 MiB): the same step called 20 times back to back, per call;
- ``add``: the jitted add of two m-byte buffers on one device, no message;
- ``halving_doubling``, ``recursive_doubling``, ``ring``: the whole all-reduce of n bytes.

Each row names the collectives that carried it (``collectives``: gloo or mpi, from JAX's
config), Open MPI's ``btl_tcp_flags``, every ``OMPI_MCA_btl_tcp_*`` set,
``mpi_yield_when_idle``, ``--mca`` and ``--sysctl``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from allreduce_jax import distributed

PATTERNS = ("one_way", "exchange", "exchange_add", "shift")


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


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--sizes", default="1KiB,2MiB,4MiB,8MiB,16MiB", help="message bytes m")
  ap.add_argument("--allreduce", default="16MiB", help="bytes per host of the whole all-reduces")
  ap.add_argument("--algorithms", default="halving_doubling,recursive_doubling,ring")
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument(
    "--sysctl",
    action="append",
    default=[],
    metavar="NAME=VALUE",
    help="set a net.ipv4 sysctl of this host's network namespace first (as root), e.g."
    " tcp_slow_start_after_idle=0; recorded in the rows",
  )
  ap.add_argument(
    "--mca",
    action="append",
    default=[],
    metavar="NAME=VALUE",
    help="an Open MPI MCA parameter for this rank (OMPI_MCA_NAME, set before MPI starts), e.g."
    " mpi_yield_when_idle=1; recorded in the rows",
  )
  ap.add_argument("--out", required=True)
  args = ap.parse_args(argv)
  sysctls = dict(kv.split("=", 1) for kv in args.sysctl)
  mca = dict(kv.split("=", 1) for kv in args.mca)
  for name, value in mca.items():  # read by Open MPI when XLA's collectives start it
    os.environ[f"OMPI_MCA_{name}"] = value
  for name, value in sysctls.items():  # the namespace's own copy: gone with the cluster
    Path("/proc/sys/net/ipv4", name).write_text(value)
  distributed.initialize_from_env()
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax import lax
  from jax.experimental import multihost_utils
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  from allreduce_jax import devices
  from allreduce_jax.tools.bench import programs, verifiable_block
  from allreduce_jax.units import parse_size

  p = jax.device_count()
  mesh = Mesh(np.array(jax.devices()), ("i",))
  spec = P("i")
  collectives = jax.config.jax_cpu_collectives_implementation
  flags = os.environ.get("OMPI_MCA_btl_tcp_flags")
  tcp = {k: v for k, v in os.environ.items() if k.startswith("OMPI_MCA_btl_tcp_")}

  def timed(fn, x) -> list[float]:
    """Each call's time, the longest over the processes (a receiver waits longest)."""
    jax.block_until_ready(fn(x))  # compile, connect
    out = []
    for k in range(args.reps):
      multihost_utils.sync_global_devices(f"rep{k}")
      t0 = time.perf_counter()
      jax.block_until_ready(fn(x))
      out.append(time.perf_counter() - t0)
    every = np.asarray(multihost_utils.process_allgather(np.asarray(out)))
    return [float(t) for t in every.reshape(-1, len(out)).max(axis=0)]

  def step(pattern: str):
    perm = pairs(pattern, p)

    def body(b):
      got = lax.ppermute(b, "i", perm)
      return b + got if pattern == "exchange_add" else got

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))

  def put(count: int, mesh=mesh, spec=spec):
    return devices.put(
      (p, count), "float32", NamedSharding(mesh, spec), lambda idx: verifiable_block(idx, p, count)
    )

  def chained(fn, x, calls: int = 20) -> list[float]:
    """Per call over ``calls`` calls back to back after a barrier (no barrier skew in a
    small step's time), the longest over the processes."""
    jax.block_until_ready(fn(x))
    out = []
    for k in range(args.reps):
      multihost_utils.sync_global_devices(f"chain{k}")
      t0 = time.perf_counter()
      for _ in range(calls):
        x = fn(x)
      jax.block_until_ready(x)
      out.append((time.perf_counter() - t0) / calls)
    every = np.asarray(multihost_utils.process_allgather(np.asarray(out)))
    return [float(t) for t in every.reshape(-1, len(out)).max(axis=0)]

  rows = []

  def record(kind: str, m: int, ts: list[float]) -> None:
    rows.append({
      "kind": kind, "bytes": m, "p": p, "reps": len(ts), "collectives": collectives,
      "btl_tcp_flags": flags, "tcp_mca": tcp, "mca": mca or None, "sysctl": sysctls or None,
      "yield_when_idle": os.environ.get("OMPI_MCA_mpi_yield_when_idle"),
      "time_s": statistics.median(ts),
      "time_s_min": min(ts), "time_s_max": max(ts), "times_s": ts,
    })  # fmt: skip
    if jax.process_index() == 0:
      print(f"{kind:20s} {m:>10d} B  {statistics.median(ts) * 1e3:9.2f} ms", flush=True)

  for m in (parse_size(s) for s in args.sizes.split(",")):
    x = put(m // 4)
    for pattern in PATTERNS:
      record(pattern, m, timed(step(pattern), x))
      if m < 1 << 20:  # the per-step cost alpha: back to back
        record(f"{pattern}_chained", m, chained(step(pattern), x))
    local = jax.jit(jnp.add)
    a = jnp.ones((m // 4,), jnp.float32)
    b = jnp.ones((m // 4,), jnp.float32)
    record("add", m, timed(lambda _, a=a, b=b, f=local: f(a, b), None))
  n = parse_size(args.allreduce)
  for alg in args.algorithms.split(","):
    alg_mesh, alg_spec, fn, _ = programs(alg, p, "sum")
    record(alg, n, timed(fn, put(n // 4, alg_mesh, alg_spec)))
  if jax.process_index() == 0:
    with open(args.out, "a") as f:
      for r in rows:
        f.write(json.dumps(r) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
