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
# # 1 · All-reduce from scratch
#
# In data-parallel training every worker computes a gradient on its own slice of the
# batch. Before the optimizer step the gradients must be **summed (or averaged) and the
# same result delivered to every worker**: that is an *all-reduce*. It runs once per
# step, on every parameter, so its cost sits directly on the training step time.
#
# This notebook builds the idea from the simplest scheme (send everything to one
# place) to the ring, watches both run step by step on emulated devices, and checks
# the ring against XLA's own `lax.psum`.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"  # CI runs the small mode
DEVICES = 8
P_TRACE = 4  # participants in the step-by-step pictures

# %%
import jax

jax.config.update("jax_num_cpu_devices", DEVICES)  # before the first JAX computation

import matplotlib.pyplot as plt
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import all_reduce, cost_model, hlo, trace
from allreduce_jax.tools import verify

print(jax.__version__, jax.default_backend(), len(jax.devices()), "devices")

# %% [markdown]
# ## The central scheme: everyone sends to one participant
#
# Participant 0 plays "parameter server": the others send it their buffers, it adds
# them up and sends the total back. With `lax.ppermute` each participant can receive at
# most one message per step, exactly like one network link, so the root needs p−1
# steps to collect and p−1 more to hand back.
#
# How to read the pictures: rows are participants, columns are elements of the buffer
# (one per participant here), and each number says **how many participants'
# contributions that copy already contains**. They are decoded from the values that
# really arrived in every `ppermute` of the compiled program (`allreduce_jax.trace`).

# %%
frames = trace.run_trace("naive", P_TRACE)
trace.plot_trace(frames, f"naive (parameter server), p={P_TRACE}")
plt.show()

# %% [markdown]
# ## The ring: reduce-scatter, then all-gather
#
# Cut the buffer into p chunks. In each of p−1 **reduce-scatter** steps every
# participant passes one running partial chunk to its right-hand neighbour, which adds
# its own copy of that chunk. Every link is busy in every step and each carries only
# n/p bytes. After p−1 steps participant i owns chunk i complete (the diagonal below).
# In p−1 **all-gather** steps the finished chunks travel round the ring once more.

# %%
frames = trace.run_trace("ring", P_TRACE)
trace.plot_trace(
  frames, f"ring, p={P_TRACE}: steps 1..{P_TRACE - 1} reduce-scatter, then all-gather"
)
plt.show()
after_rs = frames[P_TRACE - 1].counts
print("after the reduce-scatter, complete chunks sit on the diagonal:", np.diag(after_rs))

# %% [markdown]
# ## Using it: one call inside `shard_map`
#
# `all_reduce` is called on the local block inside a `jax.shard_map` body, exactly like
# `lax.psum`. The ring's result is typed as *varying* (it comes out of `ppermute`s), so we
# return it with a per-device `out_specs` and check that every copy is identical.

# %%
mesh = jax.make_mesh((DEVICES,), ("data",))
grads = jax.random.normal(jax.random.key(0), (DEVICES, 1000))  # one gradient per device
grads = jax.device_put(grads, NamedSharding(mesh, P("data")))


@jax.jit
@jax.shard_map(mesh=mesh, in_specs=P("data"), out_specs=P("data"))
def both(g):  # g: f32[1, 1000] on each device
  ring = all_reduce(g[0], "data", op="mean", algorithm="ring")
  xla = jax.lax.pmean(g[0], "data")
  return ring[None], xla[None]


ring, xla = (np.asarray(a) for a in both(grads))
print("all copies identical:", all(np.array_equal(ring[k], ring[0]) for k in range(DEVICES)))
print("max |ring - pmean| on random data:", np.abs(ring[0] - xla[0]).max())

# %% [markdown]
# Random floats are summed in a different order by the ring than by XLA, so the two
# may differ in the last bits. With nccl-tests' trick — integer-valued inputs whose sums
# are exact in any order — the comparison can be **bit for bit**:

# %%
rows = verify.run_case("ring", DEVICES, shapes=((13,), (3, 7)) if SMALL else verify.SHAPES)
print(verify.format_table(verify.summarize(rows)))
assert all(r.passed for r in rows)

# %% [markdown]
# ## What each participant sends
#
# The compiled HLO says exactly what moves. For the ring each participant sends
# 2(p−1)/p·n bytes — under 2n however many participants there are. The central root
# sends (p−1)·n and receives as much: its link is the bottleneck and grows with p.

# %%
n = 840  # float32 elements per participant
ps = [2, 4, 8] if SMALL else [2, 3, 4, 5, 6, 7, 8]
ring_bytes = [hlo.audit_all_reduce("ring", p, n).max_sent_bytes for p in ps]
naive_bytes = [hlo.audit_all_reduce("naive", p, n).max_sent_bytes for p in ps]
for p, r, c in zip(ps, ring_bytes, naive_bytes):
  assert r == cost_model.schedule("ring", p, 4 * n).max_sent_bytes
  assert c == cost_model.schedule("naive", p, 4 * n).max_sent_bytes
fig, ax = plt.subplots(figsize=(5, 3.2))
ax.plot(ps, np.array(ring_bytes) / (4 * n), "o-", label="ring (every participant)")
ax.plot(ps, np.array(naive_bytes) / (4 * n), "s-", label="naive (the root)")
ax.axhline(2, color="gray", ls=":", label="2n")
ax.set_xlabel("participants p")
ax.set_ylabel("bytes sent / n")
ax.set_title("bytes sent per participant, from compiled HLO")
ax.legend()
plt.show()

# %% [markdown]
# ## What this run showed

# %%
exact = [r for r in rows if r.kind == "verifiable"]
print(
  f"On {DEVICES} emulated {jax.default_backend()} devices the ring matched the lax collectives "
  f"bit for bit on exact inputs in {sum(r.bit_exact for r in exact)}/{len(exact)} cases "
  f"({sum(r.passed for r in rows)}/{len(rows)} cases passed overall) and matched pmean "
  f"within {np.abs(ring[0] - xla[0]).max():.2g} on random data. At p={ps[-1]} each ring "
  f"participant sent {ring_bytes[-1] / (4 * n):.2f}·n bytes, while the central root sent "
  f"{naive_bytes[-1] / (4 * n):.0f}·n (and received as much)."
)
