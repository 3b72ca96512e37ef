"""Joining a multi-process JAX runtime (``jax.distributed``) for any subcommand.

One JAX program can span several processes (hosts): gloo over TCP on CPU, NCCL on
GPU, ICI/DCN on TPU pods. Every process runs the same subcommand; ``jax.devices()``
then lists the devices of all processes and the same ``shard_map`` code spans them.

:func:`initialize_from_env` is called by ``allreduce-jax`` (``tools.dispatch.run``) before a
subcommand touches any device. It initializes when it finds, in this order:

1. the variables set by ``allreduce-jax launch`` (``ALLREDUCE_JAX_COORDINATOR``,
   ``ALLREDUCE_JAX_NUM_PROCESSES``, ``ALLREDUCE_JAX_PROCESS_ID``, optionally
   ``ALLREDUCE_JAX_LOCAL_DEVICES`` and ``ALLREDUCE_JAX_COORDINATOR_BIND``), or
   ``JAX_COORDINATOR_ADDRESS`` + ``JAX_NUM_PROCESSES`` + ``JAX_PROCESS_ID``. Of these
   three JAX reads only the first (``jax.distributed.initialize``'s default address);
   the count and the index are names some cluster launchers export, read here so that
   such a job needs no other variables. ``JAX_COORDINATOR_ADDRESS`` alone is left to
   JAX (2 and 3 below);
2. ``ALLREDUCE_JAX_DISTRIBUTED=auto``: ``jax.distributed.initialize()`` without
   arguments, which detects Cloud TPU pod slices, SLURM, Open MPI and GKE;
3. a SLURM step or an Open MPI job with more than one task (auto-detected as in 2):
   ``mpirun -np N allreduce-jax SUBCOMMAND`` and ``srun -n N allreduce-jax SUBCOMMAND``
   need no other variable.

Emulated CPU devices per process (:func:`cpu_devices_from_env`): ``ALLREDUCE_JAX_LOCAL_DEVICES``,
else JAX's own ``JAX_NUM_CPU_DEVICES`` (``mpirun -x JAX_NUM_CPU_DEVICES=2``; ``srun`` passes
the caller's environment), else in a SLURM step the task's CPUs (``srun -c 2``:
``SLURM_CPUS_PER_TASK``), else 1. JAX's SLURM detection pins each process to device
``SLURM_LOCALID`` (``local_device_ids``, jax#16788); on CPU this module passes every
emulated device instead (the pin names only CUDA/ROCm devices, so the CPU count is what
counts), and on GPU ``JAX_LOCAL_DEVICE_IDS`` (read by JAX) or
``ALLREDUCE_JAX_LOCAL_DEVICE_IDS`` overrides it.

``ALLREDUCE_JAX_DISTRIBUTED=off`` disables all of this. Nothing happens at import.

``ALLREDUCE_JAX_COLLECTIVES=mpi`` (``launch|cluster --collectives mpi`` set it) runs XLA's
CPU collectives over MPI instead of gloo: jaxlib's bundled MPItrampoline forwards them to
the MPIwrapper library ``MPITRAMPOLINE_LIB`` names (:func:`mpiwrapper`; it must be in the
environment before JAX loads), one device per process, the processes MPI ranks (``mpirun``).

Which address gloo tells its peers: JAX builds gloo's TCP device with no interface
and no host name, so gloo resolves this machine's host name (``gethostname`` then
``getaddrinfo``, the first address it can bind). Where the name resolves to a
loopback address (Debian's ``127.0.1.1``, containers sharing one name) every peer
would be told ``127.x`` and fail with "Connection refused". ``GLOO_SOCKET_IFNAME``
(torch's name: the interface, e.g. ``eth0``) or ``ALLREDUCE_JAX_ADDRESS`` (a host
name or IP address of this host) choose it instead; and a process of a run whose
coordinator is not on loopback stops with one line (:class:`AddressError`) before
it would advertise a loopback address.

A user script joins the same way as the subcommands::

    from allreduce_jax import distributed
    distributed.initialize_from_env()   # before any JAX work; False when not launched
    import jax                          # jax.devices() now spans every process

and runs under ``allreduce-jax launch -n 4 -- python script.py`` or
``allreduce-jax cluster --hosts 4 -- python script.py``.

Once it has joined a run, :func:`initialize_from_env` also makes the process fail
fast (:func:`exit_fast_on_error`): an uncaught exception prints its traceback and
exits with status 1 at once, instead of waiting in JAX's shutdown barrier for peers
that are blocked in a collective with it (300 s by default), so the process that
failed first is the one a launcher sees fail. ``SIGUSR1`` prints every thread's
Python stack (``faulthandler``), which ``allreduce-jax launch --timeout`` uses to say
which process is stuck.
"""

