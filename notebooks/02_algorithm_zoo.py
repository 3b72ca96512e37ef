# %% [markdown]
# # 2 · A zoo of all-reduce algorithms
#
# The ring of notebook 1 moves the fewest bytes but takes 2(p−1) steps. Other
# algorithms trade steps for bytes, or spread the load differently over the links. Here
# **every algorithm in the registry** runs for real on emulated devices: we watch who
# sends to whom at every step and how the sum spreads, count what each compiled program
# sends and check it against the closed-form schedule, price the schedules with the α-β
# model and say why the cheapest one changes with the size (and why the model's large-size
# winner loses on a switch where each participant has one link), and check every result
# against NumPy. Two cells ask you for a number first, and one asks you to write
# recursive doubling yourself.
#
# **Run time.** Full mode 33 s on 2 CPU cores; small mode
# (`ALLREDUCE_JAX_SMALL=1` in the environment, or the kernel "allreduce-jax small" in
# JupyterLab) 20–60 s: the compiled programs are counted at p = 4 and 8
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
from jax import lax  # noqa: F401  (the exercise below writes with it)
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import ALGORITHMS, all_reduce, cost_model, devices, hlo, teach, topology, trace
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
# **One convention for "steps".** A *message step* is one round in which participants
# send at the same time and wait for what they receive: the α of the cost model is paid
# once per step. The titles above count them, and so do the model and every chart below.
# A step may hold several `ppermute`s in flight together: the bidirectional ring's two
# lanes, the double binary tree's two trees. The compiled HLO holds one
# `collective-permute` per `ppermute`, so for those two it counts twice as many (the
# audit below shows both).
#
# ### Predict before you run
#
# Recursive doubling finishes in lg p steps. **How many bytes does each of its
# participants send at p = 8, in units of the buffer size n?** (The ring sends 1.75·n.)

# %% tags=["predict"]
guess = None  # bytes a recursive-doubling participant sends at p = 8, in units of n

# %%
rd = hlo.audit_all_reduce("recursive_doubling", 8, 840)  # 840 float32 per participant
teach.reveal(guess, rd.max_sent_bytes / (4 * 840), what="recursive doubling at p=8, bytes sent / n")

# %% [markdown]
# Few steps, but the whole buffer in each: lg p·n bytes. That is the trade every
# algorithm here makes differently.
#
# ## Non-power-of-two counts: MPICH's fold
#
# With p = 5 the recursive algorithms cannot pair everyone. Participant 0 first hands
# its buffer to participant 1 and sits out, the other four run the power-of-two
# algorithm, and at the end 1 hands the result back to 0.
#
# ### Predict before you run
#
# Halving-doubling takes 2 lg p steps at a power of two (6 at p = 8). **How many steps
# does it take at p = 5?**

# %% tags=["predict"]
guess = None  # message steps of halving-doubling at p = 5

# %%
fold = trace.run_trace("halving_doubling", 5)
teach.reveal(guess, len(fold) - 1, what="halving-doubling's message steps at p=5")

# %% [markdown]
# The detailed view: each number is how many participants' contributions that copy
# already holds.

# %%
trace.plot_trace(fold, "halving-doubling, p=5: fold, 4, unfold")
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
        "steps": model.steps,
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
last_p = audit_rows[audit_rows["p"] == ps[-1]].set_index("algorithm")
display(last_p[["steps", "permutes"]].astype(int).rename(columns={"permutes": "collective-permutes (HLO)"}).T)  # fmt: skip
audit_rows.pivot(index="algorithm", columns="p", values="sent / n").round(3)

# %% [markdown]
# Above, at the largest p: message steps and the compiled program's `collective-permute`
# ops (two per step where a step holds two lanes); below it, the most bytes one
# participant sends, in units of the buffer size n, at every p. A non-power-of-two p pays
# for the fold; the ring, halving-doubling and their relatives stay under 2n, the naive
# root grows with p.

# %%
last = audit_rows[audit_rows["p"] == ps[-1]].set_index("algorithm")
order = last.sort_values(["steps", "sent / n"]).index
colors = [style(a)["color"] for a in order]
fig, (ax_s, ax_b) = plt.subplots(1, 2, figsize=(10, 0.35 * len(order) + 1.2), sharey=True)
ax_s.barh(order, last.loc[order, "steps"], color=colors)
ax_b.barh(order, last.loc[order, "sent / n"], color=colors)
ax_s.set(xlabel="message steps (α each)", title="fewer steps: less latency")
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
# Notebook 3 measures α and β instead of assuming them. (One schedule depends on them
# too: the double binary tree pipelines a buffer in as many chunks as the parameters in
# effect make cheapest, so the model is evaluated under `cost_model.use_params(params)`,
# the same parameters that price it; left to the backend's own, here the CPU's fitted
# ones, it would price a tree these parameters would not build.)

