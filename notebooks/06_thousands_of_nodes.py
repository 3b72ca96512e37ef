# %% [markdown]
# # 6 · To thousands of nodes, on real network shapes
#
# We cannot run 16384 accelerators here, but we can price what each algorithm *sends*.
# The flat α-β model (`cost_model`, notebook 3) charges every message step α plus its
# largest message times β, wherever the messages go. It cannot tell two algorithms apart
# when they send the same bytes: ring, halving-doubling and Swing all send 2(p−1)/p·n.
# On a real fabric a message crosses several links and shares them with other messages,
# so distance and link sharing decide the winner.
#
# `allreduce_jax.topology` replays an algorithm's message steps on a network: each message
# `(src, dst, fraction of n)` is routed, and a step costs α + (per-hop latency) + the
# busiest directed link's bytes × β (+ γ for the reduction). The networks: `switch()`
# (full bisection: the flat model), `torus(dims)` (1-3-D, minimal-hop dimension-order
# routing: TPU pods), `fat_tree(k, r)` (k hosts per leaf, uplinks oversubscribed r:1,
# ideal ECMP) and `islands(group, intra, inter)` (NVLink islands joined by InfiniBand).
# Here we route one step by hand, check it against the library, then sweep every
# replayable algorithm to thousands of participants. Two cells ask you for a number
# first; one asks you to write Swing's choice of partners.
#
# **Run time.** Full mode 40 s on 2 CPU cores; small mode (`ALLREDUCE_JAX_SMALL=1` in
# the environment, or the kernel "allreduce-jax small" in JupyterLab) 6–20 s: full
# mode goes to p = 16384, where the schedules have millions of messages; small mode stops
# at p = 256 and prices three sizes instead of four; the published comparisons at the end
# then run at p = 256 and 1536 instead of 4096 and 24576, so their factors are smaller.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"  # CI runs the small mode
LINK = "ib_ndr"  # one link's α and β (cost_model.PRESETS)
TOPOLOGIES = ["switch", "torus:3d", "fat_tree:8:7"]
MAX_P = 256 if SMALL else 16384
SIZES = [64 << 10, 4 << 20, 256 << 20] if SMALL else [64 << 10, 1 << 20, 16 << 20, 256 << 20]
PAPER_P = 256 if SMALL else 4096  # Swing vs halving-doubling on tori
BIG_P = 1536 if SMALL else 24576  # the double binary tree vs the ring (NCCL: 24,576 GPUs)

# %%
import jax

jax.config.update("jax_num_cpu_devices", 8)  # the trace check below runs on 8 devices

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from allreduce_jax import ALGORITHMS, cost_model, names, teach, topology
from allreduce_jax.palette import style


def fmt_bytes(n):
  for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
    if n >= size:
      return f"{n / size:g} {unit}"
  return f"{n:g} B"


params = cost_model.PRESETS[LINK]
networks = [topology.parse(t) for t in TOPOLOGIES]
# every hand-written algorithm meant for scale that has a message generator
ALGS = [a for a in names(hand_written=True, at_scale=True) if a in names(replayable=True)]
PS = [p for p in (8 << k for k in range(12)) if p <= MAX_P]
print(f"{LINK}: α = {params.alpha * 1e6:g} µs, {1e-9 / params.beta:g} GB/s per direction")
print("replayable algorithms:", ", ".join(ALGS))
print("p =", PS)

from allreduce_jax.results import source_commit

print("allreduce-jax at commit", source_commit() or "(not a git checkout)")

# %% [markdown]
# ## A schedule is data
#
# Each algorithm's record carries a generator of its message steps:
# `ALGORITHMS[name].messages(axis_sizes)` returns a list of steps, each a list of
# `(source, target, fraction of n, combined)`. The same lists come out of the compiled
# program's trace (`topology.traced_messages` reads every `ppermute`'s pairs and bytes), so
# what we price is what runs.

# %%
for name in ("ring", "halving_doubling"):
  steps = ALGORITHMS[name].messages((8,))
  print(f"{name}: {len(steps)} steps; step 1:", steps[0][:4], "...")
for name in ("ring", "halving_doubling", "swing"):
  sizes, traced = topology.traced_messages(name, 8)
  mine = ALGORITHMS[name].messages(sizes)
  same = [sorted(m[:3] for m in s) for s in traced] == [sorted(m[:3] for m in s) for s in mine]
  print(f"{name}: generated == traced at p=8: {same}")
  assert same

