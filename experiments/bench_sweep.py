"""nccl-tests-style sweep on 8 emulated CPU devices, then the α-β-γ fit, then a second
side-by-side sweep with ``auto`` using the fit (results/bench_*.jsonl, PNG, cost_params.json).

  python experiments/bench_sweep.py [--smoke]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from allreduce_jax.cli import main


@dataclass(frozen=True)
class Config:
  devices: int = 8
  min_bytes: str = "1KiB"
  max_bytes: str = "64MiB"
  factor: int = 4
  iters: int = 7
  out_fit: str = "results/bench_fit_cpu8.jsonl"
  out: str = "results/bench_cpu8.jsonl"


SMOKE = Config(
  max_bytes="16KiB",
  iters=3,
  out_fit="results/bench_fit.smoke.jsonl",
  out="results/bench.smoke.jsonl",
)


def run(cfg: Config) -> int:
  common = [
    "--devices",
    str(cfg.devices),
    "--min-bytes",
    cfg.min_bytes,
    "--max-bytes",
    cfg.max_bytes,
    "--factor",
    str(cfg.factor),
    "--iters",
    str(cfg.iters),
  ]
  first = [
    "bench",
    *common,
    "--algorithms",
    "ring,bidirectional_ring,tree,recursive_doubling,halving_doubling,naive,hierarchical,psum",
    "--out",
    cfg.out_fit,
    "--fit",
  ]
  second = [
    "bench",
    *common,
    "--algorithms",
    "ring,bidirectional_ring,tree,recursive_doubling,halving_doubling,psum,auto",
    "--out",
    cfg.out,
  ]
  return main(first) or main(second)


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--smoke", action="store_true")
  raise SystemExit(run(SMOKE if parser.parse_args().smoke else Config()))
