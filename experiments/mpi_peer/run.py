"""Every measurement of this study: each subcommand builds the commands of one campaign and
runs them, one launch of an emulated cluster at a time, as root (Open MPI, the extra ``mpi``;
``collectives``: MPIwrapper, ``bash experiments/mpi_peer/build_mpiwrapper.sh``).

    python experiments/mpi_peer/run.py compare NETWORK [REPS] [--first R] [--forced 0,4]
        [--order blocks] [--sizes 1MiB:16MiB:4]      # the side-by-side bench on one network
    python experiments/mpi_peer/run.py wire [REPS]     # bytes on the wire per algorithm
    python experiments/mpi_peer/run.py collectives ARM[,ARM...] [REPS] [--first R] [--variants ...]
    python experiments/mpi_peer/run.py decision        # what Open MPI's own decision runs

The campaigns are tables: :data:`NETWORKS` (one row per network: hosts, topology, what runs
beside each forced Open MPI algorithm, sizes, rows' names) and :data:`ARMS` (the hand-written
algorithms over MPI: each arm's launches, by variant). Rows go to ``rows/``; a repetition's
number R is in each file's name.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ROWS = HERE / "rows"
CLUSTER = (sys.executable, "-m", "allreduce_jax", "cluster", "--link", "200Mbit",
           "--launcher", "mpirun")  # fmt: skip
FORCED = {0: "its own decision", 3: "recursive doubling", 4: "ring", 5: "segmented ring",
          6: "Rabenseifner"}  # fmt: skip  # coll_tuned_allreduce_algorithm
EVERY_HOST8 = "ring,bidirectional_ring,halving_doubling,recursive_doubling,tree,psum,mpi"
RINGS = "ring,bidirectional_ring,psum,mpi"


@dataclass(frozen=True)
class Network:
  """One network's side-by-side launches: ``bench`` of ``algorithms[forced]`` (else
  ``algorithms[None]``) beside ``MPI_Allreduce`` with Open MPI's algorithm forced, per
  repetition and forced algorithm; ``rows``: the file name (``{net}``, ``{rep}``, ``{alg}``,
  ``{sfx}``: ``_blocks`` where ``--order blocks`` and the network keeps them apart);
  ``cluster``, ``bench``: more options of each (``linux``: Linux's own TCP queue, longer
  link queues, the slowest host's time)."""

  hosts: int
  topologies: tuple[str, ...]
  algorithms: dict
  sizes: str  # bench's -b:-e:-f
  iters: int
  rows: str
  forced: tuple[int, ...] = (0, 4)
  timeout: str | None = "900"
  blocks_apart: bool = False
  cluster: tuple[str, ...] = ()
  bench: tuple[str, ...] = ()


NETWORKS = {
  "switch": Network(4, ("switch",), {None: "ring,halving_doubling,psum,mpi"}, "1MiB:16MiB:4", 5,
                    "run{rep}_alg{alg}{sfx}", (0, 3, 4, 5, 6), None, True),
  "sweep": Network(4, ("switch",), {0: "ring,halving_doubling,recursive_doubling,psum,mpi",
                                    4: "ring,psum,mpi"}, "1KiB:64MiB:16", 3, "sweep_run{rep}_alg{alg}"),
  "linux": Network(4, ("switch",), {None: "ring,halving_doubling,psum,mpi"}, "1MiB:16MiB:4", 5,
                   "linux_run{rep}_alg{alg}", (0, 3, 4, 5, 6), None,
                   cluster=("--tcp-queue", "4MiB", "--queue", "500ms"), bench=("-a", "3")),
  "fat_tree": Network(4, ("fat_tree:2:2",), {None: "ring,halving_doubling,psum,mpi"},
                      "4MiB:16MiB:4", 5, "fat_tree_run{rep}_alg{alg}", timeout="600"),
  "eight_hosts": Network(8, ("switch", "torus:8"), {0: EVERY_HOST8, None: RINGS}, "1MiB:16MiB:4",
                         3, "{net}8_run{rep}_alg{alg}"),
}  # fmt: skip


@dataclass(frozen=True)
class Launch:
  """One cluster launch of the ``collectives`` campaign: ``program`` (``bench`` options,
  or ``steps.py``'s) on ``hosts`` hosts with XLA's collectives over ``collectives``, Open
  MPI's settings ``env`` (None: unset, the launcher's own), more ``cluster`` options, rows
  into ``out`` (``{rep}``: the repetition)."""

  hosts: int
  collectives: str
  program: tuple[str, ...]
  out: str
  env: dict = field(default_factory=dict)
  cluster: tuple[str, ...] = ()


PUT = "send,put,inplace,need-ack,need-csum,hetero-rdma"  # Open MPI 4.1's default btl_tcp_flags
SEND = "send,inplace,need-ack,need-csum"  # what --collectives mpi sets by default
#: Open MPI's own defaults here (the launcher's: 32 KiB fragments, ranks yielding).
DEFAULTS = {"OMPI_MCA_btl_tcp_max_send_size": "131072", "OMPI_MCA_mpi_yield_when_idle": "0"}
LAUNCHER = {k: None for k in DEFAULTS}  # the launcher's settings: these unset
BENCH3 = ("bench", "--algorithms", "ring,halving_doubling,recursive_doubling", "-b", "1MiB",
          "-e", "16MiB", "-f", "4", "--no-uneven", "-n", "3", "-w", "1")  # fmt: skip
STEPS = (sys.executable, str(HERE / "steps.py"))
STEP_SIZES = ("--sizes", "1KiB,2MiB,4MiB,8MiB,16MiB", "--reps", "5")
EVERY = ("ring,bidirectional_ring,tree,recursive_doubling,halving_doubling,halving_doubling_near,"
         "naive,two_shot,swing,double_binary_tree,psum")  # fmt: skip
TRACE = (*STEPS, "--sizes", "", "--split", "halving_doubling,recursive_doubling", "--reps", "5",
         "--mpi-trace")  # fmt: skip
SENDING = {**DEFAULTS, "OMPI_MCA_btl_tcp_flags": SEND}


def _mca(v: str, extra: tuple[str, ...] = ()) -> Launch:
  name = "32KiBfrag" + ("" if v == "base" else f"_{v}")
  env = {**SENDING, "OMPI_MCA_btl_tcp_max_send_size": "32768",
         "OMPI_MCA_mpi_yield_when_idle": "1" if v == "yield" else "0"}  # fmt: skip
  return Launch(4, "mpi", (*STEPS, "--sizes", "4MiB,8MiB,16MiB", "--reps", "5", *extra),
                f"collectives_steps_mpi_send_{name}_run{{rep}}", env)  # fmt: skip


#: The ``collectives`` campaign: arm -> variant -> its launches (``--variants`` picks some;
#: the first variant alone where an arm has one default, see :data:`DEFAULT_VARIANTS`).
ARMS: dict[str, dict[str, list[Launch]]] = {
  "mpi": {"": [Launch(4, "mpi", BENCH3, "collectives_mpi_run{rep}",
                      {**DEFAULTS, "OMPI_MCA_btl_tcp_flags": PUT})]},
  "mpi_send": {"": [Launch(4, "mpi", BENCH3, "collectives_mpi_send_run{rep}", SENDING)]},
  "gloo": {"": [Launch(4, "gloo", BENCH3, "collectives_gloo_run{rep}", DEFAULTS)]},
  "steps": {"": [
    Launch(4, "mpi", (*STEPS, *STEP_SIZES), "collectives_steps_mpi_run{rep}",
           {**DEFAULTS, "OMPI_MCA_btl_tcp_flags": PUT}),
    Launch(4, "mpi", (*STEPS, *STEP_SIZES), "collectives_steps_mpi_send_run{rep}", SENDING),
  ]},
  "variants": {
    v: [Launch(4, "mpi", (*STEPS, *STEP_SIZES, *extra), f"collectives_steps_mpi_send_{v}_run{{rep}}",
               {**SENDING, "OMPI_MCA_btl_tcp_max_send_size": size}, cluster)]
    for v, size, extra, cluster in (
      ("noidle", "131072", ("--sysctl", "tcp_slow_start_after_idle=0"), ()),
      ("reno", "131072", (), ("--congestion-control", "reno")),
      ("1MiBfrag", "1048576", (), ()),
      ("32KiBfrag", "32768", (), ()),
      ("8KiBfrag", "8192", (), ()),
    )
  },
  "mca": {
    "base": [_mca("base")],
    "progress": [_mca("progress", ("--mca", "btl_tcp_progress_thread=1"))],
    "links2": [_mca("links2", ("--mca", "btl_tcp_links=2"))],
    "buf256k": [_mca("buf256k", ("--mca", "btl_tcp_sndbuf=262144", "--mca", "btl_tcp_rcvbuf=262144"))],
    "yield": [_mca("yield")],
  },
  "trace": {
    v: [Launch(4, "mpi", (*TRACE, *extra), f"collectives_trace{'' if v == 'default' else '_' + v}_run{{rep}}",
               LAUNCHER, cluster)]
    for v, extra, cluster in (
      ("default", (), ()),
      ("noconc", ("--xla-flag=--xla_cpu_enable_concurrency_optimized_scheduler=false",), ()),
      ("eigen1", ("--xla-flag=--xla_cpu_multi_thread_eigen=false",), ()),
      ("reno", (), ("--congestion-control", "reno")),
      ("noidle", ("--sysctl", "tcp_slow_start_after_idle=0"), ()),
      ("progress", ("--mca", "btl_tcp_progress_thread=1"), ()),
    )
  },
  "ring8": {
    n: [Launch(8, "gloo", (*STEPS, "--sizes", f"1KiB,{step}", "--allreduce", n, "--algorithms",
                           "ring,psum", "--reps", "5"), f"collectives_ring8{suffix}_run{{rep}}", DEFAULTS)]
    for n, step, suffix in (("16MiB", "2MiB", ""), ("4MiB", "512KiB", "_4MiB"))
  },
  "table": {"": [
    Launch(4, "mpi", ("bench", "--algorithms", EVERY, "-b", "1KiB", "-e", "16MiB", "-f", "4",
                      "--no-uneven", "-n", "3", "-w", "1"), "collectives_table_run{rep}", LAUNCHER),
    Launch(4, "mpi", ("bench", "--algorithms", EVERY, "-b", "64MiB", "-e", "64MiB", "--no-uneven",
                      "-n", "1", "-w", "1"), "collectives_table_run{rep}", LAUNCHER),
    Launch(8, "mpi", ("bench", "--algorithms", EVERY, "-b", "1MiB", "-e", "16MiB", "-f", "16",
                      "--no-uneven", "-n", "3", "-w", "1"), "collectives_table_run{rep}", LAUNCHER),
  ]},
}  # fmt: skip
#: The variants an arm runs without ``--variants``: its first (``trace``, ``ring8``) or all.
DEFAULT_VARIANTS = {"trace": ("default",), "ring8": ("16MiB",)}


def _call(argv: list[str], env: dict | None = None) -> None:
  """Runs one command from the checkout's top, ``env`` over this one (None: unset)."""
  full = {**os.environ, "JAX_PLATFORMS": "cpu", **{k: v for k, v in (env or {}).items() if v}}
  for k in [k for k, v in (env or {}).items() if v is None]:
    full.pop(k, None)
  print("#", " ".join(argv), flush=True)
  subprocess.run(argv, env=full, cwd=ROOT, check=True)


def _forced(alg: int) -> dict:
  return {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
          "OMPI_MCA_coll_tuned_allreduce_algorithm": str(alg)}  # fmt: skip


def compare_command(net: Network, topology: str, rep: int, alg: int, args) -> list[str]:
  """One launch of ``net``'s side-by-side bench: repetition ``rep``, Open MPI's ``alg``."""
  lo, hi, factor = (args.sizes or net.sizes).split(":")
  sfx = "_blocks" if net.blocks_apart and args.order == "blocks" else ""
  name = net.rows.format(net=topology.split(":")[0], rep=rep, alg=alg, sfx=sfx)
  cluster = [*CLUSTER, "--hosts", str(net.hosts)]
  if net.topologies != ("switch",):
    cluster += ["--topology", topology]
  if net.timeout:
    cluster += ["--timeout", net.timeout]
  cluster += net.cluster
  bench = ["bench", "--algorithms", net.algorithms.get(alg, net.algorithms.get(None)), "-b", lo,
           "-e", hi, "-f", factor, "--no-uneven", "-n", str(net.iters), "-w", "1", *net.bench]  # fmt: skip
  if args.order:
    bench += ["--order", args.order]
  bench += ["--out", str(ROWS / f"{name}.jsonl")]
  return [*cluster, "--", *bench]


def compare(args) -> None:
  """The side-by-side bench on one network: per repetition, topology and forced algorithm."""
  net = NETWORKS[args.network]
  for rep in range(args.first, args.first + args.reps):
    for topology in args.topologies or net.topologies:
      for alg in args.forced or net.forced:
        _call(compare_command(net, topology, rep, alg, args), _forced(alg))


def wire(args) -> None:
  """Bytes on the wire: per repetition one launch per forced Open MPI algorithm, ``wire.py``
  counting ``MPI_Allreduce``'s calls (the first launch also the hand-written ones)."""
  for rep in range(args.first, args.first + args.reps):
    for alg in FORCED:
      algs = "mpi,ring,halving_doubling,recursive_doubling,psum" if alg == 0 else "mpi"
      _call([*CLUSTER, "--hosts", "4", "--timeout", "600", "--", sys.executable,
             str(HERE / "wire.py"), "--algorithms", algs, "--bytes", "4MiB", "--reps", "5",
             "--out", str(ROWS / f"wire_run{rep}.jsonl")], _forced(alg))  # fmt: skip


def launch_command(launch: Launch, rep: int) -> list[str]:
  """One launch of the ``collectives`` campaign, repetition ``rep``."""
  out = str(ROWS / (launch.out.format(rep=rep) + ".jsonl"))
  return [*CLUSTER, "--hosts", str(launch.hosts), *launch.cluster, "--collectives",
          launch.collectives, "--timeout", "900", "--", *launch.program, "--out", out]  # fmt: skip


def collectives(args) -> None:
  """The hand-written algorithms over MPI: each of ``args.arms``' launches (its variants),
  the arms taking turns within each repetition."""
  if unknown := [a for a in args.arms if a not in ARMS]:
    raise SystemExit(f"run.py collectives: {unknown[0]!r} is not an arm: {', '.join(ARMS)}.")
  if args.variants and len(args.arms) > 1:
    raise SystemExit("run.py collectives: --variants goes with one arm.")
  picked = {a: args.variants or DEFAULT_VARIANTS.get(a, tuple(ARMS[a])) for a in args.arms}
  for a, variants in picked.items():
    if unknown := [v for v in variants if v not in ARMS[a]]:
      raise SystemExit(f"run.py collectives {a}: --variants {unknown[0]!r} is not one of"
                       f" {', '.join(ARMS[a])}.")  # fmt: skip
  if "trace" in args.arms:
    _call(["bash", str(HERE / "build_mpi_call_trace.sh")])
  for rep in range(args.first, args.first + args.reps):
    for a, variants in picked.items():
      for launch in (launch for v in variants for launch in ARMS[a][v]):
        _call(launch_command(launch, rep), launch.env)


GDB_BREAKS = ("basic_linear", "nonoverlapping", "recursivedoubling", "redscat_allgather", "ring",
              "ring_segmented")  # fmt: skip  # ompi_coll_base_allreduce_intra_*
DECISION_PROGRAM = """\
import numpy as np
from mpi4py import MPI
for n in (1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20):
  if MPI.COMM_WORLD.rank == 0:
    print("size", n, flush=True)
  MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, np.ones(n // 4, np.float32))
"""


def decision(args) -> None:
  """Which algorithm Open MPI's own decision runs for a float32 sum of 1 KiB to 64 MiB per
  rank at p = 4 and 8: rank 0 under gdb, a breakpoint on each of its all-reduce algorithms;
  into rows/decision.txt."""
  with tempfile.TemporaryDirectory() as tmp:
    t = Path(tmp)
    (t / "ar.py").write_text(DECISION_PROGRAM)
    breaks = "".join(f"break ompi_coll_base_allreduce_intra_{a}\n" for a in GDB_BREAKS)
    (t / "gdb").write_text(f"set breakpoint pending on\n{breaks}commands 1-6\ncontinue\nend\nrun\n")
    (t / "rank.sh").write_text(
      '#!/bin/sh\n[ "$OMPI_COMM_WORLD_RANK" = 0 ] || exec "$@"\n'
      f'exec gdb -q -batch -x "{t}/gdb" --args "$@" > "{t}/out" 2>&1\n'
    )
    (t / "rank.sh").chmod(0o755)
    version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    lines = [
      f"# {version.splitlines()[0]}: size per rank (bytes) -> the algorithm its decision ran"
    ]
    for p in (4, 8):
      _call(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(p), "--mca", "pml",
             "ob1", "--mca", "btl", "tcp,self", str(t / "rank.sh"), sys.executable,
             str(t / "ar.py")])  # fmt: skip
      lines += _decisions((t / "out").read_text(), p)
  (ROWS / "decision.txt").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))


