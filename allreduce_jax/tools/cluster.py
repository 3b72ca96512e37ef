"""``allreduce-jax cluster``: run a subcommand on an emulated cluster of hosts on this machine.

    allreduce-jax cluster --hosts 4 [--topology switch] [--link 200Mbit] [--queue 100ms] \\
        [--mtu 1500] [--tcp-queue 16KiB] [--congestion-control cubic] [--devices-per-host 1] \\
        [--rootless] [--timeout S] [--log-dir DIR] [--counters FILE] -- bench ...
    allreduce-jax cluster down        # remove what killed runs left (down --all: every cluster)

Builds N hosts, each a network namespace with its own address and host name, joined
by the network ``--topology`` names (the specs ``scaling --topology`` reads:
``switch``, ``fat_tree:K:R``, ``torus:AxB``) whose links are shaped to ``--link``
in each direction (:mod:`allreduce_jax.netns`; ``--queue``: each link's queue as time
at its rate, ``--mtu``: its frames, ``--tcp-queue``: what one TCP socket may keep queued
in its host, :data:`~allreduce_jax.netns.DEFAULT_TCP_QUEUE`; ``--congestion-control``:
the hosts' TCP congestion control, else the machine's default, which the banner names),
then runs the command after ``--`` once per host, all joined into one
``jax.distributed`` runtime (gloo over the emulated links; the coordinator on host 0),
with ``$ALLREDUCE_JAX_NETWORK`` describing the network (rows measured there carry it in
their key). The command is an ``allreduce-jax`` subcommand or any program that calls
:func:`allreduce_jax.distributed.initialize_from_env`.

The processes are supervised by ``allreduce-jax launch``'s code
(:func:`allreduce_jax.tools.launch.launch`): a host that fails or is killed is named
within a poll (50 ms) and the others stopped, ``--timeout`` names a stuck one, every
host writes ``DIR/process-R.log``. Namespaces, links and host files are removed after
a success, a failure or Ctrl-C; if this command is killed (even by SIGKILL) a
watchdog process removes them, and the next ``cluster`` run (or ``cluster down``)
removes what a dead run left (``down --all``: every cluster, running or not).
``--counters FILE`` writes each host's interface byte
counters (sent, received) over the run as JSON.

``--fault SPEC`` (repeatable) injects a fault T seconds after the hosts joined:
``kill:H@T``, ``stop:H@T``, ``spin:H@T``, ``link:H=RATE@T``, ``down:H@T+D``,
``cpu:H=FRACTION@T``
(:mod:`allreduce_jax.tools.faults`); each is printed with its time and written to
``DIR/faults.jsonl``, and rows measured there name the faults in their network.
``--restarts N`` starts the job again after a failure, ``--elastic`` on the surviving
hosts (:func:`allreduce_jax.tools.launch.launch_restarting`); the faults then apply to
whatever process runs on their host at their time, and a host whose links went down for
good is replaced (its links up again) when a restart puts it back in the job.

One cluster runs at a time on a machine: every host process shares this machine's
CPUs, so two clusters measuring at once distort each other's timings. A second
``cluster`` waits for the first (saying so) unless ``--concurrent`` is given (or
``ALLREDUCE_JAX_CLUSTER_CONCURRENT=1``, which the test suite sets: its clusters check
plumbing, not time).

Root builds the namespaces on the machine (``ip netns list`` shows them). Without root
the cluster is built in a user namespace of the user's own (rootless; ``--rootless`` asks
for it as root too), where the kernel allows unprivileged user namespaces (most
distributions do): the same hosts, links and shaping, invisible outside, and removed by
the kernel with the run's last process (no watchdog or ``down`` needed). Where neither
is possible, one line says what is needed.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from allreduce_jax import distributed, netns, progress, units
from allreduce_jax.tools import engines
from allreduce_jax.tools import faults as fault_lib
from allreduce_jax.tools import launch as launcher
from allreduce_jax.tools._args import output_dir, output_path

#: The coordinator's port on host 0 (its namespace is fresh, so the port is free).
PORT = 29500

#: The machine-wide lock that keeps two clusters from timing each other's CPU use.
LOCK = Path("/run/lock/allreduce-jax-cluster.lock")
ENV_CONCURRENT = "ALLREDUCE_JAX_CLUSTER_CONCURRENT"


@contextlib.contextmanager
def _one_at_a_time(concurrent: bool, err):
  """Holds :data:`LOCK` for the run (waits, saying so, while another cluster holds it)."""
  if concurrent:
    yield
    return
  with _open_lock() as f:
    writable = f.writable()
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      f.seek(0)
      holder = f.read().strip() or "?"
      print(
        f"# cluster: waiting for another cluster run (pid {holder}) to finish: clusters on one"
        " machine share its CPUs and distort each other's timings (--concurrent: do not wait)",
        file=err,
        flush=True,
      )
      fcntl.flock(f, fcntl.LOCK_EX)
    if writable:
      f.truncate(0)
      f.write(str(os.getpid()))
      f.flush()
    try:
      yield
    finally:
      if writable:
        f.truncate(0)
      fcntl.flock(f, fcntl.LOCK_UN)


def _open_lock():
  """:data:`LOCK`, made writable by every user (root's and rootless clusters share
  the machine's CPUs alike); read-only where another user made it without that (a
  read-only file locks all the same, it just cannot name the holder)."""
  LOCK.parent.mkdir(parents=True, exist_ok=True)
  try:
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
  except PermissionError:
    return open(LOCK)
  with contextlib.suppress(OSError):
    os.fchmod(fd, 0o666)  # past the umask; only the file's owner may
  return os.fdopen(fd, "a+")


# The namespace watchdog: its own session (Ctrl-C does not reach it); when its stdin
# reaches EOF without "done" (the cluster command died, even by SIGKILL) it deletes
# the cluster's namespaces and host files, and the cgroups of its cpu: faults (as
# faults.remove_cgroups does: processes moved to the parent, the root's cpu controller
# disabled again where the run enabled it). Standalone: it imports nothing of ours.
_WATCHDOG = """
import os, shutil, subprocess, sys, time
tag = sys.argv[1] + "-"
cgroup, notes = sys.argv[2], sys.argv[3]
for line in sys.stdin:
  if line.strip() == "done":
    sys.exit(0)
