"""Every notebook executes, in small mode, on 8 emulated CPU devices.

The notebooks are jupytext percent scripts (``notebooks/*.py``); here they are read
as notebooks and run cell by cell by nbclient in a fresh kernel, as a user would.
"""

from pathlib import Path

import jupytext
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("[0-9][0-9]_*.py"))


def test_notebooks_exist():
  assert len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_in_small_mode(path, monkeypatch, tmp_path):
  monkeypatch.setenv("ALLREDUCE_JAX_SMALL", "1")
  monkeypatch.setenv("ALLREDUCE_JAX_RESULTS", str(tmp_path))
  # The kernel's own backend, as in Jupyter (ipykernel picks the inline one when
  # MPLBACKEND is unset): figures must reach the reader as images.
  monkeypatch.delenv("MPLBACKEND", raising=False)
  nb = jupytext.read(path)
  NotebookClient(
    nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
  ).execute()
  outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
  assert not [o for o in outputs if o.get("output_type") == "error"]
  # A figure shows as an image, not as its text repr (a bare matplotlib Figure needs the
  # inline backend: `# %matplotlib inline` in a notebook that never imports pyplot).
  unshown = [o for o in outputs if "<Figure size" in str(o.get("data", {}).get("text/plain", ""))
             and "image/png" not in o.get("data", {})]  # fmt: skip
  assert not unshown, f"{len(unshown)} figure(s) shown as text"
  # The closing cell states what this run measured.
  assert nb.cells[-1].cell_type == "code" and nb.cells[-1].outputs


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


def test_notebooks_read_the_report_plan_and_registry():
  """No notebook keeps its own list of sizes or of algorithms."""
  for path in NOTEBOOKS:
    text = path.read_text()
    assert '"../results"' not in text, path.name
    assert 'in ("psum", "auto")' not in text and '"hierarchical" else' not in text, path.name
