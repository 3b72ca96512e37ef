"""Error vs p of every lossy wire format: measured (JAX, p = 2..8) and replayed (NumPy, to 1024).

The inputs: 16,384 standard-normal float32 per participant;
the metric is the relative L2 error of the result against the float64 sum.

- measured: ``all_reduce(x, "i", algorithm=a, wire=w)`` on p emulated CPU devices, for
  every hand-written one-axis algorithm (ring and two_shot at every p = 2..8, the
  others at p = 2, 4, 8), with a check that every participant holds the same bits;
- replayed: ``allreduce_jax.wire_error.replay`` (the same arithmetic, bit for bit at
  the tested sizes) for the ring and two_shot at p = 2, 4, ..., 1024.

    python experiments/compression/compression_error.py                 # the rows
    python experiments/compression/compression_error.py --smoke

Rows: ``experiments/compression/rows/error_vs_p.jsonl`` (the row store, kind ``wire_error``);
their table ``rows/error_vs_p.md`` is ``tables.py``'s.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import all_reduce, names, results, wire_error
from allreduce_jax.devices import mesh_for, use_cpu_devices

#: A closed-form model of the relative L2 error (int8 block 256), for comparison.
MODEL = {
  ("ring", "int8"): {2: 8.6e-3, 8: 1.45e-2, 16: 2.0e-2, 64: 4.0e-2},
  ("two_shot", "int8"): {2: 9.9e-3, 8: 9.7e-3, 16: 9.9e-3, 64: 1.0e-2},
  ("ring", "bf16"): {2: 2.0e-3, 8: 3.5e-3, 16: 4.8e-3, 64: 9.6e-3},
}


@dataclass(frozen=True)
class Config:
  n: int = 16384
  measured_ps: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8)
  replay_ps: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
  wires: tuple[str, ...] = ("bf16", "int8", "fp8")
  seed: int = 0
  out: str = "experiments/compression/rows/error_vs_p.jsonl"


def inputs(p: int, n: int, seed: int):
  return np.random.default_rng([seed, p]).standard_normal((p, n)).astype(np.float32)


def row(cfg: Config, source: str, algorithm: str, wire: str, p: int, out, x, **more) -> dict:
  """One cell's row (printed as it is made): ``out``'s relative error against the sum of
  ``x``, beside the closed-form model's where it has one."""
  rel = wire_error.relative_error(out, x)
  r = dict(source=source, algorithm=algorithm, wire=wire, p=p, n=cfg.n, rel_error=rel, **more)
  r["model"] = MODEL.get((algorithm, wire), {}).get(p)
  print(json.dumps(r), flush=True)
  return r


def measured(cfg: Config) -> list[dict]:
  rows = []
  for alg in names(axes=1, hand_written=True, priced=True):
    ps = cfg.measured_ps if alg in wire_error.REPLAYED else (2, 4, 8)
    for p in (q for q in ps if q in cfg.measured_ps):
      x = inputs(p, cfg.n, cfg.seed)
      mesh, axis = mesh_for(alg, p)
      xs = jax.device_put(x.reshape(-1), NamedSharding(mesh, P(axis)))
      for wire in cfg.wires:
        f = jax.jit(
          jax.shard_map(
            lambda b, a=alg, w=wire, ax=axis: all_reduce(b, ax, algorithm=a, wire=w),
            mesh=mesh,
            in_specs=P(axis),
            out_specs=P(axis),
          )
        )
        out = np.asarray(f(xs)).reshape(p, cfg.n)
        same = all(np.array_equal(out[0].view(np.uint32), r.view(np.uint32)) for r in out)
        rows.append(row(cfg, "measured", alg, wire, p, out[0], x, replicas_identical=same))
  return rows


def replayed(cfg: Config) -> list[dict]:
  rows = []
  for p in cfg.replay_ps:
    x = inputs(p, cfg.n, cfg.seed)
    for alg in wire_error.REPLAYED:
      for wire in cfg.wires:
        rows.append(row(cfg, "replay", alg, wire, p, wire_error.replay(alg, x, wire), x))
  return rows


def measure(args: argparse.Namespace) -> None:
  """Every replayed and measured cell, into ``--out`` through the row store (emptied
  first: one run's rows), then the table printed."""
  cfg = Config(out=args.out)
  if args.smoke:
    cfg = Config(n=1024, measured_ps=(2, 4), replay_ps=(2, 4, 16), out=args.out)
  use_cpu_devices(max(cfg.measured_ps))
  rows = replayed(cfg) + measured(cfg)
  store = results.RowStore(cfg.out, "wire_error")
  store.reset()
  store.extend(
    rows, [store.key({k: r[k] for k in ("source", "algorithm", "wire", "p", "n")}) for r in rows]
  )
  print(
    f"{len(rows)} rows into {cfg.out}; python experiments/compression/tables.py draws the table"
  )


def parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--smoke", action="store_true", help="p <= 4, replay to 16, n = 1024")
  ap.add_argument("--out", default=Config.out, help="the rows' file (.jsonl; one run's rows)")
  return ap


if __name__ == "__main__":
  measure(parser().parse_args())