from __future__ import annotations

import atexit
import errno
import faulthandler
import fcntl
import functools
import ipaddress
import os
import signal
import socket
import struct
import sys
import traceback
from collections.abc import Mapping, Sequence

import jax
from jax._src import distributed as jax_distributed
from jax._src import xla_bridge
from jax._src.lib import _jax

from allreduce_jax import progress

ENV_COORDINATOR = "ALLREDUCE_JAX_COORDINATOR"
ENV_COORDINATOR_BIND = "ALLREDUCE_JAX_COORDINATOR_BIND"
ENV_NUM_PROCESSES = "ALLREDUCE_JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "ALLREDUCE_JAX_PROCESS_ID"
ENV_LOCAL_DEVICES = "ALLREDUCE_JAX_LOCAL_DEVICES"
ENV_LOCAL_DEVICE_IDS = "ALLREDUCE_JAX_LOCAL_DEVICE_IDS"
ENV_INIT_TIMEOUT = "ALLREDUCE_JAX_INIT_TIMEOUT"
ENV_HEARTBEAT_TIMEOUT = "ALLREDUCE_JAX_HEARTBEAT_TIMEOUT"
ENV_SHUTDOWN_TIMEOUT = "ALLREDUCE_JAX_SHUTDOWN_TIMEOUT"
ENV_MODE = "ALLREDUCE_JAX_DISTRIBUTED"
ENV_GLOO_IFNAME = "GLOO_SOCKET_IFNAME"
ENV_ADDRESS = "ALLREDUCE_JAX_ADDRESS"
ENV_COLLECTIVES = "ALLREDUCE_JAX_COLLECTIVES"
ENV_MPIWRAPPER = "MPITRAMPOLINE_LIB"  # read by MPItrampoline, which jaxlib bundles

#: ``--collectives``: what moves the data between processes on CPU.
COLLECTIVES = ("gloo", "mpi")
#: Where ``experiments/mpi_peer/build_mpiwrapper.sh`` installs MPIwrapper (a checkout's ``build/``).
MPIWRAPPER_BUILT = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build", "mpiwrapper", "lib",
  "libmpiwrapper.so",
)  # fmt: skip
BUILD_MPIWRAPPER = "bash experiments/mpi_peer/build_mpiwrapper.sh"

LAUNCHER_VARS = (
  ENV_COORDINATOR,
  ENV_COORDINATOR_BIND,
  ENV_NUM_PROCESSES,
  ENV_PROCESS_ID,
  ENV_LOCAL_DEVICES,
  ENV_LOCAL_DEVICE_IDS,
  ENV_INIT_TIMEOUT,
  ENV_HEARTBEAT_TIMEOUT,
  ENV_SHUTDOWN_TIMEOUT,
)


class CoordinatorError(RuntimeError):
  """The coordinator service cannot start (its port is taken, or the address is not
  one of this machine's); the message names the address and what to change."""


def _int_env(env: Mapping[str, str], name: str, minimum: int = 0) -> int | None:
  text = env.get(name)
  if text is None or text.strip() == "":
    return None
  try:
    value = int(text)
  except ValueError:
    raise ValueError(f"environment variable {name}={text!r} is not an integer.") from None
  if value < minimum:
    raise ValueError(f"environment variable {name}={text!r} must be at least {minimum}.")
  return value


def _check_address(address: str, what: str) -> None:
  host, sep, port = address.rpartition(":")
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(f"{what}={address!r} must be HOST:PORT with a port in 1..65535.")


