# %% [markdown]
# # 8 · Stragglers, their mitigations, and when asynchrony pays
#
# A synchronous step ends when the **last** worker's gradient arrives, so random compute
# times make synchronous SGD slower than its average worker. This notebook first
# simulates that wait in a few lines of NumPy and checks it against the closed form, then
# puts the classic remedies on one simulated clock — **backup workers** (drop the slowest
# gradients), **batches proportional to speed**, **isolating** a slow node, and
# **asynchronous SGD** through a parameter server (never wait, but every gradient is
# stale and crosses the server's one link) — and ends with a phase diagram: which of them
# reaches the target accuracy first, by straggler heaviness and link bandwidth. Two
# cells ask you for a number first; one asks you to write the backup workers' wait.
#
# **Run time.** Full mode 72 s on 2 CPU cores; small mode
# (`ALLREDUCE_JAX_SMALL=1` in the environment, or the kernel "allreduce-jax small" in
# JupyterLab) 20–50 s: fewer simulated steps, a shorter training budget, one
# seed, and a smaller phase grid (the run prints it). Every
# sentence below is computed from the run; where small mode is too small to support one,
# the text says so and why.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"  # CI runs the small mode
SIM_STEPS = 2_000 if SMALL else 20_000  # simulated sync steps per point (section 1)
NS = [2, 4, 8, 16, 32, 64]  # workers, for the wait of section 1
WORKERS = 8  # workers of the training runs (sections 2 and 4)
GRADIENTS = 160 if SMALL else 1600  # per-worker gradients each arm computes, in all
SEEDS = (0,) if SMALL else (0, 1, 2)
ARMS = ["sync", "sync_b1", "sync_balanced", "sync_isolate", "async", "ssp4"]
SIGMAS = (0.0, 1.5) if SMALL else (0.0, 0.5, 1.0, 1.5)  # phase diagram: straggler heaviness
BANDWIDTHS = (0.1, 100.0) if SMALL else (0.1, 1.0, 10.0, 100.0, 1000.0)  # GB/s per direction
PHASE_ARMS = ("sync", "async") if SMALL else ("sync", "sync_b1", "async", "ssp4")

# %%
import jax

jax.config.update("jax_num_cpu_devices", 8)  # before the first JAX computation

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from allreduce_jax import cost_model, teach
from allreduce_jax.training import (
  ComputeTimes,
  Setup,
  get_arm,
  get_workload,
  harmonic,
  run_arm,
  sync_schedule,
)

print(jax.__version__, jax.default_backend(), len(jax.devices()), "devices")

from allreduce_jax.results import source_commit

print("allreduce-jax at commit", source_commit() or "(not a git checkout)")

# %% [markdown]
# ## 1 · A sync step waits for the slowest worker
#
# Draw one compute time per worker per step and take the largest: that is how long a
# synchronous step waits. For N independent Exp(1) times (mean 1, a memoryless worker)
# the expected maximum is the harmonic number H_N = 1 + 1/2 + … + 1/N ≈ ln N + 0.577.
# With b **backup workers** the step keeps the fastest N − b gradients and waits for
# the (N − b)-th: E = H_N − H_b. Log-normal times with spread σ (mean 1 too) grow more
# slowly with N when σ is small and faster when it is large.
#
# ### Predict before you run
#
# Eight workers, each gradient taking an exponential time of mean 1. **How long does a
# synchronous step wait, on average, in mean gradient times?**

# %% tags=["predict"]
guess = None  # the mean wait of a sync step, 8 workers, exponential times

