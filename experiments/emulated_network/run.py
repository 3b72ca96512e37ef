"""Every measurement of this study and of ../gloo_pair_order/: each subcommand builds its
commands and runs them, one emulated cluster at a time (as root, or rootless where a step
allows; about an hour at 200 Mbit/s for the default steps).

    python experiments/emulated_network/run.py sweep [STEP ...]   # SWEEP's steps (default 1-6)
    python experiments/emulated_network/run.py link-queue [--hosts 4,8] [--queues 1ms,...] \\
        [--mtus 1500] [--tcp-queues 4MiB] [--congestion-controls bbr,cubic] [--max-bytes 16MiB] \\
        [--order blocks] [--repeats 3] [--incast] --out ROWS

``sweep`` runs the numbered steps of :data:`SWEEP`, each resumable (a step skips the rows it
has: ``bench`` by its rows' keys, the others by their tags). ``link-queue`` runs the ring
and ``psum`` for every (hosts, link queue, MTU, TCP queue, congestion control, repeat), the
repeats going round the settings so that a slow spell of the machine hits each alike,
and tags each row with them (``--incast``: also the algorithms whose messages converge).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from allreduce_jax import results, units

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = HERE / "rows"
GLOO = HERE.parent / "gloo_pair_order"
LINK = "200Mbit"
PY = sys.executable
NETS = (("switch", 4), ("switch", 8), ("fat_tree:4:2", 8), ("torus:8", 8))
ALL = ("ring,bidirectional_ring,tree,recursive_doubling,halving_doubling,halving_doubling_near,"
       "swing,double_binary_tree,naive,psum")  # fmt: skip
FAST = (
  "ring,bidirectional_ring,halving_doubling,halving_doubling_near,swing,double_binary_tree,psum"
)
BENCH = ("bench", "-n", "3", "-w", "1", "--no-uneven", "-a", "3")  # -a 3: the slowest process


def cluster(hosts: int, *options: str, tcp_queue: str = "16KiB") -> list[str]:
  """``allreduce-jax cluster`` on ``hosts`` hosts of 200 Mbit/s links, run nice'd."""
  return ["nice", "-n", "5", PY, "-m", "allreduce_jax", "cluster", "--link", LINK, "--timeout",
          "1800", "--tcp-queue", tcp_queue, "--hosts", str(hosts), *options]  # fmt: skip


def _call(argv: list[str], **kw) -> subprocess.CompletedProcess:
  print("##", " ".join(argv), file=sys.stderr, flush=True)
  return subprocess.run(argv, cwd=ROOT, **kw)


def _name(net: str, p: int) -> str:
  return f"{net.replace(':', '_')}_{p}.jsonl"


def _network(hosts: int, **more) -> dict:
  """The network a row was measured on, for the key of rows this script writes itself."""
  return {"network": "switch", "hosts": hosts, "link_Bps": units.parse_rate(LINK), **more}


def append(path: Path, kind: str, rows: list[dict], context: dict, tags: dict) -> None:
  """``rows`` (a program's own output) tagged with ``tags``, through the row store; each
  keyed by its tags, hosts, size and pattern over ``context``."""
  store = results.RowStore(path, kind, context=context)
  ident = ("p", "bytes", "pattern")
  keys = [store.key(tags, **{k: r[k] for k in ident if k in r}) for r in rows]
  store.extend([{**tags, **r} for r in rows], keys)


def printed_rows(argv: list[str]) -> list[dict]:
  """The JSON rows a cluster's process 0 printed."""
  done = _call(argv, capture_output=True, text=True, check=True)
  return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def half_duplex() -> None:
  """1: the half-duplex exchange in JAX (the minimal reproduction), 2 and 4 hosts."""
  for h in (2, 4):
    path = GLOO / "rows" / f"half_duplex_p{h}.jsonl"
    if not results.read_rows(path, "exchange"):
      argv = [*cluster(h, tcp_queue="4MiB"), "--", PY, str(GLOO / "gloo_exchange_half_duplex.py")]
      append(path, "exchange", printed_rows(argv), {"network": _network(h)}, {})


def wire_bytes() -> None:
  """2: bytes on the wire, every algorithm, 2, 4 and 8 hosts, 4 MiB per participant."""
  for h in (2, 4, 8):
    _call([*cluster(h, tcp_queue="4MiB"), "--", PY, str(HERE / "wire_bytes.py"), "--bytes",
           "4MiB", "--out", str(OUT / "wire_bytes.jsonl")], check=True)  # fmt: skip