for n in sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else []:
  if n.startswith(tag):
    subprocess.run(["ip", "netns", "del", n], capture_output=True)
if os.path.isdir("/etc/netns"):
  for n in os.listdir("/etc/netns"):
    if n.startswith(tag):
      shutil.rmtree(os.path.join("/etc/netns", n), ignore_errors=True)
for root in (cgroup, os.path.join(cgroup, "cpu")):
  for n in sorted(os.listdir(root)) if os.path.isdir(root) else []:
    group = os.path.join(root, n)
    for _ in range(50 if n.startswith(tag) and os.path.isdir(group) else 0):
      try:
        for pid in open(os.path.join(group, "cgroup.procs")).read().split():
          with open(os.path.join(root, "cgroup.procs"), "w") as f:
            f.write(pid)
      except OSError:
        pass
      try:
        os.rmdir(group)
        break
      except FileNotFoundError:
        break
      except OSError:
        time.sleep(0.1)
note = os.path.join(notes, tag[:-1])
if os.path.exists(note):
  try:
    with open(os.path.join(cgroup, "cgroup.subtree_control"), "w") as f:
      f.write("-cpu")
  except OSError:
    pass
  os.remove(note)
"""


def _watchdog(tag: str) -> subprocess.Popen | None:
  try:
    return subprocess.Popen(
      [sys.executable, "-c", _WATCHDOG, tag, str(fault_lib.CGROUP), str(fault_lib.CPU_NOTES)],
      stdin=subprocess.PIPE,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
      start_new_session=True,
    )
  except OSError:  # pragma: no cover - the next run's clean-up still covers it
    return None


def _release(watchdog: subprocess.Popen | None) -> None:
  if watchdog is None:
    return
  with contextlib.suppress(OSError, ValueError, subprocess.TimeoutExpired):
    watchdog.stdin.write(b"done\n")
    watchdog.stdin.close()
    watchdog.wait(5)


@dataclass(frozen=True)
class Job:
  """What runs on a built cluster: ``command`` on each of ``hosts`` hosts, started by
  ``engine`` with ``devices_per_host`` devices each, data moved by ``collectives``, the
  ``faults`` applied and the processes supervised as ``options`` say (builtin engine);
  each host's interface counters over the run written to ``counters_path``."""

  command: list[str]
  hosts: int
  devices_per_host: int = 1
  engine: str = "builtin"
  collectives: str = "gloo"
  faults: tuple[fault_lib.Fault, ...] = ()
  options: launcher.Options = field(default_factory=launcher.Options)
  counters_path: str | None = None


