"""Faults injected into an emulated cluster while a run goes on (``cluster --fault SPEC``).

    kill:H@T        SIGKILL host H's process T seconds after the hosts joined
    stop:H@T        SIGSTOP it (it stays stopped: its peers see a silent host)
    spin:H@T        its main thread spins in Python from then on (SIGUSR2; a process
                    stuck outside JAX: alive, never reaching its next collective)
    link:H=RATE@T   host H's links change to RATE each way (tc tbf, both ends)
    down:H@T+D      host H's links go down for D seconds, then up again (+inf: for good)
    cpu:H=F@T       host H's process limited to F of one core (a cgroup's CPU quota:
                    cgroup v1 ``cpu.cfs_quota_us`` or v2 ``cpu.max``, whichever the
                    machine has)

"The hosts joined" is when host 0's coordinator has a connection from every host (its
``ss`` table). Each fault is printed with its time when applied, and written as a row
of ``faults.jsonl`` in the run's log folder. Cgroups made here are removed after the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from allreduce_jax import cluster_rows, netns, networks, units

KINDS = ("kill", "stop", "spin", "link", "down", "cpu")
USAGE = (
  "kill:H@T, stop:H@T, spin:H@T, link:H=RATE@T, down:H@T+D (D: seconds or inf) or cpu:H=FRACTION@T"
)

_SPEC = re.compile(
  r"^(?P<kind>[a-z]+):(?P<host>\d+)(?:=(?P<value>[^@]+))?@(?P<at>[0-9.]+)"
  r"(?:\+(?P<dur>[0-9.]+|inf))?$"
)

CGROUP = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
#: Where a run notes that it enabled the cpu controller for the root cgroup's children
#: (cgroup v2: ``+cpu`` in its ``cgroup.subtree_control``), one file per cluster tag, so
#: whoever removes that cluster's cgroups (the run, its watchdog, ``cluster down``)
#: disables it again and leaves the machine as it found it.
CPU_NOTES = Path("/run/allreduce-jax-cpu")

#: The fastest rate a link is shaped to, in bytes/s (8 Tbit/s): tbf's bucket
#: (:func:`allreduce_jax.networks.bucket_bytes`, 4 ms of the rate) is a 32-bit byte
#: count, so a faster ``--link`` or ``link:`` fault would fail inside ``tc``.
MAX_LINK_RATE = 1e12


@dataclass(frozen=True)
class Fault:
  """One fault: ``kind`` on host ``host`` at ``at`` seconds after the hosts joined;
  ``value``: the new rate (bytes/s, ``link``) or CPU fraction (``cpu``);
  ``duration``: seconds down (``down``; ``inf``: for good); ``spec``: as given."""

  spec: str
  kind: str
  host: int
  at: float
  value: float | None = None
  duration: float | None = None


def parse(spec: str, hosts: int) -> Fault:
  """``spec`` -> :class:`Fault`; a ``ValueError`` naming ``--fault`` and the spec if it
  is malformed or names a host outside ``0..hosts-1``."""

  def bad(why: str) -> ValueError:
    return ValueError(f"--fault {spec!r}: {why}; expected {USAGE}.")

  m = _SPEC.match(spec.strip())
  if not m or m["kind"] not in KINDS:
    raise bad("not a fault")
  kind, host, value, dur = m["kind"], int(m["host"]), m["value"], m["dur"]
  if host >= hosts:
    raise bad(f"host {host} is not one of 0..{hosts - 1}")
  try:
    at = float(m["at"])
  except ValueError:
    raise bad("its time is not a number of seconds") from None
  if at > units.MAX_SECONDS:
    raise bad(f"its time must be at most {units.MAX_SECONDS:.3g} seconds (about 292 years)")
  needs_value = kind in ("link", "cpu")
  if needs_value != (value is not None):
    raise bad(f"{kind} {'takes' if needs_value else 'takes no'} =VALUE")
  if (kind == "down") != (dur is not None):
    raise bad(f"{kind} {'takes' if kind == 'down' else 'takes no'} +DURATION")
  number = None
  if kind == "link":
    try:
      number = units.parse_rate(value, "--fault")
    except ValueError:
      raise bad(f"rate {value!r} is not a rate such as 20Mbit") from None
    if number > MAX_LINK_RATE:
      raise bad(f"rate {value!r} is above {units.tc_rate(MAX_LINK_RATE)}, the most tc shapes here")
  elif kind == "cpu":
    try:
      number = float(value)
    except ValueError:
      number = -1.0
    if not 0 < number <= 64:
      raise bad(f"CPU fraction {value!r} is not a number > 0 (0.5: half a core)")
  try:
    duration = float(dur) if dur is not None else None
  except ValueError:
    raise bad(f"its duration {dur!r} is not a number of seconds") from None
  if duration is not None and duration <= 0:
    raise bad("its duration must be > 0")
  if duration is not None and units.MAX_SECONDS < duration < float("inf"):
    raise bad(f"its duration must be at most {units.MAX_SECONDS:.3g} seconds (+inf: for good)")
  return Fault(spec.strip(), kind, host, at, number, duration)


def alive(pid: int) -> bool:
  """Whether ``pid`` runs (a zombie or a process gone does not)."""
  try:
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
  except (OSError, IndexError):
    return False
  return state != "Z"


def check_link_rate(rate: float, text: str, option: str = "--link") -> None:
  """A ``ValueError`` naming ``option`` and ``text`` (as given) if ``rate`` (bytes/s,
  parsed from ``text``) is faster than a link is shaped to (:data:`MAX_LINK_RATE`)."""
  if rate > MAX_LINK_RATE:
    raise ValueError(
      f"{option} {text}: at most {units.tc_rate(MAX_LINK_RATE)}, the most tc shapes a link"
      " to here (its token bucket is a 32-bit byte count)."
    )


def cgroup_version() -> int | None:
  """2 (unified hierarchy), 1 (v1 ``cpu`` controller) or None (no CPU controller)."""
  if (CGROUP / "cgroup.controllers").exists():
    return 2
  if (CGROUP / "cpu" / "cpu.cfs_quota_us").exists():
    return 1
  return None


class Injector:
  """Applies ``faults`` to the hosts of ``plan`` once they joined; :meth:`start` is the
  launcher's ``on_start`` hook (every attempt of a restarting job: a fault hits the
  process that runs on its host then), :meth:`repair` puts back the links a fault took
  down for good (a replacement host), :meth:`close` stops it and removes its cgroups.

  A fault whose host is not in the job (``--elastic`` left it out) hits the host of the
  job at the same position modulo the job's size, so a schedule drawn for every host
  applies to whichever hosts are in the job; a process fault due while the job restarts
  waits for the next attempt's process."""

  def __init__(self, plan: netns.Plan, faults: list[Fault], port: int, err, log_dir=None):
    self.plan, self.faults, self.port, self.err = plan, faults, port, err
    self.log_dir = Path(log_dir) if log_dir else None
    self.cancel = threading.Event()
    self.thread: threading.Thread | None = None
    self.cgroups: list[Path] = []
    self.rows: list[dict] = []
    self.timers: list[threading.Timer] = []
    self.pids: dict[int, int] = {}  # host -> the pid of the process running there now
    self.broken: set[int] = set()  # hosts whose links are down for good
    self.lock = threading.Lock()
    self.joined: float | None = None  # when the hosts first joined (time.monotonic)
    self.t0: float | None = None

  def start(self, pids: list[int], t0: float, hosts: list[int] | None = None) -> None:
    """The processes of ``hosts`` (default: every host, in order) started as ``pids``;
    the first call starts applying the faults, ``t0`` on ``time.monotonic``'s clock."""
    with self.lock:
      self.pids = dict(zip(hosts if hosts is not None else range(len(pids)), pids))
    if self.thread is None:
      self.thread = threading.Thread(target=self._run, args=(t0,), daemon=True)
      self.thread.start()

  def repair(self, hosts: list[int]) -> None:
    """Puts the links of those of ``hosts`` that a fault took down for good back up."""
    for host in sorted(self.broken & set(hosts)):
      f = Fault(f"repair:{host}", "down", host, 0.0)
      try:
        for ns, dev in self._host_devs(host):
          self._tc(["ip", "-n", ns, "link", "set", dev, "up"])
        what = f"links of host {host} up again (a replacement)"
      except (OSError, subprocess.CalledProcessError) as e:
        what = f"failed to bring the links up: {e}"
      self.broken.discard(host)
      self._log(f, self.joined or time.monotonic(), self.t0 or time.monotonic(), what, "up")

  def _target(self, f: Fault) -> tuple[int, int | None] | None:
    """``(host, pid)`` a fault hits now (see the class), None when cancelled."""
    needs_pid = f.kind in ("kill", "stop", "spin", "cpu")
    while not self.cancel.is_set():
      with self.lock:
        pids = dict(self.pids)
      live = sorted(h for h, p in pids.items() if alive(p))
      host = f.host if f.host in pids else (live[f.host % len(live)] if live else None)
      if host is not None and not needs_pid:
        return host, None
      if host is not None and host in live:
        return host, pids[host]
      self.cancel.wait(0.02)  # between attempts: the next one's processes are on their way
    return None

  def _say(self, text: str) -> None:
    print(f"# cluster: {text}", file=self.err, flush=True)

  def _joined(self, deadline: float) -> bool:
    """Waits until host 0's coordinator port has a connection from every host."""
    argv = [*self.plan.exec_in(self.plan.hosts[0]), "ss", "-Htn", "state", "established",
            f"( sport = :{self.port} )"]  # fmt: skip
    while not self.cancel.is_set() and time.monotonic() < deadline:
      res = subprocess.run(argv, capture_output=True, text=True)
      if res.returncode == 0 and len(res.stdout.strip().splitlines()) >= len(self.plan.hosts):
        return True
      self.cancel.wait(0.05)
    return False

  def _run(self, t0: float) -> None:
    self.t0 = t0
    if not self._joined(time.monotonic() + 300):
      if not self.cancel.is_set():
        self._say("the hosts never joined; no fault applied")
      return
    joined = self.joined = time.monotonic()
    self._say(f"hosts joined {joined - t0:.2f} s after the start; faults count from here")
    for f in sorted(self.faults, key=lambda f: f.at):
      if self.cancel.wait(max(0.0, joined + f.at - time.monotonic())):
        return
      target = self._target(f)
      if target is None:
        return
      if target[0] != f.host:
        f = dataclasses.replace(f, host=target[0])
      try:
        what = self._apply(f, target[1])
      except (OSError, subprocess.CalledProcessError, ValueError) as e:
        what = f"failed: {e}"
      self._log(f, joined, t0, what)
      if f.kind == "down" and f.duration < float("inf") and not self.cancel.is_set():
        timer = threading.Timer(f.duration, self._link_up, args=(f, joined, t0))
        timer.daemon = True
        self.timers.append(timer)
        timer.start()

  def _log(self, f: Fault, joined: float, t0: float, what: str, event: str | None = None) -> None:
    now = time.monotonic()
    row = {
      "fault": f.spec,
      "event": event or f.kind,
      "host": f.host,
      "after_join_s": round(now - joined, 4),
      "after_start_s": round(now - t0, 4),
      "unix_time": time.time(),
      "what": what,
    }
    self.rows.append(row)
    self._say(f"fault {f.spec}: {what} at {now - joined:.2f} s after the hosts joined")
    if self.log_dir is not None:
      with contextlib.suppress(OSError):
        with open(self.log_dir / "faults.jsonl", "a") as fh:
          fh.write(json.dumps(row) + "\n")

  def _ends(self, host: int) -> list[tuple[str, str]]:
    """``(namespace, device)`` of both ends of every link of ``host``."""
    ns = self.plan.hosts[host]
    return [
      end for lk in self.plan.links if ns in (lk.a, lk.b) for end in ((lk.a, lk.a_dev), (lk.b, lk.b_dev))
    ]  # fmt: skip

  def _tc(self, argv: list[str]) -> None:
    subprocess.run([*self.plan.enter, *argv], check=True, capture_output=True)

  def _apply(self, f: Fault, pid: int | None) -> str:
    if f.kind in ("kill", "stop", "spin"):
      sig = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "spin": signal.SIGUSR2}[f.kind]
      os.kill(pid, sig)
      return f"{sig.name} to pid {pid}" + (" (it spins in Python)" if f.kind == "spin" else "")
    if f.kind == "link":
      burst = networks.bucket_bytes(f.value)
      for ns, dev in self._ends(f.host):
        self._tc(["tc", "-n", ns, "qdisc", "change", "dev", dev, "root", "tbf", "rate",
                  units.tc_rate(f.value), "burst", str(burst),
                  "latency", f"{self.plan.queue * 1e6:.0f}us"])  # fmt: skip
      return f"links of host {f.host} at {units.tc_rate(f.value)} each way"
    if f.kind == "down":
      for ns, dev in self._host_devs(f.host):
        self._tc(["ip", "-n", ns, "link", "set", dev, "down"])
      if f.duration == float("inf"):
        self.broken.add(f.host)
      return f"links of host {f.host} down " + (
        "for good" if f.duration == float("inf") else f"for {f.duration:g} s"
      )
    return self._cpu(f, pid)

  def _host_devs(self, host: int) -> list[tuple[str, str]]:
    ns = self.plan.hosts[host]
    return [(ns, dev) for dev in self.plan.host_links(host)]

  def _link_up(self, f: Fault, joined: float, t0: float) -> None:
    try:
      for ns, dev in self._host_devs(f.host):
        self._tc(["ip", "-n", ns, "link", "set", dev, "up"])
      what = f"links of host {f.host} up again"
    except (OSError, subprocess.CalledProcessError) as e:
      what = f"failed to bring the links up: {e}"
    self._log(f, joined, t0, what, event="up")

  def _cpu(self, f: Fault, pid: int) -> str:
    version = cgroup_version()
    if version is None:
      raise ValueError("no CPU cgroup controller on this machine")
    quota = max(1000, int(f.value * PERIOD_US))
    name = f"{self.plan.tag}-host{f.host}"
    if version == 2:
      group = CGROUP / name
      _enable_cpu_controller(self.plan.tag)
      group.mkdir(exist_ok=True)
      self.cgroups.append(group)
      (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
    else:
      group = CGROUP / "cpu" / name
      group.mkdir(exist_ok=True)
      self.cgroups.append(group)
      (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
      (group / "cpu.cfs_quota_us").write_text(str(quota))
    (group / "cgroup.procs").write_text(str(pid))
    return f"pid {pid} limited to {f.value:g} of a core (cgroup v{version} {group})"

  def close(self) -> list[dict]:
    """Stops applying faults, says which were never applied (due after the run ended:
    a row ``"event": "not applied"`` each), removes the cgroups made (and restores the
    root's cpu controller where the run enabled it); the rows of the faults."""
    self.cancel.set()
    for t in self.timers:
      t.cancel()
    if self.thread is not None:
      self.thread.join(5)
    if self.joined is not None:
      done = {r["fault"] for r in self.rows}
      for f in sorted(self.faults, key=lambda f: f.at):
        if f.spec not in done:
          self._log(f, self.joined, self.t0, "not applied, the run ended first (its rows still"
                    " name it in their network)", "not applied")  # fmt: skip
    remove_cgroups(f"{self.plan.tag}-")
    return self.rows


# ---- cgroups a run (or a killed run) leaves ----------------------------------------


def _enable_cpu_controller(tag: str) -> None:
  """cgroup v2: the cpu controller for the root's children (``+cpu``), noted in
  :data:`CPU_NOTES` if this run is the one that enabled it."""
  control = CGROUP / "cgroup.subtree_control"
  with contextlib.suppress(OSError):
    if "cpu" in control.read_text().split():
      return
    control.write_text("+cpu")
    CPU_NOTES.mkdir(parents=True, exist_ok=True)
    (CPU_NOTES / tag).write_text("+cpu\n")


def cgroups(prefix: str = f"{netns.PREFIX}-") -> list[Path]:
  """The cgroups (v2 under :data:`CGROUP`, v1 under its ``cpu``) whose names start with
  ``prefix``: ``arj-123-`` one cluster's, ``arj-`` every cluster's."""
  found = []
  for root in (CGROUP, CGROUP / "cpu"):
    with contextlib.suppress(OSError):
      found += [root / n for n in sorted(os.listdir(root)) if n.startswith(prefix)]
  return [g for g in found if g.is_dir()]


def remove_cgroups(prefix: str = f"{netns.PREFIX}-") -> list[str]:
  """Removes the cgroups of :func:`cgroups` (their processes moved to the parent
  first; an exiting process is waited for briefly) and, on cgroup v2, disables the cpu
  controller for the root's children where such a cluster enabled it. Returns the
  cgroups removed."""
  removed = []
  for group in cgroups(prefix):
    for _ in range(50):
      with contextlib.suppress(OSError):
        for pid in (group / "cgroup.procs").read_text().split():
          (group.parent / "cgroup.procs").write_text(pid)
      try:
        group.rmdir()
        removed.append(str(group))
        break
      except FileNotFoundError:
        break
      except OSError:
        time.sleep(0.1)
  with contextlib.suppress(OSError):
    for note in sorted(CPU_NOTES.iterdir()):  # not while any cluster's cgroups need it
      if f"{note.name}-".startswith(prefix) and not cgroups():
        with contextlib.suppress(OSError):
          (CGROUP / "cgroup.subtree_control").write_text("-cpu")
        note.unlink()
  return removed


def stale_cgroup_tags() -> list[str]:
  """Tags (``arj-PID``) of the clusters whose cgroups are left while their process is
  gone (a cluster killed, even by SIGKILL, whose watchdog could not remove them)."""
  tags = {"-".join(g.name.split("-")[:2]) for g in cgroups()}
  with contextlib.suppress(OSError):
    tags |= {n.name for n in CPU_NOTES.iterdir()}
  return sorted(t for t in tags if t.split("-")[1].isdigit() and not alive(int(t.split("-")[1])))


# ---- a row's faults, read back ----------------------------------------------------


def row_links(row: dict) -> cluster_rows.Links:
  """``(network, hosts, rate, link_rates)`` of a ``bench`` row measured on ``allreduce-jax
  cluster`` (its key's ``network``: the ``--topology`` spec, the hosts, every link's rate
  in bytes/s, and ``{host: bytes/s}`` of its ``--fault link:H=RATE@0``); None for a row of
  another machine, or with any other fault (a rate changed mid-run, a link down, a kill:
  no steady network to replay). What :func:`allreduce_jax.cluster_rows.link_rate_cells`
  takes as ``links``."""
  net = cluster_rows.network(row)
  if net is None:
    return None
  hosts = int(net["hosts"])
  link_rates = {}
  for spec in net.get("faults", []):
    f = parse(spec, hosts)
    if f.kind != "link" or f.at != 0:
      return None
    link_rates[f.host] = f.value
  return net["network"], hosts, float(net["link_Bps"]), link_rates
