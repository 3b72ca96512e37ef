"""Recursive doubling and recursive halving-doubling (Rabenseifner) all-reduce.

Both pair participant ``r`` with ``r XOR mask`` for masks 1, 2, 4, ... so they need a
power-of-two participant count. For other p we use MPICH's fold: with
``pof2 = 2**floor(lg p)`` and ``rem = p - pof2``, each even participant ``2k < 2*rem``
first hands its whole buffer to ``2k+1`` and sits out; the remaining ``pof2`` run the
algorithm under a new rank; at the end ``2k+1`` hands the result back to ``2k``. This
costs two extra steps and 2n extra bytes on the folded pairs.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from allreduce_jax import _comm
from allreduce_jax._comm import AxisName

Combine = Callable[[jax.Array, jax.Array], jax.Array]


def _pof2(p: int) -> int:
  return 1 << (p.bit_length() - 1)


def _real_rank(newrank: int, rem: int) -> int:
  """Participant index of the one running under ``newrank`` after the fold."""
  return 2 * newrank + 1 if newrank < rem else newrank + rem


def _xor_pairs(pof2: int, rem: int, mask: int) -> list[tuple[int, int]]:
  return [(_real_rank(r, rem), _real_rank(r ^ mask, rem)) for r in range(pof2)]


def _fold(x: jax.Array, axis_name: AxisName, combine: Combine) -> tuple[jax.Array, jax.Array]:
  """MPICH fold to a power of two. Returns ``(x, newrank)``; newrank is -1 for the
  participants that sit out (their ``x`` is then meaningless until :func:`_unfold`)."""
  p, i = _comm.size(axis_name), _comm.index(axis_name)
  rem = p - _pof2(p)
  if rem == 0:
    return x, i
  recv = _comm.send(x, axis_name, [(2 * k, 2 * k + 1) for k in range(rem)])
  low = i < 2 * rem
  odd = i % 2 == 1
  # Lower rank's data first, as in a left-to-right sum.
  x = jnp.where(low & odd, combine(recv, x), x)
  newrank = jnp.where(low, jnp.where(odd, i // 2, -1), i - rem)
  return x, newrank


def _unfold(x: jax.Array, axis_name: AxisName) -> jax.Array:
  """Hands the result back from ``2k+1`` to the folded-out ``2k``."""
  p, i = _comm.size(axis_name), _comm.index(axis_name)
  rem = p - _pof2(p)
  if rem == 0:
    return x
  recv = _comm.send(x, axis_name, [(2 * k + 1, 2 * k) for k in range(rem)])
  return jnp.where((i < 2 * rem) & (i % 2 == 0), recv, x)


def recursive_doubling(flat: jax.Array, axis_name: AxisName, combine: Combine) -> jax.Array:
  """Recursive-doubling (butterfly) all-reduce: lg p exchanges of the full buffer.

  In step k every participant swaps its whole partial result with the participant
  whose rank differs in bit k, and both combine. After lg p steps everyone holds the
  total. Few steps, but every step moves all n bytes: the choice for short messages
  (MPICH uses it up to 2 KiB).

  - steps: lg p (+2 when p is not a power of two)
  - bytes sent per participant: n·lg p (+n on folded pairs)
  - time: lg p·α + n·lg p·β + n·lg p·γ

  Both partners combine the lower rank's data first, so every participant computes
  bit-identical results even for non-commutative corner cases (max of +0 and -0).

  Args/Returns: as :func:`allreduce_jax._ring.ring`.

  References:
    Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication
    Operations in MPICH", IJHPCA 19(1), 2005.
  """
  p = _comm.size(axis_name)
  pof2, rem = _pof2(p), p - _pof2(p)
  x, newrank = _fold(flat, axis_name, combine)  # T[n]
  mask = 1
  while mask < pof2:
    recv = _comm.send(x, axis_name, _xor_pairs(pof2, rem, mask))  # T[n]
    upper = (newrank & mask) != 0
    x = combine(jnp.where(upper, recv, x), jnp.where(upper, x, recv))
    mask <<= 1
  return _unfold(x, axis_name)


def halving_doubling(flat: jax.Array, axis_name: AxisName, combine: Combine) -> jax.Array:
  """Rabenseifner's all-reduce: recursive-halving reduce-scatter, then
  recursive-doubling all-gather.

  Reduce-scatter: in the step at distance ``mask`` (pof2/2, ..., 2, 1) each participant
  keeps the half of its current range that its rank bit selects, sends the other half
  to its partner and combines what it receives; ranges halve every step, so after lg p
  steps participant r owns chunk r of n/p. All-gather reverses this, doubling ranges.

  - steps: 2 lg p (+2 when p is not a power of two)
  - bytes sent per participant: 2(p-1)/p·n (bandwidth-optimal; +n on folded pairs)
  - time: 2 lg p·α + 2(p-1)/p·nβ + (p-1)/p·nγ

  Args/Returns: as :func:`allreduce_jax._ring.ring`.

  References:
    Rabenseifner, "Optimization of Collective Reduction Operations", ICCS 2004;
    Thakur, Rabenseifner & Gropp, IJHPCA 19(1), 2005.
  """
  p, n = _comm.size(axis_name), flat.shape[0]
  pof2, rem = _pof2(p), p - _pof2(p)
  x = _comm.pad_to_multiple(flat, pof2)  # T[pof2*c]
  x, newrank = _fold(x, axis_name, combine)
  mask = pof2 // 2
  while mask >= 1:  # reduce-scatter by recursive halving
    half = x.shape[0] // 2
    upper = ((newrank & mask) != 0).astype(jnp.int32)
    keep = lax.dynamic_slice_in_dim(x, upper * half, half)  # T[half]
    give = lax.dynamic_slice_in_dim(x, (1 - upper) * half, half)
    recv = _comm.send(give, axis_name, _xor_pairs(pof2, rem, mask))
    x = combine(keep, recv)
    mask //= 2
  mask = 1
  while mask < pof2:  # all-gather by recursive doubling
    h = x.shape[0]
    recv = _comm.send(x, axis_name, _xor_pairs(pof2, rem, mask))  # T[h]
    upper = ((newrank & mask) != 0).astype(jnp.int32)
    out = _comm.make_varying(jnp.zeros((2 * h,), x.dtype), axis_name)
    out = lax.dynamic_update_slice_in_dim(out, x, upper * h, 0)
    x = lax.dynamic_update_slice_in_dim(out, recv, (1 - upper) * h, 0)  # T[2h]
    mask <<= 1
  return _unfold(x, axis_name)[:n]