def cluster(
  command: list[str],
  hosts: int,
  *,
  network: str = "switch",
  link: str = "200Mbit",
  queue: str = "100ms",
  mtu: int = 1500,
  tcp_queue: str = units.format_bytes(netns.DEFAULT_TCP_QUEUE, sep=""),
  congestion_control: str | None = None,
  devices_per_host: int = 1,
  counters_path: str | None = None,
  concurrent: bool = False,
  rootless: bool | None = None,
  engine: str = "builtin",
  collectives: str = "gloo",
  faults: Sequence[fault_lib.Fault | str] = (),
  options: launcher.Options | None = None,
  err=None,
) -> int:
  """Builds the cluster, runs ``command`` on every host (:func:`launch.launch_restarting`
  with ``options``, None: the defaults; the ``faults`` applied: :class:`~allreduce_jax.tools.faults.Fault`
  or their specs), removes the cluster; waits first while another cluster runs unless
  ``concurrent``. ``rootless``: build it in a user namespace of this user's own
  (:class:`~allreduce_jax.netns.UserNamespace`) rather than as root on the machine;
  None: as root where this process can, else rootless. ``engine``: who starts the hosts'
  processes, ``builtin`` (:func:`launch.run_attempt`), ``mpirun`` or ``slurm``
  (:mod:`allreduce_jax.tools.engines`). Returns the launcher's status; raises
  ``ValueError`` (bad option, one line naming it), ``netns.ClusterError`` (no
  privilege, a failed build) or ``launch.LaunchError``."""
  err = err or sys.stderr
  if devices_per_host < 1:
    raise ValueError(f"--devices-per-host must be at least 1, got {devices_per_host}.")
  if engine not in engines.LAUNCHERS:
    raise ValueError(f"--launcher must be one of {', '.join(engines.LAUNCHERS)}, got {engine!r}.")
  if collectives == "mpi" and engine != "mpirun":
    raise ValueError(
      f"--collectives mpi needs the hosts' processes to be MPI ranks: --launcher mpirun, got"
      f" --launcher {engine}."
    )
  distributed.check_collectives(collectives, devices_per_host, "--devices-per-host")
  rate = units.parse_rate(link, "--link")
  fault_lib.check_link_rate(rate, link)
  plan = netns.plan(
    network,
    hosts,
    rate,
    queue=units.parse_duration(queue, "--queue"),
    mtu=mtu,
    tcp_queue=units.parse_size(tcp_queue, "--tcp-queue"),
    congestion_control=congestion_control,
  )
  launcher.command_argv(list(command))  # a missing command: before anything is built
  parsed = tuple(f if isinstance(f, fault_lib.Fault) else fault_lib.parse(f, hosts) for f in faults)
  job = Job(list(command), hosts, devices_per_host, engine, collectives, parsed,
            options or launcher.Options(), counters_path)  # fmt: skip
  rootless, problem = netns.choose(rootless)
  problem = problem or netns.congestion_control_problem(congestion_control)
  problem = problem or engines.problem(engine, rootless)
  if problem:
    raise netns.ClusterError(problem)
  with _one_at_a_time(concurrent, err):
    return _run(job, plan, rootless, err)


