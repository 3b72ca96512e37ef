"""torchft's fault-tolerant data parallelism on the emulated hosts (the ``torchft`` extra).

    allreduce-jax cluster --hosts 5 -- python torchft_dp.py host --steps S --out DIR \\
        --schedule '["kill:1@40.8", ...]'

Host N (the last) runs torchft's lighthouse until a group has finished; hosts 0..N-1 are
one replica group each, with one process: the digits MLP (64-128-10, as ``train sync``'s),
16 examples a step, SGD with momentum 0.9 and learning rate 0.05, wrapped in torchft's
``Manager``, its ``DistributedDataParallel`` and ``Optimizer``, over Gloo, with its own
example's settings (Gloo's and the manager's timeout 5 s, the lighthouse's heartbeat timeout
5 s, quorum ticks of 100 ms). Each group hosts its own TCP store under the host's name: the
quorum hands every group the store address of the group it sets Gloo up with, so the address
must be one the other hosts reach (``127.0.0.1`` would send each host to its own store, where
no peer ever writes). A group's process is supervised on its host (:func:`host`): the
schedule's failures for that host are applied to it at ``t0`` + their time (``kill``:
SIGKILL; ``stop``: SIGSTOP; ``down``: the host's link down for good; the times count from
the host's first committed step, as ``cluster --fault`` counts from the hosts joining), and
the supervisor replaces a process that died, or whose committed steps stopped for
``--gloo-timeout`` + :data:`FLOOR_MARGIN_S` (counted from its first step, so that a replica
still importing torch is not replaced), by a new one (the link up again: a replacement
host) that joins the quorum and takes the weights from a peer. Every committed step is
reported with :mod:`allreduce_jax.progress`'s line format to ``DIR/progress-H-K`` (host H,
K-th process), for ``run.py torchft`` to count.

torchft's ``DistributedDataParallel`` fails an assertion when its all-reduce failed (a
peer died mid-step): its comm hook asserts that the managed future has an inner future,
and the survivor dies with the dead peer. :func:`_safe_ddp`'s hook hands the bucket back
unreduced instead; the manager has recorded the error, so ``should_commit`` drops the
step, as torchft intends.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

#: Gloo's and the manager's timeout by default (torchft's example's).
GLOO_TIMEOUT_S = 5.0
#: Seconds past Gloo's timeout without a committed step after which the supervisor
#: replaces its process.
FLOOR_MARGIN_S = 10.0
#: torchft's own example's setting: the lighthouse's heartbeat timeout.
HEARTBEAT_TIMEOUT_MS = 5000
LIGHTHOUSE_PORT = 29510
MANAGER_PORT = 29520
STORE_PORT = 29530


def _env(name: str) -> int:
  return int(os.environ[name])


def host(args) -> int:
  """This host's role: the lighthouse (the last host) or a replica group's supervisor."""
  rank, n = _env("ALLREDUCE_JAX_PROCESS_ID"), _env("ALLREDUCE_JAX_NUM_PROCESSES") - 1
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  if rank == n:  # the lighthouse, until a group has finished
    lighthouse = subprocess.Popen([Path(sys.executable).with_name("torchft_lighthouse"),
                                   "--min_replicas", "1", "--quorum_tick_ms", "100",
                                   "--join_timeout_ms", "1000",
                                   "--heartbeat_timeout_ms", str(HEARTBEAT_TIMEOUT_MS),
                                   "--bind", f"[::]:{LIGHTHOUSE_PORT}"])  # fmt: skip
    while lighthouse.poll() is None and not (out / "done").exists():
      time.sleep(0.2)
    lighthouse.kill()
    return lighthouse.wait() if not (out / "done").exists() else 0
  faults = sorted(
    (f for f in (_parse(s) for s in json.loads(args.schedule)) if f[2] % n == rank),
    key=lambda f: f[1],
  )

  def note(event: str, what: str = "") -> None:  # read back by events()
    print(f"supervisor {rank} {event} {time.time():.4f} {what}".rstrip(), flush=True)

  floor_s = args.gloo_timeout + FLOOR_MARGIN_S
  k, down, t0 = 0, False, None  # t0: the schedule's zero, this host's first committed step
  while True:
    progress = out / f"progress-{rank}-{k}"
    env = {**os.environ, "ALLREDUCE_JAX_PROGRESS": str(progress), "TORCHFT_LIGHTHOUSE":
           f"http://host{n}:{LIGHTHOUSE_PORT}"}  # fmt: skip
    child = subprocess.Popen([sys.executable, __file__, "replica", "--steps", str(args.steps),
                              "--seed", str(args.seed), "--groups", str(n), "--incarnation",
                              str(k), "--gloo-timeout", str(args.gloo_timeout),
                              *(["--stock-ddp"] if args.stock_ddp else [])], env=env)  # fmt: skip
    note("started", f"pid={child.pid} floor_s={floor_s:g}")
    last, seen, done, stepped = time.time(), 0, False, False
    while child.poll() is None:
      now = time.time()
      if t0 is not None and faults and now >= t0 + faults[0][1]:
        kind = faults.pop(0)[0]
        if kind == "kill":
          child.kill()
        elif kind == "stop":
          child.send_signal(signal.SIGSTOP)
        else:
          _link(False)
          down = True
        note("fault", kind)
      new = _read_from(progress, seen)
      seen += len(new)
      if b"step " in new:
        last, stepped = now, True
        if t0 is None:
          t0 = now
          note("clock")
      done = done or b"accuracy:" in new
      if (out / "done").exists() and not done:  # another group finished: the run is over
        child.kill()
        child.wait()
        note("ended", "run-over")
        return 0
      if now - last > floor_s and stepped and not done:  # its steps stopped for the floor
        child.kill()
        child.wait()
        note("replaced", "no-progress")
      time.sleep(0.05)
    child.wait()
    note("ended", f"code={child.returncode}")
    if down:
      _link(True)
      down = False
      note("link up")
    if child.returncode == 0 or done:
      return 0
    k += 1


def _read_from(path: Path, offset: int) -> bytes:
  try:
    with open(path, "rb") as f:
      f.seek(offset)
      return f.read()
  except OSError:
    return b""


def _parse(spec: str) -> tuple[str, float, int]:
  kind, rest = spec.split(":", 1)
  host_, at = rest.split("@", 1)
  return kind, float(at.split("+")[0]), int(host_)


def _link(up: bool) -> None:
  """This host's interfaces (all but loopback) up or down."""
  for dev in os.listdir("/sys/class/net"):
    if dev != "lo":
      subprocess.run(["ip", "link", "set", dev, "up" if up else "down"], check=False)


