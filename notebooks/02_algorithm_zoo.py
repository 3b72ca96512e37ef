# %% [markdown]
# # 2 · A zoo of all-reduce algorithms
#
# The ring of notebook 1 moves the fewest bytes but takes 2(p−1) steps. Other
# algorithms trade steps for bytes, or spread the load differently over the links. Here
# **every algorithm in the registry** runs for real on emulated devices: we watch who
# sends to whom at every step and how the sum spreads, count what each compiled program
# sends and check it against the closed-form schedule, price the schedules with the α-β
# model, and check every result against NumPy.
#
# **Run time.** Full mode takes about 3 minutes on 2 CPU cores. Small mode
# (`ALLREDUCE_JAX_SMALL=1` in the environment, or the kernel "allreduce-jax small" in
# JupyterLab) takes about 1 minute: the compiled programs are counted at p = 4 and 8
# instead of p = 2 to 8, and the results checked against NumPy at p = 8 only. Every
# sentence at the end is computed from the run.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"  # CI runs the small mode
DEVICES = 8
P_TRACE = 8  # participants in the schedule pictures

# %%
import jax

jax.config.update("jax_num_cpu_devices", DEVICES)  # before the first JAX computation

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import display
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import ALGORITHMS, all_reduce, cost_model, devices, hlo, trace
from allreduce_jax.palette import style

# Every hand-written algorithm with a schedule, straight from the registry records: an
# algorithm registered tomorrow shows up here with no edit.
ZOO = [a for a, r in ALGORITHMS.items() if r.hand_written and r.schedule is not None]
OTHERS = [a for a in ALGORITHMS if a not in ZOO]
display(
  pd.DataFrame(
    [(a, ALGORITHMS[a].axes, ALGORITHMS[a].summary) for a in ZOO],
    columns=["algorithm", "mesh axes", "what it does"],
  ).set_index("algorithm")
)
print("also registered:", "; ".join(f"{a}: {ALGORITHMS[a].summary}" for a in OTHERS))

from allreduce_jax.results import source_commit

print("allreduce-jax at commit", source_commit() or "(not a git checkout)")

# %% [markdown]
# ## Every schedule, drawn from its trace
#
# `trace.run_trace(algorithm, p)` runs the compiled program on inputs that encode
# which participant each value came from, records what arrived in every `ppermute`,
# and decodes it. Below, one panel per algorithm: each column is one `ppermute` (one
# message step), each arrow one message from a participant (left) to another (right),
# and the shading says what fraction of the final sum each participant holds after the
# step. Nothing here is a description of the algorithm: it is what the program did.

# %%
traces = {a: trace.run_trace(a, P_TRACE) for a in ZOO}


