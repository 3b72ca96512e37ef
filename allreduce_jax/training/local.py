"""Periodic averaging: Local SGD(H) and DiLoCo(H) over the hand-written all-reduce.

Each of the ``p`` participants of the mesh axis keeps its own parameters and
optimizer state (a leading participant axis, sharded, as in :mod:`.sync`) and takes
``H`` optimizer steps on its own batches without communicating. Then, once per
*round*, the participants average their parameters with one
:func:`allreduce_jax.all_reduce_tree` (any hand-written algorithm; ring by default):

* **Local SGD(H)** (Stich 2019): ``θ_i <- mean_j θ_j``. The inner optimizer's state
  (e.g. momentum) stays local. With ``H = 1`` and plain SGD this is synchronous
  data-parallel SGD: ``mean_j(θ - η g_j) = θ - η mean_j g_j`` (up to rounding).
* **DiLoCo(H)** (Douillard et al. 2023): inner AdamW; every participant also keeps
  the global parameters ``θ`` and an *outer* optimizer (Nesterov SGD, lr 0.7,
  momentum 0.9 in the paper) applied to the averaged pseudo-gradient
  ``Δ = θ - mean_j θ_j``: ``θ <- outer(θ, Δ)``, then ``θ_i <- θ``. The outer state is
  updated from the same all-reduced ``Δ`` everywhere, so it stays replicated.

Communication: one all-reduce of the parameters per round, i.e. ``1/H`` of
synchronous SGD's per-step gradient all-reduce (same size), nothing else.

A chunk of rounds runs as one ``lax.scan`` (rounds) of a ``lax.scan`` (H local steps)
inside one ``jax.shard_map``: one compiled program per (mesh, H, chunk length).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import ALGORITHMS, _comm, all_reduce_tree, cost_model, devices
from allreduce_jax.training import arms, models
from allreduce_jax.training import data as data_mod
from allreduce_jax.training.figures import workload_panels
from allreduce_jax.training.sync import (
  concat_losses,
  first_replica,
  participants,
  put_train_set,
  replicas_identical,
  replicate,
)

#: DiLoCo's outer optimizer (Douillard et al. 2023): Nesterov SGD, lr 0.7, momentum 0.9.
DILOCO_OUTER_LR = 0.7
DILOCO_OUTER_MOMENTUM = 0.9


def diloco_outer(
  learning_rate: float = DILOCO_OUTER_LR, momentum: float = DILOCO_OUTER_MOMENTUM
) -> optax.GradientTransformation:
  """DiLoCo's outer optimizer: ``optax.sgd(lr, momentum, nesterov=True)``."""
  return optax.sgd(learning_rate, momentum=momentum, nesterov=True)


