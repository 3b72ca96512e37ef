"""One cell of the overlap study, measured on every host of an emulated cluster.

    allreduce-jax cluster --hosts 2 --topology switch --link 200Mbit -- \\
        python experiments/overlap/measure.py --algorithm ring,psum,two_shot:int8 --run 0

Every host (one process, one CPU device) trains the same MLP on its own batch and times,
round robin over trials, each way of computing the all-reduced gradient
(:data:`VARIANTS`): the fused gradient alone (``compute``, the fastest way this machine
computes it, one program), the forward pass alone, the buckets' all-reduces alone
(``comm``), the backward stages alone (``stages``), today's step (``after``: the fused
gradient, then every bucket), and the overlapped step of
:func:`allreduce_jax.overlap.value_and_grad` with each mechanism (``streams``,
``thread``, ``one_program``). A trial starts after a barrier and ends when this host's
result is ready; its time is the slowest host's. For the programs of the split variants
every host records when each was dispatched and when its result was ready (a thread per
program waits for it), on the machine's monotonic clock, which every emulated host
shares: the timeline. Process 0 appends one row per variant to ``--out``. Several
all-reduces (``--algorithm``, a comma list of ``algorithm[:wire]``) are measured one after
the other in one cluster, each at every bucket size, so a campaign starts one cluster per
host count, not one per cell.
"""

from __future__ import annotations

import argparse
import itertools
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import all_reduce_tree, overlap
from allreduce_jax.distributed import initialize_from_env
from allreduce_jax.results import RowStore, environment, run_context

VARIANTS = ("compute", "forward", "comm", "stages", "after", "streams", "thread", "one_program")


def loss_fn(params, x):
  """A ``len(params)``-layer tanh MLP regressing to zero: one host's loss on its batch."""
  for layer in params[:-1]:
    x = jnp.tanh(x @ layer["w"] + layer["b"])
  return jnp.mean((x @ params[-1]["w"] + params[-1]["b"]) ** 2)


def layer_bytes(width: int) -> int:
  """One layer's parameters (``b`` then ``w``, the order the buckets take them)."""
  return 4 * (width * width + width)


def setup(layers: int, width: int, batch: int):
  """The mesh, the replicated parameters and this host's batch (random floats)."""
  mesh = jax.make_mesh((jax.device_count(),), ("data",))
  rng = np.random.default_rng(0)
  params = [
    {
      "w": (rng.normal(size=(width, width)) / np.sqrt(width)).astype(np.float32),
      "b": np.zeros(width, np.float32),
    }
    for _ in range(layers)
  ]
  x = rng.normal(size=(batch * jax.device_count(), width)).astype(np.float32)

  def put(a, spec):
    return jax.make_array_from_callback(a.shape, NamedSharding(mesh, spec), lambda i: a[i])

  return mesh, jax.tree.map(lambda a: put(a, P()), params), put(x, P("data"))


class Recorder:
  """Dispatch and ready times of the programs of one trial (a thread waits for each)."""

  def __init__(self):
    self.events: list[tuple[str, int, float, float]] = []
    self.threads: list[threading.Thread] = []
    self.lock = threading.Lock()

  def __call__(self, kind: str, index: int, outputs) -> None:
    sent = time.perf_counter()

    def wait():
      jax.block_until_ready(outputs)
      with self.lock:
        self.events.append((kind, index, sent, time.perf_counter()))

    thread = threading.Thread(target=wait)
    thread.start()
    self.threads.append(thread)

  def finish(self) -> list[tuple[str, int, float, float]]:
    for thread in self.threads:
      thread.join()
    return sorted(self.events, key=lambda e: (e[3], e[0], e[1]))


