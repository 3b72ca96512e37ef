"""Every notebook executes in small mode on 8 emulated CPU devices, and its closing cell
says only what the run measured.

The notebooks are jupytext percent scripts (``notebooks/*.py``); here they are read
as notebooks and run cell by cell by nbclient in a fresh kernel, as a user would.

The conclusion contract: each notebook ends with a code cell that fills a dict
``CONCLUSION`` (name -> a value computed in the notebook: a number, a string, a bool, or
a list of them) and prints its sentences from those values. After the run the test
reads ``CONCLUSION`` back from the kernel and checks the printed text against it:

* every number in the text is one of the recorded values, as printed (rounded to the
  digits shown; a number followed by KiB/MiB/GiB may be recorded in bytes, one followed
  by % as a fraction), and every recorded number and string appears in the text;
* every recorded number is finite, and the text says no "inf", "nan" or "no change".

So a sentence cannot quote a number that was typed in, nor one the run did not make.
"""

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import jupytext
import pytest

from allreduce_jax.results import source_commit
from allreduce_jax.teach import NOT_YET, RIGHT

_ROOT = Path(__file__).parent.parent
_spec = importlib.util.spec_from_file_location("run_notebooks", _ROOT / "lab" / "run_notebooks.py")
runner = importlib.util.module_from_spec(_spec)
sys.modules["run_notebooks"] = runner  # its dataclass looks itself up there
_spec.loader.exec_module(runner)

NOTEBOOKS = runner.NOTEBOOKS
# Notebooks not yet turned into lessons (prompts, a checked exercise, a full-mode record,
# the README's times in their header); this set only shrinks.
_NOT_YET: set[str] = set()
LESSONS = [p for p in NOTEBOOKS if p.stem not in _NOT_YET]

# A number as printed: 8, 1,024, 0.25, 2.1e-05; not a digit inside a word (int8, bf16,
# H100); a binary size or percent unit after it scales what it may be recorded as.
_NUMBER = re.compile(
  r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?([eE][-+]?\d+)?(?!\.?\d)\s?(KiB|MiB|GiB|%)?"
)
_SCALE = {"KiB": (1, 1024), "MiB": (1, 1024**2), "GiB": (1, 1024**3), "%": (1, 0.01), None: (1,)}
_FORBIDDEN = re.compile(r"\b(inf|infinity|nan|no change)\b", re.IGNORECASE)


def printed_numbers(text: str) -> list[tuple[float, float, str | None]]:
  """``(value, tolerance, unit)`` of every number in ``text``: the tolerance is half a
  unit of its last printed digit."""
  out = []
  for m in _NUMBER.finditer(text):
    whole, frac, exp, unit = m.groups()
    value = float(whole.replace(",", "") + (frac or "") + (exp or ""))
    digits = len(frac) - 1 if frac else 0
    out.append((value, 0.5 * 10.0 ** (int(exp[1:] if exp else 0) - digits), unit))
  return out


def _leaves(value):
  if isinstance(value, dict):
    for v in value.values():
      yield from _leaves(v)
  elif isinstance(value, list | tuple):
    for v in value:
      yield from _leaves(v)
  else:
    yield value


def _matches(recorded: float, number: tuple[float, float, str | None]) -> bool:
  value, tol, unit = number
  return any(
    abs(abs(recorded) / scale - value) <= tol * (1 + 1e-9) + 1e-12 for scale in _SCALE[unit]
  )


