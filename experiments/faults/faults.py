"""Faults on the emulated cluster: one slow link per algorithm, the time until a killed
host is named, and a training run that loses a host and recovers.

    python experiments/faults/faults.py slow-link   # bench rows: healthy, one link at 1/2, 1/10 [RUNS]
    python experiments/faults/faults.py slow-queue  # 1/10, queues of 5 and 100 ms [PAIRS]
    python experiments/faults/faults.py slow-idle   # 1/10, tcp_slow_start_after_idle 1, 0 [PAIRS [CC]]
    python experiments/faults/faults.py slow-cc 3 cubic  # 1/10 under that congestion control [ALGORITHMS]
    python experiments/faults/faults.py slow-alone every 3  # every algorithm in blocks [RUNS [CC]]
    python experiments/faults/faults.py slow-alone every 1 --net torus  # on another network
    python experiments/faults/faults.py slow-cases  # 1/100, torus:4, fat_tree:2:1, p = 8 [CASE...]
    python experiments/faults/faults.py kill        # a host killed mid-collective [ALGORITHMS]
    python experiments/faults/faults.py stop ring   # a host SIGSTOPped, --heartbeat-timeout 5
    python experiments/faults/faults.py down        # a link down 0.5, 2, 5 s [ALGORITHMS]
    python experiments/faults/faults.py give-up     # a link down past the heartbeat timeout
    python experiments/faults/faults.py slow-host   # train sync, a slowed host kept or isolated
    python experiments/faults/faults.py recovery    # train sync killed mid-run: --restarts, --elastic
    python experiments/faults/faults.py torn        # a saver SIGKILLed at 20 random moments
    python experiments/faults/faults.py tables      # tables.md and slow_link.png from the rows

Every measurement runs ``allreduce-jax cluster`` (root, or rootless), most on 4 hosts of a
switch whose links run at 200 Mbit/s each way; faults come from ``cluster --fault``.
ALGORITHMS: a comma list (default: those each step names). Options: ``--seeds 0,1,2``
(recovery, slow-host: one run per seed), ``--for 10,20`` and ``--runs N`` (down: those
outages, N runs each, at JAX's default heartbeat timeout), ``--kill-at T`` or
``--kill-after-step K`` (recovery: host 2 SIGKILLed T s after the hosts joined, or once
step K's checkpoint is complete), ``--slow 2,10`` (slow-cc, slow-alone every: host 1 at
those 1/k; default 10; slow-alone every times 1 MiB only at 1/100, where 4 MiB would take
~40 s a call), ``--net switch-8|fat-tree|torus`` (slow-alone every: on 8 hosts of a switch,
fat_tree:2:1 or torus:4 instead of the 4-host switch; 1 MiB), ``--concurrent`` (``cluster --concurrent``: do not wait
for another cluster run; the rows say so).
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS = HERE / "rows"
HOSTS = 4
LINK = "200Mbit"
SLOW = {1: None, 2: "100Mbit", 10: "20Mbit", 100: "2Mbit"}  # k -> host 1's rate (link at 1/k)
ALGORITHMS = "ring,bidirectional_ring,tree,halving_doubling,naive,psum"
KILL_AT = (3.0, 4.5, 6.0)  # seconds after the hosts joined: 1, 2.5, 4 s into the calls
KILL_SIZE = "1MiB"
CLUSTER = [sys.executable, "-m", "allreduce_jax", "cluster", "--hosts", str(HOSTS),
           "--link", LINK, "--timeout", "900"]  # fmt: skip


def _read(name: str) -> list[dict]:
  return _read_path(ROWS / name)


def _read_path(path: Path) -> list[dict]:
  return (
    [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
  )


def _append(name: str, row: dict) -> None:
  ROWS.mkdir(exist_ok=True)
  with open(ROWS / name, "a") as f:
    f.write(json.dumps(row) + "\n")


# A short queue (tbf's latency) against the cluster's default 100 ms, whose 250 kB at
# 20 Mbit/s delays each direction's ACKs behind the other's data: does it close the rings'
# gap to the replay (the README: no)?
SLOW_QUEUE = "5ms"
QUEUE_ALGORITHMS = "ring,bidirectional_ring,tree,halving_doubling,psum"  # also at 100 ms
P8_ALGORITHMS = "ring,tree,naive,halving_doubling,psum"
# Linux restarts an idle TCP connection's window (RFC 2861) unless this is 0; per namespace.
IDLE_SYSCTL = "/proc/sys/net/ipv4/tcp_slow_start_after_idle"


def slow_link(runs: int = 3) -> None:
  """``runs`` rounds, each: every hand-written algorithm and ``psum`` at 1 and 4 MiB per
  host with host 1's link at 1/10, 1/2 and healthy, and 8 hosts (:data:`P8_ALGORITHMS`,
  1 MiB) at 1/10 and healthy; the cluster's default queues (100 ms)."""
  every = every_algorithm()
  for _ in range(runs):
    for k in (10, 2, 1):
      _slow_bench(HOSTS, "switch", SLOW[k], every, "4MiB")
    slow_cases(["switch-8"])


# ``slow-alone every --net NAME``'s networks: (hosts, --topology); the 4-host switch the default.
BLOCKS_NETS = {"switch": (HOSTS, "switch"), "switch-8": (8, "switch"),
               "fat-tree": (HOSTS, "fat_tree:2:1"), "torus": (HOSTS, "torus:4")}  # fmt: skip


def slow_alone(
  every: bool = False,
  runs: int = 1,
  cc: str | None = None,
  slow: tuple[float, ...] = (10,),
  net: str = "switch",
) -> None:
  """The ring alone (no other algorithm's calls between its calls: bench ``--order
  blocks``, 6 calls), 4 MiB, host 1 at 1/10, queues of 100 ms and :data:`SLOW_QUEUE`;
  ``every``: instead ``runs`` rounds of every algorithm so (3 calls each, 100 ms queues),
  each round host 1 at each 1/k of ``slow`` (1 and 4 MiB; 1 MiB only at 1/100, where a
  4 MiB call takes ~40 s, and on any ``net`` but the 4-host switch), every host's TCP
  congestion control ``cc`` (None: the machine's; the rows' key says which, and host 1's
  link fault its rate), on :data:`BLOCKS_NETS`' ``net``."""
  _check_slow(slow)
  if net not in BLOCKS_NETS:
    raise SystemExit(
      f"faults.py slow-alone: --net expects one of {', '.join(BLOCKS_NETS)}, got {net!r}."
    )
  hosts, network = BLOCKS_NETS[net]
  if every:
    for _ in range(runs):
      for k in slow:
        top = "1MiB" if k == 100 or net != "switch" else "4MiB"
        _slow_bench(hosts, network, SLOW[k], every_algorithm(), top, "100ms",
                    "slow_link_alone.jsonl", ("--order", "blocks"), cc=cc)  # fmt: skip
    return
  if slow != (10,) or net != "switch":
    raise SystemExit(
      "faults.py slow-alone: --slow and --net expect every (the ring alone is at 1/10 on the"
      " 4-host switch)."
    )
  for queue in ("100ms", SLOW_QUEUE):
    _slow_bench(HOSTS, "switch", SLOW[10], "ring", "4MiB", queue, "slow_link_alone.jsonl",
                ("-b", "4MiB", "-n", "6", "--order", "blocks"))  # fmt: skip


#: The slow host as the parameter server's root: host 0 (participant 0, naive's root).
ROOT_ALGORITHMS = "naive,ring,tree,psum"


def slow_root(runs: int = 3) -> None:
  """Host 0, the parameter server's (``naive``'s) root, at 1/10: ``runs`` runs of
  :data:`ROOT_ALGORITHMS` at 1 and 4 MiB timed in blocks (bench ``--order blocks``), as
  the ``slow-alone every`` cells with host 1 slowed."""
  for _ in range(runs):
    _slow_bench(HOSTS, "switch", SLOW[10], ROOT_ALGORITHMS, "4MiB", "100ms", "slow_root.jsonl",
                ("--order", "blocks"), host=0)  # fmt: skip


def slow_root_table() -> str:
  """Per algorithm and size: host 0 (the root) slowed against host 1 (a leaf) slowed, both
  at 1/10 and timed in blocks (the machine's congestion control, 100 ms queues): median
  (min–max) seconds over the runs, and in n·k/B (n bytes through the slow link)."""
  root = [r for r in _read("slow_root.jsonl") if r.get("wrong") == 0]
  if not root:
    return "(not measured)"

  def net(r: dict) -> dict:
    return json.loads(r["key"])["network"]

  leaf = [r for r in _read("slow_link_alone.jsonl") if r.get("wrong") == 0 and r["iters"] != 6
          and net(r)["faults"] == ["link:1=20Mbit@0"] and net(r)["hosts"] == HOSTS
          and net(r)["queue_s"] == 0.1 and _cc(r) is None]  # fmt: skip
  lines = ["| algorithm | size | host 0 (root) at 1/10, s | n·k/B | host 1 (leaf) at 1/10, s |"
           " n·k/B | root / leaf |", "|---|---|---|---|---|---|---|"]  # fmt: skip
  for alg in ROOT_ALGORITHMS.split(","):
    for size in sorted({r["bytes"] for r in root}):
      a = [r["time_us"] / 1e6 for r in root if r["algorithm"] == alg and r["bytes"] == size]
      b = [r["time_us"] / 1e6 for r in leaf if r["algorithm"] == alg and r["bytes"] == size]
      if not a:
        continue
      n = size / (net(root[0])["link_Bps"] / 10)
      leaf_cells = (
        f"{_mid(b)} | {_median(b) / n:.2f} | {_median(a) / _median(b):.2f}" if b else "– | – | –"
      )
      lines.append(
        f"| {alg} | {size // 2**20} MiB | {_mid(a)} | {_median(a) / n:.2f} | {leaf_cells} |"
      )
  return "\n".join(lines)