def _decisions(gdb_out: str, p: int) -> list[str]:
  """``p=P size=N ALGORITHM`` per size from gdb's output (a size, then the breakpoint hit)."""
  out, size = [], None
  for line in gdb_out.splitlines():
    if line.startswith("size "):
      size = line.split()[1]
    elif "hit Breakpoint" in line and "ompi_coll_base_allreduce_intra_" in line:
      alg = line.split("ompi_coll_base_allreduce_intra_")[1].split()[0].split("(")[0]
      out.append(f"p={p} size={size} {alg}")
  return out


def parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sub = ap.add_subparsers(dest="command", required=True)

  def repeated(name: str, run, help: str, **what) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help, description=help)
    for positional, choices in what.items():
      p.add_argument(positional, choices=choices)
    p.add_argument("reps", nargs="?", type=int, default=3, help="repetitions")
    p.add_argument("--first", type=int, default=1, help="the first repetition's number")
    p.set_defaults(run=run)
    return p

  c = repeated("compare", compare, "the side-by-side bench on one network", network=NETWORKS)
  c.add_argument("--forced", type=lambda s: [int(a) for a in s.split(",")],
                 help="Open MPI's algorithms, comma-separated (coll_tuned numbers)")  # fmt: skip
  c.add_argument("--order", choices=("round-robin", "blocks"), help="bench's --order")
  c.add_argument("--sizes", help="bench's -b:-e:-f, e.g. 1MiB:64MiB:64")
  c.add_argument("--topologies", type=lambda s: s.split(","), help="eight_hosts: some of them")
  repeated("wire", wire, "bytes on the wire per algorithm (wire.py), 4 MiB")
  a = sub.add_parser("collectives", help="the hand-written algorithms over MPI (ARMS)")
  a.add_argument("arms", type=lambda s: s.split(","), help=f"some of {', '.join(ARMS)}")
  a.add_argument("reps", nargs="?", type=int, default=3, help="repetitions")
  a.add_argument("--first", type=int, default=1, help="the first repetition's number")
  a.set_defaults(run=collectives)
  a.add_argument("--variants", type=lambda s: s.split(","), help="some of the arm's variants")
  d = sub.add_parser("decision", help="which algorithm Open MPI's own decision runs")
  d.set_defaults(run=decision)
  return ap


if __name__ == "__main__":
  args = parser().parse_args()
  args.run(args)
