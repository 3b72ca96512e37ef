"""Every study in experiments/ stays readable and reproducible from what it commits.

- experiments/ holds only study folders and the index, which names each study once;
- every study's README opens with the question, the answer and the command, and its file
  table names every file of the study (a path or a glob, relative to the study);
- a study's Python files are scripts (run as ``python experiments/STUDY/NAME.py``: an
  ``if __name__ == "__main__":`` block) or modules (no such block: imported, never run);
  every file imports without doing work (no output, no file, no JAX backend started),
  the library's public names only, and of the studies' files only a module of its own
  study, by its bare name (``import rounds``), as Python finds it beside the script it
  runs; a module's name is its study's alone and shadows no importable module;
- no script has a ``main`` of its own or writes rows by hand: a study's tables are written
  by ``results.write_tables`` (``tables.py``), its commands parsed by argparse subcommands
  (``run.py``), its rows appended through the row store (``results.RowStore``);
- every table a study commits is regenerated from its committed rows, text for text
  (``tables()`` of the study's scripts: ``{path relative to the study: text}``).
"""

import ast
import fnmatch
import re
import subprocess
import sys
from importlib.machinery import PathFinder
from pathlib import Path

import pytest
import study_script

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
STUDIES = sorted(p.name for p in EXPERIMENTS.iterdir() if p.is_dir() and p.name != "__pycache__")
SCRIPTS = sorted(p for s in STUDIES for p in (EXPERIMENTS / s).glob("*.py"))  # and modules


_MAIN_TESTS = ("__name__ == '__main__'", '__name__ == "__main__"')


def _runs_as_main(source: str) -> bool:
  """Whether the file has a top-level ``if __name__ == "__main__":`` block (a script)."""
  return any(
    isinstance(node, ast.If) and ast.unparse(node.test) in _MAIN_TESTS
    for node in ast.parse(source).body
  )


MODULES = [p for p in SCRIPTS if not _runs_as_main(p.read_text())]


def _study_files(study: str) -> list[str]:
  """The study's files that git tracks or would track (built and ignored files aside)."""
  out = subprocess.run(
    ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", f"experiments/{study}"],
    cwd=ROOT, capture_output=True, text=True, check=True,
  ).stdout  # fmt: skip
  prefix = f"experiments/{study}/"
  return sorted(
    line.removeprefix(prefix)
    for line in out.splitlines()
    if line and (ROOT / line).exists() and "__pycache__" not in line
  )


def _file_table(readme: str) -> list[str]:
  """Every backticked path in the first column of the table under the README's "## Files"."""
  assert "\n## Files\n" in readme, "no '## Files' section"
  section = readme.split("\n## Files\n", 1)[1].split("\n## ", 1)[0]
  names = []
  for line in section.splitlines():
    cells = line.split("|")
    if line.startswith("|") and len(cells) > 2:
      names += re.findall(r"`([^`]+)`", cells[1])
  return names


def test_experiments_holds_study_folders_and_an_index_naming_each_once():
  loose = sorted(p.name for p in EXPERIMENTS.iterdir() if p.is_file() and p.name != "README.md")
  assert loose == [], f"loose files at experiments/'s top: {loose}"
  index = (EXPERIMENTS / "README.md").read_text()
  for study in STUDIES:
    assert index.count(f"]({study}/)") == 1, f"experiments/README.md must link {study}/ once"


@pytest.mark.parametrize("study", STUDIES)
def test_readme_opens_with_question_answer_command_and_lists_every_file(study):
  readme = (EXPERIMENTS / study / "README.md").read_text()
  head = readme.split("\n## ")[0]
  for part in ("**Question.**", "**Answer.**", "**Reproduce.**"):
    assert part in head, f"{study}/README.md: no {part} before its first section"
  names = _file_table(readme)
  unnamed = [f for f in _study_files(study) if not any(fnmatch.fnmatch(f, n) for n in names)]
  assert unnamed == [], f"{study}/README.md's file table does not name {unnamed}"
  missing = [n for n in names if not any(fnmatch.fnmatch(f, n) for f in _study_files(study))]
  assert missing == [], f"{study}/README.md's file table names files that do not exist: {missing}"