def make_local_chunk(
  graphdef: Any,
  rest: Any,
  inner_tx: optax.GradientTransformation,
  mesh: jax.sharding.Mesh,
  outer_tx: optax.GradientTransformation | None = None,
  algorithm: str = "ring",
  axis: str | tuple[str, ...] = "data",
  bucket_bytes: int | None = None,
) -> Callable:
  """Builds the jitted run of a chunk of rounds of Local SGD (``outer_tx=None``) or DiLoCo.

  Per round and participant ``i``: ``H`` steps ``θ_i <- θ_i + inner(∇ loss(θ_i;
  batch))``; then ``m = all_reduce_tree(θ_i, op="mean")``; then Local SGD sets
  ``θ = θ_i = m``, DiLoCo sets ``θ <- θ + outer(θ - m)`` and ``θ_i = θ``.

  Args:
    graphdef, rest: the model (from :func:`models.split`).
    inner_tx: the per-participant optimizer (state kept local across rounds).
    mesh: a mesh with axis ``axis``.
    outer_tx: DiLoCo's outer optimizer (:func:`diloco_outer`); ``None``: Local SGD.
    algorithm: the all-reduce (a key of ``ALGORITHMS``).
    axis: the data-parallel mesh axis (or tuple of axes).
    bucket_bytes: passed to ``all_reduce_tree``.

  Returns:
    ``chunk(state, x_all, y_all, idx) -> (state, losses)``: ``state = (θ_i,
    inner_state, θ, outer_state)``, every leaf ``T[p, ...]`` sharded over ``axis``
    (:func:`init_state`); ``idx``: i32[rounds, H, p * B] sharded on its last axis
    (participant ``i`` reads columns ``i*B:(i+1)*B``); ``losses``: f32[p, rounds * H],
    each participant's own training loss at each local step.
  """
  if algorithm not in ALGORITHMS:
    raise ValueError(
      f"algorithm={algorithm!r} is not supported; expected one of {sorted(ALGORITHMS)}."
    )

  def per_device(state, x_all, y_all, idx):
    w, s, gw, gs = jax.tree.map(lambda a: a[0], state)  # drop the participant axis

    def local_step(carry, ib):  # ib: i32[B]
      w, s = carry
      xb, yb = x_all[ib], y_all[ib]
      loss, g = jax.value_and_grad(lambda q: models.loss_fn(graphdef, q, rest, xb, yb))(w)
      updates, s = inner_tx.update(g, s, w)
      return (optax.apply_updates(w, updates), s), loss

    def round_(carry, ib_round):  # ib_round: i32[H, B]
      w, s, gw, gs = carry
      (w, s), losses = lax.scan(local_step, (w, s), ib_round)
      mean = all_reduce_tree(w, axis, op="mean", algorithm=algorithm, bucket_bytes=bucket_bytes)
      # Typed shard_map: keep the carry "varying" whatever the algorithm returns.
      mean = jax.tree.map(lambda a: _comm.make_varying(a, axis), mean)
      if outer_tx is None:
        gw = mean
      else:
        delta = jax.tree.map(lambda a, b: a - b, gw, mean)  # the outer pseudo-gradient
        updates, gs = outer_tx.update(delta, gs, gw)
        gw = optax.apply_updates(gw, updates)
      return (gw, s, gw, gs), losses

    (w, s, gw, gs), losses = lax.scan(round_, (w, s, gw, gs), idx)
    out = jax.tree.map(lambda a: a[None], (w, s, gw, gs))
    return out, losses.reshape(1, -1)

  fn = jax.shard_map(
    per_device,
    mesh=mesh,
    in_specs=(P(axis), P(), P(), P(None, None, axis)),
    out_specs=(P(axis), P(axis)),
  )
  return jax.jit(fn)


def init_state(
  params: Any,
  inner_tx: optax.GradientTransformation,
  outer_tx: optax.GradientTransformation | None,
  mesh: jax.sharding.Mesh,
  axis: str | tuple[str, ...] = "data",
) -> tuple:
  """``(θ_i, inner_state, θ, outer_state)``, each replicated once per participant."""
  outer_state = outer_tx.init(params) if outer_tx is not None else ()
  return replicate((params, inner_tx.init(params), params, outer_state), mesh, axis)


def make_metrics(graphdef: Any, rest: Any) -> Callable[..., tuple[float, float]]:
  """``metrics(params, x, y) -> (mean loss, accuracy)`` as floats, jitted."""
  fn = jax.jit(lambda w, x, y: models.metrics(graphdef, w, rest, x, y))

  def metrics(params, x, y) -> tuple[float, float]:
    loss, acc = fn(params, jnp.asarray(x), jnp.asarray(y))
    return float(loss), float(acc)

  return metrics


@dataclass(frozen=True)
class PeriodicResult:
  """What a Local SGD / DiLoCo / gossip run produced.

  ``losses``: f32[steps], the participants' mean training loss per local step;
  after ``eval_steps[k]`` local steps (0 = initial) the evaluated model had test
  loss ``test_loss[k]`` and accuracy ``test_acc[k]``; ``rounds``: communication
  rounds (all-reduces or neighbour exchanges); ``params``: the final evaluated model.
  ``consensus``: mean squared distance of the participants' parameters to their
  mean at each evaluation (0 right after an averaging round).
  """

  losses: np.ndarray
  eval_steps: list[int]
  test_loss: list[float]
  test_acc: list[float]
  rounds: int
  params: Any
  consensus: list[float] = field(default_factory=list)

  @property
  def final_test_acc(self) -> float:
    return self.test_acc[-1]

  @property
  def final_test_loss(self) -> float:
    return self.test_loss[-1]

  @property
  def diverged(self) -> bool:
    return bool(not np.isfinite(self.losses).all())


