"""``--smoke`` runs of the bench, fusion and scaling subcommands: structure and
correctness of the rows, not timings."""

import json

import jax
import pytest

from allreduce_jax import cost_model, topology
from allreduce_jax.cli import main
from allreduce_jax.tools import bench

# Start the 8-device backend now: a command's --devices 2 must not shrink it for later tests.
jax.devices()


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


def test_scaling_smoke(tmp_path, monkeypatch):
  monkeypatch.setenv(cost_model.FIT_ENV_VAR, str(tmp_path / "none.json"))  # no local fit
  out = tmp_path / "scaling.jsonl"
  assert main(["scaling", "--smoke", "--out", str(out)]) == 0
  rows = _rows(out)
  # every hand-written algorithm whose record has a two-level model (naive is not swept)
  want = {"ring", "tree", "recursive_doubling", "halving_doubling", "hierarchical"}
  assert {r["algorithm"] for r in rows} == want
  assert {r["p"] for r in rows} == {8, 16, 32, 64}
  assert all(r["predicted_us"] > 0 for r in rows)
  with pytest.raises(SystemExit, match="--inner"):
    main(["scaling", "--smoke", "--inner", "fast", "--out", str(out)])


# ---------------------------------------------------------------------------- rows and resume

TINY = ["--min-bytes", "1KiB", "--max-bytes", "1KiB", "--no-uneven", "--iters", "2"]
TINY += ["--warmup", "0"]


def _bench(tmp_path, *extra, algorithms="ring,psum", devices="2"):
  out = tmp_path / "bench.jsonl"
  argv = ["bench", "--devices", devices, "--algorithms", algorithms, *TINY, "--out", str(out)]
  return main([*argv, *extra]), out