def _run(job: Job, plan: netns.Plan, rootless: bool, err) -> int:
  watchdog = None
  if not rootless:  # rootless, the kernel removes it all with its last process
    stale = netns.clean_stale()
    stale += [t for t in fault_lib.stale_cgroup_tags() if fault_lib.remove_cgroups(f"{t}-")]
    if stale:
      print(f"# cluster: removed what dead runs left ({', '.join(stale)})", file=err, flush=True)
    watchdog = _watchdog(plan.tag)
  try:
    with netns.built(plan, rootless) as plan:
      return _hosts(job, plan, err)
  finally:
    _release(watchdog)
    left = netns.leftovers(plan.tag)
    if left:  # pragma: no cover - down() removes all it made
      print(f"# cluster: could not remove {', '.join(left)}", file=err, flush=True)


def _hosts(job: Job, plan: netns.Plan, err) -> int:
  """Runs the job on every host of the built ``plan``; the launcher's status."""
  rate = plan.rate
  print(
    f"# cluster: {job.hosts} host(s) on {plan.network}, every link {units.tc_rate(rate)}"
    f" each way ({rate / 1e6:.3g} MB/s, queues of {plan.queue * 1e3:g} ms, MTU {plan.mtu},"
    f" at most {units.format_bytes(plan.tcp_queue)} queued per TCP socket, TCP congestion"
    f" control {plan.congestion_control or netns.default_congestion_control() or 'unknown'}"
    f"{'' if plan.congestion_control else ' (the machine default)'}),"
    f" addresses {plan.addresses[0]}..{plan.addresses[-1]},"
    f" namespaces {plan.tag}-*"
    + (f" in a user namespace of uid {os.getuid()} (rootless)" if plan.enter else ""),
    file=err,
    flush=True,
  )
  before = netns.counters(plan)
  if job.engine != "builtin":
    rc = engines.run(job.engine, plan, job.command, job.devices_per_host, job.options.timeout,
                     err, job.collectives)  # fmt: skip
  else:
    rc = _launch_builtin(job, plan, err)
  if job.counters_path:
    after = netns.counters(plan)
    rows = [
      {**a, "tx_bytes": a["tx_bytes"] - b["tx_bytes"], "rx_bytes": a["rx_bytes"] - b["rx_bytes"]}
      for a, b in zip(after, before)
    ]
    Path(job.counters_path).write_text(
      json.dumps({"network": plan.network, "rate": rate, "hosts": rows}, indent=1) + "\n"
    )
  return rc


def _launch_builtin(job: Job, plan: netns.Plan, err) -> int:
  """The hosts' processes under :func:`launch.launch_restarting`: ``--restarts`` starts
  them again after a failure (``--elastic``: on the surviving hosts, the coordinator on
  the first of them), the job's faults are applied during the first attempt and named in
  the network description every host's rows carry (built once)."""
  faults = job.faults
  injector = (
    fault_lib.Injector(plan, list(faults), PORT, err, job.options.log_dir) if faults else None
  )
  described = {**plan.describe(), **({"faults": [f.spec for f in faults]} if faults else {})}
  spin = {progress.ENV_FAULT_SPIN: "1"} if any(f.kind == "spin" for f in faults) else {}

  def place(alive: list[int], attempt: int) -> launcher.Place:
    if injector is not None:  # a host whose links went down for good is replaced
      injector.repair(alive)
    return launcher.Place(
      local_devices=job.devices_per_host,
      coordinator=f"{plan.addresses[alive[0]]}:{PORT + attempt}",
      host_argv=lambda rank: netns.host_argv(plan, alive[rank], described),
      extra_env=spin,
      on_start=(lambda pids, t0: injector.start(pids, t0, alive)) if injector else None,
      explain=lambda rank: link_down(plan, alive[rank]),
    )

  try:
    return launcher.launch_restarting(
      job.command, job.hosts, job.options, place=place, label="cluster", err=err
    )
  finally:
    if injector is not None:
      injector.close()


