"""``--smoke`` runs of the bench, fusion and scaling subcommands: structure and
correctness of the rows, not timings."""

import json

import pytest

from allreduce_jax import cost_model
from allreduce_jax.cli import main
from allreduce_jax.tools import bench


def _rows(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


def test_parse_size_units_and_errors():
  assert bench.parse_size("1KiB") == 1024
  assert bench.parse_size("64MiB") == 64 << 20
  assert bench.parse_size("2GB") == 2 * 10**9
  with pytest.raises(ValueError, match="--min-bytes '3XB'"):
    bench.parse_size("3XB", "--min-bytes")


def test_bad_size_argument_is_a_clear_error(tmp_path):
  with pytest.raises(SystemExit, match="--min-bytes '3XB'"):
    main(["bench", "--min-bytes", "3XB", "--out", str(tmp_path / "b.jsonl")])


def test_sweep_has_a_size_not_divisible_by_p():
  sizes = bench.sweep_sizes(1024, 1 << 20, 4, 4, 8)
  assert any((n // 4) % 8 for n in sizes)
  assert sizes[0] == 1024 and sizes[-1] == 1 << 20


def test_bench_smoke_rows_fit_and_resume(tmp_path, monkeypatch):
  monkeypatch.setenv(cost_model.FIT_ENV_VAR, str(tmp_path / "none.json"))
  out, params = tmp_path / "bench.jsonl", tmp_path / "cost_params.json"
  argv = ["bench", "--smoke", "--algorithms", "ring,recursive_doubling,psum,auto"]
  argv += ["--out", str(out), "--fit", "--params", str(params)]
  assert main(argv) == 0
  rows = _rows(out)
  assert len(rows) == 4 * 3  # 1KiB, 4KiB and one size not divisible by p
  for r in rows:
    assert set(bench.ROW_FIELDS) <= set(r)
    assert r["wrong"] == 0 and r["n_devices"] == 8 and r["time_us"] > 0
    assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * 7 / 8)
  assert {r["chosen"] for r in rows if r["algorithm"] == "auto"} <= set(
    cost_model.auto_candidates()
  )
  fitted = cost_model.load_params(params)
  assert set(fitted.per_algorithm) >= {"ring", "recursive_doubling"}
  assert out.with_suffix(".png").stat().st_size > 0
  # Resuming: a second run measures nothing new.
  assert main(argv) == 0
  assert len(_rows(out)) == len(rows)


def test_fusion_smoke(tmp_path):
  out = tmp_path / "fusion.jsonl"
  argv = ["fusion", "--smoke", "--models", "transformer", "--algorithms", "ring"]
  argv += ["--buckets", "per-leaf,64KiB,one", "--out", str(out)]
  assert main(argv) == 0
  rows = _rows(out)
  assert [r["bucket"] for r in rows] == ["per-leaf", "64KiB", "one"]
  assert all(r["wrong"] == 0 for r in rows)
  assert rows[0]["n_buckets"] == rows[0]["n_leaves"] > 20 and rows[-1]["n_buckets"] == 1
  assert rows[0]["speedup_vs_per_leaf"] == pytest.approx(1.0)
  assert out.with_suffix(".png").exists()


def test_scaling_smoke(tmp_path):
  out = tmp_path / "scaling.jsonl"
  assert main(["scaling", "--smoke", "--out", str(out), "--params", str(tmp_path / "x")]) == 0
  rows = _rows(out)
  assert {r["algorithm"] for r in rows} == {"ring", "tree", "halving_doubling", "hierarchical"}
  assert {r["p"] for r in rows} == {8, 16, 32, 64}
  assert all(r["predicted_us"] > 0 for r in rows)
  with pytest.raises(SystemExit, match="--inner"):
    main(["scaling", "--smoke", "--inner", "fast", "--out", str(out)])
