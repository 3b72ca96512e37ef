# %% [markdown]
# # 4 · Compressed all-reduce: the error grows along the ring, hop by hop
#
# Notebook 3 showed that large all-reduces are bandwidth-bound: their time is the bytes
# moved. Sending fewer bytes is the next idea. `all_reduce(x, "i", wire="int8")` sends
# every message as block-absmax int8 (one float32 scale per 256 elements, in the same
# message): about a quarter of the bytes. But the result is no longer exact. A ring
# re-encodes the running partial sum at every hop, so each hop adds a fresh rounding
# error on a larger sum; `two_shot` (notebook 2) sends every slice straight to its
# owner, encoded once. Here we follow one ring chunk hop by hop in NumPy, check that the
# library's JAX program does exactly this arithmetic, and watch the error grow with p.
#
# **Run time.** Full mode takes about 1 minute on 2 CPU cores. Small mode
# (`ALLREDUCE_JAX_SMALL=1` in the environment, or the kernel "allreduce-jax small" in
# JupyterLab) takes about half a minute: the hop-by-hop replay follows 16 participants
# instead of 256, with a smaller buffer. Every sentence at the end is computed from the
# run.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"
P_RING = 16 if SMALL else 256  # participants of the hop-by-hop replay
N = 4096 if SMALL else 16384  # float32 elements per participant

# %%
import jax
import matplotlib.pyplot as plt
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import all_reduce, wire_error
from allreduce_jax.devices import mesh_for, use_cpu_devices
from allreduce_jax.palette import label, style

use_cpu_devices(8)  # 8 emulated CPU devices (before the first computation)
rng = np.random.default_rng(0)

from allreduce_jax.results import source_commit

print("allreduce-jax at commit", source_commit() or "(not a git checkout)")

# %% [markdown]
# ## One chunk around the ring, inline
#
# Chunk k starts at participant k+1; at each hop the partial sum is encoded, sent,
# decoded and the next participant adds its own copy. The exact sum of the same
# contributions is carried beside it.

# %%
x = rng.standard_normal((P_RING, N)).astype(np.float32)
c = N // P_RING
chunk = 0
acc = x[1 % P_RING, :c].copy()
exact = acc.astype(np.float64)
inline = []
for t in range(2, P_RING + 1):
  acc = wire_error.np_roundtrip("int8", acc) + x[(chunk + t) % P_RING, :c]
  exact += x[(chunk + t) % P_RING, :c]
  inline.append(np.linalg.norm(acc - exact) / np.linalg.norm(exact))
print("relative error after hop 1, 2, 4, last:", [f"{inline[i]:.2e}" for i in (0, 1, 3, -1)])

# %% [markdown]
# The library's replay (`wire_error.ring_hop_errors`) does the same for every chunk at
# once, and the JAX program on 8 devices gives bit for bit the replay's result.

# %%
hops = {w: wire_error.ring_hop_errors(x, w) for w in ("bf16", "int8")}
p = 8
mesh, axis = mesh_for("ring", p)
x8 = x[:p]
f = jax.jit(
  jax.shard_map(
    lambda b: all_reduce(b, axis, algorithm="ring", wire="int8"),
    mesh=mesh,
    in_specs=P(axis),
    out_specs=P(axis),
  )
)
got = np.asarray(f(jax.device_put(x8.reshape(-1), NamedSharding(mesh, P(axis))))).reshape(p, N)
same = np.array_equal(got[0], wire_error.replay("ring", x8, "int8"))
print(f"JAX ring int8 on {p} devices == NumPy replay, bit for bit: {same}")
assert same

# %% [markdown]
# Below, the error after every hop of the ring (over all chunks together), with an int8 and
# a bf16 wire, and beside it int8 `two_shot` run at p = 2, 3, … participants: there
# every slice is encoded once on its way to its owner and once more on its way back,
# whatever p is.

# %%
once = [
  wire_error.relative_error(wire_error.replay("two_shot", x[:q], "int8"), x[:q])
  for q in range(2, P_RING + 1)
]
fig, ax = plt.subplots(figsize=(7.5, 5))
steps = np.arange(1, P_RING + 1)
ax.plot(steps, hops["int8"], label=label("ring", "int8") + ": re-encodes every hop",
        **{**style("ring", wire="int8"), "marker": None, "linewidth": 2})  # fmt: skip
ax.plot(
  steps,
  hops["bf16"],
  label=label("ring", "bf16"),
  **{**style("ring", wire="bf16"), "marker": None, "linewidth": 2},
)
ax.plot(steps[1:], once, label=label("two_shot", "int8") + " at p = hop + 1: encoded once",
        **{**style("two_shot", wire="int8"), "marker": None, "linewidth": 2})  # fmt: skip
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("hop (the last point: after the all-gather's encoding)")
ax.set_ylabel("relative L2 error")
ax.set_title(f"error of a compressed all-reduce, {N} float32 per participant")
ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=9)
ax.grid(alpha=0.3)
fig.tight_layout()
plt.show()

# %% [markdown]
# On log-log axes a power law is a straight line, and its slope is the exponent. Hop k
# rounds a partial sum of k contributions, whose size grows like √k, so its rounding
# error does too; the independent errors of hops 1 … k add up to √(1 + … + k) ≈ k/√2
# units, while the exact sum grows like √k: the *relative* error grows like √k, a slope
# of ½. Encoded once, two_shot's error should not grow with p. A least-squares line
# through the logs measures both.
#
# ## What this run showed

# %%
growth = {
  "ring": np.polyfit(np.log(steps), np.log(hops["int8"]), 1)[0],
  "two_shot": np.polyfit(np.log(steps[1:]), np.log(once), 1)[0],
}
CONCLUSION = {
  "first": hops["int8"][0],
  "last": hops["int8"][-1],
  "p": P_RING,
  "bf16": hops["bf16"][-1],
  "two_shot": once[-1],
  "ring_slope": growth["ring"],
  "two_shot_slope": growth["two_shot"],
  "devices": p,
}
print(
  f"With an int8 wire the ring's relative error was {CONCLUSION['first']:.2e} after one hop "
  f"and {CONCLUSION['last']:.2e} at p = {P_RING}, growing like p^{growth['ring']:.2f}; a bf16 "
  f"wire ended at {CONCLUSION['bf16']:.2e}. int8 two_shot, each slice encoded once, ended at "
  f"{CONCLUSION['two_shot']:.2e} (growing like p^{growth['two_shot']:.2f}). The JAX program on "
  f"{p} devices gave the NumPy replay's result bit for bit."
)