def replica(args) -> int:
  """One replica group's process: train until the quorum's step reaches ``--steps``."""
  import numpy as np
  import torch
  import torchft
  from torch import nn

  from allreduce_jax import progress
  from allreduce_jax.training import data

  torch.set_num_threads(1)
  rank = _env("ALLREDUCE_JAX_PROCESS_ID")
  d = data.load_digits()
  x_train, y_train = torch.from_numpy(d.x_train), torch.from_numpy(d.y_train).long()
  torch.manual_seed(args.seed)
  model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
  inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

  def state_dict():
    return {"model": model.state_dict(), "optim": inner.state_dict()}

  def load_state_dict(state):
    model.load_state_dict(state["model"])
    inner.load_state_dict(state["optim"])

  # The quorum hands every group the primary group's store address for Gloo's set-up:
  # it must be a name the other hosts reach (127.0.0.1 sends each to its own store).
  name, store_port = socket.gethostname(), STORE_PORT + rank  # ports apart on one host
  store = torch.distributed.TCPStore(name, store_port, is_master=True, wait_for_workers=False)
  pg = torchft.ProcessGroupGloo(timeout=timedelta(seconds=args.gloo_timeout))
  manager = torchft.Manager(
    pg=pg, min_replica_size=1, load_state_dict=load_state_dict, state_dict=state_dict,
    replica_id=f"host{rank}", lighthouse_addr=os.environ["TORCHFT_LIGHTHOUSE"],
    port=MANAGER_PORT + rank, hostname=name, timeout=timedelta(seconds=args.gloo_timeout),
    quorum_timeout=timedelta(seconds=30), rank=0, world_size=1,
    store_addr=name, store_port=store_port,
  )  # fmt: skip
  ddp = (
    torchft.DistributedDataParallel(manager, model) if args.stock_ddp else _safe_ddp(manager, model)
  )
  opt = torchft.Optimizer(manager, inner)
  rng = np.random.default_rng(1000 * args.seed + 17 * rank + args.incarnation)
  loss_fn = nn.CrossEntropyLoss()
  while manager.current_step() < args.steps:
    ib = torch.from_numpy(rng.integers(0, d.n_train, 16))
    opt.zero_grad()
    loss = loss_fn(ddp(x_train[ib]), y_train[ib])
    loss.backward()
    before = manager.current_step()
    opt.step()  # steps the inner optimizer only if the quorum commits
    if manager.current_step() > before:
      progress.step(manager.current_step())
    else:  # dropped: a group failed during it
      progress.mark("dropped", before)
  with torch.no_grad():
    acc = (model(torch.from_numpy(d.x_test)).argmax(-1).numpy() == d.y_test).mean()
  progress.phase(f"accuracy:{acc:.4f}")
  Path(os.environ["ALLREDUCE_JAX_PROGRESS"]).with_name("done").touch()
  manager.shutdown(wait=False)
  del store
  os._exit(0)  # torchft's threads and servers would keep the process alive


