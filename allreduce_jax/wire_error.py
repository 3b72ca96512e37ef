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

import numpy as np

from allreduce_jax._wire import np_roundtrip

#: ``np_roundtrip`` (the codec in NumPy) is re-exported: notebooks import no private module.
__all__ = ["REPLAYED", "np_roundtrip", "relative_error", "replay", "ring_hop_errors"]

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
