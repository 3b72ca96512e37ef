# %% [markdown]
# # 8 · Compressed all-reduce: the error grows along the ring, hop by hop
#
# `all_reduce(x, "i", wire="int8")` sends every message as block-absmax int8 (one float32
# scale per 256 elements, in the same message): a quarter of the bytes. A ring re-encodes
# the running partial sum at every hop, so each hop adds a fresh rounding error on a
# larger sum; `two_shot` sends every slice straight to its owner, encoded once. Here we
# follow one ring hop by hop, check the library does exactly this arithmetic, and watch
# the error grow with p.

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

use_cpu_devices(8)  # 8 emulated CPU devices (before the first computation)
rng = np.random.default_rng(0)

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

# %%
once = [
  wire_error.relative_error(wire_error.replay("two_shot", x[:q], "int8"), x[:q])
  for q in range(2, P_RING + 1)
]
fig, ax = plt.subplots(figsize=(6, 3.5))
steps = np.arange(1, P_RING + 1)
ax.plot(steps, hops["int8"], label="int8 ring (re-encodes every hop)")
ax.plot(steps, hops["bf16"], label="bf16 ring")
ax.plot(steps[1:], once, label="int8 two_shot at p = hop + 1 (encoded once)")
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("hop (the last point: after the all-gather's encoding)")
ax.set_ylabel("relative L2 error")
ax.legend(fontsize=8)
fig.tight_layout()

# %%
print(
  f"int8 ring: {hops['int8'][0]:.2e} after one hop, {hops['int8'][-1]:.2e} at p = {P_RING};"
  f" bf16 ring {hops['bf16'][-1]:.2e}; int8 two_shot at p = {P_RING}: {once[-1]:.2e}"
)
