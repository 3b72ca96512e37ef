"""nccl-tests-style measurement of every all-reduce algorithm (``allreduce-jax bench``).

Timing goes through the tools' one timer (:func:`time_round_robin`, defined in
:mod:`allreduce_jax.tools._timing`; scripts import it from here): at
each message size all algorithms are compiled apart and then timed *round robin*
(call 1 of every algorithm, then call 2, ...), so a slow spell of a shared machine
hits them all alike and the ratios (custom vs ``psum``) stay meaningful.
``--order blocks`` times one algorithm after the other instead, for networks where
one algorithm's traffic slows the next one's calls (see ``_timing``).

As in nccl-tests (``doc/PERFORMANCE.md``), with ``n`` bytes per participant and time
``t``:

.. math::

  \\mathrm{algbw} = n / t, \\qquad \\mathrm{busbw} = \\mathrm{algbw}·\\frac{2(p-1)}{p}

so busbw is comparable across participant counts and with a link's peak bandwidth.
Every timed result is checked against ``lax.psum`` (``wrong`` = elements that differ)
on nccl-tests-style verifiable inputs, whose sums are exact in any order. With
``--wires`` each algorithm also runs in lossy wire formats (``all_reduce(...,
wire=...)``): there ``wrong`` counts the elements beyond the stated error bound (the
schedule's steps × the format's unit error × the largest sum of absolute values) and
``rel_error`` (relative L2 error against ``psum``) stands next to the time.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm import tqdm

from allreduce_jax import ALGORITHMS, _wire, all_reduce, cost_model, devices, names, netns, topology
from allreduce_jax._ops import get_op
from allreduce_jax.results import SCHEMA, fingerprint, run_context
from allreduce_jax.tools import compare, mpi_peer, plot
from allreduce_jax.tools._args import (
  add_devices,
  available_memory,
  check_memory,
  check_op_dtypes,
  check_rows,
  choice_list,
  dtype_spec,
  figure_path,
  nonnegative_int,
  op_spec,
  output_path,
  params_file,
  positive_int,
  positive_seconds,
  row_store,
  size,
  wire_list,
)
from allreduce_jax.tools._deadline import Deadline
from allreduce_jax.tools._timing import ORDERS, time_round_robin  # time_round_robin: public here
from allreduce_jax.units import format_bytes, parse_size

#: What a row file's first line starts with (``results.RowStore``): -J never writes over one.
ROWS_PREFIX = b'{"schema": "' + SCHEMA.encode() + b'"'

#: The fields every bench row carries (nccl-tests' columns, the model's prediction,
#: the run's configuration, the spread of the timed calls and XLA's temporary memory).
#: Bandwidths are GB/s (1e9 bytes/s) as in nccl-tests: ``algbw_GBps``/``busbw_GBps``;
#: ``algbw_gbps``/``busbw_gbps`` hold the same values under the names of the first row
#: layout (kept for existing readers; "gbps" there never meant gigabits).
ROW_FIELDS: tuple[str, ...] = (
  "algorithm",
  "n_devices",
  "process_count",
  "bytes",
  "count",
  "dtype",
  "op",
  "time_us",
  "algbw_GBps",
  "busbw_GBps",
  "algbw_gbps",
  "busbw_gbps",
  "wrong",
  "compile_s",
  "predicted_us",
  "backend",
  "jax_version",
  "time_us_min",
  "time_us_max",
  "time_us_iqr",
  "iters",
  "temp_bytes",
  "wire",
  "rel_error",
  "wire_bytes_per_element",
  "checked",
  "time_from",
  "mpi_algorithm",
  "collectives",
)

#: ``-a`` (nccl-tests' ``--average``): whose time a row of a multi-process run reports,
#: each process timing its own calls (one process: all the same).
AVERAGE = {0: "process 0", 1: "mean", 2: "min", 3: "max"}


def combine_spreads(stats: np.ndarray, average: int) -> np.ndarray:
  """``stats``: f[processes, programs, 4], each process's (median, min, max, IQR) per
  program -> f[programs, 4]: the median combined as ``-a`` says, with a spread that
  belongs to it (the chosen process's for 0, 2 and 3; the mean of each for 1), so a
  row's ``time_us`` always lies between its ``time_us_min`` and ``time_us_max``.

  Example:
    >>> s = np.array([[[1.0, 0.5, 2.0, 0.1]], [[3.0, 2.5, 4.0, 0.3]]])
    >>> combine_spreads(s, 3).tolist(), combine_spreads(s, 1).tolist()
    ([[3.0, 2.5, 4.0, 0.3]], [[2.0, 1.5, 3.0, 0.2]])
  """
  if average == 1:
    return stats.mean(axis=0)
  pick = {0: np.zeros(stats.shape[1], int), 2: stats[..., 0].argmin(axis=0),
          3: stats[..., 0].argmax(axis=0)}[average]  # fmt: skip
  return stats[pick, np.arange(stats.shape[1])]


def _process_times(timings, average: int) -> np.ndarray:
  """Every process's timings (seconds) -> f[programs, 4] (median, min, max, IQR),
  combined by :func:`combine_spreads` (process 0's own, exactly, with ``-a 0``)."""
  mine = np.asarray([[t.median_s, t.min_s, t.max_s, t.iqr_s] for t in timings], np.float64)
  if average == 0 or jax.process_count() == 1:
    return mine
  every = multihost_utils.process_allgather(mine.astype(np.float32))  # f32[procs, n, 4]
  stats = np.asarray(every, np.float64).reshape(jax.process_count(), *mine.shape)
  return combine_spreads(stats, average)


def sweep_sizes(
  min_bytes: int, max_bytes: int, factor: int, itemsize: int, p: int, uneven: bool = True
) -> list[int]:
  """Byte sizes per participant: ``min, min·f, min·f², ... ≤ max`` (nccl-tests
  ``-b -e -f``), rounded to whole elements, plus (``uneven``) one size whose element
  count is not a multiple of ``p``, near the geometric middle of the sweep.

  Example:
    >>> sweep_sizes(1024, 65536, 4, 4, 8)
    [1024, 4096, 8196, 16384, 65536]
  """
  if min_bytes > max_bytes:
    raise ValueError(f"--min-bytes {min_bytes} is larger than --max-bytes {max_bytes}.")
  if factor < 2:
    raise ValueError(f"--factor must be at least 2, got {factor}.")
  sizes, n = [], min_bytes
  while n <= max_bytes:
    sizes.append(max(itemsize, n // itemsize * itemsize))
    n *= factor
  if uneven and p > 1:
    count = int(math.sqrt(sizes[0] * sizes[-1])) // itemsize + 1
    while count % p == 0:
      count += 1
    sizes.append(count * itemsize)
  return sorted(set(sizes))


def bandwidths(nbytes: float, seconds: float, p: int) -> tuple[float, float]:
  """``(algbw, busbw)`` in GB/s (1e9 bytes/s): n/t and n/t·2(p-1)/p.

  Example:
    >>> bandwidths(1e9, 1.0, 8)
    (1.0, 1.75)
  """
  algbw = nbytes / seconds / 1e9
  return algbw, algbw * (2 * (p - 1) / p if p > 1 else 1.0)


# ----------------------------------------------------------------------------------------
# The all-reduce sweep.
# ----------------------------------------------------------------------------------------


def verifiable_block(index, p: int, count: int, seed: int = 0) -> np.ndarray:
  """Rows ``index[0]`` (participants) × columns ``index[1]`` of the verifiable input
  ``x[i, k] = compare.rank_coded(i, k, seed)`` of shape ``(p, count)``, built for this
  process's shards only."""
  rows = np.arange(*index[0].indices(p))[:, None]
  cols = np.arange(*index[1].indices(count))[None, :]
  return compare.rank_coded(rows, cols, seed)


def verifiable_input(mesh, spec: P, p: int, count: int, dtype: str = "float32") -> jax.Array:
  """The verifiable input of :func:`verifiable_block`, ``dtype[p, count]``, laid out by
  ``spec`` over ``mesh`` (one row a participant); each process builds its own shards."""
  sharding = NamedSharding(mesh, spec)
  return devices.put((p, count), dtype, sharding, lambda idx: verifiable_block(idx, p, count))


def programs(algorithm: str, p: int, op: str, wire: str | None = None):
  """``(mesh, spec, timed_fn, check_fn)`` for one algorithm on ``p`` devices.

  ``timed_fn``: ``T[p, count] -> T[p, count]``, row ``i`` all-reduced on device ``i``
  (sending in wire format ``wire``).
  ``check_fn``: ``(x, out) -> (i32[p], f32[p])``: elements of each row that differ
  from ``lax.psum``'s (``mean``: by more than 2 ulp; a lossy wire: by more than its
  stated bound), and the row's relative L2 error against it.
  """

  mesh, axis = devices.mesh_for(algorithm, p)
  spec = P(axis)
  fmt = _wire.get(wire)

  def body(b):  # b: T[1, count], this participant's row
    return all_reduce(b[0], axis, op=op, algorithm=algorithm, wire=wire)[None]

  def check(b, out):  # b, out: T[1, count]
    ref = get_op(op, b.dtype).reference(b[0], axis)
    got = out[0]
    diff = jnp.abs(got.astype(jnp.float32) - ref.astype(jnp.float32))
    if fmt.lossy:
      record = ALGORITHMS[algorithm]
      steps = record.schedule(p, 4.0 * b.shape[1], devices.inner_size(algorithm, p)).steps
      magnitude = jnp.max(lax.psum(jnp.abs(b[0].astype(jnp.float32)), axis))
      bad = diff > 1.01 * steps * fmt.unit_error * magnitude
    elif op == "mean" and jnp.issubdtype(got.dtype, jnp.floating):
      tol = 2 * jnp.finfo(got.dtype).eps * jnp.abs(ref)
      bad = diff > tol.astype(jnp.float32)
    else:
      bad = got != ref
    ref32 = ref.astype(jnp.float32)
    norm = jnp.sqrt(jnp.sum(ref32 * ref32))
    rel = jnp.sqrt(jnp.sum(diff * diff)) / jnp.where(norm > 0, norm, 1.0)
    return jnp.sum(bad, dtype=jnp.int32)[None], rel[None]

  timed = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
  checker = jax.jit(
    jax.shard_map(check, mesh=mesh, in_specs=(spec, spec), out_specs=(spec, spec), check_vma=False)
  )
  return mesh, spec, timed, checker


def wire_bytes(fn, reps: int) -> np.ndarray:
  """``f64[2]``: the bytes this host's interfaces sent and received over ``reps`` calls of
  ``fn`` (:func:`allreduce_jax.netns.interface_bytes` read after a barrier of every
  process, before and after). ``wire_bytes(lambda: None, reps)`` is the barriers' own,
  to subtract."""
  multihost_utils.sync_global_devices("wire bytes: before")
  before = netns.interface_bytes()
  for _ in range(reps):
    fn()
  multihost_utils.sync_global_devices("wire bytes: after")
  return np.subtract(netns.interface_bytes(), before).astype(np.float64)


def wire_per_call(fn, reps: int, idle: np.ndarray) -> np.ndarray:
  """``f64[processes, 2]``: every process's bytes sent and received per call of ``fn``
  over ``reps`` calls (:func:`wire_bytes`), less ``idle`` (``wire_bytes(lambda: None,
  reps)``, the barriers' own, so only ``fn``'s calls count), gathered from every process."""
  per_call = (wire_bytes(fn, reps) - idle) / reps
  return np.asarray(multihost_utils.process_allgather(per_call)).reshape(-1, 2)


def wire_parser(description: str, reps: int, algorithms: str | None, algorithms_help: str):
  """The command line of a script that counts each algorithm's bytes on the wire on every
  host of a cluster (:func:`wire_per_call`): ``--bytes`` per participant, ``--reps``
  calls counted, ``--algorithms``, ``--network`` (the cluster's topology, for the rows)
  and ``--out`` (the rows' file, appended)."""
  ap = argparse.ArgumentParser(description=description)
  ap.add_argument("--bytes", default="4MiB", help="bytes per participant")
  ap.add_argument("--reps", type=int, default=reps, help="calls counted per algorithm")
  ap.add_argument("--algorithms", default=algorithms, help=algorithms_help)
  ap.add_argument("--network", default="switch", help="the cluster's --topology (for the rows)")
  ap.add_argument("--out", required=True, help="the rows' file (.jsonl, appended)")
  return ap


def measure_size(
  algorithms: Sequence[str],
  p: int,
  nbytes: int,
  dtype: str = "float32",
  op: str = "sum",
  iters: int = 10,
  warmup: int = 2,
  params=None,
  wires: Sequence[str | None] = (None,),
  check: bool = True,
  average: int = 0,
  order: str = "round-robin",
  deadline: Deadline | None = None,
  iteration_times: bool = False,
) -> list[dict]:
  """Measures every algorithm in every wire format at one size, side by side; returns
  one row each (XLA's ``psum`` only exact). ``check``: compare each result with
  ``lax.psum``'s (``wrong``; ``None`` without the check). ``average``: which process's
  time a multi-process row reports (:data:`AVERAGE`). ``order``: the calls' order
  (:func:`~allreduce_jax.tools._timing.time_round_robin`). ``deadline``: counts the calls
  (bench ``-T``). ``iteration_times``: rows also carry every timed call of this process
  (``times_us``) and their 50th and 99th percentiles (bench ``-I``)."""

  itemsize = jnp.dtype(dtype).itemsize
  count = nbytes // itemsize
  built = []
  inputs: dict = {}
  for wire in wires:
    for alg in algorithms:
      if alg == mpi_peer.NAME:  # MPI_Allreduce of this process's row (mpi4jax), exact only
        if wire is None:
          timed, (x,), checker = mpi_peer.program(p, count, dtype, op)
          built.append((alg, wire, timed, x, checker))
        continue
      if wire not in ALGORITHMS[alg].wires:
        continue
      mesh, spec, timed, checker = programs(alg, p, op, wire)
      key = (mesh.axis_names, mesh.devices.shape)
      if key not in inputs:
        inputs[key] = verifiable_input(mesh, spec, p, count, dtype)
      built.append((alg, wire, timed, inputs[key], checker))
  params = params or cost_model.current_params()  # auto traces with these (never a file)
  if deadline is not None:
    deadline.at(f"{','.join(a for a, *_ in built)} at {format_bytes(nbytes)} {dtype} {op}")
  with cost_model.use_params(params):
    timings = time_round_robin(
      [(timed, (x,)) for _, _, timed, x, _ in built],
      iters,
      warmup,
      order=order,
      on_call=deadline.call if deadline is not None else None,
    )
    # What auto picked, and what each schedule chose at trace time under these
    # parameters (the double binary tree's chunk count; auto's, its pick's): a model
    # handed them prices what ran.
    picks = {alg: cost_model.choose(p, nbytes, params) for alg, *_ in built if alg == "auto"}
    choices = {
      alg: topology.trace_choices(picks.get(alg, alg), p, nbytes)
      for alg, *_ in built
      if alg != mpi_peer.NAME
    }
  stats = _process_times(timings, average)  # f[programs, 4]: median, min, max, IQR (s)
  rows = []
  for (alg, wire, _, x, checker), t, (sec, lo, hi, iqr) in zip(built, timings, stats):
    wrong = rel_error = None
    mpi = alg == mpi_peer.NAME
    if check and mpi:  # each rank checks its own result; the row sums them
      mine = np.asarray([checker(t.compiled(x))], np.int32)
      wrong = int(np.sum(multihost_utils.process_allgather(mine)))
    elif check:
      bad, rel = checker(x, t.compiled(x))
      wrong = int(np.sum(devices.fetch(bad)))
      rel_error = float(np.max(devices.fetch(rel)))
    algbw, busbw = bandwidths(nbytes, float(sec), p)
    inner = None if mpi else devices.inner_size(alg, p)
    mpi_algorithm = mpi_peer.algorithm() if mpi else None
    priced = mpi_peer.SCHEDULE.get(mpi_algorithm) if mpi else alg
    row = {
      "algorithm": alg,
      "n_devices": p,
      "process_count": jax.process_count(),
      "bytes": nbytes,
      "count": count,
      "dtype": dtype,
      "op": op,
      "algbw_GBps": algbw,
      "busbw_GBps": busbw,
      "algbw_gbps": algbw,  # the same values under the first layout's names
      "busbw_gbps": busbw,
      "wrong": wrong,
      "predicted_us": (
        cost_model.predict_us(priced, p, nbytes, params, inner=inner) if priced else None
      ),
      "backend": jax.default_backend(),
      "jax_version": jax.__version__,
      **t.row(),
      # process 0's median and spread unless -a says otherwise
      "time_us": float(sec) * 1e6,
      "time_us_min": float(lo) * 1e6,
      "time_us_max": float(hi) * 1e6,
      "time_us_iqr": float(iqr) * 1e6,
      "time_from": AVERAGE[average] if jax.process_count() > 1 else "process 0",
      "checked": check,
      "warmup": warmup,
      "order": order,
      "chosen": picks.get(alg),
      "choices": choices.get(alg) or None,
      "wire": wire,
      "rel_error": rel_error,
      "wire_bytes_per_element": (
        None if mpi else ALGORITHMS[alg].wire_bytes(p, wire, count, itemsize, inner)
      ),
      "mpi_algorithm": mpi_algorithm,
      "collectives": cpu_collectives(),
    }
    if iteration_times:  # this process's own calls, in order
      row["times_us"] = [s * 1e6 for s in t.times_s]
      row["time_us_p50"], row["time_us_p99"] = np.percentile(row["times_us"], [50, 99]).tolist()
    rows.append(row)
  del inputs, built
  return rows


def cpu_collectives() -> str | None:
  """What carried the messages between processes on CPU: XLA's CPU collectives,
  ``gloo`` or ``mpi`` (``jax_cpu_collectives_implementation``, which ``launch|cluster
  --collectives`` set through ``ALLREDUCE_JAX_COLLECTIVES``); None on another backend."""
  if jax.default_backend() != "cpu":
    return None
  return jax.config.jax_cpu_collectives_implementation or None


def params_id(params) -> str:
  """A fingerprint of the cost parameters behind ``auto`` (its choice depends on them)."""

  if isinstance(params, cost_model.FittedParams):
    return fingerprint(params.to_json())
  return fingerprint(cost_model.params_to_dict(cost_model.resolve(params, "ring")))


def row_key(
  store,
  algorithm: str,
  nbytes: int,
  params,
  wire: str | None = None,
  *,
  dtype: str = "float32",
  op: str = "sum",
  check: bool = True,
  average: int = 0,
  order: str = "round-robin",
  iteration_times: bool = False,
) -> str:
  """A bench row's key: algorithm, size, dtype and op over the run's configuration
  (the store's context), plus the cost parameters for ``auto``, a lossy wire format,
  an unchecked run (``-c 0``), a time other than process 0's (``-a``), timing in
  blocks (``--order blocks``) and XLA's CPU collectives over MPI."""
  extra = {"cost_params": params_id(params)} if algorithm == "auto" else {}
  if wire is not None:
    extra["wire"] = wire
  if not check:
    extra["checked"] = False
  if average and jax.process_count() > 1:
    extra["time_from"] = AVERAGE[average]
  if order != "round-robin":
    extra["order"] = order
  if iteration_times:  # rows with every call's time (-I)
    extra["times"] = True
  if algorithm == mpi_peer.NAME:  # which of Open MPI's algorithms ran
    extra["mpi_algorithm"] = mpi_peer.algorithm()
  if cpu_collectives() == "mpi":  # XLA's collectives over MPI: not gloo's rows
    extra["collectives"] = "mpi"
  return store.key(algorithm=algorithm, bytes=nbytes, dtype=dtype, op=op, **extra)


HEADER = (
  f"{'size(B)':>12} {'count':>10} {'type':>8} {'redop':>5} {'algorithm':>18}"
  f" {'time(us)':>10} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'#wrong':>6}"
  f" {'model(us)':>10} {'vs psum':>7} {'rel.err':>8}"
)


def format_row(r: dict, psum_busbw: float | None = None) -> str:
  """One nccl-tests-style table line (plus the model's prediction and busbw/psum)."""
  ratio = f"{r['busbw_GBps'] / psum_busbw:7.2f}" if psum_busbw else f"{'':>7}"
  pred = r.get("predicted_us")
  pred_s = f"{pred:10.1f}" if pred is not None else f"{'-':>10}"
  name = r["algorithm"] + (f"({r['chosen']})" if r.get("chosen") else "")
  name += f"({r['mpi_algorithm']})" if r.get("mpi_algorithm") else ""
  name += f"/{r['wire']}" if r.get("wire") else ""
  err = r.get("rel_error")
  err_s = f"{err:8.1e}" if err is not None else f"{'-':>8}"
  tail = f" {r['time_us_p50']:>9.1f} {r['time_us_p99']:>9.1f}" if "time_us_p99" in r else ""
  return (
    f"{r['bytes']:>12} {r['count']:>10} {r['dtype']:>8} {r['op']:>5} {name:>18}"
    f" {r['time_us']:>10.1f} {r['algbw_GBps']:>11.3f} {r['busbw_GBps']:>11.3f}"
    f" {'-' if r['wrong'] is None else r['wrong']:>6}"
    f" {pred_s} {ratio} {err_s}{tail}"
  )


#: The two columns ``-I`` adds to :data:`HEADER`: the timed calls' percentiles.
HEADER_ITERATIONS = f" {'p50(us)':>9} {'p99(us)':>9}"


def summary(rows: Sequence[dict]) -> str:
  """``# Avg bus bandwidth`` per algorithm and the out-of-bounds (wrong) total."""
  lines = []
  by_alg: dict[str, list[float]] = {}
  for r in rows:
    name = r["algorithm"] + (f"/{r['wire']}" if r.get("wire") else "")
    by_alg.setdefault(name, []).append(r["busbw_GBps"])
  for alg, bws in by_alg.items():
    lines.append(f"# Avg bus bandwidth {alg:>18} : {statistics.mean(bws):.4f} GB/s")
  checked = [r["wrong"] for r in rows if r["wrong"] is not None]
  wrong = sum(checked)
  if len(checked) < len(rows):
    lines.append(f"# Not checked (-c 0): {len(rows) - len(checked)} result(s)")
  lines.append(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
  return "\n".join(lines)


# ----------------------------------------------------------------------------------------
# Fitting (the figure is tools.plot.bench).
# ----------------------------------------------------------------------------------------


def _fit_rows(rows: Sequence[dict], min_bytes: int = 0) -> list[tuple]:
  """``(algorithm, p, bytes, seconds)`` of the rows the α-β-γ fit can use: one-axis
  algorithms with a cost schedule (multi-axis ones need an inner size per row), at
  ``min_bytes`` per participant or more."""
  return [
    (r["algorithm"], r["n_devices"], r["bytes"], r["time_us"] * 1e-6)
    for r in rows
    if r["algorithm"] in names(axes=1, priced=True)
    and r["n_devices"] > 1
    and not r.get("wire")
    and r["bytes"] >= min_bytes
  ]


def fit_report(rows: Sequence[dict], fitted, min_bytes: int = 0) -> tuple[str, list[dict]]:
  """Per (algorithm, size) from ``min_bytes`` on: measured vs predicted (own fit and
  shared fit), rel. error."""
  table = []
  for alg, p, n, sec in _fit_rows(rows, min_bytes):
    own = cost_model.predict_seconds(alg, p, n, fitted.get(alg))
    shared = cost_model.predict_seconds(alg, p, n, fitted.shared)
    table.append(
      {
        "algorithm": alg,
        "n_devices": p,
        "bytes": n,
        "measured_us": sec * 1e6,
        "fit_us": own * 1e6,
        "fit_err": own / sec - 1,
        "shared_us": shared * 1e6,
        "shared_err": shared / sec - 1,
      }
    )
  lines = [
    f"{'algorithm':>18} {'size':>8} {'measured(us)':>12} {'model(us)':>10} {'err':>7}"
    f" {'shared(us)':>10} {'err':>7}"
  ]
  for t in sorted(table, key=lambda t: (t["algorithm"], t["bytes"])):
    lines.append(
      f"{t['algorithm']:>18} {format_bytes(t['bytes']):>8} {t['measured_us']:>12.1f}"
      f" {t['fit_us']:>10.1f} {t['fit_err']:>+7.0%} {t['shared_us']:>10.1f} {t['shared_err']:>+7.0%}"
    )
  return "\n".join(lines), table


def fit_params_table(fitted) -> list[dict]:
  """One row per fit (shared, then each algorithm): α (µs), β (ns/B), bandwidth
  (GB/s) and γ (ns/B), γ None where the rows could not identify it
  (``cost_model.gamma_identifiable``)."""
  known = fitted.meta.get("gamma_identified", {})
  table = []
  for name, q in [("shared", fitted.shared), *fitted.per_algorithm.items()]:
    d = cost_model.params_to_dict(q)
    if not known.get(name, name == "shared"):  # older fit files: per-algorithm ones at one p
      d["gamma_ns_per_byte"] = None
    table.append({"fit": name, **d})
  return table


def fit_and_save(rows: Sequence[dict], path, min_bytes: int = 0) -> tuple:
  """Fits α, β, γ (shared and per algorithm) from bench rows of ``min_bytes`` per
  participant or more and saves them.

  On a real network keep small messages out (``--fit-min-bytes 1MiB``): below about
  1 MiB a token-bucket link lets a burst through faster than its rate and a sender's
  clock stops once its sends are buffered, and least squares over those rows halved β
  on the emulated cluster (``experiments/emulated_network/rows/auto_fit.md``)."""
  fit_rows = _fit_rows(rows, min_bytes)
  if not fit_rows:
    raise ValueError(
      "--fit: no measured rows with more than one device"
      + (f" at --fit-min-bytes {format_bytes(min_bytes, sep='')} or more" if min_bytes else "")
      + " to fit."
    )
  meta = {
    "backend": rows[0]["backend"],
    "n_devices": sorted({r[1] for r in fit_rows}),
    "jax_version": rows[0]["jax_version"],
    "rows": len(fit_rows),
    "min_bytes": min_bytes,
    "model": "t = alpha*steps + beta*beta_bytes + gamma*gamma_bytes (cost_model.schedule)",
  }
  fitted = cost_model.fit_all(fit_rows, meta=meta)
  text, table = fit_report(rows, fitted, min_bytes)
  big = [t for t in table if t["bytes"] >= 1 << 20]
  fitted.meta["max_abs_err_ge_1MiB"] = {
    a: max(abs(t["fit_err"]) for t in big if t["algorithm"] == a)
    for a in sorted({t["algorithm"] for t in big})
  }
  cost_model.save_params(fitted, path)
  return fitted, text, table


# ----------------------------------------------------------------------------------------
# Command line.
# ----------------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
  add_devices(parser)
  parser.add_argument(
    "--algorithms",
    type=choice_list(lambda: (*ALGORITHMS, mpi_peer.NAME), "algorithms"),
    default=None,
    help="comma-separated (default: every algorithm, psum included); mpi: Open MPI's"
    " MPI_Allreduce through mpi4jax (under mpirun, one device per process; the row names the"
    " algorithm forced with --mca coll_tuned_allreduce_algorithm)",
  )
  # Short flags as in nccl-tests (all_reduce_perf -b 8 -e 128M -f 2 -n 20 -w 5 -d float -o sum).
  parser.add_argument(
    "-b", "--min-bytes", default=None, help="smallest size per participant (default: 1KiB)"
  )
  parser.add_argument(
    "-e", "--max-bytes", default=None, help="largest size per participant (default: 64MiB;"
    " --smoke: 4KiB)"
  )  # fmt: skip
  parser.add_argument("-f", "--factor", type=int, default=None, help="size multiplier (default: 4)")
  parser.add_argument("--no-uneven", action="store_true", help="skip the size not divisible by p")
  parser.add_argument(
    "-d",
    "--dtype",
    "--datatype",
    type=dtype_spec,
    default="float32",
    help="element type(s): one, a comma list, or all (every nccl-tests datatype all_reduce"
    " reduces: int8 ... bfloat16, 64-bit ones with JAX_ENABLE_X64=1)",
  )
  parser.add_argument(
    "-o",
    "--op",
    type=op_spec,
    default="sum",
    help="reduction(s): sum, mean (nccl-tests' avg), max, min, a comma list, or all;"
    " pairs all_reduce does not define (mean of integers) are skipped",
  )
  parser.add_argument(
    "-g",
    "--ngpus",
    type=positive_int,
    default=None,
    help="devices per process (nccl-tests' GPUs per thread): in one process the same as"
    " --devices; under launch/cluster it must equal the devices each process has",
  )
  parser.add_argument(
    "-c",
    "--check",
    type=int,
    choices=(0, 1),
    default=1,
    help="1: compare every timed result with lax.psum's (#wrong); 0: skip that (rows say"
    " wrong = null)",
  )
  parser.add_argument(
    "-a",
    "--average",
    type=int,
    choices=tuple(AVERAGE),
    default=0,
    help="on several processes, whose time a row reports: 0 process 0's, 1 the mean,"
    " 2 the min, 3 the max of the processes' medians (default: 0; nccl-tests' -a"
    " defaults to 1, the mean)",
  )
  parser.add_argument(
    "--order",
    choices=ORDERS,
    default="round-robin",
    help="round-robin: call k of every algorithm, then call k+1 (a noisy CPU hits all"
    " alike); blocks: each algorithm's warm-up and timed calls together (on a network,"
    " no algorithm's calls follow another's traffic) (default: round-robin)",
  )
  parser.add_argument(
    "-n",
    "--iters",
    type=positive_int,
    default=None,
    help="timed calls per (algorithm, size) (default: 10; --smoke: 3)",
  )
  parser.add_argument(
    "-w", "--warmup", type=nonnegative_int, default=None, help="untimed calls first (default: 3;"
    " --smoke: 1)"
  )  # fmt: skip
  parser.add_argument("--out", default="results/bench.jsonl", help="JSON Lines file (appended)")
  parser.add_argument(
    "--fresh", action="store_true", help="overwrite --out instead of resuming (skip done rows)"
  )
  parser.add_argument(
    "--fit",
    action="store_true",
    help="fit α, β, γ from the rows in --out and save them to --params",
  )
  parser.add_argument(
    "--fit-min-bytes",
    type=size,
    default=0,
    metavar="SIZE",
    help="--fit only from rows of SIZE per participant or more (e.g. 1MiB on a real or"
    " emulated network, where small messages beat the link's rate; default: every row)",
  )
  parser.add_argument(
    "--params",
    default=None,
    help="fit file to write with --fit and to price auto with (default:"
    " $ALLREDUCE_JAX_COST_PARAMS or results/cost_params.json; bench, fusion and scaling"
    " pass it to auto explicitly, the library never reads it)",
  )
  parser.add_argument("--plot", default=None, help="figure path (default: --out with .png)")
  parser.add_argument(
    "--smoke",
    action="store_true",
    help="tiny sweep for tests (1KiB to 4KiB, 3 iterations); options given explicitly win",
  )
  parser.add_argument(
    "--wires",
    type=wire_list,
    default="none",
    help="comma-separated wire formats to send in: none (exact), bf16, int8, fp8;"
    " lossy rows report rel_error next to the time",
  )
  # nccl-tests 2.19's -T, -I and -J.
  parser.add_argument(
    "-T",
    "--timeout",
    type=positive_seconds,
    default=None,
    metavar="SECONDS",
    help="end the run after SECONDS, naming the participant that is stuck (the process"
    " whose calls fall behind the others', or that does not answer); exit 124 (default: none)",
  )
  parser.add_argument(
    "-I",
    "--iteration-times",
    action="store_true",
    help="rows also carry every timed call (times_us) and their p50 and p99, which the table shows",
  )
  parser.add_argument(
    "-J",
    "--json",
    default=None,
    metavar="FILE",
    help="also write the run (its configuration and every row so far) as one JSON document"
    " to FILE, rewritten after each size",
  )


def _pairs(ops: list[str], dtypes: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
  """The (op, dtype) pairs to sweep, dtype-major, and the pairs ``all_reduce`` does not
  define (``mean`` of integers, ...), as ``op×dtype``; a single undefined pair asked
  for by name is refused (``check_op_dtypes``), one line naming both options."""
  good, bad = [], []
  for dtype in dtypes:
    for op in ops:
      try:
        get_op(op, dtype)
        good.append((op, dtype))
      except (TypeError, ValueError):
        bad.append(f"{op}×{dtype}")
  if not good:
    check_op_dtypes(ops, dtypes)
  return good, bad


def _devices_per_process(args: argparse.Namespace) -> None:
  """``-g/--ngpus``: nccl-tests' devices per thread. In one process it is the device
  count (``--devices``); under ``jax.distributed`` the launcher fixed each process's
  devices, so it must match them."""
  g = args.ngpus
  if g is None:
    return
  if jax.distributed.is_initialized():
    have = jax.local_device_count()
    if g != have:
      raise SystemExit(
        f"-g/--ngpus {g}: this process has {have} local device(s), fixed by its launcher"
        " (launch --local-devices, cluster --devices-per-host)."
      )
    return
  if args.devices is not None and args.devices != g:
    raise SystemExit(
      f"-g/--ngpus {g} and --devices {args.devices}: in one process both are the device"
      " count; give one of them."
    )
  args.devices = g


def run(args: argparse.Namespace) -> int:
  deadline = Deadline(args.timeout, f"bench: -T {args.timeout:g}" if args.timeout else "").start()
  try:
    return _run(args, deadline)
  finally:
    deadline.finish()


def _run(args: argparse.Namespace, deadline: Deadline) -> int:
  sizes, pairs, undefined, p, algorithms = _sweep(args)
  check = bool(args.check)
  main = jax.process_index() == 0
  wires = list(args.wires)
  for w in wires:
    lossy = [op for op, _ in pairs if op not in ("sum", "mean")]
    if w is not None and lossy:
      raise SystemExit(f"--wires {w}: a lossy wire format needs --op sum or mean, got {lossy[0]}.")
  # Every input and output problem is found here, before the first measurement.
  out = Path(args.out)
  context = {
    **run_context(),
    "n_devices": p,
    "iters": args.iters,
    "warmup": args.warmup,
    **({"trials": args.trials} if getattr(args, "trials", None) else {}),
  }  # + each row's dtype and op (row_key): one file holds every pair of -o/-d
  check_rows(out, "bench")  # the user's --out is named before --plot's default derived from it
  fig = figure_path(args.plot or out.with_suffix(".png"), "--plot")
  if args.fit:
    output_path(args.params or cost_model.default_fit_path(), "--params")
  if args.json:  # before the store: --fresh must not empty a file -J names
    fit = args.params or (cost_model.default_fit_path() if args.fit else None)
    _json_path(args.json, {"--out": out, "--plot": fig, "--params": fit})
  store = row_store(out, "bench", fresh=args.fresh and main, context=context)
  done = {} if args.fresh else store.done()  # every process: the same (empty) set
  if args.params and not args.fit:  # the fit to price auto with: refused like scaling's
    params = params_file(args.params, "--params")
  else:
    params = cost_model.load_default_params()
  if main:
    _print_header(args, params, p, check, undefined)
  entries = [
    (a, w)
    for w in wires
    for a in algorithms
    if (w is None if a == mpi_peer.NAME else w in ALGORITHMS[a].wires)
  ]
  rows_by_pair = _measure_pairs(
    args, store, done, sizes, pairs, entries, p, params, main, deadline, context
  )
  every = [r for rows in rows_by_pair.values() for r in rows]
  if main:
    print(summary(every), flush=True)
  status = 0 if all(not r["wrong"] for r in every) else 1
  first = pairs[0]  # the fit and the main figure: the first pair of -o/-d
  if args.fit and main:
    params = _fit(args, store, first)
  if main:
    drawn = []
    for (op, dtype), rows in rows_by_pair.items():  # one figure per pair: bench_max_int32.png
      path = fig if (op, dtype) == first else fig.with_stem(f"{fig.stem}_{op}_{dtype}")
      figure = plot.bench(rows, params)
      if figure is not None:
        plot.save(figure, path)
        drawn.append(str(path))
    figures = ("  figure: " if len(drawn) == 1 else "  figures: ") + ", ".join(drawn)
    print(f"# rows: {out}" + (figures if drawn else "  (no figure)"))
  return status


def _sweep(args: argparse.Namespace):
  """``(sizes by dtype, (op, dtype) pairs, undefined pairs, p, algorithms)`` the
  options ask for: the preset filled in, every bad option one line, memory checked."""
  # Explicit options win over --smoke's preset, which wins over the defaults.
  preset = SMOKE if args.smoke else DEFAULTS
  for name, value in preset.items():
    if getattr(args, name) is None:
      setattr(args, name, value)
  try:
    min_b = parse_size(args.min_bytes, "--min-bytes")
    max_b = parse_size(args.max_bytes, "--max-bytes")
  except ValueError as e:
    raise SystemExit(str(e)) from None

  algorithms = args.algorithms or list(ALGORITHMS)
  pairs, undefined = _pairs(list(args.op), list(args.dtype))
  _devices_per_process(args)

  try:
    args.devices = devices.use_cpu_devices(args.devices)
    sizes = {
      d: sweep_sizes(min_b, max_b, args.factor, jnp.dtype(d).itemsize, args.devices,
                     not args.no_uneven)
      for d in dict.fromkeys(d for _, d in pairs)
    }  # fmt: skip
  except ValueError as e:
    raise SystemExit(str(e)) from None

  p = len(jax.devices()) if jax.distributed.is_initialized() else args.devices
  if mpi_peer.NAME in algorithms and (why := mpi_peer.problem()):
    raise SystemExit(why)
  unfit = [a for a in algorithms if a != mpi_peer.NAME and not devices.fits(a, p)]
  if unfit and args.algorithms:  # asked for by name: say so, measure nothing
    raise SystemExit(
      f"--algorithms {','.join(unfit)}: no mesh at p={p} ({_no_mesh(unfit)}); choose"
      " --devices with a mesh for it (e.g. 4 or 8) or other --algorithms."
    )
  algorithms = [a for a in algorithms if a not in unfit]
  if unfit and jax.process_index() == 0:
    print(f"# skipping {', '.join(unfit)}: no mesh at p={p}", file=sys.stderr, flush=True)
  largest = max(max(v) for v in sizes.values())
  check_memory(
    4 * p * largest,
    f"--max-bytes {args.max_bytes} on {p} devices (input, result, check and XLA's"
    " buffers, 4 per device)",
    f"use -e {format_bytes(_fits_bytes(p), sep='')} or less"
    if _fits_bytes(p)
    else "use a smaller -e",
  )
  return sizes, pairs, undefined, p, algorithms


def _print_header(args: argparse.Namespace, params, p: int, check: bool, undefined) -> None:
  fit_file = Path(args.params) if args.params and not args.fit else cost_model.default_fit_path()
  src = cost_model.describe_params(params) + (f" from {fit_file}" if fit_file.exists() else "")
  print(
    f"# allreduce-jax bench: jax {jax.__version__}, backend {jax.default_backend()}, {p} devices,"
    f" {jax.process_count()} process(es); auto and the model use: {src};"
    f" iters {args.iters}, warmup {args.warmup}"
    + ("; in blocks (--order blocks)" if args.order == "blocks" else "")
    + ("" if check else "; results not checked (-c 0)")
    + (f"; time: {AVERAGE[args.average]} of the processes'" if jax.process_count() > 1 else ""),
    flush=True,
  )
  if undefined:
    print(f"# skipping {', '.join(undefined)}: all_reduce does not define them", flush=True)
  print("# " + HEADER.lstrip() + (HEADER_ITERATIONS if args.iteration_times else ""), flush=True)


def _json_path(path: str, others: dict[str, Path | str | None]) -> Path:
  """``-J FILE``, checked before anything is measured: writable, not the file of another
  option (``others``: option -> path), and not a file of rows (which the one JSON
  document ``-J`` writes would replace); an earlier ``-J`` document is rewritten."""
  json_path = output_path(path, "-J/--json")
  for option, other in others.items():
    if other is not None and json_path.resolve() == Path(other).resolve():
      raise SystemExit(
        f"-J/--json {path}: is also {option}; -J writes one JSON document over it. Give -J"
        f" a file of its own (e.g. {Path(path).with_suffix('.json').name}"
        f"{' beside it' if Path(path).suffix != '.json' else '; another name'})."
      )
  if _holds_rows(json_path):
    raise SystemExit(
      f"-J/--json {path}: holds rows (JSON Lines of allreduce-jax results); -J writes one JSON"
      " document and would replace them. Give -J another file."
    )
  return json_path


def _holds_rows(path: Path) -> bool:
  """Whether ``path`` is a file whose first line is a row of the row store."""
  try:
    with open(path, "rb") as f:
      return f.read(len(ROWS_PREFIX)) == ROWS_PREFIX
  except (FileNotFoundError, IsADirectoryError):
    return False


def _write_json(path: str, context: dict, rows: list[dict]) -> None:
  """``-J``: the run as one JSON document (written whole, then renamed into place)."""
  import json
  import os

  tmp = Path(f"{path}.tmp")
  tmp.write_text(json.dumps({"config": context, "results": rows}, indent=1, default=str) + "\n")
  os.replace(tmp, path)


def _measure_pairs(args, store, done, sizes, pairs, entries, p, params, main, deadline, context):
  """Every (algorithm, wire) at every size of every (op, dtype) pair: rows already in
  ``done`` reused, the rest measured (one round robin per wire format) and stored;
  each size's rows printed. Returns the rows by pair."""
  check = bool(args.check)
  wires = list(args.wires)
  bar = tqdm(
    total=sum(len(sizes[d]) for _, d in pairs) * len(entries),
    file=sys.stderr,
    disable=None if main else True,
    leave=False,
  )
  rows_by_pair: dict[tuple[str, str], list[dict]] = {}
  for op, dtype in pairs:
    rows_all = rows_by_pair[(op, dtype)] = []
    for nbytes in sizes[dtype]:
      keys = {
        (a, w): row_key(store, a, nbytes, params, w, dtype=dtype, op=op, check=check,
                        average=args.average, order=args.order,
                        iteration_times=args.iteration_times)
        for a, w in entries
      }  # fmt: skip
      todo = [e for e in entries if keys[e] not in done]
      rows = [done[keys[e]] for e in entries if e not in todo]
      for w in wires:  # one round robin per format keeps the rows' order simple
        mine = [a for a, ww in todo if ww == w]
        if not mine:
          continue
        bar.set_description(f"{dtype} {op} {format_bytes(nbytes)}")
        new = measure_size(
          mine, p, nbytes, dtype, op, args.iters, args.warmup, params, wires=(w,),
          check=check, average=args.average, order=args.order, deadline=deadline,
          iteration_times=args.iteration_times,
        )  # fmt: skip
        if main:
          store.extend(new, [keys[(r["algorithm"], r.get("wire"))] for r in new])
        rows += new
      bar.update(len(entries))
      rows.sort(key=lambda r: entries.index((r["algorithm"], r.get("wire"))))
      psum = next((r["busbw_GBps"] for r in rows if r["algorithm"] == "psum"), None)
      if main:
        for r in rows:
          bar.write(format_row(r, psum))
      rows_all += rows
      if main and args.json:
        _write_json(
          args.json,
          {**context, "collectives": cpu_collectives()},
          [r for rs in rows_by_pair.values() for r in rs],
        )
  bar.close()
  return rows_by_pair


def _fit(args: argparse.Namespace, store, first: tuple[str, str]):
  """``--fit``: α-β-γ fitted to this configuration's rows of the first pair, saved
  and printed; returns the fit."""
  path = Path(args.params) if args.params else cost_model.default_fit_path()
  mine = [r for r in store.current() if (r["op"], r["dtype"]) == first]
  try:
    fitted, text, _ = fit_and_save(mine, path, args.fit_min_bytes)
  except ValueError as e:
    raise SystemExit(str(e)) from None
  print(f"# fit from {len(mine)} rows ({first[1]} {first[0]}) -> {path}")
  for d in fit_params_table(fitted):
    gamma = "—" if d["gamma_ns_per_byte"] is None else f"{d['gamma_ns_per_byte']:.4f} ns/B"
    print(
      f"#   {d['fit']:>18}: α = {d['alpha_us']:9.2f} µs  β = {d['beta_ns_per_byte']:.4f} ns/B"
      f" ({d['bandwidth_GBps']:.2f} GB/s)  γ = {gamma}"
    )
  print("#   γ —: not identifiable from one algorithm at one p (β includes it)")
  print(text)
  return fitted


#: Bench's sweep when an option is not given, and with ``--smoke`` (explicit options win).
DEFAULTS = {"min_bytes": "1KiB", "max_bytes": "64MiB", "factor": 4, "iters": 10, "warmup": 3}
SMOKE = {"min_bytes": "1KiB", "max_bytes": "4KiB", "factor": 4, "iters": 3, "warmup": 1}


def _no_mesh(unfit) -> str:
  return "; ".join(f"{a} needs {ALGORITHMS[a].axes} mesh axes of size ≥ 2" for a in unfit)


def _fits_bytes(p: int) -> int:
  """The largest power-of-two size per participant whose 4 buffers per device fit."""
  have = available_memory() or 0
  if 4 * p > have:
    return 0
  n = 1
  while 4 * p * 2 * n <= have:
    n *= 2
  return n
