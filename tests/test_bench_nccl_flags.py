"""bench's nccl-tests 2.19 flags: ``-T`` (a timeout that names the stuck participant),
``-I`` (every timed call, p50 and p99), ``-J`` (the run as one JSON document)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from allreduce_jax.cli import main

ROOT = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, "-m", "allreduce_jax", "bench"]


def test_iteration_times_and_json(tmp_path, capsys):
  out, doc = tmp_path / "b.jsonl", tmp_path / "b.json"
  argv = ["bench", "--devices", "4", "--algorithms", "ring,psum", "--smoke", "-n", "7", "-I",
          "-J", str(doc), "--out", str(out)]  # fmt: skip
  assert main(argv) == 0
  rows = [r for r in map(json.loads, out.read_text().splitlines()) if "algorithm" in r]
  results = json.loads(doc.read_text())["results"]
  assert len(rows) == len(results) == 6  # every row the store has
  for r, j in zip(rows, results):
    assert (j["algorithm"], j["bytes"], j["time_us"]) == (r["algorithm"], r["bytes"], r["time_us"])
  for r in rows:
    times = np.asarray(r["times_us"])
    assert len(times) == 7
    assert r["time_us_p50"] == pytest.approx(np.median(times))
    assert r["time_us_p99"] == pytest.approx(np.percentile(times, 99))
    assert times.min() <= r["time_us_p50"] <= r["time_us_p99"] <= times.max()
  table = capsys.readouterr().out
  assert "p50(us)   p99(us)" in table
  assert f"{rows[0]['time_us_p99']:>9.1f}" in table


def test_bad_timeout_is_one_line(capsys):
  with pytest.raises(SystemExit):
    main(["bench", "--smoke", "-T", "0"])
  assert "argument -T/--timeout: must be more than 0 seconds, got 0" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_timeout_in_one_process_says_where_and_exits_124(tmp_path):
  argv = [*BENCH, "--devices", "2", "--algorithms", "ring", "--smoke", "-n", "1000000", "-T", "4",
          "--out", str(tmp_path / "b.jsonl")]  # fmt: skip
  res = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=100)
  assert res.returncode == 124, res.stderr[-2000:]
  assert "bench: -T 4 s reached after" in res.stderr
  assert "during ring at 1 KiB float32 sum; stopping." in res.stderr


@pytest.mark.timeout(180)
def test_timeout_names_a_stopped_participant(tmp_path):
  logs = tmp_path / "logs"
  argv = [sys.executable, "-m", "allreduce_jax", "launch", "-n", "2", "--log-dir", str(logs),
          "--", "bench", "--algorithms", "ring", "--smoke", "-n", "1000000", "-T", "12",
          "--out", str(tmp_path / "b.jsonl")]  # fmt: skip
  proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.monotonic() + 120
    log0 = logs / "process-0.log"
    while not (log0.exists() and "size(B)" in log0.read_text(errors="replace")):
      assert time.monotonic() < deadline and proc.poll() is None, "bench never started timing"
      time.sleep(0.2)
    time.sleep(1)
    victim = json.loads((logs / "pids.json").read_text())["1"]
    os.kill(victim, signal.SIGSTOP)
    out, err = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
  assert proc.returncode == 124, err[-2000:]
  assert "bench: -T 12 s reached: process 1 did not answer (stopped or dead)" in out + err