def check_conclusion(text: str, conclusion: dict) -> list[str]:
  """What is wrong with a conclusion ``text`` against its recorded ``conclusion``
  (empty when nothing is)."""
  problems = [f"the text says {m.group(0)!r}" for m in _FORBIDDEN.finditer(text)]
  if not isinstance(conclusion, dict) or not conclusion:
    return [*problems, "CONCLUSION is not a non-empty dict"]
  leaves = list(_leaves(conclusion))
  numbers = [float(v) for v in leaves if isinstance(v, int | float) and not isinstance(v, bool)]
  strings = [v for v in leaves if isinstance(v, str)]
  problems += [f"recorded value {v} is not finite" for v in numbers if not math.isfinite(v)]
  numbers = [v for v in numbers if math.isfinite(v)]
  printed = printed_numbers(text)
  if not printed:
    problems.append("the text prints no number")
  for number in printed:
    if not any(_matches(v, number) for v in numbers):
      problems.append(f"printed {number[0]:g}{number[2] or ''} is not a recorded value")
  for v in numbers:
    if not any(_matches(v, number) for number in printed):
      problems.append(f"recorded {v:g} is not in the text")
  problems += [f"recorded {s!r} is not in the text" for s in strings if s not in text]
  return problems


@pytest.mark.parametrize(
  ("text", "conclusion", "wrong"),
  [
    ("The ring took 151 µs at 8 devices.", {"us": 151.2, "p": 8}, []),
    ("latency-bound below 128 KiB, 17.3 % slower", {"n": 131072, "x": 0.1734}, []),
    ("latency-bound below 1.5 KiB", {"n": 1.5}, []),
    ("int8 and bf16 wires, error 2.1e-05 (ring)", {"e": 2.13e-5, "a": "ring"}, []),
    ("a 1,024-leaf tree, 0.25·n", {"leaves": 1024, "sent": [0.2504]}, []),
    ("α = 151 µs per step and inf GB/s", {"a": 151, "b": float("inf")}, ["inf", "finite"]),
    ("the best algorithm changes no change", {"p": 8}, ["no change", "prints no number"]),
    ("nan GB/s at 8 devices", {"p": 8}, ["nan"]),
    ("The ring took 150 µs.", {"us": 151.2}, ["150 is not", "151.2 is not"]),
    ("at 8 devices tree won", {"p": 8, "best": "ring"}, ["'ring'"]),
    ("at 8 devices", {}, ["non-empty"]),
  ],
)
def test_the_conclusion_check_can_fail(text, conclusion, wrong):
  problems = check_conclusion(text, conclusion)
  assert bool(problems) == bool(wrong), problems
  for w in wrong:
    assert any(w in p for p in problems), (w, problems)


def test_notebooks_exist():
  assert len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_records_its_conclusion(path):
  """The last cell fills ``CONCLUSION`` (checked after a run by the test below)."""
  last = jupytext.read(path).cells[-1]
  assert last.cell_type == "code" and "CONCLUSION" in last.source, (
    f"{path.name} must end with a code cell that fills CONCLUSION (see this module's docstring)"
  )


def _tagged(cells, tag):
  return [k for k, c in enumerate(cells) if tag in runner.tags(c)]


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_every_notebook_asks_for_predictions_and_has_a_checked_exercise(path):
  """At least two "predict before you run" cells, each followed by the cell that
  reveals the truth (``teach.reveal``); at least one exercise, each check after an
  exercise and followed by a folded solution."""
  cells = jupytext.read(path).cells
  predicts = _tagged(cells, "predict")
  assert len(predicts) >= 2, f"{path.name}: {len(predicts)} predict cell(s)"
  for k in predicts:
    assert "teach.reveal(" in cells[k + 1].source, (path.name, cells[k + 1].source[:200])
  exercises, checks = _tagged(cells, "exercise"), _tagged(cells, "check")
  solutions = _tagged(cells, "solution")
  assert exercises and len(checks) == len(solutions) >= 1, (path.name, exercises, checks)
  for check, solution in zip(checks, solutions):
    assert any(e < check for e in exercises) and check < solution, (path.name, check, solution)
    assert "teach.check(" in cells[check].source
    assert cells[solution].cell_type == "markdown" and "<details>" in cells[solution].source
    compile(runner.solution_code(cells[solution]), f"{path.name}: solution", "exec")


def _full_mode() -> dict:
  path = runner.FULL_MODE
  return json.loads(path.read_text()) if path.exists() else {}


