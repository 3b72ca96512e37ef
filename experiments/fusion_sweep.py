"""Per-leaf vs bucketed all-reduce of the CNN and a 196-leaf transformer gradient pytree
(results/fusion.jsonl + PNG).

  python experiments/fusion_sweep.py [--smoke]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from allreduce_jax.cli import main


@dataclass(frozen=True)
class Config:
  devices: int = 8
  algorithms: str = "ring,psum"
  layers: int = 16
  d_model: int = 128
  iters: int = 7
  out: str = "results/fusion.jsonl"


def run(cfg: Config, smoke: bool = False) -> int:
  argv = [
    "fusion",
    "--devices",
    str(cfg.devices),
    "--algorithms",
    cfg.algorithms,
    "--layers",
    str(cfg.layers),
    "--d-model",
    str(cfg.d_model),
    "--iters",
    str(cfg.iters),
    "--out",
    cfg.out,
  ]
  return main([*argv, "--smoke"] if smoke else argv)


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--smoke", action="store_true")
  smoke = parser.parse_args().smoke
  raise SystemExit(run(Config(out="results/fusion.smoke.jsonl") if smoke else Config(), smoke))