def link_down(plan: netns.Plan, host: int) -> str | None:
  """Why ``host`` cannot progress when one of its interfaces is down (``ip link``: not
  UP): "has its link down (...)", the watchdog's verdict; None when they are all up."""
  ns = plan.hosts[host]
  down = []
  for dev in plan.host_links(host):
    res = subprocess.run([*plan.enter, "ip", "-n", ns, "-o", "link", "show", "dev", dev],
                         capture_output=True, text=True)  # fmt: skip
    flags = res.stdout.partition("<")[2].partition(">")[0].split(",")
    if res.returncode == 0 and "UP" not in flags:
      down.append(dev)
  return f"has its link down ({', '.join(down)} not UP in {ns})" if down else None


def _down(prog: str, everything: bool = False) -> int:
  """Removes the leftovers of clusters whose command is gone; with ``everything``, also
  the clusters still running (their hosts lose their links)."""
  tags = netns.clean_stale()
  for tag in fault_lib.stale_cgroup_tags():  # a killed cluster's cpu: faults
    fault_lib.remove_cgroups(f"{tag}-")
    tags = sorted({*tags, tag})
  live = sorted({"-".join(n.split("-")[:2]) for n in netns.namespaces()})
  if everything:
    live = sorted({*live, *("-".join(g.name.split("-")[:2]) for g in fault_lib.cgroups())})
    for tag in live:
      netns.down(tag)
      fault_lib.remove_cgroups(f"{tag}-")
    tags, live = sorted({*tags, *live}), []
  print(f"{prog}: removed {len(tags)} cluster(s){': ' if tags else ''}{', '.join(tags)}")
  if live:
    print(f"{prog}: kept {', '.join(live)}: still running (their process is alive; 'down --all'"
          " removes them too)")  # fmt: skip
  left = netns.leftovers() if everything else [x for t in tags for x in netns.leftovers(t)]
  left += [str(g) for g in fault_lib.cgroups() if "-".join(g.name.split("-")[:2]) in tags]
  if left:
    print(f"{prog}: could not remove {', '.join(left)}", file=sys.stderr)
    return 1
  return 0


def configure(parser: argparse.ArgumentParser) -> None:
  parser.usage = (
    "%(prog)s --hosts N [--topology NET] [--link RATE] [options] -- COMMAND [ARGS...]\n"
    "       %(prog)s down [--all]"
  )
  parser.add_argument("--hosts", type=int, default=None, help="emulated hosts (one process each)")
  parser.add_argument(
    "--topology",
    default="switch",
    help="switch, fat_tree:HOSTS_PER_LEAF:OVERSUBSCRIPTION or torus:AxB (as scaling --topology)",
  )
  parser.add_argument(
    "--link", default="200Mbit", help=f"each link's rate, each way: {units.RATE_HELP}"
  )
  parser.add_argument(
    "--queue",
    default="100ms",
    help="how much traffic each shaped link's queue holds, as time at its rate (tbf's"
    " latency; beyond it packets are dropped): 100ms (the default) or 5ms...",
  )
  parser.add_argument(
    "--mtu",
    type=int,
    default=1500,
    help="every link's MTU in bytes: 1500 (Ethernet, the default) or 9000 (jumbo frames)",
  )
  parser.add_argument(
    "--tcp-queue",
    default=units.format_bytes(netns.DEFAULT_TCP_QUEUE, sep=""),
    help="bytes one TCP socket may keep in its host's queue (Linux's TCP Small Queues,"
    " net.ipv4.tcp_limit_output_bytes, set in every host): 16KiB (the default: a host's"
    " small messages pass its bulk data, as under a flow-fair qdisc) or 4MiB (this"
    " kernel's own default: one flow can fill the link's whole queue)",
  )
  parser.add_argument(
    "--congestion-control",
    default=None,
    help="the hosts' TCP congestion control (net.ipv4.tcp_congestion_control, set in every"
    " host): reno, cubic (most distributions' default), bbr... (default: the machine's own,"
    " which the banner names)",
  )
  parser.add_argument(
    "--devices-per-host", type=int, default=1, help="emulated CPU devices per host process"
  )
  parser.add_argument(
    "--counters", default=None, help="write each host's bytes sent/received (JSON) here"
  )
  parser.add_argument(
    "--concurrent",
    action="store_true",
    help=f"run even while another cluster runs (without it: wait; ${ENV_CONCURRENT}=1 sets it)",
  )
  parser.add_argument(
    "--rootless",
    action="store_true",
    help="build the cluster in a user namespace of your own, as when not root (it is how"
    " a user without root runs: chosen by itself there; nothing of it shows on the machine)",
  )
  parser.add_argument(
    "--launcher",
    default="builtin",
    choices=engines.LAUNCHERS,
    help="who starts the hosts' processes: builtin (the default; names a dead or stuck host),"
    " mpirun (Open MPI, its daemons started in each host through an rsh agent) or slurm (a"
    " private SLURM, one slurmd per host; srun -c DEVICES); root only",
  )
  launcher.add_launch_options(parser, "host")
  launcher.add_collectives_option(parser, "--launcher mpirun, --devices-per-host 1")
  parser.add_argument(
    "--fault",
    action="append",
    default=[],
    metavar="SPEC",
    help="inject a fault T seconds after the hosts joined (repeatable): kill:H@T (SIGKILL"
    " host H), stop:H@T (SIGSTOP), spin:H@T (its main thread spins in Python),"
    " link:H=RATE@T (its links' rate), down:H@T+D (its links down D seconds; +inf: for"
    " good), cpu:H=FRACTION@T (a cgroup CPU quota, FRACTION of a core)",
  )
  parser.add_argument(
    "command",
    nargs=argparse.REMAINDER,
    help="after --: an allreduce-jax subcommand or a program; or 'down [--all]' to remove leftovers",
  )