def check_lesson(small: dict, full: dict) -> list[str]:
  """What the small run's ``CONCLUSION`` says against the full run's lesson: every
  claim the same, or named in the small run's ``too_short`` with its reason."""
  lesson, too_short = small.get("lesson", {}), small.get("too_short", {})
  problems = [f"the full run is too short for {k!r}" for k in full.get("too_short", {})]
  for claim, value in full.get("lesson", {}).items():
    if claim in too_short:
      continue
    if claim not in lesson:
      problems.append(f"the small run does not state {claim!r}")
    elif lesson[claim] != value:
      problems.append(f"{claim!r}: small mode {lesson[claim]!r}, full mode {value!r}")
  return problems


@pytest.mark.parametrize(
  ("small", "full", "wrong"),
  [
    ({"lesson": {"a": True}}, {"lesson": {"a": True}}, []),
    ({"lesson": {"a": False}}, {"lesson": {"a": True}}, ["'a'"]),
    ({"lesson": {}, "too_short": {"a": "why"}}, {"lesson": {"a": True}}, []),
    ({"lesson": {}}, {"lesson": {"a": "ring"}}, ["does not state"]),
    ({"lesson": {"a": 1}}, {"lesson": {"a": 1}, "too_short": {"a": "x"}}, ["full run"]),
  ],
)
def test_the_lesson_check_can_fail(small, full, wrong):
  problems = check_lesson(small, full)
  assert bool(problems) == bool(wrong), problems
  for w in wrong:
    assert any(w in p for p in problems), (w, problems)


