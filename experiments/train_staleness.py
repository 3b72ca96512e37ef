"""Table A: test accuracy under fixed staleness τ (plain async, η/τ, DC-ASGD, sync).

  .venv/bin/python experiments/train_staleness.py            # default: a couple of minutes
  .venv/bin/python experiments/train_staleness.py --smoke    # seconds

Every config field is an option (``--learning-rate 0.01 --taus 0,4,16 ...``).
Writes ``results/staleness[.smoke]/``: ``staleness.jsonl`` (one row per run; rerun
to resume), ``table_a.md`` and ``staleness_curves.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
  from allreduce_jax import _devices
  from allreduce_jax.training import experiments as ex

  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--smoke", action="store_true", help="tiny preset (seconds)")
  parser.add_argument("--out", default=None, help="output folder")
  parser.add_argument("--devices", type=int, default=8, help="emulated CPU devices")
  ex.add_config_arguments(parser, ex.StalenessConfig)
  args = parser.parse_args(argv)
  try:
    _devices.use_cpu_devices(args.devices)
    cfg = ex.config_from_arguments(ex.StalenessConfig, args, smoke=args.smoke)
  except ValueError as e:
    parser.error(str(e))
  out = Path(args.out or ("results/staleness.smoke" if args.smoke else "results/staleness"))
  rows = ex.run_staleness_sweep(cfg, out)
  print(ex.write_staleness_outputs(rows, out)[0].read_text())
  return 0


if __name__ == "__main__":
  sys.exit(main())
