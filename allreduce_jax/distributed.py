"""Joining a multi-process JAX runtime (``jax.distributed``) for any subcommand.

One JAX program can span several processes (hosts): gloo over TCP on CPU, NCCL on
GPU, ICI/DCN on TPU pods. Every process runs the same subcommand; ``jax.devices()``
then lists the devices of all processes and the same ``shard_map`` code spans them.

:func:`initialize_from_env` is called by ``allreduce-jax`` (``cli.main``) before a
subcommand touches any device. It initializes when it finds, in this order:

1. the variables set by ``allreduce-jax launch`` (``ALLREDUCE_JAX_COORDINATOR``,
   ``ALLREDUCE_JAX_NUM_PROCESSES``, ``ALLREDUCE_JAX_PROCESS_ID``, optionally
   ``ALLREDUCE_JAX_LOCAL_DEVICES`` and ``ALLREDUCE_JAX_COORDINATOR_BIND``), or JAX's
   own names ``JAX_COORDINATOR_ADDRESS`` + ``JAX_NUM_PROCESSES`` + ``JAX_PROCESS_ID``;
2. ``ALLREDUCE_JAX_DISTRIBUTED=auto``: ``jax.distributed.initialize()`` without
   arguments, which detects Cloud TPU pod slices, SLURM, Open MPI and GKE;
3. a SLURM step or an Open MPI job with more than one task (auto-detected as in 2).

``ALLREDUCE_JAX_DISTRIBUTED=off`` disables all of this. Nothing happens at import.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

ENV_COORDINATOR = "ALLREDUCE_JAX_COORDINATOR"
ENV_COORDINATOR_BIND = "ALLREDUCE_JAX_COORDINATOR_BIND"
ENV_NUM_PROCESSES = "ALLREDUCE_JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "ALLREDUCE_JAX_PROCESS_ID"
ENV_LOCAL_DEVICES = "ALLREDUCE_JAX_LOCAL_DEVICES"
ENV_LOCAL_DEVICE_IDS = "ALLREDUCE_JAX_LOCAL_DEVICE_IDS"
ENV_INIT_TIMEOUT = "ALLREDUCE_JAX_INIT_TIMEOUT"
ENV_MODE = "ALLREDUCE_JAX_DISTRIBUTED"

LAUNCHER_VARS = (
  ENV_COORDINATOR,
  ENV_COORDINATOR_BIND,
  ENV_NUM_PROCESSES,
  ENV_PROCESS_ID,
  ENV_LOCAL_DEVICES,
  ENV_LOCAL_DEVICE_IDS,
  ENV_INIT_TIMEOUT,
)


def _int_env(env: Mapping[str, str], name: str, minimum: int = 0) -> int | None:
  text = env.get(name)
  if text is None or text.strip() == "":
    return None
  try:
    value = int(text)
  except ValueError:
    raise ValueError(f"environment variable {name}={text!r} is not an integer.") from None
  if value < minimum:
    raise ValueError(f"environment variable {name}={text!r} must be at least {minimum}.")
  return value


def _check_address(address: str, what: str) -> None:
  host, sep, port = address.rpartition(":")
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(f"{what}={address!r} must be HOST:PORT with a port in 1..65535.")


def initialize(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  *,
  local_devices: int | None = None,
  local_device_ids: Sequence[int] | None = None,
  coordinator_bind_address: str | None = None,
  initialization_timeout: int = 300,
) -> None:
  """Joins this process to a ``jax.distributed`` runtime. Call before any JAX work.

  With ``coordinator_address``, ``num_processes`` and ``process_id`` all given the
  cluster is explicit; with any of them ``None``, JAX detects it (TPU pod slice,
  SLURM, Open MPI, GKE). CPU collectives across processes use gloo.

  Args:
    coordinator_address: ``HOST:PORT`` of process 0's coordinator service.
    num_processes: how many processes take part.
    process_id: this process's index, ``0 <= process_id < num_processes``.
    local_devices: emulated CPU devices in this process (CPU backend only).
    local_device_ids: the accelerators this process uses (GPU), as in JAX.
    coordinator_bind_address: where process 0's service listens (default: JAX's,
      all interfaces; the local launcher passes loopback).
    initialization_timeout: seconds to wait for all processes to connect.

  Raises:
    ValueError: malformed or inconsistent arguments.
    RuntimeError: called after the JAX backend started.
  """
  import jax

  if jax.distributed.is_initialized():
    return
  if coordinator_address is not None:
    _check_address(coordinator_address, "coordinator_address")
  if coordinator_bind_address is not None:
    _check_address(coordinator_bind_address, "coordinator_bind_address")
  if num_processes is not None and num_processes < 1:
    raise ValueError(f"num_processes={num_processes} must be at least 1.")
  if process_id is not None and num_processes is not None and not 0 <= process_id < num_processes:
    raise ValueError(f"process_id={process_id} must be in 0..{num_processes - 1}.")
  if local_devices is not None:
    if local_devices < 1:
      raise ValueError(f"local_devices={local_devices} must be at least 1.")
    jax.config.update("jax_num_cpu_devices", local_devices)
  if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  explicit = None not in (coordinator_address, num_processes, process_id)
  jax.distributed.initialize(
    # All three given: skip cluster detection, so that e.g. a SLURM allocation
    # around a local launcher does not change this process's devices.
    cluster_detection_method="deactivate" if explicit else None,
    coordinator_address=coordinator_address,
    num_processes=num_processes,
    process_id=process_id,
    local_device_ids=list(local_device_ids) if local_device_ids is not None else None,
    coordinator_bind_address=coordinator_bind_address,
    initialization_timeout=initialization_timeout,
  )


def _slurm_or_mpi_tasks(env: Mapping[str, str]) -> int:
  """Tasks in this SLURM step / Open MPI job (0 when neither is present)."""
  if "SLURM_JOB_ID" in env and "SLURM_PROCID" in env:
    for name in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
      n = _int_env(env, name, minimum=1)
      if n is not None:
        return n
  if "OMPI_COMM_WORLD_SIZE" in env:
    return _int_env(env, "OMPI_COMM_WORLD_SIZE", minimum=1) or 0
  return 0


def initialize_from_env(env: Mapping[str, str] | None = None) -> bool:
  """Initializes ``jax.distributed`` if the environment asks for it (see the module
  docstring). Returns True when this process is now part of a multi-process run.

  Raises:
    ValueError: a malformed variable, named in the message.
  """
  env = os.environ if env is None else env
  mode = env.get(ENV_MODE, "").strip().lower()
  if mode not in ("", "auto", "off", "0", "1", "on"):
    raise ValueError(f"environment variable {ENV_MODE}={mode!r} must be 'auto' or 'off'.")
  if mode in ("off", "0"):
    return False
  coordinator = env.get(ENV_COORDINATOR) or env.get("JAX_COORDINATOR_ADDRESS")
  num = _int_env(env, ENV_NUM_PROCESSES, 1)
  if num is None:
    num = _int_env(env, "JAX_NUM_PROCESSES", 1)
  pid = _int_env(env, ENV_PROCESS_ID)
  if pid is None:
    pid = _int_env(env, "JAX_PROCESS_ID")
  explicit = (coordinator, num, pid)
  if any(v is not None for v in explicit) and mode not in ("auto", "on", "1"):
    if None in explicit:
      raise ValueError(
        f"an explicit cluster needs {ENV_COORDINATOR}, {ENV_NUM_PROCESSES} and"
        f" {ENV_PROCESS_ID} (or JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and"
        f" JAX_PROCESS_ID) together; got coordinator={coordinator!r},"
        f" num_processes={num}, process_id={pid}."
      )
  elif mode not in ("auto", "on", "1") and _slurm_or_mpi_tasks(env) <= 1:
    return False
  ids_text = env.get(ENV_LOCAL_DEVICE_IDS, "").strip()
  try:
    ids = [int(s) for s in ids_text.split(",")] if ids_text else None
  except ValueError:
    raise ValueError(
      f"environment variable {ENV_LOCAL_DEVICE_IDS}={ids_text!r} must be comma-separated integers."
    ) from None
  initialize(
    coordinator,
    num,
    pid,
    local_devices=_int_env(env, ENV_LOCAL_DEVICES, 1),
    local_device_ids=ids,
    coordinator_bind_address=env.get(ENV_COORDINATOR_BIND) or None,
    initialization_timeout=_int_env(env, ENV_INIT_TIMEOUT, 1) or 300,
  )
  return True


def main_guard(argv0: str = "allreduce-jax") -> None:
  """Initializes from the environment, turning a bad variable into a clean exit."""
  try:
    initialize_from_env()
  except ValueError as e:
    print(f"{argv0}: {e}", file=sys.stderr)
    raise SystemExit(2) from None
  except Exception as e:  # JaxRuntimeError from the coordinator service or client
    address = os.environ.get(ENV_COORDINATOR_BIND) or os.environ.get(ENV_COORDINATOR)
    hint = ""
    if "Failed to start RPC server" in str(e) and address:
      hint = f" (is the coordinator port of {address} already in use?)"
    print(f"{argv0}: jax.distributed.initialize failed: {e}{hint}", file=sys.stderr)
    raise SystemExit(1) from None