def check_coordinator_port(bind_address: str, what: str = "coordinator") -> None:
  """Raises :class:`CoordinatorError` if the coordinator could not listen on
  ``bind_address`` (``HOST:PORT``) right now.

  JAX's coordinator service crashes the process (SIGSEGV) when its port is taken,
  so process 0 checks first and fails with a message instead.
  """
  host, _, port = bind_address.rpartition(":")
  host = host.strip("[]")
  family = socket.AF_INET6 if ":" in host else socket.AF_INET
  try:
    infos = socket.getaddrinfo(host or None, int(port), family, socket.SOCK_STREAM)
  except OSError as e:
    raise CoordinatorError(f"{what} {bind_address}: cannot resolve {host!r} ({e}).") from None
  problem = listen_problem(
    f"{what} {bind_address}", family, infos[0][4],
    in_use="pick another port (another run may still be using it).",
    elsewhere=f"process 0 runs the coordinator, so the address must be one of its own (set"
    f" {ENV_COORDINATOR_BIND} to e.g. 0.0.0.0:PORT to listen on every interface).",
  )  # fmt: skip
  if problem is not None:
    raise CoordinatorError(problem)


class AddressError(CoordinatorError):
  """This process would advertise an address its peers cannot reach (loopback in a
  run across hosts), or the interface / address chosen for gloo is not this host's."""


def _iface_ipv4(name: str) -> str | None:
  """The IPv4 address of interface ``name`` (SIOCGIFADDR), None if it has none."""
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    try:
      packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
    except OSError:
      return None
  return socket.inet_ntoa(packed[20:24])


def gloo_address(interface: str | None = None, hostname: str | None = None) -> str:
  """The address gloo's TCP transport will listen on and advertise, chosen as gloo
  chooses it (``gloo/transport/tcp/device.cc``): the interface's address if one is
  named, else the first address of ``hostname`` (default: this machine's host name)
  that a socket can bind. ``AddressError`` when there is none."""
  if interface:
    address = _iface_ipv4(interface)
    if address is None:
      raise AddressError(
        f"{ENV_GLOO_IFNAME}={interface}: no such interface with an IPv4 address on this host"
        f" (its interfaces: {', '.join(n for _, n in socket.if_nameindex())})."
      )
    return address
  name = hostname or socket.gethostname()
  try:
    infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
  except OSError as e:
    raise AddressError(
      f"gloo advertises the address of this host's name {name!r}, which does not resolve"
      f" ({e.strerror or e}); set {ENV_GLOO_IFNAME} to an interface or {ENV_ADDRESS} to"
      " this host's address."
    ) from None
  for family, _, _, _, sockaddr in infos:
    if bind_error(family, (sockaddr[0], 0)) is None:
      return sockaddr[0]
  raise AddressError(
    f"{ENV_ADDRESS if hostname else 'this host name'}={name!r} resolves to"
    f" {', '.join(sorted({i[4][0] for i in infos}))}, none of them this host's; set"
    f" {ENV_GLOO_IFNAME} or {ENV_ADDRESS} to one of its own."
  )


def check_advertised_address(
  coordinator_address: str, interface: str | None = None, hostname: str | None = None
) -> str:
  """Returns the address gloo will advertise; raises :class:`AddressError` (one line)
  when it is loopback while the coordinator is not (peers on other hosts would be
  told 127.x and fail with "Connection refused")."""
  address = gloo_address(interface, hostname)
  if ipaddress.ip_address(address.split("%")[0]).is_loopback and not _is_loopback(
    coordinator_address
  ):
    how = (
      f"{ENV_GLOO_IFNAME}={interface}" if interface
      else f"{ENV_ADDRESS}={hostname}" if hostname
      else f"this host's name {socket.gethostname()!r}"
    )  # fmt: skip
    raise AddressError(
      f"{how} gives {address}, a loopback address, which gloo would advertise to peers on"
      f" other hosts (coordinator {coordinator_address}); set {ENV_GLOO_IFNAME} to the"
      f" interface that reaches them (e.g. eth0) or {ENV_ADDRESS} to this host's address."
    )
  return address


def _use_gloo_address(interface: str | None, hostname: str | None) -> None:
  """Makes JAX's CPU client use gloo collectives on ``interface`` / ``hostname``
  (JAX itself passes neither). Call after ``jax.distributed.initialize`` and before
  the CPU backend starts."""

  collectives = _jax.make_gloo_tcp_collectives(
    distributed_client=jax_distributed.global_state.client,
    hostname=hostname or None,
    interface=interface or None,
  )
  current = xla_bridge._backend_factories["cpu"]
  xla_bridge.register_backend_factory(
    "cpu",
    functools.partial(xla_bridge.make_cpu_client, collectives=collectives),
    priority=current.priority,
    fail_quietly=current.fail_quietly,
    experimental=current.experimental,
  )


