"""An emulated cluster on one Linux machine: hosts as network namespaces, shaped links.

Each host is a network namespace with its own address (from :data:`SUBNET`, used only
inside the namespaces this module creates) and its own host name (a UTS namespace
per process, resolved through ``/etc/netns/NAME/hosts``, which ``ip netns exec``
mounts over ``/etc/hosts``; rootless, through the user namespace's own ``/etc/hosts``),
so gloo advertises the right address to its peers.
Links are veth pairs shaped with ``tc`` token buckets (``tbf``) on both ends, so
each direction of a link carries at most its rate; there is no added delay
(``netem`` is not used). A link's queue is one FIFO (the kernel the committed results
ran on has no flow-fair qdisc under ``tbf``), so each host caps what one TCP socket keeps in it
(:data:`DEFAULT_TCP_QUEUE`, ``net.ipv4.tcp_limit_output_bytes`` in its namespace). The networks are the specs :func:`topology.parse` reads:

- ``switch``: one bridge in a namespace of its own; each host's link to it shaped
  to the rate, both directions (a non-blocking switch with one port per host).
- ``fat_tree:K:R``: leaf bridges of K hosts (host i on leaf i // K), each leaf's
  uplink to one spine bridge shaped to K·rate/R (R:1 oversubscription).
- ``torus:A[xB[xC]]`` (or ``torus:1d|2d|3d``, fitted to the host count): host i at
  row-major coordinates, a point-to-point link to each neighbour, IP forwarding, and
  static minimal dimension-order routes (dimension 0 first, ties forward: the
  routing :class:`topology.Torus` replays), so a message to a far host crosses the
  hosts between.

Names start with :data:`PREFIX` and the creating process's id (``arj-PID-h0``...),
so concurrent clusters never collide, and leftovers of a process that died (even by
SIGKILL) are recognised and removed (:func:`stale_tags`, :func:`down`).

Link rates are read by :func:`allreduce_jax.units.parse_rate`, the package's one rate
parser (``200Mbit``, ``1Gbit``, ``25MB/s``...), and written for ``tc`` by
:func:`allreduce_jax.units.tc_rate`.

Built by root (``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN``) the namespaces are named on
this machine (``ip netns list`` shows them). Without root, the cluster is built inside a
user namespace of the user's own (*rootless*, :class:`UserNamespace`, where the kernel
lets unprivileged users create one): it holds its own network and mount namespaces, in
which this user is root, and every command that builds or enters the cluster runs through
``nsenter`` into it (:attr:`Plan.enter`); nothing of it is visible on the machine, and the
kernel removes all of it with its last process. Both need ``ip`` and ``tc`` (iproute2) and
``unshare`` (util-linux; rootless also ``nsenter``); :func:`privilege_problem` says what
is missing. :func:`built` builds a plan either way and removes it. Importing this module
runs nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import math
import os
import re
import select
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from allreduce_jax import networks, units
from allreduce_jax.results import ENV_NETWORK

#: Every namespace this module creates is named ``PREFIX-PID-...``.
PREFIX = "arj"
#: The private subnet of the emulated hosts (only ever inside these namespaces).
SUBNET = ipaddress.ip_network("10.213.0.0/16")
NETNS_DIR = Path("/run/netns")
ETC_NETNS = Path("/etc/netns")

# ----------------------------------------------------------------------------------------
# The plan: what to create, as data (tested without privilege).
# ----------------------------------------------------------------------------------------


#: Each shaped link's queue, in seconds of traffic at its rate (``cluster --queue``).
DEFAULT_QUEUE = 0.1
#: Bytes one TCP socket may keep queued below it in its host (Linux's TCP Small Queues,
#: ``net.ipv4.tcp_limit_output_bytes``; ``cluster --tcp-queue``). The kernel's default
#: (4 MiB where the committed results ran) lets one bulk flow fill its host's whole link queue, so the host's other
#: packets (gloo's "ready to receive", ACKs) wait behind up to ``queue`` of it; a real
#: host's flow-fair default qdisc (``fq_codel``, ``fq``), which that kernel lacks under a
#: shaped link, lets them pass. 16 KiB keeps each socket's share to about one segment.
DEFAULT_TCP_QUEUE = 16 * 1024


@dataclass(frozen=True)
class Link:
  """A veth pair between namespaces ``a`` and ``b`` (device ``a_dev`` in ``a``...),
  shaped to ``rate`` bytes/s in each direction; a ``*_bridge`` end is enslaved to
  that namespace's bridge ``br0``."""

  a: str
  a_dev: str
  b: str
  b_dev: str
  rate: float
  a_bridge: bool = False
  b_bridge: bool = False


