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
# # 4 · To thousands of nodes
#
# We cannot run 16384 accelerators here, but the α-β model that fitted the emulated
# measurements (notebook 3) extends to any p: each algorithm's step count and bytes
# are known in closed form (`cost_model.schedule`). This notebook asks the model where
# the flat ring — bandwidth-optimal, and what NCCL uses inside a node — stops being the
# right choice as a cluster grows, and why.
#
# The machine: nodes of 8 GPUs on NVLink 4 (3.4 µs per hop, 450 GB/s per direction),
# nodes joined by InfiniBand NDR (5 µs per message step, 50 GB/s per NIC, one NIC per
# GPU): `cost_model.PRESETS`, where each number is sourced. Override them with measured values.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"  # pure arithmetic: both modes are fast
INNER, OUTER = "nvlink4", "ib_ndr"  # presets of cost_model.PRESETS
PER_NODE = 8  # devices per node (and NICs per node)
MAX_P = 16384
SIZES = [1 << 20, 100 << 20, 1 << 30]  # bytes per device: 1 MiB, 100 MiB, 1 GiB
if not SMALL:
  SIZES = [64 << 10, *SIZES]
TOLERANCE = 0.05  # "ring loses" = more than 5% slower than the best algorithm

# %%
import matplotlib.pyplot as plt
import numpy as np

from allreduce_jax import cost_model
from allreduce_jax.tools import scaling
from allreduce_jax.tools.bench import format_size

inner, outer = cost_model.PRESETS[INNER], cost_model.PRESETS[OUTER]
machine = cost_model.TwoLevel(inner, outer, PER_NODE, PER_NODE)
PS = [p for p in scaling.PS if p <= MAX_P]
ALGS = scaling.ALGORITHMS
for name, q in [(INNER, inner), (OUTER, outer)]:
  d = cost_model.params_to_dict(q)
  print(f"{name:>8}: α = {d['alpha_us']:.1f} µs per step, {d['bandwidth_gbps']:.0f} GB/s")
print("p =", PS)

# %% [markdown]
# ## Predicted all-reduce time from 8 to 16384 GPUs
#
# `scaling.sweep` prices four algorithms on the two-level machine
# (`cost_model.predict_two_level_seconds`):
#
# * **ring**: NCCL's flat ring through every GPU; of its 2(p−1) steps, 2(b−1) cross a
#   node boundary (b = p/8 nodes). Bytes: 2(p−1)/p·n, the minimum.
# * **tree**: binomial reduce then broadcast, 2⌈lg p⌉ steps of n bytes each.
# * **halving_doubling** (Rabenseifner): 2 lg p steps, the ring's bytes.
# * **hierarchical**: ring reduce-scatter inside each node, ring all-reduce of the
#   1/8 shard across nodes (each GPU on its own NIC), all-gather inside the node.

# %%
rows = scaling.sweep(machine, "gpu-cluster", PS, SIZES)
cross = {c["bytes"]: c for c in scaling.crossovers(rows, TOLERANCE)}
fig, axes = plt.subplots(1, len(SIZES), figsize=(4.2 * len(SIZES), 3.8), squeeze=False)
for ax, n in zip(axes[0], SIZES):
  for a in ALGS:
    rs = [r for r in rows if r["bytes"] == n and r["algorithm"] == a]
    ax.loglog([r["p"] for r in rs], [r["predicted_us"] for r in rs], "o-", ms=3, label=a)
  c = cross[n]
  if c["ring_loses_at"]:
    ax.axvline(c["ring_loses_at"], color="tab:red", ls=":", lw=1)
    ax.text(
      c["ring_loses_at"],
      ax.get_ylim()[1],
      f" ring loses from\n p={c['ring_loses_at']}",
      fontsize=7,
      color="tab:red",
      va="top",
    )
  ax.set_xscale("log", base=2)
  ax.set_title(f"{format_size(n)} per GPU", fontsize=10)
  ax.set_xlabel("participants p (GPUs)")
  ax.grid(True, which="both", alpha=0.3)
