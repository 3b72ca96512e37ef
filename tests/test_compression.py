"""Gradient compression as optax transformations (``powersgd``, ``topk``,
``all_reduce_gradients(wire=..., error_feedback=True)``) against NumPy / closed forms.

Each transformation runs inside a typed ``jax.shard_map`` with one state copy per
participant (a leading axis sharded over the mesh), as ``training.sync`` runs it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import _wire, all_reduce_gradients, powersgd, topk
from allreduce_jax.devices import submesh

PARTS = 4


def _stack(tree):
  return jax.tree.map(lambda a: np.broadcast_to(np.asarray(a), (PARTS, *np.shape(a))).copy(), tree)


def _steps(tx, grads_per_step, params, check_vma=True):
  """Runs ``tx.update`` on per-participant gradients (leaves ``[steps, p, ...]``) for
  each step inside one shard_map; returns (updates ``[steps, p, ...]``, final state)."""
  mesh = submesh((PARTS,), ("d",))
  spec = NamedSharding(mesh, P("d"))
  state = jax.device_put(_stack(tx.init(params)), spec)

  def body(g_all, s):  # g_all leaves: T[steps, 1, ...]; s leaves: T[1, ...]
    s = jax.tree.map(lambda a: a[0], s)

    def step(s, g):
      u, s = tx.update(jax.tree.map(lambda a: a[0], g), s, None)
      return s, jax.tree.map(lambda a: a[None], u)

    s, us = jax.lax.scan(step, s, g_all)
    return us, jax.tree.map(lambda a: a[None], s)

  f = jax.jit(
    jax.shard_map(
      body,
      mesh=mesh,
      in_specs=(P(None, "d"), P("d")),
      out_specs=(P(None, "d"), P("d")),
      check_vma=check_vma,
    )
  )
  g = jax.device_put(grads_per_step, NamedSharding(mesh, P(None, "d")))
  us, state = f(g, state)
  return jax.tree.map(np.asarray, us), jax.tree.map(np.asarray, state)


def test_powersgd_is_exact_on_a_low_rank_average_and_keeps_the_residual():
  rng = np.random.default_rng(0)
  u, v = rng.standard_normal((16, 2)), rng.standard_normal((12, 2))
  # Each participant's gradient is rank 2 in the same column space; so is the mean.
  m = np.stack([u @ np.diag(rng.standard_normal(2)) @ v.T for _ in range(PARTS)])
  bias = rng.standard_normal((PARTS, 12))
  grads = {"w": m[None].astype(np.float32), "b": bias[None].astype(np.float32)}
  params = {"w": np.zeros((16, 12), np.float32), "b": np.zeros(12, np.float32)}
  us, state = _steps(powersgd("d", rank=2), grads, params)
  np.testing.assert_allclose(us["w"][0, 0], m.mean(0), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(us["b"][0, 0], bias.mean(0), rtol=1e-6)
  assert all(np.array_equal(us["w"][0, 0], us["w"][0, i]) for i in range(PARTS))
  # Error feedback keeps e_i = M_i - P Q^T (each participant's own difference).
  np.testing.assert_allclose(state.residual["w"], m - m.mean(0), atol=1e-4)
  assert int(state.count[0]) == 1


def test_powersgd_rank_one_matches_a_numpy_power_iteration():
  # A full-rank mean: rank 1 keeps P Q^T of one power-iteration step from the warm Q.
  rng = np.random.default_rng(1)
  m = rng.standard_normal((PARTS, 20, 10)).astype(np.float32)
  tx = powersgd("d", rank=1)
  params = {"w": np.zeros((20, 10), np.float32)}
  q0 = np.asarray(tx.init(params).q[0])
  us, state = _steps(tx, {"w": m[None]}, params)
  pm = (m @ q0).mean(0)
  ph = pm / np.linalg.norm(pm)
  qm = np.einsum("inm,nr->imr", m, ph).mean(0)
  np.testing.assert_allclose(us["w"][0, 0], ph @ qm.T, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(state.q[0][0], qm, rtol=1e-4, atol=1e-6)  # the warm start


def test_powersgd_before_start_step_is_the_exact_average():
  rng = np.random.default_rng(2)
  g = rng.standard_normal((3, PARTS, 16, 12)).astype(np.float32)
  params = {"w": np.zeros((16, 12), np.float32)}
  us, state = _steps(powersgd("d", rank=1, start_step=2), {"w": g}, params)
  exact, _ = _steps(all_reduce_gradients("d"), {"w": g}, params)
  assert np.array_equal(us["w"][:2], exact["w"][:2])
  assert not np.allclose(us["w"][2], exact["w"][2])  # compressed from step 2 on
  assert int(state.count[0]) == 3


@pytest.mark.parametrize("error_feedback", [True, False])
def test_topk_against_numpy(error_feedback):
  rng = np.random.default_rng(3)
  g = rng.standard_normal((2, PARTS, 40)).astype(np.float32)
  params = {"w": np.zeros(40, np.float32)}
  us, state = _steps(topk("d", fraction=0.1, error_feedback=error_feedback), {"w": g}, params)
  e = np.zeros((PARTS, 40), np.float32)
  for t in range(2):
    c = g[t] + e if error_feedback else g[t]
    kept = np.zeros_like(c)
    for i in range(PARTS):
      top = np.argsort(-np.abs(c[i]), kind="stable")[:4]
      kept[i, top] = c[i, top]
    np.testing.assert_allclose(us["w"][t, 0], kept.mean(0), rtol=1e-6, atol=1e-7)
    assert all(np.array_equal(us["w"][t, 0], us["w"][t, i]) for i in range(PARTS))
    e = c - kept
  np.testing.assert_allclose(state.residual["w"], e if error_feedback else 0 * e, atol=1e-6)


def test_all_reduce_gradients_error_feedback_accumulates_the_residual():
  rng = np.random.default_rng(4)
  g = rng.standard_normal((2, PARTS, 300)).astype(np.float32)
  params = {"w": np.zeros(300, np.float32)}
  tx = all_reduce_gradients("d", algorithm="two_shot", wire="int8", error_feedback=True)
  us, state = _steps(tx, {"w": g}, params)
  c1 = g[1] + (g[0] - _wire.np_roundtrip("int8", g[0]))  # step 2 sends g + e
  plain, _ = _steps(
    all_reduce_gradients("d", algorithm="two_shot", wire="int8"), {"w": c1[None]}, params
  )
  assert np.array_equal(us["w"][1], plain["w"][0])
  np.testing.assert_allclose(state.residual["w"], c1 - _wire.np_roundtrip("int8", c1), atol=1e-6)
  np.testing.assert_allclose(us["w"][0, 0], g[0].mean(0), atol=0.05)


def test_refusals():
  with pytest.raises(ValueError, match="error_feedback=True needs a lossy wire"):
    all_reduce_gradients("d", error_feedback=True)
  with pytest.raises(ValueError, match="op='max' with wire='int8'"):
    all_reduce_gradients("d", op="max", wire="int8")
  with pytest.raises(ValueError, match="rank=0"):
    powersgd("d", rank=0)
  with pytest.raises(ValueError, match="fraction=0"):
    topk("d", fraction=0)


def test_multisteps_nnx_state_and_bfloat16():
  # optax.MultiSteps around each, on an nnx.State of nnx.Params, in float32 and bfloat16.
  # Untyped shard_map, as for all_reduce_gradients in tests/test_gradients.py: MultiSteps'
  # lax.cond pairs the reduced (invariant) updates with varying zeros, which typed
  # shard_map refuses for lax.pmean too.
  model = nnx.Linear(16, 12, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(5)
  for tx, dtype in (
    (powersgd("d", rank=2, start_step=1), jnp.bfloat16),
    (topk("d", fraction=0.25), jnp.float32),
    (all_reduce_gradients("d", wire="bf16", error_feedback=True), jnp.bfloat16),
  ):
    params = jax.tree.map(lambda a, d=dtype: a.astype(d), nnx.state(model, nnx.Param))
    grads = jax.tree.map(
      lambda a, d=dtype: rng.standard_normal((4, PARTS, *a.shape)).astype(d), params
    )
    multi = optax.MultiSteps(optax.chain(tx, optax.sgd(1.0)), every_k_schedule=2)
    with jax.numpy_dtype_promotion("standard"):  # MultiSteps mixes int and float
      us, _ = _steps(multi, grads, params, check_vma=False)
    for leaf in jax.tree.leaves(us):
      assert leaf.dtype == dtype
      assert not leaf[0].any() and leaf[1].any()  # MultiSteps emits every 2nd step
      assert all(np.array_equal(leaf[1, 0], leaf[1, i]) for i in range(PARTS))
