"""The layout: the library never imports the tools wing, and an algorithm registered with
one ``register(...)`` reaches verify, bench, audit and the report with no other change."""

import json
import pkgutil
import subprocess
import sys

import pytest

import allreduce_jax
from allreduce_jax import ALGORITHMS, Algorithm, cli, cost_model, register
from allreduce_jax.tools import audit, report


def _library_modules() -> list[str]:
  """Every module of the package below the tools wing (the dispatcher and the tools
  themselves excluded)."""
  top = ("allreduce_jax.tools", "allreduce_jax.cli", "allreduce_jax.__main__")
  return [
    m.name
    for m in pkgutil.walk_packages(allreduce_jax.__path__, "allreduce_jax.")
    if not m.name.startswith(top)
  ]


def test_the_library_does_not_load_the_tools_wing():
  code = (
    "import importlib, json, sys\n"
    f"for name in {_library_modules()!r}:\n"
    "  importlib.import_module(name)\n"
    "print(json.dumps(sorted(m for m in sys.modules if m.startswith('allreduce_jax.tools'))))"
  )
  res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-2000:]
  assert json.loads(res.stdout.strip().splitlines()[-1]) == []


def test_import_allreduce_jax_alone_does_not_load_the_tools_wing():
  code = "import sys, allreduce_jax; print(any(m.startswith('allreduce_jax.tools') for m in sys.modules))"
  res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert res.returncode == 0, res.stderr[-2000:]
  assert res.stdout.strip() == "False"


@pytest.fixture
def toy():
  """A ring variant (the library's ring under another name), registered once."""
  ring = ALGORITHMS["ring"]

  def toy_ring(flat, axis_name, combine):  # flat: T[n]
    return ring(flat, axis_name, combine)

  register(
    Algorithm("toy_ring", toy_ring, auto=False, schedule=ring.schedule, summary="a test's ring")
  )
  yield "toy_ring"
  del ALGORITHMS["toy_ring"]


def test_a_registered_algorithm_reaches_every_tool(toy, tmp_path, monkeypatch, capsys):
  monkeypatch.setenv(cost_model.FIT_ENV_VAR, str(tmp_path / "none.json"))
  # verify: accepted, compared with XLA, passes.
  argv = ["verify", "--algorithms", toy, "--participants", "4", "--dtypes", "float32"]
  assert cli.main([*argv, "--ops", "sum", "--shapes", "13"]) == 0
  assert toy in capsys.readouterr().out
  # bench: a tiny sweep times it next to psum and prices it with its schedule.
  out = tmp_path / "bench.jsonl"
  argv = ["bench", "--devices", "8", "--algorithms", f"{toy},psum", "--min-bytes", "1KiB"]
  argv += ["--max-bytes", "1KiB", "--no-uneven", "--iters", "2", "--warmup", "0"]
  assert cli.main([*argv, "--out", str(out)]) == 0
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  mine = [r for r in rows if r.get("algorithm") == toy]
  assert mine and mine[0]["wrong"] == 0 and mine[0]["predicted_us"] > 0
  # audit: in the audited set, and its HLO matches the ring's schedule.
  assert toy in audit.audited()
  (row,) = audit.audit_in_process(4, 4096, (toy,))
  assert row["match"] and row["permutes"] == 6
  # the report: in the algorithm lists its commands are built from.
  assert toy in report.algorithms("bench")
  bench = next(s for s in report.plan(tmp_path, smoke=True, devices=8) if s.key == "bench")
  assert toy in bench.commands[0][bench.commands[0].index("--algorithms") + 1].split(",")