@dataclass(frozen=True)
class Plan:
  """An emulated cluster, as the commands :func:`up` runs will build it.

  Attributes:
    tag: ``PREFIX-PID``; every namespace's name starts with it.
    network: the network spec (``switch``, ``fat_tree:2:2``, ``torus:8``).
    rate: each host link's rate, bytes/s per direction.
    hosts: the hosts' namespace names, rank order.
    hostnames: each host's own host name.
    addresses: each host's address (what its host name resolves to).
    devices: each host's interface that carries its address (``lo`` on a torus,
      whose hosts have one link per neighbour).
    bridges: namespaces holding a bridge (switches), none on a torus.
    links: every veth pair.
    routes: ``(namespace, destination, next hop, device)`` static routes (torus).
    queue: seconds of traffic each shaped link's queue holds before it drops (tbf's
      ``latency``): how long a small message can wait behind bulk data.
    mtu: every link's MTU in bytes (1500: Ethernet's; 9000: jumbo frames, which carry
      0.99 of the line as TCP payload where 1500 carries 0.956).
    tcp_queue: bytes one TCP socket may keep queued in its host
      (``net.ipv4.tcp_limit_output_bytes`` in every host's namespace).
    congestion_control: the hosts' TCP congestion control
      (``net.ipv4.tcp_congestion_control`` in every host's namespace); None: what a new
      namespace inherits, the machine's default.
    enter: the command prefix that enters the user namespace the cluster is built in
      (rootless, :attr:`UserNamespace.enter`); empty when root builds it on the machine.
  """

  tag: str
  network: str
  rate: float
  hosts: tuple[str, ...]
  hostnames: tuple[str, ...]
  addresses: tuple[str, ...]
  devices: tuple[str, ...]
  bridges: tuple[str, ...] = ()
  links: tuple[Link, ...] = ()
  routes: tuple[tuple[str, str, str, str], ...] = field(default=())
  queue: float = DEFAULT_QUEUE
  mtu: int = 1500
  tcp_queue: int = DEFAULT_TCP_QUEUE
  congestion_control: str | None = None
  enter: tuple[str, ...] = ()

  @property
  def namespaces(self) -> tuple[str, ...]:
    return self.hosts + self.bridges

  def exec_in(self, ns: str) -> list[str]:
    """The command prefix that runs a program in namespace ``ns`` (``ip netns exec``)."""
    return [*self.enter, "ip", "netns", "exec", ns]

  def host_links(self, rank: int) -> list[str]:
    """The devices of host ``rank`` that carry traffic to other hosts (its NICs)."""
    ns = self.hosts[rank]
    return [lk.a_dev if lk.a == ns else lk.b_dev for lk in self.links if ns in (lk.a, lk.b)]

  def describe(self) -> dict:
    """The network as data, for rows: spec, hosts, rate, queue, MTU, TCP queue, and
    the congestion control where one was asked for."""
    out = {
      "network": self.network,
      "hosts": len(self.hosts),
      "link_Bps": self.rate,
      "queue_s": self.queue,
      "mtu": self.mtu,
      "tcp_queue": self.tcp_queue,
    }
    if self.congestion_control:
      out["congestion_control"] = self.congestion_control
    return out


def tag_for(pid: int | None = None) -> str:
  return f"{PREFIX}-{os.getpid() if pid is None else pid}"


def _address(i: int) -> str:
  return str(SUBNET.network_address + i + 1)


