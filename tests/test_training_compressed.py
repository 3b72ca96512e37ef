"""Table C's compressed arms: registered, priced by closed forms, and the optimizer
route with an exact all-reduce trains bit for bit like the sync arm.

References: the sync arm's own training (a different code path: the masked all-reduce
of gradient, loss and count in the step), the ring's closed form 2(p − 1)/p · bytes per
participant, the ring all-gather's (p − 1) · block, and PowerSGD's own state (the
warm-start Q of every matrix it compresses).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from allreduce_jax import powersgd
from allreduce_jax.training import arms, catalogue, compressed, configs, experiments, tables

# The digits MLP: 64 -> 128 -> 10, kernels first dimension = fan-in.
MLP_SHAPES = [(64, 128), (128,), (128, 10), (10,)]
MLP_N = 64 * 128 + 128 + 128 * 10 + 10
WL = arms.get_workload("digits_mlp", smoke=True)
SMALL = arms.Setup(workers=4, batch_per_worker=16, gradients=48, eval_every=4, speeds=())


def test_every_compressed_arm_is_registered():
  assert catalogue  # the import fills the registry
  for name, c in compressed.COMPRESSED_ARMS.items():
    arm = arms.get_arm(name)
    assert arm.family == "compressed", name
    assert (arm.bind is not None) == (c.kind in ("powersgd", "topk")), name  # shapes priced
    assert arm.summary
  cfg = configs.TableCConfig(arms=tuple(compressed.COMPRESSED_ARMS))
  assert set(cfg.arms) == set(compressed.COMPRESSED_ARMS)


def test_an_unbound_compressed_arm_says_so():
  setup = arms.Setup(workers=4, model_params=MLP_N)
  with pytest.raises(ValueError, match="bind it first"):
    arms.get_arm("powersgd_r4").comm_seconds(setup)


def test_mlp_shapes_are_the_workloads():
  wl = arms.get_workload("digits_mlp", smoke=True)
  assert sorted(compressed.leaf_shapes(wl)) == sorted(MLP_SHAPES)


@pytest.mark.parametrize("rank", [1, 2, 4])
def test_powersgd_counts_match_its_state(rank):
  """P carries n·r per compressed matrix plus the leaves left exact; Q carries m·r: the
  compressed matrices are exactly those PowerSGD keeps a warm-start Q for."""
  params = [np.zeros(s, np.float32) for s in MLP_SHAPES]
  qs = powersgd("i", rank=rank).init(params).q
  comp = [s for s in MLP_SHAPES if compressed.powersgd_matrix(s, rank) is not None]
  assert [q.shape for q in qs] == [(math.prod(s[1:]), rank) for s in comp]
  exact = MLP_N - sum(math.prod(s) for s in comp)
  got = compressed.collectives(compressed.Compression("powersgd", rank=rank), MLP_SHAPES)
  assert got == [
    ("all_reduce", exact + sum(s[0] * rank for s in comp)),
    ("all_reduce", sum(q.shape[0] * rank for q in qs)),
  ]


def test_bytes_per_sample_match_the_closed_forms():
  p, B = 4, 16
  setup = arms.Setup(workers=p, batch_per_worker=B, model_params=MLP_N)
  ring = 2 * (p - 1) / p  # a ring all-reduce: bytes each participant sends per byte
  per = lambda name: arms.bound(arms.get_arm(name), WL).bytes_per_sample(setup)  # noqa: E731
  sync = arms.get_arm("sync").bytes_per_sample(setup)
  assert sync == pytest.approx(p * ring * 4 * MLP_N / (p * B))
  assert per("sync_bf16") == pytest.approx(sync / 2)
  c = MLP_N // p  # int8: one 4-byte scale per 256 elements of each message
  assert per("sync_int8") == pytest.approx(sync / 4 * (c + 4 * math.ceil(c / 256)) / c)
  for r in (1, 4):  # (n + m)·r·4 per matrix, plus the exact leaves, each all-reduced
    p_words = (MLP_N - 64 * 128 - 128 * 10) + (64 + 128) * r
    q_words = (128 + 10) * r
    want = p * ring * 4 * (p_words + q_words) / (p * B)
    assert per(f"powersgd_r{r}") == pytest.approx(want)
  k = sum(math.ceil(0.01 * math.prod(s)) for s in MLP_SHAPES)  # 82 + 2 + 13 + 1
  assert per("topk1") == pytest.approx(p * (p - 1) * 8 * k / (p * B))
  assert per("topk1_noef") == per("topk1")
  # A virtual size scales the counts: 10x the parameters, 10x the bytes.
  big = dataclasses.replace(setup, model_params=10 * MLP_N)
  assert arms.bound(arms.get_arm("powersgd_r4"), WL).bytes_per_sample(big) == pytest.approx(
    10 * per("powersgd_r4"), rel=1e-3
  )


def test_exact_through_the_optimizer_is_the_sync_arm_bit_for_bit():
  """``all_reduce_gradients`` chained before the optimizer, with no wire, trains exactly
  like the sync arm's masked all-reduce in the step (XLA's psum: its sum does not
  depend on the bucket's layout)."""
  setup = dataclasses.replace(SMALL, algorithm="psum")
  exact = compressed.compressed_arm("exact_tx", compressed.Compression("exact"))
  a = arms.run_arm(arms.get_arm("sync"), setup, WL, seed=1)
  b = arms.run_arm(exact, setup, WL, seed=1)
  assert b["test_metric"] == a["test_metric"]
  assert b["final_loss"] == a["final_loss"]  # the mean of the last window's losses, bitwise
  assert b["eval_time"] == a["eval_time"] and b["bytes_per_sample"] == a["bytes_per_sample"]


def test_compressed_rows_have_their_fields_and_render(tmp_path):
  names = ("sync", "sync_int8_two_shot", "powersgd_r1", "topk1")
  cfg = configs.TableCConfig.smoke(**{**dataclasses.asdict(SMALL), "arms": names})
  rows = experiments.run_table_c(cfg, tmp_path, smoke=True, log=lambda s: None)
  by = {r["arm"]: r for r in rows}
  assert set(by) == set(names)
  for name in names[1:]:
    r = by[name]
    assert r["family"] == "compressed" and r["replicas_identical"] is True
    assert r["compression"] == compressed.COMPRESSED_ARMS[name].kind
    assert 0 < r["bytes_per_sample"] < by["sync"]["bytes_per_sample"]
    assert r["bytes_vs_sync"] == pytest.approx(
      r["bytes_per_sample"] / by["sync"]["bytes_per_sample"]
    )
    assert r["bytes_per_sample_measured"] == pytest.approx(r["bytes_per_sample"])
    assert np.isfinite(r["final_metric"]) and len(r["test_metric"]) == len(r["eval_time"])
  assert by["sync_int8_two_shot"]["compression_algorithm"] == "two_shot"
  md = experiments.write_table_c_outputs(rows, cfg, tmp_path)[0].read_text()
  assert "## Compressed all-reduce next to sync" in md
  table = tables.compression_table(rows)
  assert table.count("\n") == 1 + len(names)  # header, rule, one line per arm
  assert "PowerSGD r = 1" in table and "int8 wire, two_shot" in table