def _rekey(path, **change):
  """Rewrites every row's key as if measured under another configuration."""
  rows = _rows(path)
  for r in rows:
    r["key"] = json.dumps({**json.loads(r["key"]), **change}, sort_keys=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_bench_resumes_only_rows_of_the_same_configuration(tmp_path, monkeypatch):
  monkeypatch.setenv(cost_model.FIT_ENV_VAR, str(tmp_path / "none.json"))
  assert _bench(tmp_path)[0] == 0
  rc, out = _bench(tmp_path)
  assert rc == 0 and len(_rows(out)) == 2  # same configuration: nothing measured
  _rekey(out, process_count=4)  # rows of a 4-process launch
  assert _bench(tmp_path)[0] == 0
  assert len(_rows(out)) == 4  # measured again, not reprinted


def test_bench_iters_and_warmup_are_part_of_the_key(tmp_path, monkeypatch):
  monkeypatch.setenv(cost_model.FIT_ENV_VAR, str(tmp_path / "none.json"))
  _, out = _bench(tmp_path)
  _bench(tmp_path, "--iters", "3")
  _bench(tmp_path, "--warmup", "1")
  keys = [json.loads(r["key"]) for r in _rows(out)]
  assert len(keys) == 6
  assert {(k["iters"], k["warmup"]) for k in keys} == {(2, 0), (3, 0), (2, 1)}
  assert {k["process_count"] for k in keys} == {1} and {k["n_devices"] for k in keys} == {2}
  assert all(k["jax_version"] and k["backend"] == "cpu" for k in keys)


def test_auto_rows_are_keyed_on_the_cost_parameters(tmp_path, monkeypatch):
  fit = tmp_path / "cost_params.json"
  monkeypatch.setenv(cost_model.FIT_ENV_VAR, str(fit))
  _, out = _bench(tmp_path, algorithms="auto,ring")
  _bench(tmp_path, algorithms="auto,ring")
  assert len(_rows(out)) == 2
  fitted = cost_model.FittedParams(cost_model.Params(1e-3, 1e-9, 0.0), {}, {})
  cost_model.save_params(fitted, fit)  # a new fit: auto may choose differently
  _bench(tmp_path, algorithms="auto,ring")
  assert [r["algorithm"] for r in _rows(out)] == ["auto", "ring", "auto"]


def test_single_size_sweep_plots(tmp_path, monkeypatch):
  monkeypatch.setenv(cost_model.FIT_ENV_VAR, str(tmp_path / "none.json"))
  out = tmp_path / "b.jsonl"
  argv = ["bench", "--devices", "2", "--algorithms", "ring,psum", "--min-bytes", "4KiB"]
  argv += ["--max-bytes", "4KiB", "--iters", "2", "--warmup", "0", "--out", str(out)]
  assert main(argv) == 0
  assert out.with_suffix(".png").stat().st_size > 0


def test_bench_on_one_device(tmp_path, monkeypatch):
  monkeypatch.setenv(cost_model.FIT_ENV_VAR, str(tmp_path / "none.json"))
  rc, out = _bench(tmp_path, devices="1")
  assert rc == 0
  assert [(r["n_devices"], r["wrong"]) for r in _rows(out)] == [(1, 0), (1, 0)]


def test_float64_without_x64_is_refused(tmp_path, capsys):
  with pytest.raises(SystemExit):
    _bench(tmp_path, "--dtype", "float64")
  assert "JAX_ENABLE_X64=1" in capsys.readouterr().err
  assert not (tmp_path / "bench.jsonl").exists()


def test_torn_line_then_resume(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv(cost_model.FIT_ENV_VAR, str(tmp_path / "none.json"))
  _, out = _bench(tmp_path)
  text = out.read_text()
  out.write_text(text[: len(text) - 40])  # killed while writing the second row
  assert _bench(tmp_path)[0] == 0
  assert "half-written" in capsys.readouterr().err
  rows = _rows(out)  # every line is whole JSON again; only the lost row was measured
  assert [r["algorithm"] for r in rows] == ["ring", "psum"]


@pytest.mark.parametrize(
  "content, message",
  [('{"algorithm": "ring"}\n', "is not an allreduce-jax row"), ("a,b\n1,2\n", "not JSON")],
)
def test_foreign_out_is_refused_and_kept(tmp_path, content, message):
  out = tmp_path / "bench.jsonl"
  out.write_text(content)
  for extra in ([], ["--fresh"]):
    with pytest.raises(SystemExit, match=f"--out: .*bench.jsonl: .*{message}"):
      _bench(tmp_path, *extra)
    assert out.read_text() == content


def test_out_must_be_jsonl_and_fresh_never_deletes_a_users_file(tmp_path):
  notes = tmp_path / "notes.csv"
  notes.write_text("my,notes\n")
  argv = ["bench", "--devices", "2", "--algorithms", "ring", *TINY, "--out", str(notes)]
  for extra in ([], ["--fresh"]):
    with pytest.raises(SystemExit, match=r"notes\.csv: rows are written to \.jsonl files only"):
      main([*argv, *extra])
  assert notes.read_text() == "my,notes\n"


def test_unwritable_out_fails_before_measuring(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("")
  out = blocker / "bench.jsonl"
  for opt in ("--out", "--plot"):
    argv = ["bench", "--devices", "2", "--algorithms", "ring", *TINY, "--out", str(out)]
    if opt == "--plot":
      argv[-1] = str(tmp_path / "b.jsonl")
      argv += ["--plot", str(blocker / "b.png")]
    with pytest.raises(SystemExit, match=f"{opt}.*cannot create"):
      main(argv)
  assert not (tmp_path / "b.jsonl").exists()  # nothing measured, nothing written


def test_fusion_resume_and_foreign_out(tmp_path):
  out = tmp_path / "fusion.jsonl"
  argv = ["fusion", "--devices", "2", "--models", "cnn", "--algorithms", "psum", "--iters", "2"]
  argv += ["--warmup", "0", "--buckets", "per-leaf,one", "--out", str(out)]
  assert main(argv) == 0
  assert main(argv) == 0
  assert len(_rows(out)) == 2  # resumed
  assert main([*argv, "--iters", "3"]) == 0
  assert len(_rows(out)) == 4  # another configuration: measured
  bench_rows = tmp_path / "bench.jsonl"
  bench_rows.write_text(out.read_text().replace('"kind": "fusion"', '"kind": "bench"'))
  with pytest.raises(SystemExit, match="holds 'bench' rows, not 'fusion' rows"):
    main([*argv[:-1], str(bench_rows)])


def test_wire_bytes_of_every_record_at_the_mesh_bench_builds():
  # bench's rows carry wire_bytes_per_element for every algorithm, multi-axis ones
  # included (hierarchical once raised "needs inner sizes" there: the report's bench
  # section failed on it).
  from allreduce_jax import ALGORITHMS, devices, names

  n = 1 << 12
  for name in names(hand_written=True):
    record = ALGORITHMS[name]
    if record.schedule is None or not devices.fits(name, 8):
      continue
    inner = devices.inner_size(name, 8)
    got = record.wire_bytes(8, None, n, 4, inner)
    assert got == record.schedule(8, 4.0 * n, inner).max_sent_bytes / n, name


def test_nccl_tests_flags_sweep_every_op_and_dtype_check_and_devices(tmp_path, capsys):
  out = tmp_path / "bench.jsonl"
  one = ["--algorithms", "ring,psum", "-b", "1KiB", "-e", "1KiB", "--no-uneven", "-n", "1",
         "-w", "0", "--out", str(out)]  # fmt: skip
  # -o all -d int32,float32: every pair but mean of integers, each checked against psum.
  assert main(["bench", "-g", "2", *one, "-o", "all", "-d", "int32,float32"]) == 0
  text = capsys.readouterr().out
  assert "# skipping mean×int32: all_reduce does not define them" in text
  rows = _rows(out)
  pairs = [(r["dtype"], r["op"]) for r in rows[::2]]
  assert pairs == [("int32", o) for o in ("sum", "max", "min")] + [
    ("float32", o) for o in ("sum", "mean", "max", "min")
  ]
  assert [r["algorithm"] for r in rows] == ["ring", "psum"] * 7
  assert all(r["wrong"] == 0 and r["checked"] and r["n_devices"] == 2 for r in rows)
  assert all(r["time_from"] == "process 0" for r in rows)  # one process: -a changes nothing
  assert (tmp_path / "bench_max_float32.png").stat().st_size > 0  # one figure per pair
  assert out.with_suffix(".png").stat().st_size > 0  # the first pair: int32 sum
  # -c 0: measured, not checked (wrong = null), kept apart from the checked rows.
  assert main(["bench", "--devices", "2", *one, "-c", "0", "-a", "3"]) == 0
  new = _rows(out)[len(rows) :]
  assert [(r["algorithm"], r["wrong"], r["checked"]) for r in new] == [
    ("ring", None, False),
    ("psum", None, False),
  ]
  assert "# Not checked (-c 0): 2 result(s)" in capsys.readouterr().out
  with pytest.raises(SystemExit, match="-g/--ngpus 2 and --devices 4: in one process both"):
    main(["bench", "-g", "2", "--devices", "4", *one])


@pytest.mark.parametrize("average", [0, 1, 2, 3])
def test_a_combined_time_lies_inside_its_spread(average):
  """``-a``: the row's median comes with the spread of the process it came from (the
  mean of each for ``-a 1``), checked against NumPy on random per-process timings. The
  sweep on the emulated cluster died drawing ``-a 3`` rows whose max-of-medians lay
  above process 0's maximum ('yerr' must not contain negative values)."""
  import numpy as np

  rng = np.random.default_rng(average)
  t = np.sort(rng.uniform(1.0, 9.0, (5, 7, 3)), axis=-1)  # [procs, programs, min<med<max]
  stats = np.stack([t[..., 1], t[..., 0], t[..., 2], t[..., 2] - t[..., 0]], axis=-1)
  got = bench.combine_spreads(stats, average)
  want = [t[0, :, 1], t[..., 1].mean(0), t[..., 1].min(0), t[..., 1].max(0)][average]
  np.testing.assert_allclose(got[:, 0], want)
  assert np.all(got[:, 1] <= got[:, 0]) and np.all(got[:, 0] <= got[:, 2])
  if average in (0, 2, 3):  # one process's own row, all four numbers
    who = [np.zeros(7, int), t[..., 1].argmin(0), t[..., 1].argmax(0)][max(0, average - 1)]
    np.testing.assert_array_equal(got, stats[who, np.arange(7)])


def test_fit_min_bytes_keeps_the_small_rows_out(tmp_path):
  """``--fit-min-bytes``: rows below it stay out of the fit. Synthetic rows from a known
  α-β above 1 MiB and a token-bucket burst below it (4x faster than the rate): the
  fit from 1 MiB on recovers β; the fit over every row does not."""
  true = cost_model.Params(200e-6, 40e-9, 0.0)  # 25 MB/s, the emulated 200 Mbit/s link
  rows = [
    {"algorithm": a, "n_devices": 4, "bytes": n, "op": "sum", "dtype": "float32",
     "backend": "cpu", "jax_version": jax.__version__,
     "time_us": cost_model.predict_seconds(a, 4, n, true) * 1e6 / (4 if n < 1 << 20 else 1)}
    for a in ("ring", "tree") for n in (4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)
  ]  # fmt: skip
  fitted, _, table = bench.fit_and_save(rows, tmp_path / "p.json", min_bytes=1 << 20)
  assert fitted.shared.beta == pytest.approx(true.beta, rel=1e-6)
  assert {t["bytes"] for t in table} == {1 << 20, 4 << 20, 16 << 20}
  assert json.loads((tmp_path / "p.json").read_text())["meta"]["min_bytes"] == 1 << 20
  every, _, _ = bench.fit_and_save(rows, tmp_path / "q.json")
  assert abs(every.shared.beta / true.beta - 1) > 0.05
  with pytest.raises(ValueError, match="at --fit-min-bytes 1GiB or more"):
    bench.fit_and_save(rows, tmp_path / "r.json", min_bytes=1 << 30)


@pytest.mark.parametrize("order", ["round-robin", "blocks"])
def test_timer_calls_in_the_order_asked_and_times_only_after_warmup(order, monkeypatch):
  from allreduce_jax.tools import _timing

  calls = []

  def fake_compile(fn, *args):  # a "compiled" program that logs its calls
    return (lambda *a: calls.append(fn) or 0), 0.0, -1

  monkeypatch.setattr(_timing, "compile_timed", fake_compile)
  a, b = _timing.time_round_robin([("A", ()), ("B", ())], iters=3, warmup=2, order=order)
  assert len(a.times_s) == len(b.times_s) == 3  # the 2 warm-up calls each are not timed
  assert "".join(calls) == ("ABABABABAB" if order == "round-robin" else "AAAAABBBBB")
  with pytest.raises(ValueError, match="--order must be one of round-robin, blocks"):
    _timing.time_round_robin([("A", ())], order="shuffled")


def test_bench_rows_in_blocks_say_so_and_are_keyed_apart(tmp_path, monkeypatch):
  monkeypatch.setenv(cost_model.FIT_ENV_VAR, str(tmp_path / "none.json"))
  _, out = _bench(tmp_path)
  assert _bench(tmp_path, "--order", "blocks")[0] == 0
  rows = _rows(out)
  assert [r["order"] for r in rows] == ["round-robin"] * 2 + ["blocks"] * 2
  assert all(r["wrong"] == 0 for r in rows)
  keys = [json.loads(r["key"]) for r in rows]
  assert [k.get("order") for k in keys] == [None, None, "blocks", "blocks"]
  assert _bench(tmp_path, "--order", "blocks")[0] == 0 and len(_rows(out)) == 4  # resumed


def test_rows_record_the_schedules_trace_time_choices():
  """A double-tree row says which chunk count it traced with (the parameters the bench
  ran under choose it), so a model prices the schedule that ran; others record none."""
  from allreduce_jax import _dbtree

  n = 1 << 20
  cpu = cost_model.FittedParams.from_json(cost_model.CPU_FIT)
  for params in (cost_model.DEFAULT_PARAMS, cpu):
    rows = bench.measure_size(["double_binary_tree", "ring", "auto"], 8, n, iters=1, warmup=0,
                              params=params)  # fmt: skip
    dbt, ring, auto = rows
    assert dbt["wrong"] == 0 and dbt["choices"] == {"chunks": _dbtree.choose_chunks(8, n, params)}
    assert ring["choices"] is None
    with cost_model.use_params(params):  # auto's row: the choices of the algorithm it chose
      assert auto["choices"] == (topology.trace_choices(auto["chosen"], 8, n) or None)