def run(args: argparse.Namespace) -> int:
  prog = "allreduce-jax cluster"
  command = args.command[1:] if args.command[:1] == ["--"] else args.command
  if command[:1] == ["down"] and args.hosts is None:
    if command[1:] not in ([], ["--all"]):
      print(f"{prog}: down takes only --all, got {' '.join(command[1:])!r}.", file=sys.stderr)
      return 2
    return _down(prog, everything=command[1:] == ["--all"])
  if args.hosts is None:
    print(f"{prog}: --hosts N is required (or 'cluster down').", file=sys.stderr)
    return 2
  if args.hosts < 1:  # before the launch options' checks, which would say -n/--num-processes
    print(f"{prog}: --hosts must be at least 1, got {args.hosts}.", file=sys.stderr)
    return 2
  if args.log_dir:
    output_dir(args.log_dir, "--log-dir")
  if args.counters:  # written after the run: a bad path is refused before it
    output_path(args.counters, "--counters")
  try:
    launcher.check_options(launcher.launch_options(args), args.hosts)
    faults = [fault_lib.parse(spec, args.hosts) for spec in args.fault]
    if args.launcher != "builtin" and (faults or args.restarts or args.elastic):
      raise ValueError(
        f"--launcher {args.launcher}: --fault, --restarts and --elastic need the builtin"
        " launcher (it knows each host's process)."
      )
    return cluster(
      args.command,
      args.hosts,
      network=args.topology,
      link=args.link,
      queue=args.queue,
      mtu=args.mtu,
      tcp_queue=args.tcp_queue,
      congestion_control=args.congestion_control,
      devices_per_host=args.devices_per_host,
      counters_path=args.counters,
      concurrent=args.concurrent or os.environ.get(ENV_CONCURRENT, "") not in ("", "0"),
      rootless=True if args.rootless else None,
      engine=args.launcher,
      collectives=args.collectives,
      faults=faults,
      options=launcher.launch_options(args),
    )
  except (ValueError, launcher.LaunchError) as e:
    print(f"{prog}: {e}", file=sys.stderr)
    return 2
  except netns.ClusterError as e:
    print(f"{prog}: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    print(f"{prog}: interrupted (Ctrl-C); the cluster is removed.", file=sys.stderr)
    return 130
