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

import json
import math
import re
import time
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

from allreduce_jax.results import source_commit

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("[0-9][0-9]_*.py"))

# A number as printed: 8, 1,024, 0.25, 2.1e-05; not a digit inside a word (int8, bf16,
# H100); a binary size or percent unit after it scales what it may be recorded as.
_NUMBER = re.compile(
  r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?([eE][-+]?\d+)?(?!\.?\d)\s?(KiB|MiB|GiB|%)?"
)
_SCALE = {"KiB": (1, 1024), "MiB": (1, 1024**2), "GiB": (1, 1024**3), "%": (1, 0.01), None: (1,)}
_FORBIDDEN = re.compile(r"\b(inf|infinity|nan|no change)\b", re.IGNORECASE)

# Appended to the notebook under test: hands CONCLUSION back as one JSON line.
_DUMP = (
  "import json as _json\n"
  "print('CONCLUSION=' + _json.dumps({k: (v.tolist() if hasattr(v, 'tolist') else v)"
  " for k, v in CONCLUSION.items()}))"
)


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


def _text(outputs) -> str:
  """What a cell showed its reader: stdout, and Markdown or plain text it displayed."""
  parts = []
  for o in outputs:
    if o.get("output_type") == "stream" and o.get("name") == "stdout":
      parts.append(o["text"])
    elif "data" in o:
      data = o["data"]
      parts.append(data.get("text/markdown") or data.get("text/plain", ""))
  return "".join(parts)


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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_in_small_mode(path, monkeypatch, tmp_path):
  monkeypatch.setenv("ALLREDUCE_JAX_SMALL", "1")
  monkeypatch.setenv("ALLREDUCE_JAX_RESULTS", str(tmp_path))
  # The kernel's own backend, as in Jupyter (ipykernel picks the inline one when
  # MPLBACKEND is unset): figures must reach the reader as images.
  monkeypatch.delenv("MPLBACKEND", raising=False)
  nb = jupytext.read(path)
  concludes = "CONCLUSION" in nb.cells[-1].source
  if concludes:
    nb.cells.append(nbformat.v4.new_code_cell(_DUMP))
  start = time.perf_counter()
  NotebookClient(
    nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
  ).execute()
  print(f"{path.name}: {time.perf_counter() - start:.0f} s in small mode")
  outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
  assert not [o for o in outputs if o.get("output_type") == "error"]
  # A figure shows as an image, not as its text repr (a bare matplotlib Figure needs the
  # inline backend: `# %matplotlib inline` in a notebook that never imports pyplot).
  unshown = [o for o in outputs if "<Figure size" in str(o.get("data", {}).get("text/plain", ""))
             and "image/png" not in o.get("data", {})]  # fmt: skip
  assert not unshown, f"{len(unshown)} figure(s) shown as text"
  # The first output names the code that made it (an executed copy says its commit).
  first = next(_text(c.outputs) for c in nb.cells if c.cell_type == "code" and c.get("outputs"))
  assert f"allreduce-jax at commit {source_commit() or '(not a git checkout)'}" in first, first
  if not concludes:  # test_every_notebook_records_its_conclusion names it
    assert nb.cells[-1].cell_type == "code" and nb.cells[-1].outputs
    return
  dump = _text(nb.cells.pop().outputs)
  conclusion = json.loads(dump.split("CONCLUSION=", 1)[1])
  text = _text(nb.cells[-1].outputs)
  assert not (problems := check_conclusion(text, conclusion)), (text, problems)


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