def bind_error(family: socket.AddressFamily, address: tuple) -> OSError | None:
  """Why a TCP server could not bind ``address`` right now (``None`` if it could):
  binds a socket of ``family`` with ``SO_REUSEADDR``, as a listener would, and closes it."""
  with socket.socket(family, socket.SOCK_STREAM) as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      s.bind(address)
    except OSError as e:
      return e
  return None


def listen_problem(
  what: str, family: socket.AddressFamily, address: tuple, *, in_use: str, elsewhere: str
) -> str | None:
  """Why a coordinator could not listen on ``address`` right now (:func:`bind_error`), in
  one line that starts with ``what`` and ends with the caller's fix: ``in_use`` where the
  port is taken, ``elsewhere`` where the address is not this machine's; ``None`` if it could.

  Example:
    >>> import socket
    >>> with socket.socket() as s:
    ...   s.bind(("127.0.0.1", 0))
    ...   s.listen()
    ...   port = s.getsockname()[1]
    ...   problem = listen_problem("here", socket.AF_INET, ("127.0.0.1", port),
    ...                            in_use="pick another.", elsewhere="use this host's.")
    >>> problem == f"here: port {port} is already in use on this machine; pick another."
    True
  """
  e = bind_error(family, address)
  if e is None:
    return None
  if e.errno == errno.EADDRINUSE:
    return f"{what}: port {address[1]} is already in use on this machine; {in_use}"
  return f"{what}: cannot listen there ({e.strerror}); {elsewhere}"


def _is_loopback(address: str) -> bool:
  host = address.rpartition(":")[0].strip("[]")
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:  # a host name
    return False


def _program() -> str:
  name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
  return "allreduce-jax" if name in ("", "-c", "__main__.py") else name


#: The status of a non-zero ``sys.exit`` / ``SystemExit`` on its way out (see
#: :func:`exit_fast_on_error`); None while none is pending.
_failing_exit: int | None = None


def note_exit(code) -> None:
  """Records that this process is leaving with ``SystemExit(code)``: a non-zero status
  then ends it at once at exit (:func:`exit_fast_on_error`), not after JAX's barrier."""
  global _failing_exit
  status = code if isinstance(code, int) else (0 if code is None else 1)
  _failing_exit = status or None


def _exit_now_if_failing() -> None:  # an atexit handler, run before JAX's own
  if _failing_exit is None:
    return
  _say_exiting(_failing_exit)
  _flush_and_exit(_failing_exit)


def _say_exiting(code: int) -> None:
  print(
    f"{_program()}: exiting at once (status {code}) without waiting in"
    " jax.distributed's shutdown barrier",
    file=sys.stderr,
  )


def _flush_and_exit(code: int) -> None:
  """Flushes stdout and stderr and ends the process with ``code`` at once (no atexit
  handlers, so not JAX's shutdown barrier)."""
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except Exception:  # pragma: no cover
      pass
  os._exit(code)


def exit_fast_on_error() -> None:
  """Makes an uncaught exception or a non-zero exit end this process at once.

  After ``jax.distributed.initialize`` a normal exit runs JAX's shutdown barrier,
  which waits (``shutdown_timeout``, 300 s by default) for every other process, and
  those may be blocked in a collective waiting for this one: the run then hangs
  until the timeout aborts them all, and the failure looks like theirs. Instead the
  traceback is printed, output flushed and the process leaves with ``os._exit(1)``
  (130 for Ctrl-C). A non-zero ``sys.exit(n)`` (and a ``SystemExit`` leaving the
  ``allreduce-jax`` command) likewise ends with ``os._exit(n)`` once ``finally``
  blocks have run (an ``atexit`` handler that runs before JAX's); ``sys.exit(0)``
  still shuts down normally.
  """
  global _failing_exit
  _failing_exit = None
  if not getattr(sys.exit, "_allreduce_jax", False):
    real_exit = sys.exit

    def exit(code=None):
      note_exit(code)
      real_exit(code)

    exit._allreduce_jax = True
    sys.exit = exit
  atexit.unregister(_exit_now_if_failing)
  atexit.register(_exit_now_if_failing)  # after JAX's clean_up, so it runs first
  previous = sys.excepthook

  def hook(kind, value, tb):
    try:
      if issubclass(kind, KeyboardInterrupt):
        code = 130
      else:
        code = 1
      (previous if previous is not hook else sys.__excepthook__)(kind, value, tb)
      _say_exiting(code)
    except Exception:  # pragma: no cover - printing must not stop the exit
      traceback.print_exception(kind, value, tb)
      code = 1
    _flush_and_exit(code)

  sys.excepthook = hook
  try:  # a stack dump on demand, for a launcher's --timeout report
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
  except (AttributeError, ValueError, RuntimeError):  # pragma: no cover - no SIGUSR1 / not main
    pass


