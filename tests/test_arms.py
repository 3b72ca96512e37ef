"""The arms harness: SSP between sync and async, the parameter-server queue's closed
form, the slow-node mitigations, Table C and the phase diagram.

Schedules are checked against independent references: the order statistics of the
same compute times (sync), a straightforward heap replay of asynchronous SGD
(the seed's simulator), and the link model's closed-form rate.
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np
import pytest

from allreduce_jax import cost_model
from allreduce_jax.cli import main as cli_main
from allreduce_jax.training import arms, async_sim, configs, experiments, families, tables
from allreduce_jax.training.results import Results

MODELS = ("exponential", "lognormal:1.0", "pareto:1.5", "slow:4", "constant")


def _reference_async(model, n, T, seed):
  """Plain async SGD with free communication: a worker's gradient is applied the
  moment it finishes and the worker reads the new version (the seed's heap loop)."""
  times = async_sim.ComputeTimes(model, n, seed)
  used = [0] * n

  def nxt(i):
    used[i] += 1
    return times(i, used[i] - 1)

  heap = [(nxt(i), i, 0) for i in range(n)]
  heapq.heapify(heap)
  stal, when, version = [], [], 0
  while version < T:
    t, i, read = heapq.heappop(heap)
    stal.append(version - read)
    when.append(t)
    version += 1
    heapq.heappush(heap, (t + nxt(i), i, version))
  return np.array(stal), np.array(when)


@pytest.mark.parametrize("model", MODELS)
def test_ssp_infinite_bound_is_async_bit_for_bit(model):
  n, T = 6, 600
  stal, when = _reference_async(model, n, T, seed=3)
  times = lambda: async_sim.ComputeTimes(model, n, 3)  # noqa: E731
  plain = async_sim.ps_schedule(times(), T)
  huge = async_sim.ps_schedule(times(), T, staleness_bound=10**9)
  np.testing.assert_array_equal(plain.staleness, stal)
  np.testing.assert_array_equal(plain.time, when)
  for f in ("staleness", "worker", "time", "read"):
    np.testing.assert_array_equal(getattr(huge, f), getattr(plain, f))
  # ... also with communication through the server's queue
  kw = {"push_s": 0.3, "pull_s": 0.2, "duplex": False}
  a = async_sim.ps_schedule(times(), T, **kw)
  b = async_sim.ps_schedule(times(), T, staleness_bound=10**9, **kw)
  np.testing.assert_array_equal(a.time, b.time)
  np.testing.assert_array_equal(a.staleness, b.staleness)


@pytest.mark.parametrize("model", MODELS)
def test_ssp_zero_bound_is_sync_bit_for_bit(model):
  n, S = 5, 120
  ssp = async_sim.ps_schedule(async_sim.ComputeTimes(model, n, 7), n * S, staleness_bound=0)
  sync = async_sim.sync_schedule(model, n, S, seed=7)
  # Round k ends when its last gradient is applied, at sync's time of step k ...
  np.testing.assert_array_equal(ssp.time.reshape(S, n).max(axis=1), sync.time)
  # ... and every gradient of round k was computed at the parameters after round k-1.
  np.testing.assert_array_equal(ssp.read.reshape(S, n), np.repeat(np.arange(S)[:, None] * n, n, 1))
  np.testing.assert_array_equal(ssp.clock.reshape(S, n), np.repeat(np.arange(S)[:, None], n, 1))


def test_ssp_bound_limits_the_lead_and_staleness():
  n, T, s = 8, 4000, 2
  sched = async_sim.ps_schedule(async_sim.ComputeTimes("slow:8", n, 0), T, staleness_bound=s)
  free = async_sim.ps_schedule(async_sim.ComputeTimes("slow:8", n, 0), T)
  assert sched.staleness.max() < free.staleness.max()
  assert sched.staleness.max() <= (s + 1) * n  # at most s+1 clocks of N updates in flight
  assert sched.time[-1] > free.time[-1]  # the fast workers wait for the slow one


@pytest.mark.parametrize("duplex, shards", [(True, 1), (False, 1), (True, 4), (False, 2)])
def test_parameter_server_queue_matches_its_closed_form(duplex, shards):
  """N workers, zero compute, one server link: updates per second = bandwidth / bytes
  per direction (full duplex), half that on a shared link, × S with S shards."""
  n, model_bytes, bw = 8, 4e8, 12.5e9  # 100 M float32 parameters on 100 GbE
  msg = model_bytes / shards / bw  # one message through one shard's link
  zero = async_sim.ComputeTimes("exponential", n, 0, scale=np.zeros(n))
  sched = async_sim.ps_schedule(zero, 400, push_s=msg, pull_s=msg, duplex=duplex)
  i, j = 200, 200 + 24 * n  # steady state, same phase of the (period-N) pattern
  rate = (j - i) / (sched.time[j] - sched.time[i])
  expected = bw / model_bytes * shards * (1.0 if duplex else 0.5)
  assert rate == pytest.approx(expected, rel=1e-9)


def test_arms_price_the_same_ps_link():
  setup = arms.Setup(model_params=100_000_000, network="100gbe", server_shards=4)
  q = cost_model.PRESETS["100gbe"]
  assert arms.ps_message_seconds(setup) == pytest.approx(q.alpha + q.beta * 4e8 / 4)
  assert arms.get_arm("async").bytes_per_sample(setup) == pytest.approx(2 * 4e8 / 16)
  ring = arms.allreduce_seconds(setup)
  assert ring == pytest.approx(cost_model.predict_seconds("ring", 8, 4e8, q))
  assert arms.get_arm("sync").bytes_per_sample(setup) == pytest.approx(2 * 7 * 4e8 / (8 * 16))
  fast = dataclasses.replace(setup, bandwidth_GBps=1000.0)
  assert arms.allreduce_seconds(fast) < ring


def _small_setup(**kw):
  base = dict(workers=4, gradients=400, model_params=10_000, compute="lognormal:0.5")
  return arms.Setup(**{**base, **kw})


@pytest.mark.parametrize(
  "name", ["sync", "sync_b1", "sync_ov", "sync_b1_ov", "sync_balanced", "sync_isolate", "async"]
)
def test_every_arm_schedule_is_consistent(name):
  arm = arms.get_arm(name)
  setup = _small_setup(speeds=(1.0, 1.0, 1.0, 0.25))
  tl = arm.make_schedule(setup, 0)
  assert (np.diff(tl.time) >= 0).all() and tl.time[0] > 0
  assert tl.gradients[-1] <= setup.gradients
  if name != "sync_isolate":  # isolation all-reduces over fewer workers
    measured = tl.bytes_sent / (len(tl.time) * tl.samples)
    assert measured == pytest.approx(arm.bytes_per_sample(setup))


def test_mitigations_beat_plain_sync_under_a_slow_node():
  setup = _small_setup(speeds=(1.0, 1.0, 1.0, 0.25), compute="lognormal:0.1")
  t = {a: arms.get_arm(a).make_schedule(setup, 0).time[-1] for a in arms.ARMS if "sync" in a}
  for mitigation in ("sync_b1", "sync_balanced", "sync_isolate"):
    assert t[mitigation] < 0.5 * t["sync"], t
  isolated = arms.get_arm("sync_isolate").make_schedule(setup, 0).info["isolated"]
  assert list(isolated) == ["3"]  # the slow worker, and only it
  assert families.balanced_batches(64, np.array([1.0, 1.0, 1.0, 0.25])).sum() == 64


def test_ssp_arm_names_build_on_demand():
  assert arms.get_arm("ssp7").summary.endswith("s=7")
  with pytest.raises(ValueError, match="not registered"):
    arms.get_arm("hogwild")


def test_table_c_smoke_resumes_and_renders(tmp_path, capsys):
  argv = ["train", "table-c", "--smoke", "--arms", "sync,async", "--gradients", "80"]
  assert cli_main([*argv, "--out", str(tmp_path)]) == 0
  out = capsys.readouterr().out
  assert "| digits_mlp | async |" in out and (tmp_path / "table_c_curves.png").stat().st_size
  rows = Results(tmp_path / "table_c.jsonl").rows()
  assert [r["arm"] for r in rows] == ["sync", "async"]
  assert all(r["eval_time"][-1] == pytest.approx(r["total_time"], rel=1e-4) for r in rows)
  before = (tmp_path / "table_c.jsonl").read_text()
  assert cli_main([*argv, "--out", str(tmp_path)]) == 0  # resumes: nothing new
  assert (tmp_path / "table_c.jsonl").read_text() == before


def test_phase_cells_pick_the_fastest_arm():
  cfg = configs.PhaseConfig.smoke()
  rows = [
    {"arm": a, "sigma": s, "bandwidth_GBps": bw, "seed": 0, "updates_to_target": 1,
     "time_to_target": t}
    for s in cfg.sigmas
    for bw in cfg.bandwidths_GBps
    for a, t in (("sync", 1.0 + s), ("async", 1.5 if bw > 1 else 9.0))
  ]  # fmt: skip
  cells = experiments.phase_cells(cfg, rows)
  win = {(c["sigma"], c["bandwidth_GBps"]): c["winner"] for c in cells}
  assert win == {
    (0.0, 0.1): "sync",
    (0.0, 100.0): "sync",
    (1.0, 0.1): "sync",
    (1.0, 100.0): "async",
  }
  assert "| 0.1 |" in tables.phase_table(cells)
  assert "- σ = 1: **sync** at 0.1 GB/s" in tables.phase_boundary(cells)
  assert "**async** at 100 GB/s" in tables.phase_boundary(cells)


def test_phase_sweep_reuses_identical_training(tmp_path):
  cfg = configs.PhaseConfig.smoke(sigmas=(0.5,), gradients=80, eval_every=5)
  lines = []
  rows = experiments.run_phase(cfg, tmp_path, smoke=True, log=lines.append)
  assert len(rows) == len(lines) == 4  # 2 bandwidths × (sync, async)
  sync = [r for r in rows if r["arm"] == "sync"]
  assert sync[0]["final_metric"] == sync[1]["final_metric"]  # one training, two prices
  assert sync[0]["final_loss"] == sync[1]["final_loss"]
  assert sync[0]["time_to_target"] > sync[1]["time_to_target"]  # slower link, later


def test_cli_options_come_from_the_config_fields():
  import argparse

  from allreduce_jax.tools import train

  parser = argparse.ArgumentParser()
  train.configure(parser)
  argv = ["table-c", "--smoke", "--no-duplex", "--bandwidth", "none", "--speeds", "1,1,1,0.5"]
  args = parser.parse_args([*argv, "--arms", "sync,ssp3", "--server-shards", "2"])
  cfg = train.config_from_arguments(configs.TableCConfig, args, smoke=args.smoke)
  assert cfg.duplex is False and cfg.bandwidth_GBps is None and cfg.server_shards == 2
  assert cfg.speeds == (1.0, 1.0, 1.0, 0.5) and cfg.arms == ("sync", "ssp3")
  assert cfg.gradients == configs.TableCConfig.smoke().gradients  # unset: the smoke preset
  with pytest.raises(SystemExit):
    parser.parse_args(["phase", "--sigmas", "a,b"])
  bw = parser.parse_args(["phase", "--bandwidth", "100Gbit", "--bandwidths", "8Gbit,2GB/s"])
  assert bw.bandwidth_GBps == 12.5 and bw.bandwidths_GBps == (1.0, 2.0)  # GB/s


@pytest.mark.parametrize(
  "argv, message",
  [
    (["table-c", "--bandwidth-gbps", "100"], "--bandwidth-gbps was renamed --bandwidth"),
    (["phase", "--bandwidths-gbps", "1,10"], "--bandwidths-gbps was renamed --bandwidths"),
    (["table-c", "--bandwidth", "100"], "--bandwidth '100' has no unit"),
  ],
)
def test_rate_options_say_their_unit(argv, message, capsys):
  import argparse

  from allreduce_jax.tools import train

  parser = argparse.ArgumentParser()
  train.configure(parser)
  with pytest.raises(SystemExit) as e:
    parser.parse_args(argv)
  assert e.value.code == 2 and message in capsys.readouterr().err
  with pytest.raises(ValueError, match="speeds"):
    configs.TableCConfig(speeds=(1.0, 2.0))


def test_table_b_arms_reproduce_its_schedules_from_the_simulator():
  """Table B through the arms: the uncharged parameter-server arm is
  ``async_sim.event_schedule`` and the sync arm on the gradient clock is
  ``sync_schedule`` with the all-reduce ``predict_us / compute_us`` (the pre-arms
  runner's two computations, as independent references), bit for bit."""
  cfg = configs.StragglerConfig.smoke()
  n, seed, bytes_ = 4, 3, 4 * 5000
  setup = dataclasses.replace(experiments.straggler_setup(cfg, n, "exponential"), model_params=5000)
  tl = experiments.straggler_arm(cfg, "async").make_schedule(setup, seed)
  want = async_sim.event_schedule("exponential", n, setup.gradients, 2000 + seed, cfg.max_staleness)
  assert np.array_equal(tl.time, want.time) and np.array_equal(tl.plan.staleness, want.staleness)
  ar = cost_model.predict_us(cfg.algorithm, n, bytes_, inner=None) / cfg.compute_us
  steps = setup.gradients // n
  for b in (0, 1):
    tl = experiments.straggler_arm(cfg, "sync" if b == 0 else f"sync_b{b}").make_schedule(
      setup, seed
    )
    want = async_sim.sync_schedule(
      "exponential", n, steps, 2000 + seed, backups=b, allreduce_time=ar
    )
    assert np.array_equal(tl.step_time, want.step_time) and np.array_equal(tl.plan, want.mask)


def _overlap_reference(setup, compute, buckets, b, h):
  """The overlapped step's exposed communication in closed form: K equal stages of the
  backward ``b·c``, K buckets of ``a`` each; the schedule hides
  ``min((K − 1)·a, (K − 1)·b·c / K)``, of which ``h`` does."""
  a = cost_model.predict_seconds(
    setup.algorithm, setup.workers, 4.0 * -(-setup.model_params // buckets), arms.link(setup)
  )
  hideable = np.minimum((buckets - 1) * a, (buckets - 1) * b * compute / buckets)
  return buckets * a - h * hideable, a


@pytest.mark.parametrize("backups", [0, 1])
def test_overlapped_sync_is_sync_with_only_the_exposed_communication(backups):
  setup = _small_setup(model_params=100_000_000, speeds=(1.0, 1.0, 1.0, 0.25))
  sync = families.sync_timeline(setup, 0, backups)
  ov = arms.get_arm("sync_ov" if backups == 0 else f"sync_b{backups}_ov").make_schedule(setup, 0)
  assert np.array_equal(ov.plan, sync.plan)  # the same gradients kept: the same training
  k = ov.info["buckets"]
  assert k == 16  # 400 MB in 25 MiB buckets
  compute = sync.step_time - cost_model.predict_seconds("ring", 4, 4e8, arms.link(setup))
  b, h = families.OVERLAP_BACKWARD, families.OVERLAP_HIDDEN
  exposed, a = _overlap_reference(setup, compute, k, b, h)
  np.testing.assert_allclose(ov.step_time, compute + exposed, rtol=1e-9)
  floor = compute * (1 - b) + np.maximum(b * compute + a, b * compute / k + k * a)
  assert (ov.step_time >= floor - 1e-12).all() and (ov.step_time > floor).any()
  assert (ov.step_time <= sync.step_time).all() and ov.time[-1] < sync.time[-1]
  np.testing.assert_allclose(np.cumsum(ov.step_time), ov.time)
  # One bucket (the model's real size) hides nothing: sync's clock exactly.
  small = _small_setup(model_params=10_000, speeds=(1.0, 1.0, 1.0, 0.25))
  one = arms.get_arm("sync_ov").make_schedule(small, 0)
  assert one.info["buckets"] == 1
  np.testing.assert_allclose(one.time, families.sync_timeline(small, 0).time, rtol=1e-12)


def test_overlapped_sync_trains_as_sync():
  wl = arms.get_workload("digits_mlp", smoke=True)
  setup = _small_setup(gradients=80, eval_every=5, model_params=100_000_000)
  rows = {a: arms.run_arm(arms.get_arm(a), setup, wl, 0) for a in ("sync_b1", "sync_b1_ov")}
  sync, ov = rows["sync_b1"], rows["sync_b1_ov"]
  assert ov["test_metric"] == sync["test_metric"] and ov["final_loss"] == sync["final_loss"]
  assert ov["eval_updates"] == sync["eval_updates"]
  assert all(t_ov <= t for t_ov, t in zip(ov["eval_time"], sync["eval_time"], strict=True))
  assert ov["eval_time"][-1] < sync["eval_time"][-1]
