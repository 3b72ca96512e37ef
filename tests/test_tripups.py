"""What a newcomer meets first: the core install, options that do what they say, one
unit convention and one size label everywhere, help on every option."""

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from allreduce_jax import cli, cost_model, units
from allreduce_jax.tools import COMMANDS, dispatch
from allreduce_jax.tools import train as train_tool

#: The dependencies of the extras (pyproject.toml), none of which the core install has.
EXTRA_MODULES = ("flax", "matplotlib", "sklearn", "scipy", "tqdm")

#: Run first in a subprocess: importing any of EXTRA_MODULES fails as if not installed.
_BLOCK = textwrap.dedent(
  f"""
  import importlib.abc, sys
  class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
      if name.partition(".")[0] in {EXTRA_MODULES!r}:
        raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
  sys.meta_path.insert(0, Absent())
  """
)


#: The README's first example (the core API only), printing its result as JSON.
CORE_EXAMPLE = f"""
import json
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import allreduce_jax
from allreduce_jax import (all_reduce, all_reduce_tree, all_reduce_gradients, powersgd, topk,
                           ALGORITHMS, OPS)

jax.config.update("jax_num_cpu_devices", 8)
mesh = jax.make_mesh((8,), ("data",))
x = jax.device_put(jnp.arange(32.0), NamedSharding(mesh, P("data")))


@jax.jit
@jax.shard_map(mesh=mesh, in_specs=P("data"), out_specs=P())
def f(block):
  return all_reduce(block, "data", op="sum", algorithm="ring")


print(json.dumps(f(x).tolist()))
EXTRA = set({EXTRA_MODULES!r})
"""


