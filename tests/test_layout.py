"""The layout: the library never imports the tools wing, no module imports another in a
cycle or reaches for another module's private names, and an algorithm registered with one
``register(...)`` reaches verify, bench, audit, scaling and the report with no other change."""

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import allreduce_jax
from allreduce_jax import ALGORITHMS, Algorithm, cli, cost_model, register, topology
from allreduce_jax.tools import audit, report, scaling

PACKAGE = Path(allreduce_jax.__file__).parent


def _modules() -> dict[str, Path]:
  """Every module of the package (tools and training included): dotted name -> file."""
  out = {}
  for f in sorted(PACKAGE.rglob("*.py")):
    parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
    out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
  return out


def _imports(tree: ast.AST, modules: dict[str, Path]):
  """``(node, imported module, name or None)`` for every import statement anywhere in
  ``tree`` (function-local ones too) and every ``importlib.import_module("...")`` of a
  literal, resolved to the package's own modules."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        yield node, a.name, None
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      for a in node.names:
        full = f"{node.module}.{a.name}"
        yield (node, full, None) if full in modules else (node, node.module, a.name)
    elif (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Attribute)
      and node.func.attr == "import_module"
      and node.args
      and isinstance(node.args[0], ast.Constant)
    ):
      yield node, node.args[0].value, None


def _import_graph() -> dict[str, set[str]]:
  modules = _modules()
  graph = {m: set() for m in modules}
  for m, f in modules.items():
    for _, target, _ in _imports(ast.parse(f.read_text()), modules):
      if target in modules and target != m:
        graph[m].add(target)
  return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while not comp or comp[-1] != v:
        comp.append(stack.pop())
        on.discard(comp[-1])
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_the_cycle_finder_finds_a_cycle():
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
  """Counting function-local imports too: a cycle hidden inside functions is still one."""
  assert _cycles(_import_graph()) == []


def _local_imports(source: str) -> list[str]:
  """Imports of the package's own modules inside a function (``line: statement``): an
  import that hides an ordering problem, or work, from the module's top."""
  found = []
  for fn in ast.walk(ast.parse(source)):
    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
      for node in ast.walk(fn):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom):
          names = [node.module or ""] if node.level == 0 else ["."]
        if any(n == "." or n.split(".")[0] == "allreduce_jax" for n in names):
          found.append(f"{node.lineno}: {ast.unparse(node)}")
  return found


def test_the_local_import_finder_finds_them():
  src = "import json\ndef f():\n  import numpy\n  from allreduce_jax import units\n  return units\n"
  assert _local_imports(src) == ["4: from allreduce_jax import units"]


def test_no_module_imports_its_own_package_inside_a_function():
  found = {m: _local_imports(f.read_text()) for m, f in _modules().items()}
  assert {m: v for m, v in found.items() if v} == {}


def _private_uses(source: str, modules: dict[str, Path]) -> list[str]:
  """``module._name`` that ``source`` imports or reads from another module of the
  package (private modules themselves may be imported: they are the package's own)."""
  tree = ast.parse(source)
  bound, found = {}, []
  for node, target, name in _imports(tree, modules):
    if not target.startswith("allreduce_jax"):
      continue
    if name is not None and name.startswith("_") and not name.startswith("__"):
      found.append(f"{target}.{name}")
    if isinstance(node, ast.ImportFrom) and name is None:
      for a in node.names:
        if f"{node.module}.{a.name}" == target:
          bound[a.asname or a.name] = target
    elif isinstance(node, ast.Import):
      for a in node.names:
        if a.asname and a.name == target:
          bound[a.asname] = target
  for node in ast.walk(tree):
    if (
      isinstance(node, ast.Attribute)
      and isinstance(node.value, ast.Name)
      and node.value.id in bound
      and node.attr.startswith("_")
      and not node.attr.startswith("__")
      and f"{bound[node.value.id]}.{node.attr}" not in modules
    ):
      found.append(f"{bound[node.value.id]}.{node.attr}")
  return sorted(set(found))


def test_the_private_name_finder_finds_them():
  modules = {"allreduce_jax.a": Path("a.py"), "allreduce_jax._b": Path("_b.py")}
  src = "from allreduce_jax.a import _x, y\nfrom allreduce_jax import _b\n_b._z + _b.w\n"
  assert _private_uses(src, modules) == ["allreduce_jax._b._z", "allreduce_jax.a._x"]


def test_no_library_module_uses_a_private_name_of_another():
  modules = _modules()
  found = {m: _private_uses(f.read_text(), modules) for m, f in modules.items()}
  assert {m: v for m, v in found.items() if v} == {}


NOTEBOOKS = PACKAGE.parent / "notebooks"


def _notebook_sources(path: Path) -> str:
  """The code of a notebook: a jupytext ``.py`` as it is, an ``.ipynb`` (JSON) as its
  code cells joined (IPython magics and shell lines dropped)."""
  if path.suffix == ".py":
    return path.read_text()
  cells = json.loads(path.read_text())["cells"]
  code = (
    "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
    for c in cells
    if c["cell_type"] == "code"
  )
  return "\n".join(
    line for cell in code for line in cell.splitlines() if not line.lstrip().startswith(("%", "!"))
  )


