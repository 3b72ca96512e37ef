"""The faults study's slow-link measurements: each subcommand runs ``bench`` on an emulated
cluster (root, or rootless) with one host's link slowed by ``cluster --fault link:H=RATE@0``,
one cluster at a time, and appends the rows to ``rows/`` (``run_failures.py`` kills hosts,
takes links down and trains through it).

    python experiments/faults/run.py slow-link [RUNS]     # healthy, one link at 1/2, 1/10
    python experiments/faults/run.py slow-queue [PAIRS] [every]  # 1/10, queues of 5 and 100 ms
    python experiments/faults/run.py slow-idle [PAIRS] [CC]  # 1/10, idle restart on and off
    python experiments/faults/run.py slow-cc RUNS CC [ALGORITHMS] [--slow 2,10]  # under CC
    python experiments/faults/run.py slow-alone [every [RUNS [CC]] [--slow K] [--net NET]]  # in blocks
    python experiments/faults/run.py slow-cases [CASE ...]  # 1/100, torus:4, fat_tree:2:1, p = 8
    python experiments/faults/run.py slow-root [RUNS]     # host 0, naive's root, at 1/10

The campaigns are tables: :data:`SLOW` (host 1's rate per slowdown k), :data:`BLOCKS_NETS`
(``slow-alone every --net``) and :data:`SLOW_CASES`; one cluster run is a :class:`Bench`.
While host 1's link is slowed on a switch, its sockets and the slow link's queues are
sampled (:func:`sample_tcp`, one ``slow_link_tcp`` row a run).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import subcommands

from allreduce_jax import netns, registry, results

HERE = Path(__file__).resolve().parent
ROWS = HERE / "rows"
HOSTS = 4
LINK = "200Mbit"
SLOW = {1: None, 2: "100Mbit", 10: "20Mbit", 100: "2Mbit"}  # k -> host 1's rate (link at 1/k)
ALGORITHMS = "ring,bidirectional_ring,tree,halving_doubling,naive,psum"
# A short queue (tbf's latency) against the cluster's default 100 ms, whose 250 kB at
# 20 Mbit/s delays each direction's ACKs behind the other's data: does it close the rings'
# gap to the replay (the README: no)?
SLOW_QUEUE = "5ms"
QUEUE_ALGORITHMS = "ring,bidirectional_ring,tree,halving_doubling,psum"  # also at 100 ms
P8_ALGORITHMS = "ring,tree,naive,halving_doubling,psum"
#: The slow host as the parameter server's root: host 0 (participant 0, naive's root).
ROOT_ALGORITHMS = "naive,ring,tree,psum"
# Linux restarts an idle TCP connection's window (RFC 2861) unless this is 0; per namespace.
IDLE_SYSCTL = "/proc/sys/net/ipv4/tcp_slow_start_after_idle"
# Run as each host's process: sets the knob in the host's own network namespace, checks
# it took, then execs the bench (its argv after the script: "$0" "$@").
NO_IDLE_RESTART = f'echo 0 > {IDLE_SYSCTL} && [ "$(cat {IDLE_SYSCTL})" = 0 ] && exec "$0" "$@"'
#: ``slow-alone every --net NAME``'s networks: (hosts, --topology); the 4-host switch first.
BLOCKS_NETS = {"switch": (HOSTS, "switch"), "switch-8": (8, "switch"),
               "fat-tree": (HOSTS, "fat_tree:2:1"), "torus": (HOSTS, "torus:4")}  # fmt: skip
#: More networks, 1 MiB per host: (hosts, --topology, the rates of host 1's link, algorithms:
#: "first" those slow-link measures, "more" those it leaves out, "all", "p8").
SLOW_CASES = {
  "switch-more": (HOSTS, "switch", (None, "100Mbit", "20Mbit"), "more"),
  "switch-100": (HOSTS, "switch", ("2Mbit",), "first"),
  "switch-8": (8, "switch", ("20Mbit", None), "p8"),
  "fat-tree": (HOSTS, "fat_tree:2:1", (None, "20Mbit"), "all"),
  "torus": (HOSTS, "torus:4", (None, "20Mbit"), "all"),
}
SS_FIELDS = re.compile(r"\b(cwnd|rtt|unacked|notsent|minrtt):([0-9.]+)")


@dataclass(frozen=True)
class Bench:
  """One cluster run of ``bench``: ``algorithms`` at 1 MiB up to ``top`` on ``hosts`` hosts
  of ``network``, ``host``'s link at ``rate`` (None: healthy), links' queues ``queue``,
  rows appended to ``rows/name`` (``more``: more bench options). ``idle_restart``: for the
  ``slow-idle`` pairs, whose rows say which (True: Linux's default; False:
  ``tcp_slow_start_after_idle`` set to 0 in every host first, :data:`NO_IDLE_RESTART`);
  None: Linux's default, unmarked. ``cc``: ``cluster --congestion-control``."""

  hosts: int
  network: str
  rate: str | None
  algorithms: str
  top: str
  queue: str = "100ms"
  name: str = "slow_link.jsonl"
  more: tuple[str, ...] = ()
  idle_restart: bool | None = None
  cc: str | None = None
  host: int = 1

  def argv(self, out: str) -> list[str]:
    faults = ["--fault", f"link:{self.host}={self.rate}@0"] if self.rate else []
    faults += ["--congestion-control", self.cc] if self.cc else []  # before "--"
    py = [sys.executable, "-m", "allreduce_jax"]
    bench = ["sh", "-c", NO_IDLE_RESTART, *py] if self.idle_restart is False else []
    return [*py, "cluster", "--hosts", str(self.hosts), "--topology", self.network,
            "--link", LINK, "--queue", self.queue, "--timeout", "1800", *faults, "--", *bench,
            "bench", "-n", "3", "-w", "1", "--no-uneven", "-a", "3", "--algorithms",
            self.algorithms, "-b", "1MiB", "-e", self.top, "-f", "4", "--fresh", "--out", out,
            "--plot", str(Path(tempfile.gettempdir()) / "slow_link_bench.png"),
            *self.more]  # fmt: skip

  @property
  def mark(self) -> dict:
    return {} if self.idle_restart is None else {"slow_start_after_idle": int(self.idle_restart)}


