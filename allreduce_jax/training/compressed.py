"""Sync arms whose all-reduce is compressed: a narrow wire format, PowerSGD or top-k.

Each arm is the ``sync`` arm (equal batches, the step ends when every worker is done,
plus the communication) with the gradient averaging moved into the optimizer: the
per-worker gradients go to ``optax.chain(comm, workload optimizer)``, ``comm`` one of

* ``all_reduce_gradients(axis, wire=...)``: the all-reduce in ``bf16`` or ``int8``
  (block-absmax, one f32 scale per 256 elements) on ``ring`` or ``two_shot``
  (:data:`WIRE_ARMS`);
* ``powersgd(axis, rank=r, error_feedback=...)``: two all-reduces of the P and Q
  factors per step;
* ``topk(axis, fraction=..., error_feedback=...)``: one ring all-gather of every
  worker's (value, index) pairs.

The optimizer state (error feedback, PowerSGD's warm-start Q) is one copy per worker,
like the optimizer's, and the replicas stay bitwise identical (checked every chunk).

Bytes (all workers, one step; ``N`` = the priced parameter count, ``p`` workers):

* wire: ``p × Algorithm.wire_bytes(p, wire, N) × N`` (the record's busiest sender in
  that format, scales included);
* PowerSGD: an all-reduce of ``Σ n_j·r + (uncompressed elements)`` float32 (P and the
  leaves DDP's rule leaves alone) and one of ``Σ m_j·r`` (Q), each priced by the
  algorithm's schedule as the sync all-reduce is: (n + m)·r·4 bytes per n×m matrix
  per step instead of n·m·4;
* top-k: ``p·(p − 1)·8K`` (each worker forwards the p − 1 others' K (value, index)
  pairs around the ring; K = Σ ceil(fraction·size) over the leaves).

PowerSGD's and top-k's counts come from the workload's parameter shapes
(:attr:`~.arms.Arm.bind`); a virtual ``model_params`` scales them by
``model_params / real count``. Time: the cost model's α-β-γ of each collective
(top-k's all-gather: ``(p − 1)(α + β·8K)``). Not priced: the codec's own compute
(quantizing, the PowerSGD matmuls, ``top_k``), which on this project's XLA:CPU is not
negligible (``experiments/compression/``); the arms' times are the network's side.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import optax

from allreduce_jax import ALGORITHMS, all_reduce_gradients, cost_model, devices
from allreduce_jax.compression import MIN_COMPRESSION_RATE, powersgd, topk
from allreduce_jax.training import models, sync
from allreduce_jax.training.arms import (
  Arm,
  Curve,
  Setup,
  Timeline,
  Workload,
  allreduce_bytes,
  link,
  model_bytes,
)
from allreduce_jax.training.families import sync_timeline, train_curve


@dataclass(frozen=True)
class Compression:
  """What a compressed arm sends.

  Attributes:
    kind: ``"exact"`` (``all_reduce_gradients`` with no wire: the sync arm through
      the optimizer route), ``"wire"``, ``"powersgd"`` or ``"topk"``.
    wire: the wire format of ``kind="wire"`` (``"bf16"``, ``"int8"``).
    algorithm: the all-reduce algorithm (None: the setup's ``algorithm``).
    rank: PowerSGD's rank r.
    fraction: top-k's share of each leaf's entries.
    error_feedback: keep and re-add what compression dropped (PowerSGD, top-k).
  """

  kind: str
  wire: str | None = None
  algorithm: str | None = None
  rank: int = 1
  fraction: float = 0.01
  error_feedback: bool = True

  def algorithm_for(self, setup: Setup) -> str:
    return self.algorithm or setup.algorithm

  def transform(self, axis, algorithm: str) -> optax.GradientTransformation:
    """The gradient averaging, chained before the workload's optimizer."""
    if self.kind == "exact":
      return all_reduce_gradients(axis, algorithm=algorithm)
    if self.kind == "wire":
      return all_reduce_gradients(axis, algorithm=algorithm, wire=self.wire)
    if self.kind == "powersgd":
      return powersgd(axis, rank=self.rank, algorithm=algorithm, error_feedback=self.error_feedback)
    if self.kind == "topk":
      return topk(axis, fraction=self.fraction, error_feedback=self.error_feedback)
    raise ValueError(f"kind={self.kind!r} is not one of exact, wire, powersgd, topk.")


def leaf_shapes(workload: Workload, seed: int = 0) -> list[tuple[int, ...]]:
  """The shapes of the workload model's parameter leaves (in tree order)."""
  _, params, _ = models.split(workload.make_model(seed))
  return [tuple(np.shape(a)) for a in jax.tree.leaves(params)]


def powersgd_matrix(shape: tuple[int, ...], rank: int) -> tuple[int, int] | None:
  """``(n, m)`` a leaf is compressed as by :func:`~allreduce_jax.powersgd` (first
  dimension × the rest), or None when DDP's rule (n + m)·r·2 ≥ n·m leaves it exact."""
  if len(shape) < 2:
    return None
  n, m = shape[0], math.prod(shape[1:])
  return None if (n + m) * rank * MIN_COMPRESSION_RATE >= n * m else (n, m)


def collectives(c: Compression, shapes: list[tuple[int, ...]]) -> list[tuple[str, int]]:
  """One step's collectives as ``(kind, float32 elements per worker)``: ``("all_reduce",
  n)`` or ``("all_gather", n)`` (n = the 32-bit words each worker contributes).

  Example:
    >>> collectives(Compression("powersgd", rank=1), [(64, 128), (128,), (128, 10), (10,)])
    [('all_reduce', 330), ('all_reduce', 138)]
    >>> collectives(Compression("topk", fraction=0.01), [(64, 128), (128,)])
    [('all_gather', 168)]
  """
  total = sum(math.prod(s) for s in shapes)
  if c.kind in ("exact", "wire"):
    return [("all_reduce", total)]
  if c.kind == "powersgd":
    first, second = 0, 0
    for s in shapes:
      m = powersgd_matrix(s, c.rank)
      if m is None:
        first += math.prod(s)
      else:
        first += m[0] * c.rank
        second += m[1] * c.rank
    return [("all_reduce", first), ("all_reduce", second)]
  if c.kind == "topk":
    k = sum(max(1, math.ceil(c.fraction * math.prod(s))) for s in shapes)
    return [("all_gather", 2 * k)]  # values' f32 bits and int32 indices
  raise ValueError(f"kind={c.kind!r} is not one of exact, wire, powersgd, topk.")


def step_comm(c: Compression, setup: Setup, shapes: list[tuple[int, ...]]) -> tuple[float, float]:
  """``(seconds, bytes all workers send)`` of one step's communication on ``setup``.

  ``shapes``' element counts are scaled to ``setup.model_params`` (a virtual size)."""
  p = setup.workers
  model_bytes(setup)  # a ValueError while model_params is 0 (the harness fills it in)
  if p <= 1:
    return 0.0, 0.0
  alg = c.algorithm_for(setup)
  inner = devices.inner_size(alg, p)
  q = link(setup)
  scale = setup.model_params / max(1, sum(math.prod(s) for s in shapes))
  seconds = sent = 0.0
  for kind, words in collectives(c, shapes):
    n = words * scale  # elements per worker at the priced size
    if kind == "all_gather":  # the ring all-gather of 32-bit words
      seconds += (p - 1) * (q.alpha + q.beta * 4.0 * n)
      sent += p * (p - 1) * 4.0 * n
      continue
    record = ALGORITHMS[alg]
    wire = c.wire if c.kind == "wire" else None
    ratio = record.wire_bytes(p, wire, max(1, int(n)), inner=inner) / record.wire_bytes(
      p, None, max(1, int(n)), inner=inner
    )
    nbytes = 4.0 * n * ratio  # the payload as the wire format carries it
    seconds += cost_model.predict_seconds(alg, p, nbytes, q, inner)
    sent += p * cost_model.schedule(alg, p, nbytes, inner).max_sent_bytes
  return seconds, sent


_compiled: dict[Any, Any] = {}


def run_compressed_curve(
  c: Compression, setup: Setup, workload: Workload, timeline: Timeline, seed: int
) -> Curve:
  """Synchronous training whose gradients are averaged by ``c``'s transformation,
  chained before the workload's optimizer at its sync learning rate."""
  n = setup.workers
  alg = c.algorithm_for(setup)
  graphdef, params, rest = models.split(workload.make_model(seed))
  lr = workload.sync_lr(n)
  key = ("compressed", c, workload.name, n, alg, lr)
  if key not in _compiled:
    mesh, axis = devices.mesh_for(alg, n)
    tx = optax.chain(c.transform(axis, alg), workload.tx(lr))
    chunk = sync.make_sync_chunk(graphdef, rest, tx, mesh, alg, axis=axis, tx_reduces=True)
    _compiled[key] = (mesh, axis, tx, chunk, sync.make_evaluator(graphdef, rest, workload.metric))
  steps = np.asarray(timeline.plan).shape[0]
  return train_curve(setup, workload, seed, (graphdef, params, rest), _compiled[key], alg, steps)


def _describe(c: Compression) -> str:
  alg = c.algorithm or "the setup's algorithm"
  ef = "with" if c.error_feedback else "without"
  return {
    "exact": f"all-reduce SGD through all_reduce_gradients ({alg}), exact",
    "wire": f"all-reduce SGD, the all-reduce in {c.wire} on the wire ({alg})",
    "powersgd": f"PowerSGD rank {c.rank}, {ef} error feedback (P and Q all-reduced, {alg})",
    "topk": f"top-k {c.fraction:.0%} of each leaf, {ef} error feedback (ring all-gather)",
  }[c.kind]


def compressed_arm(name: str, c: Compression, shapes: list[tuple[int, ...]] | None = None) -> Arm:
  """The sync arm ``name`` whose gradients are averaged by ``c``.

  ``shapes``: the parameter shapes it is priced for; None: PowerSGD and top-k arms are
  bound to each workload (:func:`~.arms.bound`) before they are scheduled or priced, a
  wire-format arm needs only the setup's ``model_params`` (one all-reduce of them).
  """
  by_shape = c.kind in ("powersgd", "topk")

  def need(setup: Setup) -> list[tuple[int, ...]]:
    if shapes is not None:
      return shapes
    if not by_shape:
      return [(max(1, setup.model_params),)]
    raise ValueError(f"arm {name}: its bytes depend on the model's shapes; bind it first.")

  def schedule(setup: Setup, seed: int) -> Timeline:
    ar, sent = step_comm(c, setup, need(setup))
    tl = sync_timeline(setup, seed, comm=(ar, sent))
    dense = allreduce_bytes(setup)  # sync's exact all-reduce of the parameters
    info = {
      **tl.info,
      "compression": c.kind,
      "wire": c.wire,
      "compression_algorithm": c.algorithm_for(setup),
      "rank": c.rank if c.kind == "powersgd" else None,
      "fraction": c.fraction if c.kind == "topk" else None,
      "error_feedback": c.error_feedback if c.kind in ("powersgd", "topk") else None,
      "bytes_vs_sync": sent / dense if dense else None,
    }
    return dataclasses.replace(tl, info=info)

  def per_sample(setup: Setup) -> float:
    return step_comm(c, setup, need(setup))[1] / (setup.workers * setup.batch_per_worker)

  def bind(workload: Workload) -> Arm:
    return compressed_arm(name, c, leaf_shapes(workload))

  return Arm(
    name,
    "compressed",
    schedule,
    lambda setup: step_comm(c, setup, need(setup))[0],
    per_sample,
    lambda setup, wl, tl, seed: run_compressed_curve(c, setup, wl, tl, seed),
    _describe(c),
    bind=bind if shapes is None and by_shape else None,
  )


#: The compressed arms Table C knows: name -> what it sends.
COMPRESSED_ARMS: dict[str, Compression] = {
  "sync_bf16": Compression("wire", wire="bf16"),
  "sync_int8": Compression("wire", wire="int8", algorithm="ring"),
  "sync_int8_two_shot": Compression("wire", wire="int8", algorithm="two_shot"),
  "powersgd_r1": Compression("powersgd", rank=1),
  "powersgd_r4": Compression("powersgd", rank=4),
  "powersgd_r4_noef": Compression("powersgd", rank=4, error_feedback=False),
  "topk1": Compression("topk", fraction=0.01),
  "topk1_noef": Compression("topk", fraction=0.01, error_feedback=False),
}

__all__ = [
  "COMPRESSED_ARMS",
  "Compression",
  "collectives",
  "compressed_arm",
  "leaf_shapes",
  "powersgd_matrix",
  "run_compressed_curve",
  "step_comm",
]
