"""Recursive doubling and recursive halving-doubling (Rabenseifner) all-reduce.

Both pair participant ``r`` with ``r XOR mask`` for masks 1, 2, 4, ... so they need a
power-of-two participant count. For other p we use MPICH's fold: with
``pof2 = 2**floor(lg p)`` and ``rem = p - pof2``, each even participant ``2k < 2*rem``
first hands its whole buffer to ``2k+1`` and sits out; the remaining ``pof2`` run the
algorithm under a new rank; at the end ``2k+1`` hands the result back to ``2k``. This
costs two extra steps and 2n extra bytes on the folded pairs.

Halving-doubling comes in two orders of the same steps: MPICH's far-first
(:func:`halving_doubling`) and near-first (``_near.py``); both, and Swing
(``_swing.py``), run on :func:`butterfly`, which takes the partner of each step
as data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from allreduce_jax import _comm, _wire, cost_model
from allreduce_jax._comm import AxisName
from allreduce_jax.registry import Algorithm, register

Combine = Callable[[jax.Array, jax.Array], jax.Array]


def largest_pof2(p: int) -> int:
  """The largest power of two not above ``p``."""
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
  rem = p - largest_pof2(p)
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
  rem = p - largest_pof2(p)
  if rem == 0:
    return x
  x = _comm.settle(x)  # lossy wire: 2k+1 keeps what 2k receives
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
  pof2, rem = largest_pof2(p), p - largest_pof2(p)
  x, newrank = _fold(flat, axis_name, combine)  # T[n]
  mask = 1
  while mask < pof2:
    x = _comm.settle(x)  # lossy wire: both partners combine the same two messages
    recv = _comm.send(x, axis_name, _xor_pairs(pof2, rem, mask))  # T[n]
    upper = (newrank & mask) != 0
    x = combine(jnp.where(upper, recv, x), jnp.where(upper, x, recv))
    mask <<= 1
  return _unfold(x, axis_name)


def _components(pof2: int, partners: Sequence[Sequence[int]], s: int) -> list[int]:
  """Smallest member of each rank's group after the reduce-scatter steps ``s, s+1, ...``.

  Ranks linked by the matchings of those steps form groups of ``pof2 / 2**s`` ranks
  that will exchange data among themselves only; each group owns one contiguous
  slice of the buffer. Returns ``rep[r]`` = the smallest rank of r's group.
  """
  rep = list(range(pof2))

  def find(x: int) -> int:
    while rep[x] != x:
      x = rep[x]
    return x

  for step in partners[s:]:
    for r, q in enumerate(step):
      a, b = find(r), find(q)
      if a != b:
        rep[max(a, b)] = min(a, b)
  return [find(r) for r in range(pof2)]


def butterfly_tables(pof2: int, partners: Sequence[Sequence[int]]) -> list[list[int]]:
  """For each reduce-scatter step, which half of its current slice each rank keeps.

  ``partners[s][r]`` is rank r's partner at step s (a perfect matching of
  ``range(pof2)``). A slice split at step s goes half to r's group of the later
  steps and half to the partner's; the group with the smaller lowest member takes
  the lower half. Returns ``upper[s][r]`` (1: r keeps the upper half). For XOR
  partners far-first this is bit ``pof2 >> (s+1)`` of r (MPICH's layout);
  near-first, bit s; for Swing, the group layout of De Sensi et al.

  Raises ``ValueError`` if the steps do not halve the groups every time (then the
  schedule is not a reduce-scatter).
  """
  upper = []
  for s, step in enumerate(partners):
    here, after = _components(pof2, partners, s), _components(pof2, partners, s + 1)
    row = []
    for r, q in enumerate(step):
      if here[r] != here[q] or after[r] == after[q] or step[q] != r:
        raise ValueError(f"partners of step {s} do not halve the groups (rank {r}, partner {q}).")
      row.append(int(after[r] > after[q]))
    upper.append(row)
  return upper


def butterfly(
  flat: jax.Array, axis_name: AxisName, combine: Combine, partners: Sequence[Sequence[int]]
) -> jax.Array:
  """Reduce-scatter by recursive halving, then all-gather by recursive doubling, with
  the partner of each step given by ``partners`` (over the ``pof2`` folded ranks).

  The reduce-scatter runs the steps in the given order, the all-gather in reverse.
  In each reduce-scatter step every rank sends the half of its slice that the
  partner's group will own (:func:`butterfly_tables`) and combines the half it keeps
  with what it receives, so after lg pof2 steps each rank owns one fully reduced
  n/pof2 slice; the all-gather retraces the steps, doubling slices. Non-powers of two
  fold first (MPICH). Shared by far-first and near-first halving-doubling and Swing.

  Args:
    flat: ``T[n]``.
    axis_name: the axis (or tuple of axes) to reduce over.
    combine: elementwise reduction.
    partners: ``partners[s][r]``, one perfect matching of ``range(pof2)`` per step.

  Returns:
    ``T[n]``, reduced over all participants, identical on each.
  """
  p, n = _comm.size(axis_name), flat.shape[0]
  pof2, rem = largest_pof2(p), p - largest_pof2(p)
  tables = [jnp.asarray(np.asarray(u, np.int32)) for u in butterfly_tables(pof2, partners)]
  pairs = [
    [(_real_rank(r, rem), _real_rank(q, rem)) for r, q in enumerate(step)] for step in partners
  ]
  # A lossy wire quantizes in blocks from each message's start: whole blocks per
  # slice keep the all-gather's concatenated slices on their grid (forwarded exactly).
  block = _wire.BLOCK if _wire.active() is not None else 1
  x = _comm.pad_to_multiple(flat, pof2 * block)  # T[pof2*c]
  x, newrank = _fold(x, axis_name, combine)
  slot = jnp.maximum(newrank, 0)  # folded-out ranks (-1) compute garbage, never sent
  x = _halving(x, axis_name, combine, pairs, tables, slot)  # the owner's reduced slice
  x = _comm.finished(x, axis_name)  # folded-out ranks: unused
  x = _comm.settle(x)  # lossy wire: the owner holds what it sends
  x = _doubling(x, axis_name, pairs, tables, slot)
  return _unfold(x, axis_name)[:n]


def _halving(x, axis_name, combine, pairs, tables, slot) -> jax.Array:
  """Reduce-scatter by recursive halving: ``T[pof2*c] -> T[c]``, rank ``slot``
  keeping, in each step, the half its row of ``tables`` selects."""
  for step_pairs, table in zip(pairs, tables):
    half = x.shape[0] // 2
    upper = table[slot]
    keep = lax.dynamic_slice_in_dim(x, upper * half, half)  # T[half]
    give = lax.dynamic_slice_in_dim(x, (1 - upper) * half, half)
    x = combine(keep, _comm.send(give, axis_name, step_pairs))
  return x


def _doubling(x, axis_name, pairs, tables, slot) -> jax.Array:
  """All-gather by recursive doubling, the halving steps retraced in reverse:
  ``T[c] -> T[pof2*c]``."""
  for step_pairs, table in zip(reversed(pairs), reversed(tables)):
    h = x.shape[0]
    recv = _comm.send(x, axis_name, step_pairs)  # T[h]
    upper = table[slot]
    out = _comm.make_varying(jnp.zeros((2 * h,), x.dtype), axis_name)
    out = lax.dynamic_update_slice_in_dim(out, x, upper * h, 0)
    x = lax.dynamic_update_slice_in_dim(out, recv, (1 - upper) * h, 0)  # T[2h]
  return x


def _far_first_plan(axis_name: AxisName, what: str):
  """The pairs and tables of far-first halving on a power-of-two axis (no fold)."""
  p = _comm.size(axis_name)
  if p != largest_pof2(p):
    raise ValueError(
      f"algorithm='halving_doubling' has a {what} over a power-of-two number of"
      f" participants only; axis_name={axis_name!r} has {p} (use algorithm='ring')."
    )
  partners = far_first_partners(p)
  tables = [jnp.asarray(np.asarray(u, np.int32)) for u in butterfly_tables(p, partners)]
  pairs = [list(enumerate(step)) for step in partners]
  return pairs, tables


def halving_reduce_scatter(flat: jax.Array, axis_name: AxisName, combine: Combine) -> jax.Array:
  """Recursive-halving reduce-scatter, far partners first (Rabenseifner's first half):
  ``T[p*c] -> T[c]``, participant ``r`` gets reduced chunk ``r``. lg p steps, n/2, n/4,
  ... bytes: (p-1)/p·n. A power-of-two p only (the fold has no slice for the ranks
  it sets aside)."""
  pairs, tables = _far_first_plan(axis_name, "reduce-scatter")
  return _halving(flat, axis_name, combine, pairs, tables, _comm.index(axis_name))


def doubling_all_gather(block: jax.Array, axis_name: AxisName) -> jax.Array:
  """Recursive-doubling all-gather, near partners first (Rabenseifner's second
  half): ``T[c] -> T[p*c]``; lg p steps of c, 2c, ... bytes. A power-of-two p only."""
  pairs, tables = _far_first_plan(axis_name, "all-gather")
  block = _comm.make_varying(block, axis_name)
  return _doubling(block, axis_name, pairs, tables, _comm.index(axis_name))


def butterfly_messages(
  p: int, partners: Sequence[Sequence[int]]
) -> list[list[tuple[int, int, float, bool]]]:
  """The message steps of :func:`butterfly` as ``(source, target, fraction of n,
  combined)``: fold (whole buffer, ``2k -> 2k+1``), lg pof2 halving steps (n/2, n/4,
  ..., combined), the doubling steps in reverse (..., n/4, n/2), unfold. Fractions
  ignore the padding to a multiple of pof2.
  """
  rem = p - largest_pof2(p)
  fold = [[(2 * k, 2 * k + 1, 1.0, True) for k in range(rem)]] if rem else []
  unfold = [[(2 * k + 1, 2 * k, 1.0, False) for k in range(rem)]] if rem else []
  pairs = [
    [(_real_rank(r, rem), _real_rank(q, rem)) for r, q in enumerate(step)] for step in partners
  ]
  rs = [[(a, b, 0.5 ** (s + 1), True) for a, b in step] for s, step in enumerate(pairs)]
  ag = [[(a, b, 0.5 ** (s + 1), False) for a, b in step] for s, step in enumerate(pairs)]
  return fold + rs + ag[::-1] + unfold


def far_first_partners(pof2: int) -> list[list[int]]:
  """XOR partners, largest distance first (MPICH): masks pof2/2, ..., 2, 1."""
  masks = [pof2 >> (s + 1) for s in range(pof2.bit_length() - 1)]
  return [[r ^ m for r in range(pof2)] for m in masks]


def halving_doubling(flat: jax.Array, axis_name: AxisName, combine: Combine) -> jax.Array:
  """Rabenseifner's all-reduce: recursive-halving reduce-scatter, then
  recursive-doubling all-gather, in MPICH's order (far partners first).

  Reduce-scatter: in the step at distance ``mask`` (pof2/2, ..., 2, 1) each participant
  keeps the half of its current range that its rank bit selects, sends the other half
  to its partner and combines what it receives; ranges halve every step, so after lg p
  steps participant r owns chunk r of n/p. All-gather reverses this, doubling ranges.
  The largest messages (n/2) travel the farthest (distance pof2/2): on a torus or a
  tapered fat tree that is the costly order (see :func:`halving_doubling_near`).

  - steps: 2 lg p (+2 when p is not a power of two)
  - bytes sent per participant: 2(p-1)/p·n (bandwidth-optimal; +n on folded pairs)
  - time: 2 lg p·α + 2(p-1)/p·nβ + (p-1)/p·nγ

  Args/Returns: as :func:`allreduce_jax._ring.ring`.

  References:
    Rabenseifner, "Optimization of Collective Reduction Operations", ICCS 2004;
    Thakur, Rabenseifner & Gropp, IJHPCA 19(1), 2005.
  """
  return butterfly(
    flat, axis_name, combine, far_first_partners(largest_pof2(_comm.size(axis_name)))
  )


def _fold_steps(p: int):
  pof2 = 1 << (p.bit_length() - 1)
  rem = p - pof2

  def real(r):
    return 2 * r + 1 if r < rem else r + rem

  fold = [[(2 * k, 2 * k + 1, 1.0, True) for k in range(rem)]] if rem else []
  unfold = [[(2 * k + 1, 2 * k, 1.0, False) for k in range(rem)]] if rem else []
  return pof2, real, fold, unfold


def recursive_doubling_messages(sizes: Sequence[int]) -> list[list[tuple]]:
  """MPICH fold to a power of two, lg p full-buffer XOR exchanges, unfold."""
  (p,) = sizes
  if p < 2:
    return []
  pof2, real, fold, unfold = _fold_steps(p)
  masks = [1 << k for k in range(pof2.bit_length() - 1)]
  mid = [[(real(r), real(r ^ m), 1.0, True) for r in range(pof2)] for m in masks]
  return fold + mid + unfold


def halving_doubling_messages(sizes: Sequence[int]) -> list[list[tuple]]:
  """Rabenseifner, MPICH (far-first) order: halving at distance pof2/2 ... 1 with
  n/2, n/4, ... then doubling at 1 ... pof2/2 with n/pof2 ... n/2."""
  (p,) = sizes
  if p < 2:
    return []
  pof2, real, fold, unfold = _fold_steps(p)
  L = pof2.bit_length() - 1
  rs = [
    [(real(r), real(r ^ (pof2 >> (s + 1))), 1 / 2 ** (s + 1), True) for r in range(pof2)]
    for s in range(L)
  ]
  ag = [
    [(real(r), real(r ^ (1 << s)), (1 << s) / pof2, False) for r in range(pof2)] for s in range(L)
  ]
  return fold + rs + ag + unfold


register(
  Algorithm(
    "recursive_doubling",
    recursive_doubling,
    schedule=cost_model.recursive_doubling_schedule,
    messages=recursive_doubling_messages,
    two_level=cost_model.recursive_doubling_two_level,
    summary="lg p full-buffer exchanges with XOR partners",
  )
)
register(
  Algorithm(
    "halving_doubling",
    halving_doubling,
    schedule=cost_model.halving_doubling_schedule,
    messages=halving_doubling_messages,
    two_level=cost_model.halving_doubling_two_level,
    summary="Rabenseifner: recursive-halving RS + recursive-doubling AG",
    reduce_scatter=halving_reduce_scatter,
    all_gather=doubling_all_gather,
  )
)
