"""Devices and meshes: emulated CPU devices, sub-meshes, the mesh a registry record's
``axes`` asks for (:func:`mesh_for`), and host <-> device transfers that work in one
process or across ``jax.distributed`` processes (:func:`put`, :func:`fetch`).

Public: the tools, the training experiments, the notebooks and user code use it.
"""

from __future__ import annotations

import sys

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh

from allreduce_jax.registry import ALGORITHMS

#: The most emulated CPU devices :func:`use_cpu_devices` asks for.
MAX_CPU_DEVICES = 512

#: ``--devices`` when not given, on CPU: this many emulated devices.
CPU_DEFAULT_DEVICES = 8


def use_cpu_devices(n: int | None = None) -> int:
  """Asks for ``n`` emulated CPU devices and returns the device count to run on. Must
  run before the first JAX computation.

  ``n=None`` (``--devices`` not given): every visible device on GPU/TPU, and
  :data:`CPU_DEFAULT_DEVICES` emulated devices on CPU. On GPU/TPU, or when a backend
  is already running with at least ``n`` devices, this changes nothing. Raises
  ``ValueError`` if fewer than ``n`` devices can be had. In a ``jax.distributed`` run
  the devices are fixed per process by whoever started it, so ``n`` is ignored (with a
  note on stderr if it differs from the global count) and the global count returned.
  """
  if n is None:
    if jax.distributed.is_initialized():  # the launcher fixed every process's devices
      return jax.device_count()
    try:
      jax.config.update("jax_num_cpu_devices", CPU_DEFAULT_DEVICES)  # CPU backend only
    except RuntimeError:
      pass
    if jax.default_backend() != "cpu":
      return jax.device_count()
    n = CPU_DEFAULT_DEVICES
  if n < 1:
    raise ValueError(f"--devices must be at least 1, got {n}.")
  if jax.distributed.is_initialized():
    # A multi-process run: the launcher (or cluster) fixed the devices of every
    # process; asking for more here would change this process's count only.
    have = jax.device_count()
    if n != have and jax.process_index() == 0:
      print(
        f"# --devices {n} ignored: this jax.distributed run has {have} devices"
        f" ({jax.process_count()} processes × {jax.local_device_count()} local)",
        file=sys.stderr,
        flush=True,
      )
    return have
  if n > MAX_CPU_DEVICES and len(jax.devices()) < n:  # refused at once, not minutes later
    raise ValueError(
      f"--devices {n}: at most {MAX_CPU_DEVICES} emulated CPU devices (each one costs memory"
      f" and compile time); this machine has {len(jax.devices())} {jax.default_backend()}"
      " device(s)."
    )
  try:
    jax.config.update("jax_num_cpu_devices", n)
  except RuntimeError:
    pass  # backend already initialized (e.g. by jax.distributed): check below
  have = len(jax.devices())
  if have < n:
    raise ValueError(
      f"--devices {n} asked for {n} devices but only {have} are available on"
      f" {jax.default_backend()} (leave --devices out to use every visible device)."
    )
  return n


def submesh(shape: tuple[int, ...], axis_names: tuple[str, ...]) -> Mesh:
  """A mesh over the first ``prod(shape)`` devices, with Explicit axes.

  Inputs must be ``device_put`` to a ``NamedSharding`` of this mesh before use.
  """
  p = int(np.prod(shape))
  devices = jax.devices()
  if p > len(devices):
    raise ValueError(f"a mesh of shape {shape} needs {p} devices; {len(devices)} available.")
  return Mesh(
    np.asarray(devices[:p]).reshape(shape),
    axis_names,
    axis_types=(AxisType.Explicit,) * len(shape),
  )


def process_mesh(axis_names: tuple[str, str] = ("outer", "inner")) -> Mesh:
  """A 2-D mesh with one axis per process level: ``outer`` = processes (hosts),
  ``inner`` = each process's local devices. Row ``r`` holds process ``r``'s devices,
  so collectives along ``inner`` stay inside a process and ``outer`` crosses them.
  """
  nproc, local = jax.process_count(), jax.local_device_count()
  devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
  if len(devices) != nproc * local:
    raise ValueError(
      f"a process mesh needs the same device count in every process; got {len(devices)}"
      f" devices over {nproc} processes with {local} local devices here."
    )
  return Mesh(
    np.asarray(devices, dtype=object).reshape(nproc, local),
    axis_names,
    axis_types=(AxisType.Explicit,) * 2,
  )


