"""What a newcomer runs first: the README's commands and the Makefile's targets agree.

``make try`` is the seconds-long path the README's "A first try" promises: it installs the
``cli`` extra alone into ``.venv`` and runs the README's first command, the one its block
shows. The Makefile and the README say the same of full and small mode.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
  return README.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def _dry_run(target: str) -> list[str]:
  if shutil.which("make") is None:
    pytest.skip("no make on this machine")
  # Under an outer make (CI's `make test`) the inherited MAKEFLAGS/MAKELEVEL would add
  # make's own "Entering/Leaving directory" lines: the dry run starts from a clean slate.
  env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
  argv = ["make", "--no-print-directory", "-n", "-B", target]
  res = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env)
  assert res.returncode == 0, res.stderr
  return res.stdout.strip().splitlines()


def test_make_try_installs_the_cli_extra_and_runs_the_first_try():
  install = _section("Install").split("```bash", 1)[1].split("```", 1)[0]
  assert re.search(r"^make try\s", install, re.M), install
  first_try = _section("A first try (seconds)")
  assert "after `make`" not in first_try and "`make try`" in first_try
  command = first_try.split("```bash", 1)[1].split("```", 1)[0].strip()
  lines = _dry_run("try")
  installs = [line for line in lines if "pip install" in line and " -e " in line]
  assert installs and all(line.endswith("-e '.[cli]'") for line in installs), installs
  assert lines[-1] == f".venv/bin/{command}"  # the README's command, nothing else


def test_the_makefile_and_the_readme_agree_on_full_and_small_mode():
  makefile = (ROOT / "Makefile").read_text()
  comment = makefile.split("\nnotebooks:", 1)[0].rsplit("\n\n", 1)[1]
  assert "full mode unless ALLREDUCE_JAX_SMALL=1" in " ".join(comment.split()), comment
  notebooks = " ".join(_section("Notebooks").split())
  assert "`make notebooks` runs every notebook in full mode," in notebooks
  assert "`ALLREDUCE_JAX_SMALL=1 make notebooks` in small mode" in notebooks
  # and it does: the recipe leaves the variable to the caller
  assert not any("ALLREDUCE_JAX_SMALL" in line for line in _dry_run("notebooks"))