axes[0][0].set_ylabel("predicted all-reduce time (µs)")
axes[0][0].legend(fontsize=7)
fig.tight_layout()
plt.show()

# %%
print(
  f"{'size':>7} {'ring within 5% up to':>21} {'then loses to':>17} {'ring / best at p=' + str(PS[-1]):>22}"
)
for n in SIZES:
  c = cross[n]
  print(
    f"{format_size(n):>7} {c['ring_competitive_until'] or 'never':>21} {c['winner_there']:>17}"
    f" {c['ring_over_best_at_max_p']:>14.1f}x ({c['best_at_max_p']})"
  )

# %% [markdown]
# ## Why: the latency term grows linearly in p for the ring, logarithmically for the others
#
# Split each predicted time into its two parts by pricing the same schedule on a
# machine with free bytes (β = γ = 0, only α left) and subtracting. The ring's
# 2(p−1) sequential steps cost 2(p−1)·α no matter how small each chunk gets; at
# p = 16384 that is tens of thousands of steps. Halving-doubling needs 2·lg p = 28;
# hierarchical puts 14 steps on NVLink and 2(b−1) on InfiniBand, so its latency also
# grows with the node count b, with 8× fewer steps than the ring's.

# %%
latency_only = cost_model.TwoLevel(
  cost_model.Params(inner.alpha, 0.0, 0.0), cost_model.Params(outer.alpha, 0.0, 0.0), PER_NODE
)
n_show = SIZES[-2]  # 100 MiB
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
for a in ALGS:
  lat = np.array([cost_model.predict_two_level_seconds(a, p, n_show, latency_only) for p in PS])
  tot = np.array([cost_model.predict_two_level_seconds(a, p, n_show, machine) for p in PS])
  (line,) = axes[0].loglog(PS, lat * 1e6, "o-", ms=3, label=f"{a}: latency α·steps")
  axes[0].loglog(PS, (tot - lat) * 1e6, "--", color=line.get_color(), lw=1)
  axes[1].semilogx(PS, lat / tot, "o-", ms=3, label=a)
axes[0].set_xscale("log", base=2)
axes[0].set_xlabel("participants p")
axes[0].set_ylabel("time (µs): solid latency, dashed bytes")
axes[0].set_title(f"the two terms, {format_size(n_show)} per GPU", fontsize=10)
axes[0].legend(fontsize=7)
axes[1].set_xscale("log", base=2)
axes[1].set_xlabel("participants p")
axes[1].set_ylabel("latency share of the total time")
axes[1].set_ylim(0, 1)
axes[1].set_title("how latency-bound each algorithm is", fontsize=10)
axes[1].legend(fontsize=7)
for ax in axes:
  ax.grid(True, which="both", alpha=0.3)
fig.tight_layout()
plt.show()

# %% [markdown]
# The same thing as one number: the ring is latency-bound below n* = p·α/β
# (`cost_model.balance_bytes`), and n* grows with p: on InfiniBand alone, by several
# thousand GPUs even a gigabyte-sized gradient is "small" for the ring. Halving-doubling's
# n* grows only like lg p.


# %%
def human(n):  # bytes, readable
  for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if n >= scale:
      return f"{n / scale:,.1f} {unit}"
  return f"{n:.0f} B"


print(f"{'p':>6} {'ring n*':>12} {'halving-doubling n*':>20}   (all links {OUTER})")
for p in PS:
  print(
    f"{p:>6} {human(cost_model.balance_bytes('ring', p, outer)):>12}"
    f" {human(cost_model.balance_bytes('halving_doubling', p, outer)):>20}"
  )


# %% [markdown]
# ## How far from optimal? The lower bound
#
# No all-reduce can beat max(⌈lg p⌉·α, 2(p−1)/p·n·β) (Patarasuk & Yuan 2009): lg p
# rounds are needed for information from everyone to reach everyone, and every
# participant must send and receive almost 2n bytes. On a flat machine where every
# link is InfiniBand (`cost_model.lower_bound_seconds`), each algorithm's distance
# from the bound:

