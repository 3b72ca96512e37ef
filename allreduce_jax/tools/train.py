"""``allreduce-jax train MODE``: the one training command line, one subcommand per mode.

``sync``        one synchronous data-parallel run over the hand-written all-reduce;
``staleness``   fixed-τ stale-gradient sweep (the report's Table A);
``stragglers``  compute-time models × sync/async, communication charged to sync only (Table B);
``table-c``     every arm × workload on one time model, compute + communication (Table C);
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
import os
import sys
import time
import types
import typing
from collections.abc import Callable
from pathlib import Path

import jax

from allreduce_jax import devices, units
from allreduce_jax.results import RowsError
from allreduce_jax.tools import _args
from allreduce_jax.tools.launch import ENV_ELASTIC
from allreduce_jax.training import arms, configs, data
from allreduce_jax.training import experiments as ex
from allreduce_jax.training.checkpoint import CheckpointError
from allreduce_jax.training.results import Results


def _parser_for(hint, opt: str, rate: bool = False):
  """An argparse ``type`` for a config field annotated ``hint``; ``rate``: a field in
  GB/s (``*_GBps``) read from a rate with its unit (``100Gbit``, ``12.5GB/s``)."""
  args = typing.get_args(hint)
  if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
    inner = _parser_for(next(a for a in args if a is not type(None)), opt, rate)
    return lambda text: None if text.strip().lower() == "none" else inner(text)
  if typing.get_origin(hint) is tuple:
    elem = args[0] if args else str
    if rate:
      return lambda text: tuple(_parser_for(elem, opt, rate)(v) for v in _args.csv_list(text))

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
      return units.parse_rate_GBps(text, opt) if rate else hint(text)
    except ValueError as e:
      if rate:
        raise argparse.ArgumentTypeError(str(e)) from None
      raise argparse.ArgumentTypeError(f"{opt}: expected {hint.__name__}, got {text!r}") from None

  return parse


def _default_text(value, rate: bool = False) -> str:
  if isinstance(value, tuple):
    return ",".join(_default_text(v, rate) for v in value) or "(empty)"
  if rate and value is not None:
    return f"{value:g}GB/s"
  return f"{value:g}" if isinstance(value, float) else str(value)


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


def option_of(field_name: str) -> str:
  """The option of a config field: ``--field-name``; a field in GB/s drops its unit
  (``bandwidth_GBps`` -> ``--bandwidth``, which takes ``100Gbit`` or ``12.5GB/s``)."""
  return "--" + field_name.removesuffix("_GBps").replace("_", "-")


#: Options that were renamed: old -> (new, example). The old spelling is refused with a
#: message naming the new one (``--bandwidth-gbps`` meant GB/s, read by many as Gbit/s).
RENAMED = {
  "--bandwidth-gbps": ("--bandwidth", "--bandwidth 100Gbit (= 12.5GB/s)"),
  "--bandwidths-gbps": ("--bandwidths", "--bandwidths 1Gbit,10Gbit,100Gbit"),
}


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
  """One ``--field-name`` option per field of the config dataclass ``cls``, typed
  from its annotations (``tuple[int, ...]`` is a comma list, ``X | None`` accepts
  ``none``, ``bool`` is ``--x/--no-x``, a ``*_GBps`` field a rate with its unit),
  with the default in its help."""
  hints = typing.get_type_hints(cls)
  smoke = {k: v for k, v in dataclasses.asdict(cls.smoke()).items()}
  docs = _field_docs(cls)
  for f in dataclasses.fields(cls):
    rate = f.name.endswith("_GBps")
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    notes = [f"default {_default_text(default, rate)}"]
    if smoke[f.name] != default:
      notes.append(f"--smoke: {_default_text(smoke[f.name], rate)}")
    text = f"({'; '.join(notes)})"
    if rate:
      text = f"{units.RATE_HELP[0].upper()}{units.RATE_HELP[1:]}. {text}"
    if f.name in docs:  # docstring markup (``x``) is not help text
      text = docs[f.name].replace("``", "").replace("%", "%%") + " " + text
    opt = option_of(f.name)
    if hints[f.name] is bool:
      parser.add_argument(
        opt, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=text
      )
    else:
      parser.add_argument(
        opt,
        dest=f.name,
        type=_parser_for(hints[f.name], opt, rate),
        default=None,
        help=text,
        metavar=("RATES" if typing.get_origin(hints[f.name]) is tuple else "RATE")
        if rate
        else None,
      )
    if rate:
      for old, (new, example) in RENAMED.items():
        if new == opt:
          _args.add_renamed(parser, old, new, example)


def config_from_arguments(cls: type, args: argparse.Namespace, smoke: bool = False):
  """The frozen config from parsed options (unset options keep the default or smoke preset)."""
  overrides = {
    f.name: getattr(args, f.name)
    for f in dataclasses.fields(cls)
    if getattr(args, f.name, None) is not None
  }
  return cls.smoke(**overrides) if smoke else cls(**overrides)


def configure(parser: argparse.ArgumentParser) -> None:
  sub = parser.add_subparsers(dest="mode", metavar="MODE", required=True)
  for name, mode in MODES.items():
    cls, help_text, desc = mode.config, mode.help, mode.help
    if mode.lists_arms:
      desc += ". Arms: " + "; ".join(f"{a.name} ({a.summary})" for a in arms.ARMS.values())
      desc += ". Workloads: " + ", ".join(arms.WORKLOADS) + "."
    p = sub.add_parser(name, help=help_text, description=desc)
    p.add_argument("--smoke", action="store_true", help="the seconds-long preset (CI)")
    _args.add_devices(p)
    p.add_argument("--out", default=None, help="output folder (default results/train[.smoke]/MODE)")
    if mode.sweep:
      p.add_argument("--max-runs", type=int, default=None, help="stop after this many new runs")
    if name == "sync":
      _add_checkpoint_arguments(p)
      p.add_argument(
        "--overlap",
        action="store_true",
        help="overlap each step's all-reduce with its backward pass, bucket by bucket"
        " (needs --bucket-bytes N > 0); the same parameters, bit for bit",
      )
    add_config_arguments(p, cls)


def _add_checkpoint_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument(
    "--checkpoint-dir",
    default=None,
    help="save the run here (orbax-checkpoint, atomic: a kill during a save leaves the"
    " previous one) and resume from the newest complete checkpoint there; resume is"
    " bitwise (default: no checkpoints)",
  )
  p.add_argument(
    "--checkpoint-every",
    type=int,
    default=None,
    help="steps between two checkpoints (default: --eval-every)",
  )


def _run_sync(cfg, args, out: Path, store) -> bool:

  # Resume: a seed already trained with this exact config is not trained again.
  config = json.loads(json.dumps(dataclasses.asdict(cfg)))
  done = store.done()
  rows = []
  for seed in cfg.seeds:
    key = store.key(config=config, seed=seed, **({"overlap": True} if args.overlap else {}))
    if key in done:
      rows.append(done[key])
      continue
    row = ex.run_sync(
      cfg,
      seed,
      checkpoint_dir=args.checkpoint_dir,
      checkpoint_every=args.checkpoint_every or cfg.eval_every,
      elastic=_elastic(),
      overlap=args.overlap,
    )
    rows.append(row)
    if jax.process_index() == 0:  # under `launch` every process holds the same rows
      store.append({**row, "process_count": jax.process_count()}, key)
  for row in rows:
    print(
      f"seed {row['seed']}: test acc {row['final_test_acc']:.4f}, train acc"
      f" {row['final_train_acc']:.4f}, steps to {cfg.target:.0%}: {row['steps_to_target']},"
      f" replicas identical: {row['replicas_identical']}, {row['wall_s']:.1f} s"
      + (f", resumed from step {row['restarts']}" if row.get("restarts") else "")
      + f", parameters sha256 {row['params_sha256'][:16]}"
    )
  return all(r["replicas_identical"] for r in rows)


def _shown(rows: list[dict], paths: list[Path]) -> bool:
  """Prints the sweep's table (its first output file); False if a replica check failed."""
  print(paths[0].read_text())
  return all(r.get("replicas_identical", True) for r in rows)


