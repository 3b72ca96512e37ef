"""``allreduce-jax train MODE``: the one training command line, one subcommand per mode.

``sync``        one synchronous data-parallel run over the hand-written all-reduce;
``staleness``   Table A, fixed-τ stale-gradient sweep;
``stragglers``  Table B, compute-time models × sync/async (communication charged to sync only);
``table-c``     Table C, every arm × workload on one time model (compute + communication);
``phase``       the phase diagram, straggler heaviness × bandwidth -> fastest arm.

Every field of the mode's config dataclass (:mod:`allreduce_jax.training.configs`)
is an option ``--field-name`` with its default in ``--help``; ``--smoke`` starts
from the seconds-long preset. Sweeps resume: rerunning a command skips the runs
already in its JSONL file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import types
import typing
from pathlib import Path

from allreduce_jax.tools import _args


def _modes() -> dict[str, tuple[type, str]]:
  from allreduce_jax.training import configs

  return {
    "sync": (configs.SyncConfig, "one synchronous data-parallel run (replicas checked identical)"),
    "staleness": (configs.StalenessConfig, "Table A: fixed staleness τ, every async method"),
    "stragglers": (
      configs.StragglerConfig,
      "Table B: compute-time models × sync/backups/async (async communication not charged;"
      " see table-c)",
    ),
    "table-c": (
      configs.TableCConfig,
      "Table C: every arm × workload, time = compute + communication priced by the cost model",
    ),
    "phase": (
      configs.PhaseConfig,
      "phase diagram: fastest arm to the target by straggler σ × link bandwidth",
    ),
  }


def _parser_for(hint, name: str):
  """An argparse ``type`` for a config field annotated ``hint``."""
  opt = "--" + name.replace("_", "-")
  args = typing.get_args(hint)
  if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
    inner = _parser_for(next(a for a in args if a is not type(None)), name)
    return lambda text: None if text.strip().lower() == "none" else inner(text)
  if typing.get_origin(hint) is tuple:
    elem = args[0] if args else str

    def parse_tuple(text: str) -> tuple:
      try:
        return tuple(elem(v) for v in _args.csv_list(text))
      except ValueError:
        raise argparse.ArgumentTypeError(
          f"{opt}: expected comma-separated {elem.__name__} values, got {text!r}"
        ) from None

    return parse_tuple

  def parse(text: str):
    try:
      return hint(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"{opt}: expected {hint.__name__}, got {text!r}") from None

  return parse


def _default_text(value) -> str:
  if isinstance(value, tuple):
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) or "(empty)"
  return str(value)


def _field_docs(cls: type) -> dict[str, str]:
  """``name: text`` lines of the ``Attributes:`` sections along ``cls``'s bases."""
  docs: dict[str, str] = {}
  for klass in reversed(cls.__mro__):
    lines = (klass.__doc__ or "").splitlines()
    if not any(line.strip() == "Attributes:" for line in lines):
      continue
    name = None
    for line in lines[[ln.strip() for ln in lines].index("Attributes:") + 1 :]:
      head, sep, text = line.strip().partition(": ")
      if sep and head.isidentifier() and line.startswith("    ") and not line.startswith("      "):
        name, docs[head] = head, text.strip()
      elif name and line.strip():
        docs[name] += " " + line.strip()
      elif not line.strip():
        name = None
  return docs


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
  """One ``--field-name`` option per field of the config dataclass ``cls``, typed
  from its annotations (``tuple[int, ...]`` is a comma list, ``X | None`` accepts
  ``none``, ``bool`` is ``--x/--no-x``), with the default in its help."""
  hints = typing.get_type_hints(cls)
  smoke = {k: v for k, v in dataclasses.asdict(cls.smoke()).items()}
  docs = _field_docs(cls)
  for f in dataclasses.fields(cls):
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    text = f"default {_default_text(default)}"
    if f.name in docs:
      text = docs[f.name].replace("%", "%%") + f" ({text}"
      text += ")"
    if smoke[f.name] != default:
      text = text.rstrip(")") + f"; --smoke: {_default_text(smoke[f.name])}"
      text += ")" if f.name in docs else ""
    opt = "--" + f.name.replace("_", "-")
    if hints[f.name] is bool:
      parser.add_argument(
        opt, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=text
      )
    else:
      parser.add_argument(
        opt, dest=f.name, type=_parser_for(hints[f.name], f.name), default=None, help=text
      )