def train_local(
  graphdef: Any,
  params: Any,
  rest: Any,
  inner_tx: optax.GradientTransformation,
  data,
  idx: np.ndarray,
  *,
  mesh: jax.sharding.Mesh,
  H: int,
  outer_tx: optax.GradientTransformation | None = None,
  algorithm: str = "ring",
  rounds_per_eval: int = 1,
  axis: str | tuple[str, ...] = "data",
  bucket_bytes: int | None = None,
  chunk_fn: Callable | None = None,
  metrics: Callable | None = None,
) -> PeriodicResult:
  """Trains with Local SGD(H) (``outer_tx=None``) or DiLoCo(H) on the batches ``idx``.

  Args:
    graphdef, params, rest: the model (from :func:`models.split`).
    inner_tx: the per-participant optimizer.
    data: a dataset with ``x_train, y_train, x_test, y_test`` (digits or text).
    idx: i32[steps, p * B] global batches, ``steps`` a multiple of ``H``
      (participant ``i`` takes block ``i`` of each row, as in :func:`sync.train_sync`).
    mesh: the data-parallel mesh.
    H: local steps per round (>= 1).
    outer_tx: DiLoCo's outer optimizer, or ``None`` for Local SGD.
    algorithm: the all-reduce algorithm.
    rounds_per_eval: rounds per compiled chunk; the averaged model is evaluated
      after each chunk.
    axis, bucket_bytes: as in :func:`make_local_chunk`.
    chunk_fn: a prebuilt :func:`make_local_chunk` (reused across runs: compiled once).
    metrics: a prebuilt :func:`make_metrics`.

  Returns:
    A :class:`PeriodicResult` (``params``: the global parameters, participant 0's copy).

  Raises:
    ValueError: malformed ``idx``, ``H`` or ``rounds_per_eval``.
    RuntimeError: the participants' global parameters stopped being identical.
  """
  p = participants(mesh, axis)
  idx = np.asarray(idx, np.int32)
  if H < 1:
    raise ValueError(f"H must be >= 1, got {H}.")
  if idx.ndim != 2 or idx.shape[1] % p or idx.shape[0] % H:
    raise ValueError(
      f"idx must be i32[steps, p * B] with p={p} and steps a multiple of H={H};"
      f" got shape {idx.shape}."
    )
  if rounds_per_eval < 1:
    raise ValueError(f"rounds_per_eval must be >= 1, got {rounds_per_eval}.")
  rounds = idx.shape[0] // H
  chunk = chunk_fn or make_local_chunk(
    graphdef, rest, inner_tx, mesh, outer_tx, algorithm, axis, bucket_bytes
  )
  metrics = metrics or make_metrics(graphdef, rest)
  col = NamedSharding(mesh, P(None, None, axis))
  x_all, y_all = put_train_set(data, mesh)
  state = init_state(params, inner_tx, outer_tx, mesh, axis)
  loss0, acc0 = metrics(params, data.x_test, data.y_test)
  eval_steps, test_loss, test_acc, losses = [0], [loss0], [acc0], []
  idx3 = idx.reshape(rounds, H, idx.shape[1])
  for start in range(0, rounds, rounds_per_eval):
    stop = min(start + rounds_per_eval, rounds)
    ib = devices.put_host(idx3[start:stop], col)
    state, chunk_losses = chunk(state, x_all, y_all, ib)
    losses.append(devices.fetch(chunk_losses).mean(axis=0))
    eval_steps.append(stop * H)
    global_w = first_replica(state[2])
    loss, acc = metrics(global_w, data.x_test, data.y_test)
    test_loss.append(loss)
    test_acc.append(acc)
  if not replicas_identical(state[2]):
    raise RuntimeError("participants' global parameters differ after averaging.")
  return PeriodicResult(
    losses=concat_losses(losses),
    eval_steps=eval_steps,
    test_loss=test_loss,
    test_acc=test_acc,
    rounds=rounds,
    params=first_replica(state[2]),
  )


