"""Issue 17 (trust, round three): rows never deleted, one writer per file, exact
max/min below 1e-38, identical NaN bits, the right process blamed, one-line errors."""

from __future__ import annotations

import json

import pytest

from allreduce_jax import cost_model
from allreduce_jax.cli import main
from allreduce_jax.results import RowsError, RowStore, release_locks


def _keys(path):
  return [json.loads(line)["key"] for line in path.read_text().splitlines()]


# ---------------------------------------------------------------- 1. rows never deleted


def test_the_readme_scaling_commands_share_one_file(tmp_path, monkeypatch):
  monkeypatch.setenv(cost_model.FIT_ENV_VAR, str(tmp_path / "none.json"))
  out = tmp_path / "s.jsonl"
  assert main(["scaling", "--smoke", "--out", str(out)]) == 0
  first = _keys(out)
  assert main(["scaling", "--smoke", "--topology", "switch", "--out", str(out)]) == 0
  both = _keys(out)
  assert both[: len(first)] == first and len(both) > len(first)  # appended, none deleted
  assert main(["scaling", "--smoke", "--out", str(out)]) == 0  # a rerun resumes: nothing new
  assert _keys(out) == both
  assert main(["scaling", "--smoke", "--fresh", "--out", str(out)]) == 0  # only --fresh empties
  assert _keys(out) == first


def test_verify_ring_then_tree_into_one_file(tmp_path):
  out = tmp_path / "v.jsonl"
  argv = ["verify", "--devices", "2", "--ops", "sum", "--dtypes", "float32", "--kinds"]
  argv += ["verifiable", "--shapes", "3", "--out", str(out)]
  assert main([*argv, "--algorithms", "ring"]) == 0
  assert main([*argv, "--algorithms", "tree"]) == 0
  algorithms = [json.loads(line)["algorithm"] for line in out.read_text().splitlines()]
  assert algorithms == ["ring", "tree"]


def test_a_second_writer_is_locked_out_with_one_line(tmp_path):
  path = tmp_path / "b.jsonl"
  first = RowStore(path, "bench", context={})
  first.lock()
  try:
    with pytest.raises(RowsError, match="another allreduce-jax run is writing this file"):
      RowStore(path, "bench", context={}).lock()
    argv = ["bench", "--devices", "2", "--algorithms", "ring", "-b", "1KiB", "-e", "1KiB"]
    with pytest.raises(SystemExit, match=r"^--out: .*b\.jsonl: another allreduce-jax run"):
      main([*argv, "--out", str(path)])
  finally:
    first.unlock()
  assert not path.exists()  # the lock made the file; nothing written, so it is gone again
  second = RowStore(path, "bench", context={})
  second.lock()  # free again
  second.append({"n": 1}, second.key(n=1))
  release_locks()
  assert path.exists()


def test_a_full_disk_is_one_line_and_keeps_the_rows(tmp_path, monkeypatch):
  import errno
  import os

  store = RowStore(tmp_path / "r.jsonl", "bench", context={})
  store.append({"n": 1}, store.key(n=1))
  real_write = os.write

  def full(fd, data):
    real_write(fd, bytes(data)[:7])  # part of a row reaches the disk, then no space
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "write", full)
  with pytest.raises(RowsError, match="cannot be written \\(the disk is full\\); the rows"):
    store.append({"n": 2}, store.key(n=2))
  monkeypatch.undo()
  assert [r["n"] for r in store.rows()] == [1]  # no half row left
  assert store.path.read_text().endswith("\n")
