"""bench's nccl-tests 2.19 flags: ``-T`` (a timeout that names the stuck participant),
``-I`` (every timed call, p50 and p99), ``-J`` (the run as one JSON document)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import launched
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


@pytest.mark.parametrize(
  "value, says",
  [("0", "must be more than 0 seconds, got 0"),
   ("nan", "expected a finite number of seconds, got nan"),
   ("inf", "expected a finite number of seconds, got inf"),
   ("1e308", "must be at most 9.22e+09 seconds (about 292 years), got 1e+308")],
)  # fmt: skip
def test_bad_timeout_is_one_line(value, says, capsys):
  with pytest.raises(SystemExit):  # inf and 1e308 overflowed in the timer thread: no timeout
    main(["bench", "--smoke", "-T", value])
  last = capsys.readouterr().err.strip().splitlines()[-1]  # after argparse's usage
  assert last == f"allreduce-jax bench: error: argument -T/--timeout: {says}"


@pytest.mark.timeout(120)
def test_timeout_in_one_process_says_where_and_exits_124(tmp_path):
  argv = [*BENCH, "--devices", "2", "--algorithms", "ring", "--smoke", "-n", "1000000", "-T", "4",
          "--out", str(tmp_path / "b.jsonl")]  # fmt: skip
  res = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=100)
  assert res.returncode == 124, res.stderr[-2000:]
  assert "bench: -T 4 s reached after" in res.stderr
  assert "during ring at 1 KiB float32 sum; stopping." in res.stderr


def _stop_one_while_timing(tmp_path, victim_rank: int, seconds: int = 12):
  """``launch -n 2 -- bench -T seconds``, process ``victim_rank`` stopped (SIGSTOP)
  once timing started: ``(returncode, stdout + stderr, seconds from the stop to the end)``.
  The launcher's own no-progress watchdog is off (``--watchdog 0``): bench's ``-T`` is tested."""
  logs = tmp_path / "logs"
  argv = [sys.executable, "-m", "allreduce_jax", "launch", "-n", "2", "--log-dir", str(logs),
          "--output", "all", "--watchdog", "0", "--", "bench", "--algorithms", "ring", "--smoke", "-n", "1000000",
          "-T", str(seconds), "--out", str(tmp_path / "b.jsonl")]  # fmt: skip
  proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  timing = lambda: launched.says(logs / "process-0.log", "size(B)")  # noqa: E731
  # wait=60: below JAX's own heartbeat check (100 s)
  out, err, took = launched.signal_when(
    proc, timing, logs, victim_rank, signal.SIGSTOP, within=120, settle=1, wait=60
  )
  return proc.returncode, out + err, took


@pytest.mark.timeout(180)
def test_timeout_fires_when_process_0_is_the_stopped_one(tmp_path):
  rc, text, took = _stop_one_while_timing(tmp_path, 0)
  assert rc == 124, text[-3000:]
  assert "bench: -T 12 s reached: process 0 did not answer (stopped or dead); process 1 made" in (
    text
  )
  assert took < 12 + 15, f"{took:.1f} s"


@pytest.mark.timeout(180)
def test_timeout_names_a_stopped_participant(tmp_path):
  rc, text, _ = _stop_one_while_timing(tmp_path, 1)
  assert rc == 124, text[-2000:]
  assert "bench: -T 12 s reached: process 1 did not answer (stopped or dead)" in text


def test_json_never_writes_over_rows_or_another_options_file(tmp_path, capsys):
  out, other = tmp_path / "b.jsonl", tmp_path / "other.jsonl"
  argv = ["bench", "--devices", "2", "--algorithms", "ring", "--smoke", "-e", "1KiB", "-n", "2"]
  assert main([*argv, "--out", str(other)]) == 0  # another run's rows
  assert main([*argv, "--out", str(out)]) == 0
  kept = out.read_bytes(), other.read_bytes()
  capsys.readouterr()
  for doc, says in [(out, "is also --out"), (tmp_path / "b.png", "is also --plot"),
                    (tmp_path / "fit.json", "is also --params"), (other, "holds rows")]:  # fmt: skip
    extra = ["--fit", "--params", str(tmp_path / "fit.json")] if "params" in says else []
    with pytest.raises(SystemExit) as e:
      main([*argv, "--algorithms", "ring,psum", "--out", str(out), "-J", str(doc), *extra])
    assert str(e.value).startswith(f"-J/--json {doc}: {says}"), e.value
    assert "\n" not in str(e.value)
  assert (out.read_bytes(), other.read_bytes()) == kept  # nothing measured, nothing replaced
  assert "size(B)" not in capsys.readouterr().out  # refused before the header
  doc = tmp_path / "b.json"  # a file of its own: written, and rewritten by the next run
  assert main([*argv, "--out", str(out), "-J", str(doc)]) == 0
  assert main([*argv, "--out", str(out), "-J", str(doc)]) == 0
  assert len(json.loads(doc.read_text())["results"]) == len(out.read_text().splitlines()) == 2
