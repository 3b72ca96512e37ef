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
# # 6 · Stragglers
#
# A synchronous step ends when the **last** worker's gradient arrives. If compute
# times vary — shared machines, thermal throttling, garbage collection, a slow node —
# the step takes the maximum of N random times, and the maximum grows with N.
#
# This notebook measures that effect on simulated compute times, checks it against the
# closed form H_N, tries the two standard remedies — **backup workers** (drop the
# slowest b gradients) and **asynchronous SGD** (never wait) — and finally trains the
# same model under each to compare **time to accuracy**, the quantity that matters.
#
# Time is in units of one mean gradient computation throughout.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"  # CI runs the small mode
DEVICES = 8
SAMPLES = 20_000 if SMALL else 200_000  # compute times drawn per distribution
SIM_STEPS = 2_000 if SMALL else 20_000  # simulated sync steps per point
NS = [1, 2, 4, 8, 16, 32, 64]  # workers, for the H_N curve
N_BACKUP = 16  # pool size for the backup-worker curve
WORKERS = 4 if SMALL else DEVICES  # data-parallel workers in the training runs
TRAIN_STEPS = 30 if SMALL else 200  # sync steps; async applies WORKERS× as many updates
TRAIN_COMPUTE = (
  ("exponential", "slow") if SMALL else ("constant", "exponential", "lognormal", "pareto", "slow")
)
BACKUPS = (1,) if SMALL else (1, 2)
SEEDS = (0,) if SMALL else (0, 1)
TARGET = 0.9 if SMALL else 0.95  # test accuracy that counts as "trained"
RESULTS = os.environ.get("ALLREDUCE_JAX_RESULTS", "../results")

# %%
import jax

jax.config.update("jax_num_cpu_devices", DEVICES)  # before the first JAX computation

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

from allreduce_jax.training import async_sim, experiments, tables
from allreduce_jax.training.async_sim import harmonic

OUT = Path(RESULTS) / "notebooks" / "06"
MODELS = async_sim.COMPUTE_MODELS
print(jax.__version__, jax.default_backend(), len(jax.devices()), "devices")

# %% [markdown]
# ## Compute-time distributions
#
# `async_sim.draw_compute_times` draws one time per (step, worker), all with mean 1:
# **constant**; **exponential** (memoryless, the textbook model); **lognormal** (σ = 0.5,
# a moderate right tail); **pareto** (α = 1.5: infinite variance, rare very long
# stalls); **slow** (worker 0 always 4× slower, everyone jittered ±10%).