def _without_extras(code: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run(
    [sys.executable, "-c", _BLOCK + textwrap.dedent(code)],
    capture_output=True,
    text=True,
    env=env,
    timeout=300,
  )


def test_the_library_imports_and_runs_with_the_core_dependencies_only():
  done = _without_extras(CORE_EXAMPLE + "\nimport sys\nprint(sorted(set(sys.modules) & EXTRA))")
  assert done.returncode == 0, done.stderr
  result, loaded = done.stdout.strip().splitlines()[-2:]
  # each of 8 devices holds 4 of arange(32): the sum over devices of element j is 112 + 8j
  assert json.loads(result) == [112.0, 120.0, 128.0, 136.0]
  assert loaded == "[]"


@pytest.mark.parametrize(
  "argv, extra",
  [
    (["verify", "--devices", "2", "--algorithms", "ring"], "cli"),  # tqdm
    (["train", "sync", "--smoke"], "train"),  # flax
    (["report", "--smoke"], "train"),  # tqdm first, but report trains too
  ],
)
def test_a_subcommand_without_its_extra_names_the_extra(argv, extra):
  done = _without_extras(f"from allreduce_jax.cli import main; raise SystemExit(main({argv!r}))")
  assert done.returncode != 0
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1, done.stderr  # one line, no traceback
  assert f"pip install 'allreduce-jax[{extra}]'" in lines[0]
  assert lines[0].startswith(f"allreduce-jax {argv[0]}: needs ")


def test_a_module_of_no_extra_is_not_blamed_on_an_extra():
  with pytest.raises(ModuleNotFoundError):
    dispatch._missing_extra(ModuleNotFoundError("No module named 'nope'", name="nope"))


def test_scaling_smoke_keeps_a_lower_max_p(tmp_path, capsys):
  out = tmp_path / "scaling.jsonl"
  assert cli.main(["scaling", "--smoke", "--max-p", "16", "--out", str(out)]) == 0
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert {r["p"] for r in rows} == {8, 16}
  out.unlink()
  assert cli.main(["scaling", "--smoke", "--out", str(out)]) == 0  # --smoke alone: up to 64
  assert max(json.loads(line)["p"] for line in out.read_text().splitlines()) == 64


@pytest.mark.parametrize(
  "argv, option",
  [
    (["--link", "100Gbit"], "--link"),
    (["--hop-latency-us", "1"], "--hop-latency-us"),
    (["--ps", "24576"], "--ps"),
    (["--topology", "switch", "--inner", "nvlink4"], "--inner"),
    (["--topology", "switch", "--outer", "5,50GB/s"], "--outer"),
  ],
)
def test_scaling_refuses_an_option_of_the_other_model(argv, option, tmp_path):
  out = tmp_path / "scaling.jsonl"
  with pytest.raises(SystemExit, match=f"^{option} applies only (with|without) --topology"):
    cli.main(["scaling", "--smoke", *argv, "--out", str(out)])
  assert not out.exists()


def test_a_bare_number_is_no_rate_for_any_option(capsys):
  # The same text, refused the same way by train --bandwidth and scaling --link/--inner.
  for parse in (
    lambda t: units.parse_rate(t, "--bandwidth"),
    lambda t: cost_model.parse_link(f"5,{t}", "--link"),
  ):
    with pytest.raises(ValueError, match=r"'100'.* no unit"):
      parse("100")
    assert parse("100Gbit") == parse("12.5GB/s")  # bits or bytes per second, never neither
  with pytest.raises(SystemExit) as e:
    cli.main(["train", "phase", "--smoke", "--bandwidth", "100"])
  assert e.value.code == 2 and "has no unit" in capsys.readouterr().err
  with pytest.raises(SystemExit, match="'100' has no unit"):
    cli.main(["scaling", "--smoke", "--topology", "switch", "--link", "5,100"])


LINKS = ("link", "inner", "outer")


def _rate_options():
  """(subcommand, parser, action) of every option that takes a rate."""
  found = []
  for name, (module, _) in COMMANDS.items():
    for path, p in _parsers(name, importlib.import_module(module)):
      for a in p._actions:
        if a.option_strings and (a.metavar in ("RATE", "RATES") or a.dest in LINKS):
          found.append((path, a))
  return found


def test_every_rate_option_documents_the_one_unit_convention():
  found = _rate_options()
  assert {"cluster --link", "scaling --link", "train table-c --bandwidth"} <= {
    f"{path} {a.option_strings[-1]}" for path, a in found
  }
  for path, a in found:
    if path == "scaling" and a.dest in ("outer", "link"):  # they refer to --inner's forms
      assert "the same forms as --inner" in a.help
    else:
      assert units.RATE_HELP[1:] in a.help, f"{path} {a.option_strings}"


def test_train_options_take_the_rate_parser():
  p = argparse.ArgumentParser()
  train_tool.configure(p)
  args = p.parse_args(["phase", "--bandwidths", "1Gbit,12.5GB/s"])
  assert args.bandwidths_GBps == pytest.approx((0.125, 12.5))


@pytest.mark.parametrize(
  "nbytes, label",
  [(1024, "1 KiB"), (128 << 10, "128 KiB"), (131064, "128 KiB"), (1025638, "1001.6 KiB"),
   (1000, "1000 B"), (3 << 20, "3 MiB"), (1048575, "1 MiB"), (int(4.5e9), "4.2 GiB")],
)  # fmt: skip
def test_size_labels_have_no_trailing_zero_and_a_space(nbytes, label):
  assert units.format_bytes(nbytes) == label
  assert units.format_bytes(nbytes, sep="") == label.replace(" ", "")


def _parsers(name, module):
  """``(path, parser)`` of subcommand ``name`` and of each of its own subcommands."""
  root = argparse.ArgumentParser(prog=f"allreduce-jax {name}")
  module.configure(root)
  todo, out = [(name, root)], []
  while todo:
    path, p = todo.pop()
    out.append((path, p))
    for a in p._actions:
      if isinstance(a, argparse._SubParsersAction):
        todo += [(f"{path} {child}", c) for child, c in a.choices.items()]
  return out


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_of_every_subcommand_has_help(name):
  """Its own words, not just the default ``cli`` adds: ``(default ...)`` alone is not help."""
  missing = []
  for path, p in _parsers(name, importlib.import_module(COMMANDS[name][0])):
    for a in p._actions:
      if a.help is argparse.SUPPRESS or isinstance(a, argparse._SubParsersAction):
        continue
      text = (a.help or "").strip()
      if not text or text.startswith("(default"):
        missing.append(f"{path} {'/'.join(a.option_strings) or a.dest}")
  assert not missing, missing


def test_jax_coordinator_address_alone_is_left_to_jax():
  """JAX reads JAX_COORDINATOR_ADDRESS itself (with its cluster auto-detection); only
  with a process count or index beside it is it an explicit cluster here."""
  from allreduce_jax import distributed

  assert distributed.initialize_from_env({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}) is False
  with pytest.raises(ValueError, match="together"):
    distributed.initialize_from_env(
      {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1", "JAX_PROCESS_ID": "0"}
    )
  # JAX reads JAX_COORDINATOR_ADDRESS, not the process count and index: nothing may call those
  # JAX's own names.
  assert not re.search(r"JAX's own[^.]*JAX_(NUM_PROCESSES|PROCESS_ID)", distributed.__doc__)


def test_core_dependencies_are_the_library_s_and_each_extra_module_has_its_extra():
  import re
  import tomllib
  from pathlib import Path

  project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]

  def names(reqs):
    return {re.split(r"[<>=\[ ;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}

  assert names(project["dependencies"]) == {"jax", "numpy", "ml-dtypes", "optax"}
  extras = project["optional-dependencies"]
  distribution = {"sklearn": "scikit-learn"}  # import name -> what pip installs
  for module, extra in dispatch.EXTRAS.items():
    assert distribution.get(module, module) in names(extras[extra]), (module, extra)


def test_fusion_smoke_keeps_an_explicit_size(tmp_path):
  from allreduce_jax.tools import fusion_bench

  out = tmp_path / "fusion.jsonl"
  argv = ["fusion", "--smoke", "--models", "transformer", "--algorithms", "ring", "--devices", "2"]
  assert cli.main([*argv, "--buckets", "one", "--layers", "3", "--out", str(out)]) == 0
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert {r["n_leaves"] for r in rows} == {len(fusion_bench.transformer_shapes(3, 16))}
  assert {r["iters"] for r in rows} == {3}  # the rest of --smoke stays