def variants(mesh, params, x, options: dict, names: tuple[str, ...]):
  """``{name: fn(record) -> outputs}``: one trial of each variant; ``record`` is a
  :class:`Recorder` (the split variants report their programs to it)."""

  def sharded(body, out_specs):
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data")), out_specs=out_specs))

  def mine(params):
    return jax.tree.map(lambda a: jax.lax.pcast(a, "data", to="varying"), params)

  def grads(params, x):
    return jax.tree.map(lambda a: a[None], jax.grad(loss_fn)(mine(params), x))

  def after(params, x):
    return all_reduce_tree(jax.grad(loss_fn)(mine(params), x), "data", op="mean", **options)

  fused, forward = sharded(grads, P("data")), sharded(lambda p, x: loss_fn(p, x)[None], P("data"))
  today = sharded(after, P())
  mechanisms = ("streams", "thread", "one_program")
  made = {m: overlap.value_and_grad(loss_fn, "data", mechanism=m, **options) for m in mechanisms}
  programs = made["streams"].programs(params, x)
  buckets = _bucket_inputs(programs, params, x)
  table = {
    "compute": lambda record: fused(params, x),
    "forward": lambda record: forward(params, x),
    "after": lambda record: today(params, x),
    "comm": lambda record: _comm(programs, buckets, record),
    "stages": lambda record: _stages(programs, params, x, record),
  }
  for m in mechanisms:
    table[m] = lambda record, m=m: made[m].programs(params, x).run(params, x, on_dispatch=record)
  return {name: table[name] for name in names}, programs


def _bucket_inputs(programs, params, x) -> list:
  """Each stage's bucket leaves (the all-reduces' inputs), computed once."""
  _, values = programs.forward(params, x)
  env = dict(zip(programs.forward_vars, values))
  out = []
  for stage, program in zip(programs.backward.stages, programs.stages):
    exports, leaves = program(*[env[v] for v in stage.inputs])
    env.update(zip(stage.exports, exports))
    out.append(leaves)
  return jax.block_until_ready(out)


def _comm(programs, buckets, record):
  """The buckets' all-reduces alone, in the overlapped step's order, one stream."""
  out = []
  for s, (reduce, leaves) in enumerate(zip(programs.reduces, buckets)):
    out.append(reduce(leaves))
    record("reduce", s, out[-1])
  return out


def _stages(programs, params, x, record):
  """The forward program and the backward stages alone (no all-reduce)."""
  _, values = programs.forward(params, x)
  record("forward", 0, values)
  env = dict(zip(programs.forward_vars, values))
  out = []
  for s, (stage, program) in enumerate(zip(programs.backward.stages, programs.stages)):
    exports, leaves = program(*[env[v] for v in stage.inputs])
    env.update(zip(stage.exports, exports))
    record("stage", s, leaves)
    out.append(leaves)
  return out


def measure(fns: dict, trials: int, warmup: int, barrier) -> tuple[np.ndarray, dict]:
  """``(times f64[V, trials], events {name: [trial][event] (kind, index, sent, ready)})``:
  every variant once per round, round robin, after a barrier."""
  for _ in range(warmup):
    for fn in fns.values():
      jax.block_until_ready(fn(Recorder()))
  times = np.zeros((len(fns), trials))
  events: dict = {name: [] for name in fns}
  for t, (v, (name, fn)) in itertools.product(range(trials), enumerate(fns.items())):
    jax.block_until_ready(barrier())
    record = Recorder()
    t0 = time.perf_counter()
    jax.block_until_ready(fn(record))
    times[v, t] = time.perf_counter() - t0
    events[name].append([(k, i, s - t0, r - t0, t0) for k, i, s, r in record.finish()])
  return times, events


