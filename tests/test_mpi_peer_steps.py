"""experiments/mpi_peer/steps.py and its module trace_steps.py: halving-doubling's and
recursive doubling's steps as the library schedules them, bad input, and one traced round of
each mode on two local processes (the steps' result checked against the whole program's);
traced_rounds.py: the traced exchanges' arithmetic."""

import subprocess
import sys
from pathlib import Path

import pytest
import study_script

from allreduce_jax import results
from allreduce_jax._recursive import halving_doubling_messages, recursive_doubling_messages

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "mpi_peer" / "steps.py"


def _trace_steps():
  return study_script.load(SCRIPT.with_name("trace_steps.py"))


def _traced():
  return study_script.load(SCRIPT.with_name("traced_rounds.py"))


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize(
  "algorithm, messages",
  [
    ("halving_doubling", halving_doubling_messages),
    ("recursive_doubling", recursive_doubling_messages),
  ],
)
def test_split_steps_are_the_library_schedule(algorithm, messages, p):
  steps = _trace_steps().split_steps(algorithm, p)
  want = messages((p,))
  assert len(steps) == len(want)
  for (kind, mask), step in zip(steps, want):
    assert sorted((a, b) for a, b, *_ in step) == sorted((r, r ^ mask) for r in range(p))
    assert all(combined == (kind != "gather") for *_, combined in step)


@pytest.mark.parametrize(
  "algorithm, p, says",
  [("ring", 4, "--split='ring'"), ("halving_doubling", 6, "p=6"), ("halving_doubling", 1, "p=1")],
)
def test_split_steps_bad_input(algorithm, p, says):
  with pytest.raises(ValueError, match=says.replace("[", r"\[")):
    _trace_steps().split_steps(algorithm, p)


def test_exchanges_pair_the_processes_collective_by_collective():
  # 4 processes, two collectives: partners r^2 then r^1, 100 bytes each way at 1000 B/s
  # (0.1 s at full duplex); the pair (2, 3) takes twice that in the second.
  def calls(r, t):
    out = []
    for k, (mask, dur) in enumerate([(2, 0.1), (1, 0.2 if r in (2, 3) else 0.1)]):
      t0 = t + k
      out += [
        ["irecv", t0, t0, r ^ mask, 100, f"q{r}{k}"],
        ["wait", t0, t0 + dur, -1, 0, f"q{r}{k}"],
      ]
    return out

  row = {"origin_s": 0.0, "start": [[0.0]] * 4, "end": [[3.0]] * 4}
  got = _traced().exchanges(row, {r: calls(r, 0.5) for r in range(4)}, rate=1000.0, min_bytes=1)
  assert sorted((e["k"], e["pair"], round(e["over_mb"], 6)) for e in got) == [
    (0, (0, 2), 1.0), (0, (1, 3), 1.0), (1, (0, 1), 1.0), (1, (2, 3), 2.0)
  ]  # fmt: skip
  assert got[0]["first_post"] == [0.5] * 4
  assert all(
    e["rates"] == pytest.approx((1000.0, 1000.0) if e["pair"] != (2, 3) else (500.0, 500.0))
    for e in got
  )


def test_one_traced_round_of_each_mode(tmp_path):
  out = tmp_path / "rows.jsonl"
  cmd = [
    sys.executable, "-m", "allreduce_jax", "launch", "-n", "2", "--timeout", "120", "--",
    sys.executable, str(SCRIPT), "--sizes", "", "--algorithms", "", "--split",
    "halving_doubling", "--allreduce", "64KiB", "--reps", "1", "--out", str(out),
  ]  # fmt: skip
  run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
  rows = results.read_rows(out, "steps")
  assert sorted(r["mode"] for r in rows) == sorted(_trace_steps().MODES)
  for r in rows:
    steps = 1 if r["mode"].startswith("whole") else 2
    assert len(r["start"]) == 2 and all(len(s) == steps for s in r["start"])
    assert all(0 <= a <= b for s, e in zip(r["start"], r["end"]) for a, b in zip(s, e))
  assert any(
    "| halving_doubling | 64 KiB | split (1) |" in line for line in _traced().steps_table(rows)
  )
