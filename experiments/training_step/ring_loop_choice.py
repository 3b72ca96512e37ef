"""Why the ring's steps are an unrolled Python loop and not ``lax.fori_loop``.

Compiles both forms of the same ring all-reduce (the library's unrolled one, and a
``fori_loop`` variant written here only for this comparison) and times them side by
side with the tools' one timer (``tools._timing``), with ``psum`` as the yardstick.

    python experiments/ring_loop_choice.py            # 8 devices, 4 KiB / 1 MiB / 16 MiB
    python experiments/ring_loop_choice.py --smoke
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
  devices: int = 8
  sizes: tuple[int, ...] = (4 << 10, 1 << 20, 16 << 20)
  iters: int = 9
  trials: int = 3


def ring_fori_loop(flat, axis_name, combine):
  """The ring with both phases as ``lax.fori_loop`` (one permute in the HLO each)."""
  import jax.numpy as jnp
  from jax import lax

  from allreduce_jax import _comm

  p, i, n = _comm.size(axis_name), _comm.index(axis_name), flat.shape[0]
  flat = _comm.pad_to_multiple(flat, p)  # T[p*c]
  c = flat.shape[0] // p
  pairs = _comm.shift_pairs(p, 1)

  def reduce_step(s, acc):  # acc: T[c]
    return combine(_comm.send(acc, axis_name, pairs), _comm.chunk(flat, (i - (s + 2)) % p, c))

  acc = lax.fori_loop(0, p - 1, reduce_step, _comm.chunk(flat, (i - 1) % p, c))
  out = _comm.make_varying(jnp.zeros_like(flat), axis_name)
  out = lax.dynamic_update_slice_in_dim(out, acc, i * c, 0)

  def gather_step(s, carry):
    cur, out = carry
    cur = _comm.send(cur, axis_name, pairs)
    return cur, lax.dynamic_update_slice_in_dim(out, cur, ((i - (s + 1)) % p) * c, 0)

  _, out = lax.fori_loop(0, p - 1, gather_step, (acc, out))
  return out[:n]


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--smoke", action="store_true", help="tiny sizes, few iterations")
  args = parser.parse_args(argv)
  cfg = Config(sizes=(4 << 10, 64 << 10), iters=3, trials=1) if args.smoke else Config()

  import jax

  jax.config.update("jax_num_cpu_devices", cfg.devices)
  import jax.numpy as jnp
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from allreduce_jax import all_reduce, devices
  from allreduce_jax.tools._timing import time_round_robin

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
  main()