def round_robin() -> None:
  """3: every algorithm on every network, round robin: 4 and 64 KiB (for α), 1-16 MiB, and
  64 MiB (the fast ones), at the kernel's own TCP queue (4 MiB a socket)."""
  for net, p in NETS:
    out = ("--out", str(OUT / f"bench_{_name(net, p)}"))
    for algs, sizes in ((ALL, "4KiB:64KiB:16"), (ALL, "1MiB:16MiB:4"), (FAST, "64MiB:64MiB:4")):
      lo, hi, f = sizes.split(":")
      _call([*cluster(p, "--topology", net, tcp_queue="4MiB"), "--", *BENCH, "--algorithms",
             algs, "-b", lo, "-e", hi, "-f", f, *out], check=True)  # fmt: skip


def in_blocks() -> None:
  """4: every network again in blocks (each algorithm's warm-up and calls together)."""
  for net, p in NETS:
    _call([*cluster(p, "--topology", net, tcp_queue="4MiB"), "--", *BENCH, "--order", "blocks",
           "--algorithms", ALL, "-b", "1MiB", "-e", "16MiB", "-f", "4", "--out",
           str(OUT / f"blocks_{_name(net, p)}")], check=True)  # fmt: skip


def small_queue(folder: str, *options: str) -> Callable[[], None]:
  """Every network in blocks at ``cluster``'s default 16 KiB TCP queue, 4 KiB-64 MiB,
  into ``rows/FOLDER`` (``options``: more cluster options)."""

  def run() -> None:
    for net, p in NETS:
      out = ("--out", str(OUT / folder / f"blocks_{_name(net, p)}"))
      for algs, sizes in ((ALL, "4KiB:64KiB:16"), (ALL, "1MiB:16MiB:4"), (FAST, "64MiB:64MiB:4")):
        lo, hi, f = sizes.split(":")
        _call([*cluster(p, "--topology", net, *options), "--", *BENCH, "--order", "blocks",
               "--algorithms", algs, "-b", lo, "-e", hi, "-f", f, *out], check=True)  # fmt: skip

  return run


def half_duplex_sizes() -> None:
  """9: one ppermute by size (64 KiB-16 MiB) on the 4-host switch at cubic, 3 runs."""
  path = GLOO / "rows" / "half_duplex_sizes_p4.jsonl"
  have = {r["run"] for r in results.read_rows(path, "exchange")}
  for i in sorted({1, 2, 3} - have):
    argv = [*cluster(4, "--congestion-control", "cubic"), "--", PY,
            str(GLOO / "gloo_exchange_half_duplex.py"), "--sizes", "64KiB,256KiB,1MiB,4MiB,16MiB"]  # fmt: skip
    tags = {"run": i, "congestion_control": "cubic"}
    append(path, "exchange", printed_rows(argv), {"network": _network(4)}, tags)


def rootless() -> None:
  """11: the same bench built as root and rootless (in a user namespace), alternating."""
  for i in (1, 2, 3):
    for mode in ("root", "rootless"):
      flag = ("--rootless",) if mode == "rootless" else ()
      _call([*cluster(4, *flag), "--", *BENCH, "--order", "blocks", "--algorithms",
             "ring,halving_doubling,naive,psum", "-b", "4MiB", "-e", "16MiB", "-f", "4", "--out",
             str(OUT / "rootless" / f"{mode}_run{i}.jsonl")], check=True)  # fmt: skip


COUNTERS = ('echo RETRANS $(hostname) $(nstat -asz TcpRetransSegs TcpExtTCPTimeouts'
            ' TcpExtTCPLossProbes | awk "NR>1{print \\$1\\"=\\"\\$2}")')  # fmt: skip


def ring_alone() -> None:
  """12: the ring alone at cubic (4 hosts, 16 MiB), 5 runs, then 3 runs of naive (an
  incast) before it on the same connections, with each host's TCP retransmissions."""
  d = OUT / "ring_alone_cubic"
  counts = d / "retransmissions.txt"
  for i in range(1, 9):
    name, algs = (
      (f"alone_run{i}", "ring") if i <= 5 else (f"after_naive_run{i - 5}", "naive,ring,tree")
    )
    if (d / f"{name}.jsonl").exists() and (d / f"{name}.jsonl").stat().st_size:
      continue
    bench = " ".join([PY, "-m", "allreduce_jax", *BENCH, "--order", "blocks", "--algorithms",
                      algs, "-b", "16MiB", "-e", "16MiB", "-n", "5", "--out", str(d / f"{name}.jsonl")])  # fmt: skip
    _call([*cluster(4, "--congestion-control", "cubic", "--log-dir", str(d / "logs")), "--",
           "sh", "-c", f"{bench}; {COUNTERS}"], check=True)  # fmt: skip
    lines = [f"{name} {line}" for h in range(4)
             for line in (d / "logs" / f"process-{h}.log").read_text().splitlines()
             if line.startswith("RETRANS")]  # fmt: skip
    counts.write_text((counts.read_text() if counts.exists() else "") + "\n".join(lines) + "\n")
    subprocess.run(["rm", "-rf", str(d / "logs")], check=True)


