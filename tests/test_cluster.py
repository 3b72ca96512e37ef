"""The emulated cluster (``allreduce-jax cluster``, :mod:`allreduce_jax.netns`).

The plan (names, links, routes) and the rate parser are checked everywhere; building
namespaces on the machine needs root, and building them rootless needs unprivileged user
namespaces, so those tests skip elsewhere with the reason. Each test that builds checks
that nothing is left behind (namespaces, host files, links; rootless: no process in the
cluster's user namespace).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from launched import says, signal_when

from allreduce_jax import distributed, netns, topology, units
from allreduce_jax.tools import cluster

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = [sys.executable, "-m", "allreduce_jax", "cluster"]


def _needs(problem, what: str):
  """A fixture that skips a test where ``problem()`` (asked once a module) says why ``what``
  cannot be built here."""

  @pytest.fixture(scope="module")
  def fixture():
    if why := problem():
      pytest.skip(f"{what}: {why}")

  return fixture


privileged = _needs(netns.root_problem, "cluster as root")
rootless = _needs(netns.rootless_problem, "rootless cluster")


@pytest.mark.parametrize(
  "text, rate",
  [("200Mbit", 25e6), ("1Gbit", 125e6), ("100kbit", 12.5e3), ("25MB/s", 25e6),
   ("1GB/s", 1e9), ("2MiB/s", 2 * 2**20), ("200Mbps", 25e6), ("0.5Gbit", 62.5e6)],
)  # fmt: skip
def test_parse_rate(text, rate):
  assert units.parse_rate(text) == pytest.approx(rate)


@pytest.mark.parametrize("text", ["", "200", "fast", "-1Mbit", "0Gbit", "3 parsecs"])
def test_parse_rate_rejects_with_one_line_naming_the_option(text):
  with pytest.raises(ValueError, match=r"^--link '.*' (has no unit|is not a)"):
    units.parse_rate(text, "--link")


def test_format_rate_round_trips_what_tc_reads():
  for text in ("200Mbit", "1Gbit", "1.5Gbit", "64kbit"):
    assert units.tc_rate(units.parse_rate(text)) == text


def test_switch_plan_one_bridge_every_host_link_shaped():
  p = netns.plan("switch", 4, 25e6, tag="arj-1")
  assert p.hosts == tuple(f"arj-1-h{i}" for i in range(4)) and p.bridges == ("arj-1-sw",)
  assert len(set(p.addresses)) == 4 and len(set(p.hostnames)) == 4
  assert all(lk.b == "arj-1-sw" and lk.b_bridge and lk.rate == 25e6 for lk in p.links)
  assert [p.host_links(i) for i in range(4)] == [["eth0"]] * 4


def test_fat_tree_plan_uplinks_carry_k_over_r_host_links():
  p = netns.plan("fat_tree:2:2", 4, 25e6, tag="arj-1")
  ups = [lk for lk in p.links if lk.b == "arj-1-spine"]
  assert [lk.a for lk in ups] == ["arj-1-leaf0", "arj-1-leaf1"]
  assert all(lk.rate == 2 * 25e6 / 2 for lk in ups)  # K·rate/R
  hosts = [lk for lk in p.links if lk.a in p.hosts]
  assert [lk.b for lk in hosts] == ["arj-1-leaf0"] * 2 + ["arj-1-leaf1"] * 2


@pytest.mark.parametrize("spec, p", [("torus:8", 8), ("torus:2x3", 6), ("torus:4x4", 16)])
def test_torus_routes_follow_the_replays_dimension_order(spec, p):
  plan = netns.plan(spec, p, 25e6, tag="arj-1")
  top = topology.parse(spec).fit(p)
  # One link per pair of neighbours, and the routes' hop counts are the replay's.
  dims = top.dims
  pairs = {frozenset((lk.a, lk.b)) for lk in plan.links}
  assert len(pairs) == len(plan.links) == sum(p if k > 2 else p // 2 for k in dims if k > 1)
  # Follow the plan's static routes (namespace, destination -> next hop) host by host.
  nxt = {
    (ns, dst): hop for ns, dst, hop, dev in plan.routes if dev == f"t{plan.addresses.index(hop)}"
  }
  assert len(nxt) == len(plan.routes) == p * (p - 1)
  for s in range(p):
    for t in range(p):
      hops, at = 0, s
      while at != t:
        at, hops = plan.addresses.index(nxt[plan.hosts[at], plan.addresses[t]]), hops + 1
        assert hops <= p
      assert hops == int(top.hops(np.array([s]), np.array([t]))[0])


@pytest.mark.parametrize(
  "spec, hosts, message",
  [("switch:2", 4, "switch:PORTS"), ("torus:4x4", 8, "has 16 nodes but --hosts is 8"),
   ("islands:8:nvlink4:ib_ndr", 8, "only switch, fat_tree"), ("ring", 4, "--topology 'ring'"),
   ("switch", 0, "--hosts must be at least 1")],
)  # fmt: skip
def test_plan_rejects_what_it_cannot_emulate_in_one_line(spec, hosts, message):
  with pytest.raises(ValueError, match=message):
    netns.plan(spec, hosts, 25e6)


def test_interface_bytes_sums_every_interface_but_loopback(tmp_path):
  for dev, sent, received in [("lo", 1000, 1000), ("eth0", 5, 7), ("eth1", 11, 13)]:
    (tmp_path / dev / "statistics").mkdir(parents=True)
    (tmp_path / dev / "statistics" / "tx_bytes").write_text(f"{sent}\n")
    (tmp_path / dev / "statistics" / "rx_bytes").write_text(f"{received}\n")
  assert netns.interface_bytes(tmp_path) == (16, 20)


def test_without_privilege_one_line_says_what_is_needed(monkeypatch, capsys):
  # Neither root nor a user namespace: one line names both ways and what each needs.
  refused = "unshare: unshare failed: Operation not permitted"
  monkeypatch.setattr(netns, "_caps", lambda: 0)
  monkeypatch.setattr(netns, "_UNSHARE_USER", ["sh", "-c", f"echo '{refused}' >&2; exit 1"])
  problem = netns.privilege_problem()
  assert "needs root" in problem and "CAP_NET_ADMIN" in problem
  assert refused in problem and "user.max_user_namespaces" in problem
  assert netns.privilege_problem(rootless=True) == netns.rootless_problem()
  args = cluster_args(["--hosts", "2", "--", "verify"])
  assert cluster.run(args) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "needs root" in err and refused in err


def test_without_root_a_cluster_is_built_rootless(rootless, monkeypatch):
  monkeypatch.setattr(netns, "_caps", lambda: 0)
  assert "needs root" in netns.privilege_problem(rootless=False)
  assert netns.privilege_problem() is None and netns.choose() == (True, None)


def test_congestion_control_problem_names_the_kernels_lists(monkeypatch, tmp_path):
  files = {"_CC": "bbr\n", "_CC_AVAILABLE": "reno bbr cubic\n", "_CC_ALLOWED": "reno bbr\n"}
  for name, text in files.items():
    (tmp_path / name).write_text(text)
    monkeypatch.setattr(netns, name, str(tmp_path / name))
  assert netns.default_congestion_control() == "bbr"
  assert netns.congestion_control_problem(None) is None
  assert netns.congestion_control_problem("reno") is None
  missing = netns.congestion_control_problem("dctcp")
  assert "--congestion-control dctcp" in missing and "has reno bbr cubic" in missing
  refused = netns.congestion_control_problem("cubic")
  assert "may use only reno bbr" in refused
  assert "tcp_allowed_congestion_control='reno bbr cubic'" in refused
  # The machine's default is what a namespace starts with: asking for it needs no write.
  (tmp_path / "_CC_ALLOWED").write_text("reno\n")
  assert netns.congestion_control_problem("bbr") is None
  assert (
    netns.plan("switch", 2, 25e6, congestion_control="cubic").describe()["congestion_control"]
    == "cubic"
  )
  assert "congestion_control" not in netns.plan("switch", 2, 25e6).describe()


def test_a_refused_congestion_control_is_one_line_before_anything_is_built(
  monkeypatch, capsys, tmp_path
):
  monkeypatch.setattr(netns, "choose", lambda rootless=None: (bool(rootless), None))
  monkeypatch.setattr(netns, "congestion_control_problem", lambda name: f"{name}: refused (test)")
  monkeypatch.setattr(netns, "up", lambda plan: pytest.fail("built a cluster"))
  assert (
    cluster.run(cluster_args(["--hosts", "2", "--congestion-control", "cubic", "--", "verify"]))
    == 1
  )
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "cubic: refused (test)" in err


def cluster_args(argv):
  from allreduce_jax.tools import dispatch

  return dispatch.subcommand_parser("cluster").parse_args(argv)


@pytest.mark.parametrize(
  "argv, message",
  [(["--hosts", "2", "--link", "fast", "--", "verify"], "--link 'fast'"),
   (["--hosts", "2", "--topology", "torus:3", "--", "verify"], "torus:3"),
   (["--hosts", "2"], "give the command to run after '--'"),
   (["--", "verify"], "--hosts N is required"),
   (["--hosts", "2", "--queue", "5", "--", "verify"], "--queue '5' is not a duration"),
   (["--hosts", "2", "--queue", "20s", "--", "verify"], "--queue must be more than 0 s and at most 10 s"),
   (["--hosts", "2", "--mtu", "100", "--", "verify"], "--mtu must be from 576 to 65535 bytes, got 100"),
   (["--hosts", "2", "--tcp-queue", "lots", "--", "verify"], "--tcp-queue 'lots' is not a size"),
   (["--hosts", "2", "--tcp-queue", "100", "--", "verify"],
    "--tcp-queue must be from 1 KiB to 1 GiB, got 100 bytes"),
   (["--hosts", "2", "--congestion-control", "Bad!", "--", "verify"],
    "--congestion-control must be a kernel's algorithm name")],
)  # fmt: skip
def test_bad_options_one_line_exit_2(argv, message, capsys):
  assert cluster.run(cluster_args(argv)) == 2
  err = capsys.readouterr().err
  assert message in err and err.count("\n") == 1


def test_up_and_down_leave_nothing_behind(privileged):
  for spec, n in (("switch", 3), ("fat_tree:2:2", 4), ("torus:2x2", 4)):
    plan = netns.plan(
      spec, n, 25e6, queue=0.002, mtu=9000, tcp_queue=32 * 1024, congestion_control="reno"
    )
    try:
      netns.up(plan)
      assert set(netns.namespaces(plan.tag + "-")) == set(plan.namespaces)
      dev = plan.host_links(0)[0]  # shaped as asked: 200 Mbit/s, a 2 ms queue (--queue)
      shown = subprocess.run(["tc", "-n", plan.hosts[0], "qdisc", "show", "dev", dev],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
      assert "tbf" in shown and "rate 200Mbit" in shown and "lat 2ms" in shown
      for ns in plan.hosts:  # every host's links carry jumbo frames (--mtu 9000)
        for dev in plan.host_links(plan.hosts.index(ns)):
          link = subprocess.run(["ip", "-n", ns, "link", "show", "dev", dev],
                                capture_output=True, text=True, check=True).stdout  # fmt: skip
          assert "mtu 9000" in link
      hosts = (netns.ETC_NETNS / plan.hosts[0] / "hosts").read_text()
      assert f"{plan.addresses[1]} {plan.hostnames[1]}" in hosts
      # A program run as host 1 sees its own host name, the TCP queue asked for
      # (--tcp-queue, the kernel's TSQ limit in its namespace), the congestion control
      # asked for (reno: every kernel has it, every namespace may use it) and the
      # network described.
      seen = subprocess.run(
        [*netns.host_argv(plan, 1), "sh", "-c", f"hostname; cat {netns._TSQ}; cat {netns._CC};"
         f' echo "${netns.ENV_NETWORK}"'], capture_output=True, text=True, check=True, timeout=30,
      ).stdout.splitlines()  # fmt: skip
      assert seen[:3] == [plan.hostnames[1], "32768", "reno"]
      assert json.loads(seen[3]) == {"network": plan.network, "hosts": n, "link_Bps": 25e6,
                                     "queue_s": 0.002, "mtu": 9000, "tcp_queue": 32768,
                                     "congestion_control": "reno"}  # fmt: skip
    finally:
      netns.down(plan.tag)
    assert netns.leftovers(plan.tag) == []


def _user_ns(plan: netns.Plan) -> str:
  """The user namespace a rootless plan is built in (its holder's, named by ``enter``)."""
  pid = next(a for a in plan.enter if a.startswith("--target=")).split("=")[1]
  return os.readlink(f"/proc/{pid}/ns/user")


def test_a_user_namespace_that_cannot_be_made_is_one_line(monkeypatch):
  monkeypatch.setattr(netns, "_HOLDER", "echo 'mount: /run: permission denied.' >&2; exit 32")
  with pytest.raises(netns.ClusterError, match=r"^cannot make a user namespace for the"
                     r" cluster: mount: /run: permission denied\.$"):  # fmt: skip
    netns.UserNamespace()


def test_rootless_builds_the_same_cluster_unseen_and_leaves_nothing(rootless, tmp_path):
  plan = netns.plan("torus:4", 4, 25e6, queue=0.002, tcp_queue=32 * 1024,
                    congestion_control="reno")  # fmt: skip
  with netns.built(plan, rootless=True) as built:
    user_ns = _user_ns(built)
    assert built.enter and built.hosts == plan.hosts
    listed = subprocess.run([*built.enter, "ip", "netns", "list"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert set(plan.namespaces) <= {line.split()[0] for line in listed.splitlines()}
    dev = plan.host_links(0)[0]
    shown = subprocess.run([*built.enter, "tc", "-n", plan.hosts[0], "qdisc", "show", "dev", dev],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "tbf" in shown and "rate 200Mbit" in shown and "lat 2ms" in shown
    # Host 1 has its name, its TCP settings, finds host 3 by name (the user namespace's
    # /etc/hosts) and reaches it through host 2 (a ring of 4: ties go forward).
    seen = subprocess.run(
      [*netns.host_argv(built, 1), "sh", "-c", f"hostname; cat {netns._TSQ}; cat {netns._CC};"
       f" getent hosts {plan.hostnames[3]}; ip route get {plan.addresses[3]}; pwd"],
      capture_output=True, text=True, check=True, timeout=30, cwd=tmp_path,
    ).stdout.splitlines()  # fmt: skip
    assert seen[:3] == [plan.hostnames[1], "32768", "reno"]
    assert seen[3].split() == [plan.addresses[3], plan.hostnames[3]]
    assert f"via {plan.addresses[2]}" in seen[4]
    assert seen[-1] == str(tmp_path)  # where it was started: relative paths stay the caller's
    counted = netns.counters(built)
    assert [c["address"] for c in counted] == list(plan.addresses)
    # Nothing of it shows on the machine: no named namespace, no host file, no link.
    assert netns.leftovers(plan.tag) == []
  assert netns.processes_in(user_ns) == []  # the kernel removed it with its last process


def test_a_failed_build_removes_what_it_built(privileged, monkeypatch):
  plan = netns.plan("switch", 2, 25e6)
  real = netns._run

  def fail_on_tc(argv):
    if argv[0] == "tc":
      raise netns.ClusterError("tc refused (test)")
    real(argv)

  monkeypatch.setattr(netns, "_run", fail_on_tc)
  with pytest.raises(netns.ClusterError, match="tc refused"):
    netns.up(plan)
  assert netns.leftovers(plan.tag) == []


def _wait_for(path: Path, text: str, wait_s: float) -> None:
  deadline = time.monotonic() + wait_s
  while not (path.exists() and text in path.read_text(errors="replace")):
    assert time.monotonic() < deadline, f"{text!r} never appeared in {path}"
    time.sleep(0.1)


def _verify_across_two_hosts(tmp_path, *options: str, env=None, python=sys.executable, wrap=None):
  counters = tmp_path / "counters.json"
  env = {**(env or os.environ), "GLOO_SOCKET_IFNAME": "eth0"}  # gloo on the interface named
  argv = [python, "-m", "allreduce_jax", "cluster", "--hosts", "2", "--link", "1Gbit", *options,
          "--counters", str(counters), "--log-dir", str(tmp_path / "logs"), "--timeout", "90",
          "--", "verify", "--algorithms", "ring,recursive_doubling", "--dtypes", "float32",
          "--ops", "sum", "--kinds", "verifiable", "--shapes", "4096"]  # fmt: skip
  res = subprocess.run(wrap(argv, env) if wrap else argv, cwd=tmp_path, capture_output=True,
                       text=True, timeout=110, env=env)  # fmt: skip
  assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
  assert "2 devices, 2 process(es)" in res.stdout and " 0 failed" in res.stdout
  assert "all 2 processes finished OK" in res.stderr
  hosts = json.loads(counters.read_text())["hosts"]
  # The sums crossed the emulated link: each host sent at least the 16 KiB it reduces.
  assert all(h["tx_bytes"] > 16 * 1024 for h in hosts)
  assert netns.leftovers(f"arj-{_cluster_pid(res.stderr)}") == []
  return res


@pytest.mark.timeout(120)
def test_verify_runs_across_a_two_host_cluster(privileged, tmp_path):
  res = _verify_across_two_hosts(tmp_path)
  assert "rootless" not in res.stderr


@pytest.mark.timeout(120)
def test_verify_runs_across_a_two_host_rootless_cluster(rootless, tmp_path):
  res = _verify_across_two_hosts(tmp_path, "--rootless")
  assert f"in a user namespace of uid {os.getuid()} (rootless)" in res.stderr


def _cluster_pid(err: str) -> str:
  line = next(x for x in err.splitlines() if "namespaces arj-" in x)
  return line.split("namespaces arj-")[1].split("-")[0]


SLEEPER = (
  "import sys, time\n"
  "from allreduce_jax import distributed\n"
  "distributed.initialize_from_env()\n"
  "import jax, socket\n"
  "print('ready', jax.process_index(), socket.gethostname(), flush=True)\n"
  "time.sleep(120)\n"
)


@pytest.mark.timeout(120)
def test_a_host_killed_mid_run_is_named_within_10_s(privileged, tmp_path):
  script = tmp_path / "sleeper.py"
  script.write_text(SLEEPER)
  logs = tmp_path / "logs"
  proc = subprocess.Popen(
    [*CLUSTER, "--hosts", "2", "--log-dir", str(logs), "--", sys.executable, str(script)],
    cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
  )  # fmt: skip
  ready = lambda: says(logs / "process-1.log", "ready 1 host1")  # noqa: E731
  _, err, elapsed = signal_when(proc, ready, logs, 1, signal.SIGKILL, within=90, wait=30)
  assert proc.returncode == 128 + signal.SIGKILL, err
  assert "cluster: process 1 of 2" in err and "was killed by SIGKILL" in err
  assert elapsed < 10, f"took {elapsed:.1f} s"
  assert netns.leftovers(f"arj-{proc.pid}") == []


def _sleeping(logs: Path, *options: str) -> subprocess.Popen:
  """``cluster --hosts 2 --topology torus:2 [options]`` of a command that sleeps, started."""
  return subprocess.Popen(
    [*CLUSTER, "--hosts", "2", "--topology", "torus:2", *options, "--log-dir", str(logs),
     "--", "sh", "-c", "echo ready; sleep 60"],
    cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
  )  # fmt: skip


def _hosts_ready(logs: Path) -> list[int]:
  """The host processes' pids, once host 1 has said it is ready."""
  _wait_for(logs / "process-1.log", "ready", 30)
  return list(json.loads((logs / "pids.json").read_text()).values())


@pytest.mark.timeout(60)
def test_sigkill_of_the_command_leaves_nothing_behind(privileged, tmp_path):
  logs = tmp_path / "logs"
  proc = _sleeping(logs)
  try:
    pids = _hosts_ready(logs)
    assert netns.leftovers(f"arj-{proc.pid}")
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 15
    while netns.leftovers(f"arj-{proc.pid}") and time.monotonic() < deadline:
      time.sleep(0.1)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()  # reap it, close its pipes: no ResourceWarning in a later test
  assert netns.leftovers(f"arj-{proc.pid}") == []
  deadline = time.monotonic() + 10
  while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not any(Path(f"/proc/{p}").exists() for p in pids)


@pytest.mark.timeout(60)
def test_sigkill_of_a_rootless_command_leaves_nothing_behind(rootless, tmp_path):
  logs = tmp_path / "logs"
  proc = _sleeping(logs, "--rootless")
  try:
    pids = _hosts_ready(logs)
    user_ns = os.readlink(f"/proc/{pids[0]}/ns/user")
    assert user_ns != os.readlink("/proc/self/ns/user")
    assert len(netns.processes_in(user_ns)) >= 3  # the holder and the two hosts
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 15
    while netns.processes_in(user_ns) and time.monotonic() < deadline:
      time.sleep(0.1)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
  # No process is left in its user namespace: the kernel has removed the namespaces,
  # links and shaping with the last one; nothing was ever named on the machine.
  assert netns.processes_in(user_ns) == []
  assert netns.leftovers(f"arj-{proc.pid}") == []


def _unprivileged(argv: list[str], env: dict) -> list[str]:
  return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
          "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]  # fmt: skip


@pytest.fixture
def nobody_python():
  """A Python that user ``nobody`` can run with this checkout's packages (this venv's,
  else the system's of the same version with the venv's packages on its path), its
  environment and a folder of its own; skips with the reason where there is none (not
  root, no ``setpriv``, a checkout or interpreter ``nobody`` cannot read)."""
  if os.geteuid() != 0 or not shutil.which("setpriv"):
    pytest.skip("needs root and setpriv to become an unprivileged user")
  site = next(Path(p) for p in sys.path if p.endswith("site-packages"))
  work = Path(tempfile.mkdtemp(prefix="arj-test-nobody-", dir="/tmp"))  # not root's TMPDIR
  env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(work),
         "PYTHONPATH": f"{site}:{ROOT}"}  # fmt: skip
  try:
    yield _nobody_python(env, work)
  finally:
    shutil.rmtree(work, ignore_errors=True)


def _nobody_python(env: dict, work: Path) -> tuple[str, dict, Path]:
  version = f"{sys.version_info.major}.{sys.version_info.minor}"
  tried = []
  found = [shutil.which(f"python{version}"), f"/usr/local/bin/python{version}"]
  for python in dict.fromkeys([sys.executable, f"/usr/bin/python{version}", *found]):
    if not (python and os.path.exists(python)):
      continue
    res = subprocess.run(_unprivileged([python, "-c", "import jax, allreduce_jax"], env),
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    if res.returncode == 0:
      os.chown(work, 65534, 65534)
      return python, env, work
    tried.append(f"{python}: {(res.stderr.strip().splitlines() or ['?'])[-1]}")
  pytest.skip(f"user nobody cannot run this checkout's Python ({'; '.join(tried)})")


@pytest.mark.timeout(120)
def test_an_unprivileged_user_runs_verify_across_a_two_host_cluster(rootless, nobody_python):
  python, env, work = nobody_python
  res = _verify_across_two_hosts(work, env=env, python=python, wrap=_unprivileged)
  # No --rootless: chosen by itself, without root.
  assert "in a user namespace of uid 65534 (rootless)" in res.stderr


def test_gloo_address_of_an_interface_and_of_a_name():
  assert distributed.gloo_address(interface="lo") == "127.0.0.1"
  assert distributed.gloo_address(hostname="127.0.0.1") == "127.0.0.1"
  with pytest.raises(distributed.AddressError, match="GLOO_SOCKET_IFNAME=nope0: no such interface"):
    distributed.gloo_address(interface="nope0")


def test_a_loopback_address_for_peers_on_other_hosts_is_one_line_error():
  # A local run (coordinator on loopback) may use loopback; a run across hosts may not.
  assert distributed.check_advertised_address("127.0.0.1:1234", hostname="localhost")
  with pytest.raises(distributed.AddressError) as e:
    distributed.check_advertised_address("10.213.0.1:1234", hostname="127.0.0.1")
  text = str(e.value)
  assert "\n" not in text and "loopback" in text and "GLOO_SOCKET_IFNAME" in text
  with pytest.raises(distributed.AddressError, match=r"GLOO_SOCKET_IFNAME=lo gives 127\.0\.0\.1"):
    distributed.check_advertised_address("10.213.0.1:1234", interface="lo")


def test_a_second_cluster_waits_for_the_first_and_says_so(tmp_path, monkeypatch):
  # Two clusters on one machine share its CPUs: the second waits (unless --concurrent).
  import fcntl
  import io
  import threading

  monkeypatch.setattr(cluster, "LOCK", tmp_path / "cluster.lock")
  held = open(cluster.LOCK, "w")
  fcntl.flock(held, fcntl.LOCK_EX)
  held.write("4242")
  held.flush()
  err, entered = io.StringIO(), threading.Event()

  def second():
    with cluster._one_at_a_time(False, err):
      entered.set()

  t = threading.Thread(target=second)
  t.start()
  time.sleep(0.5)
  assert not entered.is_set()  # still waiting while the first holds the lock
  assert "waiting for another cluster run (pid 4242)" in err.getvalue()
  fcntl.flock(held, fcntl.LOCK_UN)
  held.close()
  t.join(10)
  assert entered.is_set()
  with cluster._one_at_a_time(True, io.StringIO()):  # --concurrent never touches the lock
    pass


def test_the_reports_network_section_says_why_it_was_skipped(tmp_path, monkeypatch):
  from allreduce_jax import cli
  from allreduce_jax.tools import report

  monkeypatch.setattr(report, "_network_skip", lambda: "needs root (a test's reason)")
  out = tmp_path / "report"
  assert cli.main(["report", "--smoke", "--out", str(out), "--only", "network"]) == 0
  text = (out / "REPORT.md").read_text()
  assert "## On a real network" in text
  assert "*Skipped on this machine: needs root (a test's reason)*" in text


def test_down_removes_what_dead_runs_left_and_keeps_running_clusters(privileged, capsys):
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True).stdout.strip()  # fmt: skip
  stale = netns.plan("switch", 2, 25e6, tag=f"arj-{dead}")
  live = netns.plan("switch", 2, 25e6)  # this process's: alive
  try:
    netns.up(stale)
    netns.up(live)
    assert cluster.run(cluster_args(["down"])) == 0
    out = capsys.readouterr().out
    assert f"arj-{dead}" in out.splitlines()[0] and netns.leftovers(stale.tag) == []
    assert set(netns.namespaces(live.tag + "-")) == set(live.namespaces)
    assert "kept " in out and live.tag in out.split("kept ", 1)[1]
  finally:
    netns.down(stale.tag)
    netns.down(live.tag)
  assert netns.leftovers(live.tag) == []
