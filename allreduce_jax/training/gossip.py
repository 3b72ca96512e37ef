"""Decentralized gossip SGD (D-PSGD, Lian et al. 2017) over a ring, executed for real.

Each of the ``p`` participants keeps its own parameters ``θ_i`` (a leading
participant axis, sharded, as in :mod:`.sync`); there is no all-reduce and no
server. Per step, every participant computes its gradient at its own ``θ_i``,
exchanges its parameters with ring neighbours through ``lax.ppermute`` (the
parameters are raveled into one flat buffer, so one exchange is one
``collective-permute``), and applies::

  θ_i <- Σ_j W_ij θ_j + optimizer(∇ loss(θ_i; batch_i))

with a doubly stochastic mixing matrix ``W`` supported on ring edges:

* ``"pairs"`` (default): one neighbour exchange per step. Even steps pair
  ``(0,1), (2,3), ...``, odd steps pair ``(1,2), (3,4), ..., (p-1,0)``; partners
  average, ``W = (I + Π_t)/2`` with ``Π_t`` the pairing (symmetric). One ``ppermute``
  per step: each participant sends ``n`` bytes (the parameters). Needs even ``p``.
* ``"ring"``: both neighbours every step, ``θ_i <- (θ_{i-1} + θ_i + θ_{i+1})/3``: two
  ``ppermute`` per step, ``2n`` bytes per participant.

Compare the ring all-reduce of synchronous SGD: ``2(p-1)/p · n`` bytes per
participant per step and ``2(p-1)`` sequential messages; gossip sends ``n`` (or
``2n``) in one message, but the participants only approach consensus.

A chunk of steps runs as one ``lax.scan`` inside one ``jax.shard_map`` (the scan
body holds two steps, an even and an odd one, for ``"pairs"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import devices, hlo
from allreduce_jax.training import arms, models
from allreduce_jax.training import data as data_mod
from allreduce_jax.training.data import load_digits
from allreduce_jax.training.local import PeriodicResult, make_metrics
from allreduce_jax.training.sync import concat_losses, participants, put_train_set, replicate

#: Mixing schemes: one neighbour per step (``pairs``) or both ring neighbours (``ring``).
MIXINGS = ("pairs", "ring")


def pairings(p: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
  """The two alternating matchings of a ring of even ``p`` as ``(source, target)`` pairs.

  Example:
    >>> pairings(4)
    ([(0, 1), (1, 0), (2, 3), (3, 2)], [(0, 3), (1, 2), (2, 1), (3, 0)])
  """
  if p < 2 or p % 2:
    raise ValueError(f"mixing='pairs' needs an even number of participants >= 2, got {p}.")
  even = [(i, i ^ 1) for i in range(p)]
  odd = [(i, (i + 1) % p if i % 2 else (i - 1) % p) for i in range(p)]
  return even, odd


def exchanges_per_step(mixing: str) -> int:
  """``collective-permute`` ops (each of the full parameter buffer) per step."""
  if mixing not in MIXINGS:
    raise ValueError(f"mixing={mixing!r} is not supported; expected one of {MIXINGS}.")
  return 1 if mixing == "pairs" else 2


def mixing_matrix(p: int, mixing: str = "pairs", step: int = 0) -> np.ndarray:
  """``W`` (f64[p, p]) of step ``step``: doubly stochastic, nonzero on ring edges only.

  Example:
    >>> mixing_matrix(4, "ring")[0].tolist()
    [0.3333333333333333, 0.3333333333333333, 0.0, 0.3333333333333333]
  """
  w = np.zeros((p, p))
  if mixing == "pairs":
    for src, dst in pairings(p)[step % 2]:
      w[dst, dst] = 0.5
      w[dst, src] += 0.5
  elif mixing == "ring":
    for i in range(p):
      for j in (i - 1, i, i + 1):
        w[i, j % p] += 1 / 3
  else:
    raise ValueError(f"mixing={mixing!r} is not supported; expected one of {MIXINGS}.")
  return w


def make_gossip_chunk(
  graphdef: Any,
  rest: Any,
  tx: optax.GradientTransformation,
  mesh: jax.sharding.Mesh,
  mixing: str = "pairs",
  axis: str = "data",
) -> Callable:
  """Builds the jitted D-PSGD run of a chunk of steps.

  Args:
    graphdef, rest: the model (from :func:`models.split`).
    tx: each participant's optimizer (its state stays local).
    mesh: a mesh with the single axis ``axis``.
    mixing: one of :data:`MIXINGS`.
    axis: the mesh axis (one name: ``ppermute`` numbers participants along it).

  Returns:
    ``chunk(state, x_all, y_all, idx) -> (state, losses)``: ``state = (θ_i,
    opt_state)`` with leaves ``T[p, ...]`` sharded over ``axis``; ``idx``:
    i32[steps, p * B] sharded on its last axis (``steps`` even for ``"pairs"``);
    ``losses``: f32[p, steps], each participant's own training loss.
  """
  p = participants(mesh, axis)
  exchanges_per_step(mixing)  # validates the name
  if mixing == "pairs":
    perms = pairings(p)
  else:  # from the left neighbour, from the right neighbour
    perms = ([(i, (i + 1) % p) for i in range(p)], [(i, (i - 1) % p) for i in range(p)])

  def one_step(w, s, ib, x_all, y_all, phase: int):
    xb, yb = x_all[ib], y_all[ib]
    loss, g = jax.value_and_grad(lambda q: models.loss_fn(graphdef, q, rest, xb, yb))(w)
    flat, unravel = ravel_pytree(w)
    if p == 1:
      mixed = flat
    elif mixing == "pairs":
      mixed = 0.5 * (flat + lax.ppermute(flat, axis, perms[phase]))
    else:
      left, right = lax.ppermute(flat, axis, perms[0]), lax.ppermute(flat, axis, perms[1])
      mixed = (left + flat + right) / 3.0
    updates, s = tx.update(g, s, w)
    return optax.apply_updates(unravel(mixed), updates), s, loss

  def per_device(state, x_all, y_all, idx):
    w, s = jax.tree.map(lambda a: a[0], state)
    if mixing == "pairs":

      def body(carry, ib2):  # ib2: i32[2, B]: an even step, then an odd one
        w, s = carry
        w, s, l0 = one_step(w, s, ib2[0], x_all, y_all, 0)
        w, s, l1 = one_step(w, s, ib2[1], x_all, y_all, 1)
        return (w, s), jnp.stack([l0, l1])

      (w, s), losses = lax.scan(body, (w, s), idx.reshape(-1, 2, idx.shape[-1]))
    else:

      def body(carry, ib):
        w, s = carry
        w, s, loss = one_step(w, s, ib, x_all, y_all, 0)
        return (w, s), loss

      (w, s), losses = lax.scan(body, (w, s), idx)
    return jax.tree.map(lambda a: a[None], (w, s)), losses.reshape(1, -1)

  fn = jax.shard_map(
    per_device,
    mesh=mesh,
    in_specs=(P(axis), P(), P(), P(None, axis)),
    out_specs=(P(axis), P(axis)),
  )
  return jax.jit(fn)


def bytes_per_step(nbytes: int, mixing: str = "pairs", p: int = 2) -> int:
  """Bytes one participant sends per gossip step: ``n`` (pairs) or ``2n`` (ring); 0 if p = 1."""
  return 0 if p <= 1 else exchanges_per_step(mixing) * int(nbytes)


def train_gossip(
  graphdef: Any,
  params: Any,
  rest: Any,
  tx: optax.GradientTransformation,
  data: Any,
  idx: np.ndarray,
  *,
  mesh: jax.sharding.Mesh,
  mixing: str = "pairs",
  eval_every: int = 50,
  axis: str = "data",
  chunk_fn: Callable | None = None,
  metrics: Callable | None = None,
) -> PeriodicResult:
  """Trains with D-PSGD on the batches ``idx`` (i32[steps, p * B]).

  The model evaluated (and returned) after each chunk of ``eval_every`` steps is
  the participants' average (computed on the host: a measurement, not part of the
  algorithm); ``consensus`` records the mean squared distance to it.

  Args:
    graphdef, params, rest, tx, data, idx, mesh: as in :func:`local.train_local`.
    mixing: one of :data:`MIXINGS`.
    eval_every: steps per compiled chunk (even for ``"pairs"``).
    axis: the mesh axis.
    chunk_fn, metrics: prebuilt :func:`make_gossip_chunk` / :func:`local.make_metrics`.

  Returns:
    A :class:`~allreduce_jax.training.local.PeriodicResult` (``rounds`` = steps: one
    exchange per step).
  """
  p = participants(mesh, axis)
  idx = np.asarray(idx, np.int32)
  if idx.ndim != 2 or idx.shape[1] % p:
    raise ValueError(f"idx must be i32[steps, p * B] with p={p}; got shape {idx.shape}.")
  steps = idx.shape[0]
  if eval_every < 1 or (mixing == "pairs" and (eval_every % 2 or steps % 2)):
    raise ValueError(
      f"eval_every={eval_every} and steps={steps} must be >= 1 (and even for mixing='pairs')."
    )
  chunk = chunk_fn or make_gossip_chunk(graphdef, rest, tx, mesh, mixing, axis)
  metrics = metrics or make_metrics(graphdef, rest)
  col = NamedSharding(mesh, P(None, axis))
  x_all, y_all = put_train_set(data, mesh)
  state = replicate((params, tx.init(params)), mesh, axis)
  loss0, acc0 = metrics(params, data.x_test, data.y_test)
  eval_steps, test_loss, test_acc, consensus, losses = [0], [loss0], [acc0], [0.0], []
  avg = params
  for start in range(0, steps, eval_every):
    stop = min(start + eval_every, steps)
    ib = devices.put_host(idx[start:stop], col)
    state, chunk_losses = chunk(state, x_all, y_all, ib)
    losses.append(devices.fetch(chunk_losses).mean(axis=0))
    stacked = jax.tree.map(devices.fetch, state[0])
    avg = jax.tree.map(lambda a: a.mean(axis=0), stacked)
    consensus.append(
      float(
        sum(((a - m) ** 2).sum() for a, m in zip(jax.tree.leaves(stacked), jax.tree.leaves(avg)))
      )
      / p
    )
    loss, acc = metrics(avg, data.x_test, data.y_test)
    eval_steps.append(stop)
    test_loss.append(loss)
    test_acc.append(acc)
  return PeriodicResult(
    losses=concat_losses(losses),
    eval_steps=eval_steps,
    test_loss=test_loss,
    test_acc=test_acc,
    rounds=steps,
    params=avg,
    consensus=consensus,
  )


# ------------------------------------------------------------------ arms (training.arms interface)


def gossip_timeline(setup, seed: int, mixing: str = "pairs"):
  """When each gossip step ends, in simulated seconds.

  Worker ``i`` computes its ``k``-th gradient, then exchanges with its step-``k``
  neighbours ``N_k(i)`` (its partner for ``"pairs"``, both ring neighbours for
  ``"ring"``); an exchange starts when every side of it is ready, so
  ``T_i(k) = max_{j ∈ N_k(i) ∪ {i}} (T_j(k-1) + c_j(k)) + e`` with ``e`` one
  neighbour exchange, ``α + β·model_bytes`` (both directions at once on a
  full-duplex link). A slow worker delays only its neighbours at first; the delay
  spreads one hop per step. Update ``u`` (step ``u`` done by all N) is at
  ``max_i T_i(u)``.

  Returns:
    A :class:`~allreduce_jax.training.arms.Timeline` (plan: ``mixing``).
  """
  n = setup.workers
  U = arms.sync_rounds(setup)
  if mixing == "pairs":
    U -= U % 2
    pairs = pairings(n) if n > 1 else ([(0, 0)], [(0, 0)])
    partner = [np.array([dst for _src, dst in sorted(pr)]) for pr in pairs]
  else:
    exchanges_per_step(mixing)
  e = exchange_seconds(setup) if n > 1 else 0.0
  c = arms.compute_times(setup, seed).rows(U)  # f64[U, N]
  t = np.zeros(n)
  done = np.empty(U)
  idx = np.arange(n)
  for k in range(U):
    ready = t + c[k]
    if mixing == "pairs":
      t = np.maximum(ready, ready[partner[k % 2]]) + e
    else:
      t = np.maximum(np.maximum(ready, ready[(idx - 1) % n]), ready[(idx + 1) % n]) + e
    done[k] = t.max()
  sent = bytes_per_step(arms.model_bytes(setup), mixing, n) * n
  return arms.Timeline(
    time=done,
    gradients=np.arange(1, U + 1) * n,
    samples=float(n * setup.batch_per_worker),
    bytes_sent=U * sent,
    comm_s=U * e,
    plan=mixing,
    info={"mixing": mixing, "exchange_s": e},
  )


def exchange_seconds(setup) -> float:
  """One neighbour exchange of the parameters: ``α + β·model_bytes``."""
  q = arms.link(setup)
  return q.alpha + q.beta * arms.model_bytes(setup)


_compiled: dict[Any, Any] = {}


def run_gossip_curve(setup, workload, timeline, seed: int):
  """Trains D-PSGD along ``timeline`` (plan = mixing) on the emulated devices, each
  worker with the workload's optimizer at its sync learning rate (the workers'
  average follows SGD on the N·B batch); evaluates the workers' average."""

  n, d, mixing = setup.workers, workload.data, timeline.plan
  U = len(timeline.time)
  graphdef, params, rest = models.split(workload.make_model(seed))
  lr = workload.sync_lr(n)
  key = (workload.name, n, mixing, lr)
  if key not in _compiled:
    mesh = devices.submesh((n,), ("data",))
    tx = workload.tx(lr)
    chunk = make_gossip_chunk(graphdef, rest, tx, mesh, mixing)
    _compiled[key] = (mesh, tx, chunk, make_metrics(graphdef, rest))
  mesh, tx, chunk, metrics = _compiled[key]
  idx = data_mod.batch_indices(d.n_train, n * setup.batch_per_worker, U, 1000 + seed)
  every = setup.eval_every + (setup.eval_every % 2 if mixing == "pairs" else 0)
  res = train_gossip(
    graphdef,
    params,
    rest,
    tx,
    idx=idx,
    data=d,
    mesh=mesh,
    mixing=mixing,
    eval_every=every,
    chunk_fn=chunk,
    metrics=metrics,
  )
  return arms.periodic_curve(res, workload, every, consensus=res.consensus[-1])


