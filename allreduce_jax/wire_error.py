"""The error a lossy wire format costs, replayed in NumPy at any participant count.

:func:`replay` runs the same arithmetic as ``all_reduce(..., wire=...)`` for the ring
(which re-encodes the running partial sum at every hop) and ``two_shot`` (each slice
encoded once, summed in float32 at its owner), with the codec of
``allreduce_jax._wire`` (:func:`~allreduce_jax._wire.np_roundtrip`, the same bits).
At p ≤ 8 it equals the JAX program bit for bit at the tested sizes
(``tests/test_wire.py``; on multi-million-element messages XLA:CPU's vectorized
division can differ in the last bit, which moves a rare element across a rounding
tie); beyond, it is how the error at p = 1024 is measured without 1024 devices. :func:`ring_hop_errors`
follows one ring chunk hop by hop (notebook 04).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import _comm, _wire
from allreduce_jax._wire import np_roundtrip
from allreduce_jax.registry import ALGORITHMS

#: ``np_roundtrip`` (the codec in NumPy) is re-exported: notebooks import no private module.
__all__ = [
  "REPLAYED",
  "np_roundtrip",
  "quantizations",
  "relative_error",
  "replay",
  "ring_hop_errors",
]


def quantizations(algorithm: str, mesh, axis_name, n: int, dtype="float32") -> int:
  """How many quantizations the worst element of ``all_reduce(x, op="sum",
  algorithm=..., wire=<lossy>)`` has been through, on ``mesh`` over ``axis_name``
  with ``n`` elements per participant: each one adds at most ``unit_error`` x its
  block's absmax to the result, so this times ``unit_error`` bounds the error.

  Read off the algorithm's own program (its ``fn`` from the registry), run once on
  counters instead of values (``_wire.COUNTING``): a message quantizes what it
  carries unless that is already on the grid (forwarded), and combining adds the
  counts of both sides. The ring at p: p (p − 1 hops, then its owner's settle);
  recursive doubling at p = 2^k: 2(p − 1) (both partners' values, every step).

  Example:
    >>> import jax
    >>> from allreduce_jax.devices import submesh
    >>> quantizations("recursive_doubling", submesh((4,), ("i",)), "i", 8)
    6
  """
  return _quantizations(algorithm, mesh, axis_name, int(n), jnp.dtype(dtype).name)


@functools.cache
def _quantizations(algorithm, mesh, axis_name, n, dtype) -> int:
  record = ALGORITHMS[algorithm]
  if not record.hand_written or mesh.size == 1:
    return 0

  def combine(a, b):  # two partial results: their quantizations add up, off the grid
    return 2 * (a // 2 + b // 2)

  def body(block):  # block: T[1, n] of zeros: nothing quantized yet
    flat = _comm.make_varying(block[0], axis_name)
    with _wire.using(_wire.COUNTING):
      return record(flat, axis_name, combine)[None]

  spec = P(_comm.axes_tuple(axis_name))
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
  zeros = jax.device_put(np.zeros((mesh.size, n), dtype), NamedSharding(mesh, spec))
  return int(np.asarray(f(zeros)).max()) // 2


#: The algorithms :func:`replay` knows.
REPLAYED = ("ring", "two_shot")


def _chunks(x: np.ndarray) -> tuple[np.ndarray, int]:
  """``x: f32[p, n]`` -> ``f32[p (holder), p (chunk), c]`` zero-padded, and n."""
  p, n = x.shape
  c = -(-n // p)
  padded = np.pad(x, ((0, 0), (0, p * c - n)))
  return padded.reshape(p, p, c), n


def replay(algorithm: str, x: np.ndarray, wire: str | None) -> np.ndarray:
  """What every participant holds after ``all_reduce(x_i, op="sum", algorithm=...,
  wire=wire)``, computed in NumPy.

  Args:
    algorithm: one of :data:`REPLAYED`.
    x: ``f32[p, n]``, participant ``i``'s block in row ``i``.
    wire: a key of ``_wire.FORMATS``.

  Returns:
    ``f32[n]``, the result (the same on every participant).
  """
  x = np.asarray(x, np.float32)
  p = x.shape[0]
  if p == 1:
    return x[0]
  blocks, n = _chunks(x)  # [holder, chunk, c]
  k = np.arange(p)
  if algorithm == "ring":
    # Chunk k starts at participant k+1 and picks up participant k+t's copy at hop t.
    acc = blocks[(k + 1) % p, k]  # [chunk, c]
    for t in range(2, p + 1):
      acc = np_roundtrip(wire, acc) + blocks[(k + t) % p, k]
  elif algorithm == "two_shot":
    # The owner k adds the encoded copies in the order they arrive (shift d = 1, 2, ...).
    acc = blocks[k, k].copy()
    for d in range(1, p):
      acc = acc + np_roundtrip(wire, blocks[(k - d) % p, k])
  else:
    raise ValueError(f"algorithm={algorithm!r} is not replayed; expected one of {REPLAYED}.")
  return np_roundtrip(wire, acc).reshape(-1)[:n]  # the all-gather: encoded once more


def relative_error(result: np.ndarray, x: np.ndarray) -> float:
  """Relative L2 error of ``result`` against the float64 sum of ``x: T[p, n]``."""
  exact = np.asarray(x, np.float64).sum(axis=0)
  return float(np.linalg.norm(np.asarray(result, np.float64) - exact) / np.linalg.norm(exact))


def ring_hop_errors(x: np.ndarray, wire: str | None) -> np.ndarray:
  """``f64[p]``: relative L2 error of the ring's running partial sums after hop
  1, ..., p-1 (reduce-scatter) and of the final result (after the all-gather's
  encoding), each against the exact sum of the same contributions."""
  x = np.asarray(x, np.float32)
  p = x.shape[0]
  blocks, _ = _chunks(x)
  k = np.arange(p)
  acc = blocks[(k + 1) % p, k]
  exact = acc.astype(np.float64)
  out = []
  for t in range(2, p + 1):
    acc = np_roundtrip(wire, acc) + blocks[(k + t) % p, k]
    exact = exact + blocks[(k + t) % p, k]
    out.append(np.linalg.norm(acc - exact) / np.linalg.norm(exact))
  final = np_roundtrip(wire, acc)
  out.append(np.linalg.norm(final - exact) / np.linalg.norm(exact))
  return np.asarray(out)