# %%
params = cost_model.DEFAULT_PARAMS
single = [a for a in ZOO if ALGORITHMS[a].axes == 1]
sizes = np.geomspace(64, 1 << 30, 300)


def model_seconds(a, n):  # α·steps + β·(bytes on the busiest link), choices made with them
  with cost_model.use_params(params):
    s = cost_model.schedule(a, DEVICES, n)
  return params.alpha * s.steps + params.beta * s.beta_bytes


t = np.array([[model_seconds(a, n) for n in sizes] for a in single])
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


def coefficients(a, n):  # (message steps, bytes on the busiest link / n) at size n
  with cost_model.use_params(params):
    s = cost_model.schedule(a, DEVICES, n)
  return s.steps, s.beta_bytes / n


why = []
for n, a, b in changes:
  (sa, ka), (sb, kb) = coefficients(a, n), coefficients(b, n)
  why.append(
    {
      "at": f"{n:,.0f} B",
      "from": a,
      "to": b,
      "steps (from → to)": f"{sa:g} → {sb:g}",
      "busiest link / n (from → to)": f"{ka:.3g} → {kb:.3g}",
      # where α·(extra steps) = β·n·(bytes saved per byte of buffer)
      "break-even n = α·Δsteps / (β·Δ(bytes/n))": f"{params.alpha * (sb - sa) / (params.beta * (ka - kb)):,.0f} B",
    }
  )
pd.DataFrame(why)

# %% [markdown]
# Why the cheapest one changes. Every line is α·steps + β·(bytes on the busiest link):
# an algorithm with more steps but fewer bytes per byte of buffer overtakes one with
# fewer steps once n·β·(bytes saved) exceeds α·(steps added). The table reads both
# coefficients off the schedules at the crossing; the break-even size they give is where
# the figure's lines cross (up to the grid's spacing, and the double binary tree's
# coefficients move with n: it cuts a large buffer into more pipelined chunks).
#
# The large-size winner is worth a second look. In this model a step costs its *largest
# message*, as if every message had a link of its own: a participant that sends to two
# partners at once (the double binary tree's two trees, the bidirectional ring's two
# lanes) is charged for one message, i.e. it gets two links' bandwidth. That is what a
# switch with **one link per participant** does not give: there the messages a
# participant sends in one step share its link. `topology.switch(1)` is such a switch
# (`topology.switch()` is the flat model itself); the same schedules, priced on both:

# %%
big = 1 << 30
with cost_model.use_params(params):
  nic = pd.DataFrame(
    {
      "flat model (ms)": [1e3 * topology.predict_seconds(a, DEVICES, big, params) for a in single],
      "one link per participant (ms)": [
        1e3 * topology.predict_seconds(a, DEVICES, big, params, topology.switch(1)) for a in single
      ],
    },
    index=single,
  )
nic["slower by"] = nic["one link per participant (ms)"] / nic["flat model (ms)"]
flat_best, nic_best = nic["flat model (ms)"].idxmin(), nic["one link per participant (ms)"].idxmin()
print(f"at {big / 2**30:g} GiB per participant, p={DEVICES}: cheapest in the flat model {flat_best}, "
      f"on one link per participant {nic_best}")  # fmt: skip
nic.sort_values("one link per participant (ms)").round(2)

# %% [markdown]
# Where every participant has one link, the algorithms that the flat model credited with
# two links fall back to (or behind) the ring: the bidirectional ring becomes the ring, and
# the double binary tree, which also sends more bytes in all (its interior nodes forward
# to two children), loses. On a GPU server with several NVLinks per GPU, or on a torus
# with a link per direction, the flat model's assumption holds and the tree's advantage is
# real; notebook 6 prices these algorithms on tori and fat trees at thousands of nodes.
#
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
# ### Try this: recursive doubling, written by you
#
# Write recursive doubling from `lax.ppermute` for a power-of-two p: in step k
# (k = 0, 1, …, lg p − 1) every participant r swaps its whole partial sum with
# participant r XOR 2^k and adds what it receives. After lg p steps everyone holds the
# total. The check runs it on the 8 devices against NumPy, bit for bit, and counts its
# steps in the compiled program.


