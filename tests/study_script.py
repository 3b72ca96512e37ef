"""Loads a study's file (``experiments/STUDY/NAME.py``) as a module for the tests."""

import importlib.util
import sys
from pathlib import Path


def load(path: Path):
  """The module of ``path``, named ``study_{folder}_{stem}`` and registered in
  ``sys.modules`` while it loads (dataclasses look their module up then); its folder first
  on ``sys.path`` meanwhile, as when Python runs it, so it finds its study's modules."""
  spec = importlib.util.spec_from_file_location(f"study_{path.parent.name}_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  sys.path.insert(0, str(path.parent))
  try:
    spec.loader.exec_module(module)
  finally:
    sys.path.remove(str(path.parent))
  return module