# %%
rng = np.random.default_rng(0)
draws = {
  "exponential": rng.exponential(1.0, (SIM_STEPS, max(NS))),
  "lognormal σ=0.5": rng.lognormal(-(0.5**2) / 2, 0.5, (SIM_STEPS, max(NS))),
  "lognormal σ=1.5": rng.lognormal(-(1.5**2) / 2, 1.5, (SIM_STEPS, max(NS))),
}
wait = pd.DataFrame(
  {
    **{name: [t[:, :n].max(axis=1).mean() for n in NS] for name, t in draws.items()},
    # the (N-1)-th fastest of N: one backup worker
    "exponential, 1 backup": [
      np.sort(draws["exponential"][:, :n], axis=1)[:, n - 2].mean() for n in NS
    ],
    "H_N": [harmonic(n) for n in NS],
    "H_N − H_1": [harmonic(n) - 1 for n in NS],
  },
  index=pd.Index(NS, name="N"),
)
teach.reveal(guess, wait.loc[8, "exponential"], what="a sync step's mean wait, 8 workers")
wait.round(3)

# %%
fig, ax = plt.subplots(figsize=(7, 3.8))
for name, marker in zip(
  ["exponential", "exponential, 1 backup", "lognormal σ=0.5", "lognormal σ=1.5"], "osv^"
):
  ax.plot(NS, wait[name], marker=marker, ls="none", label=f"simulated: {name}")
ax.plot(NS, wait["H_N"], "k-", lw=1, label="H_N (closed form)")
ax.plot(NS, wait["H_N − H_1"], "k--", lw=1, label="H_N − H_1 (closed form)")
ax.set_xscale("log", base=2)
ax.set_xlabel("workers N")
ax.set_ylabel("mean step time\n(in mean gradient times)")
ax.set_title("a synchronous step waits for its slowest worker")
ax.grid(True, alpha=0.3)
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
fig.tight_layout()
plt.show()

# The library's schedule draws its own times; it must agree with the closed form too.
lib = sync_schedule("exponential", 8, SIM_STEPS, seed=1).step_time.mean()
gap_closed = float(np.max(np.abs(wait["exponential"] / wait["H_N"] - 1)))
gap_backup = float(np.max(np.abs(wait["exponential, 1 backup"] / wait["H_N − H_1"] - 1)))
print(
  f"simulated / closed form, worst over N: {gap_closed:.1%} (no backup), "
  f"{gap_backup:.1%} (1 backup); library sync_schedule at N=8: {lib:.3f} vs H_8 = "
  f"{harmonic(8):.3f}"
)

# %% [markdown]
# ### Predict before you run
#
# With one backup worker the step keeps the fastest 7 of 8 gradients. **How long does it
# wait now?**

# %% tags=["predict"]
guess = None  # the mean wait with one backup worker, 8 workers

# %%
teach.reveal(guess, wait.loc[8, "exponential, 1 backup"], what="the wait with one backup worker")

# %% [markdown]
# ### Try this: the backup workers' wait
#
# Given compute times `t` (f64[S, N]: row k holds the N workers' times of step k), write
# the mean wait of a step that keeps the fastest N − b gradients. The check compares it
# with the library's `sync_schedule(..., backups=b)` for b = 0, 1, 2.


# %% tags=["exercise"]
def backup_wait(t, b):  # t: f64[S, N]; b backup workers -> the mean step time
  raise NotImplementedError("your turn: each step waits for its (N − b)-th fastest worker")


# %% tags=["check"]
def backup_is_right():
  times = ComputeTimes("exponential", 8, seed=3)
  return teach.agree(
    (f"with b={b}", backup_wait(times.rows(500), b),
     sync_schedule("exponential", 8, 500, seed=3, backups=b, times=times).step_time.mean())
    for b in (0, 1, 2)
  )  # fmt: skip


teach.check(
  backup_is_right,
  right="the (N − b)-th fastest time of each step, averaged: what backup workers buy.",
  wrong="sort each step's times; the step ends at the (N − b)-th smallest",
)

# %% [markdown] tags=["solution"]
# <details><summary>Solution</summary>
#
# ```python
# def backup_wait(t, b):  # t: f64[S, N]; b backup workers -> the mean step time
#   n = t.shape[1]
#   return np.sort(t, axis=1)[:, n - b - 1].mean()
# ```
# </details>

