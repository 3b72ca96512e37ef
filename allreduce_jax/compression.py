"""Stateful gradient compression as optax transformations: PowerSGD and top-k.

Both sit where :func:`allreduce_jax.all_reduce_gradients` sits (chained first, inside
the ``jax.shard_map`` body of a data-parallel step) and return updates already
averaged over the axis. Their state (error feedback, PowerSGD's warm-start Q, the
step count) is the optax state, one copy per participant like the optimizer's.

Error feedback (Seide et al. 2014; Karimireddy et al. 2019): each participant adds
what compression dropped last time to this step's gradient before compressing, and
keeps the new difference, ``e ← (g + e) − C(g + e)``. Without it both methods are
biased; with it the dropped mass is delayed, not lost.
"""

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from allreduce_jax import _comm
from allreduce_jax._api import check_axis_name
from allreduce_jax._comm import AxisName
from allreduce_jax._invariant import as_invariant, varying_axes
from allreduce_jax._ring import ring_all_gather
from allreduce_jax.fusion import all_reduce_tree
from allreduce_jax.registry import check_algorithm

#: DDP's ``min_compression_rate``: a matrix is compressed only if
#: (rows + cols)·rank·2 < rows·cols.
MIN_COMPRESSION_RATE = 2


def _like(new: Any, old: Any, axis_name: AxisName) -> Any:
  """``new`` typed varying over ``axis_name`` wherever ``old`` was (typed shard_map:
  a state that enters varying must leave varying, e.g. as a ``lax.scan`` carry)."""

  def one(n, o):
    if set(_comm.axes_tuple(axis_name)) <= varying_axes(jnp.asarray(o)):
      return _comm.make_varying(n, axis_name)
    return n

  return jax.tree.map(one, new, old)


def _zeros_f32(tree: Any) -> Any:
  return jax.tree.map(lambda a: jnp.zeros(jnp.shape(a), jnp.float32), tree)


def _f32(a: jax.Array) -> jax.Array:
  """A floating leaf narrower than float32 (bfloat16, float16) in float32."""
  floating = jnp.issubdtype(a.dtype, jnp.floating) and jnp.finfo(a.dtype).bits < 32
  return a.astype(jnp.float32) if floating else a


def _mean_in_f32(tree: Any, axis_name: AxisName, algorithm: str) -> Any:
  """The exact mean of every leaf, computed in float32 and rounded to the leaf's dtype
  once (a bfloat16 sum rounds at every addition)."""
  out = all_reduce_tree(jax.tree.map(_f32, tree), axis_name, op="mean", algorithm=algorithm)
  return jax.tree.map(lambda o, g: o.astype(g.dtype), out, tree)


# ----------------------------------------------------------------------------------------
# PowerSGD.
# ----------------------------------------------------------------------------------------


class PowerSGDState(NamedTuple):
  """``count``: updates so far (i32[]); ``q``: the warm-start Q of each compressed
  matrix (``f32[cols, rank]``, in leaf order); ``residual``: the error feedback, a
  float32 tree like the updates (zeros without error feedback)."""

  count: jax.Array
  q: tuple
  residual: Any


def _matrix_shape(shape: tuple[int, ...], rank: int) -> tuple[int, int] | None:
  """``(rows, cols)`` a leaf is compressed as (first dimension x the rest), or None
  when it is not worth it (vectors; DDP's rule (rows + cols)·r·2 ≥ rows·cols)."""
  if len(shape) < 2:
    return None
  rows, cols = shape[0], math.prod(shape[1:])
  if (rows + cols) * rank * MIN_COMPRESSION_RATE >= rows * cols:
    return None
  return rows, cols


def _orthonormal_columns(p: jax.Array) -> jax.Array:
  """Gram-Schmidt on the columns of ``p: f32[rows, r]`` (a zero column stays zero)."""
  cols = []
  for j in range(p.shape[1]):
    v = p[:, j]
    for u in cols:
      v = v - jnp.dot(u, v) * u
    cols.append(v * lax.rsqrt(jnp.maximum(jnp.dot(v, v), 1e-30)))
  return jnp.stack(cols, axis=1)


