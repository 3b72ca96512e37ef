"""Tensor fusion measured (``allreduce-jax fusion``): per-leaf vs bucketed all-reduce.

Each all-reduce pays its latency term (2(p-1)α for a ring) whatever its size, so a
gradient pytree of L leaves reduced leaf by leaf costs about L·2(p-1)α + 2(p-1)/p·Nβ
(N = all the bytes), while B buckets cost B·2(p-1)α + 2(p-1)/p·Nβ. Frameworks bucket:
PyTorch DDP 25 MB (``bucket_cap_mb``), Horovod a 64-128 MB fusion buffer
(``HOROVOD_FUSION_THRESHOLD``).

Two gradient pytrees, shapes written out below:

- ``cnn``: the training CNN of ``allreduce_jax.training.models`` (two 3×3 convs and a
  dense head: 6 leaves), as a stand-in for "the Flax model used for training";
- ``transformer``: a GPT-like stack (embeddings + ``layers`` × 12 leaves + final norm)
  with ``d_model`` and an MLP of 4·d_model: hundreds of leaves at the default size.

All bucket sizes of one (model, algorithm) are compiled first and timed round robin,
so the speedups are side-by-side ratios on a shared machine.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import cost_model, devices, names
from allreduce_jax.fusion import all_reduce_tree, plan_buckets
from allreduce_jax.results import fingerprint, run_context
from allreduce_jax.tools import compare, plot
from allreduce_jax.tools._args import (
  add_devices,
  add_rows_out,
  choice_list,
  figure_path,
  nonnegative_int,
  positive_int,
  row_store,
  text_table,
)
from allreduce_jax.tools._timing import time_round_robin

#: bucket label -> ``bucket_bytes`` of :func:`allreduce_jax.all_reduce_tree`.
BUCKETS: dict[str, int | None] = {
  "per-leaf": 0,
  "64KiB": 64 << 10,
  "1MiB": 1 << 20,
  "4MiB": 4 << 20,
  "25MiB": 25 << 20,
  "one": None,
}


def cnn_shapes() -> dict[str, tuple[int, ...]]:
  """Parameter shapes of the training CNN (``training/models.py``: Conv(1→16, 3×3),
  Conv(16→32, 3×3), Linear(4·4·32 → 10))."""
  return {
    "conv1/kernel": (3, 3, 1, 16),
    "conv1/bias": (16,),
    "conv2/kernel": (3, 3, 16, 32),
    "conv2/bias": (32,),
    "out/kernel": (4 * 4 * 32, 10),
    "out/bias": (10,),
  }


def transformer_shapes(
  layers: int = 16, d_model: int = 128, vocab: int = 1024, context: int = 256
) -> dict[str, tuple[int, ...]]:
  """A GPT-2-style parameter list: token and position embeddings, then per layer
  two LayerNorms (scale, bias), attention (qkv, proj: kernel and bias) and MLP (fc,
  proj: kernel and bias) — 12 leaves per layer — and a final LayerNorm.

  Example:
    >>> s = transformer_shapes(layers=16)
    >>> len(s), sum(int(np.prod(v)) for v in s.values())
    (196, 3336448)
  """
  d, h = d_model, 4 * d_model
  shapes: dict[str, tuple[int, ...]] = {"wte": (vocab, d), "wpe": (context, d)}
  for k in range(layers):
    shapes |= {
      f"h{k}/ln1/scale": (d,),
      f"h{k}/ln1/bias": (d,),
      f"h{k}/attn/qkv/kernel": (d, 3 * d),
      f"h{k}/attn/qkv/bias": (3 * d,),
      f"h{k}/attn/proj/kernel": (d, d),
      f"h{k}/attn/proj/bias": (d,),
      f"h{k}/ln2/scale": (d,),
      f"h{k}/ln2/bias": (d,),
      f"h{k}/mlp/fc/kernel": (d, h),
      f"h{k}/mlp/fc/bias": (h,),
      f"h{k}/mlp/proj/kernel": (h, d),
      f"h{k}/mlp/proj/bias": (d,),
    }
  shapes |= {"ln_f/scale": (d,), "ln_f/bias": (d,)}
  return shapes


def _leaf_values(p: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
  """Verifiable rank-coded integers (exact sums in any order): ``T[p, *shape]``."""
  n = int(np.prod(shape, dtype=np.int64))
  i = np.arange(p)[:, None]
  k = np.arange(n)[None, :]
  return compare.rank_coded(i, k, seed).astype(np.float32).reshape((p, *shape))


def measure_model(
  model: str,
  shapes: dict[str, tuple[int, ...]],
  algorithm: str,
  p: int,
  buckets: dict[str, int | None],
  iters: int,
  warmup: int,
  params=None,
) -> list[dict]:
  """Times ``all_reduce_tree`` of a float32 gradient pytree at every bucket size,
  side by side; checks each result against per-leaf ``lax.psum``."""

  mesh = devices.submesh((p,), ("i",))
  sharding = NamedSharding(mesh, P("i"))
  host = {name: _leaf_values(p, s, seed) for seed, (name, s) in enumerate(shapes.items())}
  tree = {
    name: devices.put(v.shape, v.dtype, sharding, lambda idx, v=v: v[idx])
    for name, v in host.items()
  }
  leaves = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes.values()]
  total = sum(int(np.prod(s)) * 4 for s in shapes.values())
  programs = []
  for label, bucket_bytes in buckets.items():

    def body(t, bucket_bytes=bucket_bytes):  # t: {name: f32[1, *shape]}
      local = jax.tree.map(lambda leaf: leaf[0], t)
      out = all_reduce_tree(local, "i", op="sum", algorithm=algorithm, bucket_bytes=bucket_bytes)
      return jax.tree.map(lambda leaf: leaf[None], out)

    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    plan = plan_buckets(leaves, bucket_bytes)
    sizes = [sum(int(np.prod(leaves[k].shape)) * 4 for k in grp) for grp in plan]
    programs.append((label, bucket_bytes, fn, sizes))

  def ref_body(t):
    return jax.tree.map(lambda b: jax.lax.psum(b[0], "i")[None], t)

  ref = jax.jit(
    jax.shard_map(ref_body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False)
  )(tree)
  timings = time_round_robin([(fn, (tree,)) for _, _, fn, _ in programs], iters, warmup)
  rows = []
  per_leaf = None
  for (label, bucket_bytes, _, sizes), t in zip(programs, timings):
    out = t.compiled(tree)
    wrong = sum(int(np.sum(devices.fetch(out[k]) != devices.fetch(ref[k]))) for k in shapes)
    if bucket_bytes == 0:
      per_leaf = t.median_s
    rows.append(
      {
        "model": model,
        "algorithm": algorithm,
        "bucket": label,
        "bucket_bytes": bucket_bytes,
        "n_leaves": len(shapes),
        "n_buckets": len(sizes),
        "bytes": total,
        "n_devices": p,
        **t.row(),
        "predicted_us": sum(cost_model.predict_us(algorithm, p, n, params) for n in sizes),
        "wrong": wrong,
        "backend": jax.default_backend(),
        "jax_version": jax.__version__,
        "process_count": jax.process_count(),
      }
    )
  for r in rows:
    r["speedup_vs_per_leaf"] = per_leaf / (r["time_us"] * 1e-6) if per_leaf else None
  return rows


def format_rows(rows: list[dict]) -> str:
  def speedup(r):
    sp = r.get("speedup_vs_per_leaf")
    return f"{sp:.2f}x" if sp else "-"

  return text_table(
    rows,
    [
      ("model", 12, lambda r: r["model"]),
      ("algorithm", 10, lambda r: r["algorithm"]),
      ("bucket", 9, lambda r: r["bucket"]),
      ("leaves", 6, lambda r: r["n_leaves"]),
      ("buckets", 7, lambda r: r["n_buckets"]),
      ("MiB", 7, lambda r: f"{r['bytes'] / 2**20:.2f}"),
      ("time(us)", 10, lambda r: f"{r['time_us']:.0f}"),
      ("min", 9, lambda r: f"{r['time_us_min']:.0f}"),
      ("max", 9, lambda r: f"{r['time_us_max']:.0f}"),
      ("model(us)", 10, lambda r: f"{r['predicted_us']:.0f}"),
      ("speedup", 7, speedup),
      ("#wrong", 6, lambda r: r["wrong"]),
    ],
  )


#: The gradient pytrees ``--models`` chooses from.
MODELS: tuple[str, ...] = ("cnn", "transformer")


def _single_axis() -> tuple[str, ...]:
  return names(axes=1)


#: The sizes when an option is not given, and with ``--smoke`` (explicit options win).
DEFAULTS = {"layers": 16, "d_model": 128, "iters": 7, "warmup": 2}
SMOKE = {"layers": 2, "d_model": 16, "iters": 3, "warmup": 1}


def configure(parser: argparse.ArgumentParser) -> None:
  add_devices(parser)
  parser.add_argument(
    "--algorithms",
    type=choice_list(_single_axis, "algorithms"),
    default=["ring", "psum"],
    help="single-axis algorithms (default ring,psum)",
  )
  parser.add_argument(
    "--models",
    type=choice_list(MODELS, "models"),
    default=["cnn", "transformer"],
    help=f"gradient pytrees to all-reduce, some of {','.join(MODELS)}",
  )
  parser.add_argument(
    "--layers", type=positive_int, default=None, help="transformer layers (12 leaves each)"
  )
  parser.add_argument("--d-model", type=positive_int, default=None, help="transformer width")
  parser.add_argument(
    "--buckets",
    type=choice_list(tuple(BUCKETS), "buckets"),
    default=list(BUCKETS),
    help=f"some of {','.join(BUCKETS)}",
  )
  parser.add_argument(
    "--iters", type=positive_int, default=None, help="timed iterations per bucket size (median)"
  )
  parser.add_argument(
    "--warmup", type=nonnegative_int, default=None, help="untimed iterations before them"
  )
  for action in parser._actions:  # the defaults in --help, where --smoke changes them
    if action.dest in DEFAULTS:
      action.help += f" (default {DEFAULTS[action.dest]}; --smoke: {SMOKE[action.dest]})"
  add_rows_out(parser, "results/fusion.jsonl")
  parser.add_argument(
    "--smoke", action="store_true", help="tiny models, few iterations (explicit options win)"
  )


def run(args: argparse.Namespace) -> int:

  if "per-leaf" not in args.buckets:
    args.buckets = ["per-leaf", *args.buckets]
  for name, value in (SMOKE if args.smoke else DEFAULTS).items():
    if getattr(args, name) is None:  # an option given explicitly wins over --smoke
      setattr(args, name, value)
  models = {
    "cnn": cnn_shapes(),
    "transformer": transformer_shapes(args.layers, args.d_model),
  }
  try:
    args.devices = devices.use_cpu_devices(args.devices)
  except ValueError as e:
    raise SystemExit(str(e)) from None

  p = jax.device_count() if jax.distributed.is_initialized() else args.devices
  main = jax.process_index() == 0
  # Every input and output problem is found here, before the first measurement.
  out = Path(args.out)
  context = {**run_context(), "n_devices": p, "iters": args.iters, "warmup": args.warmup}
  store = row_store(out, "fusion", fresh=args.fresh and main, context=context)
  fig = figure_path(args.plot or out.with_suffix(".png"), "--plot")
  done = {} if args.fresh else store.done()  # every process: the same (empty) set
  params = cost_model.load_default_params()
  buckets = {b: BUCKETS[b] for b in args.buckets}
  rows_all = []
  for m in args.models:
    shapes = models[m]
    for alg in args.algorithms:
      shape_id = fingerprint(shapes)  # the model's leaves (layers, width)
      keys = {b: store.key(model=m, shapes=shape_id, algorithm=alg, bucket=b) for b in buckets}
      if all(k in done for k in keys.values()):
        rows_all += [done[k] for k in keys.values()]
        continue
      if main:
        print(f"# fusion: {m} ({len(shapes)} leaves), {alg}, {p} devices ...", flush=True)
      with cost_model.use_params(params):  # what algorithm="auto" traces with
        rows = measure_model(m, shapes, alg, p, buckets, args.iters, args.warmup, params)
      if main:
        store.extend(rows, [keys[r["bucket"]] for r in rows])
      rows_all += rows
  if main and rows_all:
    print(format_rows(rows_all))
    plot.save(plot.fusion(rows_all, list(BUCKETS)), fig)
    print(f"# rows: {out}  figure: {fig}")
  return 0 if all(r["wrong"] == 0 for r in rows_all) else 1
