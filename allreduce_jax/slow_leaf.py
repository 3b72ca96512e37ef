"""The slow host as a pipelined leaf: an all-reduce for one participant on a slow link.

Any exact all-reduce must move n bytes out of every participant's link and n bytes into
it (:func:`allreduce_jax.gloo_model.cut_bound_seconds`). Where one participant's link is
much slower than the others', the ring moves 2(p-1)/p·n through it each way and a tree
with that host as a leaf moves n up, then n down, one after the other: 1.5× and 2× the
bound at p = 4. Here the slow participant (the *leaf*) sends its n once and receives
the result once, both at the same time, in chunks:

- the vector is cut into ``k`` chunks; in stage ``t`` (``t = 0 … k``) ONE ``ppermute``
  carries the leaf's chunk ``t`` to healthy host ``a`` and the finished chunk ``t-1``
  from healthy host ``b`` to the leaf. ``a`` and ``b`` are different hosts (for
  p ≥ 3): over gloo an exchange with one peer runs half duplex
  (:func:`allreduce_jax.replay.half_duplex`), a send to one and a receive from
  another run at once;
- after stage ``t`` the p-1 healthy hosts all-reduce chunk ``t`` among themselves, the
  leaf's part added at ``a``: a ring (reduce-scatter then all-gather) over the healthy
  hosts in 2(p-2) ``ppermute`` steps of 1/(k(p-1)) of the vector each. Every piece is
  reduced once, on one healthy host, and copied from there, so every participant ends
  with the same bits.

The healthy hosts are ``leaf+1, …, leaf+p-1`` (mod p): ``a = leaf+1`` receives, ``b =
leaf-1`` sends. At p = 2 the one healthy host is both (each stage an exchange).

- ``ppermute`` steps: (k+1) + 2k(p-2)
- bytes through the leaf's link: n each way (the bound's), in k+1 stages of n/k
- time on a switch, the leaf's link at ``r_s`` bytes/s and the others' at ``r``
  (payload), one ``ppermute`` at a time as XLA:CPU runs them:
  (k+1)(α + n/(k·r_s)) + 2k(p-2)α + 2(p-2)/(p-1)·n/r — about (1 + 1/k)× the bound plus
  the healthy ring's time, which the stages do not hide (the leaf's receiver is busy
  with the leaf's chunk until the stage ends). Over gloo an exchange runs half duplex,
  which doubles the stages' time at p = 2 (a = b) and the healthy ring's at p = 3.

Not in the registry: it needs to be told which participant is slow (``leaf``) and how
finely to pipeline (``chunks``), which a registry algorithm's ``(flat, axis_name,
combine)`` does not carry.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from allreduce_jax import _comm, gloo_model, replay
from allreduce_jax._comm import AxisName
from allreduce_jax._invariant import as_invariant
from allreduce_jax._ops import get_op

Combine = Callable[[jax.Array, jax.Array], jax.Array]


def _check(leaf, chunks, p: int) -> None:
  if not isinstance(leaf, (int, np.integer)) or isinstance(leaf, bool) or not 0 <= leaf < p:
    raise ValueError(f"leaf={leaf!r}: expected a participant index in [0, {p}).")
  if not isinstance(chunks, (int, np.integer)) or isinstance(chunks, bool) or chunks < 1:
    raise ValueError(f"chunks={chunks!r}: expected an int >= 1.")


def stage_chunks(n: int, p: int, chunks: int) -> int:
  """The chunk count used for ``n`` elements on ``p`` participants: ``chunks``, but no
  more than one chunk per p-1 elements (a chunk of padding only would cross the slow
  link for nothing)."""
  return max(1, min(chunks, math.ceil(n / max(1, p - 1))))


def slow_leaf(
  flat: jax.Array, axis_name: AxisName, combine: Combine, *, leaf: int, chunks: int
) -> jax.Array:
  """The pipelined-leaf all-reduce of one participant's ``flat`` (``T[n]``).

  Args:
    flat: this participant's block, ``T[n]`` (made varying over ``axis_name`` by the
      caller under ``check_vma=True``, as ``all_reduce`` does).
    axis_name: the mesh axis (or tuple of axes) to reduce over.
    combine: elementwise reduction of two partial results.
    leaf: the participant on the slow link (``0 <= leaf < p``).
    chunks: pipeline stages' chunk count ``k`` (see :func:`stage_chunks`).

  Returns:
    ``T[n]``: the reduction over all participants, the same bits on each.
  """
  p, i = _comm.size(axis_name), _comm.index(axis_name)
  _check(leaf, chunks, p)
  n = flat.shape[0]
  if p == 1 or n == 0:
    return flat
  h = p - 1  # healthy hosts
  k = stage_chunks(n, p, chunks)
  q = math.ceil(n / (k * h))  # one piece of the healthy ring
  c = q * h  # one chunk: what crosses the slow link in a stage
  x = _comm.pad_to_multiple(flat, k * c).reshape(k, c)  # T[k, c]
  healthy = [(leaf + 1 + j) % p for j in range(h)]
  a, b = healthy[0], healthy[-1]
  is_leaf = i == leaf
  r = (i - leaf - 1) % p  # rank in the healthy ring (the leaf's: h, unused)
  ring_pairs = [(healthy[j], healthy[(j + 1) % h]) for j in range(h)]
  done: list[jax.Array] = []  # finished chunks, T[c] each
  finished = None  # the finished chunk t-1 on the healthy hosts
  for t in range(k + 1):
    # Stage t, one ppermute: the leaf's chunk t to a, the finished chunk t-1 from b.
    pairs = ([(leaf, a)] if t < k else []) + ([(b, leaf)] if t > 0 else [])
    raw = x[min(t, k - 1)]  # T[c]
    msg = raw if finished is None else jnp.where(is_leaf, raw, finished)
    got = _comm.send(msg, axis_name, pairs)  # a: the leaf's chunk t; leaf: chunk t-1
    if t > 0:
      done.append(jnp.where(is_leaf, got, finished))
    if t == k:
      break
    part = jnp.where(i == a, combine(raw, got), raw)  # T[c]: the leaf's part added at a
    finished = _healthy_ring(part, r, h, q, axis_name, ring_pairs, combine)
  return jnp.concatenate(done)[:n]


def _healthy_ring(part, r, h: int, q: int, axis_name, pairs, combine) -> jax.Array:
  """Ring all-reduce of ``part`` (``T[h*q]``) over the h healthy hosts along ``pairs``
  (healthy rank j sends to j+1): piece r finished on healthy rank r, then gathered."""
  if h == 1:
    return _comm.settle(part)

  def piece(j):
    return _comm.chunk(part, j % h, q)  # T[q]

  acc = piece(r - 1)  # after step s: piece r-s-2 summed over s+2 healthy hosts
  for s in range(h - 1):
    acc = combine(_comm.send(acc, axis_name, pairs), piece(r - s - 2))
  acc = _comm.settle(acc)  # piece r, reduced over every participant
  out = lax.dynamic_update_slice_in_dim(jnp.zeros_like(part), acc, (r % h) * q, 0)
  cur = acc
  for s in range(h - 1):
    cur = _comm.send(cur, axis_name, pairs)  # started at healthy rank r-s-1
    out = lax.dynamic_update_slice_in_dim(out, cur, ((r - s - 1) % h) * q, 0)
  return out  # T[h*q]


def slow_leaf_all_reduce(
  x: jax.Array, axis_name: AxisName, *, leaf: int, chunks: int = 8, op: str = "sum"
) -> jax.Array:
  """All-reduce of ``x`` over ``axis_name`` with participant ``leaf`` as the pipelined
  leaf (:func:`slow_leaf`), inside ``jax.shard_map``: ``lax.psum``'s result for ``op``
  ``"sum"`` (and ``lax.pmax``/``pmin``, or psum / p for ``"mean"``, under the semantics
  of :mod:`allreduce_jax._ops`), typed invariant like psum's.

  Args:
    x: this participant's array, any shape.
    axis_name: the mesh axis (or tuple of axes) to reduce over.
    leaf: the participant on the slow link, ``0 <= leaf < p``.
    chunks: pipeline chunks ``k``: (1 + 1/k)× the bound through the slow link, and
      (k+1) + 2k(p-2) ``ppermute`` steps.
    op: ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``.

  Returns:
    An array like ``x``, the reduction over all participants, the same bits on each.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> from allreduce_jax.slow_leaf import slow_leaf_all_reduce
    >>> mesh = jax.make_mesh((4,), ("i",), devices=jax.devices()[:4])
    >>> f = jax.shard_map(lambda v: slow_leaf_all_reduce(v, "i", leaf=1, chunks=2),
    ...                   mesh=mesh, in_specs=P("i"), out_specs=P())
    >>> x = jax.device_put(jnp.arange(12.0), jax.NamedSharding(mesh, P("i")))
    >>> print(f(x))
    [18. 22. 26.]
  """
  x = jnp.asarray(x)
  reduction = get_op(op, x.dtype)
  p = _comm.size(axis_name)
  _check(leaf, chunks, p)
  flat = _comm.make_varying(x.reshape(-1), axis_name)  # T[n]
  flat = slow_leaf(flat, axis_name, reduction.combine, leaf=leaf, chunks=chunks)
  out = reduction.finalize(flat, p=p).reshape(x.shape)
  return as_invariant(out, axis_name)


def slow_leaf_messages(p: int, *, leaf: int, chunks: int) -> list[list[tuple]]:
  """The schedule one step per ``ppermute``, as :func:`slow_leaf` sends it on a vector
  of n elements with ``k = chunks`` (n a multiple of k(p-1)): ``(src, dst, fraction of
  n, combined)`` per message, the replay's format
  (:func:`allreduce_jax.replay.profile`)."""
  _check(leaf, chunks, p)
  if p < 2:
    return []
  h, k = p - 1, chunks
  healthy = [(leaf + 1 + j) % p for j in range(h)]
  a, b = healthy[0], healthy[-1]
  rs = [(healthy[j], healthy[(j + 1) % h], 1 / (k * h), True) for j in range(h)]
  ag = [(src, dst, f, False) for src, dst, f, _ in rs]
  ring = [rs] * (h - 1) + [ag] * (h - 1) if h > 1 else []
  steps = []
  for t in range(k + 1):
    stage = ([(leaf, a, 1 / k, True)] if t < k else []) + ([(b, leaf, 1 / k, False)] if t else [])
    steps.append(stage)
    if t < k:
      steps.extend(ring)
  return steps


def slow_leaf_seconds(
  p: int,
  n_bytes: float,
  *,
  leaf: int,
  chunks: int,
  rate: float,
  alpha: float,
  link_rates: dict[int, float] | None = None,
  network: str = "switch",
  mtu: int = 1500,
) -> float:
  """The replayed time of :func:`slow_leaf` on the emulated ``network`` as XLA:CPU runs
  it over gloo (one ``ppermute`` at a time, an exchange at half duplex): the same
  pricing as :func:`allreduce_jax.gloo_model.emulated_seconds` (``rate``, ``alpha``,
  ``link_rates``, ``mtu`` as it takes them, no token bucket) on
  :func:`slow_leaf_messages`.

  Example:
    >>> from allreduce_jax import gloo_model
    >>> t = slow_leaf_seconds(4, 4 * 2**20, leaf=1, chunks=8, rate=25e6, alpha=0.0,
    ...                       link_rates={1: 2.5e6})
    >>> round(t / gloo_model.cut_bound_seconds(4 * 2**20, 4, rate=25e6,
    ...                                        link_rates={1: 2.5e6}), 3)  # 9/8 + 4/3 · 1/10
    1.258
  """
  if not rate > 0:
    raise ValueError(f"rate={rate!r}: expected a link rate in bytes/s > 0.")
  steps = replay.half_duplex(slow_leaf_messages(p, leaf=leaf, chunks=chunks))
  if not steps:
    return 0.0
  top = gloo_model.emulated_network(network, p, rate=rate, link_rates=link_rates)
  params = gloo_model.link_params(rate, alpha, mtu)
  return float(replay.profile(steps, top, p).seconds(n_bytes, params).sum())