def powersgd(
  axis_name: AxisName,
  *,
  rank: int = 1,
  start_step: int = 0,
  algorithm: str = "ring",
  error_feedback: bool = True,
) -> optax.GradientTransformation:
  """PowerSGD (Vogels et al. 2019; PyTorch DDP's ``powerSGD_hook``) as an optax
  transformation that averages the updates over ``axis_name``.

  Per step, for every leaf of at least two dimensions viewed as ``M: f32[n, m]``
  (first dimension x the rest) with (n + m)·rank·2 < n·m: ``M ← g + e`` (error
  feedback), ``P = mean_i(M_i Q)``, orthonormalize P's columns, ``Q = mean_i(M_iᵀ P)``,
  and the update is ``P Qᵀ``; ``e ← M − P Qᵀ``; Q is kept for the next step (warm
  start: one power iteration per step). The other leaves are averaged exactly, in the
  same all-reduce as the P's. Before ``start_step`` (DDP's ``start_powerSGD_iter``:
  compressing too early can steer training off) every leaf is averaged exactly.
  Everything is computed in float32 (bfloat16/float16 leaves too) and each update is
  rounded to its leaf's dtype once.

  - all-reduces per step: 2 (P's with the uncompressed leaves, then Q's)
  - bytes per compressed matrix: (n + m)·rank·4 instead of n·m·4
  - exact when the average gradient has rank ≤ ``rank`` (after one step)

  Args:
    axis_name: the data-parallel mesh axis (or a tuple of axes).
    rank: keyword-only; the rank r of the approximation (1–4 is typical).
    start_step: keyword-only; updates before this one are averaged exactly.
    algorithm: keyword-only; the all-reduce algorithm for P and Q (a key of
      ``ALGORITHMS``; P and Q are small, so ``"tree"`` or ``"recursive_doubling"``
      may be faster).
    error_feedback: keyword-only; keep and re-add what compression dropped.

  Returns:
    ``optax.GradientTransformation``; state :class:`PowerSGDState`.

  References:
    Vogels, Karimireddy & Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression
    for Distributed Optimization", NeurIPS 2019.
  """
  if not isinstance(rank, int) or rank < 1:
    raise ValueError(f"rank={rank!r} must be a positive integer.")
  if not isinstance(start_step, int) or start_step < 0:
    raise ValueError(f"start_step={start_step!r} must be a non-negative integer.")
  check_algorithm(algorithm)

  def init_fn(params: Any) -> PowerSGDState:
    return _powersgd_init(params, rank)

  def step(updates, state, compress: bool):
    if compress:
      result = _powersgd_compressed(updates, state, axis_name, rank, algorithm, error_feedback)
    else:
      out = _mean_in_f32(updates, axis_name, algorithm)
      result = out, state.q, state.residual
    return _typed(result, updates, state, axis_name)

  def update_fn(updates: Any, state: PowerSGDState, params: Any = None):
    del params
    if start_step == 0:
      out, q, residual = step(updates, state, True)
    else:
      out, q, residual = lax.cond(
        state.count >= start_step,
        lambda u, s: step(u, s, True),
        lambda u, s: step(u, s, False),
        updates,
        state,
      )
    return out, PowerSGDState(state.count + 1, q, residual)

  return optax.GradientTransformation(init_fn, update_fn)


def _powersgd_init(params: Any, rank: int) -> PowerSGDState:
  """Count 0, one Q per compressed leaf, zero residuals."""
  leaves = jax.tree.leaves(params)
  qs = []
  for k, leaf in enumerate(leaves):
    shape = _matrix_shape(tuple(jnp.shape(leaf)), rank)
    if shape is not None:  # the same Q on every participant: a fixed key per leaf
      qs.append(jax.random.normal(jax.random.key(k), (shape[1], rank), jnp.float32))
  return PowerSGDState(jnp.zeros((), jnp.int32), tuple(qs), _zeros_f32(params))


def _powersgd_compressed(updates, state, axis_name, rank, algorithm, error_feedback):
  """One PowerSGD step: ``(averaged updates, new Q's, new residual)``."""
  leaves, treedef = jax.tree.flatten(updates)
  residual = treedef.flatten_up_to(state.residual)
  ms, plain, ps, which = _powersgd_local(leaves, residual, state.q, rank, error_feedback)
  first = all_reduce_tree({"p": ps, "plain": plain}, axis_name, op="mean", algorithm=algorithm)
  p_hat = [_orthonormal_columns(first["p"][k]) for k in sorted(ps)]
  q_local = [m.T @ ph for m, ph in zip(ms, p_hat)]  # f32[m, r] each
  q_hat = all_reduce_tree(q_local, axis_name, op="mean", algorithm=algorithm)
  out, new_residual = [], []
  for k, (g, e) in enumerate(zip(leaves, residual)):
    j = which[k]
    if j is None:
      out.append(first["plain"][k].astype(g.dtype))
      new_residual.append(jnp.zeros_like(e))
      continue
    approx = p_hat[j] @ q_hat[j].T  # f32[n, m], the same on every participant
    out.append(approx.reshape(g.shape).astype(g.dtype))
    new_residual.append((ms[j] - approx).reshape(g.shape) if error_feedback else jnp.zeros_like(e))
  return (
    jax.tree.unflatten(treedef, out),
    tuple(q_hat),
    jax.tree.unflatten(treedef, new_residual),
  )


def _powersgd_local(leaves, residual, qs, rank: int, error_feedback: bool):
  """This participant's half of the first all-reduce: ``M = g + e`` of each compressed
  leaf (``ms``), its ``P = M Q`` (``ps``, by leaf index), the uncompressed leaves
  (``plain``, by leaf index) and ``which`` (each leaf's Q index, None if uncompressed)."""
  ms, plain, ps, which = [], {}, {}, []
  qi = 0
  for k, (g, e) in enumerate(zip(leaves, residual)):
    shape = _matrix_shape(tuple(g.shape), rank)
    if shape is None:
      plain[k] = _f32(g)  # averaged in float32, rounded once
      which.append(None)
      continue
    m = (g.astype(jnp.float32) + (e if error_feedback else 0.0)).reshape(shape)  # f32[n, m]
    ms.append(m)
    ps[k] = m @ qs[qi]  # f32[n, r]
    which.append(qi)
    qi += 1
  return ms, plain, ps, which