def plan(
  network: str,
  hosts: int,
  rate: float,
  tag: str | None = None,
  queue: float = DEFAULT_QUEUE,
  mtu: int = 1500,
  tcp_queue: int = DEFAULT_TCP_QUEUE,
  congestion_control: str | None = None,
) -> Plan:
  """The cluster of ``hosts`` hosts on ``network`` (a :func:`topology.parse` spec:
  ``switch``, ``fat_tree:K:R``, ``torus:AxB``), links of ``rate`` bytes/s whose queues
  hold ``queue`` seconds of traffic, frames of ``mtu`` bytes, hosts whose TCP sockets
  each keep at most ``tcp_queue`` bytes queued, with TCP congestion control
  ``congestion_control`` (None: the machine's default). ``ValueError`` (naming
  ``--topology`` / ``--hosts`` / ``--queue`` / ``--mtu`` / ``--tcp-queue`` /
  ``--congestion-control``) for what cannot be emulated."""
  if hosts < 1:
    raise ValueError(f"--hosts must be at least 1, got {hosts}.")
  if hosts > 250:
    raise ValueError(f"--hosts {hosts}: at most 250 emulated hosts.")
  if rate <= 0:
    raise ValueError(f"--link must be a positive rate, got {rate}.")
  if not 0 < queue <= 10:
    raise ValueError(f"--queue must be more than 0 s and at most 10 s, got {queue} s.")
  if not 576 <= mtu <= 65535:
    raise ValueError(f"--mtu must be from 576 to 65535 bytes, got {mtu}.")
  if not 1024 <= tcp_queue <= 1 << 30:
    raise ValueError(f"--tcp-queue must be from 1 KiB to 1 GiB, got {tcp_queue} bytes.")
  if congestion_control is not None and not re.fullmatch(
    r"[a-z][a-z0-9_]{0,15}", congestion_control
  ):
    raise ValueError(
      f"--congestion-control must be a kernel's algorithm name (reno, cubic, bbr...),"
      f" got {congestion_control!r}."
    )
  top = networks.parse(network)
  if isinstance(top, networks.Switch) and top.ports is not None:
    raise ValueError(f"--topology {network!r}: switch:PORTS (several NICs) is not emulated.")
  if isinstance(top, networks.Torus):
    top = top.fit(hosts)
    if math.prod(top.dims) != hosts:
      raise ValueError(
        f"--topology {network!r} has {math.prod(top.dims)} nodes but --hosts is {hosts}."
      )
    if not top.wrap:
      raise ValueError(f"--topology {network!r}: a mesh without wraparound is not emulated.")
  elif not isinstance(top, (networks.Switch, networks.FatTree)):
    raise ValueError(
      f"--topology {network!r}: only switch, fat_tree:K:R and torus:AxB can be emulated."
    )
  tag = tag or tag_for()
  names = tuple(f"{tag}-h{i}" for i in range(hosts))
  hostnames = tuple(f"host{i}" for i in range(hosts))
  addresses = tuple(_address(i) for i in range(hosts))
  links, bridges = _links(top, hosts, rate, tag)
  routed = not bridges  # hosts joined point to point (a torus) forward for each other
  routes = tuple(
    (names[i], addresses[j], addresses[nxt], f"t{nxt}")
    for i in range(hosts)
    for j in range(hosts)
    if routed and i != j
    for nxt in (int(top.route(i, j, hosts)[1][1:]),)
  )
  devices = ("lo" if routed else "eth0",) * hosts
  name = "switch" if isinstance(top, networks.Switch) else top.name
  return Plan(
    tag, name, rate, names, hostnames, addresses, devices, bridges, links, routes, queue, mtu,
    tcp_queue, congestion_control,
  )  # fmt: skip


def _links(top, hosts: int, rate: float, tag: str) -> tuple[tuple[Link, ...], tuple[str, ...]]:
  """The veth pairs of ``top``'s :meth:`~allreduce_jax.networks.Network.links` (each
  at its rate in host links times ``rate``) and the switches' namespaces (first use
  order). Devices: a host's link to a switch is its ``eth0`` (port ``p{i}`` there), a
  switch's link up is ``uplink`` (the ``l{j}``-th port of the one above), a host's
  link to host j is ``t{j}``."""
  out, bridges, below = [], [], {}

  def ns(node: str) -> str:
    if node.startswith("h") and node[1:].isdigit():
      return f"{tag}-{node}"
    name = f"{tag}-{'sw' if node == 'switch' else node}"
    if name not in bridges:
      bridges.append(name)
    return name

  for lk in top.links(hosts):
    a, b, r = ns(lk.a), ns(lk.b), rate * lk.rate
    host_a, host_b = a not in bridges, b not in bridges
    if host_a and host_b:
      out.append(Link(a, f"t{lk.b[1:]}", b, f"t{lk.a[1:]}", r))
    elif host_a:
      out.append(Link(a, "eth0", b, f"p{lk.a[1:]}", r, b_bridge=True))
    else:
      j = below[b] = below.get(b, -1) + 1
      out.append(Link(a, "uplink", b, f"l{j}", r, True, True))
  return tuple(out), tuple(bridges)


