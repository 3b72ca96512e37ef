"""The ``allreduce-jax train`` subcommand: sync training, Table A, Table B.

``allreduce-jax train sync``        one synchronous data-parallel run (default);
``allreduce-jax train staleness``   Table A, fixed-τ staleness sweep;
``allreduce-jax train stragglers``  Table B, compute-time models × sync/async arms.

``--smoke`` shrinks every size to a seconds-long run. Sweeps resume: rerunning
the same command skips the runs already in the JSONL file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

WHAT = ("sync", "staleness", "stragglers")


def _int_tuple(name: str):
  def parse(text: str) -> tuple[int, ...]:
    try:
      return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
      raise argparse.ArgumentTypeError(
        f"{name}: expected comma-separated integers, got {text!r}"
      ) from None

  return parse


def _str_tuple(text: str) -> tuple[str, ...]:
  return tuple(v.strip() for v in text.split(",") if v.strip())


def configure(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("what", nargs="?", default="sync", choices=WHAT, help="default: sync")
  parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds)")
  parser.add_argument("--devices", type=int, default=8, help="emulated CPU devices (default 8)")
  parser.add_argument(
    "--out", default=None, help="output folder (default results/train[.smoke]/WHAT)"
  )
  parser.add_argument("--model", default=None, help="mlp or cnn")
  parser.add_argument("--optimizer", default=None, help="sgd, momentum or adam")
  parser.add_argument(
    "--lr",
    type=float,
    default=None,
    help="learning rate (stragglers: the async one; sync uses N times it)",
  )
  parser.add_argument(
    "--algorithm", default=None, help="all-reduce algorithm for sync (default ring)"
  )
  parser.add_argument("--steps", type=int, default=None, help="sync steps / staleness updates")
  parser.add_argument("--workers", type=int, default=None, help="data-parallel participants N")
  parser.add_argument("--seeds", type=_int_tuple("--seeds"), default=None, help="e.g. 0,1,2")
  parser.add_argument(
    "--taus", type=_int_tuple("--taus"), default=None, help="staleness: e.g. 0,4,16"
  )
  parser.add_argument(
    "--compute-models", type=_str_tuple, default=None, help="stragglers: e.g. exponential,slow"
  )
  parser.add_argument(
    "--max-runs", type=int, default=None, help="sweeps: stop after this many new runs"
  )


def build_config(args: argparse.Namespace):
  """The frozen config of ``args.what`` (smoke preset if ``--smoke``), with overrides."""
  from allreduce_jax.training import experiments as ex

  cls = {"sync": ex.SyncConfig, "staleness": ex.StalenessConfig, "stragglers": ex.StragglerConfig}[
    args.what
  ]
  field_of = {
    "sync": {
      "lr": "learning_rate",
      "steps": "steps",
      "workers": "workers",
      "algorithm": "algorithm",
    },
    "staleness": {"lr": "learning_rate", "steps": "updates", "taus": "taus"},
    "stragglers": {
      "lr": "async_lr",
      "steps": "sync_steps",
      "workers": "workers",
      "algorithm": "algorithm",
      "compute_models": "compute_models",
    },
  }[args.what]
  common = {"model": "model", "optimizer": "optimizer", "seeds": "seeds"}
  overrides = {}
  for opt, field in {**common, **field_of}.items():
    value = getattr(args, opt)
    if value is not None:
      overrides[field] = value
  for opt in ("taus", "compute_models", "workers", "algorithm"):
    if getattr(args, opt) is not None and opt not in field_of:
      raise ValueError(f"--{opt.replace('_', '-')} does not apply to 'train {args.what}'.")
  return cls.smoke(**overrides) if args.smoke else cls(**overrides)


def run(args: argparse.Namespace) -> int:
  from allreduce_jax import _devices

  try:
    _devices.use_cpu_devices(args.devices)
    cfg = build_config(args)
    import jax

    workers = getattr(cfg, "workers", 0)
    if workers > jax.device_count():
      raise ValueError(
        f"--workers {workers}: only {jax.device_count()} devices (raise --devices to {workers})."
      )
  except ValueError as e:
    print(f"allreduce-jax train: error: {e}", file=sys.stderr)
    return 2
  from allreduce_jax.training import experiments as ex

  out = Path(args.out or f"results/train{'.smoke' if args.smoke else ''}/{args.what}")
  from allreduce_jax.results import RowsError, RowStore

  store = RowStore(out / f"{args.what}.jsonl", args.what)
  try:
    store.check()  # a foreign or unwritable rows file: refused before any training
    done = store.done()
  except RowsError as e:
    print(f"allreduce-jax train: error: --out: {e}", file=sys.stderr)
    return 2
  t0 = time.perf_counter()
  print(f"# train {args.what}: {json.dumps(dataclasses.asdict(cfg))}", flush=True)
  if args.what == "sync":
    import jax

    # Resume: a seed already trained with this exact config is not trained again.
    config = json.loads(json.dumps(dataclasses.asdict(cfg)))
    rows = []
    for seed in cfg.seeds:
      key = store.key(config=config, seed=seed)
      if key in done:
        rows.append(done[key])
        continue
      row = ex.run_sync(cfg, seed)
      rows.append(row)
      if jax.process_index() == 0:  # under `launch` every process holds the same rows
        store.append({**row, "process_count": jax.process_count()}, key)
    for row in rows:
      print(
        f"seed {row['seed']}: test acc {row['final_test_acc']:.4f}, train acc"
        f" {row['final_train_acc']:.4f}, steps to {cfg.target:.0%}: {row['steps_to_target']},"
        f" replicas identical: {row['replicas_identical']}, {row['wall_s']:.1f} s"
      )
    ok = all(r["replicas_identical"] for r in rows)
  elif args.what == "staleness":
    rows = ex.run_staleness_sweep(cfg, out, max_runs=args.max_runs)
    paths = ex.write_staleness_outputs(rows, out)
    print(paths[0].read_text())
    ok = True
  else:
    rows = ex.run_straggler_sweep(cfg, out, max_runs=args.max_runs)
    paths = ex.write_straggler_outputs(rows, out)
    print(paths[0].read_text())
    ok = all(r.get("replicas_identical", True) for r in rows)
  print(f"# wrote {out} in {time.perf_counter() - t0:.1f} s")
  return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
  from allreduce_jax.cli import main

  sys.exit(main(["train", *sys.argv[1:]]))