def bench(b: Bench) -> None:
  """Runs ``b``, appending its rows through the row store; host 1 sampled
  (:func:`sample_tcp`) when its link is the slowed one on a switch."""
  with tempfile.TemporaryDirectory() as tmp:  # bench skips rows its --out has: one file a run
    argv = b.argv(f"{tmp}/rows.jsonl")
    samples: list[dict] = []
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) as proc:
      for line in proc.stderr:
        sys.stderr.write(line)
        tag = re.search(r"namespaces (\S+)-\*", line)
        if tag and b.rate and b.network == "switch" and b.host == 1:
          threading.Thread(target=sample_tcp, args=(tag[1], proc, samples), daemon=True).start()
    if proc.returncode:
      raise SystemExit(f"run.py: the cluster run exited {proc.returncode}: {' '.join(argv)}")
    rows = results.read_rows(f"{tmp}/rows.jsonl", "bench")
  results.RowStore(ROWS / b.name, "bench").extend([{**r, **b.mark} for r in rows])
  if samples:
    row = {**tcp_summary(b, samples), "bench": list(b.more), **b.mark}
    row.update({"cc": b.cc} if b.cc else {})
    store = results.RowStore(ROWS / "slow_link_tcp.jsonl", "slow_link_tcp", context={})
    ident = ("hosts", "slow", "queue", "algorithms", "sizes", "bench", "cc")
    store.append(row, store.key({"study": "faults", **{k: row[k] for k in ident if k in row}},
                                **b.mark))  # fmt: skip


