"""Data-parallel training on the hand-written all-reduce: sync vs simulated async SGD.

Importing the package fills the arm and workload registries (:mod:`.catalogue`).
Nothing here touches a device at import time. It needs the ``train`` extra (Flax,
scikit-learn's digits): ``pip install 'allreduce-jax[train]'``.
"""

from allreduce_jax.training import catalogue  # noqa: F401 (registers every arm and workload)
from allreduce_jax.training.arms import (
  ARMS,
  WORKLOADS,
  Arm,
  Curve,
  Setup,
  Timeline,
  Workload,
  get_arm,
  get_workload,
  register,
  register_workload,
  run_arm,
)
from allreduce_jax.training.async_sim import (
  ASYNC_METHODS,
  COMPUTE_MODELS,
  AsyncSchedule,
  ComputeTimes,
  SyncSchedule,
  event_schedule,
  fixed_tau_schedule,
  harmonic,
  make_replay,
  ps_schedule,
  run_async,
  sync_schedule,
)
from allreduce_jax.training.configs import (
  PhaseConfig,
  StalenessConfig,
  StragglerConfig,
  SyncConfig,
  TableCConfig,
)
from allreduce_jax.training.data import Digits, batch_indices, load_digits
from allreduce_jax.training.experiments import (
  phase_cells,
  run_phase,
  run_staleness_sweep,
  run_straggler_sweep,
  run_sync,
  run_table_c,
)
from allreduce_jax.training.models import CNN, MLP, make_model, make_optimizer
from allreduce_jax.training.results import Results
from allreduce_jax.training.sync import make_sync_chunk, replicas_identical, train_sync

__all__ = [
  "ARMS",
  "ASYNC_METHODS",
  "CNN",
  "COMPUTE_MODELS",
  "MLP",
  "WORKLOADS",
  "Arm",
  "AsyncSchedule",
  "ComputeTimes",
  "Curve",
  "Digits",
  "PhaseConfig",
  "Results",
  "Setup",
  "StalenessConfig",
  "StragglerConfig",
  "SyncConfig",
  "SyncSchedule",
  "TableCConfig",
  "Timeline",
  "Workload",
  "batch_indices",
  "event_schedule",
  "fixed_tau_schedule",
  "get_arm",
  "get_workload",
  "harmonic",
  "load_digits",
  "make_model",
  "make_optimizer",
  "make_replay",
  "make_sync_chunk",
  "phase_cells",
  "ps_schedule",
  "register",
  "register_workload",
  "replicas_identical",
  "run_arm",
  "run_async",
  "run_phase",
  "run_staleness_sweep",
  "run_straggler_sweep",
  "run_sync",
  "run_table_c",
  "sync_schedule",
  "train_sync",
]