# ----------------------------------------------------------------------------------------
# Privilege, building, tearing down.
# ----------------------------------------------------------------------------------------


class ClusterError(RuntimeError):
  """The cluster cannot be built (missing privilege or tools, a failed command); the
  message is one line saying what is needed."""


def _caps() -> int:
  try:
    for line in Path("/proc/self/status").read_text().splitlines():
      if line.startswith("CapEff:"):
        return int(line.split()[1], 16)
  except (OSError, ValueError):
    pass
  return 0


def _missing_tools(*tools: str) -> str | None:
  """What of ``tools`` is not on PATH (one line), or None."""
  missing = [t for t in tools if shutil.which(t) is None]
  return f"needs {', '.join(missing)} (iproute2, util-linux) on PATH." if missing else None


def root_problem() -> str | None:
  """Why this process cannot build a cluster on the machine as root (one line), or None."""
  missing = _missing_tools("ip", "tc", "unshare", "hostname")
  if missing:
    return missing
  caps = _caps()
  need = {12: "CAP_NET_ADMIN", 21: "CAP_SYS_ADMIN"}
  lacking = [name for bit, name in need.items() if not caps >> bit & 1]
  if lacking:
    return (
      f"needs root (or {' and '.join(lacking)}) to create network namespaces, veth links"
      " and tc shaping; run it as root (e.g. sudo) or in a container with CAP_NET_ADMIN."
    )
  res = subprocess.run(
    ["unshare", "--net", "--uts", "true"], capture_output=True, text=True, timeout=30
  )
  if res.returncode != 0:
    why = (res.stderr.strip().splitlines() or ["refused"])[-1]
    return f"cannot create namespaces here (unshare --net --uts: {why})."
  return None


# What a rootless cluster's holder does in its new user, network and mount namespaces:
# a private /run for `ip netns` (its names live there), its own /etc/hosts (written by
# `up`, seen by every host: `ip netns exec` mounts /etc/netns/NAME over /etc only where
# such a directory exists, and the machine's are hidden), then it waits on its stdin, so
# it exits when the cluster's process closes it or dies (even by SIGKILL).
_HOLDER = (
  "mount -t tmpfs arj /run && mkdir /run/netns && : > /run/hosts"
  " && mount --bind /run/hosts /etc/hosts"
  " && { [ ! -d /etc/netns ] || mount -t tmpfs arj /etc/netns; }"
  " && echo ready && exec cat > /dev/null"
)
_UNSHARE_USER = ["unshare", "--user", "--map-root-user", "--net", "--mount", "--"]


def rootless_problem() -> str | None:
  """Why this process cannot build a cluster in a user namespace of its own (one line),
  or None. Tries it: a user namespace may be created and still refuse what a cluster
  needs (Ubuntu's AppArmor lets one be made but takes its capabilities away)."""
  missing = _missing_tools("ip", "tc", "unshare", "nsenter")
  if missing:
    return missing
  probe = "mount -t tmpfs arj /run && ip link add arj-probe type bridge"
  try:
    res = subprocess.run(
      [*_UNSHARE_USER, "sh", "-c", probe], capture_output=True, text=True, timeout=30
    )
  except OSError as e:
    return f"cannot run unshare ({e.strerror})."
  if res.returncode != 0:
    why = (res.stderr.strip().splitlines() or [f"status {res.returncode}"])[-1]
    return (
      f"cannot build it in a user namespace either ({why}): unprivileged user namespaces"
      " are off here (as root: sysctl user.max_user_namespaces=10000; on Debian before 12"
      " kernel.unprivileged_userns_clone=1; on Ubuntu 24.04"
      " kernel.apparmor_restrict_unprivileged_userns=0)."
    )
  return None


def choose(rootless: bool | None = None) -> tuple[bool, str | None]:
  """How a cluster is built here, and why it cannot be (one line) or None: rootless or
  not as ``rootless`` asks, or (None) as root where this process can, else rootless;
  where neither works the line names both reasons."""
  if rootless is not None:
    return rootless, rootless_problem() if rootless else root_problem()
  root = root_problem()
  if root is None:
    return False, None
  why = rootless_problem()
  return True, None if why is None else f"{root.rstrip('.')}; {why}"


def privilege_problem(rootless: bool | None = None) -> str | None:
  """Why this process cannot build a cluster (one line), or None if it can: as root
  (``rootless=False``), in a user namespace of its own (``True``), or either way (None:
  root where it can, else rootless). :func:`choose` says which way, too."""
  return choose(rootless)[1]