# %% [markdown]
# ## Routing one step by hand, on a ring of 16 nodes
#
# On a 1-D torus (a ring of nodes, each linked to its two neighbours) a message goes the
# shorter way round (ties forward) and loads every link it crosses with its fraction of n.
# The step's bandwidth cost is its busiest link's load × n·β. Below, the first
# reduce-scatter step of four algorithms that all send the same bytes in total. MPICH's
# halving-doubling sends the biggest half to the farthest partner first; the near-first
# order and Swing keep the big halves close.

# %%
P16 = 16


def ring_link_loads(step, p):
  """load[d, i]: the fraction of n on the link leaving node i forward (d=0) or back (d=1)."""
  load = np.zeros((2, p))
  for src, dst, frac, *_ in step:
    ahead = (dst - src) % p
    if ahead <= p - ahead:  # forward is not longer
      for h in range(ahead):
        load[0, (src + h) % p] += frac
    else:
      for h in range(p - ahead):
        load[1, (src - h) % p] += frac
  return load


rs_names = ["ring", "halving_doubling", "halving_doubling_near", "swing"]
ring16 = topology.torus((P16,))
fig, axes = plt.subplots(1, len(rs_names), figsize=(12, 2.8), sharey=True)
busiest = {}
for ax, name in zip(axes, rs_names):
  step = ALGORITHMS[name].messages((P16,))[0]
  load = ring_link_loads(step, P16)
  lib = max(float(v.max()) for v in topology.step_link_loads(step, ring16).values())
  assert np.isclose(load.max(), lib), (name, load.max(), lib)  # the library routes the same
  busiest[name] = load.max()
  ax.bar(np.arange(P16) - 0.2, load[0], 0.4, color=style(name)["color"], label="forward")
  ax.bar(np.arange(P16) + 0.2, load[1], 0.4, color=style(name)["color"], alpha=0.45, label="back")
  ax.set_title(f"{name}\nbusiest link {load.max():g}·n", fontsize=9)
  ax.set_xlabel("link leaving node")