# %% tags=["exercise"]
def my_recursive_doubling(x, axis):  # x: f32[n] on each of p participants, p a power of two
  raise NotImplementedError("your turn: lg p steps of lax.ppermute with XOR partners")


# %% tags=["check"]
def recursive_doubling_is_right():
  mesh8 = jax.make_mesh((DEVICES,), ("i",))
  blocks = np.random.default_rng(3).integers(-50, 50, (DEVICES, 13)).astype(np.float32)
  xb = jax.device_put(blocks, NamedSharding(mesh8, P("i")))
  f = jax.jit(jax.shard_map(lambda b: my_recursive_doubling(b[0], "i")[None], mesh=mesh8,
                            in_specs=P("i"), out_specs=P("i")))  # fmt: skip
  got = np.asarray(f(xb))
  if not np.array_equal(got, np.broadcast_to(blocks.sum(0), got.shape)):
    return False, "some participant does not hold the NumPy sum"
  a = hlo.audit(hlo.compiled_text(f, xb))
  steps = int(np.log2(DEVICES))
  if a.counts["all-reduce"] or a.permutes != steps:
    return (
      False,
      f"{a.permutes} collective-permutes and {a.counts['all-reduce']} all-reduce, expected {steps} and 0",
    )
  return True


teach.check(
  recursive_doubling_is_right,
  right=f"every participant holds the sum, bit for bit, after lg p = {int(np.log2(DEVICES))} exchanges of the whole buffer.",
  wrong="each of the lg p steps must swap the whole partial sum with participant r XOR 2^k and add it",
)

# %% [markdown] tags=["solution"]
# <details><summary>Solution</summary>
#
# ```python
# def my_recursive_doubling(x, axis):  # x: f32[n] on each of p participants, p a power of two
#   p = lax.axis_size(axis)
#   mask = 1
#   while mask < p:  # partners differ in one bit: 1, 2, 4, ...
#     x = x + lax.ppermute(x, axis, [(r, r ^ mask) for r in range(p)])
#     mask <<= 1
#   return x
# ```
# </details>

# %% [markdown]
# ## What this run showed

# %%
fewest = ", ".join(last.index[last["steps"] == last["steps"].min()])
least = ", ".join(last.index[np.isclose(last["sent / n"], last["sent / n"].min())])
most = ", ".join(last.index[np.isclose(last["sent / n"], last["sent / n"].max())])
CONCLUSION = {
  "algorithms": len(ZOO),
  "p": ps[-1],
  "fewest": fewest,
  "fewest_steps": last["steps"].min(),
  "least": least,
  "least_sent": last["sent / n"].min(),
  "most": most,
  "most_sent": last["sent / n"].max(),
  "audited": int(audit_rows["match"].sum()),
  "programs": len(audit_rows),
  "exact": int(checks["exact"].sum()),
  "checks": len(checks),
  "big": big,
  "flat_best": flat_best,
  "nic_best": nic_best,
  "dbt_one_nic": nic.loc["double_binary_tree", "one link per participant (ms)"]
  / nic.loc["ring", "one link per participant (ms)"],
  "lesson": {
    "audits_match": bool(audit_rows["match"].all()),
    "exact": bool(checks["exact"].all()),
    "fewest_steps": fewest,
    "least_bytes": least,
    "flat_large_winner": flat_best,
    "one_nic_winner": nic_best,
    "tree_loses_on_one_link": bool(
      nic.loc["double_binary_tree", "one link per participant (ms)"]
      > nic.loc["ring", "one link per participant (ms)"]
    ),
  },
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
  CONCLUSION["lesson"] |= {
    "model_small_winner": changes[0][1],
    "model_large_winner": changes[-1][2],
  }
  CONCLUSION["alpha_us"], CONCLUSION["GBps"] = params.alpha * 1e6, 1e-9 / params.beta
  sentences.append(
    f"With α = {CONCLUSION['alpha_us']:g} µs and {CONCLUSION['GBps']:g} GB/s per link the "
    f"model's cheapest algorithm at p={DEVICES} changes {len(changes)} time"
    f"{'s' if len(changes) > 1 else ''}, from "
    f"{changes[0][1]} for small buffers to {changes[-1][2]} for large ones."
  )
c = CONCLUSION
sentences.append(
  f"At {c['big'] / 2**30:g} GiB the flat model's cheapest was {c['flat_best']}; on a switch with "
  f"one link per participant it was {c['nic_best']}, and the double binary tree took "
  f"{c['dbt_one_nic']:.2f} times the ring's time there."
)
print("\n".join(sentences))
