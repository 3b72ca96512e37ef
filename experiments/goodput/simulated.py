"""The asynchronous parameter server against synchronous all-reduce with workers dying,
simulated (no cluster): real training, simulated clocks (:func:`failures.race`); what
``run.py simulate`` runs, its rows through the store it is given."""

from __future__ import annotations

import math

from allreduce_jax import devices, goodput, results
from allreduce_jax.training import catalogue, failures

#: What the simulation takes from the measurements (4 hosts, the digits MLP): seconds a
#: synchronous step, the share of it a worker computes, a push or pull of the 38 KB model
#: through the server's 200 Mbit/s link (with α), a background save's cost.
SIM_STEP_S, SIM_COMPUTE, SIM_MESSAGE, SIM_SAVE_S = 0.015, 0.67, 0.13, 0.036


def simulate(args, store: results.RowStore) -> None:
  """The asynchronous parameter server against synchronous all-reduce under the same
  schedules (:func:`failures.race`), per model size (a step ``--scale`` times the measured
  one, its save as much longer, the checkpoint cadence Young and Daly's), MTBF and seed."""
  devices.use_cpu_devices(8)
  workload = catalogue.digits_workload("mlp", 0.95)(False)
  for scale in args.scale:
    step = SIM_STEP_S * scale
    for mtbf in args.mtbf:
      every = max(1, round(math.sqrt(2 * SIM_SAVE_S * scale * mtbf) / step))
      clocks = failures.Race(workers=args.hosts, step_s=step, compute_s=SIM_COMPUTE * step,
                             message_s=SIM_MESSAGE * step, recovery_s=args.recovery_s,
                             checkpoint_every=every, steps=600)  # fmt: skip
      for seed in args.seeds:
        key = store.key(mtbf_s=mtbf, seed=seed, hosts=args.hosts, scale=scale,
                        recovery_s=args.recovery_s)  # fmt: skip
        if key in store.done():
          continue
        schedule = goodput.poisson_schedule(mtbf, 1e5, args.hosts, seed=seed)
        row = failures.race(workload, schedule, clocks, seed=seed)
        store.append(
          {"mtbf_s": mtbf, "seed": seed, "hosts": args.hosts, "scale": scale, **row}, key
        )
        print(
          f"scale {scale} MTBF {mtbf} seed {seed}: sync {row['sync_s']} s, PS {row['ps_s']} s",
          flush=True,
        )
