"""Data-parallel training on the hand-written all-reduce: sync vs simulated async SGD.

Nothing here touches a device at import time.
"""

from allreduce_jax.training.async_sim import (
  ASYNC_METHODS,
  COMPUTE_MODELS,
  AsyncSchedule,
  SyncSchedule,
  event_schedule,
  fixed_tau_schedule,
  harmonic,
  make_replay,
  run_async,
  sync_schedule,
)
from allreduce_jax.training.data import Digits, batch_indices, load_digits
from allreduce_jax.training.experiments import (
  StalenessConfig,
  StragglerConfig,
  SyncConfig,
  run_staleness_sweep,
  run_straggler_sweep,
  run_sync,
)
from allreduce_jax.training.models import CNN, MLP, make_model, make_optimizer
from allreduce_jax.training.results import Results
from allreduce_jax.training.sync import make_sync_chunk, replicas_identical, train_sync

__all__ = [
  "ASYNC_METHODS",
  "CNN",
  "COMPUTE_MODELS",
  "MLP",
  "AsyncSchedule",
  "Digits",
  "Results",
  "StalenessConfig",
  "StragglerConfig",
  "SyncConfig",
  "SyncSchedule",
  "batch_indices",
  "event_schedule",
  "fixed_tau_schedule",
  "harmonic",
  "load_digits",
  "make_model",
  "make_optimizer",
  "make_replay",
  "make_sync_chunk",
  "replicas_identical",
  "run_async",
  "run_staleness_sweep",
  "run_straggler_sweep",
  "run_sync",
  "sync_schedule",
  "train_sync",
]
