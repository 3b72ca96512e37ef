"""Every ```python and ```bash block of README.md and docs/*.md runs as written.

- Python blocks run in a fresh interpreter with 8 emulated CPU devices
  (``JAX_NUM_CPU_DEVICES=8``). What a block prints is written in the block, one line of
  output per ``# prints: TEXT`` comment (at the end of the ``print`` line or on a line of
  its own), and compared with its stdout line by line: the words exactly, every number
  within 1e-4 relative, or within 10 % where the comment says ``# prints about: TEXT``
  (training losses move with the JAX version and the machine). A block that prints
  without saying what is a failure.
- Bash blocks run with ``bash -eo pipefail`` in an empty folder, with this
  environment's ``allreduce-jax`` and ``python`` first on ``PATH`` and results written
  under that folder (``ALLREDUCE_JAX_RESULTS``): commands there use small arguments.
- A block that cannot run here (it needs root, a network, a cluster, or takes many
  minutes) says so right above its fence: ``<!-- not run: REASON -->``. Nothing else is
  skipped, and a shell block spelled ``sh``/``shell``/``console`` is refused (spell it
  ``bash`` so it runs).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(\S[^>]*?)\s*-->\s*$")
PRINTS = re.compile(r"#\s*prints( about)?:\s?(.*?)\s*$")
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
RUNNABLE = {"python", "bash"}
REFUSED = {"sh", "shell", "console", "py", "python3", "pycon", "zsh"}
TIMEOUT_S = 600


@dataclass(frozen=True)
class Block:
  path: Path
  line: int
  lang: str
  code: str
  not_run: str | None  # the stated reason, or None

  @property
  def id(self) -> str:
    return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
  text = path.read_text()
  found = []
  for m in FENCE.finditer(text):
    line = text.count("\n", 0, m.start()) + 1
    before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
    reason = NOT_RUN.search(before)
    found.append(Block(path, line, m.group(1), m.group(2), reason and reason.group(1)))
  return found


ALL = [b for path in FILES for b in blocks(path)]
RUN = [b for b in ALL if b.lang in RUNNABLE and b.not_run is None]


def expected_output(code: str) -> list[tuple[str, bool]]:
  """(text, loose) per ``# prints:`` comment, in order."""
  out = []
  for line in code.splitlines():
    m = PRINTS.search(line)
    if m:
      out.append((m.group(2), m.group(1) is not None))
  return out


def same_line(got: str, want: str, loose: bool) -> bool:
  """The words equal and every number close (1e-4 relative; 10 % when loose)."""
  if NUMBER.sub("#", got).split() != NUMBER.sub("#", want).split():
    return False
  rel = 0.1 if loose else 1e-4
  return all(
    math.isclose(float(a), float(b), rel_tol=rel, abs_tol=rel * 1e-2)
    for a, b in zip(NUMBER.findall(got), NUMBER.findall(want), strict=True)
  )


def _env(tmp_path: Path) -> dict:
  env = dict(os.environ)
  env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
  env["JAX_NUM_CPU_DEVICES"] = "8"
  env["JAX_PLATFORMS"] = "cpu"
  env["ALLREDUCE_JAX_RESULTS"] = str(tmp_path / "results")
  env.pop("XLA_FLAGS", None)
  return env


def test_the_guides_have_blocks_and_every_skip_says_why():
  assert len(RUN) >= 10, [b.id for b in RUN]
  for b in ALL:
    assert b.lang not in REFUSED, f"{b.id}: spell a {b.lang!r} block 'bash' or 'python'"
    if b.not_run is not None:
      assert b.lang in RUNNABLE, f"{b.id}: 'not run' marks a block that would not run anyway"
      assert len(b.not_run) > 5, f"{b.id}: say why the block is not run"


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_resolves():
  """A guide's links to files and folders of this repository point at something."""
  broken = []
  for path in FILES:
    text = FENCE.sub("", path.read_text())
    for target in LINK.findall(text):
      if re.match(r"[a-z]+:", target) or target.startswith("#"):
        continue  # outside links and anchors in the same page
      if not (path.parent / target.split("#")[0]).exists():
        broken.append(f"{path.relative_to(ROOT)}: {target}")
  assert not broken, broken


def test_expected_output_is_compared_word_by_word_and_number_by_number():
  assert same_line("[112. 120. 128. 136.]", "[112. 120. 128. 136.]", False)
  assert not same_line("[112. 120. 128. 137.]", "[112. 120. 128. 136.]", False)
  assert same_line("loss 2.42 -> 0.09", "loss 2.4 -> 0.095", True)
  assert not same_line("loss 2.42 -> 0.20", "loss 2.4 -> 0.095", True)
  assert not same_line("True", "False", False)
  assert expected_output("print(1)  # prints: 1\n# prints about: a 2\n") == [
    ("1", False),
    ("a 2", True),
  ]


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN, ids=[b.id for b in RUN])
def test_block_runs(block: Block, tmp_path):
  if block.lang == "python":
    script = tmp_path / "block.py"
    script.write_text(block.code)
    argv = [sys.executable, str(script)]
  else:
    argv = ["bash", "-eo", "pipefail", "-c", block.code]
  proc = subprocess.run(
    argv,
    cwd=tmp_path,
    env=_env(tmp_path),
    capture_output=True,
    text=True,
    timeout=TIMEOUT_S,
  )
  assert proc.returncode == 0, f"{block.id} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
  if block.lang != "python":
    return
  got = [line for line in proc.stdout.splitlines() if line.strip()]
  want = expected_output(block.code)
  assert len(got) == len(want), (
    f"{block.id}: printed {len(got)} lines, its '# prints:' comments say {len(want)}:\n"
    + "\n".join(got)
  )
  for g, (w, loose) in zip(got, want, strict=True):
    assert same_line(g, w, loose), f"{block.id}: printed {g!r}, the block says {w!r}"