def mpiwrapper(env: Mapping[str, str] | None = None) -> str:
  """The MPIwrapper library ``--collectives mpi`` hands to jaxlib's MPItrampoline:
  ``$MPITRAMPOLINE_LIB``, else the one ``experiments/mpi_peer/build_mpiwrapper.sh`` built.

  Raises:
    ValueError: there is none (one line naming ``--collectives`` and the build command).
  """
  env = os.environ if env is None else env
  path = env.get(ENV_MPIWRAPPER, "").strip()
  if path and not os.path.isfile(path):
    raise ValueError(
      f"--collectives mpi: {ENV_MPIWRAPPER}={path!r} is not a file (unset it to use the one"
      f" `{BUILD_MPIWRAPPER}` builds)."
    )
  if not path and not os.path.isfile(MPIWRAPPER_BUILT):
    raise ValueError(
      "--collectives mpi needs MPIwrapper built against the local MPI: run"
      f" `{BUILD_MPIWRAPPER}` (or set {ENV_MPIWRAPPER} to a libmpiwrapper.so)."
    )
  return path or MPIWRAPPER_BUILT


def check_collectives(collectives: str, devices: int, devices_flag: str) -> None:
  """Raises ValueError (one line) when ``--collectives`` cannot run with ``devices``
  devices per process (``devices_flag``: the option that set them) or MPI is missing."""
  if collectives not in COLLECTIVES:
    raise ValueError(f"--collectives must be one of {', '.join(COLLECTIVES)}, got {collectives!r}.")
  if collectives != "mpi":
    return
  if devices != 1:
    raise ValueError(
      f"--collectives mpi runs one device per process (XLA's MPI collectives, xla#16430):"
      f" {devices_flag} must be 1, got {devices}."
    )
  mpiwrapper()


def _finalize_mpi() -> None:  # an atexit handler, run before JAX's own MPI_Finalize
  """Leaves a run joined over MPI. XLA frees its MPI communicators with the CPU client,
  after JAX's atexit ``MPI_Finalize``, and Open MPI then aborts the process
  ("MPI_Comm_free() ... called after MPI_FINALIZE"): so leave JAX's runtime, finalize
  MPI here and end the process before those destructors run."""
  code = _failing_exit or 0
  if not code:
    try:
      jax.distributed.shutdown()
    except Exception:  # pragma: no cover - a peer gone before the barrier
      traceback.print_exc()
      code = 1
  _jax.make_mpi_collectives().Finalize()  # MPI_Finalize: the object holds no communicator
  _flush_and_exit(code)