def _mid(xs: list[float]) -> str:
  """``median (min–max)`` of ``xs``, two decimals."""
  return f"{_median(xs):.2f} ({_span(xs)})"


def slow_queue(runs: int = 2, algorithms: str = QUEUE_ALGORITHMS) -> None:
  """``runs`` pairs: ``algorithms`` at 1 and 4 MiB with host 1 at 1/10, queues of
  :data:`SLOW_QUEUE` then of 100 ms."""
  for _ in range(runs):
    for queue in (SLOW_QUEUE, "100ms"):
      _slow_bench(HOSTS, "switch", SLOW[10], algorithms, "4MiB", queue)


def slow_idle(runs: int = 3, cc: str | None = None) -> None:
  """``runs`` pairs, their order alternating: :data:`ALGORITHMS` at 1 and 4 MiB with host
  1 at 1/10 (100 ms queues, round-robin), Linux's ``tcp_slow_start_after_idle`` on (its
  default) and off in every host (rows: ``"slow_start_after_idle"`` 1 or 0); ``cc``: the
  hosts' TCP congestion control (None: the machine's; Linux skips the idle restart for
  one that sets the rate itself, as BBR does)."""
  for i in range(runs):
    for idle_restart in (True, False)[:: 1 if i % 2 else -1]:
      _slow_bench(HOSTS, "switch", SLOW[10], ALGORITHMS, "4MiB", idle_restart=idle_restart, cc=cc)


def slow_cc(runs: int, cc: str, algorithms: str, slow: tuple[float, ...] = (10,)) -> None:
  """``runs`` rounds, each: ``algorithms`` (default: :func:`every_algorithm`) at 1 and 4 MiB
  with host 1 at each 1/k of ``slow`` (100 ms queues, round-robin), every host's TCP
  congestion control ``cc`` (``cluster --congestion-control``; the rows' key says which)."""
  _check_slow(slow)
  from allreduce_jax import netns

  problem = netns.congestion_control_problem(cc)
  if problem:
    raise SystemExit(f"faults.py slow-cc: {problem}")
  for _ in range(runs):
    for k in slow:
      _slow_bench(HOSTS, "switch", SLOW[k], algorithms or every_algorithm(), "4MiB", cc=cc)


def _check_slow(slow: tuple[float, ...]) -> None:
  """``--slow``'s factors k: each one of :data:`SLOW`'s slowed rates (2, 10, 100)."""
  bad = [k for k in slow if k not in SLOW or k == 1]
  if bad:
    raise SystemExit(
      f"faults.py: --slow expects host 1's link at 1/k for k in"
      f" {', '.join(str(k) for k in SLOW if k > 1)}, got {', '.join(f'{k:g}' for k in bad)}."
    )


# Run as each host's process: sets the knob in the host's own network namespace, checks
# it took, then execs the bench (its argv after the script: "$0" "$@").
NO_IDLE_RESTART = f'echo 0 > {IDLE_SYSCTL} && [ "$(cat {IDLE_SYSCTL})" = 0 ] && exec "$0" "$@"'


def _slow_bench(
  hosts: int,
  network: str,
  rate: str | None,
  algorithms: str,
  top: str,
  queue: str = "100ms",
  name: str = "slow_link.jsonl",
  more: tuple[str, ...] = (),
  idle_restart: bool | None = None,
  cc: str | None = None,
  host: int = 1,
) -> None:
  """One cluster run of ``bench``, its rows appended to ``rows/name`` (``more``: more
  bench options); ``host``'s link at ``rate``, sampled (:func:`_sample_tcp`) if it is host 1.
  ``idle_restart``: for the ``slow-idle`` pairs, whose rows say which (1: Linux's default;
  False: ``tcp_slow_start_after_idle`` set to 0 in every host first, :data:`NO_IDLE_RESTART`);
  None: Linux's default, unmarked.
  ``cc``: ``cluster --congestion-control``."""
  faults = ["--fault", f"link:{host}={rate}@0"] if rate else []
  faults += ["--congestion-control", cc] if cc else []  # with the faults: before "--"
  bench = (
    ["sh", "-c", NO_IDLE_RESTART, sys.executable, "-m", "allreduce_jax"]
    if idle_restart is False
    else []
  )
  mark = {"slow_start_after_idle": int(idle_restart)} if idle_restart is not None else {}
  argv = [sys.executable, "-m", "allreduce_jax", "cluster", "--hosts", str(hosts),
          "--topology", network, "--link", LINK, "--queue", queue, "--timeout", "1800",
          *faults, "--", *bench, "bench", "-n", "3", "-w", "1", "--no-uneven", "-a", "3",
          "--algorithms", algorithms, "-b", "1MiB", "-e", top, "-f", "4", "--fresh",
          "--out", "OUT", "--plot", str(Path(tempfile.gettempdir()) / "slow_link_bench.png"),
          *more]  # fmt: skip
  with tempfile.TemporaryDirectory() as tmp:  # bench skips rows its --out has: one file a run
    argv[argv.index("OUT")] = out = f"{tmp}/rows.jsonl"
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) as proc:
      samples: list[dict] = []
      for line in proc.stderr:
        sys.stderr.write(line)
        tag = re.search(r"namespaces (\S+)-\*", line)
        if tag and rate and network == "switch" and host == 1:
          threading.Thread(target=_sample_tcp, args=(tag[1], proc, samples), daemon=True).start()
    if proc.returncode:
      raise SystemExit(f"faults.py: the cluster run exited {proc.returncode}: {' '.join(argv)}")
    for row in _read_path(Path(out)):
      _append(name, {**row, **mark})
  if samples:
    row = _tcp_summary(hosts, rate, queue, algorithms, top, samples)
    _append(
      "slow_link_tcp.jsonl", {**row, "bench": list(more), **mark, **({"cc": cc} if cc else {})}
    )


SS_FIELDS = re.compile(r"\b(cwnd|rtt|unacked|notsent|minrtt):([0-9.]+)")


def _sample_tcp(tag: str, proc: subprocess.Popen, samples: list[dict]) -> None:
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


def _tcp_summary(hosts, rate, queue, algorithms, top, samples) -> dict:
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
    "hosts": hosts, "link": LINK, "slow": rate, "queue": queue, "algorithms": algorithms,
    "sizes": f"1MiB-{top}", "samples": len(samples), "socket_samples": len(socks),
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
  from allreduce_jax import registry

  names = [a for a in registry.names(axes=1) if a != "auto"]
  return ",".join(a for a in names if registry.ALGORITHMS[a].hand_written or a == "psum")


# More networks, 1 MiB per host: (hosts, --topology, the rates of host 1's link, algorithms)
SLOW_CASES = {
  "switch-more": (HOSTS, "switch", (None, "100Mbit", "20Mbit"), "more"),
  "switch-100": (HOSTS, "switch", ("2Mbit",), "first"),
  "switch-8": (8, "switch", ("20Mbit", None), "p8"),
  "fat-tree": (HOSTS, "fat_tree:2:1", (None, "20Mbit"), "all"),
  "torus": (HOSTS, "torus:4", (None, "20Mbit"), "all"),
}


def slow_cases(names: list[str]) -> None:
  """The rows of :data:`SLOW_CASES` (``names``: only those): "first" the algorithms
  :func:`slow_link` measures, "more" those it leaves out, "all" every one
  (:func:`every_algorithm`)."""
  every = every_algorithm()
  more = ",".join(a for a in every.split(",") if a not in ALGORITHMS.split(","))
  for name in names or SLOW_CASES:
    hosts, network, rates, which = SLOW_CASES[name]
    for rate in rates:
      algorithms = {"first": ALGORITHMS, "more": more, "all": every, "p8": P8_ALGORITHMS}[which]
      _slow_bench(hosts, network, rate, algorithms, "1MiB")


def kill(
  algorithms: list[str],
  kind: str = "kill",
  at: tuple[float, ...] = KILL_AT,
  extra: tuple[str, ...] = (),
) -> None:
  """Host 1 SIGKILLed (``kind`` "stop": SIGSTOPped) at each of ``at`` seconds after the
  hosts joined, during a bench loop of ``algorithms`` (default: every one registered):
  when it is named and when every survivor has stopped (the cluster command returned),
  after the fault. ``extra``: more cluster options (--heartbeat-timeout)."""
  from allreduce_jax import registry

  for algorithm in algorithms or registry.names():
    per_host = registry.ALGORITHMS[algorithm].axes  # hierarchical: 2 devices a host
    for t in at:
      with tempfile.TemporaryDirectory() as logs:
        res = subprocess.run([*CLUSTER, *extra, "--devices-per-host", str(per_host),
                              "--log-dir", logs, "--fault", f"{kind}:1@{t}", "--", "bench",
                              "-n", "100000", "-w", "1", "--no-uneven", "-g", str(per_host),
                              "--algorithms", algorithm, "-b", KILL_SIZE, "-e", KILL_SIZE,
                              "--out", f"{logs}/rows.jsonl"],
                             capture_output=True, text=True)  # fmt: skip
        ended = time.time()
        faults = _read_path(Path(logs, "faults.jsonl"))
      named = _launcher_named(res.stderr)
      fault = faults[0] if faults else None
      _append("kill.jsonl", {
        "algorithm": algorithm, "hosts": HOSTS, "devices_per_host": per_host, "link": LINK,
        "bytes": KILL_SIZE, "options": list(extra), "fault": f"{kind}:1@{t}",
        "returncode": res.returncode, "named_rank": int(named[1]) if named else None,
        "named_status": named[2] if named else None,
        "named_after_kill_s": float(named[3]) - fault["after_start_s"] if named and fault else None,
        "all_stopped_after_kill_s": ended - fault["unix_time"] if fault else None,
        "stderr_tail": [] if named and fault else res.stderr.strip().splitlines()[-3:],
      })  # fmt: skip


