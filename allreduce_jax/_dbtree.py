"""Double binary tree all-reduce (Sanders, Speck & Träff 2009; NCCL 2.4's "Tree").

Two binary trees over the same p participants, each carrying half of the buffer,
built as NCCL builds them (``src/graph/trees.cc``): tree A is the in-order binary
tree on ranks (0 at the top with one child, then 1, 3, 5, ... the leaves); tree B
is A mirrored (r -> p-1-r) when p is even, A shifted by one (r -> r+1) when p is
odd. With p even every odd rank is a leaf of A and an interior node of B, so no
participant forwards data in both trees and the load is balanced.

Each half is cut into k chunks and pipelined: a participant of height h sends
chunk j up to its parent in round j + h (after its children's copies of chunk j
have arrived), the root finishes chunk j in round j + H - 1, and a participant at
depth δ sends the finished chunk j to its children in round j + H + δ. Reduction of
later chunks and broadcast of earlier ones overlap: R = k + 2H - 1 rounds in all,
H = ⌈lg p⌉ the tree height. A round's upward transfers (combined on arrival) and
its downward ones (stored) are each split into partial permutations by a bipartite
edge colouring, one ``ppermute`` each, exactly as many as the busiest participant's
transfers (König): with p even, 2 up and 2 down in the steady state.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import xla_bridge  # no public API says whether a backend has started

from allreduce_jax import _comm, cost_model
from allreduce_jax._comm import AxisName
from allreduce_jax.registry import Algorithm, register

Combine = Callable[[jax.Array, jax.Array], jax.Array]

#: Chunk counts the model chooses among (powers of two, so buffers that divide by
#: 2·MAX_CHUNKS are never padded) and the smallest chunk it will cut.
MAX_CHUNKS = 32
MIN_CHUNK_BYTES = 4096

_NONE, _COMBINE, _REPLACE = 0, 1, 2


def btree(p: int, rank: int) -> tuple[int, int, int]:
  """NCCL's ``ncclGetBtree``: ``(parent, child0, child1)`` of ``rank`` (-1: none)."""
  bit = 1
  while bit < p and not bit & rank:
    bit <<= 1
  if rank == 0:
    return -1, (bit >> 1) if p > 1 else -1, -1
  up = (rank ^ bit) | (bit << 1)
  if up >= p:
    up = rank ^ bit
  lowbit = bit >> 1
  down0 = -1 if lowbit == 0 else rank - lowbit
  down1 = -1 if lowbit == 0 else rank + lowbit
  while down1 >= p:
    lowbit >>= 1
    down1 = -1 if lowbit == 0 else rank + lowbit
  return up, down0, down1


@dataclass(frozen=True)
class Tree:
  """One binary tree over ``range(p)``: ``parent[r]`` (-1 at the root), ``children[r]``,
  ``height[r]`` (leaves 0), ``depth[r]`` (root 0)."""

  parent: tuple[int, ...]
  children: tuple[tuple[int, ...], ...]
  height: tuple[int, ...]
  depth: tuple[int, ...]

  @property
  def root(self) -> int:
    return self.parent.index(-1)


def _tree(p: int, relabel: Callable[[int], int]) -> Tree:
  """A's shape with rank ``a`` of A placed on participant ``relabel(a)``."""
  parent, children = [-1] * p, [()] * p
  for a in range(p):
    up, d0, d1 = btree(p, a)
    r = relabel(a)
    parent[r] = -1 if up < 0 else relabel(up)
    children[r] = tuple(relabel(c) for c in (d0, d1) if c >= 0)
  depth = [0] * p
  order = [parent.index(-1)]
  for r in order:  # breadth-first from the root
    for c in children[r]:
      depth[c] = depth[r] + 1
      order.append(c)
  if len(order) != p:
    raise AssertionError(f"btree({p}) does not span every rank")
  height = [0] * p
  for r in reversed(order):
    height[r] = max((height[c] + 1 for c in children[r]), default=0)
  return Tree(tuple(parent), tuple(children), tuple(height), tuple(depth))


@functools.lru_cache(maxsize=64)
def double_tree(p: int) -> tuple[Tree, Tree]:
  """NCCL's ``ncclGetDtree``: tree A, and tree B = A mirrored (p even) or shifted by
  one rank (p odd)."""
  a = _tree(p, lambda r: r)
  b = _tree(p, (lambda r: p - 1 - r) if p % 2 == 0 else (lambda r: (r + 1) % p))
  return a, b


