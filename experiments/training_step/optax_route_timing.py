"""Timing of the optax route: the README's "Train with it" step with the ring vs XLA's psum.

One run times, side by side (round-robin, so load drifts hit every variant alike), the
same jitted data-parallel step (Flax NNX MLP on digits, Adam, replicated parameters,
batch sharded over 8 emulated CPU devices) with ``all_reduce_gradients`` on the
hand-written ring, on ``algorithm="psum"`` (XLA's own all-reduce), and with a plain
``lax.pmean``, with the tools' one timer (``tools.bench.time_round_robin``): ``--trials`` trials of ``--steps``
timed steps each, median of the trial medians, min/max/IQR over every timed step; printed
and appended through the row store (kind ``route_timing``), one row per variant.

  python experiments/training_step/optax_route_timing.py --trials 7 --steps 20 \
    --out experiments/training_step/rows/optax_route_timing.jsonl
"""

import argparse

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from sklearn.datasets import load_digits

from allreduce_jax import all_reduce_gradients, results
from allreduce_jax.tools.bench import time_round_robin


def pmean_transform(axis_name):
  return optax.GradientTransformation(
    lambda params: optax.EmptyState(),
    lambda updates, state, params=None: (jax.lax.pmean(updates, axis_name), state),
  )


def build(first, mesh, hidden):
  rngs = nnx.Rngs(0)
  model = nnx.Sequential(
    nnx.Linear(64, hidden, rngs=rngs), nnx.relu, nnx.Linear(hidden, 10, rngs=rngs)
  )
  graphdef, params = nnx.split(model)
  tx = optax.chain(first, optax.adam(1e-2))

  def loss_fn(params, x, y):
    logits = nnx.merge(graphdef, params)(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @jax.jit
  @jax.shard_map(mesh=mesh, in_specs=(P(), P(), P("data"), P("data")), out_specs=(P(), P()))
  def step(params, opt_state, x, y):
    grads = jax.grad(loss_fn)(jax.lax.pcast(params, "data", to="varying"), x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  return step, params, tx.init(params)


def time_routes(args: argparse.Namespace) -> None:
  """Every variant's step, side by side; one row each."""
  jax.config.update("jax_num_cpu_devices", 8)  # before the backend starts
  mesh = jax.make_mesh((8,), ("data",))
  x, y = load_digits(return_X_y=True)
  x = jax.device_put(jnp.asarray(x[:1792] / 16, jnp.float32), NamedSharding(mesh, P("data")))
  y = jax.device_put(jnp.asarray(y[:1792]), NamedSharding(mesh, P("data")))
  variants = {
    "all_reduce_gradients(ring)": all_reduce_gradients("data", algorithm="ring"),
    "all_reduce_gradients(psum)": all_reduce_gradients("data", algorithm="psum"),
    "lax.pmean": pmean_transform("data"),
  }
  programs, n_params = [], 0
  for first in variants.values():
    step, params, opt_state = build(first, mesh, args.hidden)
    programs.append((step, (params, opt_state, x, y)))
    n_params = sum(a.size for a in jax.tree.leaves(params))
  # The project's one timer: compile apart, warm up, then every variant in turn
  # (round-robin), `--trials` trials of `--steps` timed steps; median of trial medians.
  with jax.numpy_dtype_promotion("standard"):
    timings = time_round_robin(programs, iters=args.steps, warmup=3, trials=args.trials)
  ref = timings[1].median_s
  store = results.RowStore(args.out, "route_timing")
  run = len(store.rows()) // len(variants) + 1
  for name, t in zip(variants, timings):
    row = {
      "variant": name, **t.row(), "devices": 8, "backend": jax.default_backend(),
      "jax_version": jax.__version__, "params": int(n_params), "hidden": args.hidden,
      "vs_psum": t.median_s / ref,
      "command": "python experiments/training_step/optax_route_timing.py"
      f" --trials {args.trials} --steps {args.steps} --hidden {args.hidden}",
    }  # fmt: skip
    store.append(row, store.key(variant=name, trials=args.trials, steps=args.steps,
                                hidden=args.hidden, run=run))  # fmt: skip
    print(
      f"{name:>28}: {t.median_s * 1e3:8.2f} ms/step (min {t.min_s * 1e3:.2f}, max"
      f" {t.max_s * 1e3:.2f}, IQR {t.iqr_s * 1e3:.2f}; {args.trials} trials of {args.steps}"
      f" steps)  x{t.median_s / ref:.2f} of psum"
    )


def parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--trials", type=int, default=7)
  ap.add_argument("--steps", type=int, default=20)
  ap.add_argument("--hidden", type=int, default=32)
  ap.add_argument("--out", default="experiments/training_step/rows/optax_route_timing.jsonl")
  return ap


if __name__ == "__main__":
  time_routes(parser().parse_args())