def sample_tcp(tag: str, proc: subprocess.Popen, samples: list[dict]) -> None:
  """Every 0.25 s while ``proc`` runs: host 1's TCP sockets that have data in flight or
  waiting (``ss -tin``: cwnd, smoothed RTT, unacked, delivery rate) and the backlog and
  drops of the slow link's two queues (``tc -s qdisc``: host 1's ``eth0``, the switch's
  ``p1``)."""
  h1, sw = f"{tag}-h1", f"{tag}-sw"
  while proc.poll() is None:
    ss = subprocess.run(["ip", "netns", "exec", h1, "ss", "-tin"], capture_output=True, text=True)
    socks = []
    for info in re.findall(r"\n\s+(\S.*bytes_sent.*)", ss.stdout):
      f = {k: float(v) for k, v in SS_FIELDS.findall(info)}
      rate = re.search(r"delivery_rate (\d+)bps", info)
      if f.get("unacked", 0) > 0 or f.get("notsent", 0) > 0:
        socks.append({**f, "delivery_bps": float(rate[1]) if rate else None})
    queues = {}
    for ns, dev in ((h1, "eth0"), (sw, "p1")):
      tc = subprocess.run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", dev],
                          capture_output=True, text=True).stdout  # fmt: skip
      m = re.search(r"dropped (\d+).*?backlog (\d+)b", tc, re.S)
      if m:
        queues[dev] = {"drops": int(m[1]), "backlog": int(m[2])}
    if socks or queues:
      samples.append({"t": time.time(), "sending": socks, "queues": queues,
                      "load": os.getloadavg()[0]})  # fmt: skip
    time.sleep(0.25)


def tcp_summary(b: Bench, samples: list[dict]) -> dict:
  """One row: percentiles over the samples of host 1's sending sockets (smoothed RTT ms,
  cwnd in segments, delivery rate Mbit/s) and of the two queues' backlog (bytes), with
  the drops at the end."""

  def pct(xs):
    xs = sorted(x for x in xs if x is not None)
    return {q: xs[min(len(xs) - 1, int(q / 100 * len(xs)))] for q in (10, 50, 90)} if xs else {}

  socks = [x for s in samples for x in s["sending"]]
  queues = {
    dev: [s["queues"][dev] for s in samples if dev in s["queues"]] for dev in ("eth0", "p1")
  }
  return {
    "hosts": b.hosts, "link": LINK, "slow": b.rate, "queue": b.queue,
    "algorithms": b.algorithms, "sizes": f"1MiB-{b.top}", "samples": len(samples),
    "socket_samples": len(socks),
    "rtt_ms": pct(x.get("rtt") for x in socks), "min_rtt_ms": pct(x.get("minrtt") for x in socks),
    "cwnd": pct(x.get("cwnd") for x in socks),
    "delivery_Mbps": pct(x["delivery_bps"] / 1e6 for x in socks if x["delivery_bps"]),
    "backlog_bytes": {dev: pct(q["backlog"] for q in qs) for dev, qs in queues.items()},
    "backlog_max": {dev: max((q["backlog"] for q in qs), default=None) for dev, qs in queues.items()},
    "drops": {dev: qs[-1]["drops"] if qs else None for dev, qs in queues.items()},
    "load_1min": pct(s.get("load") for s in samples),
  }  # fmt: skip


def every_algorithm() -> str:
  """Every hand-written one-axis algorithm (``auto`` aside) and ``psum``, comma-separated."""
  names = [a for a in registry.names(axes=1) if a != "auto"]
  return ",".join(a for a in names if registry.ALGORITHMS[a].hand_written or a == "psum")


# ------------------------------------------------------------------ the subcommands


def slow_link(args) -> None:
  """``runs`` rounds, each: every hand-written algorithm and ``psum`` at 1 and 4 MiB per
  host with host 1's link at 1/10, 1/2 and healthy, and 8 hosts (:data:`P8_ALGORITHMS`,
  1 MiB) at 1/10 and healthy; the cluster's default queues (100 ms)."""
  for _ in range(args.runs):
    for k in (10, 2, 1):
      bench(Bench(HOSTS, "switch", SLOW[k], every_algorithm(), "4MiB"))
    slow_cases(argparse.Namespace(cases=["switch-8"]))


