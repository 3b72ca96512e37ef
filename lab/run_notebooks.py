"""Runs the notebooks as a learner would, and records what their full mode concludes.

    python lab/run_notebooks.py                       # every notebook, full mode: seconds each
    python lab/run_notebooks.py --small 01 07         # small mode, two of them
    python lab/run_notebooks.py --record 01 02        # full mode, written to notebooks/full_mode.json

Each notebook (``notebooks/NN_name.py``, a jupytext percent script) is read as a
notebook and run cell by cell by nbclient in a fresh kernel, with its exercises'
solutions put in (after every check cell, the solution folded in the markdown cell
that follows it, and the check once more), as the test suite runs it: a learner who
did every exercise. The closing cell fills ``CONCLUSION``; it is read back from the
kernel. ``--record`` keeps, per notebook, the full-mode conclusion (its ``lesson`` is
what the small mode must agree with, ``tests/test_notebooks.py``), the closing text and
the seconds the run took. Measure the seconds with nothing else running (``cpu-quiet``
where the machine is shared): some notebooks time things.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
FULL_MODE = ROOT / "notebooks" / "full_mode.json"

# Appended to the notebook: hands CONCLUSION back as one JSON line.
_DUMP = (
  "import json as _json\n"
  "print('CONCLUSION=' + _json.dumps({k: (v.tolist() if hasattr(v, 'tolist') else v)"
  " for k, v in CONCLUSION.items()}, default=str))"
)
_SOLUTION = re.compile(r"```python\n(.*?)```", re.DOTALL)


def tags(cell) -> list[str]:
  return list(cell.get("metadata", {}).get("tags", []))


def solution_code(cell) -> str:
  """The code inside a solution cell's folded ```python block."""
  found = _SOLUTION.findall(cell.source)
  if not found:
    raise ValueError(f"a solution cell holds no ```python block: {cell.source[:80]!r}")
  return "\n".join(found)


def with_solutions(nb) -> None:
  """After each ``solution`` markdown cell, its code (tagged ``solution-run``) and a
  copy of the ``check`` cell before it (tagged ``check-solution``)."""
  cells, check = [], None
  for cell in nb.cells:
    cells.append(cell)
    if "check" in tags(cell):
      check = cell
    if "solution" in tags(cell):
      if check is None:
        raise ValueError("a solution cell with no check cell before it")
      cells.append(nbformat.v4.new_code_cell(solution_code(cell), metadata={"tags": ["solution-run"]}))  # fmt: skip
      cells.append(nbformat.v4.new_code_cell(check.source, metadata={"tags": ["check-solution"]}))
      check = None
  nb.cells = cells


def with_parameters(nb, overrides: dict) -> None:
  """Papermill's way: a cell after the ``parameters`` cell sets ``overrides``."""
  k = next(i for i, c in enumerate(nb.cells) if "parameters" in tags(c))
  source = "\n".join(f"{name} = {value!r}" for name, value in overrides.items())
  nb.cells.insert(k + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["injected"]}))


def text(outputs) -> str:
  """What a cell showed its reader: stdout, and Markdown or plain text it displayed."""
  parts = []
  for o in outputs:
    if o.get("output_type") == "stream" and o.get("name") == "stdout":
      parts.append(o["text"])
    elif "data" in o:
      data = o["data"]
      parts.append(data.get("text/markdown") or data.get("text/plain", ""))
  return "".join(parts)


@dataclass
class Run:
  """One executed notebook: the notebook with its outputs, its ``CONCLUSION`` (None if
  its last cell fills none), the closing cell's text and the seconds it took."""

  nb: object
  conclusion: dict | None
  text: str
  seconds: float
  env: dict = field(default_factory=dict)


def execute(
  path: Path,
  *,
  small: bool,
  solutions: bool = False,
  overrides: dict | None = None,
  results: str | None = None,
  timeout: int = 1800,
) -> Run:
  """Runs ``path`` in a fresh kernel (cwd: the notebook's folder) and returns the
  :class:`Run`. The environment selects the mode (``ALLREDUCE_JAX_SMALL``) and where
  results go (``ALLREDUCE_JAX_RESULTS``: a temporary folder unless given)."""
  nb = jupytext.read(path)
  concludes = "CONCLUSION" in nb.cells[-1].source
  if solutions:
    with_solutions(nb)
  if overrides:
    with_parameters(nb, overrides)
  if concludes:
    nb.cells.append(nbformat.v4.new_code_cell(_DUMP))
  saved = {k: os.environ.get(k) for k in ("ALLREDUCE_JAX_SMALL", "ALLREDUCE_JAX_RESULTS")}
  with tempfile.TemporaryDirectory(prefix="allreduce-jax-nb-") as tmp:
    os.environ["ALLREDUCE_JAX_SMALL"] = "1" if small else "0"
    os.environ["ALLREDUCE_JAX_RESULTS"] = results or tmp
    try:
      start = time.perf_counter()
      NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
      ).execute()
      seconds = time.perf_counter() - start
    finally:
      for k, v in saved.items():
        if v is None:
          os.environ.pop(k, None)
        else:
          os.environ[k] = v
  conclusion = None
  if concludes:
    dump = text(nb.cells.pop().outputs)
    conclusion = json.loads(dump.split("CONCLUSION=", 1)[1])
  return Run(nb, conclusion, text(nb.cells[-1].outputs), seconds)


def record(runs: dict[str, Run], path: Path = FULL_MODE) -> None:
  """Writes the full-mode runs into ``path`` (other notebooks' entries are kept)."""
  import jax

  from allreduce_jax.results import source_commit

  kept = json.loads(path.read_text()) if path.exists() else {}
  for stem, run in runs.items():
    kept[stem] = {
      "lesson": run.conclusion.get("lesson", {}),
      "conclusion": run.conclusion,
      "text": run.text,
      "seconds": round(run.seconds),
      "commit": source_commit(),
      "jax": jax.__version__,
    }
  path.write_text(json.dumps(dict(sorted(kept.items())), indent=1, ensure_ascii=False) + "\n")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("names", nargs="*", help="notebook numbers or names (default: all)")
  ap.add_argument("--small", action="store_true", help="small mode (ALLREDUCE_JAX_SMALL=1)")
  ap.add_argument("--record", action="store_true", help=f"write full-mode results to {FULL_MODE}")
  args = ap.parse_args(argv)
  if args.record and args.small:
    ap.error("--record keeps full-mode runs only")
  paths = [p for p in NOTEBOOKS if not args.names or any(p.stem.startswith(n) for n in args.names)]
  if not paths:
    ap.error(f"no notebook matches {args.names}")
  runs = {}
  for path in paths:
    run = execute(path, small=args.small, solutions=True)
    errors = [o for c in run.nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]  # fmt: skip
    print(f"{path.stem}: {run.seconds:.0f} s in {'small' if args.small else 'full'} mode"
          + (f", {len(errors)} error(s)" if errors else ""), flush=True)  # fmt: skip
    if errors:
      return 1
    runs[path.stem] = run
  if args.record:
    record(runs)
    print(f"wrote {len(runs)} notebook(s) into {FULL_MODE.relative_to(ROOT)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