def _launcher_named(stderr: str) -> tuple[None, str, str, str] | None:
  """Whom the launcher's message names: ``(None, rank, status, seconds)`` like a match of
  its "process R of N (pid P) STATUS after T s"; for a host that was stopped or stopped
  answering (JAX's heartbeat check), that host, at the time its peers gave up on it."""
  named = re.search(r"process (\d+) of \d+ \(pid \d+\) (.*?) after ([0-9.]+) s", stderr)
  stopped = re.search(r"process (\d+) \(pid \d+\) of \d+ (is stopped|stopped answering)", stderr)
  if named and stopped:
    return (None, stopped[1], stopped[2], named[3])
  return (None, named[1], named[2], named[3]) if named else None


# TCP's retransmission timeouts after a loss (Linux: 200 ms at least, doubling): the
# moments, after the loss, at which a segment is sent again.
RTO_S = 0.2
DOWN_S = (0.5, 2.0, 5.0)
DOWN_ALGORITHMS = ("ring", "psum", "naive")
DOWN_AT = 4.0  # seconds after the hosts joined: about 2 s into the loop of calls


def next_retry(down_s: float) -> float:
  """The first retransmission at or after an outage of ``down_s`` that began right after
  a send: RTO_S·(2^k − 1) for the smallest such k (200 ms, 600 ms, 1.4 s, 3 s, 6.2 s…)."""
  k = 1
  while RTO_S * (2**k - 1) < down_s:
    k += 1
  return RTO_S * (2**k - 1)


def down(
  algorithms: list[str],
  then_give_up: bool = True,
  durations: tuple[float, ...] = DOWN_S,
  runs: int = 1,
  extra: list[str] = (),
) -> None:
  """Host 1's link down for each of ``durations`` seconds (0.5, 2 and 5) about 2 s into a
  loop of back-to-back 1 MiB calls (bench -I: every call's time), ``runs`` times, per
  algorithm (``algorithms``; default: ring, psum, naive), JAX's heartbeat timeout at its
  default (100 s); ``then_give_up``: then one run where the outage, 8 s, outlasts a heartbeat
  timeout of 3 s, and the run gives up, naming a host; ``extra``: more cluster options."""
  for algorithm in algorithms or DOWN_ALGORITHMS:
    calls = "40" if algorithm == "naive" else "120"
    for d in durations:
      for _ in range(runs):
        _append("link_down.jsonl", _down_run(algorithm, d, calls, list(extra)))
  if then_give_up:
    give_up()


def give_up() -> None:
  """Host 1's link down for 8 s, longer than JAX's heartbeat timeout (3 s): the run gives
  up; the row holds who was named, when, and what the hosts' logs say."""
  _append("link_down.jsonl", _down_run("ring", 8.0, "120", ["--heartbeat-timeout", "3"]))


# What a host's log says when it gives up (JAX's coordination service, XLA, gloo).
GAVE_UP = re.compile(
  r"heartbeat|UNAVAILABLE|DEADLINE_EXCEEDED|[Tt]erminating|[Gg]loo.*(error|timed)"
)


def _down_run(algorithm: str, d: float, calls: str, extra: list[str]) -> dict:
  with tempfile.TemporaryDirectory() as logs:
    res = subprocess.run([*CLUSTER, *extra, "--log-dir", logs, "--fault",
                          f"down:1@{DOWN_AT:g}+{d:g}", "--", "bench", "-n", calls, "-w", "2",
                          "-I", "--no-uneven", "--algorithms", algorithm, "-b", "1MiB",
                          "-e", "1MiB", "--out", f"{logs}/rows.jsonl"],
                         capture_output=True, text=True)  # fmt: skip
    rows = _read_path(Path(logs, "rows.jsonl"))
    faults = _read_path(Path(logs, "faults.jsonl"))
    said = []  # each matching line, and the one after (the tasks a message lists)
    for p in sorted(Path(logs).glob("*.log")):
      text = p.read_text(errors="replace").splitlines()
      said += [f"{p.name}: {' '.join(text[i : i + 2]).strip()[:400]}"
               for i, x in enumerate(text) if GAVE_UP.search(x)]  # fmt: skip
    said = said[:6]
  named = _launcher_named(res.stderr)
  row = {"algorithm": algorithm, "hosts": HOSTS, "link": LINK, "bytes": 2**20,
         "options": extra, "down_s": d, "returncode": res.returncode,
         "faults": [{k: f[k] for k in ("event", "after_join_s", "after_start_s", "what")}
                    for f in faults],
         "named": f"process {named[1]} {named[2]} after {named[3]} s" if named else None,
         "named_after_down_s": float(named[3]) - faults[0]["after_start_s"]
         if named and faults else None,
         "logs_say": said,
         "stderr_tail": res.stderr.strip().splitlines()[-3:]}  # fmt: skip
  if rows:
    t = [x / 1e3 for x in rows[0]["times_us"]]
    med = sorted(t)[len(t) // 2]
    slow = [x for x in t if x > 3 * med]
    row.update({"wrong": rows[0]["wrong"], "calls": len(t), "median_ms": med,
                "slowest_ms": max(t), "calls_slowed": len(slow),
                "extra_s": sum(x - med for x in slow) / 1e3, "times_ms": t})  # fmt: skip
  return row


def _train(
  name: str, extra: list[str], tmp: Path, seed: int = 0, kill_after: int | None = None
) -> dict:
  """One cluster run of train sync (``kill_after``: host 2's process SIGKILLed as soon as
  the checkpoint of that step is complete) and its row."""
  ck = tmp / name
  argv = [*CLUSTER, "--log-dir", str(tmp / f"logs-{name}"), *extra, "--", "train", "sync",
          "--workers", str(HOSTS), "--steps", "1200", "--eval-every", "100", "--checkpoint-dir",
          str(ck), "--checkpoint-every", "50", "--seeds", str(seed),
          "--out", str(tmp / f"out-{name}")]  # fmt: skip
  t0 = time.monotonic()
  with open(tmp / "stdout", "w+") as out, open(tmp / "stderr", "w+") as err:
    proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True)
    if kill_after is not None:
      _kill_when(proc, ck / f"seed-{seed}" / str(kill_after), tmp / f"logs-{name}" / "pids.json")
    proc.wait()
    wall = time.monotonic() - t0
    out.seek(0), err.seek(0)
    res = subprocess.CompletedProcess(argv, proc.returncode, out.read(), err.read())
  line = next((x for x in res.stdout.splitlines() if x.startswith(f"seed {seed}:")), "")
  restart = re.search(r"restart 1 of 1 after .*?\(([0-9.]+) s since the start\)", res.stderr)
  named = re.search(r"process (\d+) of \d+ \(pid \d+\) was killed by SIGKILL after ([0-9.]+)", res.stderr)  # fmt: skip
  joined = re.search(r"hosts joined ([0-9.]+) s after the start", res.stderr)
  resumed = re.search(r"resumed from step \[([0-9, ]+)\]", line)
  return {
    "run": name, "seed": seed, "hosts": HOSTS, "link": LINK, "options": extra,
    "killed_after_step": kill_after, "returncode": res.returncode,
    "final_test_acc": float(re.search(r"test acc ([0-9.]+)", line)[1]) if line else None,
    "params_sha256": line.split("sha256 ")[1].strip() if "sha256" in line else None,
    "resumed_from": [int(s) for s in resumed[1].split(",")] if resumed else [],
    "hosts_final": int(re.findall(r"# cluster: (\d+) process\(es\)", res.stderr)[-1]),
    "wall_s": wall,
    "hosts_joined_s": float(joined[1]) if joined else None,
    "named_after_s": float(named[2]) if named else None,
    "restarted_after_s": float(restart[1]) if restart else None,
  }  # fmt: skip


def _kill_when(proc: subprocess.Popen, path: Path, pids: Path) -> None:
  """SIGKILLs host 2's process (the launcher's ``pids.json``) once ``path`` exists (a
  complete checkpoint's folder), unless ``proc`` ended first."""
  import os
  import signal

  while proc.poll() is None and not path.exists():
    time.sleep(0.02)
  if proc.poll() is None:
    os.kill(json.loads(pids.read_text())["2"], signal.SIGKILL)


def recovery(
  names: list[str],
  seeds: list[int] = (0,),
  kill_at: float = 12.0,
  kill_after: int | None = None,
  extra: list[str] = (),
) -> None:
  """train sync on 4 hosts: uninterrupted, host 2 killed ``kill_at`` s after joining
  (``kill_after``: instead, as soon as that step's checkpoint is complete) with
  --restarts 1, and the same with --elastic (it finishes on 3 hosts); ``names``: only
  those runs; one run each per seed of ``seeds``; ``extra``: more cluster options."""
  fault = ["--fault", f"kill:2@{kill_at:g}"] if kill_after is None else []
  kill = [*extra, *fault, "--restarts", "1"]
  runs = {"uninterrupted": [*extra], "restart": kill, "elastic": [*kill, "--elastic"]}
  for seed in seeds:
    for name in names or runs:
      with tempfile.TemporaryDirectory() as tmp:
        after = None if name == "uninterrupted" else kill_after
        _append("recovery.jsonl", _train(name, runs[name], Path(tmp), seed, after))


SLOW_HOST_RUNS = {  # name -> (hosts, cluster options, train options)
  "healthy": (HOSTS, [], []),
  "slowed-kept": (HOSTS, ["--fault", "cpu:1=0.25@0"], []),
  "isolated": (HOSTS - 1, [], ["--learning-rate", f"{0.05 * (HOSTS - 1) / HOSTS:g}"]),
}