def parser() -> argparse.ArgumentParser:
  """The command line of one cell."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--algorithm", default="ring", help="comma list of algorithm[:wire]")
  parser.add_argument("--wire", default=None, help="the wire of the algorithms naming none")
  parser.add_argument("--bucket-layers", default="1", help="bucket sizes in layers (comma list)")
  parser.add_argument("--layers", type=int, default=6)
  parser.add_argument("--width", type=int, default=768)
  parser.add_argument("--batch", type=int, default=4096, help="samples per host")
  parser.add_argument("--trials", type=int, default=5)
  parser.add_argument("--warmup", type=int, default=1)
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument(
    "--every-variant", default="", help="algorithms (comma list) timed with all of VARIANTS"
  )
  parser.add_argument("--run", type=int, default=0, help="which repetition this is (row key)")
  parser.add_argument("--out", default="experiments/overlap/rows/cells.jsonl")
  return parser


def measure_cell(args: argparse.Namespace) -> None:
  """Every algorithm of ``--algorithm`` at every bucket size of ``--bucket-layers``: the
  variants timed, one row each (process 0)."""
  initialize_from_env()
  mesh, params, x = setup(args.layers, args.width, args.batch)
  barrier = jax.jit(
    jax.shard_map(lambda: jax.lax.psum(jnp.ones(()), "data"), mesh=mesh, in_specs=(), out_specs=P())
  )
  store = RowStore(args.out, "overlap")
  layers = [float(v) for v in args.bucket_layers.split(",")]
  for spec, k in itertools.product(args.algorithm.split(","), layers):
    algorithm, _, wire = spec.partition(":")
    wire = wire or args.wire
    every = algorithm in args.every_variant.split(",")
    names = VARIANTS if every else tuple(args.variants.split(","))
    bucket_bytes = int(k * layer_bytes(args.width))
    options = dict(algorithm=algorithm, wire=wire, bucket_bytes=bucket_bytes)
    cell = dict(
      algorithm=algorithm, wire=wire, bucket_layers=k, layers=args.layers,
      width=args.width, batch=args.batch, run=args.run,
    )  # fmt: skip
    names = tuple(n for n in names if store.key(cell, variant=n) not in store.done())
    if not names:  # every row of this cell and run is there
      continue
    fns, programs = variants(mesh, params, x, options, names)
    times, events = measure(fns, args.trials, args.warmup, barrier)
    hosts = multihost_utils.process_allgather(times)  # f64[hosts, V, trials]
    timelines = _gather_events(events)
    if jax.process_index() != 0:
      continue
    order = [stage.bucket for stage in programs.backward.stages]
    for v, name in enumerate(fns):
      row = {
        **cell, "variant": name, "hosts": jax.process_count(),
        "network": run_context().get("network"),
        "bucket_bytes": options["bucket_bytes"], "buckets": len(order),
        "bucket_sizes": [4 * sum(int(np.prod(s)) for s in _shapes(programs, b)) for b in order],
        "times_s": hosts[:, v, :].max(axis=0).tolist(), "host_times_s": hosts[:, v, :].tolist(),
        "timeline": timelines[name], "env": environment(),
      }  # fmt: skip
      store.append(row, store.key(cell, variant=name))


def _shapes(programs, bucket: int) -> list:
  outvars = programs.backward.jaxpr.jaxpr.outvars
  return [outvars[k].aval.shape for k in programs.backward.buckets[bucket]]


def _gather_events(events: dict) -> dict:
  """Every host's events, per variant and trial: ``[host][trial][(kind, index, sent, ready, t0)]``
  (the lists have the same length on every host: the same programs run everywhere)."""
  kinds = {"forward": 0, "stage": 1, "reduce": 2, "step": 3}
  out = {}
  for name, per_trial in events.items():
    if not any(per_trial):  # a one-program variant: nothing recorded on any host
      out[name] = [[[] for _ in per_trial] for _ in range(jax.process_count())]
      continue
    rows = [[(kinds[k], i, s, r, t0) for k, i, s, r, t0 in trial] for trial in per_trial]
    arr = (
      np.zeros((len(rows), len(rows[0]), 5)) if rows and rows[0] else np.zeros((len(rows), 0, 5))
    )
    for t, trial in enumerate(rows):
      arr[t, : len(trial)] = trial
    every = multihost_utils.process_allgather(arr)  # f64[hosts, trials, events, 5]
    names = {v: k for k, v in kinds.items()}
    out[name] = [
      [[(names[int(e[0])], int(e[1]), *map(float, e[2:])) for e in trial] for trial in host]
      for host in every
    ]
  return out


if __name__ == "__main__":
  measure_cell(parser().parse_args())