@dataclass(frozen=True)
class Transfer:
  """One chunk moving in one round: ``src`` sends buffer row ``row``; ``dst``
  combines it into (up) or overwrites (down) its own row ``row``."""

  src: int
  dst: int
  row: int
  mode: int


def _rounds(p: int, k: int) -> list[list[Transfer]]:
  """Every chunk transfer of the pipelined double tree, grouped by round.

  Buffer rows: tree A's chunks are rows 0..k-1, tree B's rows k..2k-1.
  """
  events: dict[int, list[Transfer]] = {}
  for t, tree in enumerate(double_tree(p)):
    top = tree.height[tree.root]
    for r in range(p):
      for j in range(k):
        row = t * k + j
        if tree.parent[r] >= 0:  # up: chunk j leaves r in round j + height
          events.setdefault(j + tree.height[r], []).append(
            Transfer(r, tree.parent[r], row, _COMBINE)
          )
        for c in tree.children[r]:  # down: finished chunk j, round j + H + depth
          events.setdefault(j + top + tree.depth[r], []).append(Transfer(r, c, row, _REPLACE))
  return [events.get(t, []) for t in range(max(events, default=-1) + 1)]


def _colour(transfers: list[Transfer]) -> list[list[Transfer]]:
  """Splits one round into partial permutations (each participant sends at most
  one and receives at most one chunk per class), using max-degree classes: a
  bipartite edge colouring by alternating-path flips (König's theorem)."""
  out_deg: dict[int, int] = {}
  in_deg: dict[int, int] = {}
  for e in transfers:
    out_deg[e.src] = out_deg.get(e.src, 0) + 1
    in_deg[e.dst] = in_deg.get(e.dst, 0) + 1
  colours = max([*out_deg.values(), *in_deg.values()], default=0)
  at_src: dict[int, dict[int, int]] = {}  # sender -> colour -> index of transfer
  at_dst: dict[int, dict[int, int]] = {}
  colour_of = [-1] * len(transfers)
  for i, e in enumerate(transfers):
    src_used, dst_used = at_src.setdefault(e.src, {}), at_dst.setdefault(e.dst, {})
    a = next(c for c in range(colours) if c not in src_used)
    b = next(c for c in range(colours) if c not in dst_used)
    if a in dst_used:
      # Flip the a/b path that starts at e.dst with its a-coloured transfer; it cannot
      # reach e.src, so afterwards a is free at both ends.
      path, node, side, want = [], e.dst, "dst", a
      while True:
        table = at_dst if side == "dst" else at_src
        j = table.get(node, {}).get(want)
        if j is None:
          break
        path.append(j)
        node = transfers[j].src if side == "dst" else transfers[j].dst
        side = "src" if side == "dst" else "dst"
        want = b if want == a else a
      for j in path:
        f = transfers[j]
        del at_src[f.src][colour_of[j]], at_dst[f.dst][colour_of[j]]
      for j in path:
        f = transfers[j]
        colour_of[j] = b if colour_of[j] == a else a
        at_src[f.src][colour_of[j]] = j
        at_dst[f.dst][colour_of[j]] = j
    colour_of[i] = a
    src_used[a] = i
    dst_used[a] = i
  classes: list[list[Transfer]] = [[] for _ in range(colours)]
  for i, c in enumerate(colour_of):
    classes[c].append(transfers[i])
  return classes


@functools.lru_cache(maxsize=64)
def plan(p: int, k: int) -> tuple[tuple[tuple[Transfer, ...], ...], ...]:
  """The ppermutes of the double tree with ``k`` chunks per tree:
  ``plan[round][i]`` is one partial permutation of chunk transfers, all going up
  (combined on arrival) or all going down (stored): the round's upward transfers
  coloured first, then its downward ones."""
  if p < 1 or k < 1:
    raise ValueError(f"plan needs p >= 1 and k >= 1, got p={p}, k={k}.")
  out = []
  for transfers in _rounds(p, k):
    up = [e for e in transfers if e.mode == _COMBINE]
    down = [e for e in transfers if e.mode == _REPLACE]
    out.append(tuple(tuple(c) for c in (*_colour(up), *_colour(down))))
  return tuple(out)