# %% [markdown]
# Synchronous SGD turns 1/E[step] of its machines' time into gradients. An
# asynchronous worker never waits, so it keeps all of it — at a price: while it computes,
# the other N − 1 workers each push a gradient on average, so its own gradient arrives
# N − 1 updates stale (notebook 7 measures what staleness costs in accuracy).
#
# ## 2 · Every remedy on one clock
#
# Now real training. Every arm below trains the same small network on the 8×8 digits,
# computes the same number of per-worker gradients, starts from the same weights, and
# runs on one simulated clock: compute times drawn per gradient (log-normal jitter, the
# setup printed below) with **one worker 4× slower than the rest**, plus communication
# priced by the α-β cost model on a link preset at the network's real size. An arm is a record
# (`allreduce_jax.training.ARMS`) with a schedule, a training replay and a price;
# `run_arm` schedules it, trains it and reads off the simulated time at which the test
# accuracy first reached the target.

# %%
wl = get_workload("digits_mlp", smoke=SMALL)
setup = Setup(workers=WORKERS, speeds=(1.0,) * (WORKERS - 1) + (0.25,), gradients=GRADIENTS)
print(
  f"{setup.workers} workers at speeds {setup.speeds}, compute {setup.compute},"
  f" {setup.compute_s * 1e3:g} ms per mean gradient, network {setup.network},"
  f" {setup.gradients} gradients per worker"
)
for a in ARMS:
  print(f"{a:>14}: {get_arm(a).summary}")
rows = [run_arm(get_arm(a), setup, wl, seed) for a in ARMS for seed in SEEDS]
runs = pd.DataFrame(rows)
table = runs.groupby("arm", sort=False).agg(
  time_to_target_s=("time_to_target", lambda t: t.median() if t.notna().all() else np.inf),
  reached=("time_to_target", lambda t: f"{t.notna().sum()}/{len(t)}"),
  final_accuracy=("final_metric", "median"),
  total_time_s=("total_time", "median"),
)
print(f"target: test accuracy {wl.target}; median over {len(SEEDS)} seed(s)")
table.round(3)

# %%
fig, ax = plt.subplots(figsize=(7, 3.8))
for (a, r), ls in zip(runs[runs["seed"] == SEEDS[0]].set_index("arm").iterrows(), ["-", "--"] * 9):
  ax.plot(r["eval_time"], r["test_metric"], ls, marker=".", label=a)
ax.axhline(wl.target, color="k", lw=0.8, ls=":")
reached = table["time_to_target_s"][np.isfinite(table["time_to_target_s"])]
if len(reached):  # the interesting part: until the slowest arm reached the target, and on
  ax.set_xlim(0, min(runs["total_time"].max(), 2.5 * reached.max()))
ax.set_xlabel("simulated seconds (compute + communication)")
ax.set_ylabel("test accuracy")
ax.set_ylim(max(0.0, wl.target - 0.4), 1.0)
ax.set_title(f"{WORKERS} workers, one 4× slower (seed {SEEDS[0]})")
ax.grid(True, alpha=0.3)
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# Plain sync runs at the slow worker's pace. A backup worker drops the slowest gradient
# of each step (here nearly always the slow worker's); a balanced batch gives the slow
# worker a quarter of the batch so everyone finishes together; isolation removes the
# worker once its running mean passes 2× the median. The parameter server (`async`) never
# waits; `ssp4` lets no worker run more than 4 updates ahead of the slowest.
#
# ## 3 · The parameter server's link
#
# The server receives every gradient and sends back the parameters: with N workers its
# one link carries N models each way for every N updates, where a ring all-reduce moves
# 2(N−1)/N of a model per worker per step, all links busy at once. In the α-β model one
# push through the server's link costs α + β·(model bytes), so even with no compute at all
# the server applies at most 1 / (α + β·bytes) updates per second. For a 100 M-parameter
# model (400 MB of float32) on each link preset:

