"""Why the ring's steps are an unrolled Python loop and not ``lax.fori_loop``.

Compiles both forms of the same ring all-reduce (the library's unrolled one, and a
``fori_loop`` variant written here only for this comparison) and times them side by
side with the tools' one timer (``tools.bench.time_round_robin``), with ``psum`` as the yardstick.

    python experiments/training_step/ring_loop_choice.py            # 8 devices, 4 KiB / 1 MiB / 16 MiB
    python experiments/training_step/ring_loop_choice.py --smoke
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import all_reduce, devices
from allreduce_jax.tools.bench import time_round_robin


@dataclass(frozen=True)
class Config:
  devices: int = 8
  sizes: tuple[int, ...] = (4 << 10, 1 << 20, 16 << 20)
  iters: int = 9
  trials: int = 3


def ring_fori_loop(flat, axis_name, combine):
  """The ring with both phases as ``lax.fori_loop`` (one permute in the HLO each), in
  plain JAX: reduce-scatter, then all-gather, each p − 1 shifts by one."""
  p, i, n = lax.axis_size(axis_name), lax.axis_index(axis_name), flat.shape[0]
  flat = jnp.pad(flat, (0, (-n) % p))  # T[p*c]
  c = flat.shape[0] // p
  pairs = [(j, (j + 1) % p) for j in range(p)]

  def chunk(k):
    return lax.dynamic_slice_in_dim(flat, k * c, c)

  def reduce_step(s, acc):  # acc: T[c]
    return combine(lax.ppermute(acc, axis_name, pairs), chunk((i - (s + 2)) % p))

  acc = lax.fori_loop(0, p - 1, reduce_step, chunk((i - 1) % p))
  out = jnp.zeros_like(flat)  # varying over the axis, as flat is
  out = lax.dynamic_update_slice_in_dim(out, acc, i * c, 0)

  def gather_step(s, carry):
    cur, out = carry
    cur = lax.ppermute(cur, axis_name, pairs)
    return cur, lax.dynamic_update_slice_in_dim(out, cur, ((i - (s + 1)) % p) * c, 0)

  _, out = lax.fori_loop(0, p - 1, gather_step, (acc, out))
  return out[:n]


def parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--smoke", action="store_true", help="tiny sizes, few iterations")
  return ap


def compare(args: argparse.Namespace) -> None:
  """Both forms and ``psum`` at every size, side by side: compile time, median, over psum."""
  cfg = Config(sizes=(4 << 10, 64 << 10), iters=3, trials=1) if args.smoke else Config()
  jax.config.update("jax_num_cpu_devices", cfg.devices)
  mesh = devices.submesh((cfg.devices,), ("i",))
  variants = {
    "unrolled": lambda b: all_reduce(b, "i", algorithm="ring"),
    "fori_loop": lambda b: ring_fori_loop(b, "i", lax.add),
    "psum": lambda b: lax.psum(b, "i"),
  }
  print(f"{'bytes':>10} {'variant':<10} {'compile ms':>10} {'median us':>10} {'vs psum':>8}")
  for nbytes in cfg.sizes:
    n = nbytes // 4
    x = jax.device_put(jnp.ones((cfg.devices * n,), jnp.float32), NamedSharding(mesh, P("i")))
    programs = [
      (jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("i"), out_specs=P("i"))), (x,))
      for fn in variants.values()
    ]
    timings = dict(zip(variants, time_round_robin(programs, cfg.iters, 2, cfg.trials)))
    psum = timings["psum"].median_s
    for name, t in timings.items():
      print(
        f"{nbytes:>10} {name:<10} {t.compile_s * 1e3:>10.0f} {t.median_s * 1e6:>10.0f}"
        f" {t.median_s / psum:>7.2f}x"
      )


if __name__ == "__main__":
  compare(parser().parse_args())
