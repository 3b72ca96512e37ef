"""Verify, bench and a training run on whatever devices this machine has, rows beside the CPU ones.

    python experiments/accelerators/accelerator_check.py            # every visible GPU/TPU (CPU: 8 emulated)
    python experiments/accelerators/accelerator_check.py --quick    # smaller sizes and fewer steps, a first look

Writes ``experiments/accelerators/rows/<backend>_<device kind>_p<N>/``: ``verify.jsonl`` (every
algorithm against the NumPy oracle), ``bench.jsonl``/``bench.txt`` (nccl-tests-style sweep of
every single-axis algorithm and XLA's psum, 8 B to 1 GiB on an accelerator) and
``train_sync.jsonl`` (the synchronous data-parallel run over the hand-written ring, replicas
checked bit-identical), plus ``NOTE.md`` saying what was run and what is meaningful at this p.

At p = 1 (one GPU): an all-reduce over one participant is the identity, so verify checks only
that each algorithm returns its input unchanged for every dtype and special value; bench times
a copy through the collective machinery (busbw = algbw: nccl-tests' factor 2(p−1)/p is 0, this
script reports algbw), which is the fixed overhead and nothing about links; the training run
checks the optax route end to end. Compare with NCCL's own numbers only from p = 2 on
(docs/accelerators.md).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

import jax

from allreduce_jax import cli, devices, names


def _tag() -> str:
  dev = jax.devices()[0]
  kind = getattr(dev, "device_kind", dev.platform).lower().replace(" ", "_").replace("/", "_")
  return f"{jax.default_backend()}_{kind}_p{jax.device_count()}"


def _run(argv: list[str], log: Path) -> int:
  """One subcommand in this process, its output also kept in ``log``."""
  buf = io.StringIO()

  class Tee(io.TextIOBase):
    def write(self, s):
      sys.__stdout__.write(s)
      buf.write(s)
      return len(s)

  with contextlib.redirect_stdout(Tee()):
    rc = cli.main(argv)
  log.write_text(buf.getvalue())
  return rc


def parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true", help="small sizes and few steps")
  ap.add_argument("--out", default="experiments/accelerators/rows", help="parent folder")
  return ap


def check(args: argparse.Namespace) -> int:
  """Verify, bench and train on every visible device; the exit status: 0 if all passed."""
  p = devices.use_cpu_devices(None)  # every visible accelerator; 8 emulated on CPU
  out = Path(args.out) / _tag()
  out.mkdir(parents=True, exist_ok=True)
  accel = jax.default_backend() != "cpu"
  single = ",".join(a for a in names(axes=1) if a != "auto")
  max_bytes = ("64MiB" if args.quick else "1GiB") if accel else ("1MiB" if args.quick else "16MiB")
  shapes = ["--shapes", "13"] if args.quick else []
  status = {
    "verify": _run(["verify", "--out", str(out / "verify.jsonl"), *shapes], out / "verify.txt"),
    "bench": _run(
      [
        "bench",
        "--algorithms",
        single,
        "-b",
        "8" if accel else "1KiB",
        "-e",
        max_bytes,
        "-f",
        "4" if args.quick else "2",
        "--out",
        str(out / "bench.jsonl"),
      ],
      out / "bench.txt",
    ),
    "train": _run(
      [
        "train",
        "sync",
        "--workers",
        str(p),
        "--out",
        str(out / "train_sync"),
        *(["--steps", "60"] if args.quick else []),
      ],
      out / "train.txt",
    ),
  }
  meaning = (
    "p = 1: every all-reduce is the identity; verify checks that each algorithm returns its"
    " input unchanged, bench's times are the fixed cost of one collective call (no link is"
    " used; busbw equals algbw), training checks the route end to end. Nothing here measures"
    " communication."
    if p == 1
    else f"p = {p}: verify, bandwidth and training across {p} devices are all meaningful;"
    f" compare busbw with all_reduce_perf -g {p} (docs/accelerators.md)."
  )
  (out / "NOTE.md").write_text(
    f"# {_tag()}\n\n`python experiments/accelerators/accelerator_check.py{' --quick' if args.quick else ''}`"
    f" on {p} {jax.default_backend()} device(s) ({jax.devices()[0].device_kind}),"
    f" jax {jax.__version__}.\n\nExit status: {status}.\n\n{meaning}\n"
  )
  print(f"# {out}: {status}; {meaning}")
  return 0 if not any(status.values()) else 1


if __name__ == "__main__":
  sys.exit(check(parser().parse_args()))