def initialize(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  *,
  local_devices: int | None = None,
  local_device_ids: Sequence[int] | None = None,
  coordinator_bind_address: str | None = None,
  initialization_timeout: int = 300,
  heartbeat_timeout: int | None = None,
  shutdown_timeout: int | None = None,
  gloo_interface: str | None = None,
  gloo_hostname: str | None = None,
  collectives: str = "gloo",
) -> None:
  """Joins this process to a ``jax.distributed`` runtime. Call before any JAX work.

  With ``coordinator_address``, ``num_processes`` and ``process_id`` all given the
  cluster is explicit; with any of them ``None``, JAX detects it (TPU pod slice,
  SLURM, Open MPI, GKE). CPU collectives across processes use gloo.

  Args:
    coordinator_address: ``HOST:PORT`` of process 0's coordinator service.
    num_processes: how many processes take part.
    process_id: this process's index, ``0 <= process_id < num_processes``.
    local_devices: emulated CPU devices in this process (CPU backend only).
    local_device_ids: the accelerators this process uses (GPU), as in JAX.
    coordinator_bind_address: where process 0's service listens. Default: for a
      loopback ``coordinator_address`` (``127.0.0.1``, ``localhost``, ``::1``) that
      address itself, so a local run is not reachable from other hosts; otherwise
      JAX's default, every interface (other hosts must reach it, and a host name
      may resolve to 127.0.1.1 locally).
    initialization_timeout: seconds to wait for all processes to connect.
    heartbeat_timeout: seconds without a heartbeat after which a process counts as
      dead (JAX's default 100 when None).
    shutdown_timeout: seconds a finishing process waits for the others in the
      shutdown barrier (JAX's default 300 when None).
    gloo_interface: the network interface gloo's CPU collectives use and advertise
      (``GLOO_SOCKET_IFNAME``); default: the address of this host's name.
    gloo_hostname: the host name or address gloo uses instead (``ALLREDUCE_JAX_ADDRESS``).
    collectives: what moves the data between processes on CPU: ``gloo`` (TCP, through
      the coordinator) or ``mpi`` (XLA's MPI collectives through jaxlib's MPItrampoline
      and :func:`mpiwrapper`; the processes must be MPI ranks, one device each).

  Raises:
    ValueError: malformed or inconsistent arguments.
    CoordinatorError: process 0 cannot listen on the coordinator's address (port
      in use, or not this machine's address).
    AddressError: gloo would advertise a loopback address to peers on other hosts,
      or ``gloo_interface`` / ``gloo_hostname`` is not this host's.
    RuntimeError: called after the JAX backend started.
  """

  if jax.distributed.is_initialized():
    return
  if coordinator_address is not None:
    _check_address(coordinator_address, "coordinator_address")
  if coordinator_bind_address is not None:
    _check_address(coordinator_bind_address, "coordinator_bind_address")
  if num_processes is not None and num_processes < 1:
    raise ValueError(f"num_processes={num_processes} must be at least 1.")
  if process_id is not None and num_processes is not None and not 0 <= process_id < num_processes:
    raise ValueError(f"process_id={process_id} must be in 0..{num_processes - 1}.")
  if local_devices is not None:
    if local_devices < 1:
      raise ValueError(f"local_devices={local_devices} must be at least 1.")
    jax.config.update("jax_num_cpu_devices", local_devices)
  if collectives == "mpi":
    check_collectives(
      "mpi",
      local_devices or max(1, jax.config.jax_num_cpu_devices),
      "the devices per process (--local-devices, --devices-per-host)",
    )
    if not os.environ.get(ENV_MPIWRAPPER, "").strip():  # jaxlib read it when it loaded
      raise ValueError(
        f"--collectives mpi: {ENV_MPIWRAPPER} must be in each process's environment before"
        f" JAX loads (launch and cluster set it; under mpirun: -x {ENV_MPIWRAPPER}={mpiwrapper()})."
      )
    jax.config.update("jax_cpu_collectives_implementation", "mpi")
  elif collectives != "gloo":
    raise ValueError(f"--collectives must be one of {', '.join(COLLECTIVES)}, got {collectives!r}.")
  if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  explicit = None not in (coordinator_address, num_processes, process_id)
  if not explicit and local_device_ids is None and _on_cpu():
    # JAX's SLURM (and Open MPI) detection would pin this process to device
    # [SLURM_LOCALID] (jax#16788); that names CUDA/ROCm devices only, so on CPU keep
    # every emulated device, as its count says.
    local_device_ids = list(range(max(1, jax.config.jax_num_cpu_devices)))
  if explicit and coordinator_bind_address is None and _is_loopback(coordinator_address):
    coordinator_bind_address = coordinator_address  # a local run: not every interface
  if explicit and process_id == 0 and num_processes > 1:
    port = coordinator_address.rpartition(":")[2]
    check_coordinator_port(coordinator_bind_address or f"0.0.0.0:{port}")
  gloo = jax.config.jax_cpu_collectives_implementation == "gloo"
  if gloo and explicit and num_processes > 1:
    check_advertised_address(coordinator_address, gloo_interface, gloo_hostname)
  timeouts = {}
  if heartbeat_timeout is not None:
    timeouts["heartbeat_timeout_seconds"] = int(heartbeat_timeout)
  if shutdown_timeout is not None:
    timeouts["shutdown_timeout_seconds"] = int(shutdown_timeout)
  jax.distributed.initialize(
    # All three given: skip cluster detection, so that e.g. a SLURM allocation
    # around a local launcher does not change this process's devices.
    cluster_detection_method="deactivate" if explicit else None,
    coordinator_address=coordinator_address,
    num_processes=num_processes,
    process_id=process_id,
    local_device_ids=list(local_device_ids) if local_device_ids is not None else None,
    coordinator_bind_address=coordinator_bind_address,
    initialization_timeout=initialization_timeout,
    **timeouts,
  )
  if gloo and (gloo_interface or gloo_hostname):
    _use_gloo_address(gloo_interface, gloo_hostname)
  if collectives == "mpi":
    jax.devices()  # the CPU client now: it calls MPI_Init and registers JAX's MPI_Finalize
    atexit.register(_finalize_mpi)  # so this one runs before it