# %%
rng = np.random.default_rng(0)
ids = np.broadcast_to(np.arange(DEVICES), (SAMPLES // DEVICES, DEVICES))
draws = {m: async_sim.draw_compute_times(m, rng, ids).ravel() for m in MODELS}
fig, ax = plt.subplots(figsize=(7, 3.8))
bins = np.linspace(0, 5, 101)
for m, t in draws.items():
  if m == "constant":
    ax.axvline(1, color="k", lw=1, label="constant (all at 1)")
  else:
    ax.hist(t, bins=bins, density=True, histtype="step", lw=1.5, label=m)
ax.set_xlabel("compute time of one gradient (mean-compute units)")
ax.set_ylabel("probability density (1 / unit)")
ax.set_yscale("log")
ax.set_title(f"per-worker compute times, {DEVICES} workers")
ax.legend(fontsize=8)
plt.show()
print(f"{'model':>12} {'mean':>6} {'p50':>6} {'p99':>7} {'max':>8}")
for m, t in draws.items():
  print(f"{m:>12} {t.mean():6.3f} {np.median(t):6.3f} {np.percentile(t, 99):7.3f} {t.max():8.2f}")

# %% [markdown]
# ## The sync step waits for the slowest worker: H_N
#
# For N independent Exp(1) times, the expected maximum is the harmonic number
# H_N = 1 + 1/2 + … + 1/N ≈ ln N + 0.577: the first of N finishes after 1/N on
# average, the next after a further 1/(N−1), and so on. A sync step on 8 workers
# therefore takes 2.72× a single gradient, on 64 workers 4.74×.
# `async_sim.sync_schedule` simulates the steps; the line is the formula.

# %%
sim = {
  m: [async_sim.sync_schedule(m, n, SIM_STEPS, seed=1).step_time for n in NS]
  for m in ("exponential", "lognormal", "pareto")
}
fig, ax = plt.subplots(figsize=(6.5, 4))
for m, steps in sim.items():
  ax.errorbar(
    NS,
    [s.mean() for s in steps],
    [s.std() / np.sqrt(len(s)) for s in steps],
    fmt="o",
    ms=5,
    capsize=3,
    label=f"{m}, simulated",
  )
grid = np.arange(1, NS[-1] + 1)
ax.plot(grid, [harmonic(n) for n in grid], "k-", lw=1, label="H_N (exponential, exact)")
ax.plot(grid, np.log(grid) + 0.5772, "k:", lw=1, label="ln N + 0.577")
ax.set_xscale("log", base=2)
ax.set_xlabel("workers N")
ax.set_ylabel("mean sync step time (mean-compute units)")
ax.set_title(f"a sync step = the slowest of N ({SIM_STEPS} simulated steps per point)")
ax.grid(True, which="both", alpha=0.3)
ax.legend(fontsize=8)
plt.show()
exp_means = [s.mean() for s in sim["exponential"]]
worst_rel = max(abs(m / harmonic(n) - 1) for m, n in zip(exp_means, NS))
print(f"{'N':>4} {'simulated':>10} {'H_N':>8}")
for n, m in zip(NS, exp_means):
  print(f"{n:>4} {m:10.3f} {harmonic(n):8.3f}")

# %% [markdown]
# Lognormal times have a thinner tail and suffer less; Pareto's heavy tail makes the
# expected maximum grow like N^(1/α), far faster than ln N.
#
# ## Backup workers: H_N − H_b
#
# Chen et al. (2016): run N workers and close the step after the first N − b gradients,
# dropping the b slowest. The (N−b)-th fastest of N exponentials has expected value
# H_N − H_b = 1/(b+1) + … + 1/N: dropping the slowest worker removes the term 1, the
# second slowest 1/2, and so on, so the first backups save the most. The price: each
# step averages N − b gradients instead of N.

# %%
bs = list(range(0, N_BACKUP // 2 + 1))
backup_sim = [
  async_sim.sync_schedule("exponential", N_BACKUP, SIM_STEPS, seed=2, backups=b).step_time.mean()
  for b in bs
]
formula = [harmonic(N_BACKUP) - harmonic(b) for b in bs]
fig, ax = plt.subplots(figsize=(6, 3.8))
ax.plot(bs, backup_sim, "o", label="simulated")
ax.plot(bs, formula, "k-", lw=1, label="H_N − H_b")
ax.set_xlabel(f"backup workers b (of N = {N_BACKUP}, slowest b dropped)")
ax.set_ylabel("mean step time (mean-compute units)")
ax.set_title(f"backup workers, exponential compute times, N = {N_BACKUP}")
ax.grid(True, alpha=0.3)
ax.legend(fontsize=8)
plt.show()
for b in (0, 1, 4):
  print(f"b={b}: simulated {backup_sim[b]:.3f}, H_N − H_b = {formula[b]:.3f}")

# %% [markdown]
# ## Async under the same stragglers
#
# Asynchronous workers never wait: each applies its gradient when it is done and starts
# the next. With N workers and mean compute time 1 the server applies about N updates per
# unit of time whatever the distribution — but each update is one gradient (not N), and
# it is stale. The table compares the time to obtain one gradient's worth of progress:
# sync needs E[step]/N per gradient (E[step]/(N−b) with b backups), async 1/N.
# `async_sim.event_schedule` plays the server's event loop on the same distributions.

# %%
n = DEVICES
print(
  f"{'model':>12} {'sync/grad':>10} {'b=1/grad':>10} {'async/grad':>11} {'async mean τ':>13} {'p99 τ':>6}"
)
per_grad = {}
for m in MODELS:
  s0 = async_sim.sync_schedule(m, n, SIM_STEPS, seed=3).step_time.mean() / n
  s1 = async_sim.sync_schedule(m, n, SIM_STEPS, seed=3, backups=1).step_time.mean() / (n - 1)
  a = async_sim.event_schedule(m, n, SIM_STEPS * n, seed=3)
  per_grad[m] = (s0, s1, a.time[-1] / len(a.time))
  print(
    f"{m:>12} {s0:10.3f} {s1:10.3f} {per_grad[m][2]:11.3f} {a.staleness.mean():13.2f}"
    f" {np.percentile(a.staleness, 99):6.0f}"
  )
fig, ax = plt.subplots(figsize=(7, 3.6))
x = np.arange(len(MODELS))
for k, (label, j) in enumerate([("sync", 0), ("sync, 1 backup", 1), ("async", 2)]):
  ax.bar(x + (k - 1) * 0.27, [per_grad[m][j] for m in MODELS], 0.27, label=label)
ax.set_xticks(x, MODELS)
ax.set_xlabel("compute-time model")
ax.set_ylabel("time per gradient (mean-compute units)")
ax.set_title(f"{n} workers: how much of their time becomes gradients")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## Time to accuracy
#
# Per-gradient throughput is only half the story: async gradients are stale, and a sync
# step with backups averages fewer gradients. So we train. `experiments.run_straggler_sweep`
# runs, for every compute model, synchronous data-parallel training on the emulated
# devices (the ring all-reduce; its modelled time is added to each step), sync with
# backup workers (a 0/1 mask keeps the fastest N−b gradients each step) and async SGD
# (plain, and with the η/τ learning rate) replayed on the event schedule. Every arm
# computes the same number of gradients; sync uses an N× larger learning rate for its
# N× larger batch (Goyal et al. 2017). The clock is the simulated one: what the run
# would take on a cluster with these compute times.
#
# Runs are appended to `stragglers.jsonl` as they finish and skipped when the notebook
# runs again with the same settings.

# %%
cfg = experiments.StragglerConfig(
  workers=WORKERS,
  sync_steps=TRAIN_STEPS,
  compute_models=TRAIN_COMPUTE,
  backups=BACKUPS,
  seeds=SEEDS,
  target=TARGET,
  n_sweep=(),
)
rows = experiments.run_straggler_sweep(cfg, OUT / "stragglers", log=lambda line: None)
assert all(r.get("replicas_identical", True) for r in rows)
display(Markdown(tables.straggler_table(rows)))

# %%
arms = list(dict.fromkeys(r["arm"] for r in rows))
fig, axes = plt.subplots(
  1, len(TRAIN_COMPUTE), figsize=(3.6 * len(TRAIN_COMPUTE), 3.4), squeeze=False, sharey=True
)
for ax, m in zip(axes[0], TRAIN_COMPUTE):
  for arm in arms:
    rs = [r for r in rows if r["compute"] == m and r["arm"] == arm]
    k = min(len(r["test_acc"]) for r in rs)
    t = np.mean([r["eval_time"][:k] for r in rs], axis=0)
    acc = np.mean([r["test_acc"][:k] for r in rs], axis=0)
    ax.plot(t, acc, "-" if arm.startswith("sync") else "--", label=arm)
  ax.axhline(TARGET, color="0.5", lw=0.8)
  ax.set_title(f"{m}, N = {WORKERS}", fontsize=10)
  ax.set_xlabel("simulated time (mean-compute units)")
  ax.set_ylim(0, 1)
  ax.grid(True, alpha=0.3)
axes[0][0].set_ylabel("test accuracy")
axes[0][-1].legend(fontsize=7)
fig.tight_layout()
plt.show()


# %%
def time_to_target(m, arm):
  got = [r["time_to_target"] for r in rows if r["compute"] == m and r["arm"] == arm]
  got = [t for t in got if t is not None]
  return float(np.mean(got)) if got else np.nan


ttt = {(m, arm): time_to_target(m, arm) for m in TRAIN_COMPUTE for arm in arms}
fig, ax = plt.subplots(figsize=(7, 3.6))
x = np.arange(len(TRAIN_COMPUTE))
w = 0.8 / len(arms)
for k, arm in enumerate(arms):
  ax.bar(x + k * w, [ttt[m, arm] for m in TRAIN_COMPUTE], w, label=arm)
ax.set_xticks(x + w * (len(arms) - 1) / 2, TRAIN_COMPUTE)
ax.set_xlabel("compute-time model")
ax.set_ylabel(f"simulated time to {TARGET:.0%} test accuracy")
ax.set_title(f"time to accuracy, N = {WORKERS} (missing bar: target not reached)")
ax.legend(fontsize=7)
plt.show()

# %% [markdown]
# ## What this run showed


# %%
def winner(m):
  reached = {arm: ttt[m, arm] for arm in arms if np.isfinite(ttt[m, arm])}
  return min(reached, key=reached.get) if reached else "none"


summary = "; ".join(
  f"{m}: {winner(m)}"
  + (
    f" (sync {ttt[m, 'sync']:.1f}, {winner(m)} {ttt[m, winner(m)]:.1f})"
    if winner(m) != "none" and np.isfinite(ttt[m, "sync"])
    else ""
  )
  for m in TRAIN_COMPUTE
)
print(
  f"With exponential compute times a sync step took {exp_means[NS.index(8)]:.2f} (H_8 = "
  f"{harmonic(8):.2f}) and {exp_means[-1]:.2f} at N={NS[-1]} (H = {harmonic(NS[-1]):.2f}); the "
  f"simulation stayed within {worst_rel:.1%} of H_N. With N={N_BACKUP} workers, 1 backup cut the "
  f"mean step from {backup_sim[0]:.2f} to {backup_sim[1]:.2f} (H_N − H_1 = {formula[1]:.2f}) and 4 "
  f"backups to {backup_sim[4]:.2f}. Per gradient, async on {DEVICES} workers spent "
  f"{per_grad['exponential'][2]:.3f} time units against sync's {per_grad['exponential'][0]:.3f} "
  f"(exponential) and {per_grad['slow'][2]:.3f} against {per_grad['slow'][0]:.3f} with one slow "
  f"worker. Fastest to {TARGET:.0%} test accuracy in training with N={WORKERS}, by compute model "
  f"(simulated time): {summary}."
)