def _private_imports(source: str, modules: dict[str, Path]) -> list[str]:
  """Every private module of the package ``source`` imports, and every private name
  it takes or reads from one of the package's modules."""
  found = [
    target
    for _, target, _ in _imports(ast.parse(source), modules)
    if target.startswith("allreduce_jax")
    and any(part.startswith("_") and not part.startswith("__") for part in target.split("."))
  ]
  return sorted(set(found) | set(_private_uses(source, modules)))


def test_the_notebook_import_finder_finds_them(tmp_path):
  modules = {"allreduce_jax._b": Path("_b.py"), "allreduce_jax.tools._c": Path("_c.py")}
  src = "from allreduce_jax import _b\nimport allreduce_jax.tools._c\nfrom allreduce_jax.units import _f\n"
  assert _private_imports(src, modules) == [
    "allreduce_jax._b",
    "allreduce_jax.tools._c",
    "allreduce_jax.units._f",
  ]
  nb = {
    "cells": [
      {"cell_type": "code", "source": ["%matplotlib inline\n", "from allreduce_jax import _b\n"]}
    ]
  }
  path = tmp_path / "probe.ipynb"
  path.write_text(json.dumps(nb))
  assert _private_imports(_notebook_sources(path), modules) == ["allreduce_jax._b"]


def test_notebooks_import_no_private_module():
  """Notebooks are thin over the public library and tools: no ``_module``, no ``_name``."""
  modules = _modules()
  books = sorted(NOTEBOOKS.glob("*.py")) + sorted(NOTEBOOKS.glob("*.ipynb"))
  assert books
  found = {b.name: _private_imports(_notebook_sources(b), modules) for b in books}
  assert {b: v for b, v in found.items() if v} == {}


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


def test_import_allreduce_jax_loads_neither_the_tools_wing_nor_the_namespace_builder():
  """``import allreduce_jax`` is the algorithms and their cost model: not the tools, not
  the emulated cluster's namespaces (``netns``; the model of its links is ``networks``)."""
  code = (
    "import sys, allreduce_jax\n"
    "print(sorted(m for m in sys.modules if m.startswith(('allreduce_jax.tools',"
    " 'allreduce_jax.netns'))))"
  )
  res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert res.returncode == 0, res.stderr[-2000:]
  assert res.stdout.strip() == "[]"


@pytest.fixture
def toy():
  """A ring variant (the library's ring under another name), registered once."""
  ring = ALGORITHMS["ring"]

  def toy_ring(flat, axis_name, combine):  # flat: T[n]
    return ring(flat, axis_name, combine)

  register(
    Algorithm(
      "toy_ring",
      toy_ring,
      auto=False,
      schedule=ring.schedule,
      messages=ring.messages,
      two_level=ring.two_level,
      summary="a test's ring",
    )
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
  # scaling: both sweeps take it from its record (a two-level model, a message generator).
  assert toy in scaling.two_level_algorithms() and toy in scaling.topology_algorithms()
  machine = cost_model.TwoLevel(cost_model.PRESETS["nvlink4"], cost_model.PRESETS["ib_ndr"])
  rows = scaling.sweep(machine, "gpu-cluster", ps=(16,), sizes=(1 << 20,))
  got = {r["algorithm"]: r["predicted_us"] for r in rows}
  assert got[toy] == got["ring"] > 0
  rows = scaling.sweep_topology(topology.torus((16,)), machine.outer, (16,), (1 << 20,))
  got = {r["algorithm"]: r["predicted_us"] for r in rows}
  assert got[toy] == got["ring"] > 0


def test_a_registered_arm_and_workload_reach_table_c(tmp_path):
  """Adding a training arm or a workload is one ``register`` / ``register_workload``: the
  configs accept them and Table C runs them (the toy arm's curve is synthetic, so no
  training runs; its timeline is the sync family's)."""
  from allreduce_jax.training import arms, catalogue, configs, experiments, families

  sync = families.sync_arm(0)

  def toy_run(setup, workload, timeline, seed):
    return arms.Curve(eval_updates=[0, len(timeline.time)], metric=[0.1, 0.99], diverged=False,
                      final_loss=0.5)  # fmt: skip

  arms.register(arms.Arm("toy_arm", "sync", sync.make_schedule, sync.comm_seconds,
                         sync.bytes_per_sample, toy_run, "a test's arm"))  # fmt: skip
  arms.register_workload("toy_workload", catalogue.digits_workload("mlp", 0.5))
  try:
    cfg = configs.TableCConfig.smoke(arms=("toy_arm",), workloads=("toy_workload",))
    (row,) = experiments.run_table_c(cfg, tmp_path, smoke=True, log=lambda line: None)
    assert (row["arm"], row["workload"], row["test_metric"]) == (
      "toy_arm",
      "digits_mlp",
      [0.1, 0.99],
    )
    assert row["time_to_target"] == row["total_time"] > 0
  finally:
    del arms.ARMS["toy_arm"], arms.WORKLOADS["toy_workload"]
