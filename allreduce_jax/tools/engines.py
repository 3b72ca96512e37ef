"""``allreduce-jax cluster --launcher mpirun|slurm``: the emulated hosts run by Open MPI or SLURM.

``--launcher builtin`` (the default) starts one process per host itself
(:func:`allreduce_jax.tools.launch.launch`). The other two hand the hosts to the engine
a cluster of real machines uses, each started inside the hosts' network namespaces:

- ``mpirun``: runs in host 0's namespace with a host file of the hosts' addresses (one
  slot each) and an rsh agent (``plm_rsh_agent``, a script written for the run) that
  starts Open MPI's daemon ``orted`` in the namespace of the host whose address it is
  given, under that host's name. ``pml ob1``, ``btl tcp,self`` and both TCP components
  pinned to the cluster's subnet, so nothing takes another path (on a torus, where a
  host's address is on its loopback device, which those components skip, the address
  also goes on one of its links). Each rank gets
  ``JAX_NUM_CPU_DEVICES`` = ``--devices-per-host``; JAX's Open MPI detection joins them.
  ``--collectives mpi`` (mpirun only) also gives each rank the MPIwrapper library, so XLA's
  collectives run over Open MPI, and TCP transport parameters that send large messages in
  32 KiB fragments rather than put them (:func:`collectives_env`; the user's ``OMPI_MCA_*``
  wins).
- ``slurm``: a private SLURM (:class:`allreduce_jax.tools.slurm_local.Slurm`) with
  ``slurmctld`` on host 0 and one ``slurmd`` per host, each in its host's network
  namespace (entered with ``nsenter --net``: ``ip netns exec`` mounts a fresh ``/sys``
  and hides the cgroup tree slurmd reads) with its host name and the cluster's
  ``/etc/hosts``; then ``srun -N H -n H -c DEVICES --kill-on-bad-exit=1`` from host 0.
  The task's CPUs (``-c``) become its emulated devices (:mod:`allreduce_jax.distributed`).

What happens when a host fails is the engine's: Open MPI ends the job when a rank
dies and names its rank and host address ("mpirun noticed that process rank 1 ... on
node 10.213.0.2 exited on signal 9"); ``srun --kill-on-bad-exit=1`` ends the step and
names the host and task ("srun: error: host1: task 1: Killed"). ``--timeout`` is
``mpirun --timeout`` (it ends the job; Open MPI does not say which rank is stuck) or,
under SLURM, cancels the step (``srun`` is interrupted twice) and says so; neither
names the stuck host as ``--launcher builtin`` does. Nothing is left behind: the
engine's processes are killed with the launcher (``PR_SET_PDEATHSIG``), the private
SLURM is torn down with every process it started, and the namespaces go as with the
builtin launcher. Root only (the SLURM daemons and the namespaces' mounts need it).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from allreduce_jax import distributed, netns
from allreduce_jax.tools import slurm_local
from allreduce_jax.tools._proc import LaunchError, command_argv, die_with_parent

LAUNCHERS = ("builtin", "mpirun", "slurm")


def problem(name: str, rootless: bool) -> str | None:
  """Why ``--launcher name`` cannot run here (one line), or None."""
  if name == "builtin":
    return None
  if rootless:
    return f"--launcher {name} needs root (its daemons run in the hosts' namespaces as root)."
  if name == "mpirun":
    if shutil.which("mpirun") is None:
      return (
        "--launcher mpirun needs Open MPI's mpirun on PATH (Debian: apt-get install openmpi-bin)."
      )
    return None
  why = slurm_local.problem()
  return f"--launcher slurm {why}" if why else None


def _run(argv: list[str], env: dict, timeout: float | None, on_timeout, err) -> int:
  """Runs the engine's front end (its output passes through), killed with this process;
  ``on_timeout(proc)`` after ``timeout`` seconds. Returns its status (128 + signal)."""
  proc = subprocess.Popen(die_with_parent(argv), env=env, start_new_session=True)
  try:
    try:
      proc.wait(timeout)
    except subprocess.TimeoutExpired:
      on_timeout(proc)
      try:
        proc.wait(15)
      except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
  finally:
    if proc.poll() is None:  # Ctrl-C, SIGTERM: the engine goes with us
      with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
      try:
        proc.wait(5)
      except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
  return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


def _agent(plan: netns.Plan, folder: Path) -> Path:
  """The rsh agent: ``AGENT ADDRESS COMMAND...`` runs the command string on that host."""
  cases = "".join(
    f'  {addr}) exec {shlex.join(netns.host_argv(plan, rank))} sh -c "$*" ;;\n'
    for rank, addr in enumerate(plan.addresses)
  )
  path = folder / "rsh-agent"
  path.write_text(
    "#!/bin/sh\n# Open MPI's rsh agent for an emulated cluster: $1 is a host's address.\n"
    f'host="$1"; shift\ncase "$host" in\n{cases}'
    '  *) echo "rsh-agent: no emulated host $host" >&2; exit 255 ;;\nesac\n'
  )
  path.chmod(0o700)
  return path


#: ``--collectives mpi``'s Open MPI parameters: large messages sent in 32 KiB fragments, not
#: put (Open MPI's default flags have ``put``, under which a pairwise exchange takes turns, and
#: its fragments are 128 KiB, under which it still half does), and a rank waiting on MPI
#: yields the CPU rather than spinning (an emulated cluster's ranks share the machine's cores;
#: spinning ones slow the exchange's two directions; see ``docs/mpi_peer.md``).
#: ``OMPI_MCA_<name>`` in the environment wins.
MPI_MCA = {
  "btl_tcp_flags": "send,inplace,need-ack,need-csum",
  "btl_tcp_max_send_size": "32768",
  "mpi_yield_when_idle": "1",
}


def collectives_env(collectives: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
  """The variables every rank needs for ``--collectives`` (the MPIwrapper library must be
  in the environment before JAX loads); for ``mpi`` also Open MPI's parameters
  :data:`MPI_MCA`, each ``OMPI_MCA_<name>`` from ``environ`` (default
  ``os.environ``) where set."""
  if collectives != "mpi":
    return {}
  environ = os.environ if environ is None else environ
  mca = {f"OMPI_MCA_{k}": environ.get(f"OMPI_MCA_{k}") or v for k, v in MPI_MCA.items()}
  return {
    distributed.ENV_COLLECTIVES: "mpi",
    distributed.ENV_MPIWRAPPER: distributed.mpiwrapper(environ),
    **mca,
  }


def mpirun_local(command: list[str], n: int, collectives: str, timeout, err) -> int:
  """``allreduce-jax launch --collectives mpi``: ``command`` as ``n`` MPI ranks on this
  machine (``mpirun -np n``, one device each); its status. Open MPI ends the job when a
  rank fails and names it; ``--timeout`` is ``mpirun --timeout``."""
  if shutil.which("mpirun") is None:
    raise LaunchError(
      "--collectives mpi runs the processes under Open MPI's mpirun, which is not on PATH"
      " (Debian: apt-get install openmpi-bin)."
    )
  argv = command_argv(list(command))
  extra = {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1", **collectives_env(collectives)}
  engine = ["mpirun", *(["--allow-run-as-root"] if os.getuid() == 0 else []), "--oversubscribe",
            "-np", str(n)]  # fmt: skip
  for k in extra:
    engine += ["-x", k]
  if timeout is not None:
    engine += ["--timeout", str(max(1, round(timeout)))]
  print(
    f"# launch: mpirun -np {n}, one device per rank, collectives over MPI", file=err, flush=True
  )
  env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
  env = {k: v for k, v in env.items() if k not in distributed.LAUNCHER_VARS}
  env.update(extra)
  return _run([*engine, *argv], env, None if timeout is None else timeout + 30,
              lambda proc: os.killpg(proc.pid, signal.SIGTERM), err)  # fmt: skip


def _address_on_a_link(plan: netns.Plan) -> None:
  """On a torus each host's address sits on its loopback device, which Open MPI's TCP
  components never use: the address goes on one of the host's links as well (``/32``,
  so no route changes), where they find it."""
  for ns, addr in zip(plan.hosts, plan.addresses):
    dev = next(lk.a_dev if lk.a == ns else lk.b_dev for lk in plan.links if ns in (lk.a, lk.b))
    subprocess.run([*plan.enter, "ip", "-n", ns, "addr", "add", f"{addr}/32", "dev", dev],
                   check=True, capture_output=True)  # fmt: skip


def mpirun(
  plan: netns.Plan, command: list[str], devices: int, timeout, err, collectives: str = "gloo"
) -> int:
  """Runs ``command`` once per host under ``mpirun`` from host 0; its status."""
  argv = command_argv(list(command))
  folder = Path(tempfile.mkdtemp(prefix="allreduce-jax-mpirun-"))
  try:
    hostfile = folder / "hosts"
    hostfile.write_text("".join(f"{a} slots=1\n" for a in plan.addresses))
    subnet = str(netns.SUBNET)
    mca = {
      "plm_rsh_agent": str(_agent(plan, folder)),
      "plm_rsh_no_tree_spawn": "1",
      "pml": "ob1",
      "btl": "tcp,self",
      "btl_tcp_if_include": subnet,
      "oob_tcp_if_include": subnet,
    }
    if plan.devices[0] == "lo":
      _address_on_a_link(plan)
    engine = ["mpirun", "--allow-run-as-root", "-np", str(len(plan.hosts)), "--hostfile",
              str(hostfile), "--map-by", "node"]  # fmt: skip
    for k, v in mca.items():
      engine += ["--mca", k, v]
    engine += ["-x", "JAX_PLATFORMS=cpu", "-x", f"JAX_NUM_CPU_DEVICES={devices}"]
    for k, v in collectives_env(collectives).items():
      engine += ["-x", f"{k}={v}"]
    if timeout is not None:
      engine += ["--timeout", str(max(1, round(timeout)))]
    print(f"# cluster: mpirun from {plan.hostnames[0]}, one rank per host", file=err, flush=True)
    # an outer MPI job's variables out; MCA parameters of the collectives and the TCP
    # transport (OMPI_MCA_coll_tuned_..., OMPI_MCA_btl_tcp_flags) reach the ranks
    env = {
      k: v
      for k, v in os.environ.items()
      if not k.startswith(("OMPI_", "PMIX_"))
      or k.startswith(("OMPI_MCA_coll", "OMPI_MCA_btl_tcp_"))
    }
    return _run(
      [*netns.host_argv(plan, 0), *engine, *argv], env, None if timeout is None else timeout + 30,
      lambda proc: os.killpg(proc.pid, signal.SIGTERM), err,
    )  # fmt: skip
  finally:
    shutil.rmtree(folder, ignore_errors=True)


def _slurm_enter(plan: netns.Plan, rank: int) -> tuple[str, ...]:
  """Runs a program as host ``rank`` for SLURM: its network namespace (``nsenter``,
  so ``/sys`` stays the machine's), its host name, the cluster's ``/etc/hosts``."""
  ns = plan.hosts[rank]
  setup = 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"'
  return ("nsenter", f"--net={netns.NETNS_DIR / ns}", "unshare", "--mount", "--uts", "--",
          "sh", "-c", setup, "sh", str(netns.ETC_NETNS / ns / "hosts"), plan.hostnames[rank])  # fmt: skip


def slurm(plan: netns.Plan, command: list[str], devices: int, timeout, err) -> int:
  """Runs ``command`` once per host as one SLURM step (``srun`` from host 0); its status."""
  argv = command_argv(list(command))
  nodes = [
    slurm_local.Node(name, addr, _slurm_enter(plan, rank))
    for rank, (name, addr) in enumerate(zip(plan.hostnames, plan.addresses))
  ]
  with slurm_local.Slurm(nodes, cpus=devices) as engine:
    hosts = len(plan.hosts)
    print(
      f"# cluster: SLURM up (slurmctld on {plan.hostnames[0]}, a slurmd on every host);"
      f" srun -N {hosts} -n {hosts} -c {devices} from {plan.hostnames[0]}",
      file=err,
      flush=True,
    )
    env = {**engine.env, "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_NUM_CPU_DEVICES", None)  # -c gives each task its devices
    srun = ["srun", "-N", str(hosts), "-n", str(hosts), "--ntasks-per-node=1", "-c",
            str(devices), "--kill-on-bad-exit=1"]  # fmt: skip

    def cancel(proc):
      print(
        f"cluster: --timeout {timeout:g} s reached: cancelling the SLURM step (srun does not"
        " say which task is stuck).",
        file=err,
        flush=True,
      )
      for _ in range(2):  # srun: a second Ctrl-C within a second cancels the step
        with contextlib.suppress(ProcessLookupError):
          os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.3)

    rc = _run([*netns.host_argv(plan, 0), *srun, *argv], env, timeout, cancel, err)
    return 124 if timeout is not None and rc in (130, 128 + signal.SIGINT) else rc


def run(
  name: str, plan: netns.Plan, command, devices: int, timeout, err=None, collectives: str = "gloo"
) -> int:
  """Runs ``command`` on every host of the built ``plan`` under launcher ``name``
  (``collectives`` ``mpi``: ``mpirun`` only)."""
  err = err or sys.stderr
  if name == "mpirun":
    return mpirun(plan, command, devices, timeout, err, collectives)
  return slurm(plan, command, devices, timeout, err)
