"""Bytes each host puts on the wire per all-reduce, MPI_Allreduce's and the rest's, from the
hosts' interface counters, next to each algorithm's schedule.

Runs on every host of an emulated cluster launched by ``mpirun`` (one process and one
device per host), one Open MPI algorithm forced per launch (``run.py wire`` runs them all):

    OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=4 \\
    allreduce-jax cluster --hosts 4 --link 200Mbit --launcher mpirun -- \\
      python experiments/mpi_peer/wire.py --algorithms mpi --out experiments/mpi_peer/rows/wire.jsonl

For each algorithm: compile and run it once (connections made), wait for every host (a
barrier), read this host's interface counters (``/sys/class/net/DEV/statistics``: the
namespace's own interfaces), call it ``--reps`` times, barrier, read again
(:func:`allreduce_jax.tools.bench.wire_per_call`); the same
interval with nothing run (barriers only) is subtracted, so only that algorithm's calls
are counted. Host 0 appends one row per (algorithm, host) with the bytes sent and
received per call and the schedule's (:func:`schedule_bytes`), through the row store (kind
``wire``).
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
from jax.experimental import multihost_utils

from allreduce_jax import distributed, gloo_model, results
from allreduce_jax.tools import mpi_peer
from allreduce_jax.tools.bench import (
  programs,
  verifiable_input,
  wire_bytes,
  wire_parser,
  wire_per_call,
)
from allreduce_jax.units import parse_size


def schedule_bytes(algorithm: str, p: int, n: float) -> float:
  """Bytes each of ``p`` participants sends per all-reduce of ``n`` bytes, by the schedule.

  Open MPI's (``mpi(NAME)``), closed forms of Thakur, Rabenseifner & Gropp (2005),
  "Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1), §4 (``p``
  a power of two): the ring and the segmented ring (reduce-scatter then all-gather around
  the ring) and Rabenseifner's (recursive-halving reduce-scatter then recursive-doubling
  all-gather) ``2 (p-1)/p n``; recursive doubling ``lg p · n``. ``psum``: XLA's gloo
  backend runs gloo's ring, ``2 (p-1)/p n``. The hand-written algorithms: their generated
  schedules (:func:`allreduce_jax.gloo_model.schedule_bytes`, host 0; the same on every
  host for these).

  Example:
    >>> schedule_bytes("mpi(ring)", 4, 4.0), schedule_bytes("mpi(recursive_doubling)", 4, 4.0)
    (6.0, 8.0)
  """
  ring = 2 * (p - 1) / p * n
  closed = {
    "psum": ring,
    "mpi(ring)": ring,
    "mpi(segmented_ring)": ring,
    "mpi(rabenseifner)": ring,
    "mpi(recursive_doubling)": (p.bit_length() - 1) * n,
  }
  if algorithm in closed:
    return closed[algorithm]
  if algorithm.startswith("mpi("):
    raise ValueError(f"algorithm={algorithm!r}: no closed form (Open MPI decides at run time).")
  return float(gloo_model.schedule_bytes(algorithm, p, n)[0])


def program(algorithm: str, p: int, count: int):
  """``(name, call, wrong)``: the row's name of ``algorithm`` (``mpi(ITS PICK)`` for the
  peer), one call of it on this host's input (compiled and connected) and how many
  elements it got wrong."""
  if algorithm == mpi_peer.NAME:
    if (why := mpi_peer.problem()) is not None:
      raise SystemExit(why)
    timed, (x,), check = mpi_peer.program(p, count, "float32", "sum")
    out = timed.jitted(x)  # compile, connect
    return (
      f"mpi({mpi_peer.algorithm()})",
      lambda: jax.block_until_ready(timed.jitted(x)),
      check(out),
    )
  mesh, spec, timed, checker = programs(algorithm, p, "sum")
  x = verifiable_input(mesh, spec, p, count)
  out = timed(x)  # compile, connect
  wrong = int(np.sum(np.asarray(checker(x, out)[0].addressable_data(0))))
  return algorithm, lambda: jax.block_until_ready(timed(x)), wrong


def measure(args: argparse.Namespace) -> None:
  """Every algorithm's bytes per call on every host; host 0 appends the rows."""
  if args.reps < 1:
    raise SystemExit(f"wire.py: --reps={args.reps}: expected at least 1 call.")
  distributed.initialize_from_env()
  p = jax.device_count()
  n = parse_size(args.bytes)
  idle = wire_bytes(lambda: None, args.reps)
  rows = []
  for alg in args.algorithms.split(","):
    name, call, wrong = program(alg, p, n // 4)
    every = wire_per_call(call, args.reps, idle)
    wrongs = np.asarray(multihost_utils.process_allgather(np.array([wrong]))).reshape(p)
    try:
      schedule = schedule_bytes(name, p, n)
    except ValueError:
      schedule = None
    for host, ((sent, received), bad) in enumerate(zip(every, wrongs)):
      rows.append({
        "network": args.network, "p": p, "bytes": n, "algorithm": name, "host": host,
        "reps": args.reps, "sent": float(sent), "received": float(received),
        "schedule_bytes": schedule, "wrong": int(bad),
      })  # fmt: skip
    if jax.process_index() == 0:
      ratio = f"{every[0, 0] / schedule:.3f}" if schedule else "—"
      print(f"{name:26s} host0 sent {every[0, 0] / 1e6:8.3f} MB/call  ratio {ratio}", flush=True)
  if jax.process_index() == 0 and rows:
    store = results.RowStore(args.out, "wire")
    store.extend(rows, by=("bytes", "algorithm", "host"))


def parser() -> argparse.ArgumentParser:
  return wire_parser(
    __doc__.splitlines()[0], reps=4, algorithms="mpi",
    algorithms_help="comma list: bench's names, psum, mpi",
  )  # fmt: skip


if __name__ == "__main__":
  measure(parser().parse_args())