def allreduce_bytes_per_participant(algorithm: str, p: int, nbytes: int) -> float:
  """Bytes one participant sends in one all-reduce of ``nbytes`` (from the cost model's
  schedule: ``2(p-1)/p · n`` for the ring).

  Example:
    >>> allreduce_bytes_per_participant("ring", 4, 4096)
    6144.0
  """
  if p <= 1:
    return 0.0

  return float(cost_model.schedule(algorithm, p, float(nbytes)).max_sent_bytes)


# ------------------------------------------------------------------ arms (training.arms interface)

#: DiLoCo's inner AdamW learning rate when the workload's own optimizer is not Adam-like.
DILOCO_INNER_LR = 3e-3


def local_timeline(setup, seed: int, H: int, comm_s: float, bytes_per_round: float):
  """When each inner step of a periodic-averaging arm ends, in simulated seconds.

  Within a round the workers do not wait for each other: worker ``i`` finishes its
  ``k``-th local step of round ``r`` at ``start_r + Σ_{j<=k} c_ij`` (its own compute
  times, the harness's straggler model); update ``u`` (step ``k`` of round ``r``
  done by all N) is at the latest of those, and the round's last update adds the
  communication ``comm_s`` (one all-reduce, or any other exchange). The next round
  starts when it ends.

  Args:
    setup: the harness's :class:`~allreduce_jax.training.arms.Setup`.
    seed: the run's seed (compute times drawn as for every other arm).
    H: local steps per round; updates = ``(gradients // N // H) * H``.
    comm_s: seconds of the averaging at the end of each round.
    bytes_per_round: bytes all workers send per round.

  Returns:
    A :class:`~allreduce_jax.training.arms.Timeline` (plan: ``H``).
  """
  rounds = arms.sync_rounds(setup) // H
  if rounds < 1:
    raise ValueError(
      f"H={H} local steps do not fit the budget of {arms.sync_rounds(setup)} steps per worker."
    )
  U = rounds * H
  c = arms.compute_times(setup, seed).rows(U).reshape(rounds, H, setup.workers)  # f64[R, H, N]
  within = np.cumsum(c, axis=1).max(axis=2)  # f64[R, H]: all N done with local step k
  round_s = within[:, -1] + comm_s
  start = np.concatenate([[0.0], np.cumsum(round_s)[:-1]])
  t = start[:, None] + within
  t[:, -1] += comm_s
  return arms.Timeline(
    time=t.reshape(-1),
    gradients=np.arange(1, U + 1) * setup.workers,
    samples=float(setup.workers * setup.batch_per_worker),
    bytes_sent=rounds * bytes_per_round,
    comm_s=rounds * comm_s,
    plan=H,
    info={"H": H, "rounds": rounds, "round_comm_s": comm_s},
  )


_compiled: dict[Any, Any] = {}