def gossip_arm(mixing: str = "pairs"):
  """D-PSGD on a ring: ``gossip`` (one neighbour exchange per step) or ``gossip_ring``
  (both neighbours)."""
  name = "gossip" if mixing == "pairs" else f"gossip_{mixing}"
  return arms.Arm(
    name,
    "gossip",
    lambda setup, seed: gossip_timeline(setup, seed, mixing),
    exchange_seconds,
    lambda setup: exchanges_per_step(mixing) * arms.model_bytes(setup) / setup.batch_per_worker,
    run_gossip_curve,
    "D-PSGD on a ring: "
    + ("one neighbour exchange per step" if mixing == "pairs" else "both neighbours every step"),
  )


def audit_step_bytes(
  graphdef: Any, params: Any, rest: Any, p: int, mixing: str = "pairs", data=None
) -> dict:
  """Compiles a gossip chunk on ``p`` devices and counts what one step sends (HLO audit).

  ``data`` (default: the digits) gives the input shapes the program is compiled for.

  Returns ``{"param_bytes": n, "permutes_per_step", "sent_bytes_per_step"}`` (the most
  any participant sends through ``collective-permute`` per step) and
  ``"ring_allreduce_bytes"``, what one participant sends in the ring all-reduce of the
  same ``n`` bytes, from the compiled hand-written ring. Example (``pairs``: one
  exchange of the ``n`` parameter bytes per step)::

    >>> from allreduce_jax.training import models
    >>> g, w, r = models.split(models.make_model("mlp", 0, hidden=(30,)))
    >>> a = audit_step_bytes(g, w, r, 4)
    >>> a["sent_bytes_per_step"] == a["param_bytes"], a["ring_allreduce_bytes"] / a["param_bytes"]
    (True, 1.5)
  """
  mesh = devices.submesh((p,), ("data",))
  tx = optax.sgd(0.0)
  chunk = make_gossip_chunk(graphdef, rest, tx, mesh, mixing)
  state = replicate((params, tx.init(params)), mesh)
  leaves = jax.tree.leaves(params)
  n = int(sum(np.asarray(a).nbytes for a in leaves))
  if data is None:
    data = load_digits()
  rep = NamedSharding(mesh, P())
  x = jax.ShapeDtypeStruct((2, *data.x_train.shape[1:]), data.x_train.dtype, sharding=rep)
  y = jax.ShapeDtypeStruct((2, *data.y_train.shape[1:]), data.y_train.dtype, sharding=rep)
  idx = jax.ShapeDtypeStruct((2, p), jnp.int32, sharding=NamedSharding(mesh, P(None, "data")))
  audit = hlo.audit(chunk.lower(state, x, y, idx).compile().as_text())
  body = 2 if mixing == "pairs" else 1  # steps in the scan body
  ring = hlo.audit_all_reduce("ring", p, -(-n // 4))  # float32 elements
  return {
    "param_bytes": n,
    "permutes_per_step": audit.permutes / body,
    "sent_bytes_per_step": audit.max_sent_bytes / body,
    "ring_allreduce_bytes": ring.max_sent_bytes,
  }
