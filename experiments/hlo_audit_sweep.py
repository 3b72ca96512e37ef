"""HLO communication audit for p = 2 ... 64, compile-only, one subprocess per p:
permutes and bytes per participant vs the formulas, and compile time vs p
(results/hlo_audit.jsonl + PNG).

  python experiments/hlo_audit_sweep.py [--smoke]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from allreduce_jax.tools import audit


@dataclass(frozen=True)
class Config:
  ps: str = "2,4,8,16,32,64"
  nbytes: int = 1 << 16
  out: str = "results/hlo_audit.jsonl"


SMOKE = Config(ps="2,4", out="results/hlo_audit.smoke.jsonl")


def run(cfg: Config) -> int:
  return audit.main(["--ps", cfg.ps, "--bytes", str(cfg.nbytes), "--out", cfg.out])


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--smoke", action="store_true")
  raise SystemExit(run(SMOKE if parser.parse_args().smoke else Config()))
