"""Every bad input or output is one line naming the option, found before
any work starts (no traceback, nothing measured)."""

import json
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import all_reduce, cost_model, devices
from allreduce_jax.cli import main

# Start the 8-device backend now: a command's --devices 2 must not shrink it for later tests.
jax.devices()


def _error(argv, capsys) -> str:
  """The one-line error a command gives (SystemExit text, or its last stderr line)."""
  try:
    rc = main(argv)
  except SystemExit as e:
    if isinstance(e.code, str):
      assert "\n" not in e.code
      return e.code
    rc = e.code
  assert rc not in (0, None)
  return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.fixture
def no_fit(tmp_path, monkeypatch):
  monkeypatch.setenv(cost_model.FIT_ENV_VAR, str(tmp_path / "none.json"))


BENCH = ["bench", "--devices", "2", "--min-bytes", "1KiB", "--max-bytes", "1KiB"]


@pytest.mark.parametrize(
  "argv, match",
  [
    (
      [*BENCH, "--dtype", "bool"],
      r"argument (-d/)?--dtype(/--datatype)?: dtype bool cannot be all-reduced",
    ),
    (
      [*BENCH, "--dtype", "int4"],
      r"argument (-d/)?--dtype(/--datatype)?: dtype int4 packs 4-bit elements",
    ),
    ([*BENCH, "--dtype", "float64"], r"argument (-d/)?--dtype(/--datatype)?: .*JAX_ENABLE_X64=1"),
    ([*BENCH, "--dtype", "nope"], r"argument (-d/)?--dtype(/--datatype)?: unknown dtype 'nope'"),
    ([*BENCH, "--algorithms", ""], r"argument --algorithms: expected some of ring"),
    ([*BENCH, "--algorithms", "ring,nope"], r"argument --algorithms: unknown algorithm 'nope'"),
    (
      [*BENCH, "--op", "prod"],
      r"argument (-o/)?--op: unsupported op 'prod'; expected sum, mean, max, min",
    ),
    ([*BENCH, "--op", "mean", "--dtype", "int32"], r"--op mean with --dtype int32: .*integer"),
    ([*BENCH, "--iters", "0"], r"argument (-n/)?--iters: must be at least 1"),
    ([*BENCH, "--devices", "0"], r"argument --devices: must be at least 1"),
    (["fusion", "--iters", "0"], r"argument (-n/)?--iters: must be at least 1"),
    (["fusion", "--algorithms", "hierarchical"], r"argument --algorithms: unknown algorithm"),
    (["fusion", "--models", ""], r"argument --models: expected some of cnn, transformer"),
    (["audit", "--ps", "0"], r"argument --ps: every value must be at least 1"),
    (["audit", "--ps", ""], r"argument --ps: expected at least one value"),
    (["audit", "--bytes", "6"], r"--bytes 6: must be a multiple of 4"),
    (["scaling", "--inner", "nan,5"], r"--inner 'nan,5': expected 'latency_us,rate'"),
    (["scaling", "--outer", "5,inf"], r"--outer '5,inf'"),
    (["scaling", "--sizes", ""], r"argument --sizes: expected at least one value"),
    (["scaling", "--sizes", ","], r"argument --sizes: expected at least one value"),
    (["scaling", "--max-p", "0"], r"argument --max-p: must be at least 1"),
    (["scaling", "--max-p", "4"], r"--max-p 4: no participant count to model"),
  ],
)
def test_bad_option_is_one_line_naming_it(argv, match, capsys, tmp_path, no_fit):
  out = tmp_path / f"{argv[0]}.jsonl"
  assert re.search(match, _error([*argv, "--out", str(out)], capsys))
  assert not out.exists()  # nothing was written