def degrees(p: int, k: int) -> dict[str, np.ndarray]:
  """Per round and participant (``int[rounds, p]``), computed from the tree shapes
  without building the transfers (cheap at thousands of participants):
  ``"up"``/``"down"``: the chunks moved up/down through its busier direction (max of
  sent and received); ``"port"``: the same for all transfers; ``"combined"``: the
  chunks it combines."""
  trees = double_tree(p)
  top = max(t.height[t.root] for t in trees)
  rounds = k + 2 * top - 1 if p > 1 else 0
  size = (rounds + k + 1) * p
  acc = {key: np.zeros(size, np.int64) for key in ("up_out", "up_in", "down_out", "down_in")}

  def add(key, start, who):  # +1 on rounds [start, start + k) of participant who
    acc[key] += np.bincount(start * p + who, minlength=size)
    acc[key] -= np.bincount((start + k) * p + who, minlength=size)

  for tree in trees:
    h_top = tree.height[tree.root]
    par = np.asarray(tree.parent)
    height, depth = np.asarray(tree.height), np.asarray(tree.depth)
    r = np.flatnonzero(par >= 0)
    add("up_out", height[r], r)  # the child sends chunk j in round j + height
    add("up_in", height[r], par[r])  # the parent receives and combines it
    add("down_out", h_top + depth[par[r]], par[r])  # the parent sends, round j + H + depth
    add("down_in", h_top + depth[par[r]], r)
  a = {key: np.cumsum(v.reshape(-1, p), axis=0)[:rounds] for key, v in acc.items()}
  return {
    "up": np.maximum(a["up_out"], a["up_in"]),
    "down": np.maximum(a["down_out"], a["down_in"]),
    "port": np.maximum(a["up_out"] + a["down_out"], a["up_in"] + a["down_in"]),
    "combined": a["up_in"],
  }


@functools.lru_cache(maxsize=256)
def _counts(p: int, k: int) -> tuple[int, int, int, int]:
  """(rounds, ppermutes, Σ busiest combines, most chunks one participant sends)."""
  d = degrees(p, k)
  sent = np.zeros(p, np.int64)
  for tree in double_tree(p):
    sent += np.asarray([int(tree.parent[r] >= 0) + len(tree.children[r]) for r in range(p)])
  return (
    int(d["port"].shape[0]),
    int(d["up"].max(axis=1).sum() + d["down"].max(axis=1).sum()),
    int(d["combined"].max(axis=1).sum()),
    int(sent.max()) * k,
  )


def cost(p: int, n_bytes: float, k: int) -> dict[str, float]:
  """Schedule counts for ``k`` chunks per tree (see ``cost_model``), in the flat
  model's convention (every (source, target) pair of a step on its own link, as for
  the bidirectional ring's two lanes).

  - steps: rounds = k + 2H - 1 (H = ⌈lg p⌉), each moving chunks of n/(2k) bytes;
  - beta_bytes: one chunk per round, (k + 2H - 1)·n/(2k) → n/2 (with one NIC per
    participant, ``topology.switch(1)``, the busiest one carries up to 4 chunks a
    round: → 2n, the ring's figure);
  - gamma_bytes: the most chunks one participant combines per round (2 in the
    steady state), summed: → n;
  - permutes: per round, as many ppermutes as the busiest participant's upward
    transfers plus as many as its downward ones;
  - max_sent_bytes: (up + down transfers) × n/(2k), summed over both trees (≤ 2n).
  """
  if p == 1:
    return dict(steps=0, beta_bytes=0.0, gamma_bytes=0.0, permutes=0, max_sent_bytes=0.0)
  rounds, permutes, comb, sent = _counts(p, k)
  c = n_bytes / (2 * k)
  return dict(
    steps=rounds,
    beta_bytes=float(rounds * c),
    gamma_bytes=float(comb * c),
    permutes=permutes,
    max_sent_bytes=float(sent * c),
  )


def _model_params():
  """The parameters ``algorithm="auto"`` would use now (``cost_model.current_params``),
  without starting a JAX backend just to price a schedule: before any backend runs
  (a pure model sweep) and outside ``use_params``, ``cost_model.DEFAULT_PARAMS``."""
  if cost_model.pinned_params() is not None or xla_bridge.backends_are_initialized():
    return cost_model.current_params()
  return cost_model.DEFAULT_PARAMS


