"""Two-shot all-reduce: a reduce-scatter by direct exchange, then a direct all-gather.

The quantize-once design of ZeRO++'s qgZ and flashinfer's FP8 two-shot all-reduce:
every participant sends each other participant that one's slice directly, so under a
lossy wire format each slice is encoded once, summed at its owner in float32 (never
requantized on the way, unlike a ring, which re-encodes the partial sum at every
hop), and the owner's finished slice is encoded once more for the all-gather.
The error therefore stays flat in p where a ring's grows like √p.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from allreduce_jax import _comm, cost_model
from allreduce_jax._comm import AxisName
from allreduce_jax.registry import Algorithm, register

Combine = Callable[[jax.Array, jax.Array], jax.Array]


def _accumulation_dtype(dtype) -> jnp.dtype:
  """float32 for narrower floats (bf16, f16): the owner sums in float32."""
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4:
    return jnp.dtype(jnp.float32)
  return dtype


def two_shot(flat: jax.Array, axis_name: AxisName, combine: Combine) -> jax.Array:
  """Direct reduce-scatter + direct all-gather ("two-shot", qgZ-style).

  Reduce-scatter: in step d = 1 .. p-1 participant i sends its copy of slice i + d
  straight to participant i + d (a shift by d), which combines it into its own slice
  in float32; after p-1 steps participant i owns slice i, each contribution having
  travelled one hop. All-gather: in step d participant i sends its finished slice to
  i + d, which stores it.

  - steps: 2(p-1), each a shift permutation by d = 1 .. p-1 of n/p bytes
  - bytes sent per participant: 2(p-1)/p·n, as the ring's (bandwidth-optimal)
  - time (flat α-β): 2(p-1)α + 2(p-1)/p·nβ + (p-1)/p·nγ, the ring's; on a physical
    ring the shift by d crosses d links, so it pays where every pair has its own
    path (a switch) and where quantization error matters
  - under a lossy wire: each element is encoded twice on its way (its slice, then
    the owner's sum), whatever p

  Args/Returns: as :func:`allreduce_jax._ring.ring`.

  References:
    Wang et al., "ZeRO++: Extremely Efficient Collective Communication for Giant
    Model Training", 2023 (qgZ); flashinfer ``quantized_all_reduce`` (two-shot).
  """
  p, n = _comm.size(axis_name), flat.shape[0]
  padded = _comm.pad_to_multiple(flat, p)  # T[p*c]
  block = direct_reduce_scatter(padded, axis_name, combine)  # T[c]
  block = _comm.finished(block, axis_name)
  block = _comm.settle(block)  # lossy wire: hold what others get
  return direct_all_gather(block, axis_name)[:n]


def direct_reduce_scatter(flat: jax.Array, axis_name: AxisName, combine: Combine) -> jax.Array:
  """Direct reduce-scatter: ``T[p*c] -> T[c]``. In step d = 1 .. p-1 participant i
  sends its copy of slice i + d straight to its owner i + d, which combines it into
  its own slice (in float32 for narrower floats): p-1 steps, (p-1)/p·n bytes."""
  p, i = _comm.size(axis_name), _comm.index(axis_name)
  c = flat.shape[0] // p
  acc_dtype = _accumulation_dtype(flat.dtype)
  acc = _comm.chunk(flat, i, c).astype(acc_dtype)  # A[c]: my own slice
  for d in range(1, p):
    send = _comm.chunk(flat, (i + d) % p, c)  # T[c]: the slice participant i+d owns
    acc = combine(acc, _comm.send(send, axis_name, _comm.shift_pairs(p, d)).astype(acc_dtype))
  return acc.astype(flat.dtype)


def direct_all_gather(block: jax.Array, axis_name: AxisName) -> jax.Array:
  """Direct all-gather: ``T[c] -> T[p*c]``; in step d participant i sends its block
  straight to i + d: p-1 steps, (p-1)/p·n bytes."""
  p, i = _comm.size(axis_name), _comm.index(axis_name)
  c = block.shape[0]
  out = _comm.make_varying(jnp.zeros((p * c,), block.dtype), axis_name)
  out = lax.dynamic_update_slice_in_dim(out, block, i * c, 0)
  for d in range(1, p):
    got = _comm.send(block, axis_name, _comm.shift_pairs(p, d))  # slice i - d
    out = lax.dynamic_update_slice_in_dim(out, got, ((i - d) % p) * c, 0)
  return out


def two_shot_messages(sizes: Sequence[int]) -> list[list[tuple[int, int, float, bool]]]:
  """Message steps of :func:`two_shot`: shifts by 1 .. p-1 of n/p, combined, then the
  same shifts of n/p, stored."""
  (p,) = sizes
  rs = [[(j, (j + d) % p, 1 / p, True) for j in range(p)] for d in range(1, p)]
  ag = [[(j, (j + d) % p, 1 / p, False) for j in range(p)] for d in range(1, p)]
  return rs + ag


# Compressed all-reduce: the quantize-once algorithm (each slice quantized once, summed at
# its owner, then gathered), registered with the exact ones.
register(
  Algorithm(
    "two_shot",
    two_shot,
    auto=False,
    schedule=cost_model.ring_schedule,  # the same steps and bytes as the ring
    messages=two_shot_messages,
    # 2(p-1) distinct steps of p messages: 4.2M at p = 1024, 537M at 16384 (the
    # replay sweep to 16384 ran out of memory on it); a direct scheme for small p.
    at_scale=False,
    summary="direct reduce-scatter + direct all-gather: a slice is quantized once",
    reduce_scatter=direct_reduce_scatter,
    all_gather=direct_all_gather,
  )
)