class UserNamespace:
  """A user namespace of this user's own, holding a network and a mount namespace, in
  which a cluster is built without root (this user is root in it). :attr:`enter` is the
  command prefix that runs a program in it. A holder process keeps it alive; it exits on
  :meth:`close` or when the process that made it dies, even by SIGKILL (its stdin reaches
  EOF), and the kernel removes the namespaces, links and shaping inside with the last
  process in them. ``ClusterError`` when it cannot be made."""

  def __init__(self) -> None:
    self._holder = subprocess.Popen(
      [*_UNSHARE_USER, "sh", "-c", _HOLDER],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      start_new_session=True,  # Ctrl-C reaches the cluster's process, which closes it
    )
    ready = b""
    if select.select([self._holder.stdout], [], [], 30)[0]:  # never a hang
      ready = self._holder.stdout.readline()
    if ready.strip() != b"ready":
      why = (self._stop().strip().splitlines() or [f"status {self._holder.returncode}"])[-1]
      raise ClusterError(f"cannot make a user namespace for the cluster: {why}")
    pid = self._holder.pid
    # --wd=.: the program starts where its caller is (entering a mount namespace would
    # otherwise move it to /, and relative paths would land there).
    self.enter = ("nsenter", f"--target={pid}", "--user", "--mount", "--net",
                  "--preserve-credentials", "--wd=.", "--")  # fmt: skip

  def close(self) -> None:
    self._stop()

  def _stop(self) -> str:
    """Ends the holder (EOF on its stdin; killed if it is stuck before reading it);
    returns what it wrote to stderr."""
    with contextlib.suppress(OSError, ValueError):
      self._holder.stdin.close()
    try:
      self._holder.wait(10)
    except subprocess.TimeoutExpired:
      self._holder.kill()
      self._holder.wait()
    with self._holder.stdout, self._holder.stderr:
      return self._holder.stderr.read().decode(errors="replace")


