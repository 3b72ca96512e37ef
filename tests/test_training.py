"""Training: sync data parallel over the custom all-reduce, simulated async SGD, sweeps.

Every check compares against an independent reference: XLA's psum, plain
single-device training, a naive Python replay of stale SGD, or the order-statistic
formulas (H_N) for straggler times.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from allreduce_jax import ALGORITHMS, devices
from allreduce_jax.cli import main as cli_main
from allreduce_jax.training import async_sim, data, experiments, models, sync
from allreduce_jax.training.results import Results

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def digits():
  return data.load_digits()


def _mlp(seed=0):
  return models.split(models.make_model("mlp", seed))


# ------------------------------------------------------------------ data


def test_split_is_stratified_standardized_and_fixed(digits):
  again = data.load_digits.__wrapped__()
  np.testing.assert_array_equal(digits.y_test, again.y_test)
  assert digits.x_train.dtype == np.float32 and digits.y_train.dtype == np.int32
  assert len(digits.y_train) + len(digits.y_test) == 1797
  np.testing.assert_allclose(digits.x_train.mean(0), 0.0, atol=1e-5)
  frac_train = np.bincount(digits.y_train) / len(digits.y_train)
  frac_test = np.bincount(digits.y_test) / len(digits.y_test)
  assert np.abs(frac_train - frac_test).max() < 0.01  # stratified


def test_batch_indices_are_epochs_without_replacement():
  idx = data.batch_indices(10, 5, 4, seed=3)
  assert idx.shape == (4, 5)
  assert sorted(idx[:2].ravel()) == list(range(10))  # first epoch is a permutation


# ------------------------------------------------------------------ sync


def test_sync_ring_equals_psum_and_single_device(digits):
  graphdef, params, rest = _mlp()
  tx = models.make_optimizer("momentum", 0.05)
  mesh = devices.submesh((8,), ("data",))
  idx = data.batch_indices(digits.n_train, 8 * 8, 120, seed=1)
  ring = sync.train_sync(
    graphdef, params, rest, tx, digits, idx, mesh=mesh, algorithm="ring", eval_every=60
  )
  psum = sync.train_sync(
    graphdef, params, rest, tx, digits, idx, mesh=mesh, algorithm="psum", eval_every=60
  )
  single, w_single = sync.train_single_device(graphdef, params, rest, tx, digits, idx)
  assert ring.losses.shape == (120,)
  assert ring.replicas_identical and psum.replicas_identical
  assert np.abs(ring.losses - psum.losses).max() <= 1e-5
  assert np.abs(ring.losses - single).max() <= 1e-4
  for a, b in zip(jax.tree.leaves(ring.params), jax.tree.leaves(w_single)):
    np.testing.assert_allclose(a, np.asarray(b), atol=1e-4)
  assert ring.losses[-1] < 0.5 * ring.losses[0]  # it actually trained


@pytest.fixture(scope="module")
def adam_reference(digits):
  """Single-device Adam training on 4 x 8 examples per step: the reference below."""
  graphdef, params, rest = _mlp(1)
  tx = models.make_optimizer("adam", 1e-3)
  idx = data.batch_indices(digits.n_train, 4 * 8, 6, seed=2)
  single, _ = sync.train_single_device(graphdef, params, rest, tx, digits, idx)
  return (graphdef, params, rest, tx, idx), single


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm_trains_like_single_device(digits, adam_reference, algorithm):
  (graphdef, params, rest, tx, idx), single = adam_reference
  mesh, axis = experiments._mesh(4, algorithm)
  res = sync.train_sync(
    graphdef, params, rest, tx, digits, idx, mesh=mesh, axis=axis, algorithm=algorithm, eval_every=6
  )
  assert res.replicas_identical
  assert np.abs(res.losses - single).max() <= 1e-5


def test_backup_mask_averages_the_kept_gradients(digits):
  graphdef, params, rest = _mlp(2)
  tx = models.make_optimizer("sgd", 0.1)
  mesh = devices.submesh((8,), ("data",))
  steps, B = 6, 8
  sched = async_sim.sync_schedule("exponential", 8, steps, seed=0, backups=2)
  idx = data.batch_indices(digits.n_train, 8 * B, steps, seed=3)
  res = sync.train_sync(
    graphdef,
    params,
    rest,
    tx,
    digits,
    idx,
    mesh=mesh,
    algorithm="ring",
    mask=sched.mask,
    eval_every=3,
  )
  # Reference: single-device training on the examples of the kept workers only.
  kept = [idx[s].reshape(8, B)[sched.mask[s] > 0].ravel() for s in range(steps)]
  ref, _ = sync.train_single_device(graphdef, params, rest, tx, digits, np.stack(kept))
  full, _ = sync.train_single_device(graphdef, params, rest, tx, digits, idx)
  assert np.abs(res.losses - ref).max() <= 1e-5
  assert np.abs(res.losses[1:] - full[1:]).max() > 1e-3  # the mask did change the run


def test_default_sync_config_reaches_95_percent():
  row = experiments.run_sync(experiments.SyncConfig())
  assert row["replicas_identical"]
  assert row["final_test_acc"] >= 0.95, row["test_acc"]


def test_cnn_trains_synchronously():
  row = experiments.run_sync(experiments.SyncConfig.smoke(model="cnn", workers=4, steps=20))
  assert row["replicas_identical"] and row["final_test_acc"] > 0.5


# ------------------------------------------------------------------ async replay


def _naive_async(graphdef, params, rest, tx, digits, tau, idx, method):
  """Reference: keep every parameter version in a Python list."""
  history = [params]
  w, s = params, tx.init(params)
  ms = jax.tree.map(jnp.zeros_like, params)  # DC-ASGD-a's running mean square of g
  grad = jax.jit(jax.grad(lambda q, x, y: models.loss_fn(graphdef, q, rest, x, y)))
  for t in range(len(tau)):
    read = history[t - int(tau[t])]
    g = grad(read, digits.x_train[idx[t]], digits.y_train[idx[t]])
    ms = jax.tree.map(lambda m, gi: 0.95 * m + 0.05 * gi * gi, ms, g)
    if method == "dcasgd":  # λ_t = 2 / sqrt(ms + 1e-7), elementwise (Zheng et al.'s DC-ASGD-a)
      g = jax.tree.map(
        lambda gi, wi, ri, m: gi + 2.0 / jnp.sqrt(m + 1e-7) * gi * gi * (wi - ri), g, w, read, ms
      )
    if method == "async_eta_tau":
      scale = 1.0 / max(int(tau[t]), 1)
      g = jax.tree.map(lambda gi, c=scale: gi * c, g)
    u, s = tx.update(g, s, w)
    w = optax.apply_updates(w, u)
    history.append(w)
  return w


@pytest.mark.parametrize("method", async_sim.ASYNC_METHODS)
def test_replay_matches_naive_stale_sgd_and_compiles_once(digits, method):
  graphdef, params, rest = _mlp(3)
  tx = models.make_optimizer("momentum", 0.05)
  K = 24
  replay = async_sim.make_replay(graphdef, rest, tx, K)
  evaluate = sync.make_evaluator(graphdef, rest)
  T = 45
  idx = data.batch_indices(digits.n_train, 8, T, seed=4)
  schedules = [
    async_sim.event_schedule("exponential", 4, T, seed=5, max_staleness=K - 1),
    async_sim.fixed_tau_schedule(3, T),
    async_sim.event_schedule("slow", 6, T, seed=6, max_staleness=K - 1),
  ]
  for sched in schedules:
    res = async_sim.run_async(
      replay,
      params,
      tx,
      digits,
      sched,
      idx,
      buffer_size=K,
      method=method,
      chunk=20,
      evaluate=evaluate,
    )
    ref = _naive_async(graphdef, params, rest, tx, digits, sched.staleness, idx, method)
    for a, b in zip(jax.tree.leaves(res.params), jax.tree.leaves(ref)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)
  assert schedules[0].staleness.max() > 3  # the event schedule really was stale
  assert replay._cache_size() == 1  # one compile for every schedule and τ


def test_staleness_changes_the_run_and_dc_is_identity_at_tau_zero(digits):
  graphdef, params, rest = _mlp(4)
  tx = models.make_optimizer("momentum", 0.05)
  replay = async_sim.make_replay(graphdef, rest, tx, 9)
  ev = sync.make_evaluator(graphdef, rest)
  idx = data.batch_indices(digits.n_train, 8, 40, seed=7)
  runs = {
    (m, tau): async_sim.run_async(
      replay,
      params,
      tx,
      digits,
      async_sim.fixed_tau_schedule(tau, 40),
      idx,
      buffer_size=9,
      method=m,
      chunk=40,
      evaluate=ev,
    ).losses
    for m in ("async", "dcasgd")
    for tau in (0, 8)
  }
  np.testing.assert_array_equal(runs["async", 0], runs["dcasgd", 0])
  assert np.abs(runs["async", 8] - runs["async", 0]).max() > 1e-3
  assert np.abs(runs["dcasgd", 8] - runs["async", 8]).max() > 0


def test_replay_rejects_staleness_beyond_the_buffer(digits):
  graphdef, params, rest = _mlp()
  tx = models.make_optimizer("sgd", 0.1)
  replay = async_sim.make_replay(graphdef, rest, tx, 4)
  with pytest.raises(ValueError, match="buffer_size"):
    async_sim.run_async(
      replay,
      params,
      tx,
      digits,
      async_sim.fixed_tau_schedule(5, 10),
      data.batch_indices(digits.n_train, 8, 10, 0),
      buffer_size=4,
      evaluate=sync.make_evaluator(graphdef, rest),
    )


# ------------------------------------------------------------------ straggler math


@pytest.mark.parametrize("n,b", [(8, 0), (16, 0), (8, 2), (16, 4)])
def test_sync_step_under_exponential_times_is_harmonic(n, b):
  s = async_sim.sync_schedule("exponential", n, 40_000, seed=n + b, backups=b)
  expected = async_sim.harmonic(n) - async_sim.harmonic(b)
  se = s.step_time.std() / np.sqrt(s.step_time.size)
  assert abs(s.step_time.mean() - expected) < 4 * se, (s.step_time.mean(), expected, se)
  assert s.mask.sum(1).tolist() == [n - b] * 40_000


def test_harmonic_values():
  assert round(async_sim.harmonic(8), 3) == 2.718 and round(async_sim.harmonic(16), 3) == 3.381


@pytest.mark.parametrize("model", async_sim.COMPUTE_MODELS)
def test_async_mean_staleness_is_n_minus_1(model):
  s = async_sim.event_schedule(model, 8, 30_000, seed=1)
  assert abs(s.staleness.mean() - 7) < 0.2
  assert (np.diff(s.time) >= 0).all()


def test_slow_worker_dominates_sync_and_backups_recover():
  plain = async_sim.sync_schedule("slow", 8, 2000, seed=0).step_time.mean()
  backup = async_sim.sync_schedule("slow", 8, 2000, seed=0, backups=1).step_time.mean()
  assert 3.9 < plain < 4.1 and backup < 1.1
  a = async_sim.event_schedule("slow", 8, 20_000, seed=0)
  assert (a.worker == 0).mean() < 0.5 / 8  # the slow worker contributes ~1/4 as often


def test_allreduce_time_falls_back_or_uses_cost_model():
  us, source = experiments.allreduce_time_us("ring", 8, 40_000)
  assert us > 0 and source in ("cost_model", "constant")
  assert experiments.allreduce_time_us("ring", 1, 40_000) == (0.0, "none")


# ------------------------------------------------------------------ sweeps, results, CLI


def test_sweep_resumes_without_redoing_or_losing_runs(tmp_path):
  cfg = experiments.StalenessConfig.smoke(updates=20, eval_every=10)
  lines = []
  first = experiments.run_staleness_sweep(cfg, tmp_path, max_runs=2, log=lines.append)
  assert len(first) == 2 and len(lines) == 2
  path = tmp_path / "staleness.jsonl"
  with open(path, "a") as f:
    f.write('{"key": "half-writ')  # the process died mid-write
  lines.clear()
  rows = experiments.run_staleness_sweep(cfg, tmp_path, log=lines.append)
  assert len(lines) == len(cfg.arms()) - 2  # only the missing runs ran
  assert len(rows) == len(cfg.arms())
  assert rows[:2] == first  # finished rows untouched
  stored = Results(path).rows()
  assert len({r["key"] for r in stored}) == len(stored) == len(cfg.arms())
  before = path.read_text()
  lines.clear()
  experiments.run_staleness_sweep(cfg, tmp_path, log=lines.append)
  assert lines == [] and path.read_text() == before


@pytest.mark.parametrize(
  "make, name",
  [
    (lambda: experiments.StalenessConfig(taus=(-1,)), "taus"),
    (lambda: experiments.StalenessConfig(methods=("nope",)), "methods"),
    (lambda: experiments.StragglerConfig(backups=(8,)), "backups"),
    (lambda: experiments.StragglerConfig(compute_models=("gamma",)), "compute_models"),
    (lambda: experiments.SyncConfig(algorithm="fastest"), "algorithm"),
    (lambda: experiments.SyncConfig(learning_rate=-1.0), "learning_rate"),
    (lambda: experiments.SyncConfig(model="resnet"), "model"),
    (lambda: async_sim.event_schedule("exponential", 0, 10, 0), "n_workers"),
    (lambda: async_sim.sync_schedule("exponential", 4, 10, 0, backups=4), "backups"),
    (lambda: models.make_optimizer("rmsprop", 0.1), "optimizer"),
  ],
)
def test_bad_input_names_the_argument(make, name):
  with pytest.raises(ValueError, match=name):
    make()


def test_sync_rejects_too_many_workers():
  with pytest.raises(ValueError, match="workers"):
    experiments.run_sync(experiments.SyncConfig.smoke(workers=64))


def test_cli_train_smoke(tmp_path, capsys):
  assert cli_main(["train", "sync", "--smoke", "--workers", "4", "--out", str(tmp_path)]) == 0
  assert "replicas identical: True" in capsys.readouterr().out
  row = json.loads((tmp_path / "sync.jsonl").read_text().splitlines()[0])
  assert row["config"]["steps"] == 40 and row["replicas_identical"]
  with pytest.raises(SystemExit):  # --taus belongs to `train staleness`
    cli_main(["train", "sync", "--smoke", "--taus", "1,2", "--out", str(tmp_path)])
  assert "--taus" in capsys.readouterr().err
  assert cli_main(["train", "stragglers", "--smoke", "--backups", "9", "--out", str(tmp_path)]) == 2
  assert "backups" in capsys.readouterr().err