def _private(name: str) -> bool:
  return name.startswith("_") and not name.startswith("__")


def _import_problems(source: str, own: set[str], others: dict[str, str]) -> list[str]:
  """What a study's file imports beyond what it may: ``own``, the names of its study's
  modules, it may import; ``others``, every other study file's name (the study's scripts,
  other studies' scripts and modules) to what it is, it may not. No relative import (a
  study folder is no package), no private module or ``_name`` (from the library or an own
  module), no ``alias._name`` of either."""
  found, aliases = [], set()
  tree = ast.parse(source)
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.level:
      found.append(f"line {node.lineno}: a relative import (a study folder is no package)")
      continue
    if isinstance(node, ast.Import):
      modules = [(a.name, a.asname or a.name.split(".")[0]) for a in node.names]
      names = []
    elif isinstance(node, ast.ImportFrom):
      modules = [(node.module, None)]
      names = node.names
    else:
      continue
    for module, alias in modules:
      top = module.split(".")[0]
      if top in others:
        found.append(f"line {node.lineno}: imports {top}, {others[top]}")
      if any(_private(part) for part in module.split(".")):
        found.append(f"line {node.lineno}: imports the private {module}")
      mine = top == "allreduce_jax" or top in own
      if mine and alias:
        aliases.add(alias)
      for a in names:
        if _private(a.name):
          found.append(f"line {node.lineno}: imports the private {module}.{a.name}")
        elif mine:
          aliases.add(a.asname or a.name)
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
      if node.value.id in aliases and _private(node.attr):
        found.append(f"line {node.lineno}: uses the private {node.value.id}.{node.attr}")
  return sorted(found, key=lambda f: int(f.split(":")[0].split()[1]))


def _what_else(path: Path) -> dict[str, str]:
  """Every study file's name but ``path``'s study's modules, to what it is to ``path``."""
  out = {}
  for p in SCRIPTS:
    if p.parent != path.parent:
      out[p.stem] = f"a {'module' if p in MODULES else 'script'} of {p.parent.name}"
    elif p not in MODULES:
      out[p.stem] = "a script"
  return out


def test_the_import_finder_finds_them():
  src = (
    "import rounds\nfrom rounds import trace\n"
    "import steps\nfrom tables import cells\nimport wire_bytes\n"
    "from . import rounds\nfrom allreduce_jax._ring import x\n"
    "from allreduce_jax import _api, results\nfrom rounds import _hidden\n"
    "results._store\nrounds._stamp\n"
  )
  others = {"steps": "a script", "tables": "a script", "wire_bytes": "a script of faults"}
  assert [p.split(":")[0] for p in _import_problems(src, {"rounds"}, others)] == [
    "line 3", "line 4", "line 5", "line 6", "line 7", "line 8", "line 9", "line 10", "line 11",
  ]  # fmt: skip
  ok = "import jax\nimport rounds\nfrom rounds import trace\nfrom allreduce_jax import results\n"
  assert _import_problems(ok, {"rounds"}, others) == []


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_files_import_public_names_and_only_their_own_study_s_modules(path):
  own = {p.stem for p in MODULES if p.parent == path.parent}
  problems = _import_problems(path.read_text(), own, _what_else(path))
  assert problems == [], f"{path.relative_to(ROOT)}: {problems}"


def test_a_study_module_s_name_is_its_own():
  """Python finds a study's module by its bare name: another study's module of that name, or
  an importable module (the standard library's, an installed package's), would be taken
  for it."""
  names = [p.stem for p in MODULES]
  twice = sorted({n for n in names if names.count(n) > 1})
  assert twice == [], f"study modules of the same name in two studies: {twice}"
  taken = [p.relative_to(ROOT) for p in MODULES  # on sys.path, not what tests loaded before
           if p.stem in sys.stdlib_module_names or PathFinder.find_spec(p.stem)]  # fmt: skip
  assert taken == [], f"study modules named as an importable module: {taken}"