def processes_in(user_ns: str) -> list[int]:
  """The processes (that this process may inspect) in user namespace ``user_ns``
  (as ``readlink /proc/PID/ns/user`` names it)."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    with contextlib.suppress(OSError):
      if os.readlink(f"/proc/{pid}/ns/user") == user_ns:
        found.append(int(pid))
  return found


@contextlib.contextmanager
def built(p: Plan, rootless: bool = False):
  """Builds ``p`` (:func:`up`), yields it as built (with :attr:`Plan.enter` where it
  is ``rootless``), and removes it after, on success, error or Ctrl-C."""
  if not rootless:
    try:
      up(p)
      yield p
    finally:
      down(p.tag)
    return
  userns = UserNamespace()
  try:
    p = dataclasses.replace(p, enter=userns.enter)
    up(p)
    yield p
  finally:
    userns.close()


def _run(argv: Sequence[str]) -> None:
  res = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
  if res.returncode != 0:
    why = (res.stderr.strip().splitlines() or [f"status {res.returncode}"])[-1]
    raise ClusterError(f"`{' '.join(argv)}` failed: {why}")


def _in(p: Plan, ns: str, script: str) -> list[str]:
  return [*p.exec_in(ns), "sh", "-c", script]


# Quiet hosts: no IPv6 (router solicitations, DAD) so interface counters carry only
# the run's traffic; no reverse-path filter (a torus's routes are not symmetric).
_SYSCTL = (
  "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6;"
  " echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6;"
  " echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter;"
  " echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter"
)


_TSQ = "/proc/sys/net/ipv4/tcp_limit_output_bytes"  # per network namespace
_CC = "/proc/sys/net/ipv4/tcp_congestion_control"  # per network namespace
_CC_AVAILABLE = "/proc/sys/net/ipv4/tcp_available_congestion_control"
_CC_ALLOWED = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"  # the machine's


def default_congestion_control() -> str | None:
  """The TCP congestion control a new network namespace starts with (this machine's
  default, ``net.ipv4.tcp_congestion_control``), or None where it cannot be read."""
  try:
    return Path(_CC).read_text().strip() or None
  except OSError:
    return None


def congestion_control_problem(name: str | None) -> str | None:
  """Why the hosts cannot use TCP congestion control ``name`` (one line), or None.
  Inside a network namespace Linux lets a process choose only the algorithms the
  machine lists in ``net.ipv4.tcp_allowed_congestion_control``."""
  if name is None:
    return None
  try:
    available = Path(_CC_AVAILABLE).read_text().split()
    allowed = Path(_CC_ALLOWED).read_text().split()
  except OSError as e:
    return f"--congestion-control {name}: cannot read the kernel's list ({e})."
  if name not in available:
    return (
      f"--congestion-control {name}: this kernel has {' '.join(available)}"
      f" (net.ipv4.tcp_available_congestion_control; a module may add more: modprobe tcp_{name})."
    )
  if name not in allowed and name != default_congestion_control():
    return (
      f"--congestion-control {name}: a network namespace may use only {' '.join(allowed)}"
      f" here (net.ipv4.tcp_allowed_congestion_control); to allow it, as root: sysctl -w"
      f" net.ipv4.tcp_allowed_congestion_control='{' '.join([*allowed, name])}'."
    )
  return None


def _shape(ns: str, dev: str, rate: float, queue: float = DEFAULT_QUEUE) -> list[str]:
  """A token bucket on ``dev``'s egress: at most ``rate`` bytes/s leave through it.
  The bucket holds :func:`allreduce_jax.networks.bucket_bytes`; its queue holds ``queue``
  seconds (tbf's ``latency``), beyond which packets are dropped."""
  burst = networks.bucket_bytes(rate)
  return ["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
          units.tc_rate(rate), "burst", str(burst), "latency", f"{queue * 1e6:.0f}us"]  # fmt: skip


def up(p: Plan) -> None:
  """Builds ``p``: namespaces, bridges, shaped links, addresses, routes, host files.
  On a failure everything already built is removed and ``ClusterError`` raised.
  Rootless (``p.enter``) it builds inside that user namespace, whose ``/etc/hosts``
  gets the host names."""

  def run(*argv: str) -> None:
    _run([*p.enter, *argv])

  try:
    for ns in p.namespaces:
      run("ip", "netns", "add", ns)
      host = ns in p.hosts
      _run(_in(p, ns, _SYSCTL + ("; echo 1 > /proc/sys/net/ipv4/ip_forward" if p.routes else "")
                              + (f"; echo {p.tcp_queue} > {_TSQ}" if host else "")
                              + (f"; [ \"$(cat {_CC})\" = {p.congestion_control} ]"
                                 f" || echo {p.congestion_control} > {_CC}"
                                 if host and p.congestion_control else "")))  # fmt: skip
      run("ip", "-n", ns, "link", "set", "lo", "up")
    for ns in p.bridges:
      run("ip", "-n", ns, "link", "add", "br0", "type", "bridge")
      run("ip", "-n", ns, "link", "set", "br0", "up")
    for lk in p.links:
      run("ip", "link", "add", lk.a_dev, "netns", lk.a, "type", "veth",
          "peer", "name", lk.b_dev, "netns", lk.b)  # fmt: skip
      for ns, dev, bridged in ((lk.a, lk.a_dev, lk.a_bridge), (lk.b, lk.b_dev, lk.b_bridge)):
        if bridged:
          run("ip", "-n", ns, "link", "set", dev, "master", "br0")
        if p.mtu != 1500:
          run("ip", "-n", ns, "link", "set", dev, "mtu", str(p.mtu))
        run(*_shape(ns, dev, lk.rate, p.queue))
        run("ip", "-n", ns, "link", "set", dev, "up")
    hosts_file = "127.0.0.1 localhost\n" + "".join(
      f"{a} {h}\n" for a, h in zip(p.addresses, p.hostnames)
    )
    prefix = 32 if p.routes or p.devices[0] == "lo" else SUBNET.prefixlen
    for ns, addr, dev in zip(p.hosts, p.addresses, p.devices):
      run("ip", "-n", ns, "addr", "add", f"{addr}/{prefix}", "dev", dev)
      if not p.enter:
        etc = ETC_NETNS / ns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(hosts_file)
    if p.enter:  # one /etc/hosts in the user namespace, which every host sees
      run("sh", "-c", 'printf %s "$0" > /etc/hosts', hosts_file)
    for ns, dst, via, dev in p.routes:
      src = p.addresses[p.hosts.index(ns)]
      run("ip", "-n", ns, "route", "add", f"{dst}/32", "via", via, "dev", dev,
          "onlink", "src", src)  # fmt: skip
  except BaseException:
    down(p.tag)
    raise


def host_argv(p: Plan, rank: int, description: dict | None = None) -> list[str]:
  """The command prefix that runs a program as host ``rank``: in its network
  namespace (with its ``/etc/hosts``), in a UTS namespace of its own named after it,
  with :data:`~allreduce_jax.results.ENV_NETWORK` describing the network
  (``description``; None: :meth:`Plan.describe`). Every step execs the next, so the
  program keeps the process id it was started with."""
  return [
    *p.exec_in(p.hosts[rank]),
    "unshare", "--uts", "--",
    "sh", "-c", 'hostname "$0" && exec "$@"', p.hostnames[rank],
    "env", f"{ENV_NETWORK}={json.dumps(description or p.describe(), sort_keys=True)}",
  ]  # fmt: skip


def namespaces(prefix: str = PREFIX + "-") -> list[str]:
  """Network namespaces (``ip netns``) whose names start with ``prefix``."""
  try:
    names = os.listdir(NETNS_DIR)
  except OSError:
    names = []
  return sorted(n for n in names if n.startswith(prefix))


def leftovers(tag: str | None = None) -> list[str]:
  """What a cluster (``tag``; default every cluster of this module) left on the
  machine: its namespaces, its ``/etc/netns`` files and any link in this namespace
  named after it. Empty when it is all gone."""
  prefix = f"{tag}-" if tag else f"{PREFIX}-"
  found = [f"netns {n}" for n in namespaces(prefix)]
  with contextlib.suppress(OSError):
    found += [f"{ETC_NETNS / n}" for n in sorted(os.listdir(ETC_NETNS)) if n.startswith(prefix)]
  with contextlib.suppress(OSError):
    found += [f"link {n}" for n in sorted(os.listdir("/sys/class/net")) if n.startswith(prefix)]
  return found


def down(tag: str | None = None) -> list[str]:
  """Removes the namespaces (and with them their links and shaping) and host files of
  cluster ``tag`` (default: every cluster of this module). Returns what it removed."""
  prefix = f"{tag}-" if tag else f"{PREFIX}-"
  removed = []
  for ns in namespaces(prefix):
    res = subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=60)
    if res.returncode == 0:
      removed.append(ns)
  with contextlib.suppress(OSError):
    for n in os.listdir(ETC_NETNS):
      if n.startswith(prefix):
        shutil.rmtree(ETC_NETNS / n, ignore_errors=True)
    if not os.listdir(ETC_NETNS):
      with contextlib.suppress(OSError):
        ETC_NETNS.rmdir()
  return removed


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def stale_tags() -> list[str]:
  """Tags of clusters whose creating process is gone (killed, even by SIGKILL)."""
  tags = set()
  for n in namespaces():
    parts = n.split("-")
    if len(parts) >= 3 and parts[1].isdigit() and not _alive(int(parts[1])):
      tags.add(f"{PREFIX}-{parts[1]}")
  return sorted(tags)