# %%
model_bytes = 100_000_000 * 4
links = []
for name in ("10gbe", "100gbe", "ib_ndr", "nvlink4"):
  q = cost_model.PRESETS[name]
  push = q.alpha + q.beta * model_bytes  # one push (or pull) through the server's link
  ring = cost_model.predict_seconds("ring", WORKERS, model_bytes, q)
  links.append(
    {
      "network": name,
      "GB/s per direction": 1e-9 / q.beta,
      f"ring, {WORKERS} workers (s)": ring,
      "one push (s)": push,
      "server bound (updates/s)": 1 / push,
      f"{WORKERS} pushes / ring": WORKERS * push / ring,
    }
  )
links = pd.DataFrame(links).set_index("network")
links.round(4)

# %% [markdown]
# The last column is the heart of the trade: N async updates (each one worker's batch)
# take that many times the link time of one synchronous step (all N workers' batches,
# averaged in one ring all-reduce). Asynchrony pays only where waiting for stragglers costs
# more than that.
#
# ## 4 · The phase diagram: who reaches the target first
#
# For each straggler heaviness (log-normal σ) and link bandwidth, every arm is trained
# along its own timeline, pricing a 100 M-parameter model (the digits network is what
# trains; the messages are priced at the larger size, so communication matters). A sync
# arm's training does not depend on the bandwidth (only its clock does), so `run_arm`
# reuses its curve through the `curves` cache; a parameter server's does (slower links,
# staler gradients), so it trains again in every cell.

# %%
curves = {}
cells = []
for sigma in SIGMAS:
  for bw in BANDWIDTHS:
    cell = Setup(
      workers=WORKERS,
      gradients=GRADIENTS,
      compute=f"lognormal:{sigma:g}",
      bandwidth_GBps=bw,
      model_params=100_000_000,
      eval_every=5,
    )
    for a in PHASE_ARMS:
      ts = [run_arm(get_arm(a), cell, wl, s, curves)["time_to_target"] for s in SEEDS]
      ts = [np.inf if t is None else t for t in ts]
      cells.append({"σ": sigma, "GB/s": bw, "arm": a, "time_to_target": float(np.median(ts))})
cells = pd.DataFrame(cells)
grid = cells.pivot_table(index="GB/s", columns="σ", values="time_to_target", aggfunc="first")
best = cells.loc[cells.groupby(["GB/s", "σ"])["time_to_target"].idxmin()]
best = best[np.isfinite(best["time_to_target"])]
winners = best.pivot(index="GB/s", columns="σ", values="arm").reindex(
  index=list(BANDWIDTHS), columns=list(SIGMAS)
)
print(
  f"grid: {len(SIGMAS)} values of σ × {len(BANDWIDTHS)} bandwidths × {len(PHASE_ARMS)} arms,"
  f" {len(SEEDS)} seed(s) each; the fastest arm to test accuracy {wl.target}:"
)
winners.fillna("none reached")

# %%
names = list(PHASE_ARMS)
codes = winners.apply(lambda col: col.map(lambda a: names.index(a) if a in names else np.nan))
cmap = plt.get_cmap("tab10", len(names))
fig, ax = plt.subplots(figsize=(6.5, 1.6 + 0.45 * len(BANDWIDTHS)))
ax.imshow(codes.to_numpy(float), cmap=cmap, vmin=-0.5, vmax=len(names) - 0.5, aspect="auto")
for i, bw in enumerate(BANDWIDTHS):
  for j, sigma in enumerate(SIGMAS):
    a = winners.loc[bw, sigma]
    ax.text(j, i, a if isinstance(a, str) else "—", ha="center", va="center", fontsize=8)
