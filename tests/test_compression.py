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


def _stack(tree, parts=PARTS):
  return jax.tree.map(lambda a: np.broadcast_to(np.asarray(a), (parts, *np.shape(a))).copy(), tree)


def _steps(tx, grads_per_step, params, check_vma=True, parts=PARTS):
  """Runs ``tx.update`` on per-participant gradients (leaves ``[steps, p, ...]``) for
  each step inside one shard_map; returns (updates ``[steps, p, ...]``, final state)."""
  mesh = submesh((parts,), ("d",))
  spec = NamedSharding(mesh, P("d"))
  state = jax.device_put(_stack(tx.init(params), parts), spec)

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


# ------------------------------------------------------- bad input on the compression surfaces


@pytest.mark.parametrize("wire", ["int8", "bf16"])
def test_error_feedback_keeps_a_zero_residual_where_nothing_is_dropped(wire):
  # p = 1 sends nothing: the updates are the gradients at every step, the residual 0.
  rng = np.random.default_rng(6)
  g = (rng.standard_normal((3, 1, 300)) * 0.777).astype(np.float32)
  params = {"w": np.zeros(300, np.float32)}
  tx = all_reduce_gradients("d", wire=wire, error_feedback=True)
  us, state = _steps(tx, {"w": g}, params, parts=1)
  assert np.array_equal(us["w"], g)
  assert not state.residual["w"].any()
  # An integer leaf travels exact: its sums are exact at every step, no float residual.
  gi = np.arange(3 * PARTS * 5, dtype=np.int32).reshape(3, PARTS, 5)
  gf = rng.standard_normal((3, PARTS, 300)).astype(np.float32) / 3
  params = {"i": np.zeros(5, np.int32), "w": np.zeros(300, np.float32)}
  tx = all_reduce_gradients("d", op="sum", wire=wire, error_feedback=True)
  us, state = _steps(tx, {"i": gi, "w": gf}, params, check_vma=False)
  assert (us["i"] == gi.sum(1, keepdims=True)).all()
  assert not state.residual["i"].any() and state.residual["w"].any()


def test_powersgd_on_bfloat16_rounds_once():
  # Averaged in float32 and rounded to bfloat16 once: within 2^-8 of the exact mean,
  # for a leaf averaged exactly (too small to compress) and a compressed one whose
  # mean is exactly rank 1 (each participant holds a power-of-two multiple of it).
  rng = np.random.default_rng(1)
  small = (rng.standard_normal((PARTS, 4, 4)) * rng.uniform(0.5, 2, (PARTS, 1, 1))).astype(
    jnp.bfloat16
  )
  u, v = rng.choice([1.0, -3.0, 0.5], (64, 1)), rng.choice([1.0, 2.5, -0.75], (1, 48))
  big = np.stack([(u @ v) * c for c in (0.5, 0.5, 1.0, 2.0)]).astype(jnp.bfloat16)
  params = {"small": np.zeros((4, 4), jnp.bfloat16), "big": np.zeros((64, 48), jnp.bfloat16)}
  for start_step in (0, 1):
    us, _ = _steps(
      powersgd("d", rank=1, start_step=start_step), {"small": small[None], "big": big[None]}, params
    )
    for name, g in (("small", small), ("big", big)):
      want = np.asarray(g, np.float64).mean(0)
      got = np.asarray(us[name][0], np.float64)
      assert us[name].dtype == jnp.bfloat16
      assert (np.abs(got - want) <= 2.0**-8 * np.abs(want)).all(), (name, start_step)


def test_topk_takes_an_empty_leaf_and_names_an_unbound_axis():
  rng = np.random.default_rng(7)
  g = {"empty": np.zeros((1, PARTS, 0), np.float32), "w": rng.standard_normal((1, PARTS, 8))}
  g["w"] = g["w"].astype(np.float32)
  params = {"empty": np.zeros(0, np.float32), "w": np.zeros(8, np.float32)}
  us, state = _steps(topk("d", fraction=0.25), g, params)
  assert us["empty"].shape == (1, PARTS, 0) and state.residual["empty"].shape == (PARTS, 0)
  kept = np.zeros((PARTS, 8), np.float32)
  for i in range(PARTS):
    top = np.argsort(-np.abs(g["w"][0, i]), kind="stable")[:2]
    kept[i, top] = g["w"][0, i, top]
  np.testing.assert_allclose(us["w"][0, 0], kept.mean(0), rtol=1e-6)
  only_empty, _ = _steps(topk("d"), {"e": g["empty"]}, {"e": params["empty"]})
  assert only_empty["e"].shape == (1, PARTS, 0)
  with pytest.raises(
    ValueError, match=r"axis_name 'data' is not bound here; .*Bound axes: \('d',\)"
  ):
    _steps(topk("data"), g, params)