def slow_host(names: list[str], seeds: list[int] = (0,), more: list[str] = ()) -> None:
  """train sync, 600 steps: on 4 healthy hosts, with host 1's process held to 1/4 of a
  core from the start (kept in the job), and on the 3 others alone (isolated: the learning
  rate scaled by 3/4, as ``--elastic`` does); the time to 95 % test accuracy of each, one
  run per seed of ``seeds``; ``more``: more cluster options."""
  for seed, name in ((s, n) for s in seeds for n in names or SLOW_HOST_RUNS):
    hosts, extra, train = SLOW_HOST_RUNS[name]
    extra = [*more, *extra]
    with tempfile.TemporaryDirectory() as tmp:
      argv = [sys.executable, "-m", "allreduce_jax", "cluster", "--hosts", str(hosts), "--link",
              LINK, "--timeout", "900", "--log-dir", f"{tmp}/logs", *extra, "--", "train",
              "sync", "--workers", str(hosts), "--steps", "600", "--eval-every", "50",
              "--target", "0.95", "--seeds", str(seed), *train,
              "--out", f"{tmp}/out"]  # fmt: skip
      t0 = time.monotonic()
      res = subprocess.run(argv, capture_output=True, text=True)
      wall = time.monotonic() - t0
      rows = [r for p in Path(tmp, "out").rglob("*.jsonl") for r in _read_path(p)]
    if res.returncode or len(rows) != 1:
      raise SystemExit(f"faults.py slow-host {name}: exit {res.returncode}\n{res.stderr[-2000:]}")
    (row,) = rows
    per_step = row["wall_s"] / row["config"]["steps"]
    hit = row["steps_to_target"]
    _append("slow_host.jsonl", {
      "run": name, "seed": seed, "hosts": hosts, "link": LINK, "options": extra + train,
      "returncode": res.returncode, "steps": row["config"]["steps"],
      "eval_steps": row["eval_steps"], "test_acc": row["test_acc"],
      "final_test_acc": row["final_test_acc"], "steps_to_target": hit,
      "train_s": row["wall_s"], "time_to_target_s": None if hit is None else hit * per_step,
      "cluster_wall_s": wall,
    })  # fmt: skip