def _check_run(path, run) -> None:
  outputs = [
    o for cell in run.nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
  ]
  assert not [o for o in outputs if o.get("output_type") == "error"]
  # A figure shows as an image, not as its text repr (a bare matplotlib Figure needs the
  # inline backend: `# %matplotlib inline` in a notebook that never imports pyplot).
  unshown = [o for o in outputs if "<Figure size" in str(o.get("data", {}).get("text/plain", ""))
             and "image/png" not in o.get("data", {})]  # fmt: skip
  assert not unshown, f"{len(unshown)} figure(s) shown as text"
  # The first output names the code that made it (an executed copy says its commit).
  first = next(
    runner.text(c.outputs) for c in run.nb.cells if c.cell_type == "code" and c.get("outputs")
  )
  assert f"allreduce-jax at commit {source_commit() or '(not a git checkout)'}" in first, first
  # Every exercise's check says "not yet" to the untouched exercise and "right" to its solution.
  for cell in run.nb.cells:
    said = runner.text(cell.get("outputs", [])).strip()
    if "check" in runner.tags(cell):
      assert said.startswith(NOT_YET), (path.name, "the untouched exercise passed", said)
    if "check-solution" in runner.tags(cell):
      assert said.startswith(RIGHT), (path.name, "the solution failed its check", said)
  if run.conclusion is None:  # test_every_notebook_records_its_conclusion names it
    assert run.nb.cells[-1].cell_type == "code" and run.nb.cells[-1].outputs
    return
  assert not (problems := check_conclusion(run.text, run.conclusion)), (run.text, problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_in_small_mode_and_keeps_the_full_mode_s_lesson(path, monkeypatch):
  """Small mode, as CI runs it, with every exercise's solution checked; its lesson
  against the full mode's, committed in ``notebooks/full_mode.json``
  (``python lab/run_notebooks.py --record``)."""
  # The kernel's own backend, as in Jupyter (ipykernel picks the inline one when
  # MPLBACKEND is unset): figures must reach the reader as images.
  monkeypatch.delenv("MPLBACKEND", raising=False)
  run = runner.execute(path, small=True, solutions=True, timeout=900)
  print(f"{path.name}: {run.seconds:.0f} s in small mode")
  _check_run(path, run)
  if path.stem in _NOT_YET:
    return
  full = _full_mode().get(path.stem)
  assert full, (
    f"{path.stem} has no full-mode record: python lab/run_notebooks.py --record {path.stem[:2]}"
  )
  assert not (problems := check_lesson(run.conclusion, full)), (run.text, problems)


@pytest.mark.parametrize("devices", [3, 6])
def test_01_runs_on_any_device_count(devices, monkeypatch):
  """``DEVICES`` is a parameter: the ring pads a length that no device count divides."""
  monkeypatch.delenv("MPLBACKEND", raising=False)
  path = next(p for p in NOTEBOOKS if p.stem.startswith("01_"))
  run = runner.execute(path, small=True, solutions=True, overrides={"DEVICES": devices})
  _check_run(path, run)
  assert run.conclusion["devices"] == devices and run.conclusion["n"] % devices
  assert all(run.conclusion["lesson"].values()), run.conclusion["lesson"]


_RUNTIME = re.compile(
  r"\*\*Run time\.\*\* Full mode (?P<full>[^;]+?) on 2 CPU cores; small mode \(.*?\) (?P<small>[^:.]+? s)[:.]",
  re.DOTALL,
)


def test_run_time_headers_agree_with_the_readme_table():
  """Each notebook's header says the times of the README's notebook table."""
  readme = (_ROOT / "README.md").read_text()
  for path in LESSONS:
    row = next((ln for ln in readme.splitlines() if f"[{path.stem}]" in ln), None)
    assert row, f"README's notebook table has no row for {path.stem}"
    full, small = [c.strip() for c in row.strip("|").split("|")][-2:]
    header = " ".join(ln.lstrip("# ") for ln in path.read_text().splitlines()[:60])
    m = _RUNTIME.search(header)
    assert m, f"{path.name}: no 'Run time.' sentence in the header"
    assert (m["full"].replace("about ", ""), m["small"]) == (full, small), (
      path.name,
      m.groups(),
      row,
    )


def test_every_module_a_notebook_imports_is_in_the_api_reference():
  import ast

  from allreduce_jax.tools import API_MODULES

  imported = set()
  for path in NOTEBOOKS:
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("allreduce_jax"):
        for alias in node.names:
          full = f"{node.module}.{alias.name}"
          imported.add(full if _is_module(full) else node.module)
      elif isinstance(node, ast.Import):
        imported |= {a.name for a in node.names if a.name.startswith("allreduce_jax")}
  import allreduce_jax

  # allreduce_jax's own page documents the modules it exports (devices)
  documented = set(API_MODULES) | {f"allreduce_jax.{m}" for m in allreduce_jax.__all__}
  assert imported <= documented, sorted(imported - documented)


def _is_module(name: str) -> bool:
  try:
    return importlib.util.find_spec(name) is not None
  except ModuleNotFoundError:
    return False


def test_source_commit_is_the_checkout_s_commit():
  import subprocess

  head = subprocess.run(
    ["git", "rev-parse", "HEAD"], cwd=NOTEBOOKS[0].parent, capture_output=True, text=True
  ).stdout.strip()
  commit = source_commit()
  assert commit and head.startswith(commit.removesuffix("-dirty")), (commit, head)


def test_results_go_under_the_repository_whatever_the_working_directory(tmp_path):
  import os
  import subprocess
  import sys

  code = "from allreduce_jax.tools import report; print(report.results_dir('notebooks', '03'))"
  env = {k: v for k, v in os.environ.items() if k != "ALLREDUCE_JAX_RESULTS"}
  res = subprocess.run(
    [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
  )
  assert res.returncode == 0, res.stderr
  root = Path(__file__).resolve().parent.parent
  assert Path(res.stdout.strip()) == root / "results" / "notebooks" / "03"
  assert not (tmp_path / "results").exists()


def test_notebooks_keep_no_list_of_algorithms():
  """No notebook keeps its own list of algorithms or its own results folder."""
  for path in NOTEBOOKS:
    text = path.read_text()
    assert '"../results"' not in text, path.name
    assert 'in ("psum", "auto")' not in text and '"hierarchical" else' not in text, path.name