def choose_chunks(p: int, n_bytes: float, params=None) -> int:
  """k minimizing α·steps + β·beta_bytes + γ·gamma_bytes over k = 1, 2, 4, ...,
  ``MAX_CHUNKS``, with chunks of at least ``MIN_CHUNK_BYTES``.

  ``params``: a ``cost_model.Params``/``FittedParams``; None: the ones ``auto`` uses
  (:func:`_model_params`), resolved for ``double_binary_tree`` (its own fitted entry
  if the fit has one, else the shared one).
  """
  if p <= 1:
    return 1
  q = cost_model.resolve(_model_params() if params is None else params, "double_binary_tree")
  best, best_t, k = 1, math.inf, 1
  while k <= MAX_CHUNKS and (k == 1 or n_bytes / (2 * k) >= MIN_CHUNK_BYTES):
    s = cost(p, n_bytes, k)
    t = q.alpha * s["steps"] + q.beta * s["beta_bytes"] + q.gamma * s["gamma_bytes"]
    if t < best_t:
      best, best_t = k, t
    k *= 2
  return best


def double_binary_tree_chunks(
  flat: jax.Array, axis_name: AxisName, combine: Combine, chunks: int | None = None
) -> jax.Array:
  """:func:`double_binary_tree` with an explicit chunk count (None: the model's)."""
  p, n = _comm.size(axis_name), flat.shape[0]
  k = chunks or choose_chunks(p, n * flat.dtype.itemsize)
  k = max(1, min(k, -(-n // 2)))  # at least one element per chunk
  i = _comm.index(axis_name)
  padded = _comm.pad_to_multiple(flat, 2 * k)  # T[2k*c]
  c = padded.shape[0] // (2 * k)
  # The chunks as separate arrays (A's k, then B's k): a step reads and writes only
  # the few rows its transfers touch, chosen by static candidate sets, which XLA:CPU
  # runs ~4x faster than dynamic row updates of one T[2k, c] buffer.
  rows = [padded[j * c : (j + 1) * c] for j in range(2 * k)]  # 2k x T[c]
  for rnd in plan(p, k):
    with _comm.concurrent():  # one round: its transfers are in flight together
      for step in rnd:
        out_row, in_row = np.full(p, -1, np.int32), np.full(p, -1, np.int32)
        for e in step:  # a participant may send one row and receive another
          out_row[e.src], in_row[e.dst] = e.row, e.row
        touched = sorted({e.row for e in step})
        sends, gets = jnp.asarray(out_row)[i], jnp.asarray(in_row)[i]
        payload = rows[touched[0]]  # T[c]
        for j in touched[1:]:
          payload = jnp.where(sends == j, rows[j], payload)
        recv = _comm.send(payload, axis_name, [(e.src, e.dst) for e in step])  # T[c]
        for j in touched:
          new = combine(rows[j], recv) if step[0].mode == _COMBINE else recv
          rows[j] = jnp.where(gets == j, new, rows[j])
  # Lossy wire: each tree's root kept its exact rows while sending them encoded; the
  # others hold the decoded rows, which settle leaves as they are.
  rows = [_comm.settle(r) for r in rows]
  return jnp.concatenate(rows)[:n]


def double_binary_tree(flat: jax.Array, axis_name: AxisName, combine: Combine) -> jax.Array:
  """Double binary tree all-reduce, pipelined in k chunks per tree (NCCL's "Tree").

  Tree A reduces the first half of the buffer to its root and broadcasts it back,
  tree B does the same with the second half, at the same time; each half is cut in
  k chunks so that a chunk climbs (or descends) one level per round while the next
  follows it. k is chosen at trace time, from the static size and p, as the
  argmin of this model over k = 1, 2, 4, ..., 32 (chunks ≥ 4 KiB), with the
  parameters ``auto`` uses; :func:`double_binary_tree_chunks` takes k explicitly.

  - steps (rounds): k + 2⌈lg p⌉ - 1, each moving chunks of n/(2k) bytes
  - ppermutes: per round, the busiest participant's upward transfers plus its
    downward ones (2 + 2 in the steady state for p even: it is interior in one tree,
    a leaf in the other)
  - bytes sent per participant: (1 + children) · n/2 per tree: at most 2n; through
    one NIC the busiest participant moves up to 4 chunks a round, ≈ 2n in all (the
    ring's 2(p-1)/p·n), against the binomial tree's 2⌈lg p⌉·n
  - time (flat model, each pair its own link): (k + 2⌈lg p⌉ - 1)(α + n/(2k)·β) + ≈nγ,
    minimal at k ≈ √((2⌈lg p⌉ - 1)·nβ/(2α))

  Args/Returns: as :func:`allreduce_jax._ring.ring`.

  References:
    Sanders, Speck & Träff, "Two-tree algorithms for full bandwidth broadcast,
    reduction and scan", Parallel Computing 35(12), 2009; Jeaugey, "Massively
    Scale Your Deep Learning Training with NCCL 2.4", NVIDIA blog, 2019.
  """
  return double_binary_tree_chunks(flat, axis_name, combine)


def double_binary_tree_messages(
  sizes: tuple[int, ...], n_bytes: float | None = None, chunks: int | None = None
) -> list[list[tuple[int, int, float]]]:
  """Message steps of :func:`double_binary_tree` on ``prod(sizes)`` participants, one
  per round (its ppermutes run concurrently), as ``(source, target, fraction of n,
  combined)``; each transfer is one chunk, 1/(2k) of n, combined on the way up. k:
  ``chunks``, else the model's choice for ``n_bytes``, else 1 (the choice at trace
  time for small buffers)."""
  p = math.prod(sizes)
  k = chunks or (choose_chunks(p, n_bytes) if n_bytes else 1)
  f = 1 / (2 * k)
  # A round's ppermutes run together, so a step is the round's transfers in any order:
  # no need for :func:`plan`'s colouring into permutations (90 % of the time at p=4096).
  return [[(e.src, e.dst, f, e.mode == _COMBINE) for e in rnd] for rnd in _rounds(p, k)]


def double_binary_tree_ppermutes(
  sizes: tuple[int, ...], n_bytes: float | None = None, chunks: int | None = None
) -> list[list[tuple[int, int, float, bool]]]:
  """:func:`double_binary_tree_messages` one ppermute per step, as
  :func:`double_binary_tree_chunks` sends them: each round's upward permutations of
  :func:`plan`, then its downward ones."""
  p = math.prod(sizes)
  k = chunks or (choose_chunks(p, n_bytes) if n_bytes else 1)
  f = 1 / (2 * k)
  return [
    [(e.src, e.dst, f, e.mode == _COMBINE) for e in perm] for rnd in plan(p, k) for perm in rnd
  ]


def double_binary_tree_schedule(
  p: int, n: float, inner: int | None = None, chunks: int | None = None
) -> cost_model.Schedule:
  """Pipelined double binary tree with k chunks per tree (k: ``chunks``, else the
  model's choice for (p, n), as the algorithm picks it at trace time).

  steps = k + 2⌈lg p⌉ - 1 rounds of n/(2k)-byte chunks; beta_bytes = steps·n/(2k)
  (each pair on its own link, the flat model's convention: → n/2; one NIC per
  participant would carry ≈ 2n); gamma_bytes sums the busiest participant's
  combines per round (→ n); permutes: per round the busiest participant's upward
  plus downward transfers; max_sent_bytes = (1 + children)·n/2 over both trees (≤ 2n).
  See :func:`cost`.
  """
  c = cost(p, n, chunks or choose_chunks(p, n))
  return cost_model.Schedule(
    c["steps"], c["beta_bytes"], c["gamma_bytes"], c["permutes"], c["max_sent_bytes"]
  )


def double_binary_tree_choices(p: int, n_bytes: float) -> dict[str, int]:
  """The chunk count :func:`double_binary_tree` traces with for ``n_bytes`` on ``p``
  participants under the cost parameters in effect (:func:`choose_chunks`)."""
  return {"chunks": choose_chunks(p, n_bytes)}


register(
  Algorithm(
    "double_binary_tree",
    double_binary_tree,
    schedule=double_binary_tree_schedule,
    messages=double_binary_tree_messages,
    ppermutes=double_binary_tree_ppermutes,
    choices=double_binary_tree_choices,
    summary="NCCL's two complementary binary trees, half the buffer each, pipelined",
  )
)