def draw_schedule(ax, frames, title):
  p = frames[0].counts.shape[0]
  held = np.array([f.counts.mean(1) / p for f in frames]).T  # [participant, step]
  ax.imshow(held, cmap="Blues", vmin=0, vmax=1.6, aspect="auto", origin="upper")
  for f in frames[1:]:
    for src, dst in f.pairs:
      ax.annotate(
        "", xy=(f.step - 0.12, dst), xytext=(f.step - 0.88, src),
        arrowprops={"arrowstyle": "-|>", "lw": 0.7, "color": "0.15", "shrinkA": 0, "shrinkB": 0},
      )  # fmt: skip
  ax.set_title(f"{title}: {len(frames) - 1} steps", fontsize=9)
  ax.set_xticks(range(0, len(frames), max(1, len(frames) // 8)))
  ax.set_yticks(range(p))
  ax.tick_params(labelsize=7)


cols = 3
fig, axes = plt.subplots(-(-len(ZOO) // cols), cols, figsize=(13, 3.1 * -(-len(ZOO) // cols)))
for ax, a in zip(axes.ravel(), ZOO):
  draw_schedule(ax, traces[a], a)
for ax in axes.ravel()[len(ZOO) :]:
  ax.axis("off")
for ax in axes[:, 0]:
  ax.set_ylabel("participant")
for ax in axes[-1]:
  ax.set_xlabel("message step")
fig.suptitle(f"who sends to whom, p={P_TRACE} (shading: share of the sum held)", y=1.0)
fig.tight_layout()
plt.show()

# %% [markdown]
# How to read them, family by family:
#
# * **ring**: every participant sends to its right-hand neighbour in every step, n/p
#   bytes at a time: p−1 steps of reduce-scatter, p−1 of all-gather. The
#   **bidirectional ring** runs a second ring the other way on the other half of the
#   buffer (its two lanes are two `ppermute`s per step).
# * **recursive doubling**: in step k everyone swaps its *whole* partial sum with the
#   partner whose rank differs in bit k: the fewest steps (lg p), n bytes each.
# * **halving-doubling** (Rabenseifner): a reduce-scatter by recursive halving (half
#   the range with the partner at distance p/2, a quarter at p/4, ...) then an
#   all-gather by recursive doubling: the ring's bytes in 2 lg p steps.
#   **halving_doubling_near** does the same with the nearest partner first (XOR masks
#   1, 2, 4, ...), so the biggest halves cross the shortest links; **swing** (De Sensi
#   et al., 2024) pairs an even r with r + ρ(s) and an odd r with r − ρ(s), where
#   ρ = 1, −1, 3, −5, 11, ...: partners about a third closer than recursive doubling's
#   on a ring or torus, near first too.
# * **tree**: a binomial reduce to participant 0, then a binomial broadcast; the
#   **double binary tree** (NCCL's) runs two complementary trees on the two halves of
#   the buffer, pipelined in chunks, so no participant is a leaf in both.
# * **naive**: a parameter server. Everyone sends to participant 0 and gets the total
#   back: 2(p−1) steps through one participant's link.
# * **two_shot**: every participant sends each slice straight to its owner, which sums
#   it, then sends the sum straight to everyone: many messages per step, each slice
#   encoded once (what makes it interesting for compressed wires, notebook 4).
# * **hierarchical**: on a 2-D mesh, a ring reduce-scatter inside each group, an
#   all-reduce across groups on the 1/|inner| shard, and an all-gather inside.
#
# ## Non-power-of-two counts: MPICH's fold
#
# With p = 5 the recursive algorithms cannot pair everyone. Participant 0 first hands
# its buffer to participant 1 and sits out, the other four run the power-of-two
# algorithm, and at the end 1 hands the result back to 0. The detailed view below
# shows every element: each number is how many participants' contributions that copy
# already holds.

# %%
trace.plot_trace(trace.run_trace("halving_doubling", 5), "halving-doubling, p=5: fold, 4, unfold")
plt.show()

# %% [markdown]
# ## What the compiled programs send
#
# `hlo.audit_all_reduce` compiles an algorithm (it never runs it) and reads the HLO:
# how many `collective-permute` ops it holds and the most bytes any one participant
# sends. `cost_model.schedule` gives both in closed form. They must agree, and no XLA
# `all-reduce` may hide inside.

# %%
n_bytes = 4 * 16 * 3 * 5 * 7  # per participant: divisible by 2p, no padding
ps = [4, 8] if SMALL else [2, 3, 4, 5, 6, 7, 8]
audit_rows = []
for p in ps:
  for a in ZOO:
    if not devices.fits(a, p):
      continue  # a 2-D algorithm needs p to split into two factors
    got = hlo.audit_all_reduce(a, p, n_bytes // 4)
    model = cost_model.schedule(a, p, n_bytes, inner=devices.inner_size(a, p))
    audit_rows.append(
      {
        "algorithm": a,
        "p": p,
        "permutes": got.permutes,
        "permutes (formula)": model.permutes,
        "sent / n": got.max_sent_bytes / n_bytes,
        "sent / n (formula)": model.max_sent_bytes / n_bytes,
        "all-reduce ops": got.counts["all-reduce"],
      }
    )
audit_rows = pd.DataFrame(audit_rows)
# Padding to whole chunks may add a few bytes to what the formula (for unpadded n) says.
audit_rows["match"] = (audit_rows["permutes"] == audit_rows["permutes (formula)"]) & (
  (audit_rows["sent / n"] - audit_rows["sent / n (formula)"]).abs() < 0.02
)
display(audit_rows.pivot(index="algorithm", columns="p", values="permutes"))
audit_rows.pivot(index="algorithm", columns="p", values="sent / n").round(3)

# %% [markdown]
# Above: message steps (permutes) per algorithm and p; below it, the most bytes one
# participant sends, in units of the buffer size n. A non-power-of-two p pays for the
# fold; the ring, halving-doubling and their relatives stay under 2n, the naive root
# grows with p.

# %%
last = audit_rows[audit_rows["p"] == ps[-1]].set_index("algorithm")
order = last.sort_values(["permutes", "sent / n"]).index
colors = [style(a)["color"] for a in order]
fig, (ax_s, ax_b) = plt.subplots(1, 2, figsize=(10, 0.35 * len(order) + 1.2), sharey=True)
ax_s.barh(order, last.loc[order, "permutes"], color=colors)
ax_b.barh(order, last.loc[order, "sent / n"], color=colors)
ax_s.set(xlabel="message steps (collective-permutes)", title="fewer steps: less latency")
ax_b.set(
  xlabel="bytes sent by the busiest participant / n", title="fewer bytes: less time per byte"
)
ax_s.invert_yaxis()
for ax in (ax_s, ax_b):
  ax.grid(axis="x", alpha=0.3)
fig.suptitle(f"what each compiled program sends, p={ps[-1]}")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## What the trade-off costs: the α-β model
#
# With α seconds per message step and β seconds per byte on a link, each schedule
# becomes a time: α·steps + β·bytes on the critical path (`cost_model.schedule` gives
# both). With the documented default link (`cost_model.DEFAULT_PARAMS`, an NVLink-class
# α and bandwidth), the cheapest algorithm at each size is the argmin of those lines.
# Notebook 3 measures α and β instead of assuming them.

# %%
params = cost_model.DEFAULT_PARAMS
single = [a for a in ZOO if ALGORITHMS[a].axes == 1]
sizes = np.geomspace(64, 1 << 30, 300)
t = np.array(
  [
    [
      params.alpha * cost_model.schedule(a, DEVICES, n).steps
      + params.beta * cost_model.schedule(a, DEVICES, n).beta_bytes
      for n in sizes
    ]
    for a in single
  ]
)
cheapest = t.argmin(0)
changes = [
  (sizes[k], single[cheapest[k - 1]], single[cheapest[k]])
  for k in range(1, len(sizes))
  if cheapest[k] != cheapest[k - 1]
]
fig, ax = plt.subplots(figsize=(8, 4.5))
for k, a in enumerate(single):
  ax.plot(sizes, 1e6 * t[k], label=a, **{**style(a), "marker": None})
for k, (n, _, _) in enumerate(changes):
  ax.axvline(n, color="0.3", ls=(0, (6, 3)), lw=1, label="the cheapest changes" if k == 0 else None)
ax.set(xscale="log", yscale="log", xlabel="bytes per participant", ylabel="predicted µs")
ax.set_title(
  f"α-β model, p={DEVICES}, α = {params.alpha * 1e6:g} µs, {1e-9 / params.beta:g} GB/s per link"
)
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
ax.grid(alpha=0.3)
fig.tight_layout()
plt.show()
pd.DataFrame([(f"{n:,.0f} B", a, b) for n, a, b in changes], columns=["at", "from", "to"])

# %% [markdown]
# ## Every algorithm against NumPy
#
# nccl-tests' trick: integer-valued inputs whose sums are exact in any order, so a
# result can be compared **bit for bit**. Participant i holds a different block, and
# every algorithm reduces it with `sum`, `max` and `min`, in float32 and int32; NumPy
# reduces the same blocks over the participant axis. (`allreduce-jax verify` does this
# for every op, dtype and shape, and random and special values too.)

# %%
checks = []
for p in [DEVICES] if SMALL else [5, DEVICES]:
  blocks = np.random.default_rng(p).integers(-50, 50, (p, 13))  # 13: not a multiple of p
  for a in ZOO:
    if not devices.fits(a, p):
      continue
    mesh, axis = devices.mesh_for(a, p)

    def body(b, a=a, axis=axis):
      return tuple(all_reduce(b, axis, op=op, algorithm=a) for op in ("sum", "max", "min"))

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(axis), out_specs=P(axis)))
    for dtype in (np.float32, np.int32):
      x = jax.device_put(blocks.astype(dtype).reshape(-1), NamedSharding(mesh, P(axis)))
      got = [np.asarray(y).reshape(p, -1) for y in f(x)]
      want = [blocks.sum(0), blocks.max(0), blocks.min(0)]
      for op, g, w in zip(("sum", "max", "min"), got, want):
        ok = bool((g == w.astype(dtype)).all())  # every participant's copy, bit for bit
        checks.append({"algorithm": a, "p": p, "dtype": dtype.__name__, "op": op, "exact": ok})
checks = pd.DataFrame(checks)
checks.pivot_table(index="algorithm", columns=["p", "dtype"], values="exact", aggfunc="all")

# %% [markdown]
# ## What this run showed

# %%
fewest = ", ".join(last.index[last["permutes"] == last["permutes"].min()])
least = ", ".join(last.index[np.isclose(last["sent / n"], last["sent / n"].min())])
most = ", ".join(last.index[np.isclose(last["sent / n"], last["sent / n"].max())])
CONCLUSION = {
  "algorithms": len(ZOO),
  "p": ps[-1],
  "fewest": fewest,
  "fewest_steps": last["permutes"].min(),
  "least": least,
  "least_sent": last["sent / n"].min(),
  "most": most,
  "most_sent": last["sent / n"].max(),
  "audited": int(audit_rows["match"].sum()),
  "programs": len(audit_rows),
  "exact": int(checks["exact"].sum()),
  "checks": len(checks),
}
sentences = [
  f"All {len(ZOO)} hand-written algorithms of the registry ran. At p={ps[-1]} the fewest "
  f"message steps ({CONCLUSION['fewest_steps']}): {fewest}; the fewest bytes sent per "
  f"participant ({CONCLUSION['least_sent']:.2f}·n): {least}; the most "
  f"({CONCLUSION['most_sent']:.2f}·n): {most}.",
  f"{CONCLUSION['audited']} of {len(audit_rows)} compiled programs matched their closed-form "
  f"step and byte counts, and {CONCLUSION['exact']} of {len(checks)} results equalled NumPy's "
  "bit for bit on every participant.",
]
if changes:
  CONCLUSION |= {"first": changes[0][1], "last": changes[-1][2], "switches": len(changes)}
  CONCLUSION["alpha_us"], CONCLUSION["GBps"] = params.alpha * 1e6, 1e-9 / params.beta
  sentences.append(
    f"With α = {CONCLUSION['alpha_us']:g} µs and {CONCLUSION['GBps']:g} GB/s per link the "
    f"model's cheapest algorithm at p={DEVICES} changes {len(changes)} time"
    f"{'s' if len(changes) > 1 else ''}, from "
    f"{changes[0][1]} for small buffers to {changes[-1][2]} for large ones."
  )
print("\n".join(sentences))