def gloo_alone(path: Path, hosts: int, tags: dict, *options: str) -> None:
  """One run of gloo alone (``../gloo_pair_order/exchange``, built by its build.sh), its
  rows tagged with ``tags`` into ``path``."""
  exe = GLOO / "exchange"
  if not exe.exists():
    raise SystemExit(f"build {exe} first: bash experiments/gloo_pair_order/build.sh")
  with tempfile.TemporaryDirectory(prefix="gloo-store.") as store:
    out = Path(store) / "rows.out"
    _call([*cluster(hosts), "--", str(exe), "--store", store, *options, "--out", str(out)],
          check=True)  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]
  append(path, "exchange", rows, {"network": _network(hosts)}, tags)


def gloo_pair_order() -> None:
  """13: gloo alone, one exchange with send or receive posted first, a shift, one way, and
  halving-doubling's exchanges in both orders: 4 hosts back to back, after a barrier and
  with the odd hosts 2 ms late; 8 hosts back to back; 3 runs each."""
  path = GLOO / "rows" / "gloo_pair_order.jsonl"
  have = {(r["run"], r["mode"], r["p"]) for r in results.read_rows(path, "exchange")}
  modes = {
    "no_barrier": ("--no-barrier",),
    "barrier": ("--barrier",),
    "skew_2ms": ("--skew-ms", "2"),
  }
  for h in (4, 8):
    for i in (1, 2, 3):
      for mode, flags in modes.items():
        if (i, mode, h) in have or (h == 8 and mode != "no_barrier"):
          continue
        gloo_alone(path, h, {"run": i, "mode": mode}, "--sizes", "64KiB,256KiB,1MiB,4MiB,16MiB",
                   *flags)  # fmt: skip


def gloo_lanes() -> None:
  """14: gloo alone, the ring and the bidirectional ring (its lanes in turn, as XLA:CPU runs
  them) with send or receive posted first, 4 and 8 hosts, back to back, 3 runs."""
  path = GLOO / "rows" / "gloo_lanes.jsonl"
  have = {(r["run"], r["p"]) for r in results.read_rows(path, "exchange")}
  for h in (4, 8):
    for i in (1, 2, 3):
      if (i, h) not in have:
        gloo_alone(path, h, {"run": i}, "--sizes", "1MiB,4MiB,16MiB", "--no-barrier",
                   "--patterns", "ring,bidir_send_first,bidir_recv_first")  # fmt: skip


@dataclass(frozen=True)
class Step:
  what: str
  run: Callable[[], None]
  default: bool = False  # run when no step is named


#: The sweep: the rows of ``rows/`` and of ``../gloo_pair_order/rows/``, step by step.
SWEEP = {
  1: Step("the half-duplex exchange in JAX, 2 and 4 hosts", half_duplex, True),
  2: Step("bytes on the wire, every algorithm", wire_bytes, True),
  3: Step("every network round robin, 4 MiB TCP queue", round_robin, True),
  4: Step("every network in blocks, 4 MiB TCP queue", in_blocks, True),
  5: Step("every network in blocks, 16 KiB TCP queue", small_queue("tcp_queue_16k"), True),
  6: Step("step 5 again", small_queue("tcp_queue_16k/repeat"), True),
  7: Step("step 5 at cubic", small_queue("tcp_queue_16k/cubic", "--congestion-control", "cubic")),
  8: Step("step 7 after all_reduce finished each reduced slice",
          small_queue("tcp_queue_16k/cubic_finish", "--congestion-control", "cubic")),
  9: Step("one ppermute by size at cubic, 3 runs", half_duplex_sizes),
  10: Step("step 8 again", small_queue("tcp_queue_16k/cubic_finish/repeat", "--congestion-control",
                                       "cubic")),
  11: Step("root against rootless, alternating", rootless),
  12: Step("the ring alone at cubic, and after an incast", ring_alone),
  13: Step("gloo alone: send or receive first in one exchange", gloo_pair_order),
  14: Step("gloo alone: the ring and the bidirectional ring", gloo_lanes),
}  # fmt: skip