def _run_staleness(cfg, args, out: Path, store) -> bool:
  rows = ex.run_staleness_sweep(cfg, out, max_runs=args.max_runs)
  return _shown(rows, ex.write_staleness_outputs(rows, out))


def _run_stragglers(cfg, args, out: Path, store) -> bool:
  rows = ex.run_straggler_sweep(cfg, out, max_runs=args.max_runs)
  return _shown(rows, ex.write_straggler_outputs(rows, out))


def _run_table_c(cfg, args, out: Path, store) -> bool:
  rows = ex.run_table_c(cfg, out, smoke=args.smoke, max_runs=args.max_runs)
  return _shown(rows, ex.write_table_c_outputs(rows, cfg, out))


def _run_phase(cfg, args, out: Path, store) -> bool:
  rows = ex.run_phase(cfg, out, smoke=args.smoke, max_runs=args.max_runs)
  return _shown(rows, ex.write_phase_outputs(ex.phase_cells(cfg, rows), cfg, out)[1:])


@dataclasses.dataclass(frozen=True)
class Mode:
  """One ``train`` mode.

  Attributes:
    config: its frozen config class (every field an option, ``--smoke`` its preset).
    help: the one-line help.
    rows_file: its JSON Lines file under ``--out``.
    run: ``run(cfg, args, out, store) -> bool`` (False: a replica check failed, exit 1).
    sweep: resumable runs (``--max-runs``).
    lists_arms: its ``--help`` lists the registered arms and workloads.
  """

  config: type
  help: str
  rows_file: str
  run: Callable[..., bool]
  sweep: bool = True
  lists_arms: bool = False


