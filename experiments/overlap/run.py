"""The overlap study's measurements: each subcommand runs ``measure.py`` on emulated clusters.

    python experiments/overlap/run.py cells --hosts 2,4 --runs 3        # the main grid
    python experiments/overlap/run.py cells --hosts 8 --algorithms ring,psum --runs 3
    python experiments/overlap/run.py cells --hosts 2,4 --link 50Mbit --algorithms ring --runs 3
    python experiments/overlap/run.py sweep --hosts 4 --runs 3          # bucket sizes
    python experiments/overlap/tables.py                                # tables and figures

One cluster per (run, hosts, link), every algorithm of the cell in it; runs go round robin
(run 0 of every cluster, then run 1, ...), so a slow spell of the shared machine lands in
one run of each cell, not in every run of one. ``measure.py`` skips what its rows already
hold: a stopped campaign resumes where it stopped (each cluster takes minutes; run it under
``cpu-quiet``, a subcommand at a time).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MEASURE = HERE / "measure.py"
#: The main grid's all-reduces: algorithm[:wire].
ALGORITHMS = "ring,psum,halving_doubling,two_shot:int8"
#: The variants a cell needs for its targets and model (the ring on 2 and 4 hosts adds the
#: alternatives to the mechanism: a thread, one program).
NEEDED = "compute,forward,comm,stages,after,streams"


def cluster(hosts: int, link: str, args: list[str], timeout: int = 1800) -> list[str]:
  """The command running ``measure.py args`` on ``hosts`` emulated hosts."""
  return [
    "allreduce-jax", "cluster", "--hosts", str(hosts), "--topology", "switch", "--link", link,
    "--timeout", str(timeout), "--", sys.executable, str(MEASURE), *args,
  ]  # fmt: skip


def cells(args) -> list[list[str]]:
  """The grid: every algorithm of ``--algorithms`` at the bucket sizes of ``--bucket-layers``,
  one cluster per (run, hosts)."""
  out = []
  for run in range(args.first_run, args.runs):
    for hosts in (int(h) for h in args.hosts.split(",")):
      measure = ["--algorithm", args.algorithms, "--bucket-layers", args.bucket_layers]
      measure += ["--variants", NEEDED, "--trials", str(args.trials), "--run", str(run)]
      if args.link == "200Mbit" and hosts < 8:  # the mechanisms compared, with the ring
        measure += ["--every-variant", "ring"]
      out.append(cluster(hosts, args.link, [*measure, "--out", args.out]))
  return out


def sweep(args) -> list[list[str]]:
  """The bucket sizes, one bucket per leaf to one for everything, with the ring."""
  out = []
  for run in range(args.first_run, args.runs):
    for hosts in (int(h) for h in args.hosts.split(",")):
      measure = ["--algorithm", "ring", "--bucket-layers", args.bucket_layers]
      measure += ["--variants", NEEDED]
      measure += ["--trials", str(args.trials), "--run", str(run), "--out", args.out]
      out.append(cluster(hosts, args.link, measure))
  return out


def parser() -> argparse.ArgumentParser:
  """The subcommands ``cells`` and ``sweep``."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  for name, fn, layers, rows in (
    ("cells", cells, "1,2", "cells.jsonl"),
    ("sweep", sweep, "0.5,1,2,3,6", "sweep.jsonl"),
  ):
    p = sub.add_parser(name, help=fn.__doc__.splitlines()[0])
    p.set_defaults(make=fn)
    p.add_argument("--hosts", default="2,4")
    p.add_argument("--link", default="200Mbit")
    p.add_argument("--algorithms", default=ALGORITHMS)
    p.add_argument("--bucket-layers", default=layers, help="bucket sizes in layers (comma list)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--first-run", type=int, default=0, help="skip the runs below this one")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--out", default=str(HERE / "rows" / rows))
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
  return parser


def run(args: argparse.Namespace) -> None:
  """Runs (or with ``--dry-run`` prints) the clusters of the subcommand, one after the other."""
  for command in args.make(args):
    print("#", " ".join(command), flush=True)
    if not args.dry_run:
      subprocess.run(command, check=True)


if __name__ == "__main__":
  run(parser().parse_args())
