"""``bench --algorithms ...,mpi``: MPI's ``MPI_Allreduce`` as a peer, timed beside the rest.

The ``mpi`` entry calls ``mpi4jax.allreduce`` on this process's row of bench's input
inside a jitted program, so bench's one timer times it like every other algorithm (same
sizes, round robin, warm-up, median); its result is checked against the NumPy sum of
the rows (the inputs are nccl-tests-style verifiable: exact in any order). It runs
between the MPI ranks of an ``mpirun`` launch, one JAX device per process (mpi4jax
reduces one buffer per rank), and needs the extra ``mpi`` (``pip install -e '.[mpi]'``:
mpi4jax, mpi4py; build mpi4jax where no ``nvcc`` is on the PATH, or it looks for CUDA).

Which algorithm Open MPI ran is the row's ``mpi_algorithm``: the one forced through its
``coll_tuned`` component (``mpirun --mca coll_tuned_use_dynamic_rules 1 --mca
coll_tuned_allreduce_algorithm N``: :data:`OPEN_MPI_ALLREDUCE`), else ``default`` (its own
decision by size and rank count). ``predicted_us`` prices the schedule it follows
(:data:`SCHEDULE`); ``default`` and the linear ones get none.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from allreduce_jax.tools import compare

NAME = "mpi"

#: ``coll_tuned_allreduce_algorithm`` numbers of Open MPI 4.1 (``ompi_info --param coll
#: tuned --level 9``) -> the names rows carry.
OPEN_MPI_ALLREDUCE = {
  0: "default",
  1: "basic_linear",
  2: "nonoverlapping",
  3: "recursive_doubling",
  4: "ring",
  5: "segmented_ring",
  6: "rabenseifner",
}

#: The project's algorithm whose schedule (steps, bytes) each of Open MPI's follows.
SCHEDULE = {
  "recursive_doubling": "recursive_doubling",
  "ring": "ring",
  "segmented_ring": "ring",
  "rabenseifner": "halving_doubling",
}


def algorithm(env: Mapping[str, str] | None = None) -> str:
  """The Open MPI all-reduce algorithm this run forces (``default``: none forced).

  Example:
    >>> algorithm({"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
    ...            "OMPI_MCA_coll_tuned_allreduce_algorithm": "6"})
    'rabenseifner'
    >>> algorithm({"OMPI_MCA_coll_tuned_allreduce_algorithm": "6"})  # rules off: ignored
    'default'
  """
  env = os.environ if env is None else env
  if env.get("OMPI_MCA_coll_tuned_use_dynamic_rules", "0").strip().lower() not in ("1", "true"):
    return "default"
  text = env.get("OMPI_MCA_coll_tuned_allreduce_algorithm", "0").strip()
  names = {v: k for k, v in OPEN_MPI_ALLREDUCE.items()}
  number = names.get(text, int(text) if text.isdigit() else -1)
  if number not in OPEN_MPI_ALLREDUCE:
    raise ValueError(
      f"OMPI_MCA_coll_tuned_allreduce_algorithm={text!r}: expected one of"
      f" {', '.join(f'{k} {v}' for k, v in OPEN_MPI_ALLREDUCE.items())}."
    )
  return OPEN_MPI_ALLREDUCE[number]


def problem(env: Mapping[str, str] | None = None) -> str | None:
  """Why ``--algorithms mpi`` cannot run in this process (one line), or None."""
  env = os.environ if env is None else env
  if "OMPI_COMM_WORLD_SIZE" not in env and "PMI_SIZE" not in env:
    return (
      "--algorithms mpi times MPI_Allreduce between the ranks of an MPI launch: run bench"
      " under mpirun, one device per process (e.g. mpirun -np 4 allreduce-jax bench"
      " --algorithms ring,psum,mpi)."
    )
  if jax.local_device_count() != 1:
    return (
      f"--algorithms mpi needs one device per process (mpi4jax reduces one buffer per"
      f" rank); this process has {jax.local_device_count()} (unset JAX_NUM_CPU_DEVICES)."
    )
  try:
    import mpi4jax  # noqa: F401
    from mpi4py import MPI  # noqa: F401
  except ImportError as e:
    return f"--algorithms mpi needs the extra mpi (pip install -e '.[mpi]'): {e}."
  return None


def program(p: int, count: int, dtype: str, op: str):
  """``(jitted, (x,), check)`` for MPI_Allreduce of this rank's row: ``check(out)`` is
  the number of elements that differ from the sum (max, min, mean) of all rows."""
  import mpi4jax
  from mpi4py import MPI

  comm = MPI.COMM_WORLD
  if comm.size != jax.process_count() or comm.rank != jax.process_index():
    raise ValueError(
      f"MPI rank {comm.rank} of {comm.size} is not JAX process {jax.process_index()} of"
      f" {jax.process_count()}: launch the ranks and the processes together (mpirun)."
    )
  mpi_op = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]
  rows = np.arange(p)[:, None]
  data = compare.rank_coded(rows, np.arange(count)[None, :]).astype(dtype)  # T[p, count]
  x = jax.device_put(jnp.asarray(data[comm.rank]), jax.local_devices()[0])

  def reduce(v):
    out = mpi4jax.allreduce(v, op=mpi_op, comm=comm)
    return out / p if op == "mean" else out

  fold = {"sum": np.sum, "mean": np.sum, "max": np.max, "min": np.min}[op]
  want = fold(data.astype(np.float64 if op in ("sum", "mean") else data.dtype), axis=0)
  want = (want / p if op == "mean" else want).astype(dtype)

  def check(out) -> int:
    got = np.asarray(out)
    if op == "mean" and np.issubdtype(got.dtype, np.floating):
      bad = np.abs(got - want) > 2 * np.finfo(got.dtype).eps * np.abs(want)
    else:
      bad = got != want
    return int(np.sum(bad))

  return _Effectful(jax.jit(reduce)), (x,), check


class _Effectful:
  """A jitted function with an ordered effect (mpi4jax's calls carry one), in the shape
  bench's timer compiles: JAX's ahead-of-time ``lower().compile()`` form of such a
  program expects its runtime token as an argument, so ``compile()`` here compiles by
  calling the jitted function once (every rank does, in the same order) and returns it."""

  def __init__(self, jitted):
    self.jitted = jitted
    self.args = ()

  def lower(self, *args):
    self.args = args
    return self

  def compile(self):
    jax.block_until_ready(self.jitted(*self.args))
    return self.jitted