def _on_cpu() -> bool:
  """True when JAX is told to run on CPU only (``JAX_PLATFORMS=cpu``)."""
  return (jax.config.jax_platforms or "").strip().lower() == "cpu"


def _slurm_or_mpi_tasks(env: Mapping[str, str]) -> int:
  """Tasks in this SLURM step / Open MPI job (0 when neither is present)."""
  if "SLURM_JOB_ID" in env and "SLURM_PROCID" in env:
    for name in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
      n = _int_env(env, name, minimum=1)
      if n is not None:
        return n
  if "OMPI_COMM_WORLD_SIZE" in env:
    return _int_env(env, "OMPI_COMM_WORLD_SIZE", minimum=1) or 0
  return 0


def cpu_devices_from_env(env: Mapping[str, str]) -> int | None:
  """Emulated CPU devices for a process that JAX's cluster detection joins (SLURM,
  Open MPI), where the launcher did not say (``ALLREDUCE_JAX_LOCAL_DEVICES``): None
  when ``JAX_NUM_CPU_DEVICES`` is set (JAX applies it itself), else in a SLURM step
  the task's CPUs (``srun -c K``: ``SLURM_CPUS_PER_TASK``), else None (JAX's 1)."""
  if env.get("JAX_NUM_CPU_DEVICES", "").strip():
    return None
  if "SLURM_JOB_ID" in env and "SLURM_PROCID" in env:
    return _int_env(env, "SLURM_CPUS_PER_TASK", 1)
  return None


def _collectives_from_env(env: Mapping[str, str]) -> str:
  """``$ALLREDUCE_JAX_COLLECTIVES`` (default gloo), a ``ValueError`` naming it if it is
  none of :data:`COLLECTIVES`."""
  collectives = env.get(ENV_COLLECTIVES, "").strip().lower() or "gloo"
  if collectives not in COLLECTIVES:
    raise ValueError(
      f"environment variable {ENV_COLLECTIVES}={collectives!r} must be one of"
      f" {', '.join(COLLECTIVES)}."
    )
  return collectives