def _safe_hook(state, bucket):
  """torchft's DDP comm hook, but a failed all-reduce hands the bucket back unreduced (the
  manager has the error; the step is not committed) instead of failing an assertion."""
  import torch

  from allreduce_jax import progress

  work = state.allreduce(bucket.buffer())
  work.wait()
  fut = getattr(work.get_future(), "_fut", None)
  if fut is None:
    progress.mark("unreduced", 1)  # what the stock hook's assertion would have died of
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done
  return fut


def _safe_ddp(manager, module):
  import torchft

  class SafeDDP(torchft.DistributedDataParallel):
    _comm_hook = staticmethod(_safe_hook)

  return SafeDDP(manager, module)


def events(log: Path) -> list[tuple[int, str, float, str]]:
  """The supervisor's lines of a host's log: ``(host, event, unix, what)``."""
  out = []
  for line in Path(log).read_text(errors="replace").splitlines():
    parts = line.split(" ", 4)
    if parts[0] == "supervisor" and len(parts) >= 4:
      out.append((int(parts[1]), parts[2], float(parts[3]), parts[4] if len(parts) > 4 else ""))
  return out


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  sub = p.add_subparsers(dest="role", required=True)
  h = sub.add_parser("host")
  h.set_defaults(run=host)
  h.add_argument("--steps", type=int, required=True)
  h.add_argument("--out", required=True)
  h.add_argument("--schedule", default="[]")
  h.add_argument("--seed", type=int, default=0)
  h.add_argument("--stock-ddp", action="store_true", help="torchft's own DDP wrapper")
  h.add_argument("--gloo-timeout", type=float, default=GLOO_TIMEOUT_S)
  r = sub.add_parser("replica")
  r.set_defaults(run=replica)
  r.add_argument("--steps", type=int, required=True)
  r.add_argument("--seed", type=int, default=0)
  r.add_argument("--groups", type=int, required=True)
  r.add_argument("--incarnation", type=int, default=0)
  r.add_argument("--stock-ddp", action="store_true")
  r.add_argument("--gloo-timeout", type=float, default=GLOO_TIMEOUT_S)
  return p


if __name__ == "__main__":
  args = parser().parse_args()
  sys.exit(args.run(args))