def slow_host_table() -> str:
  """Per run name: the runs, and min–max over them."""
  groups: dict[str, list[dict]] = {}
  for r in _read("slow_host.jsonl"):  # runs that did not wait for other clusters apart
    concurrent = " (--concurrent)" if "--concurrent" in r["options"] else ""
    groups.setdefault(r["run"] + concurrent, []).append(r)
  if not groups:
    return "(not measured)"
  lines = ["| run | hosts | options | runs | final test acc | steps to 95 % | training (s) |"
           " s a step | time to 95 % (s) | cluster wall (s) |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
  for name, rs in groups.items():
    r = rs[0]
    opts = " ".join(f"{float(o):g}" if re.fullmatch(r"[0-9.]+", o) else o for o in r["options"])
    col = lambda k, rs=rs: [x[k] for x in rs if x[k] is not None]  # noqa: E731
    steps = ", ".join(dict.fromkeys(str(x["steps_to_target"]) for x in rs))
    lines.append(f"| {name} | {r['hosts']} | {opts or '–'} | {len(rs)} |"
                 f" {_span(col('final_test_acc'), '.4f')} | {steps} | {_span(col('train_s'), '.1f')} |"
                 f" {_span([x['train_s'] / x['steps'] for x in rs], '.3f')} |"
                 f" {_span(col('time_to_target_s'), '.1f')} | {_span(col('cluster_wall_s'), '.1f')} |")  # fmt: skip
  return "\n".join(lines)


def torn(kills: int = 20) -> None:
  """SIGKILLs the saver (``python -m allreduce_jax.tools.saver``: 16 MiB checkpoints, step
  k's values all k) at ``kills`` random moments (0.1-2 s after it started saving); after
  each, whether a save was torn (a temporary folder left), and whether the restore
  succeeded from a complete checkpoint (every value its step's) leaving no torn folder."""
  import random

  from allreduce_jax.tools import saver

  rng = random.Random(1)
  with tempfile.TemporaryDirectory() as d:
    for i in range(kills):
      p = subprocess.Popen([sys.executable, "-m", "allreduce_jax.tools.saver", d],
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
      assert p.stdout.readline().strip() == "saving"
      wait = rng.uniform(0.1, 2.0)
      time.sleep(wait)
      p.kill()
      p.wait()
      p.stdout.close()
      left = sorted(q.name for q in Path(d).iterdir() if "tmp" in q.name)
      state = saver.restore(d)
      complete = saver.complete(state)
      _append("torn_saves.jsonl", {
        "kill": i, "after_s": wait, "torn_folders": left, "restored_step": state.step if state else None,
        "restore_complete": complete, "torn_left_after": any("tmp" in q.name for q in Path(d).iterdir()),
      })  # fmt: skip


# ------------------------------------------------------------------ tables and the figure


def _traced():
  """``cost_model.use_params`` of the cost parameters the study's bench rows traced with
  (``gloo_model.traced_params``: checked on every row, once)."""
  from allreduce_jax import cost_model

  return cost_model.use_params(_traced_params())


@functools.cache
def _traced_params():
  from allreduce_jax import gloo_model

  return gloo_model.traced_params(_read("slow_link.jsonl"))


def _within_20(ratio: float) -> bool:
  """A measured / replay ratio within 20 %."""
  return 0.8 <= ratio <= 1.2


def alone_table() -> str:
  """The ring alone (:func:`slow_alone`): each run against the replay."""
  from allreduce_jax import cluster_rows
  from allreduce_jax.tools import faults

  rows = [r for r in _read("slow_link_alone.jsonl") if r["iters"] == 6]  # every's: 3 calls
  if not rows:
    return "(not measured)"
  lines = ["| queue ms | algorithm | MiB | calls | measured ms (median; min–max of the calls) |"
           " replay ms | measured / replay |", "|---|---|---|---|---|---|---|"]  # fmt: skip
  with _traced():
    for r in rows:
      (c,) = cluster_rows.link_rate_cells([r], faults.row_links, _alpha)
      q = json.loads(r["key"])["network"]["queue_s"] * 1e3
      lines.append(f"| {q:g} | {c['algorithm']} | {c['bytes'] / 2**20:g} | {r['iters']} |"
                   f" {r['time_us'] / 1e3:.0f}; {r['time_us_min'] / 1e3:.0f}–"
                   f"{r['time_us_max'] / 1e3:.0f} | {c['replay_s'] * 1e3:.0f} |"
                   f" {c['measured_s'] / c['replay_s']:.2f} |")  # fmt: skip
  return "\n".join(lines)


def _blocks_cells() -> list[dict]:
  """``slow-alone every``'s rows (3 calls a run, unlike the ring alone's 6), one dict a cell
  (host 1's slow factor k, congestion control, queue, algorithm, size) of :func:`~allreduce_jax.cluster_rows.link_rate_cells`
  (replayed with each link's own token bucket, ``buckets=True``: the slow link's 64 KiB)
  with ``k``, ``cc``, ``queue_ms``, ``runs_s`` (each run's measured seconds; a key's n-th row is run
  n), ``measured_s`` their median and ``rr`` the round-robin cell's measured / replay (the
  median of its runs in ``slow_link.jsonl``, same k, congestion control and queue; None if
  none)."""
  from allreduce_jax import cluster_rows
  from allreduce_jax.tools import faults

  rows = [r for r in _read("slow_link_alone.jsonl") if r.get("wrong") == 0 and r["iters"] != 6]
  cells: dict[str, dict] = {}
  with _traced():
    for r in rows:
      if r["key"] not in cells:
        (c,) = cluster_rows.link_rate_cells(
          [r], faults.row_links, _alpha, buckets=True
        )  # each link's own bucket
        cells[r["key"]] = {**c, "cc": _cc(r), "k": _k(r), "runs_s": [],
                           "queue_ms": json.loads(r["key"])["network"]["queue_s"] * 1e3}  # fmt: skip
      cells[r["key"]]["runs_s"].append(r["time_us"] / 1e6)
    rr = {}
    for r in _slow_rows():
      if r.get("slow_start_after_idle") is None:
        for c in cluster_rows.link_rate_cells([r], faults.row_links, _alpha):
          q = json.loads(r["key"])["network"]["queue_s"] * 1e3
          rr[r["k"], _cc(r), q, c["network"], c["hosts"], c["algorithm"], c["bytes"]] = c
  for c in cells.values():
    c["measured_s"] = _median(c["runs_s"])
    o = rr.get(
      (c["k"], c["cc"], c["queue_ms"], c["network"], c["hosts"], c["algorithm"], c["bytes"])
    )
    c["rr"] = o["measured_s"] / o["replay_s"] if o and o["replay_s"] else None
  return list(cells.values())


def blocks_tables() -> list[str]:
  """Every algorithm timed in blocks (:func:`slow_alone` ``every``) against the replay, per
  host 1's rate, congestion control and queue: each cell's runs, the within-20 % count per algorithm, and ``auto``
  told the rates against the best measured in the same runs."""
  from allreduce_jax import cluster_rows

  cells = _blocks_cells()
  if not cells:
    return ["(not measured)", ""]
  f = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
  out = []
  group = lambda c: (c["network"], c["hosts"], c["k"], c["cc"], c["queue_ms"])  # noqa: E731
  for net, p, k, cc, q in sorted(
    dict.fromkeys(map(group, cells)),
    key=lambda g: (g[0] != "switch", g[1], g[0], g[2], g[3] or "", -g[4]),  # switches first
  ):
    mine = [c for c in cells if group(c) == (net, p, k, cc, q)]
    hand = [c for c in mine if c["replay_s"] and c["algorithm"] != "psum"]
    per_alg = ", ".join(
      f"{a} {sum(_within_20(c['measured_s'] / c['replay_s']) for c in hand if c['algorithm'] == a)} of"
      f" {sum(c['algorithm'] == a for c in hand)}"
      for a in dict.fromkeys(c["algorithm"] for c in hand)
    )
    n_rr = [c for c in hand if c["rr"] is not None]
    rr_near = f"{sum(_within_20(c['rr']) for c in n_rr)} of {len(n_rr)}" if n_rr else "not measured"
    lines = ["| algorithm | MiB | runs | measured ms (min–max) | replay ms | measured / replay"
             " (min–max over runs) | round-robin / replay |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in sorted(mine, key=lambda c: c["bytes"]):
      ratios = [t / c["replay_s"] for t in c["runs_s"]] if c["replay_s"] else []
      span = f" ({_span(ratios)})" if len(ratios) > 1 else ""
      lines.append(f"| {c['algorithm']} | {c['bytes'] / 2**20:g} | {len(c['runs_s'])} |"
                   f" {_ms([t * 1e6 for t in c['runs_s']])} |"
                   f" {'–' if not c['replay_s'] else format(c['replay_s'] * 1e3, '.0f')} |"
                   f" {f(c['measured_s'] / c['replay_s']) if c['replay_s'] else '–'}{span} |"
                   f" {f(c['rr'])} |")  # fmt: skip
    runs = max(len(c["runs_s"]) for c in mine)
    auto = ["| MiB | auto's pick (the replay with each link's bucket) | its time / best measured"
            " (min–max over runs) | best measured | best / best candidate | pick priced without"
            " buckets / best measured (min–max) |", "|---|---|---|---|---|---|"]  # fmt: skip
    with _traced():
      without = {h["bytes"]: h["pick"] for h in cluster_rows.auto_picks(mine, _alpha)}
      for h in cluster_rows.auto_picks(mine, _alpha, buckets=True):
        same = [c for c in mine if c["bytes"] == h["bytes"]]
        t = {c["algorithm"]: c["measured_s"] for c in same}
        b = without[h["bytes"]]
        each = {h["pick"]: [], b: []}
        for i in range(runs):
          run = {c["algorithm"]: c["runs_s"][i] for c in same if len(c["runs_s"]) > i}
          for a in each:
            if a in run:
              each[a].append(run[a] / min(run.values()))
        auto.append(f"| {h['bytes'] / 2**20:g} | {h['pick']} | {h['pick_s'] / h['best_s']:.2f}"
                    f" ({_span(each[h['pick']])}) | {h['best']} | {h['best_s'] / h['best_candidate_s']:.2f} |"
                    f" {b} {t[b] / h['best_s']:.2f} ({_span(each[b])}) |")  # fmt: skip
    out += [
      f"#### {net}, {p} hosts, host 1 at 1/{k} ({mine[0]['rate'] * 8e-6 / k:g} Mbit/s), queues of {q:g} ms, {f'`{cc}`' if cc else 'no `--congestion-control` (the hosts inherit the machine' + chr(39) + 's)'}", "",
      f"Measured within 20 % of the replay (medians over runs) in"
      f" {sum(_within_20(c['measured_s'] / c['replay_s']) for c in hand)} of {len(hand)} hand-written"
      f" cells; per algorithm: {per_alg}. The same cells in round-robin order:"
      f" {rr_near}.", "",
      *lines, "", "`auto` told the rates (as below), against the same runs:", "", *auto, "",
    ]  # fmt: skip
  return out


def _slow_rows() -> list[dict]:
  """One row per cell (network, hosts, queue, ``tcp_slow_start_after_idle``, algorithm,
  size, slow-link factor k; 1: healthy) over its runs: ``time_us`` their median,
  ``times_us`` each, ``runs``; ``net``: the network, its hosts and its queue (``switch, 4
  hosts, queues of 5 ms``; :func:`_idle_label` for the ``slow-idle`` pairs)."""
  cells: dict[tuple, dict] = {}
  for r in _read("slow_link.jsonl"):
    if r.get("wrong") != 0:
      continue
    network = json.loads(r["key"]).get("network", {})
    k = _k(r)
    idle = r.get("slow_start_after_idle")
    net = (f"{network['network']}, {network['hosts']} hosts, queues of"
           f" {network['queue_s'] * 1e3:g} ms{_idle_label(r)}")  # fmt: skip
    cell = cells.setdefault((r["key"], idle), {**r, "k": k, "net": net, "times_us": []})
    cell["times_us"].append(r["time_us"])
  for c in cells.values():
    c["runs"] = len(c["times_us"])
    c["time_us"] = _median(c["times_us"])
  return list(cells.values())


def _k(row: dict) -> int:
  """Host 1's slow factor k (its link at 1/k; 1: healthy) from a bench row's key."""
  faults = json.loads(row["key"]).get("network", {}).get("faults", [])
  rate = faults[0].split("=")[1].split("@")[0] if faults else None
  return next(k for k, v in SLOW.items() if v == rate)


def _median(xs: list[float]) -> float:
  xs = sorted(xs)
  return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def slow_link_table(net: str) -> str:
  from allreduce_jax import cluster_rows

  rows = [r for r in _slow_rows() if r["net"] == net]
  rate = cluster_rows.link_rate(rows)
  ks = [k for k in SLOW if any(r["k"] == k for r in rows)]
  slow = [k for k in ks if k > 1]
  cols = ["algorithm", "MiB", "runs", *(f"1/{k} ms" for k in ks),
          *(f"1/{k} × healthy" for k in slow), *(f"1/{k} in n·k/B" for k in ks)]  # fmt: skip
  head = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  lines = []
  for alg in dict.fromkeys(r["algorithm"] for r in rows):
    for size in sorted({r["bytes"] for r in rows}):
      c = {r["k"]: r for r in rows if r["algorithm"] == alg and r["bytes"] == size}
      if not c:
        continue
      t = {k: r["time_us"] for k, r in c.items()}
      runs = ", ".join(dict.fromkeys(str(c[k]["runs"]) for k in ks if k in c))
      ms = [_ms(c[k]["times_us"]) if k in c else "–" for k in ks]
      ratio = [f"{t[k] / t[1]:.1f}" if k in t and 1 in t else "–" for k in slow]
      bound = [f"{t[k] / 1e6 / (size * k / rate):.2f}" if k in t else "–" for k in ks]
      lines.append("| " + " | ".join([alg, f"{size / 2**20:g}", runs, *ms, *ratio, *bound]) + " |")
  return "\n".join(head + lines)


def _ms(times_us: list[float]) -> str:
  """The median of runs in ms, and their min–max when more than one."""
  med, lo, hi = (f"{x / 1e3:.0f}" for x in (_median(times_us), min(times_us), max(times_us)))
  return med if len(times_us) == 1 else f"{med} ({lo}–{hi})"


def slow_link_tables() -> list[str]:
  """One section per network and queue measured, the 4-host switch first."""
  nets = list(dict.fromkeys(r["net"] for r in _slow_rows()))
  nets.sort(key=lambda n: not n.startswith("switch, 4 hosts"))
  out = []
  for net in nets:
    out += [f"### {net}", "", slow_link_table(net), ""]
  return out


def tcp_table() -> str:
  """Host 1's sending sockets and the slow link's two queues while the runs went on."""
  rows = _read("slow_link_tcp.jsonl")
  if not rows:
    return "(not measured)"
  p = lambda d, f=".0f": "–" if not d else "/".join(format(d[q], f) for q in ("10", "50", "90"))  # noqa: E731
  lines = ["| hosts | host 1's link | queue | samples | RTT ms (p10/50/90) | cwnd (segments) |"
           " delivery rate Mbit/s | backlog toward host 1, kB (p10/50/90; max) |"
           " backlog from host 1, kB | drops toward / from host 1 |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
  kb = lambda d: {q: v / 1e3 for q, v in d.items()}  # noqa: E731
  for r in rows:
    bl, mx, dr = r["backlog_bytes"], r["backlog_max"], r["drops"]
    queue = r["queue"] + _idle_label(r) + (", in blocks" if "blocks" in r.get("bench", []) else "")
    lines.append(f"| {r['hosts']} | {r['slow']} | {queue} | {r['socket_samples']} |"
                 f" {p(r['rtt_ms'], '.1f')} | {p(r['cwnd'])} | {p(r['delivery_Mbps'], '.1f')} |"
                 f" {p(kb(bl.get('p1', {})))}; {(mx.get('p1') or 0) / 1e3:.0f} |"
                 f" {p(kb(bl.get('eth0', {})))}; {(mx.get('eth0') or 0) / 1e3:.0f} |"
                 f" {dr.get('p1')} / {dr.get('eth0')} |")  # fmt: skip
  return "\n".join(lines)


def _span(xs: list[float], fmt: str = ".2f") -> str:
  """min–max of ``xs`` (one value alone; "–" for none)."""
  lo, hi = (format(min(xs), fmt), format(max(xs), fmt)) if xs else ("–", "–")
  return lo if lo == hi else f"{lo}–{hi}"


def kill_table() -> str:
  """Per algorithm, size and fault kind: runs, how many named host 1 (the right host),
  and the spread of the times after the fault."""
  groups: dict[tuple, list[dict]] = {}
  for r in _read("kill.jsonl"):
    kind = r["fault"].split(":")[0]
    alg = r["algorithm"] + (" (2 devices a host)" if r.get("devices_per_host", 1) > 1 else "")
    key = (kind, r.get("bytes", "4MiB"), " ".join(r.get("options", [])), alg)
    groups.setdefault(key, []).append(r)
  lines = ["| fault | per host | options | algorithm | runs | host 1 named | the launcher named |"
           " at (s after joining) | named after the fault (s) | all stopped after (s) |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
  for (kind, size, opts, alg), rs in groups.items():
    right = [r for r in rs if r["named_rank"] == 1]
    named = [r["named_after_kill_s"] for r in rs if r["named_after_kill_s"] is not None]
    stopped = [r["all_stopped_after_kill_s"] for r in rs if r["named_after_kill_s"] is not None]
    who = _named(f"process {r['named_rank']} {r['named_status']}" for r in rs if r["named_status"])
    ats = ", ".join(f"{float(r['fault'].split('@')[1]):g}" for r in rs)
    lines.append(f"| {kind} | {size} | {opts or '–'} | {alg} | {len(rs)} | {len(right)} | {who} |"
                 f" {ats} | {_span(named)} | {_span(stopped)} |")  # fmt: skip
  return "\n".join(lines)


def link_down_table() -> str:
  """Per algorithm, outage and options: runs, exits, #wrong, and min–max over the runs."""
  groups: dict[tuple, list[dict]] = {}
  for r in _read("link_down.jsonl"):
    groups.setdefault((r["algorithm"], r["down_s"], " ".join(r["options"])), []).append(r)
  if not groups:
    return "(not measured)"
  lines = ["| algorithm | down (s) | options | runs | exit | #wrong | median call (ms) |"
           " slowest call (s) | calls slowed | time lost (s) | next TCP retry (s) |"
           " stopped after the down (s) | the launcher named | the coordinator's log named |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
  for (alg, d, opts), rs in groups.items():
    col = lambda k, rs=rs: [r[k] for r in rs if r.get(k) is not None]  # noqa: E731
    join = lambda xs: ", ".join(dict.fromkeys(str(x) for x in xs)) or "–"  # noqa: E731
    slowest = [x / 1e3 for x in col("slowest_ms")]
    lines.append(f"| {alg} | {d:g} | {opts or '–'} | {len(rs)} | {join(col('returncode'))} |"
                 f" {join(col('wrong'))} | {_span(col('median_ms'), '.0f')} | {_span(slowest)} |"
                 f" {join(col('calls_slowed'))} | {_span(col('extra_s'))} |"
                 f" {next_retry(d):.1f} | {_span(col('named_after_down_s'))} |"
                 f" {_named(r['named'] for r in rs)} | {_named(_unhealthy(r) for r in rs)} |")  # fmt: skip
  return "\n".join(lines)


def _named(names) -> str:
  """The launcher's names ("process 2 was killed by SIGABRT after 12.7 s", ...) as
  "process 2, 3 (was killed by SIGABRT)"."""
  found = [re.match(r"process (\d+) (.*?)(?: after .*)?$", x) for x in names if x]
  ranks = ", ".join(dict.fromkeys(m[1] for m in found if m))
  how = "; ".join(dict.fromkeys(m[2] for m in found if m))
  return f"process {ranks} ({how})" if ranks else "–"


def _unhealthy(row: dict) -> str | None:
  """The task JAX's coordination service reported unhealthy in the hosts' logs."""
  said = " ".join(row.get("logs_say", []))
  m = re.search(r"stopped sending heartbeats\): (\d+)", said)
  return f"process {m[1]} stopped sending heartbeats" if m else None


def recovery_table() -> str:
  rows = _read("recovery.jsonl")
  lines = ["| run | seed | hosts at the end | resumed from step | test acc | parameters sha256 |"
           " killed | named at (s) | restarted at (s) | wall (s) |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
  for r in sorted(rows, key=lambda r: (r.get("seed", 0), r["run"])):
    at = re.search(r"kill:2@([0-9.]+)", " ".join(r["options"]))
    killed = f"host 2, {at[1]} s after joining" if at else "–"
    if r.get("killed_after_step") is not None:
      killed = f"host 2, after step {r['killed_after_step']}'s checkpoint"
    f = lambda v: "–" if v is None else f"{v:.1f}"  # noqa: E731
    lines.append(f"| {r['run']} | {r.get('seed', 0)} | {r['hosts_final']} |"
                 f" {r['resumed_from'] or '–'} |"
                 f" {r['final_test_acc']:.4f} | `{r['params_sha256']}` | {killed} |"
                 f" {f(r['named_after_s'])} | {f(r['restarted_after_s'])} | {r['wall_s']:.1f} |")  # fmt: skip
  return "\n".join(lines)


def _run_label(r: dict, concurrent: bool = False) -> str:
  """The run's name and its faults: ``elastic (kill:2@12)`` (``concurrent``: and
  ``--concurrent`` when the run did not wait for other cluster runs)."""
  faults = [o for o in r["options"] if re.match(r"[a-z]+:\d", o)]
  if r.get("killed_after_step") is not None:
    faults.append(f"kill:2 after step {r['killed_after_step']}")
  if concurrent and "--concurrent" in r["options"]:
    faults.append("--concurrent")
  return f"{r['run']} ({', '.join(faults)})" if faults else r["run"]


def seed_spread(rows: list[dict], key: str, per_seed: bool = True) -> str:
  """Per run (name and faults, in order of appearance; the first the reference): the
  seeds, ``key``'s min–max and mean ± sd over the values (``per_seed``: one a seed, the
  last row of a seed run twice; else every row, and runs with ``--concurrent`` apart:
  times); and how many lie within the first run's min–max."""
  import statistics

  by: dict[str, dict] = {}
  for i, r in enumerate(rows):
    if r.get(key) is not None:
      seed = r.get("seed", 0)
      by.setdefault(_run_label(r, not per_seed), {})[seed if per_seed else i] = (seed, r[key])
  if not by:
    return "(not measured)"
  runs = list(by)
  first = [x for _, x in by[runs[0]].values()]
  lo, hi = min(first), max(first)
  lines = [f"| run | seeds | values | {key} min–max | mean ± sd | within {runs[0]}'s min–max |",
           "|---|---|---|---|---|---|"]  # fmt: skip
  for name in runs:
    seeds = sorted({s for s, _ in by[name].values()})
    v = [x for _, x in by[name].values()]
    sd = statistics.stdev(v) if len(v) > 1 else 0.0
    inside = sum(lo <= x <= hi for x in v)
    lines.append(f"| {name} | {', '.join(map(str, seeds))} | {len(v)} | {_span(v, '.4f')} |"
                 f" {statistics.mean(v):.4f} ± {sd:.4f} | {inside} of {len(v)} |")  # fmt: skip
  return "\n".join(lines)


def torn_table() -> str:
  rows = _read("torn_saves.jsonl")
  if not rows:
    return "(not measured)"
  torn_n = sum(bool(r["torn_folders"]) for r in rows)
  ok = sum(r["restore_complete"] and not r["torn_left_after"] for r in rows)
  return (f"{len(rows)} kills of a saver (16 MiB a checkpoint) at random moments: {torn_n} tore a"
          f" save (a temporary folder left); {ok} of {len(rows)} restores came from a complete"
          " checkpoint, every value its step's, and left no torn folder.")  # fmt: skip


# ------------------------------------------------------------ the replay with the slow link

EMULATED = HERE.parent / "emulated_network" / "rows" / "tcp_queue_16k"


@functools.lru_cache
def _alpha(net: str, p: int) -> float:
  """α per step of a healthy run of ``net`` on ``p`` hosts: ``gloo_model.fit_alpha`` on the
  emulated network study's 4 and 64 KiB rows (timed in blocks at the same 16 KiB TCP
  queue); the switch's of ``p`` hosts where that study has no such network; 0 if neither
  (:func:`allreduce_jax.cluster_rows.healthy_alpha`)."""
  from allreduce_jax import cluster_rows

  return cluster_rows.healthy_alpha(EMULATED, net, p)


def _link_label(c: dict) -> str:
  return ", ".join(f"h{h} {v * 8 / 1e6:g} Mbit/s" for h, v in c["link_rates"].items()) or "healthy"


def _idle_label(row: dict) -> str:
  """``, tcp_slow_start_after_idle 1`` (or 0) for the ``slow-idle`` pairs' rows, and the
  congestion control where one was asked for (``, cubic``), else nothing."""
  cc = _cc(row)
  idle = row.get("slow_start_after_idle")
  return (f", tcp_slow_start_after_idle {idle}" if idle is not None else "") + (
    f", {cc}" if cc else ""
  )


def _cc(row: dict) -> str | None:
  """The congestion control a row's run asked for (``cluster --congestion-control``), or
  None: the hosts inherited the default of the machine running the study."""
  return (
    json.loads(row["key"])["network"].get("congestion_control") if "key" in row else row.get("cc")
  )


def _queue_order(c: dict) -> tuple:
  """The deeper queue first, then the study's runs before the ``slow-idle`` pairs (knob on,
  then off)."""
  return -c["queue_ms"], c["idle"] is not None, c["queue"].count(","), -(c["idle"] or 0)


def replay_tables() -> list[str]:
  """Every slow-link cell (the median of its runs) against the replay with that link's rate
  (half duplex, α of a healthy run) and the cut bound, then ``auto`` told the rates against
  the best measured, per queue."""
  from allreduce_jax import cluster_rows
  from allreduce_jax.tools import faults

  rows = _slow_rows()
  cells = []
  with _traced():
    for row in rows:
      for c in cluster_rows.link_rate_cells([row], faults.row_links, _alpha):
        queue = json.loads(row["key"])["network"]["queue_s"] * 1e3
        cells.append({**c, "queue_ms": queue, "queue": f"{queue:g}{_idle_label(row)}",
                      "idle": row.get("slow_start_after_idle"),
                      "times_s": [t / 1e6 for t in row["times_us"]]})  # fmt: skip
    queues = list(dict.fromkeys(c["queue"] for c in sorted(cells, key=_queue_order)))
    picks = {(q, d): cluster_rows.auto_picks([c for c in cells if c["queue"] == q], _alpha, d)
             for q in queues for d in ("half", "full")}  # fmt: skip
  f = lambda v: "–" if v is None else f"{v * 1e3:.0f}"  # noqa: E731
  r = lambda a, b: "–" if b is None else f"{a / b:.2f}"  # noqa: E731
  lines = ["| network | queue ms | slow link | algorithm | MiB | runs | measured ms (min–max) |"
           " replay ms | measured / replay | bound ms | measured / bound |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
  order = lambda c: (c["network"], c["hosts"], *_queue_order(c), c["bytes"],  # noqa: E731
                     -min(c["link_rates"].values(), default=float("inf")))  # fmt: skip
  for c in sorted(cells, key=order):
    lines.append(f"| {c['network']}, {c['hosts']} hosts | {c['queue']} | {_link_label(c)} |"
                 f" {c['algorithm']} | {c['bytes'] / 2**20:g} | {len(c['times_s'])} |"
                 f" {_ms([t * 1e6 for t in c['times_s']])} | {f(c['replay_s'])} |"
                 f" {r(c['measured_s'], c['replay_s'])} | {f(c['bound_s'])} |"
                 f" {r(c['measured_s'], c['bound_s'])} |")  # fmt: skip
  near = lambda cs: sum(_within_20(c["measured_s"] / c["replay_s"]) for c in cs)  # noqa: E731
  summary = []
  for net, p, q in dict.fromkeys((c["network"], c["hosts"], c["queue"]) for c in cells):
    mine = [c for c in cells if c["replay_s"] and c["algorithm"] != "psum" and c["bytes"] >= 2**20
            and (c["network"], c["hosts"], c["queue"]) == (net, p, q)]  # fmt: skip
    slow = [c for c in mine if c["link_rates"]]
    per_alg = ", ".join(
      f"{a} {near([c for c in slow if c['algorithm'] == a])} of"
      f" {sum(c['algorithm'] == a for c in slow)}"
      for a in dict.fromkeys(c["algorithm"] for c in slow)
    )
    if not mine:
      continue
    head, _, tail = q.partition(",")
    summary += [f"{net}, {p} hosts, queues of {head} ms{tail and ',' + tail}: measured within"
                f" 20 % of the replay in {near(mine)} of"
                f" {len(mine)} hand-written cells (healthy {near(mine) - near(slow)} of"
                f" {len(mine) - len(slow)}, with the slow link {near(slow)} of {len(slow)});"
                f" with the slow link, per algorithm: {per_alg or '–'}.", ""]  # fmt: skip
  alphas = ", ".join(f"{n}, {p} hosts {_alpha(n, p) * 1e3:.2f} ms"
                     for n, p in dict.fromkeys((c["network"], c["hosts"]) for c in cells))  # fmt: skip
  auto = ["| network | queue ms | slow link | MiB | auto's pick (half-duplex replay) | its time"
          " / best measured | best measured | best / best candidate | pick of the full-duplex"
          " replay / best |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
  for q in queues:
    for h, full in zip(picks[q, "half"], picks[q, "full"], strict=True):
      auto.append(f"| {h['network']}, {h['hosts']} hosts | {q} | {_link_label(h)} |"
                  f" {h['bytes'] / 2**20:g} | {h['pick']} | {h['pick_s'] / h['best_s']:.2f} |"
                  f" {h['best']} | {h['best_s'] / h['best_candidate_s']:.2f} | {full['pick']}"
                  f" {full['pick_s'] / full['best_s']:.2f} |")  # fmt: skip
  return [
    "## The replay with the slow link, and the bound any exact algorithm meets", "",
    "Replay: `gloo_model.emulated_seconds(..., link_rates={host: bytes/s})`, the algorithm's"
    " schedule as XLA:CPU runs it over gloo (one ppermute at a time, an exchange's two"
    " directions in turn) on the network with the host's links at the fault's rate both ways"
    " (a link between two hosts at its slower end's),"
    f" β from each link's payload rate, α per step of a healthy run ({alphas}; the emulated"
    " network study's 4 and 64 KiB rows of that network, else of the switch with as many"
    " hosts), no token bucket. `psum` is replayed as a ring"
    " (its record's model). Bound: `gloo_model.cut_bound_seconds`, T ≥ max_h n / (c_h · s):"
    " every other host's result needs host h's n bytes and h's result the others' sum, so n"
    " bytes cross h's links each way (c_h: their rate together, one link on a switch or a"
    " fat tree, two on a ring of links; s = 0.956, the payload share at a 1500-byte MTU);"
    " on a switch the ring moves 2(p−1)/p·n through the slow link (1.5× at p = 4).", "",
    "Measured: the median of the cell's runs (each the median of 3 calls of the slowest"
    " process).", "",
    *summary,
    *lines, "",
    "### The ring alone, host 1 at 1/10", "",
    "`faults.py slow-alone`: 6 calls of the ring back to back (bench `--order blocks`: no"
    " other algorithm's calls between them), 4 MiB per host, 4-host switch.", "",
    alone_table(), "",
    "### Every algorithm alone, host 1 slowed", "",
    "`faults.py slow-alone every RUNS [CC] [--slow K] [--net NET]`: every algorithm in blocks (bench"
    " `--order blocks`: each algorithm's 3 calls back to back, after its warm-up), 1 and 4 MiB"
    " per host (1 MiB only at 1/100) on the 4-host switch, 1 MiB with `--net switch-8|fat-tree|torus`"
    " (8 hosts of a switch, fat_tree:2:1, torus:4 with both of host 1's links slowed), host 1's link at 1/K; a run the median of 3 calls of the slowest process, a cell the median of its runs"
    " (min–max over them), taken beside other work on the same CPU. Replay: as above, with"
    " each link's token bucket as the cluster shapes it (`emulated_seconds(..., buckets=True)`,"
    " `gloo_model.link_buckets`: 4 ms of a link's rate but at least 64 KiB, so the slow link's"
    " holds 26 ms at 20 Mbit/s, 5.2 ms at 100 Mbit/s, 262 ms at 2 Mbit/s, and passes that much"
    " at once after each pause; a healthy link's 4 ms). Round-robin / replay: the"
    " same cell of the round-robin runs above (same network, rate, congestion control and queue), whose calls"
    " each start with the skew between the processes that the call before left"
    " ([replay_trace.md](replay_trace.md)). `auto` as in the section below, its candidates"
    " priced by this replay, each link's bucket included (`cluster_rows.auto_picks(...,"
    " buckets=True)`); beside it what it picks priced without the buckets.", "",
    *blocks_tables(),
    "### Host 1's TCP and the slow link's queues during the slow-link runs", "",
    "Sampled every 0.25 s in host 1's namespace while a run went on (its algorithms and sizes;"
    " host 1's link: the column): `ss -tin` of its sockets with data unacknowledged or waiting (smoothed RTT,"
    " cwnd, delivery rate) and `tc -s qdisc` of the slow link's two ends (the switch's port"
    " toward host 1 and host 1's `eth0`); one row a run.", "",
    tcp_table(), "",
    "### `auto` told the link rates", "",
    "`cost_model.use_topology(topology.with_link_rates(topology.switch(1), {1: 0.1}),"
    ' duplex="half")` around the tracing: `choose` among the measured candidates of `auto`,'
    " priced by the replay above; beside it the pick of the replay at full duplex (the"
    " topology replay's own assumption). Best measured includes `psum`.", "",
    *auto, "",
  ]  # fmt: skip


def tables() -> dict[str, str]:
  """``{"tables.md": text}`` from the committed rows."""
  parts = ["# Faults: tables (generated by faults.py from rows/)", "",
           "## One slow link (host 1 at 1/k of 200 Mbit/s)", "",
           "Queues: each link's `tbf` queue (`cluster --queue`), 100 ms the cluster's default"
           " (the study's setting); 5 ms to test whether the queue is what the rings pay."
           " `tcp_slow_start_after_idle 1` and `0`: the `slow-idle` pairs (6 algorithms, 1/10,"
           " their order alternating), Linux's restart of an idle connection's window on (its"
           " default) and off in every host, to test whether that restart is what they pay.", "",
           "Each run: the median of 3 calls of the slowest process (bench -a 3); a cell: the"
           " median of its runs (min–max over them), taken beside other work on the same CPU"
           " (runs: how many; 1 for the 1/100, fat-tree and ring-of-links cells); n·k/B:"
           " the time for n bytes through the slow link (the exact-algorithm bound is ≈ 1,"
           " the ring ≈ 1.5, the parameter server ≈ 2 at k = 10). fat_tree:2:1: two leaves"
           " of 2 hosts; torus:4: a ring of 4 links, host 1's two links slowed.", "",
           *slow_link_tables(),
           "## The slow host as the parameter server's root (host 0 at 1/10, in blocks)", "",
           "The parameter server (`naive`) gathers at participant 0 and sends the sum back from"
           " it: with host 0's link slowed every one of its 2(p − 1) messages crosses the slow"
           " link (arithmetic: 2(p − 1) = 6 n·k/B at p = 4, against 2.4 with the slow host a"
           " leaf); the ring's steps do not depend on where the slow link is (1.5 n·k/B). The"
           " leaf columns are the *Every algorithm in blocks* cells (host 1 at 1/10).", "",
           slow_root_table(), "",
           *replay_tables(),
           "## A link down mid-collective (host 1, 1 MiB per host, 4 hosts on a switch)", "",
           "Every call's time (bench -I, process 0); a call slowed: over 3× the median; time"
           " lost: the slowed calls' time beyond the median; next TCP retry: the first"
           " retransmission at or after the outage (200 ms doubling: 0.2, 0.6, 1.4, 3, 6.2 s"
           " after the loss).", "", link_down_table(), "",
           "## A host killed or stopped mid-collective (4 hosts on a switch)", "",
           "Host 1 SIGKILLed or SIGSTOPped T s after the hosts joined, during back-to-back"
           " calls (1 MiB: they start 2 s or more after joining); times: min–max over the runs"
           " (the launcher prints its time to 0.1 s).", "", kill_table(), "",
           "## train sync on 4 hosts, a host killed mid-run", "", recovery_table(), "",
           "Final test accuracy over the seeds (one run per seed; each run's own seed for"
           " initialization and data order):", "",
           seed_spread(_read("recovery.jsonl"), "final_test_acc"), "",
           "## A kill during checkpoint saves", "", torn_table(), "",
           "## A slowed host kept in the job or isolated (train sync, 600 steps)", "",
           "Host 1's process held to 1/4 of a core (cpu:1=0.25@0); time to 95 %: steps to 95 %"
           " × the training loop's seconds a step (compile and evaluations included).", "",
           slow_host_table(), "", "Over the seeds (accuracy: the last run of each seed; time"
           " to 95 %: every run):", "",
           seed_spread(_read("slow_host.jsonl"), "final_test_acc"), "",
           seed_spread(_read("slow_host.jsonl"), "time_to_target_s", per_seed=False), ""]  # fmt: skip
  return {"tables.md": "\n".join(parts)}


def figure(path: Path):
  """Each algorithm timed in blocks (as the answer's numbers) on the 4-host switch, 1 MiB per
  host, host 1's link at 1/2, 1/10 and 1/100: its time in units of the bound n·k/B (the
  median of its runs, a bar from the fastest to the slowest), one marker per slowdown."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from allreduce_jax import cluster_rows

  n = 2**20
  rows = [r for r in _read("slow_link_alone.jsonl") if r.get("wrong") == 0 and r["iters"] != 6
          and r["bytes"] == n and not _cc(r)
          and json.loads(r["key"])["network"]["network"] == "switch"
          and json.loads(r["key"])["network"]["hosts"] == 4]  # fmt: skip
  rate = cluster_rows.link_rate(rows)
  runs: dict[tuple[str, int], list[float]] = {}
  for r in rows:
    k = _k(r)
    runs.setdefault((r["algorithm"], k), []).append(r["time_us"] * 1e-6 / (n * k / rate))
  ks = sorted({k for _, k in runs})
  by = max(ks[:-1] or ks)  # the order: by the time at 1/10
  algs = sorted({a for a, _ in runs}, key=lambda a: _median(runs.get((a, by), [float("inf")])))
  looks = {2: ("o", "#1f77b4"), 10: ("s", "#d62728"), 100: ("^", "#2ca02c")}
  fig, ax = plt.subplots(figsize=(6.4, 4.6))
  for j, k in enumerate(ks):
    marker, color = looks.get(k, ("D", "#7f7f7f"))
    ys = [i + (j - (len(ks) - 1) / 2) * 0.22 for i, a in enumerate(algs) if (a, k) in runs]
    got = [runs[a, k] for a in algs if (a, k) in runs]
    mid = [_median(v) for v in got]
    err = [[m - min(v) for m, v in zip(mid, got)], [max(v) - m for m, v in zip(mid, got)]]
    counts = sorted({len(v) for v in got})
    ax.errorbar(mid, ys, xerr=err, fmt=marker, color=color, markersize=5, capsize=2,
                linewidth=1, label=f"link at 1/{k} ({'–'.join(map(str, counts))} run"
                f"{'s' if counts[-1] > 1 else ''} each)")  # fmt: skip
  ax.axvline(1.0, color="black", linestyle="--", linewidth=1, label="bound n·k/B")
  ax.set_yticks(range(len(algs)), algs, fontsize=8)
  ax.invert_yaxis()
  ax.set_xlabel("all-reduce time / (n·k/B): n = 1 MiB through the slow link at B/k")
  ax.set_xlim(left=0)
  ax.grid(axis="x", alpha=0.3)
  ax.set_title("One slow link, 4 hosts on a 200 Mbit/s switch, each algorithm in blocks",
               fontsize=10)  # fmt: skip
  ax.legend(fontsize=7, loc="lower left", framealpha=1)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  return fig


def _names(args: list[str]) -> list[str]:
  """``ring,psum`` (a comma list) -> ["ring", "psum"]; none: []."""
  return [a for x in args for a in x.split(",") if a]


def _take(argv: list[str], flag: str) -> tuple[list[str], list[float] | None]:
  """``argv`` without ``flag VALUE``, and VALUE's comma list as numbers (None: no flag)."""
  if flag not in argv:
    return argv, None
  i = argv.index(flag)
  try:
    return argv[:i] + argv[i + 2 :], [float(x) for x in argv[i + 1].split(",") if x]
  except (IndexError, ValueError):
    raise SystemExit(
      f"faults.py: {flag} expects a comma list of numbers, e.g. {flag} 1,2,3."
    ) from None


def _take_word(argv: list[str], flag: str, default: str) -> tuple[list[str], str]:
  """``argv`` without ``flag VALUE``, and VALUE (``default``: no flag)."""
  if flag not in argv:
    return argv, default
  i = argv.index(flag)
  if i + 1 == len(argv):
    raise SystemExit(f"faults.py: {flag} expects a value, e.g. {flag} {default}.")
  return argv[:i] + argv[i + 2 :], argv[i + 1]


def _cc_args(args: list[str]) -> tuple[int, str, str]:
  """``slow-cc RUNS CC [ALGORITHMS]`` -> (runs, cc, algorithms; "" for the default)."""
  if len(args) < 2 or not args[0].isdigit() or int(args[0]) < 1:
    raise SystemExit(
      "faults.py slow-cc expects RUNS (a positive whole number) and a congestion control,"
      f" e.g. slow-cc 3 cubic [ring,tree], got {' '.join(args) or 'nothing'}."
    )
  from allreduce_jax import registry

  names = _names(args[2:])
  unknown = [a for a in names if a not in registry.ALGORITHMS]
  if unknown:
    raise SystemExit(
      f"faults.py slow-cc: ALGORITHMS expects registered algorithms"
      f" ({', '.join(every_algorithm().split(','))}...), got {', '.join(unknown)}."
    )
  return int(args[0]), args[1], ",".join(names)


def _alone_args(args: list[str]) -> tuple[bool, int, str | None]:
  """``slow-alone`` or ``slow-alone every [RUNS] [CC]`` -> (every, runs, cc; None: the
  machine's)."""
  every, runs, cc = args[:1] == ["every"], args[1:2], args[2:3]
  if (args and not every) or len(args) > 3 or (runs and not (runs[0].isdigit() and int(runs[0]))):
    raise SystemExit(
      "faults.py slow-alone expects nothing, or every [RUNS] [CC] (RUNS a positive whole"
      f" number), e.g. slow-alone every 3 reno, got {' '.join(args)}."
    )
  if cc:
    from allreduce_jax import netns

    problem = netns.congestion_control_problem(cc[0])
    if problem:
      raise SystemExit(f"faults.py slow-alone: {problem}")
  return every, int(runs[0]) if runs else 1, cc[0] if cc else None


def main(argv: list[str]) -> None:
  argv, seeds = _take(argv, "--seeds")
  argv, durations = _take(argv, "--for")
  argv, runs = _take(argv, "--runs")
  argv, kill_at = _take(argv, "--kill-at")
  argv, kill_after = _take(argv, "--kill-after-step")
  argv, slow = _take(argv, "--slow")
  argv, net = _take_word(argv, "--net", "switch")
  extra = [a for a in argv if a == "--concurrent"]  # cluster --concurrent: do not wait
  argv = [a for a in argv if a != "--concurrent"]
  seeds = [int(x) for x in seeds or [0]]
  what = argv[0] if argv else "tables"
  steps = {
    "slow-link": lambda: slow_link(int(argv[1]) if argv[1:] else 3),
    "slow-queue": lambda: slow_queue(
      int(argv[1]) if argv[1:] else 2,
      every_algorithm() if argv[2:] == ["every"] else QUEUE_ALGORITHMS,
    ),
    "slow-alone": lambda: slow_alone(*_alone_args(argv[1:]), tuple(slow or [10]), net),
    "slow-idle": lambda: slow_idle(int(argv[1]) if argv[1:] else 3, argv[2] if argv[2:] else None),
    "slow-cc": lambda: slow_cc(*_cc_args(argv[1:]), tuple(slow or [10])),
    "kill": lambda: kill(_names(argv[1:])),
    "stop": lambda: kill(_names(argv[1:]), "stop", (4.5,) * 3, ("--heartbeat-timeout", "5")),
    "down": lambda: down(
      _names(argv[1:]),
      not argv[1:] and not durations,
      tuple(durations or DOWN_S),
      int(runs[0]) if runs else 1,
      extra,
    ),
    "give-up": give_up,
    "slow-cases": lambda: slow_cases(argv[1:]),
    "recovery": lambda: recovery(
      argv[1:],
      seeds,
      kill_at[0] if kill_at else 12.0,
      int(kill_after[0]) if kill_after else None,
      extra,
    ),
    "slow-host": lambda: slow_host(argv[1:], seeds, extra),
    "slow-root": lambda: slow_root(int(argv[1]) if argv[1:] else 3),
    "torn": torn,
  }
  if what in steps:
    steps[what]()
  elif what == "tables":
    for name, text in tables().items():
      (HERE / name).write_text(text)
    figure(HERE / "slow_link.png")
  else:
    raise SystemExit(f"faults.py: expected one of {', '.join([*steps, 'tables'])}, got {what!r}.")


if __name__ == "__main__":
  main(sys.argv[1:])
