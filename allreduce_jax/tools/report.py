"""``allreduce-jax report``: run every experiment and write ``results/report/REPORT.md``.

The report is thin over the subcommands: each section runs one of them (verify, the
HLO audit, bench + fit, auto, fusion, scaling, training) with its output under the
report folder, keeps what it printed, and links the figures it drew. The markdown is
rewritten after every section, and every sweep resumes from its JSON Lines file, so
an interrupted report picks up where it stopped (``--fresh`` starts over).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ALL_BUT_AUTO = (
  "ring,bidirectional_ring,tree,recursive_doubling,halving_doubling,naive,hierarchical,psum"
)


@dataclass
class Section:
  """One part of the report: the commands run, what they printed, their figures."""

  key: str
  title: str
  intro: str
  commands: list[list[str]]
  text: str = ""
  figures: list[str] = field(default_factory=list)
  seconds: float = 0.0
  status: int | None = None


class _Tee(io.TextIOBase):
  """Writes to the terminal and keeps a copy."""

  def __init__(self, stream):
    self.stream, self.buffer = stream, io.StringIO()

  def write(self, s):
    self.stream.write(s)
    self.stream.flush()
    return self.buffer.write(s)

  def flush(self):
    self.stream.flush()


def plan(out: Path, smoke: bool, devices: int) -> list[Section]:
  """The sections and the exact commands behind them."""
  d = str(devices)
  o = out.as_posix()
  if smoke:
    bench_sizes = ["--min-bytes", "1KiB", "--max-bytes", "64KiB", "--factor", "8", "--iters", "3"]
    bench_algos, audit_ps, train_flag = (
      "ring,recursive_doubling,halving_doubling,psum",
      "2,4",
      ["--smoke"],
    )
    verify_extra = [
      "--algorithms",
      "ring,halving_doubling,psum",
      "--dtypes",
      "float32,int32",
      "--shapes",
      "13",
    ]
    fusion_extra, scaling_extra = ["--smoke"], ["--smoke"]
  else:
    bench_sizes = ["--min-bytes", "1KiB", "--max-bytes", "16MiB", "--factor", "4", "--iters", "7"]
    bench_algos, audit_ps, train_flag = ALL_BUT_AUTO, "2,4,8,16,32", []
    verify_extra = ["--shapes", "scalar,13,3x7"]
    fusion_extra, scaling_extra = ["--iters", "5"], []
  return [
    Section("verify", "Verification against XLA's collectives",
            "Every algorithm x op x dtype on verifiable (bit-exact), random and NaN/Inf inputs.",
            [["verify", "--devices", d, *verify_extra, "--out", f"{o}/verify.jsonl"]]),
    Section("audit", "Communication audit from compiled HLO",
            "collective-permute count and bytes sent per participant, compiled at each p (no execution), vs the closed-form schedule.",
            [["audit", "--ps", audit_ps, "--out", f"{o}/hlo_audit.jsonl"]]),
    Section("bench", "Bus bandwidth (nccl-tests conventions) and the fitted α-β-γ model",
            "Median of timed calls, all algorithms timed round robin at each size; busbw = algbw·2(p-1)/p; every result checked (#wrong).",
            [["bench", "--devices", d, "--algorithms", bench_algos, *bench_sizes,
              "--out", f"{o}/bench.jsonl", "--fit", "--params", f"{o}/cost_params.json"]]),
    Section("auto", "auto: the model's choice, measured side by side",
            "auto uses the parameters fitted above (ALLREDUCE_JAX_COST_PARAMS).",
            [["bench", "--devices", d, "--algorithms", "auto,ring,recursive_doubling,halving_doubling,psum",
              *bench_sizes, "--out", f"{o}/bench_auto.jsonl"]]),
    Section("fusion", "Tensor fusion: per-leaf vs bucketed",
            "A real model's gradient pytree and a transformer-like one with hundreds of leaves.",
            [["fusion", "--devices", d, "--algorithms", "ring,psum", *fusion_extra, "--out", f"{o}/fusion.jsonl"]]),
    Section("scaling", "Scaling by model to thousands of participants",
            "Predicted time, 8 devices per node on NVLink, nodes on InfiniBand (presets), plus this machine's fit.",
            [["scaling", *scaling_extra, "--params", f"{o}/cost_params.json", "--out", f"{o}/scaling.jsonl"]]),
    Section("train", "Synchronous data-parallel training, asynchronous SGD, stragglers",
            "Flax NNX on scikit-learn digits; sync over the hand-written ring; simulated async on stale gradients.",
            [["train", "sync", *train_flag, "--devices", d, "--out", f"{o}/train/sync"],
             ["train", "staleness", *train_flag, "--devices", d, "--out", f"{o}/train/staleness"],
             ["train", "stragglers", *train_flag, "--devices", d, "--out", f"{o}/train/stragglers"]]),
  ]  # fmt: skip


def _run_command(argv: list[str]) -> int:
  from allreduce_jax import cli

  return cli.main(argv)


def environment() -> dict:
  import jax

  versions = {}
  for name in ("jax", "jaxlib", "flax", "optax", "numpy"):
    try:
      versions[name] = __import__(name).__version__
    except Exception:  # pragma: no cover
      versions[name] = "?"
  try:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, timeout=5).stdout.strip()  # fmt: skip
  except Exception:  # pragma: no cover
    commit = ""
  return {
    "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    "python": platform.python_version(),
    **versions,
    "backend": jax.default_backend(),
    "devices": jax.device_count(),
    "processes": jax.process_count(),
    "cpu_cores": os.cpu_count(),
    "machine": f"{platform.system()} {platform.machine()}",
    "commit": commit,
  }


def headlines(out: Path) -> list[str]:
  """A few numbers read back from the rows this report wrote."""
  from allreduce_jax.tools.bench import read_rows

  lines = []
  rows = read_rows(out / "bench.jsonl")
  by = {(r["algorithm"], r["bytes"]): r for r in rows}
  sizes = sorted({r["bytes"] for r in rows})
  if sizes and ("psum", sizes[-1]) in by and ("ring", sizes[-1]) in by:
    s = sizes[-1]
    lines.append(f"ring busbw / psum busbw at {s / 2**20:.4g} MiB: "
                 f"{by[('ring', s)]['busbw_gbps'] / by[('psum', s)]['busbw_gbps']:.2f}")  # fmt: skip
  if sizes and ("recursive_doubling", sizes[0]) in by and ("ring", sizes[0]) in by:
    s = sizes[0]
    lines.append(f"ring time / recursive doubling time at {s} B: "
                 f"{by[('ring', s)]['time_us'] / by[('recursive_doubling', s)]['time_us']:.2f}")  # fmt: skip
  if rows:
    lines.append(f"wrong elements over all timed results: {sum(int(r['wrong']) for r in rows)}")
  auto_rows = read_rows(out / "bench_auto.jsonl")
  if auto_rows:
    ratios = []
    for s in sorted({r["bytes"] for r in auto_rows}):
      at = {r["algorithm"]: r["time_us"] for r in auto_rows if r["bytes"] == s}
      custom = [t for a, t in at.items() if a not in ("auto", "psum")]
      if "auto" in at and custom:
        ratios.append(at["auto"] / min(custom))
    if ratios:
      lines.append(f"auto time / fastest hand-written time: median {statistics.median(ratios):.2f}, "
                   f"worst {max(ratios):.2f} over {len(ratios)} sizes")  # fmt: skip
  fusion = read_rows(out / "fusion.jsonl")
  speedups = [r["speedup_vs_per_leaf"] for r in fusion if r.get("speedup_vs_per_leaf")]
  if speedups:
    lines.append(f"best fused vs per-leaf speedup: {max(speedups):.2f}x")
  sync = out / "train" / "sync" / "sync.jsonl"
  if sync.exists():
    accs = [
      json.loads(line)["final_test_acc"] for line in sync.read_text().splitlines() if line.strip()
    ]
    if accs:
      lines.append(f"synchronous data-parallel test accuracy (ring all-reduce): "
                   f"{statistics.mean(accs):.4f} over {len(accs)} runs")  # fmt: skip
  return lines


def write_markdown(out: Path, sections: list[Section], env: dict, smoke: bool) -> Path:
  md = [
    "# allreduce-jax report" + (" (smoke)" if smoke else ""),
    "",
    "Written by `allreduce-jax report" + (" --smoke" if smoke else "") + "`. "
    "Every number below was measured in this run; the commands reproduce each section.",
    "",
    "## Environment",
    "",
    "| | |",
    "|---|---|",
    *[f"| {k} | {v} |" for k, v in env.items()],
    "",
  ]
  heads = headlines(out)
  if heads:
    md += ["## Headlines", "", *[f"- {h}" for h in heads], ""]
  for s in sections:
    md += [f"## {s.title}", "", s.intro, ""]
    if s.status is None:
      md += ["*not run yet*", ""]
      continue
    md += ["```bash", *[f"allreduce-jax {' '.join(c)}" for c in s.commands], "```", ""]
    status = "ok" if s.status == 0 else f"exit status {s.status}"
    md += [f"{status}, {s.seconds:.0f} s", "", "```text", s.text.rstrip(), "```", ""]
    for fig in s.figures:
      md += [f"![{Path(fig).stem}]({fig})", ""]
  md += [
    "## Notebooks",
    "",
    "The notebooks in `notebooks/` teach and re-run each part interactively (`make lab`).",
    "",
  ]
  path = out / "REPORT.md"
  path.write_text("\n".join(md))
  return path


def run_report(out: Path, smoke: bool = False, devices: int = 8, only=None, fresh=False) -> int:
  from allreduce_jax import _devices

  if fresh and out.exists():
    shutil.rmtree(out)
  out.mkdir(parents=True, exist_ok=True)
  _devices.use_cpu_devices(devices)
  env = environment()
  sections = plan(out, smoke, devices)
  if only:
    unknown = set(only) - {s.key for s in sections}
    if unknown:
      raise SystemExit(
        f"--only: unknown {sorted(unknown)}; expected some of {[s.key for s in sections]}"
      )
  os.environ["ALLREDUCE_JAX_COST_PARAMS"] = str(out / "cost_params.json")
  state_path = out / "sections.json"
  state = json.loads(state_path.read_text()) if state_path.exists() else {}
  for s in sections:  # keep what earlier runs of the same commands printed
    old = state.get(s.key)
    if old and old.get("commands") == s.commands:
      s.text, s.figures, s.seconds, s.status = (
        old["text"],
        old["figures"],
        old["seconds"],
        old["status"],
      )
  failures = 0
  for k, s in enumerate(sections, 1):
    if only and s.key not in only:
      failures += bool(s.status)
      continue
    print(f"\n=== [{k}/{len(sections)}] {s.title}", flush=True)
    before = set(out.rglob("*.png"))
    tee = _Tee(sys.stdout)
    t0 = time.perf_counter()
    s.status = 0
    with contextlib.redirect_stdout(tee):
      for argv in s.commands:
        print(f"$ {' '.join(argv)}")
        try:
          rc = _run_command(argv)
        except SystemExit as e:  # a subcommand's argument error
          rc = e.code if isinstance(e.code, int) else 2
        s.status = s.status or rc
    s.seconds = time.perf_counter() - t0
    s.text = tee.buffer.getvalue()
    s.figures = sorted(p.relative_to(out).as_posix() for p in set(out.rglob("*.png")) - before)
    if not s.figures:  # resumed sweeps redraw in place: link the section's own figures
      stems = {Path(a).stem for argv in s.commands for a in argv if a.startswith(str(out))}
      s.figures = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.png")
                         if p.stem in stems or p.parent.name in stems)  # fmt: skip
    failures += s.status != 0
    state[s.key] = {"commands": s.commands, "text": s.text, "figures": s.figures,
                    "seconds": s.seconds, "status": s.status}  # fmt: skip
    state_path.write_text(json.dumps(state, indent=1))
    write_markdown(out, sections, env, smoke)
  path = write_markdown(out, sections, env, smoke)
  print(f"\n# wrote {path} ({failures} section(s) failed)")
  return 1 if failures else 0


def configure(parser: argparse.ArgumentParser) -> None:
  parser.add_argument(
    "--out", default=None, help="folder (default results/report, or results/report.smoke)"
  )
  parser.add_argument("--devices", type=int, default=8, help="emulated CPU devices (default 8)")
  parser.add_argument(
    "--smoke", action="store_true", help="tiny sizes: the whole report in about a minute"
  )
  parser.add_argument(
    "--only",
    default=None,
    help="comma-separated sections: verify,audit,bench,auto,fusion,scaling,train",
  )
  parser.add_argument(
    "--fresh", action="store_true", help="delete the folder first instead of resuming"
  )


def run(args: argparse.Namespace) -> int:
  out = Path(args.out or ("results/report.smoke" if args.smoke else "results/report"))
  only = [s.strip() for s in args.only.split(",")] if args.only else None
  return run_report(out, smoke=args.smoke, devices=args.devices, only=only, fresh=args.fresh)