def factor_2d(p: int) -> tuple[int, int]:
  """``p = outer * inner`` with ``outer`` the smallest factor > 1 not above
  sqrt(p) (1 for primes): 8 -> (2, 4), 4 -> (2, 2), 6 -> (2, 3), 5 -> (1, 5)."""
  outer = next((d for d in range(2, int(p**0.5) + 1) if p % d == 0), 1)
  return outer, p // outer


def put(global_shape, dtype, sharding, block) -> jax.Array:
  """Builds a global array from per-shard host data, process by process.

  ``block(index)`` returns the host data of the slice ``index`` (a tuple of slices
  into the global shape). Each process only builds and transfers the shards of its
  own devices, so the same code runs in one process or across ``jax.distributed``
  processes, and the global array is never materialized on one host.
  """
  return jax.make_array_from_callback(
    tuple(global_shape), sharding, lambda index: np.asarray(block(index), dtype=dtype)
  )


def put_host(a: np.ndarray, sharding) -> jax.Array:
  """:func:`put` of a host array that every process holds whole (e.g. a data set or a
  batch plan): each process transfers only its own devices' slices."""
  return put(a.shape, a.dtype, sharding, lambda index: a[index])


def fetch(x: jax.Array) -> np.ndarray:
  """The whole value of ``x`` on this host (gathered across processes if needed)."""
  if x.is_fully_addressable:
    return np.asarray(jax.device_get(x))
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def gather_float64(a) -> np.ndarray:
  """``a`` (float64) from every process, ``f64[processes, *a.shape]``, bit for bit: the
  values travel as int32 pairs, since JAX without x64 would narrow them to float32.

  Example:
    >>> gather_float64([0.1, 1.5e9 + 1e-6]).tolist()  # one process here; float32: 1.5e9
    [[0.1, 1500000000.000001]]
  """
  a = np.ascontiguousarray(a, np.float64)
  every = np.asarray(multihost_utils.process_allgather(a.view(np.int32)))
  return every.view(np.float64).reshape(-1, *a.shape)


def mesh_for(algorithm: str, p: int) -> tuple[Mesh, str | tuple[str, ...]]:
  """The mesh and axis name to run ``algorithm`` on ``p`` devices: the one place that
  turns a registry record's ``axes`` into a mesh.

  One-axis algorithms get a 1-D mesh ``("i",)``; a k-axis one gets a k-D mesh
  ``("a0", ..., "a{k-1}")`` (outer first) from :func:`factor_axes`, and the tuple
  of its names. Returns ``(mesh, axis_name)``; the per-device spec is
  ``P(axis_name)`` either way.
  """
  if algorithm not in ALGORITHMS:
    raise ValueError(f"algorithm={algorithm!r} is not one of {sorted(ALGORITHMS)}.")
  k = ALGORITHMS[algorithm].axes
  if k == 1:
    return submesh((p,), ("i",)), "i"
  shape = factor_axes(p, k)
  axis_names = ("outer", "inner") if k == 2 else tuple(f"a{d}" for d in range(k))
  return submesh(shape, axis_names), axis_names


def fits(algorithm: str, p: int) -> bool:
  """Whether ``mesh_for(algorithm, p)`` gives every level more than one participant: a
  k-axis algorithm needs p to split into k factors > 1 (a prime p has no 2-D mesh)."""
  k = ALGORITHMS[algorithm].axes
  return k == 1 or 1 not in factor_axes(p, k)


def inner_size(algorithm: str, p: int) -> int | None:
  """The inner (last) axis size of :func:`mesh_for`'s mesh for a multi-axis algorithm,
  the ``inner`` that ``cost_model.schedule`` prices it with; None for one axis."""
  k = ALGORITHMS[algorithm].axes
  return factor_axes(p, k)[-1] if k > 1 else None


def factor_axes(p: int, k: int) -> tuple[int, ...]:
  """``p`` as a product of ``k`` factors, outer first, as even as the divisors allow
  (a prime leaves 1s outside): (8, 2) -> (2, 4), (8, 3) -> (2, 2, 2), (5, 2) -> (1, 5)."""
  if k == 1:
    return (p,)
  outer, rest = factor_2d(p)
  return (outer, *factor_axes(rest, k - 1))