#: The variables that make an explicit cluster (with a coordinator address).
_EXPLICIT = (ENV_NUM_PROCESSES, ENV_PROCESS_ID, "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def initialize_from_env(env: Mapping[str, str] | None = None) -> bool:
  """Initializes ``jax.distributed`` if the environment asks for it (see the module
  docstring). Returns True when this process is now part of a multi-process run.

  Raises:
    ValueError: a malformed variable, named in the message.
  """
  env = os.environ if env is None else env
  collectives = _collectives_from_env(env)  # checked in one process too: never ignored
  mode = env.get(ENV_MODE, "").strip().lower()
  if mode not in ("", "auto", "off", "0", "1", "on"):
    raise ValueError(f"environment variable {ENV_MODE}={mode!r} must be 'auto' or 'off'.")
  if mode in ("off", "0"):
    return False
  coordinator = env.get(ENV_COORDINATOR)
  if not coordinator and any(env.get(k, "").strip() for k in _EXPLICIT):
    coordinator = env.get("JAX_COORDINATOR_ADDRESS")  # else JAX reads it (auto-detection)
  num = _int_env(env, ENV_NUM_PROCESSES, 1)
  if num is None:
    num = _int_env(env, "JAX_NUM_PROCESSES", 1)
  pid = _int_env(env, ENV_PROCESS_ID)
  if pid is None:
    pid = _int_env(env, "JAX_PROCESS_ID")
  explicit = (coordinator, num, pid)
  if any(v is not None for v in explicit) and mode not in ("auto", "on", "1"):
    if None in explicit:
      raise ValueError(
        f"an explicit cluster needs {ENV_COORDINATOR}, {ENV_NUM_PROCESSES} and"
        f" {ENV_PROCESS_ID} (or JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and"
        f" JAX_PROCESS_ID) together; got coordinator={coordinator!r},"
        f" num_processes={num}, process_id={pid}."
      )
  elif mode not in ("auto", "on", "1") and _slurm_or_mpi_tasks(env) <= 1:
    return False
  local_devices = _int_env(env, ENV_LOCAL_DEVICES, 1)
  if local_devices is None and None in explicit:
    local_devices = cpu_devices_from_env(env)
  ids_text = env.get(ENV_LOCAL_DEVICE_IDS, "").strip()
  try:
    ids = [int(s) for s in ids_text.split(",")] if ids_text else None
  except ValueError:
    raise ValueError(
      f"environment variable {ENV_LOCAL_DEVICE_IDS}={ids_text!r} must be comma-separated integers."
    ) from None
  if collectives == "mpi" and local_devices is None:
    local_devices = _int_env(env, "JAX_NUM_CPU_DEVICES", 1)
  progress.phase("joining")  # a launcher's watchdog: the imports are done
  initialize(
    coordinator,
    num,
    pid,
    local_devices=local_devices,
    local_device_ids=ids,
    coordinator_bind_address=env.get(ENV_COORDINATOR_BIND) or None,
    initialization_timeout=_int_env(env, ENV_INIT_TIMEOUT, 1) or 300,
    heartbeat_timeout=_int_env(env, ENV_HEARTBEAT_TIMEOUT, 1),
    shutdown_timeout=_int_env(env, ENV_SHUTDOWN_TIMEOUT, 1),
    gloo_interface=env.get(ENV_GLOO_IFNAME, "").strip() or None,
    gloo_hostname=env.get(ENV_ADDRESS, "").strip() or None,
    collectives=collectives,
  )
  exit_fast_on_error()
  if env.get("JAX_COMPILATION_CACHE_DIR"):
    write_cache_from_every_process()
  progress.install_spin()
  progress.watch_compiles()
  progress.phase("joined")
  return True


def write_cache_from_every_process() -> bool:
  """Lets every process of this run write JAX's persistent compilation cache, not process
  0 alone; returns whether it could.

  JAX writes cache entries from process 0 only, so that many hosts do not write one entry
  to a shared store at once (``jax._src.compiler._cache_write``). On CPU each process's
  cache key differs (it hashes the topology of the process's own devices), so the other
  processes never find an entry and compile again in every restart. A launcher that gives
  its processes a cache folder (``launch|cluster --restarts``) has them write their own
  entries: each is written under its own key, by one process. Where JAX has changed that
  function, nothing is done.
  """
  from jax._src import compiler

  write = getattr(compiler, "_cache_write", None)
  state = getattr(jax_distributed, "global_state", None)
  if write is None or getattr(write, "_every_process", False) or state is None:
    return write is not None and getattr(write, "_every_process", False)

  def every_process_writes(*args, **kwargs):
    pid = state.process_id
    state.process_id = 0  # the only check _cache_write makes of it
    try:
      return write(*args, **kwargs)
    finally:
      state.process_id = pid

  every_process_writes._every_process = True
  compiler._cache_write = every_process_writes
  return True


def main_guard(argv0: str = "allreduce-jax") -> None:
  """Initializes from the environment, turning a bad variable into a clean exit."""
  try:
    initialize_from_env()
  except ValueError as e:
    print(f"{argv0}: {e}", file=sys.stderr)
    raise SystemExit(2) from None
  except CoordinatorError as e:
    print(f"{argv0}: {e}", file=sys.stderr)
    raise SystemExit(1) from None
  except Exception as e:  # JaxRuntimeError from the coordinator service or client
    address = os.environ.get(ENV_COORDINATOR_BIND) or os.environ.get(ENV_COORDINATOR)
    hint = ""
    if "Failed to start RPC server" in str(e) and address:
      hint = f" (is the coordinator port of {address} already in use?)"
    print(f"{argv0}: jax.distributed.initialize failed: {e}{hint}", file=sys.stderr)
    raise SystemExit(1) from None
