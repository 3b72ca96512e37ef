# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 6 · Stragglers, their mitigations, and when asynchrony pays
#
# A synchronous step ends when the **last** worker's gradient arrives, so random compute
# times make sync SGD sub-linear. The classic remedies are **backup workers** (drop the
# slowest b gradients), **batch sizes proportional to speed** on heterogeneous hardware,
# **isolating** a persistently slow node, and **asynchronous SGD** through a parameter
# server (never wait, but gradients are stale and every one crosses the server's link).
#
# Every arm here runs on one clock: simulated seconds of compute (a straggler model)
# **plus communication priced by the project's cost model** — the all-reduce for sync,
# a FIFO queue at the server's link for the parameter server. The arms are records with
# one interface (`allreduce_jax.training.arms`); this notebook only calls the library.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"  # CI runs the small mode
DEVICES = 8
SIM_STEPS = 2_000 if SMALL else 20_000  # simulated sync steps per point
NS = [2, 4, 8, 16, 32, 64]  # workers, for the H_N table

# %%
import jax

jax.config.update("jax_num_cpu_devices", DEVICES)  # before the first JAX computation

import numpy as np
import pandas as pd
from IPython.display import Markdown, display

from allreduce_jax import cost_model
from allreduce_jax.tools import report
from allreduce_jax.training import arms, async_sim, configs, experiments, figures, tables

OUT = report.results_dir("notebooks", "08")
print(jax.__version__, jax.default_backend(), len(jax.devices()), "devices")

# %% [markdown]
# ## 1 · A sync step waits for the slowest worker
#
# For N independent Exp(1) compute times the expected maximum is the harmonic number
# H_N = 1 + 1/2 + … + 1/N ≈ ln N + 0.577; with b backup workers (the fastest N − b
# kept) it is H_N − H_b. Log-normal times with spread σ grow more slowly, heavy tails
# faster. `async_sim.sync_schedule` simulates the steps.

# %%
step = pd.DataFrame(
  {
    "N": NS,
    "H_N": [async_sim.harmonic(n) for n in NS],
    "exponential": [
      async_sim.sync_schedule("exponential", n, SIM_STEPS, seed=1).step_time.mean() for n in NS
    ],
    "exponential, 1 backup": [
      async_sim.sync_schedule("exponential", n, SIM_STEPS, seed=1, backups=1).step_time.mean()
      for n in NS
    ],
    "H_N − H_1": [async_sim.harmonic(n) - 1 for n in NS],
    "lognormal σ=0.5": [
      async_sim.sync_schedule("lognormal:0.5", n, SIM_STEPS, seed=1).step_time.mean() for n in NS
    ],
    "lognormal σ=1.5": [
      async_sim.sync_schedule("lognormal:1.5", n, SIM_STEPS, seed=1).step_time.mean() for n in NS
    ],
  }
).set_index("N")
display(step.round(3))

# %% [markdown]
# Sync's efficiency per gradient is 1/E[step]: at N = 8 exponential workers only
# 1/H_8 ≈ 37 % of the machines' time turns into gradients. An asynchronous worker never
# waits (N updates per unit time), and its mean staleness is N − 1 whatever the
# distribution.
#
# ## 2 · Every arm on one clock: Table C
#
# Eight workers, one of them 4× slower (`speeds`), log-normal (σ = 0.5) jitter, 25 ms per
# mean gradient, communication priced on 100 GbE at the model's real size. Each arm
# computes the same number of gradients; the time to the target includes
# communication. `sync_balanced` gives the slow worker a proportionally smaller batch;
# `sync_isolate` removes a worker whose running mean exceeds 2× the median and
# redistributes its data; `ssp{s}` bounds how far a worker may run ahead.

# %%
tc_cfg = configs.TableCConfig.smoke() if SMALL else configs.TableCConfig()
tc_rows = experiments.run_table_c(tc_cfg, OUT / "table_c", smoke=SMALL, log=lambda line: None)
display(Markdown(tables.setup_line(tc_cfg) + "\n\n" + tables.table_c(tc_rows)))
figures.table_c_figure(tc_rows)

# %% [markdown]
# ## 3 · The parameter server's link
#
# A parameter server receives every gradient and sends back the parameters: with N
# workers its link carries N models each way per N updates, where a ring all-reduce
# moves 2(N−1)/N models per worker per step. With no compute at all the server applies
# at most bandwidth / model bytes updates per second on a full-duplex link (half on a
# shared one, × S with S shards) — the closed form the tests check against the queue.

# %%
links = []
for name in ("10gbe", "100gbe", "ib_ndr", "nvlink4"):
  s = arms.Setup(model_params=100_000_000, network=name)
  links.append(
    {
      "network": name,
      "GB/s": 1e-9 / cost_model.PRESETS[name].beta,
      "ring all-reduce, 8 workers (s)": arms.allreduce_seconds(s),
      "one push or pull (s)": arms.ps_message_seconds(s),
      "server bound (updates/s)": 1 / arms.ps_message_seconds(s),
      "ring bytes/sample": arms.get_arm("sync").bytes_per_sample(s),
      "PS bytes/sample": arms.get_arm("async").bytes_per_sample(s),
    }
  )
display(pd.DataFrame(links).set_index("network").round(4))

# %% [markdown]
# ## 4 · The phase diagram: who reaches the target first
#
# For each straggler heaviness (log-normal σ, columns) and link bandwidth (rows), every
# arm is trained along its own timeline pricing a 100 M-parameter model (the digits
# network is trained; the messages are priced at the larger size), and the cell shows the
# fastest. Sync arms' training does not depend on the bandwidth (only their clock does),
# so it is trained once per σ and re-priced.

# %%
ph_cfg = (
  configs.PhaseConfig.smoke()
  if SMALL
  else configs.PhaseConfig(
    sigmas=(0.0, 0.5, 1.5),
    bandwidths_GBps=(0.1, 1.0, 10.0, 100.0, 1000.0),
    arms=("sync", "sync_b1", "async", "ssp4"),
  )
)
ph_rows = experiments.run_phase(ph_cfg, OUT / "phase", smoke=SMALL, log=lambda line: None)
cells = experiments.phase_cells(ph_cfg, ph_rows)
display(Markdown(tables.phase_table(cells) + "\n\n" + tables.phase_boundary(cells)))
figures.phase_figure(cells)

# %% [markdown]
# ## What this run showed


# %%
def median_ttt(arm):
  t = [r["time_to_target"] for r in tc_rows if r["arm"] == arm]
  return float(np.median([np.inf if v is None else v for v in t])) if t else np.nan


fastest = min(dict.fromkeys(r["arm"] for r in tc_rows), key=median_ttt)
ps_wins = sorted({(c["sigma"], c["bandwidth_GBps"]) for c in cells if c["winner"] == c["arm"]
                  and c["family"] == "ps"})  # fmt: skip
print(
  f"A sync step on 8 exponential workers took {step.loc[8, 'exponential']:.2f} mean gradients"
  f" (H_8 = {step.loc[8, 'H_N']:.2f}); one backup brought it to"
  f" {step.loc[8, 'exponential, 1 backup']:.2f}. In Table C (one 4×-slow worker) plain sync"
  f" reached the target in {median_ttt('sync'):.3g} s, the fastest arm was {fastest}"
  f" ({median_ttt(fastest):.3g} s). In the phase diagram a parameter-server arm won"
  f" {len(ps_wins)} of {len(cells) // len(ph_cfg.arms)} cells: (σ, GB/s) = {ps_wins}."
)