def slow_alone(args) -> None:
  """The ring alone (no other algorithm's calls between its calls: bench ``--order
  blocks``, 6 calls), 4 MiB, host 1 at 1/10, queues of 100 ms and :data:`SLOW_QUEUE`;
  ``every``: instead ``runs`` rounds of every algorithm so (3 calls each, 100 ms queues),
  each round host 1 at each 1/k of ``--slow`` (1 and 4 MiB; 1 MiB only at 1/100, where a
  4 MiB call takes ~40 s, and on any ``--net`` but the 4-host switch), every host's TCP
  congestion control ``cc`` (None: the machine's; the rows' key says which)."""
  if args.every:
    hosts, network = BLOCKS_NETS[args.net]
    for _ in range(args.runs):
      for k in args.slow:
        top = "1MiB" if k == 100 or args.net != "switch" else "4MiB"
        bench(Bench(hosts, network, SLOW[k], every_algorithm(), top, name="slow_link_alone.jsonl",
                    more=("--order", "blocks"), cc=args.cc))  # fmt: skip
    return
  for queue in ("100ms", SLOW_QUEUE):
    bench(Bench(HOSTS, "switch", SLOW[10], "ring", "4MiB", queue, "slow_link_alone.jsonl",
                ("-b", "4MiB", "-n", "6", "--order", "blocks")))  # fmt: skip


def slow_root(args) -> None:
  """Host 0, the parameter server's (``naive``'s) root, at 1/10: ``runs`` runs of
  :data:`ROOT_ALGORITHMS` at 1 and 4 MiB timed in blocks (bench ``--order blocks``), as
  the ``slow-alone every`` cells with host 1 slowed."""
  for _ in range(args.runs):
    bench(Bench(HOSTS, "switch", SLOW[10], ROOT_ALGORITHMS, "4MiB", name="slow_root.jsonl",
                more=("--order", "blocks"), host=0))  # fmt: skip


def slow_queue(args) -> None:
  """``runs`` pairs: the algorithms at 1 and 4 MiB with host 1 at 1/10, queues of
  :data:`SLOW_QUEUE` then of 100 ms."""
  algorithms = every_algorithm() if args.every else QUEUE_ALGORITHMS
  for _ in range(args.runs):
    for queue in (SLOW_QUEUE, "100ms"):
      bench(Bench(HOSTS, "switch", SLOW[10], algorithms, "4MiB", queue))


def slow_idle(args) -> None:
  """``runs`` pairs, their order alternating: :data:`ALGORITHMS` at 1 and 4 MiB with host
  1 at 1/10 (100 ms queues, round-robin), Linux's ``tcp_slow_start_after_idle`` on (its
  default) and off in every host; ``cc``: the hosts' TCP congestion control (None: the
  machine's; Linux skips the idle restart for one that sets the rate itself, as BBR does)."""
  for i in range(args.runs):
    for idle_restart in (True, False)[:: 1 if i % 2 else -1]:
      bench(Bench(HOSTS, "switch", SLOW[10], ALGORITHMS, "4MiB", idle_restart=idle_restart,
                  cc=args.cc))  # fmt: skip


def slow_cc(args) -> None:
  """``runs`` rounds, each: the algorithms (default: :func:`every_algorithm`) at 1 and 4 MiB
  with host 1 at each 1/k of ``--slow`` (100 ms queues, round-robin), every host's TCP
  congestion control ``cc`` (``cluster --congestion-control``; the rows' key says which)."""
  for _ in range(args.runs):
    for k in args.slow:
      bench(Bench(HOSTS, "switch", SLOW[k], args.algorithms or every_algorithm(), "4MiB",
                  cc=args.cc))  # fmt: skip


def slow_cases(args) -> None:
  """The rows of :data:`SLOW_CASES` (``cases``: only those)."""
  every = every_algorithm()
  more = ",".join(a for a in every.split(",") if a not in ALGORITHMS.split(","))
  which = {"first": ALGORITHMS, "more": more, "all": every, "p8": P8_ALGORITHMS}
  for name in args.cases or SLOW_CASES:
    hosts, network, rates, algorithms = SLOW_CASES[name]
    for rate in rates:
      bench(Bench(hosts, network, rate, which[algorithms], "1MiB"))