ax.set_xticks(range(len(SIGMAS)), [f"{s:g}" for s in SIGMAS])
ax.set_yticks(range(len(BANDWIDTHS)), [f"{b:g}" for b in BANDWIDTHS])
ax.set_xlabel("straggler heaviness: log-normal σ of compute times")
ax.set_ylabel("link GB/s per direction")
ax.set_title(f"first to the target: {WORKERS} workers, 100 M parameters priced", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## What this run showed


# %%
n8 = 8
fastest = table["time_to_target_s"].idxmin()
ps_cells = best[best["arm"].map(lambda a: get_arm(a).family == "ps")]
reached_all = bool(np.isfinite(table["time_to_target_s"]).all())
CONCLUSION = {
  "n": n8,
  "wait": wait.loc[n8, "exponential"],
  "h_n": harmonic(n8),
  "efficiency": 1 / wait.loc[n8, "exponential"],
  "wait_backup": wait.loc[n8, "exponential, 1 backup"],
  "workers": WORKERS,
  "slow_factor": 1 / min(setup.speeds),
  "target": wl.target,
  "sigmas": len(SIGMAS),
  "bandwidths": len(BANDWIDTHS),
  "ps_cells": len(ps_cells),
  "cells": len(SIGMAS) * len(BANDWIDTHS),
  "ps_where": [[float(s), float(b)] for s, b in zip(ps_cells["σ"], ps_cells["GB/s"])],
  "cells_unreached": len(SIGMAS) * len(BANDWIDTHS) - len(best),
}
no_stragglers = best[best["σ"] == 0]["arm"].map(lambda a: get_arm(a).family)
CONCLUSION["lesson"] = {
  "the_wait_is_h_n": bool(abs(wait.loc[n8, "exponential"] / harmonic(n8) - 1) < 0.05),
  "a_backup_worker_cuts_the_wait": bool(
    wait.loc[n8, "exponential, 1 backup"] < wait.loc[n8, "exponential"] - 0.5
  ),
  "sync_first_without_stragglers": bool(len(no_stragglers) and (no_stragglers == "sync").all()),
  "the_server_first_only_with_stragglers": bool((ps_cells["σ"] > 0).all()),
}
if reached_all:
  CONCLUSION |= {
    "sync_s": float(table.loc["sync", "time_to_target_s"]),
    "fastest": fastest,
    "fastest_s": float(table.loc[fastest, "time_to_target_s"]),
  }
  CONCLUSION["sooner"] = CONCLUSION["sync_s"] / CONCLUSION["fastest_s"]
c = CONCLUSION
print(
  f"A synchronous step on {c['n']} workers with exponential compute times waited "
  f"{c['wait']:.2f} mean gradient times (the closed form H_N: {c['h_n']:.2f}), so sync "
  f"turned {c['efficiency']:.0%} of the machines' time into gradients; one backup worker "
  f"brought the wait to {c['wait_backup']:.2f}."
)
if reached_all:
  print(
    f"With one of {c['workers']} workers {c['slow_factor']:.0f}× slower, plain sync reached "
    f"{c['target']:.0%} test accuracy in {c['sync_s']:.3g} simulated seconds and the fastest "
    f"arm, {c['fastest']}, in {c['fastest_s']:.3g} ({c['sooner']:.2g}× sooner)."
  )
else:
  print(
    f"With one of {c['workers']} workers {c['slow_factor']:.0f}× slower, not every arm "
    f"reached {c['target']:.0%} test accuracy in this budget, so this run does not rank them."
  )
where = ", ".join(f"(σ {s:g}, {b:g} GB/s)" for s, b in c["ps_where"])
print(
  f"In the phase diagram ({c['sigmas']} values of σ × {c['bandwidths']} bandwidths) a "
  f"parameter-server arm was first in {c['ps_cells']} of {c['cells']} cells"
  + (f": {where}" if where else "")
  + f"; cells where no arm reached the target: {c['cells_unreached']}."
)