def sweep(args) -> None:
  """The steps named (default: those marked default), in order."""
  for k in args.steps or [k for k, s in SWEEP.items() if s.default]:
    print(f"# step {k}: {SWEEP[k].what}", file=sys.stderr, flush=True)
    SWEEP[k].run()


LINK_QUEUE_BENCH = ("-f", "4", "--no-uneven", "-n", "5", "-w", "1", "-a", "3")
INCAST = ("naive,tree,recursive_doubling", ("-b", "4MiB", "-e", "4MiB", "--no-uneven", "-n", "3",
                                            "-w", "1", "-a", "3"))  # fmt: skip


def link_queue(args) -> None:
  """The ring and psum as the link queue, MTU, TCP queue and congestion control change
  (``--incast``: the converging algorithms too), each row tagged with its settings."""
  done = {(r["hosts"], r["queue"], r["mtu"], r.get("tcp_queue", "4MiB"),
           r.get("congestion_control", ""), r["repeat"], r["set"])
          for r in results.read_rows(args.out, "bench")}  # fmt: skip
  plan = [(h, q, m, t, c, k, "ring") for k in range(1, args.repeats + 1) for h in args.hosts
          for q in args.queues for m in args.mtus for t in args.tcp_queues
          for c in args.congestion_controls]  # fmt: skip
  if args.incast:
    plan += [(max(args.hosts), q, 1500, t, c, 1, "incast") for q in args.queues
             for t in args.tcp_queues for c in args.congestion_controls]  # fmt: skip
  order = ("--order", args.order) if args.order else ()
  for h, q, m, t, c, k, which in (s for s in plan if s not in done):
    algs, sizes = ("ring,psum", ("-b", "4MiB", "-e", args.max_bytes, *LINK_QUEUE_BENCH))
    if which == "incast":
      algs, sizes = INCAST
    with tempfile.TemporaryDirectory() as tmp:
      out = Path(tmp) / "rows.jsonl"
      cc = ("--congestion-control", c) if c else ()
      _call([*cluster(h, "--queue", q, "--mtu", str(m), *cc, tcp_queue=t), "--", "bench",
             "--algorithms", algs, *sizes, *order, "--out", str(out), "--fresh"],
            check=True, stdout=subprocess.DEVNULL)  # fmt: skip
      rows = results.read_rows(out, "bench")
    tags = {"hosts": h, "queue": q, "mtu": m, "tcp_queue": t, "repeat": k, "set": which}
    tags |= {"congestion_control": c} if c else {}
    store = results.RowStore(args.out, "bench")
    store.extend(
      [{**r, **tags} for r in rows], [store.key(json.loads(r["key"]), **tags) for r in rows]
    )


def parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sub = ap.add_subparsers(dest="command", required=True)
  s = sub.add_parser("sweep", help="the numbered steps of SWEEP")
  s.add_argument("steps", nargs="*", type=int, choices=SWEEP, metavar="STEP",
                 help="; ".join(f"{k}: {v.what}" for k, v in SWEEP.items()))  # fmt: skip
  s.set_defaults(run=sweep)
  q = sub.add_parser("link-queue", help="ring and psum as the link's settings change")
  commas = lambda s: s.split(",")  # noqa: E731
  q.add_argument("--hosts", type=lambda s: [int(h) for h in s.split(",")], default=[4, 8])
  q.add_argument("--queues", type=commas, default=["1ms", "2ms", "100ms"])
  q.add_argument("--mtus", type=lambda s: [int(m) for m in s.split(",")], default=[1500])
  q.add_argument("--tcp-queues", type=commas, default=["4MiB"], help="cluster --tcp-queue values")
  q.add_argument("--congestion-controls", type=commas, default=[""],
                 help="cluster --congestion-control values (default: the machine's own)")  # fmt: skip
  q.add_argument("--max-bytes", default="16MiB", help="the ring set's largest size (bench -e)")
  q.add_argument("--order", help="bench --order (default: bench's own)")
  q.add_argument("--repeats", type=int, default=3)
  q.add_argument("--incast", action="store_true")
  q.add_argument("--out", type=Path, required=True, help="the rows' file (.jsonl, appended)")
  q.set_defaults(run=link_queue)
  return ap


if __name__ == "__main__":
  args = parser().parse_args()
  args.run(args)
