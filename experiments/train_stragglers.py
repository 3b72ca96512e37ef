"""Table B: sync (± backup workers) vs async (± η/τ) under straggling compute times.

  .venv/bin/python experiments/train_stragglers.py            # default: a few minutes
  .venv/bin/python experiments/train_stragglers.py --smoke    # seconds

Every config field is an option (``--compute-models exponential,slow --backups 1,2 ...``).
Writes ``results/stragglers[.smoke]/``: ``stragglers.jsonl`` (one row per run;
rerun to resume), ``table_b.md`` and the figures.
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
  ex.add_config_arguments(parser, ex.StragglerConfig)
  args = parser.parse_args(argv)
  try:
    _devices.use_cpu_devices(args.devices)
    cfg = ex.config_from_arguments(ex.StragglerConfig, args, smoke=args.smoke)
  except ValueError as e:
    parser.error(str(e))
  out = Path(args.out or ("results/stragglers.smoke" if args.smoke else "results/stragglers"))
  rows = ex.run_straggler_sweep(cfg, out)
  print(ex.write_straggler_outputs(rows, out)[0].read_text())
  return 0


if __name__ == "__main__":
  sys.exit(main())
