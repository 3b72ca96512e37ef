"""The α-β-γ cost model: formulas vs hand-computed values, fitting, and ``auto``."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import ALGORITHMS, all_reduce, cost_model, hlo
from allreduce_jax.cost_model import Params


@pytest.mark.parametrize(
  "algorithm, p, n, steps, beta_bytes, gamma_bytes",
  [
    ("ring", 8, 1024, 14, 2 * 7 / 8 * 1024, 7 / 8 * 1024),
    ("bidirectional_ring", 8, 1024, 14, 7 / 8 * 1024, 7 / 8 * 1024),
    ("recursive_doubling", 8, 1024, 3, 3 * 1024, 3 * 1024),
    ("recursive_doubling", 5, 1024, 4, 4 * 1024, 3 * 1024),  # fold: +2 steps
    ("halving_doubling", 8, 1024, 6, 2 * 7 / 8 * 1024, 7 / 8 * 1024),
    ("tree", 8, 1024, 6, 6 * 1024, 3 * 1024),
    ("naive", 4, 1024, 6, 6 * 1024, 3 * 1024),
    ("psum", 4, 1000, 6, 1500, 750),
    ("ring", 1, 1024, 0, 0, 0),
  ],
)
def test_schedule_matches_hand_computed(algorithm, p, n, steps, beta_bytes, gamma_bytes):
  s = cost_model.schedule(algorithm, p, n)
  assert (s.steps, s.beta_bytes, s.gamma_bytes) == pytest.approx((steps, beta_bytes, gamma_bytes))


def test_hierarchical_schedule_hand_computed():
  # p = 8 = 2 nodes x 4: 2*3 inner steps + 2*1 outer; bytes 2*(3/4)n + 2*(1/2)*(n/4).
  s = cost_model.schedule("hierarchical", 8, 1024, inner=4)
  assert s.steps == 8
  assert s.beta_bytes == pytest.approx(1.5 * 1024 + 0.25 * 1024)


def test_predict_seconds_hand_computed():
  q = Params(alpha=1e-6, beta=1e-9, gamma=1e-10)
  # 14 α + 1.75e6 β + 0.875e6 γ
  want = 14e-6 + 1.75e-3 + 0.875e-4
  assert cost_model.predict_seconds("ring", 8, 1e6, q) == pytest.approx(want)
  assert cost_model.predict_us("ring", 8, 1e6, q) == pytest.approx(want * 1e6)
  # The legacy call other code uses: defaults when params is None.
  assert cost_model.predict_us("ring", 8, 1e6) == pytest.approx(
    1e6 * cost_model.predict_seconds("ring", 8, 1e6, cost_model.DEFAULT_PARAMS)
  )


def test_lower_bound_and_from_link():
  q = Params.from_link(latency_us=5, bandwidth_GBps=50)
  assert q.alpha == pytest.approx(5e-6) and q.beta == pytest.approx(2e-11) and q.gamma == 0
  assert cost_model.lower_bound_seconds(8, 1e9, q) == pytest.approx(1.75e9 * 2e-11)


def test_fit_recovers_known_parameters_from_noisy_data():
  true = Params(alpha=150e-6, beta=0.4e-9, gamma=0.3e-9)
  rng = np.random.default_rng(0)
  rows = []
  for alg in ("ring", "recursive_doubling", "halving_doubling", "tree"):
    for n in 2.0 ** np.arange(10, 27, 2):
      t = cost_model.predict_seconds(alg, 8, n, true) * (1 + 0.02 * rng.standard_normal())
      rows.append((alg, 8, n, t))
  got = cost_model.fit(rows)
  assert got.alpha == pytest.approx(true.alpha, rel=0.05)
  assert got.beta == pytest.approx(true.beta, rel=0.1)
  assert got.gamma == pytest.approx(true.gamma, rel=0.2)


def test_fit_all_per_algorithm_and_json_roundtrip(tmp_path):
  a, b = Params(100e-6, 1e-9, 0.0), Params(10e-6, 3e-9, 0.0)
  rows = [("ring", 8, n, cost_model.predict_seconds("ring", 8, n, a)) for n in (1e3, 1e5, 1e7)]
  rows += [("tree", 8, n, cost_model.predict_seconds("tree", 8, n, b)) for n in (1e3, 1e5, 1e7)]
  fitted = cost_model.fit_all(rows)
  assert fitted.get("ring").alpha == pytest.approx(100e-6, rel=1e-6)
  assert fitted.get("tree").beta == pytest.approx(3e-9, rel=1e-6)
  path = tmp_path / "p.json"
  cost_model.save_params(fitted, path)
  back = cost_model.load_params(path)
  assert back.get("ring").alpha == pytest.approx(fitted.get("ring").alpha)
  assert json.loads(path.read_text())["shared"]["alpha_us"] > 0


def test_fit_rejects_bad_rows():
  with pytest.raises(ValueError, match="at least one"):
    cost_model.fit([])
  with pytest.raises(ValueError, match="positive"):
    cost_model.fit([("ring", 8, 1024, 0.0)])


@pytest.mark.parametrize("params", [Params(200e-6, 1e-9, 1e-9), Params(1e-6, 1e-9, 0.5e-9)])
def test_choose_is_the_argmin_among_auto_candidates(params):
  for p in (2, 3, 5, 8, 64):
    for n in (1024, 1 << 16, 1 << 24):
      best = cost_model.choose(p, n, params)
      times = {a: cost_model.predict_seconds(a, p, n, params) for a in cost_model.auto_candidates()}
      assert times[best] == min(times.values())
      record = ALGORITHMS[best]  # a one-axis, hand-written candidate, never the reference
      assert record.auto and record.axes == 1 and record.hand_written


def test_two_level_machine():
  m = cost_model.TwoLevel(cost_model.PRESETS["nvlink4"], cost_model.PRESETS["ib_ndr"], 8, 8)
  n = 1 << 20
  # Inside one node every algorithm runs on the inner parameters.
  assert cost_model.predict_two_level_seconds("tree", 8, n, m) == pytest.approx(
    cost_model.predict_seconds("tree", 8, n, m.inner)
  )
  # hierarchical at p = 16: inner ring RS+AG on NVLink + a 2-node ring on n/8 over IB.
  i, o = m.inner, m.outer
  want = 14 * i.alpha + 2 * 7 / 8 * n * i.beta + 7 / 8 * n * i.gamma
  want += 2 * o.alpha + n / 8 * o.beta + 0.5 * n / 8 * o.gamma
  assert cost_model.predict_two_level_seconds("hierarchical", 16, n, m) == pytest.approx(want)
  # Ring's step count makes it lose at scale for small messages.
  big = {a: cost_model.predict_two_level_seconds(a, 16384, n, m) for a in ("ring", "tree")}
  assert big["ring"] > 10 * big["tree"]


def _auto_program(p):
  mesh = jax.make_mesh((p,), ("i",), devices=jax.devices()[:p])
  f = jax.jit(
    jax.shard_map(
      lambda b: all_reduce(b[0], "i", algorithm="auto")[None],
      mesh=mesh,
      in_specs=P("i"),
      out_specs=P("i"),
    )
  )
  return mesh, f


@pytest.mark.parametrize(
  "params, nbytes",
  [
    (Params(500e-6, 1e-12, 0.0), 4096),  # latency-bound: fewest steps
    (Params(0.0, 1e-9, 1e-9), 1 << 16),  # bandwidth-bound
  ],
)
def test_auto_runs_the_models_argmin(params, nbytes):
  p = 8
  want = cost_model.choose(p, nbytes, params)
  mesh, f = _auto_program(p)
  count = nbytes // 4
  x = jnp.asarray((np.arange(p * count) % 7).reshape(p, count), jnp.float32)
  x = jax.device_put(x, NamedSharding(mesh, P("i")))
  with cost_model.use_params(params):  # explicit parameters, read at trace time
    audit = hlo.audit(hlo.compiled_text(f, x))
    got = np.asarray(f(x))
  assert audit.permutes == cost_model.schedule(want, p, nbytes).permutes
  assert audit.counts["all-reduce"] == 0
  np.testing.assert_array_equal(got, np.tile(np.asarray(x).sum(0), (p, 1)))


def test_cli_without_a_fit_file_uses_the_backends_defaults(tmp_path, monkeypatch):
  monkeypatch.setenv(cost_model.FIT_ENV_VAR, str(tmp_path / "missing.json"))
  assert cost_model.load_default_params() == cost_model.backend_params()


def test_unreadable_fit_file_warns_and_falls_back(tmp_path, monkeypatch):
  bad = tmp_path / "cost_params.json"
  bad.write_text("{not json")
  monkeypatch.setenv("ALLREDUCE_JAX_COST_PARAMS", str(bad))
  with pytest.warns(UserWarning, match="could not be read"):
    assert cost_model.load_default_params() == cost_model.backend_params()
  monkeypatch.setenv("ALLREDUCE_JAX_COST_PARAMS", str(tmp_path / "missing.json"))
  assert cost_model.load_default_params() == cost_model.backend_params()