#: Every ``train`` mode, in ``--help`` order.
MODES: dict[str, Mode] = {
  "sync": Mode(
    configs.SyncConfig,
    "one synchronous data-parallel run (replicas checked identical)",
    "sync.jsonl",
    _run_sync,
    sweep=False,
  ),
  "staleness": Mode(
    configs.StalenessConfig,
    "stale-gradient sweep: a fixed staleness τ for every asynchronous method"
    " (the report's staleness table)",
    "staleness.jsonl",
    _run_staleness,
  ),
  "stragglers": Mode(
    configs.StragglerConfig,
    "straggler sweep: compute-time models × sync/backup workers/async; communication is"
    " charged to sync only (kept for continuity; table-c charges both)",
    "stragglers.jsonl",
    _run_stragglers,
  ),
  "table-c": Mode(
    configs.TableCConfig,
    "every arm × workload on one clock: simulated time = compute + communication priced"
    " by the cost model (the report's sync-vs-async table)",
    "table_c.jsonl",
    _run_table_c,
    lists_arms=True,
  ),
  "phase": Mode(
    configs.PhaseConfig,
    "phase diagram: fastest arm to the target by straggler σ × link bandwidth",
    "phase_runs.jsonl",
    _run_phase,
    lists_arms=True,
  ),
}


def prepare(args: argparse.Namespace) -> None:
  """What a spare process of a restarting ``train sync`` does before it is needed
  (:mod:`allreduce_jax.tools.spares`): load the data and import orbax."""
  if args.mode != "sync":
    return
  data.load_digits()
  if args.checkpoint_dir is not None:
    import orbax.checkpoint  # noqa: F401


def run(args: argparse.Namespace) -> int:

  mode = MODES[args.mode]
  cls = mode.config
  out = Path(args.out or f"results/train{'.smoke' if args.smoke else ''}/{args.mode}")
  store = Results(out / mode.rows_file)
  try:
    args.devices = devices.use_cpu_devices(args.devices)
    cfg = config_from_arguments(cls, args, smoke=args.smoke)
    workers = getattr(cfg, "workers", 0)
    if args.mode == "sync":
      cfg = _checked_checkpointing(cfg, args)
      _check_overlap(cfg, args)
      workers = cfg.workers
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
  try:
    return _run_mode(mode, cfg, args, out, store, t0)
  except CheckpointError as e:
    print(f"allreduce-jax train {args.mode}: error: {e}", file=sys.stderr)
    return 2


def _elastic() -> bool:
  """Whether ``launch|cluster --elastic`` started this process (it may run on fewer
  processes than the run was configured for)."""
  return os.environ.get(ENV_ELASTIC, "") not in ("", "0")


def _check_overlap(cfg, args) -> None:
  if args.overlap and not cfg.bucket_bytes:
    raise ValueError(
      "--overlap needs --bucket-bytes N > 0: the buckets are what is sent while the"
      " backward pass goes on (one bucket for everything is sent after it)."
    )


def _checked_checkpointing(cfg, args):
  """``cfg`` for ``train sync`` with its checkpoint options checked; under ``--elastic``
  a restart on fewer processes trains on the devices left (``--workers`` lowered to
  them, its batch per worker kept, its learning rate scaled on resume)."""
  if args.checkpoint_every is not None and args.checkpoint_every < 1:
    raise ValueError(f"--checkpoint-every must be at least 1, got {args.checkpoint_every}.")
  if args.checkpoint_every is not None and args.checkpoint_dir is None:
    raise ValueError("--checkpoint-every needs --checkpoint-dir DIR.")
  if args.checkpoint_dir is not None:
    path = Path(args.checkpoint_dir)
    if path.exists() and not path.is_dir():
      raise ValueError(f"--checkpoint-dir {args.checkpoint_dir}: exists and is not a folder.")
  if _elastic() and cfg.workers > jax.device_count():
    print(
      f"# train sync: --elastic: {jax.device_count()} of --workers {cfg.workers} devices left;"
      f" training on {jax.device_count()}",
      flush=True,
    )
    cfg = dataclasses.replace(cfg, workers=jax.device_count())
  return cfg


def _run_mode(mode, cfg, args, out: Path, store, t0: float) -> int:
  print(f"# train {args.mode}: {json.dumps(dataclasses.asdict(cfg))}", flush=True)
  ok = mode.run(cfg, args, out, store)
  print(f"# wrote {out} in {time.perf_counter() - t0:.1f} s")
  return 0 if ok else 1