def test_every_study_file_imports_without_doing_work(tmp_path):
  """In a fresh interpreter, in an empty folder: no output, no file, no JAX backend."""
  code = (
    "import sys\n"
    "from pathlib import Path\n"
    f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
    "import study_script\n"
    f"for p in {[str(p) for p in SCRIPTS]!r}:\n"
    "  study_script.load(Path(p))\n"
    "from jax._src import xla_bridge\n"
    "sys.stderr.write('backends started: %s' % xla_bridge.backends_are_initialized())\n"
  )
  done = subprocess.run(
    [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
  )
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout == "", f"importing the scripts printed: {done.stdout[:500]}"
  assert done.stderr.endswith("backends started: False"), done.stderr[-2000:]
  assert list(tmp_path.iterdir()) == []


def _entry_problems(source: str) -> list[str]:
  """What makes a script more than the study's shape allows: a ``main`` of its own, an
  ``if __name__ == "__main__":`` block of more than two statements (the library's writer,
  or the parser and its subcommand), rows written by hand (a file opened to write or
  append, ``json.dump``, ``json.dumps`` written to a file)."""
  tree = ast.parse(source)
  found = []
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "main":
      found.append(f"line {node.lineno}: a main of its own")
    if (
      isinstance(node, ast.If)
      and isinstance(node.test, ast.Compare)
      and ast.unparse(node.test) in _MAIN_TESTS
      and len(node.body) > 2
    ):
      found.append(f"line {node.lineno}: {len(node.body)} statements under __main__")
  for node in ast.walk(tree):
    if not isinstance(node, ast.Call):
      continue
    name = ast.unparse(node.func)
    modes = [a.value for a in (*node.args, *(k.value for k in node.keywords if k.arg == "mode"))
             if isinstance(a, ast.Constant) and isinstance(a.value, str)]  # fmt: skip
    if (name == "open" or name.endswith(".open")) and any(set(m) & set("aw") for m in modes):
      found.append(f"line {node.lineno}: {name}(..., {modes[-1]!r})")
    if name == "json.dump":
      found.append(f"line {node.lineno}: json.dump")
    writes = name.split(".")[-1] in ("write", "write_text", "writelines")
    if writes and any(
      isinstance(n, ast.Call) and ast.unparse(n.func) == "json.dumps" for n in ast.walk(node)
    ):
      found.append(f"line {node.lineno}: {name}(json.dumps(...))")
  return sorted(found, key=lambda f: int(f.split(":")[0].split()[1]))


def test_the_entry_finder_finds_them():
  src = (
    "import json, sys\n"
    "def main():\n  open('rows.jsonl', 'a').write(json.dumps({}))\n"
    "def f(path):\n  path.write_text(json.dumps({}))\n  path.open(mode='w')\n"
    "if __name__ == '__main__':\n  a = 1\n  b = 2\n  sys.exit(main())\n"
  )
  assert [p.split(":")[0] for p in _entry_problems(src)] == [
    "line 2", "line 3", "line 3", "line 5", "line 6", "line 7",
  ]  # fmt: skip
  ok = "from allreduce_jax import results\nif __name__ == '__main__':\n  results.write_tables({}, '.')\n"
  assert _entry_problems(ok) == []


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_script_has_a_main_of_its_own_or_writes_rows_by_hand(script):
  problems = _entry_problems(script.read_text())
  assert problems == [], f"{script.parent.name}/{script.name}: {problems}"


TABLE_SCRIPTS = [p for p in SCRIPTS if re.search(r"^def tables\(", p.read_text(), re.M)]


def test_every_study_with_rows_regenerates_its_tables():
  have = {p.parent.name for p in TABLE_SCRIPTS}
  with_rows = {s for s in STUDIES if (EXPERIMENTS / s / "rows").is_dir()}
  assert with_rows <= have, f"studies with rows but no tables(): {sorted(with_rows - have)}"


@pytest.mark.parametrize("script", TABLE_SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_tables_regenerate_from_committed_rows(script):
  tables = study_script.load(script).tables()
  assert tables, f"{script.name}: tables() returned nothing"
  for name, text in tables.items():
    committed = (script.parent / name).read_text()
    assert text == committed, (
      f"{script.parent.name}/{name} differs from what {script.name} regenerates from the"
      f" committed rows: run `python {script.relative_to(ROOT)}`"
    )
