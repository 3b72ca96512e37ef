"""Every study in experiments/ stays readable and reproducible from what it commits.

- experiments/ holds only study folders and the index, which names each study once;
- every study's README opens with the question, the answer and the command, and its file
  table names every file of the study (a path or a glob, relative to the study);
- every script imports without doing work (no output, no file, no JAX backend started)
  and imports no other script;
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
from pathlib import Path

import pytest
import study_script

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
STUDIES = sorted(p.name for p in EXPERIMENTS.iterdir() if p.is_dir() and p.name != "__pycache__")
SCRIPTS = sorted(p for s in STUDIES for p in (EXPERIMENTS / s).glob("*.py"))


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


def test_scripts_import_no_other_script_and_no_private_name():
  """A script imports the library's public names only: no other script, no private module,
  no ``_name`` from a module, no ``module._name`` of a library module it imported."""
  stems = {p.stem for p in SCRIPTS}

  def private(name):
    return name.startswith("_") and not name.startswith("__")

  for path in SCRIPTS:
    where = path.relative_to(ROOT)
    library_aliases = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        for a in node.names:
          assert a.name.split(".")[0] not in stems, f"{where} imports the script {a.name}"
          assert not any(private(part) for part in a.name.split(".")), f"{where}: {a.name}"
          if a.name.startswith("allreduce_jax"):
            library_aliases.add(a.asname or a.name.split(".")[0])
      elif isinstance(node, ast.ImportFrom) and node.module:
        assert node.module.split(".")[0] not in stems, f"{where} imports the script {node.module}"
        assert not any(private(part) for part in node.module.split(".")), f"{where}: {node.module}"
        for a in node.names:
          assert not private(a.name), f"{where} imports the private {node.module}.{a.name}"
          if node.module.startswith("allreduce_jax"):
            library_aliases.add(a.asname or a.name)
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if node.value.id in library_aliases:
          assert not private(node.attr), f"{where} uses the private {node.value.id}.{node.attr}"


def test_every_script_imports_without_doing_work(tmp_path):
  """In a fresh interpreter, in an empty folder: no output, no file, no JAX backend."""
  code = (
    "import importlib.util, sys\n"
    f"for i, p in enumerate({[str(p) for p in SCRIPTS]!r}):\n"
    "  spec = importlib.util.spec_from_file_location(f'm{i}', p)\n"
    "  sys.modules[spec.name] = importlib.util.module_from_spec(spec)\n"
    "  spec.loader.exec_module(sys.modules[spec.name])\n"
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
      and ast.unparse(node.test) in ("__name__ == '__main__'", '__name__ == "__main__"')
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
