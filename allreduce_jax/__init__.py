"""allreduce_jax: hand-written all-reduce algorithms for JAX, verified against XLA's.

Nothing here touches a device at import time.
"""

from allreduce_jax._api import ALGORITHMS, Algorithm, all_reduce, register
from allreduce_jax._ops import OPS
from allreduce_jax.compression import powersgd, topk
from allreduce_jax.fusion import all_reduce_tree, plan_buckets
from allreduce_jax.gradients import all_reduce_gradients

__version__ = "0.1.0"

__all__ = [
  "ALGORITHMS",
  "OPS",
  "Algorithm",
  "all_reduce",
  "all_reduce_gradients",
  "all_reduce_tree",
  "plan_buckets",
  "powersgd",
  "register",
  "topk",
]