# %%
fig, axes = plt.subplots(1, len(SIZES), figsize=(4.2 * len(SIZES), 3.6), squeeze=False)
flat_algs = ["ring", "tree", "halving_doubling", "recursive_doubling"]
for ax, n in zip(axes[0], SIZES):
  bound = np.array([cost_model.lower_bound_seconds(p, n, outer) for p in PS])
  for a in flat_algs:
    t = np.array([cost_model.predict_seconds(a, p, n, outer) for p in PS])
    ax.loglog(PS, t / bound, "o-", ms=3, label=a)
  ax.axhline(1, color="k", lw=0.8)
  ax.set_xscale("log", base=2)
  ax.set_title(f"{format_size(n)} per device, all links {OUTER}", fontsize=10)
  ax.set_xlabel("participants p")
  ax.grid(True, which="both", alpha=0.3)
axes[0][0].set_ylabel("predicted time / lower bound")
axes[0][0].legend(fontsize=7)
fig.tight_layout()
plt.show()
gap = {
  a: cost_model.predict_seconds(a, PS[-1], SIZES[-1], outer)
  / cost_model.lower_bound_seconds(PS[-1], SIZES[-1], outer)
  for a in flat_algs
}
hd_worst = max(
  cost_model.predict_seconds("halving_doubling", p, n, outer)
  / cost_model.lower_bound_seconds(p, n, outer)
  for p in PS
  for n in SIZES
)
print(f"halving-doubling is at most {hd_worst:.1f}x the lower bound over every p and size above")

# %% [markdown]
# Halving-doubling stays within a small factor of the bound at every p and size (printed
# above): its bytes are the ring's and its steps are 2·lg p. The ring matches the bound for large messages
# at small p and drifts away as p grows; the tree pays 2·lg p full copies of n bytes.
# This is why NCCL switches from rings to trees (and PAT / NVLS schemes) at scale, and
# why large jobs reduce hierarchically: the slow links see few steps and 1/8 of the bytes.

# %% [markdown]
# ## What this run showed

# %%
big = cross[SIZES[-1]]
mid = cross[SIZES[-2]]
first = cross[SIZES[0]]
ring_steps = cost_model.schedule("ring", PS[-1], 1.0).steps
hd_steps = cost_model.schedule("halving_doubling", PS[-1], 1.0).steps


def until(c):
  if c["ring_competitive_until"] is None:
    return f"at no p (already not at p={PS[0]})"
  return f"up to p={c['ring_competitive_until']}"


print(
  f"On {PER_NODE}-GPU {INNER} nodes joined by {OUTER}, the model says the flat ring stays within "
  f"{TOLERANCE:.0%} of the best algorithm {until(first)} for {format_size(first['bytes'])} per "
  f"GPU ({first['winner_there']} wins), {until(mid)} for {format_size(mid['bytes'])} and "
  f"{until(big)} for {format_size(big['bytes'])} (then {big['winner_there']} wins). At "
  f"p={PS[-1]} the ring is {first['ring_over_best_at_max_p']:.0f}x slower than "
  f"{first['best_at_max_p']} at {format_size(first['bytes'])} and "
  f"{big['ring_over_best_at_max_p']:.1f}x slower than {big['best_at_max_p']} at "
  f"{format_size(big['bytes'])}: it needs {ring_steps} sequential steps where halving-doubling "
  f"needs {hd_steps}. Against the lower bound on an all-{OUTER} machine at p={PS[-1]}, "
  f"{format_size(SIZES[-1])}: ring {gap['ring']:.1f}x, halving-doubling "
  f"{gap['halving_doubling']:.2f}x, tree {gap['tree']:.1f}x; halving-doubling is never worse "
  f"than {hd_worst:.1f}x the bound."
)