def run_local_curve(setup, workload, timeline, seed: int, outer: bool):
  """Trains Local SGD (``outer=False``) or DiLoCo along ``timeline`` (plan = H) on the
  emulated devices; the global model is evaluated every ``max(1, eval_every // H)`` rounds."""

  n, d, H = setup.workers, workload.data, int(timeline.plan)
  U = len(timeline.time)
  graphdef, params, rest = models.split(workload.make_model(seed))
  if outer:
    lr = workload.lr if workload.optimizer in ("adam", "adamw") else DILOCO_INNER_LR
    inner_name = "adamw"
  else:
    lr, inner_name = workload.sync_lr(n), workload.optimizer
  key = ("local", workload.name, n, setup.algorithm, H, outer, inner_name, lr)
  if key not in _compiled:
    mesh, axis = devices.mesh_for(setup.algorithm, n)
    inner = models.make_optimizer(inner_name, lr, workload.momentum)
    outer_tx = diloco_outer() if outer else None
    chunk = make_local_chunk(graphdef, rest, inner, mesh, outer_tx, setup.algorithm, axis)
    _compiled[key] = (mesh, axis, inner, outer_tx, chunk, make_metrics(graphdef, rest))
  mesh, axis, inner, outer_tx, chunk, metrics = _compiled[key]
  idx = data_mod.batch_indices(d.n_train, n * setup.batch_per_worker, U, 1000 + seed)
  res = train_local(
    graphdef,
    params,
    rest,
    inner,
    d,
    idx,
    mesh=mesh,
    H=H,
    outer_tx=outer_tx,
    algorithm=setup.algorithm,
    rounds_per_eval=max(1, setup.eval_every // H),
    axis=axis,
    chunk_fn=chunk,
    metrics=metrics,
  )
  return arms.periodic_curve(res, workload, H, inner_optimizer=inner_name, inner_lr=lr)


def _periodic_arm(name: str, H: int, outer: bool, summary: str):
  """An arm that all-reduces the parameters once every ``H`` steps (Local SGD or DiLoCo)."""
  return arms.Arm(
    name,
    "local",
    lambda setup, seed: local_timeline(
      setup, seed, H, arms.allreduce_seconds(setup), arms.allreduce_bytes(setup)
    ),
    arms.allreduce_seconds,
    lambda setup: arms.allreduce_bytes(setup) / (H * setup.workers * setup.batch_per_worker),
    lambda setup, wl, tl, seed: run_local_curve(setup, wl, tl, seed, outer=outer),
    summary,
  )


def local_arm(H: int):
  """Local SGD(H): H local steps with the workload's optimizer at its sync learning
  rate, then one all-reduce (mean) of the parameters."""
  return _periodic_arm(
    f"local_sgd_h{H}",
    H,
    False,
    f"Local SGD: {H} local steps, then one all-reduce of the parameters",
  )


def diloco_arm(H: int):
  """DiLoCo(H): H inner AdamW steps, then one all-reduce of the parameters and an outer
  Nesterov step (lr 0.7, momentum 0.9) on the pseudo-gradient."""
  return _periodic_arm(
    f"diloco_h{H}",
    H,
    True,
    f"DiLoCo: {H} inner AdamW steps, outer Nesterov SGD (lr {DILOCO_OUTER_LR},"
    f" momentum {DILOCO_OUTER_MOMENTUM}) on the averaged pseudo-gradient",
  )


# ------------------------------------------------------------------ figure


def bytes_figure(rows: list[dict[str, Any]]):
  """Final test metric vs bytes communicated per training sample (log x), one panel per
  workload, one point per arm: the median over seeds, bars from the lowest to the
  highest seed. Rows are :func:`arms.run_arm` rows (Table C's)."""
  markers = {"sync": "o", "ps": "s", "local": "^", "gossip": "D"}
  fig, panels = workload_panels(rows)
  for ax, rs_w, by_arm in panels:
    for arm, rs in by_arm.items():
      m = np.asarray([r["final_metric"] for r in rs], np.float64)
      x = float(np.median([r["bytes_per_sample"] for r in rs]))
      med = float(np.median(m))
      ax.errorbar(
        [x],
        [med],
        yerr=[[med - m.min()], [m.max() - med]],
        fmt=markers.get(rs[0]["family"], "o"),
        capsize=3,
        label=arm,
      )
    ax.set_xscale("log")
    ax.set_xlabel("bytes sent per training sample (all workers)")
    ax.set_ylabel(f"final test {rs_w[0]['metric']} (median, min–max)")
    ax.grid(True, alpha=0.3, which="both")
  panels[-1][0].legend(fontsize=7)
  fig.tight_layout()
  return fig
