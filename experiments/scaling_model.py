"""Predicted all-reduce time from 8 to 16384 devices (NVLink nodes of 8 on InfiniBand,
and the locally fitted parameters): results/scaling.jsonl + PNG.

  python experiments/scaling_model.py [--smoke]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from allreduce_jax.cli import main


@dataclass(frozen=True)
class Config:
  inner: str = "nvlink4"
  outer: str = "ib_ndr"
  per_node: int = 8
  sizes: str = "1MiB,100MiB,1GiB"
  out: str = "results/scaling.jsonl"


def run(cfg: Config, smoke: bool = False) -> int:
  argv = [
    "scaling",
    "--inner",
    cfg.inner,
    "--outer",
    cfg.outer,
    "--per-node",
    str(cfg.per_node),
    "--sizes",
    cfg.sizes,
    "--out",
    cfg.out,
  ]
  return main([*argv, "--smoke"] if smoke else argv)


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--smoke", action="store_true")
  smoke = parser.parse_args().smoke
  raise SystemExit(run(Config(out="results/scaling.smoke.jsonl") if smoke else Config(), smoke))