# ------------------------------------------------------------------ the command line


def runs(text: str) -> int:
  if not text.isdigit() or int(text) < 1:
    raise argparse.ArgumentTypeError(f"expects a positive whole number, got {text!r}")
  return int(text)


def slowdowns(text: str) -> tuple[float, ...]:
  """``--slow``'s comma list: each one of :data:`SLOW`'s slowed factors (2, 10, 100)."""
  try:
    ks = tuple(float(x) for x in text.split(",") if x)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expects a comma list of numbers, got {text!r}") from None
  bad = [k for k in ks if k not in SLOW or k == 1]
  if bad or not ks:
    raise argparse.ArgumentTypeError(
      f"expects host 1's link at 1/k for k in {', '.join(str(k) for k in SLOW if k > 1)},"
      f" got {', '.join(f'{k:g}' for k in bad) or 'none'}"
    )
  return ks


def algorithms(text: str) -> str:
  names = [a for a in text.split(",") if a]
  unknown = [a for a in names if a not in registry.ALGORITHMS]
  if unknown:
    raise argparse.ArgumentTypeError(
      f"expects registered algorithms ({', '.join(every_algorithm().split(','))}...),"
      f" got {', '.join(unknown)}"
    )
  return ",".join(names)


def parser() -> subcommands.Parser:
  """``run.py``'s subcommands; each parsed command's ``run(args)`` measures."""
  p, add = subcommands.parser("run.py", __doc__)
  count = lambda default: (["runs"], {"nargs": "?", "type": runs, "default": default})  # noqa: E731
  cc = (["cc"], {"nargs": "?", "default": None})
  slow = (["--slow"], {"type": slowdowns, "default": None, "metavar": "K[,K...]"})
  add("slow-link", slow_link, count(3))
  add("slow-queue", slow_queue, count(2), (["every"], {"nargs": "?", "choices": ["every"]}))
  add("slow-idle", slow_idle, count(3), cc)
  add("slow-cc", slow_cc, (["runs"], {"type": runs}), (["cc"], {}),
      (["algorithms"], {"nargs": "?", "type": algorithms, "default": ""}), slow)  # fmt: skip
  add("slow-alone", slow_alone, (["every"], {"nargs": "?", "choices": ["every"]}), count(1), cc,
      slow, (["--net"], {"choices": list(BLOCKS_NETS), "default": None}))  # fmt: skip
  add("slow-cases", slow_cases, (["cases"], {"nargs": "*", "metavar": "CASE"}))
  add("slow-root", slow_root, count(3))
  return p


def parse(argv: list[str]) -> argparse.Namespace:
  """The parsed command, its combinations checked (one line naming what is wrong)."""
  args = parser().parse_args(argv)
  where = f"run.py {args.command}"
  if args.command == "slow-alone" and not args.every and (args.slow or args.net):
    raise SystemExit(f"{where}: --slow and --net expect every (the ring alone is at 1/10 on"
                     " the 4-host switch).")  # fmt: skip
  if args.command == "slow-alone" and not args.every and (args.runs != 1 or args.cc):
    raise SystemExit(f"{where}: RUNS and CC expect every: slow-alone every [RUNS] [CC].")
  problem = getattr(args, "cc", None) and netns.congestion_control_problem(args.cc)
  if problem:
    raise SystemExit(f"{where}: {problem}")
  unknown = [c for c in getattr(args, "cases", []) if c not in SLOW_CASES]
  if unknown:
    raise SystemExit(f"{where}: expected cases among {', '.join(SLOW_CASES)}, got {unknown}.")
  if "slow" in args:
    args.slow = args.slow or (10,)
  if "net" in args:
    args.net = args.net or "switch"
  return args


if __name__ == "__main__":
  args = parse(sys.argv[1:])
  args.run(args)