def _typed(result, updates, state, axis_name: AxisName):
  """One type for both branches of lax.cond and for the state coming back: Q as the
  state's Q, the residual varying wherever this participant's gradient or old
  residual is (typed shard_map; a no-op under check_vma=False)."""
  out, q, residual = result
  axes = set(_comm.axes_tuple(axis_name))

  def res(r, g, e):
    if axes <= varying_axes(jnp.asarray(g)) or axes <= varying_axes(jnp.asarray(e)):
      return _comm.make_varying(r, axis_name)
    return r

  residual = jax.tree.map(res, residual, updates, state.residual)
  return out, _like(q, state.q, axis_name), residual


# ----------------------------------------------------------------------------------------
# Top-k.
# ----------------------------------------------------------------------------------------


class TopKState(NamedTuple):
  """``residual``: the error feedback, a float32 tree like the updates (zeros
  without error feedback)."""

  residual: Any


def topk(
  axis_name: AxisName, *, fraction: float = 0.01, error_feedback: bool = True
) -> optax.GradientTransformation:
  """Top-k sparsification with error feedback, averaged over ``axis_name``.

  Per step and leaf (``g: T[n]`` flattened, ``k = ceil(fraction · n)``): ``c = g + e``;
  each participant keeps its k entries of largest magnitude, as (value, index) pairs;
  every participant's pairs of every leaf travel in ONE ring all-gather (values'
  float32 bits and int32 indices packed as int32); each participant then adds all p·k
  pairs into zeros in the same order and divides by p, so every copy holds the same
  bits. ``e ← c − (c with only its top k)``.

  - bytes sent per participant: (p − 1)·8k per leaf (the ring all-gather), against
    2(p − 1)/p·4n for a dense ring all-reduce: fraction·p times the dense bytes
  - the gathered pairs grow with p, so top-k pays for small ``fraction · p``

  Args:
    axis_name: the data-parallel mesh axis (or a tuple of axes).
    fraction: keyword-only; the share of each leaf's entries sent, in (0, 1].
    error_feedback: keyword-only; keep and re-add what was not sent.

  Returns:
    ``optax.GradientTransformation``; state :class:`TopKState`.

  References:
    Aji & Heafield, "Sparse Communication for Distributed Gradient Descent", EMNLP
    2017; Stich, Cordonnier & Jaggi, "Sparsified SGD with Memory", NeurIPS 2018.
  """
  if not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
    raise ValueError(f"fraction={fraction!r} must be a number in (0, 1].")

  def init_fn(params: Any) -> TopKState:
    return TopKState(_zeros_f32(params))

  def update_fn(updates: Any, state: TopKState, params: Any = None):
    del params
    check_axis_name(axis_name, "ring")  # all_reduce's message for an unbound axis
    leaves, treedef = jax.tree.flatten(updates)
    residual = treedef.flatten_up_to(state.residual)
    p = _comm.size(axis_name)
    flats, packed, ks = [], [], []
    for g, e in zip(leaves, residual):
      c = g.reshape(-1).astype(jnp.float32) + (e.reshape(-1) if error_feedback else 0.0)
      k = min(c.shape[0], max(1, math.ceil(fraction * c.shape[0])))  # 0 for an empty leaf
      _, idx = lax.top_k(jnp.abs(c), k)  # i32[k]
      vals = c[idx]  # f32[k]
      flats.append(c)
      ks.append((k, idx))
      packed += [lax.bitcast_convert_type(vals, jnp.int32), idx.astype(jnp.int32)]
    if sum(k for k, _ in ks):
      block = _comm.make_varying(jnp.concatenate(packed), axis_name)  # i32[2 Σk]
      gathered = ring_all_gather(block, axis_name).reshape(p, -1)  # i32[p, 2 Σk]
    else:  # nothing to send: every leaf is empty
      gathered = jnp.zeros((p, 0), jnp.int32)
    out, new_residual, offset = [], [], 0
    for g, c, (k, idx) in zip(leaves, flats, ks):
      vals = lax.bitcast_convert_type(gathered[:, offset : offset + k], jnp.float32)
      where = gathered[:, offset + k : offset + 2 * k]
      offset += 2 * k
      dense = jnp.zeros(c.shape, jnp.float32).at[where.reshape(-1)].add(vals.reshape(-1))
      avg = as_invariant(dense / p, axis_name).reshape(g.shape).astype(g.dtype)
      out.append(avg)
      kept = jnp.zeros_like(c).at[idx].set(c[idx])
      new_residual.append((c - kept).reshape(g.shape) if error_feedback else jnp.zeros(g.shape))
    new = TopKState(jax.tree.unflatten(treedef, new_residual))
    return jax.tree.unflatten(treedef, out), _like(new, state, axis_name)

  return optax.GradientTransformation(init_fn, update_fn)


__all__ = ["PowerSGDState", "TopKState", "powersgd", "topk"]
