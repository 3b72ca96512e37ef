"""Between sync and async: Local SGD(H), DiLoCo(H) and gossip D-PSGD.

References: synchronous training (Local SGD with H = 1 and plain SGD is sync SGD),
a host-side replay of the outer Nesterov step, the mixing matrices applied in NumPy,
and the HLO of the compiled programs (bytes through ``collective-permute``).
"""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import devices, hlo
from allreduce_jax.training import data, gossip, local, models, sync


@pytest.fixture(scope="module")
def digits():
  return data.load_digits()


def _mlp(seed=0, hidden=(30,)):  # 2260 parameters: divisible by p = 4
  return models.split(models.make_model("mlp", seed, hidden=hidden))


def _max_diff(a, b) -> float:
  return max(
    float(np.abs(np.asarray(x) - np.asarray(y)).max())
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


def test_local_sgd_h1_plain_sgd_is_sync(digits):
  p = 4
  graphdef, params, rest = _mlp()
  mesh = devices.submesh((p,), ("data",))
  tx = optax.sgd(0.1)
  idx = data.batch_indices(digits.n_train, p * 8, 12, seed=3)
  ref = sync.train_sync(graphdef, params, rest, tx, digits, idx, mesh=mesh, eval_every=6)
  res = local.train_local(
    graphdef, params, rest, tx, digits, idx, mesh=mesh, H=1, rounds_per_eval=6
  )
  assert _max_diff(res.params, ref.params) < 1e-6
  np.testing.assert_allclose(res.losses, ref.losses, atol=1e-6)
  assert res.rounds == 12 and res.eval_steps == [0, 6, 12]


def test_diloco_outer_step_matches_a_host_replay(digits):
  """Two rounds of DiLoCo against the same inner runs averaged on the host, then
  the outer Nesterov step applied there."""
  p, H = 2, 3
  graphdef, params, rest = _mlp()
  mesh = devices.submesh((p,), ("data",))
  inner, outer = models.make_optimizer("adamw", 1e-2), local.diloco_outer()
  idx = data.batch_indices(digits.n_train, p * 8, 2 * H, seed=4)
  res = local.train_local(
    graphdef, params, rest, inner, digits, idx, mesh=mesh, H=H, outer_tx=outer
  )
  x_all, y_all = jax.numpy.asarray(digits.x_train), jax.numpy.asarray(digits.y_train)
  single = jax.jit(lambda w, s, ib: _inner_steps(graphdef, rest, inner, x_all, y_all, w, s, ib))
  w_glob, s_out = params, outer.init(params)
  s_in = [inner.init(params) for _ in range(p)]
  for r in range(2):
    locals_ = []
    for i in range(p):
      w_i, s_in[i] = single(w_glob, s_in[i], idx[r * H : (r + 1) * H, i * 8 : (i + 1) * 8])
      locals_.append(w_i)
    mean = jax.tree.map(lambda *a: sum(a) / p, *locals_)
    delta = jax.tree.map(lambda a, b: a - b, w_glob, mean)
    upd, s_out = outer.update(delta, s_out, w_glob)
    w_glob = optax.apply_updates(w_glob, upd)
  assert _max_diff(res.params, w_glob) < 1e-5
  assert res.rounds == 2 and res.test_acc[-1] > res.test_acc[0]


def _inner_steps(graphdef, rest, tx, x_all, y_all, w, s, ib):
  for k in range(ib.shape[0]):
    g = jax.grad(lambda q, k=k: models.loss_fn(graphdef, q, rest, x_all[ib[k]], y_all[ib[k]]))(w)
    u, s = tx.update(g, s, w)
    w = optax.apply_updates(w, u)
  return w, s


def test_local_sgd_rejects_steps_not_a_multiple_of_h(digits):
  graphdef, params, rest = _mlp()
  mesh = devices.submesh((2,), ("data",))
  idx = data.batch_indices(digits.n_train, 16, 5, seed=0)
  with pytest.raises(ValueError, match="multiple of H"):
    local.train_local(graphdef, params, rest, optax.sgd(0.1), digits, idx, mesh=mesh, H=2)


def _gossip_inputs(mesh, digits, steps, p):
  rep = NamedSharding(mesh, P())
  idx = jax.device_put(np.zeros((steps, p * 4), np.int32), NamedSharding(mesh, P(None, "data")))
  return jax.device_put(digits.x_train, rep), jax.device_put(digits.y_train, rep), idx


@pytest.mark.parametrize("mixing", gossip.MIXINGS)
def test_gossip_mixes_with_the_ring_matrix(digits, mixing):
  """With a zero learning rate a gossip step is θ <- W_t θ: compare with NumPy."""
  p, steps = 4, 2
  graphdef, params, rest = _mlp()
  mesh = devices.submesh((p,), ("data",))
  tx = optax.sgd(0.0)
  chunk = gossip.make_gossip_chunk(graphdef, rest, tx, mesh, mixing)
  rng = np.random.default_rng(0)
  stacked = jax.tree.map(lambda a: rng.normal(size=(p, *a.shape)).astype(np.float32), params)
  state = (
    jax.tree.map(lambda a: jax.device_put(a, NamedSharding(mesh, P("data"))), stacked),
    sync.replicate(tx.init(params), mesh),
  )
  (w, _), _ = chunk(state, *_gossip_inputs(mesh, digits, steps, p))
  mix = gossip.mixing_matrix(p, mixing, 1) @ gossip.mixing_matrix(p, mixing, 0)
  np.testing.assert_allclose(mix.sum(axis=0), 1.0)
  np.testing.assert_allclose(mix.sum(axis=1), 1.0)
  for got, a in zip(jax.tree.leaves(w), jax.tree.leaves(stacked)):
    want = np.tensordot(mix, a.astype(np.float64), axes=1)
    np.testing.assert_allclose(devices.fetch(got), want, rtol=1e-5, atol=1e-6)


def test_gossip_sends_n_bytes_per_step_against_the_ring_allreduce(digits):
  """HLO audit: one collective-permute of the raveled parameters per step (pairs), two
  (ring mixing); the ring all-reduce of the same bytes sends 2(p-1)/p · n."""
  p, steps = 4, 4
  graphdef, params, rest = _mlp()
  n = models.n_params(params) * 4
  mesh = devices.submesh((p,), ("data",))
  tx = optax.sgd(0.1)
  state = sync.replicate((params, tx.init(params)), mesh)
  for mixing, per_step in (("pairs", n), ("ring", 2 * n)):
    chunk = gossip.make_gossip_chunk(graphdef, rest, tx, mesh, mixing)
    audit = hlo.audit(hlo.compiled_text(chunk, state, *_gossip_inputs(mesh, digits, steps, p)))
    body_steps = 2 if mixing == "pairs" else 1  # the scan body holds this many steps
    assert set(audit.permute_bytes) == {n}
    assert audit.permutes == body_steps * gossip.exchanges_per_step(mixing)
    assert all(b // body_steps == per_step for b in audit.sent_bytes.values())
    assert gossip.bytes_per_step(n, mixing, p) == per_step
  ring = hlo.audit_all_reduce("ring", p, n // 4)
  assert ring.max_sent_bytes == 2 * (p - 1) * n // p
  assert local.allreduce_bytes_per_participant("ring", p, n) == 2 * (p - 1) * n / p


def test_local_round_runs_one_allreduce_of_the_parameters(digits):
  """The compiled Local SGD round: the ring's 2(p-1) permutes of n/p bytes, once per round."""
  p = 4
  graphdef, params, rest = _mlp()
  n = models.n_params(params) * 4
  mesh = devices.submesh((p,), ("data",))
  tx = optax.sgd(0.1)
  chunk = local.make_local_chunk(graphdef, rest, tx, mesh)
  state = local.init_state(params, tx, None, mesh)
  rep = NamedSharding(mesh, P())
  idx = jax.device_put(
    np.zeros((2, 5, p * 4), np.int32), NamedSharding(mesh, P(None, None, "data"))
  )
  audit = hlo.audit(
    hlo.compiled_text(
      chunk, state, jax.device_put(digits.x_train, rep), jax.device_put(digits.y_train, rep), idx
    )
  )
  assert audit.permutes == 2 * (p - 1)
  assert max(audit.sent_bytes.values()) == 2 * (p - 1) * n // p


def test_gossip_trains_and_reaches_consensus(digits):
  p = 4
  graphdef, params, rest = _mlp()
  mesh = devices.submesh((p,), ("data",))
  idx = data.batch_indices(digits.n_train, p * 16, 40, seed=1)
  res = gossip.train_gossip(
    graphdef, params, rest, optax.sgd(0.1, momentum=0.9), digits, idx, mesh=mesh, eval_every=20
  )
  assert res.test_acc[-1] > 0.8
  assert 0 < res.consensus[-1] < res.consensus[1]
  assert not res.diverged


def test_gossip_pairs_needs_an_even_ring():
  with pytest.raises(ValueError, match="even"):
    gossip.pairings(3)
  with pytest.raises(ValueError, match="mixing"):
    gossip.exchanges_per_step("star")


def _setup(**kw):
  from allreduce_jax.training import arms

  base = dict(workers=4, gradients=32, compute="constant", compute_s=1.0, model_params=1000)
  return arms.Setup(**{**base, **kw})


def test_local_timeline_waits_for_the_slowest_once_per_round():
  from allreduce_jax.training import arms

  setup = _setup(speeds=(1.0, 1.0, 1.0, 0.5))  # worker 3 takes 2 s per gradient
  ar = arms.allreduce_seconds(setup)
  tl = local.local_timeline(setup, 0, 4, ar, arms.allreduce_bytes(setup))
  assert len(tl.time) == 8 and tl.info["rounds"] == 2
  # update u of a round ends when the slow worker has done u local steps (2 s each)
  np.testing.assert_allclose(tl.time[:4], [2, 4, 6, 8 + ar])
  np.testing.assert_allclose(tl.time[4:], 8 + ar + np.array([2, 4, 6, 8 + ar]))
  assert tl.bytes_sent == 2 * arms.allreduce_bytes(setup)
  arm = arms.get_arm("diloco_h4")
  assert arm.bytes_per_sample(setup) == arms.allreduce_bytes(setup) / (4 * 4 * 16)
  with pytest.raises(ValueError, match="do not fit"):
    local.local_timeline(setup, 0, 9, ar, 0.0)


def test_gossip_timeline_is_a_neighbour_barrier():
  setup = _setup()
  e = gossip.exchange_seconds(setup)
  tl = gossip.gossip_timeline(setup, 0, "pairs")
  np.testing.assert_allclose(tl.time, (np.arange(8) + 1) * (1 + e))
  # one slow worker: its partner waits at once, the others only once the delay has spread
  slow = gossip.gossip_timeline(_setup(speeds=(1.0, 1.0, 1.0, 0.25)), 0, "pairs")
  sync_like = (np.arange(8) + 1) * (4 + e)
  assert (slow.time <= sync_like + 1e-9).all() and slow.time[0] == pytest.approx(4 + e)
  assert tl.bytes_sent == 8 * 4 * 4000 and slow.comm_s == pytest.approx(8 * e)