def test_scaling_params_missing_or_bad(tmp_path, capsys):
  out = ["--out", str(tmp_path / "s.jsonl")]
  missing = _error(["scaling", "--smoke", "--params", str(tmp_path / "nope.json"), *out], capsys)
  assert missing.startswith("--params ") and "no such file" in missing
  bad = tmp_path / "bad.json"
  bad.write_text('{"shared": ')
  text = _error(["scaling", "--smoke", "--params", str(bad), *out], capsys)
  assert text.startswith(f"--params {bad}: not a cost-parameter file")
  assert not (tmp_path / "s.jsonl").exists()


@pytest.mark.parametrize("command", ["bench", "fusion", "scaling", "audit"])
def test_unwritable_or_foreign_out_is_refused_before_work(command, tmp_path, capsys, no_fit):
  blocker = tmp_path / "file"
  blocker.write_text("")
  extra = {"bench": BENCH[1:], "fusion": ["--smoke"], "audit": ["--ps", "2"]}.get(command, [])
  text = _error([command, *extra, "--out", str(blocker / "x.jsonl")], capsys)
  assert text.startswith("--out: ") and "cannot create its folder" in text
  notes = tmp_path / "notes.jsonl"
  notes.write_text('{"mine": 1}\n')
  text = _error([command, *extra, "--out", str(notes)], capsys)
  assert text.startswith(f"--out: {notes}: line 1 is not an allreduce-jax row")
  assert notes.read_text() == '{"mine": 1}\n'


def test_train_sync_more_workers_than_devices(capsys, tmp_path):
  argv = ["train", "sync", "--smoke", "--workers", "16", "--out", str(tmp_path)]
  text = _error(argv, capsys)
  assert "--workers 16: only 8 devices" in text


@pytest.mark.parametrize(
  "mode, content, message",
  [
    ("sync", '{"seed": 0}\n', "line 1 is not an allreduce-jax row"),
    ("staleness", "garbage\n", "line 1 is not JSON"),
  ],
)
def test_train_refuses_a_foreign_rows_file(mode, content, message, capsys, tmp_path):
  (tmp_path / f"{mode}.jsonl").write_text(content)
  extra = ["--workers", "2"] if mode == "sync" else []
  text = _error(["train", mode, "--smoke", *extra, "--out", str(tmp_path)], capsys)
  assert "--out: " in text and message in text
  assert (tmp_path / f"{mode}.jsonl").read_text() == content


def test_op_must_be_a_string():
  mesh = devices.submesh((2,), ("i",))
  x = jnp.zeros((2, 3))
  x = devices.put(x.shape, x.dtype, NamedSharding(mesh, P("i")), lambda idx: x[idx])
  body = lambda b: all_reduce(b, "i", op=["sum"])  # noqa: E731
  with pytest.raises(TypeError, match=r"op=\['sum'\] must be a string"):
    jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x)


def test_report_marks_a_failed_section_and_renders_the_others(tmp_path, monkeypatch, capsys):
  from allreduce_jax.tools import report

  def fake(argv):
    if argv[0] == "audit":
      raise RuntimeError("boom")
    if argv[0] == "scaling":
      raise SystemExit("--params x: no such file")
    return 0

  monkeypatch.setattr(report, "_run_command", fake)
  (tmp_path / "sections.json").write_text('{"verify": {"comm')  # truncated by a crash
  assert report.run_report(tmp_path, smoke=True, only=["audit", "scaling", "verify"]) == 1
  text = capsys.readouterr().out
  assert "error: RuntimeError: boom" in text and "error: --params x: no such file" in text
  assert "(2 section(s) failed)" in text
  state = json.loads((tmp_path / "sections.json").read_text())
  assert state["verify"]["status"] == 0 and state["audit"]["status"] == 1
  assert (tmp_path / "REPORT.md").exists()


def test_launch_unwritable_log_dir_before_any_process(tmp_path, capsys):
  blocker = tmp_path / "file"
  blocker.write_text("")
  argv = ["launch", "-n", "2", "--log-dir", str(blocker / "logs"), "--", "verify"]
  assert (
    _error(argv, capsys)
    == f"--log-dir {blocker / 'logs'}: cannot create the folder (Not a directory)."
  )