def clean_stale() -> list[str]:
  """Removes the leftovers of every cluster whose process died; returns their tags."""
  tags = stale_tags()
  for t in tags:
    down(t)
  return tags


def interface_bytes(root: str | Path = "/sys/class/net") -> tuple[int, int]:
  """``(sent, received)``: the bytes this network namespace's interfaces but ``lo`` have
  sent and received so far (their counters; a process on an emulated host reads its own
  host's links)."""
  sent = received = 0
  for dev in os.listdir(root):
    if dev != "lo":
      stats = Path(root) / dev / "statistics"
      sent += int((stats / "tx_bytes").read_text())
      received += int((stats / "rx_bytes").read_text())
  return sent, received


def counters(p: Plan) -> list[dict]:
  """Per host: ``{"host", "address", "tx_bytes", "rx_bytes"}``, the bytes its links
  have sent and received so far (their interface counters, read in its namespace)."""
  out = []
  for rank, (ns, addr) in enumerate(zip(p.hosts, p.addresses)):
    script = "; ".join(
      f"cat /sys/class/net/{d}/statistics/tx_bytes /sys/class/net/{d}/statistics/rx_bytes"
      for d in p.host_links(rank)
    )
    res = subprocess.run(_in(p, ns, script), capture_output=True, text=True, timeout=60)
    v = [int(x) for x in res.stdout.split()] if res.returncode == 0 else [0, 0]
    out.append({"host": rank, "address": addr, "tx_bytes": sum(v[0::2]), "rx_bytes": sum(v[1::2])})
  return out
