"""allreduce_jax: hand-written all-reduce algorithms for JAX, verified against XLA's.

Public: :func:`all_reduce` (with :func:`all_reduce_tree`, :func:`all_reduce_gradients`),
its halves :func:`reduce_scatter` and :func:`all_gather`,
the registry (:data:`ALGORITHMS`, :class:`Algorithm`, :func:`register`, :func:`names`)
and :mod:`~allreduce_jax.devices` (emulated CPU devices, meshes for a record's axes,
host <-> device transfers that also work across processes). Nothing here touches a
device at import time.
"""

from allreduce_jax import devices
from allreduce_jax._api import all_reduce
from allreduce_jax._halves import all_gather, reduce_scatter
from allreduce_jax._ops import OPS
from allreduce_jax.compression import powersgd, topk
from allreduce_jax.fusion import all_reduce_tree, plan_buckets
from allreduce_jax.gradients import all_reduce_gradients
from allreduce_jax.registry import ALGORITHMS, Algorithm, names, register

__version__ = "0.1.0"

__all__ = [
  "ALGORITHMS",
  "OPS",
  "Algorithm",
  "all_gather",
  "all_reduce",
  "all_reduce_gradients",
  "all_reduce_tree",
  "devices",
  "names",
  "plan_buckets",
  "powersgd",
  "reduce_scatter",
  "register",
  "topk",
]