axes[0].set_ylabel("load (fraction of n)")
axes[0].legend(fontsize=8, loc="upper left")
fig.suptitle(f"first reduce-scatter step on a ring of {P16} nodes", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# The whole reduce-scatter half (the sum over its steps of the busiest link's load, in
# units of n·β), on 64 nodes, as `topology.bandwidth_term` computes it.
#
# ### Predict before you run
#
# On a ring of 64 nodes the ring's reduce-scatter costs 63/64 ≈ 0.98 n·β (one neighbour
# hop per step). Far-first halving-doubling starts with n/2 sent 32 hops away. **What is
# its reduce-scatter's bandwidth term, in units of n·β?**

# %% tags=["predict"]
guess = None  # far-first halving-doubling, reduce-scatter on a ring of 64, in n·β

# %%
nets64 = {
  "ring of 64 (1-D torus)": topology.torus((64,)),
  "fat tree 8/leaf, 7:1": topology.fat_tree(8, 7),
  "flat α-β (switch)": topology.switch(),
}


def reduce_scatter(name, p):
  steps = ALGORITHMS[name].messages((p,))
  return steps[: len(steps) // 2]


table = pd.DataFrame(
  {
    label: {a: topology.bandwidth_term(reduce_scatter(a, 64), net) for a in rs_names}
    for label, net in nets64.items()
  }
).T
teach.reveal(guess, table.loc["ring of 64 (1-D torus)", "halving_doubling"],
             what="far-first halving-doubling's reduce-scatter on a ring of 64, in n·β")  # fmt: skip
table.round(3)

# %% [markdown]
# The flat model gives all four the ring's cost; on a ring of nodes far-first
# halving-doubling pays for every hop its big halves travel (the tests check the closed
# forms: near-first (lg p)/2, far-first (p/3)(1 − 1/p²)).
#
# ### Try this: Swing's partners
#
# Swing (De Sensi et al., NSDI 2024) keeps halving-doubling's halves but picks closer
# partners: in step s an even rank r pairs with r + ρ(s), an odd rank with r − ρ(s)
# (mod p), where ρ(s) = 1 − 2 + 4 − 8 + … (s + 1 terms) = 1, −1, 3, −5, 11, … Write
# the partner of rank r in step s; the check compares every pair with the library's
# schedule at p = 16 and 64.


# %% tags=["exercise"]
def swing_partner(r, s, p):  # rank r's partner in step s = 0, 1, ..., lg p − 1
  raise NotImplementedError("your turn: r ± ρ(s) mod p")


# %% tags=["check"]
def swing_is_right():
  for p in (16, 64):
    steps = ALGORITHMS["swing"].messages((p,))
    for s in range(int(np.log2(p))):
      want = sorted(m[:2] for m in steps[s])
      got = sorted((r, swing_partner(r, s, p)) for r in range(p))
      if got != want:
        wrong = next(g for g, w in zip(got, want) if g != w)
        return False, f"p={p}, step {s}: you pair {wrong[0]} with {wrong[1]}"
  return True


teach.check(
  swing_is_right,
  right="every pair of every reduce-scatter step at p = 16 and 64 is Swing's: distances 1, 1, 3, 5, 11, ..., about 2/3 of halving-doubling's.",
  wrong="rank r's partner is r + ρ(s) for an even r and r − ρ(s) for an odd r, mod p",
)

# %% [markdown] tags=["solution"]
# <details><summary>Solution</summary>
#
# ```python
# def swing_partner(r, s, p):  # rank r's partner in step s = 0, 1, ..., lg p − 1
#   rho = (1 - (-2) ** (s + 1)) // 3  # 1, -1, 3, -5, 11, ...
#   return (r + rho) % p if r % 2 == 0 else (r - rho) % p
# ```
# </details>
#
# ## Flat vs torus vs tapered fat tree, up to thousands of participants
#
# Every replayable algorithm on each network, at every p and size: one call of
# `topology.predict_seconds` each. The torus picks the most even 3-D shape for each p
# (16384 = 32×32×16); the fat tree has 8 hosts per leaf and 7:1 oversubscribed uplinks
# (such tapering has been reported for 24k-GPU clusters). `hierarchical` follows the
# network: on the torus one ring per dimension (the TPU pod scheme), on the fat tree a ring
# inside each leaf and one across leaves. Each time is also priced on the flat switch with
# the same mesh, so `over_flat` says how much the network's shape costs.

# %%
flat = topology.switch()
rows = []
for p in PS:
  for n in SIZES:
    for net in networks:
      for a in ALGS:
        t = topology.predict_seconds(a, p, n, params, net)
        t_flat = topology.predict_seconds(a, p, n, params, flat, topology.axis_sizes(a, p, net))
        rows.append({"network": net.name, "p": p, "bytes": n, "algorithm": a, "us": t * 1e6,
                     "over_flat": t / t_flat})  # fmt: skip
rows = pd.DataFrame(rows)
net_names = list(dict.fromkeys(rows["network"]))
print(f"{len(rows)} replays: {len(net_names)} networks × {len(PS)} values of p × "
      f"{len(SIZES)} sizes × {len(ALGS)} algorithms")  # fmt: skip

# %% [markdown]
# Drawn as each algorithm's time **over the ring's** (below 1: faster than the ring), one
# row per network, the smallest size on the left and the largest on the right:

# %%
shown = [SIZES[0], SIZES[-1]]
ring_us = rows[rows["algorithm"] == "ring"].set_index(["network", "p", "bytes"])["us"]
rows["over_ring"] = rows["us"] / ring_us.loc[list(zip(rows["network"], rows["p"], rows["bytes"]))].to_numpy()  # fmt: skip
fig, axes = plt.subplots(len(net_names), len(shown), figsize=(9, 2.6 * len(net_names) + 1), sharex=True)  # fmt: skip
for i, net in enumerate(net_names):
  for j, n in enumerate(shown):
    ax = axes[i, j]
    for a in ALGS:
      r = rows[(rows["network"] == net) & (rows["bytes"] == n) & (rows["algorithm"] == a)]
      ax.plot(r["p"], r["over_ring"], ms=3, lw=1.2, label=a, **style(a))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.axhline(1, color="k", lw=0.6)
    ax.set_title(f"{net}, {fmt_bytes(n)}", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3)
    if j == 0:
      ax.set_ylabel("time / ring's", fontsize=9)
    if i == len(net_names) - 1:
      ax.set_xlabel("participants p", fontsize=9)
fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8)
fig.tight_layout(rect=(0, 0.1, 1, 1))
plt.show()

# %% [markdown]
# The fastest algorithm at the largest p, per network and size, and how much slower than
# on the flat model each algorithm is there at the largest size (1 = the flat model is
# right):

# %%
last = PS[-1]
at_last = rows[rows["p"] == last]
fastest = at_last.loc[at_last.groupby(["network", "bytes"])["us"].idxmin()]  # ties: registry order
winners = fastest.pivot(index="bytes", columns="network", values="algorithm")
winners.index = [fmt_bytes(n) for n in winners.index]
print(f"fastest at p = {last}:")
winners[net_names]

# %%
over = at_last[at_last["bytes"] == SIZES[-1]].pivot(
  index="algorithm", columns="network", values="over_flat"
)
print(f"replayed / flat-model time at p = {last}, {fmt_bytes(SIZES[-1])}:")
over.loc[ALGS, net_names].round(2)

# %% [markdown]
# The ring's neighbour messages cost the same everywhere; far partners pay on the torus and
# across the tapered uplinks. The flat model gives the bidirectional ring and the double
# binary tree a link per message (two or more per participant): that is why both look best
# on `switch` at large sizes. With one NIC per participant (the fat tree here) they lose
# that.
#
# ## The published directions
#
# **Swing vs halving-doubling on tori** (De Sensi et al., NSDI 2024: up to 3× over the
# existing algorithms on torus-like networks). Replayed on 2-D and 3-D tori, every
# algorithm's time over Swing's (above 1: Swing is faster):

# %%
paper = []
for spec in (f"torus:{'x'.join(map(str, topology.even_dims(PAPER_P, 2)))}", "torus:3d"):
  net = topology.parse(spec)
  for n in (SIZES[0], SIZES[-1]):
    t = {a: topology.predict_seconds(a, PAPER_P, n, params, net) for a in ALGS}
    others = ("recursive_doubling", "halving_doubling", "halving_doubling_near", "ring")
    paper.append({"network": net.fit(PAPER_P).name, "size": fmt_bytes(n),
                  **{f"{a} / swing": t[a] / t["swing"] for a in others}})  # fmt: skip
paper = pd.DataFrame(paper)
paper.round(2)

# %% [markdown]
# **The double binary tree's latency advantage over the ring** (NCCL 2.4 on Summit: "up to
# 180x" lower latency at 24,576 GPUs). An 8-byte message, pure latency, every α counted.
#
# ### Predict before you run
#
# The ring takes 2(p − 1) steps; the double binary tree about 2 lg p rounds. **At
# p = `BIG_P`, how many times faster is the tree for an 8-byte message in this model?**

# %% tags=["predict"]
guess = None  # ring time / double binary tree time, 8 bytes, p = BIG_P, flat switch

# %%
dbt = {}
for label, net in (("flat switch", topology.switch()), ("fat tree 8/leaf, 7:1", topology.fat_tree(8, 7))):  # fmt: skip
  t_ring = topology.predict_seconds("ring", BIG_P, 8, params, net)
  t_dbt = topology.predict_seconds("double_binary_tree", BIG_P, 8, params, net)
  dbt[label] = {"ring µs": t_ring * 1e6, "double binary tree µs": t_dbt * 1e6,
                "ring / tree": t_ring / t_dbt}  # fmt: skip
print(f"p = {BIG_P}")
teach.reveal(
  guess, dbt["flat switch"]["ring / tree"], what=f"ring / double binary tree at p={BIG_P}, 8 bytes"
)
pd.DataFrame(dbt).T.round(1)

# %% [markdown]
# The model gets the direction (the tree wins by orders of magnitude at this scale) but
# not the size of the factor: every step here pays the same α (an InfiniBand message), so
# the ring's 2(p−1) steps cost 2(p−1)·α. NCCL's ring is pipelined hop by hop with its
# low-latency protocol, and on Summit most hops stay inside a node on NVLink, so its real
# per-hop latency is a fraction of an InfiniBand round trip, while each tree round crosses
# the network. A bulk-synchronous replay with one α per step cannot represent that.
#
# ## What is modelled, and what is not
#
# Modelled: full-duplex links; minimal-hop dimension-order routing on tori (ties go
# forward); ideal ECMP on the fat tree (a leaf's uplink load spread evenly, capacity k/r
# host links); one NIC per participant between islands; every message of a step in flight
# together, steps one after another; α per step plus an optional per-hop latency; γ on the
# most bytes one participant reduces.
#
# Not modelled: routing collisions beyond dimension order (real ECMP hashes collide;
# elephant flows polarise), adaptive routing, congestion control, pipelining across steps
# (NCCL's rings and trees overlap chunks; here a step waits for its slowest message),
# NCCL's multi-channel rings striped over every NIC, in-switch reduction (NVLS, SHARP: each
# GPU sends n once, which no ppermute schedule can express), and the host side (kernel
# launch, copies, protocol choice).
#
# ## What this run showed


# %%
def winner(net, n):
  return str(winners.loc[fmt_bytes(n), net])


def over_flat(net, a):
  return float(over.loc[a, net])


torus_net, tree_net = networks[1].fit(last), networks[2].fit(last)
t64 = table.loc["ring of 64 (1-D torus)"]
CONCLUSION = {
  "ring_rs": t64["ring"],
  "hd_rs": t64["halving_doubling"],
  "near_rs": t64["halving_doubling_near"],
  "swing_rs": t64["swing"],
  "p": last,
  "small": fmt_bytes(SIZES[0]),
  "large": fmt_bytes(SIZES[-1]),
  "small_bytes": SIZES[0],
  "large_bytes": SIZES[-1],
  "torus_dims": list(torus_net.dims),
  "leaf_hosts": tree_net.hosts_per_leaf,
  "oversubscription": tree_net.oversubscription,
  "torus_small": winner(networks[1].name, SIZES[0]),
  "torus_large": winner(networks[1].name, SIZES[-1]),
  "tree_small": winner(networks[2].name, SIZES[0]),
  "tree_large": winner(networks[2].name, SIZES[-1]),
  "hd_torus": over_flat(networks[1].name, "halving_doubling"),
  "hd_tree": over_flat(networks[2].name, "halving_doubling"),
  "ring_torus": over_flat(networks[1].name, "ring"),
  "ring_tree": over_flat(networks[2].name, "ring"),
  "big_p": BIG_P,
  "latency_bytes": 8,
  "dbt_factor": dbt["flat switch"]["ring / tree"],
}
CONCLUSION["lesson"] = {
  "far_first_pays_on_a_ring": bool(t64["halving_doubling"] > 2 * t64["ring"]),
  "near_first_and_swing_cheaper": bool(
    max(t64["halving_doubling_near"], t64["swing"]) < t64["halving_doubling"]
  ),
  "ring_as_priced_flat": bool(
    max(abs(CONCLUSION["ring_torus"] - 1), abs(CONCLUSION["ring_tree"] - 1)) < 0.1
  ),
  "far_first_slower_than_flat": bool(min(CONCLUSION["hd_torus"], CONCLUSION["hd_tree"]) > 1.1),
  "tree_beats_ring_on_latency": bool(CONCLUSION["dbt_factor"] > 1),
  "torus_large": CONCLUSION["torus_large"],
  "tree_large": CONCLUSION["tree_large"],
}
if SMALL:  # at p = 256 the largest size's winners are not those at 16384
  for claim in ("torus_large", "tree_large"):
    del CONCLUSION["lesson"][claim]
  CONCLUSION["too_short"] = dict.fromkeys(
    ("torus_large", "tree_large"), "small mode stops at p = 256, where other algorithms win"
  )
c = CONCLUSION
print(
  f"On a ring of nodes the reduce-scatter's bandwidth term was {c['ring_rs']:.2f} n·β for "
  f"the ring, {c['hd_rs']:.2f} for far-first halving-doubling, {c['near_rs']:.2f} near-first "
  f"and {c['swing_rs']:.2f} for Swing, where the flat model gives all of them the ring's."
)
print(
  f"Up to p = {c['p']}: on the {' × '.join(map(str, c['torus_dims']))} torus the fastest was "
  f"{c['torus_small']} at {c['small']} and {c['torus_large']} at {c['large']}; on the fat "
  f"tree ({c['leaf_hosts']} hosts per leaf, uplinks oversubscribed {c['oversubscription']:g} "
  f"to one) {c['tree_small']} and {c['tree_large']}."
)
print(
  f"Far-first halving-doubling at {c['large']} took {c['hd_torus']:.2f}× its flat-model time "
  f"on the torus and {c['hd_tree']:.2f}× on the fat tree; the ring {c['ring_torus']:.2f}× and "
  f"{c['ring_tree']:.2f}×."
)
print(
  f"At p = {c['big_p']}, for a message of {c['latency_bytes']} bytes, the double binary tree "
  f"was {c['dbt_factor']:.0f}× faster than the ring in this model."
)
if SMALL:
  print(
    "The largest size's winners are not compared with the full run's: "
    f"{CONCLUSION['too_short']['torus_large']}."
  )
