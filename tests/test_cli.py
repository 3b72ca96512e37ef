"""The verify command end to end: table, exit status, bad arguments."""

import dataclasses

import jax.numpy as jnp
import pytest

from allreduce_jax import ALGORITHMS, cli
from allreduce_jax.tools import COMMANDS, dispatch


@pytest.mark.slow
def test_verify_passes_and_prints_table(capsys, tmp_path):
  out = tmp_path / "verify.jsonl"
  rc = cli.main([
    "verify", "--algorithms", "ring,tree", "--participants", "3",
    "--dtypes", "float32,int32", "--out", str(out),
  ])  # fmt: skip
  text = capsys.readouterr().out
  assert rc == 0
  assert "max|err| vs oracle" in text and "bit-exact" in text
  assert text.count("PASS") == 2 * 7 and "FAIL" not in text
  cases = len(out.read_text().splitlines())  # one row per case, in one unit everywhere
  assert cases > 14 and f"# {cases} cases to compare" in text
  assert f"# {cases} cases compared with the NumPy oracle" in text
  assert f": {cases} passed, 0 failed" in text


def test_verify_exits_nonzero_on_a_wrong_algorithm(capsys, monkeypatch):
  tree = ALGORITHMS["tree"]

  def off_by_one(flat, axis_name, combine):
    return tree(flat, axis_name, combine) + jnp.ones((), flat.dtype)

  monkeypatch.setitem(ALGORITHMS, "tree", dataclasses.replace(tree, fn=off_by_one))
  rc = cli.main(["verify", "--algorithms", "tree", "--participants", "2", "--dtypes", "float32"])
  assert rc == 1
  assert "FAIL" in capsys.readouterr().out


@pytest.mark.parametrize(
  "argv, message",
  [
    (["verify", "--participants", "9"], "--participants: 9 is outside"),
    (["verify", "--ops", "prod"], "--ops: unknown 'prod'"),
  ],
)
def test_verify_bad_arguments(argv, message):
  with pytest.raises(SystemExit, match=message):
    cli.main(argv)


def test_verify_unknown_algorithm_is_a_usage_error_naming_it(capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(["verify", "--algorithms", "bogus"])
  assert e.value.code == 2
  assert "argument --algorithms: unknown algorithm 'bogus'" in capsys.readouterr().err


def test_unknown_command_is_a_usage_error(capsys):
  with pytest.raises(SystemExit):
    cli.main(["frobnicate"])
  assert "invalid choice" in capsys.readouterr().err


def test_version(capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(["--version"])
  assert e.value.code == 0
  assert capsys.readouterr().out.startswith("allreduce-jax ")


def _options(parser):
  """Every option of ``parser`` and of its sub-commands, with the parser that owns it."""
  import argparse

  for action in parser._actions:
    if isinstance(action, argparse._SubParsersAction):
      for child in action.choices.values():
        yield from _options(child)
    elif action.option_strings and action.help != argparse.SUPPRESS:
      yield parser, action


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_default_is_shown_in_help(name):
  for parser, action in _options(dispatch.subcommand_parser(name)):
    if action.default in (None, False) or action.dest == "help":
      continue
    shown = " ".join(parser.format_help().split())
    default = action.default
    text = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
    assert f"default: {text}" in shown or f"default {text}" in shown, (name, action.dest)


def test_nccl_tests_short_flags_are_bench_aliases():
  argv = ["-b", "8", "-e", "128M", "-f", "2", "-n", "20", "-w", "5", "-d", "bfloat16", "-o", "max"]
  args = dispatch.subcommand_parser("bench").parse_args(argv)
  assert (args.min_bytes, args.max_bytes, args.factor) == ("8", "128M", 2)
  assert (args.iters, args.warmup, args.dtype, args.op) == (20, 5, ["bfloat16"], ["max"])


@pytest.mark.parametrize(
  "argv, dtype, op",
  [
    (["-d", "float,half", "-o", "avg"], ["float32", "float16"], ["mean"]),
    (["-o", "all"], ["float32"], ["sum", "mean", "max", "min"]),
    (
      ["-d", "all"],
      ["int8", "uint8", "int32", "uint32", "float16", "float32", "bfloat16"],
      ["sum"],
    ),
  ],
)
def test_nccl_tests_op_and_datatype_lists_and_all(argv, dtype, op):
  args = dispatch.subcommand_parser("bench").parse_args(argv)  # 64-bit types need JAX_ENABLE_X64=1
  assert (args.dtype, args.op) == (dtype, op)


@pytest.mark.parametrize(
  "argv, message",
  [
    (["-o", "prod"], "argument -o/--op: unsupported op 'prod'; expected sum, mean, max, min"),
    (["-o", "sum,mulsum"], "argument -o/--op: unsupported op 'mulsum'"),
    (
      ["-d", "f8e4m3"],
      "argument -d/--dtype/--datatype: unknown dtype 'f8e4m3'; expected some of int8",
    ),
    (["-c", "2"], "argument -c/--check: invalid choice: 2 (choose from 0, 1)"),
    (["-a", "4"], "argument -a/--average: invalid choice: 4 (choose from 0, 1, 2, 3)"),
    (["-g", "0"], "argument -g/--ngpus: must be at least 1, got 0"),
  ],
)
def test_nccl_tests_flags_refuse_what_is_not_supported_in_one_line(argv, message, capsys):
  with pytest.raises(SystemExit) as e:
    dispatch.subcommand_parser("bench").parse_args(argv)
  assert e.value.code == 2
  assert message in capsys.readouterr().err