def config_from_arguments(cls: type, args: argparse.Namespace, smoke: bool = False):
  """The frozen config from parsed options (unset options keep the default or smoke preset)."""
  overrides = {
    f.name: getattr(args, f.name)
    for f in dataclasses.fields(cls)
    if getattr(args, f.name, None) is not None
  }
  return cls.smoke(**overrides) if smoke else cls(**overrides)


def configure(parser: argparse.ArgumentParser) -> None:
  from allreduce_jax.training import arms

  sub = parser.add_subparsers(dest="mode", metavar="MODE", required=True)
  for mode, (cls, help_text) in _modes().items():
    desc = help_text
    if mode in ("table-c", "phase"):
      arms.load_arm_modules()
      desc += ". Arms: " + "; ".join(f"{a.name} ({a.summary})" for a in arms.ARMS.values())
      desc += ". Workloads: " + ", ".join(arms.WORKLOADS) + "."
    p = sub.add_parser(mode, help=help_text, description=desc)
    p.add_argument("--smoke", action="store_true", help="the seconds-long preset (CI)")
    _args.add_devices(p)
    p.add_argument("--out", default=None, help="output folder (default results/train[.smoke]/MODE)")
    if mode != "sync":
      p.add_argument("--max-runs", type=int, default=None, help="stop after this many new runs")
    add_config_arguments(p, cls)


def _run_sync(cfg, args, out: Path, store) -> bool:
  import jax

  from allreduce_jax.training import experiments as ex

  # Resume: a seed already trained with this exact config is not trained again.
  config = json.loads(json.dumps(dataclasses.asdict(cfg)))
  done = store.done()
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
  return all(r["replicas_identical"] for r in rows)


def _run_sweep(mode: str, cfg, args, out: Path) -> bool:
  from allreduce_jax.training import experiments as ex

  if mode == "staleness":
    rows = ex.run_staleness_sweep(cfg, out, max_runs=args.max_runs)
    paths = ex.write_staleness_outputs(rows, out)
  elif mode == "stragglers":
    rows = ex.run_straggler_sweep(cfg, out, max_runs=args.max_runs)
    paths = ex.write_straggler_outputs(rows, out)
  elif mode == "table-c":
    rows = ex.run_table_c(cfg, out, smoke=args.smoke, max_runs=args.max_runs)
    paths = ex.write_table_c_outputs(rows, cfg, out)
  else:
    rows = ex.run_phase(cfg, out, smoke=args.smoke, max_runs=args.max_runs)
    paths = ex.write_phase_outputs(ex.phase_cells(cfg, rows), cfg, out)
    paths = paths[1:]
  print(paths[0].read_text())
  return all(r.get("replicas_identical", True) for r in rows)


#: The rows file of each mode, under ``--out``.
ROWS_FILE = {
  "sync": "sync.jsonl",
  "staleness": "staleness.jsonl",
  "stragglers": "stragglers.jsonl",
  "table-c": "table_c.jsonl",
  "phase": "phase_runs.jsonl",
}


def run(args: argparse.Namespace) -> int:
  import jax

  from allreduce_jax import _devices
  from allreduce_jax.results import RowsError
  from allreduce_jax.training import arms
  from allreduce_jax.training.results import Results

  cls = _modes()[args.mode][0]
  out = Path(args.out or f"results/train{'.smoke' if args.smoke else ''}/{args.mode}")
  store = Results(out / ROWS_FILE[args.mode])
  try:
    _devices.use_cpu_devices(args.devices)
    arms.load_arm_modules()
    cfg = config_from_arguments(cls, args, smoke=args.smoke)
    workers = getattr(cfg, "workers", 0)
    if workers > jax.device_count():
      raise ValueError(
        f"--workers {workers}: only {jax.device_count()} devices (raise --devices to {workers})."
      )
    store.check()  # a foreign or unwritable rows file: refused before any training
  except RowsError as e:
    print(f"allreduce-jax train {args.mode}: error: --out: {e}", file=sys.stderr)
    return 2
  except ValueError as e:
    print(f"allreduce-jax train {args.mode}: error: {e}", file=sys.stderr)
    return 2
  t0 = time.perf_counter()
  print(f"# train {args.mode}: {json.dumps(dataclasses.asdict(cfg))}", flush=True)
  if args.mode == "sync":
    ok = _run_sync(cfg, args, out, store)
  else:
    ok = _run_sweep(args.mode, cfg, args, out)
  print(f"# wrote {out} in {time.perf_counter() - t0:.1f} s")
  return 0 if ok else 1
