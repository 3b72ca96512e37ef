# %% [markdown]
# # 1 · All-reduce from scratch
#
# In data-parallel training every worker computes a gradient on its own slice of the
# batch. Before the optimizer step the gradients must be **summed (or averaged) and the
# same result delivered to every worker**: that is an *all-reduce*. It runs once per
# step, on every parameter, so its cost sits directly on the training step time.
#
# This notebook starts from the simplest scheme (send everything to one place), then
# **writes the ring all-reduce in about 25 lines of `lax.ppermute`**, compares it with
# XLA's own `lax.psum` and with a NumPy sum, shows that the library's
# `all_reduce(..., algorithm="ring")` is exactly that algorithm, and counts what each
# participant sends.
#
# **Run time.** Full mode takes about 1 minute on 2 CPU cores. Small mode
# (`ALLREDUCE_JAX_SMALL=1` in the environment, or the kernel "allreduce-jax small" in
# JupyterLab) takes about half a minute: a smaller buffer, the NumPy comparison on
# fewer shapes, and the bytes counted at p = 2, 4 and 8 instead of every p from 2 to 8.
# Every sentence at the end is computed from the run.

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
import pandas as pd
from IPython.display import display
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import all_reduce, cost_model, hlo, trace
from allreduce_jax.palette import style

print(jax.__version__, jax.default_backend(), len(jax.devices()), "devices")

from allreduce_jax.results import source_commit

print("allreduce-jax at commit", source_commit() or "(not a git checkout)")

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
# ## The ring, in pictures: reduce-scatter, then all-gather
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
print(
  "after the reduce-scatter, complete chunks sit on the diagonal:",
  np.diag(frames[P_TRACE - 1].counts),
)

# %% [markdown]
# ## The ring, written out
#
# Inside `jax.shard_map` each participant runs the same function on its own block.
# `lax.axis_index` says who it is, `lax.ppermute(x, axis, pairs)` is one message step:
# every `(source, target)` pair sends `x` at the same time. Participant i starts with
# its copy of chunk i−1; in reduce-scatter step s it passes its running partial sum to
# the right and adds its own copy of the chunk that just arrived (chunk i−s−2). After
# p−1 steps it holds chunk i summed over everyone, and the all-gather passes the
# finished chunks round once more.


# %%
def ring_all_reduce(x, axis):  # x: f32[n] on each participant, n a multiple of p
  p, i = lax.axis_size(axis), lax.axis_index(axis)
  c = x.shape[0] // p  # chunk length
  right = [(j, (j + 1) % p) for j in range(p)]  # everyone sends to its right neighbour

  def chunk(k):  # our own copy of chunk k (k is traced: i is)
    return lax.dynamic_slice_in_dim(x, (k % p) * c, c)

  # Reduce-scatter: p-1 steps, one chunk per link per step.
  acc = chunk(i - 1)
  for s in range(p - 1):
    acc = lax.ppermute(acc, axis, right) + chunk(i - s - 2)
  # acc is now chunk i, summed over all p participants.

  # All-gather: p-1 steps pass the finished chunks round the ring.
  out = lax.dynamic_update_slice_in_dim(x * 0, acc, i * c, 0)
  for s in range(p - 1):
    acc = lax.ppermute(acc, axis, right)  # chunk i-s-1, complete
    out = lax.dynamic_update_slice_in_dim(out, acc, ((i - s - 1) % p) * c, 0)
  return out


# %% [markdown]
# Run it on every device, next to XLA's `lax.psum` and the library's ring, on random
# floats (one gradient-like block of `n` values per device):

# %%
n = 8 * (125 if SMALL else 12_500)  # float32 per participant, a multiple of p
mesh = jax.make_mesh((DEVICES,), ("i",))
x = jax.device_put(jax.random.normal(jax.random.key(0), (DEVICES, n)), NamedSharding(mesh, P("i")))


def per_device(f):
  """``f`` on each device's row ``T[n]``; the results stacked as ``T[p, n]``."""
  body = lambda b: f(b[0])[None]  # noqa: E731
  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))


mine = per_device(lambda b: ring_all_reduce(b, "i"))
library = per_device(lambda b: all_reduce(b, "i", algorithm="ring"))
xla = per_device(lambda b: lax.psum(b, "i"))
got, lib, ref = (np.asarray(f(x)) for f in (mine, library, xla))
assert np.array_equal(got, lib)  # the text below says so
checks = pd.DataFrame(
  {
    "every copy identical": [
      all(np.array_equal(r[k], r[0]) for k in range(DEVICES)) for r in (got, lib, ref)
    ],
    "max |x - psum|": [np.abs(r - ref).max() for r in (got, lib, ref)],
    "bit for bit = notebook's ring": [np.array_equal(r, got) for r in (got, lib, ref)],
  },
  index=["ring written above", "all_reduce(algorithm='ring')", "lax.psum"],
)
checks

# %% [markdown]
# The ring and `psum` add the same numbers in a different order, so on random floats
# they can differ in the last bits (the `max |x - psum|` column), within the rounding
# bound. The notebook's ring and the library's are **identical bit for bit**:
# same chunks, same order of additions.
#
# Same program, too: the compiled HLO of each holds 2(p−1) `collective-permute` ops
# and every participant sends 2(p−1)/p·n·4 bytes (`allreduce_jax.hlo` reads them).

# %%
programs = {"ring written above": mine, "all_reduce(algorithm='ring')": library, "lax.psum": xla}
hlo_rows = []
for name, f in programs.items():
  a = hlo.audit(hlo.compiled_text(f, x))
  hlo_rows.append(
    {
      "program": name,
      "collective-permute": a.permutes,
      "all-reduce": a.counts["all-reduce"],
      "bytes sent per participant": a.max_sent_bytes,
    }
  )
hlo_table = pd.DataFrame(hlo_rows).set_index("program")
assert hlo_table.iloc[0].equals(hlo_table.iloc[1])
assert hlo_table.iloc[0]["collective-permute"] == 2 * (DEVICES - 1)
hlo_table

# %% [markdown]
# `lax.psum` compiles to one `all-reduce` op: XLA's runtime picks how to run it. The
# hand-written ring spells out every step, which is what lets us count, change and
# time them.
#
# ## Bit for bit against a NumPy oracle
#
# On random floats two correct all-reduces may differ in the last bits. nccl-tests'
# trick removes that: **integer-valued inputs, whose sums are exact in any order**, so
# the comparison can be bit for bit. Below, participant i holds its own block of small
# integers; the ring sums, maxes and mins them, in float32, bfloat16 and int32, on
# buffers whose length is not a multiple of p (the library pads and un-pads); NumPy
# reduces the same blocks over the participant axis, and every participant's copy
# must equal NumPy's exactly. (`allreduce-jax verify` runs this for every algorithm, op,
# dtype and shape, plus random inputs within the rounding bound and NaN/±inf/±0.)

# %%
OPS = {"sum": np.sum, "max": np.max, "min": np.min}
lengths = (13,) if SMALL else (1, 13, 21, 8 * 125 + 3)
ring_ops = per_device(
  lambda b: jax.numpy.stack([all_reduce(b, "i", op=op, algorithm="ring") for op in OPS])
)
oracle_rows = []
for length in lengths:
  blocks = np.random.default_rng(length).integers(-20, 20, (DEVICES, length))
  want = {op: reduce(blocks, axis=0) for op, reduce in OPS.items()}  # the oracle
  for dtype in ("float32", "bfloat16", "int32"):
    x_int = jax.device_put(jax.numpy.asarray(blocks, dtype), NamedSharding(mesh, P("i")))
    got_ops = np.asarray(ring_ops(x_int), np.float64)  # [participant, op, element]
    for k, op in enumerate(OPS):
      exact = bool((got_ops[:, k] == want[op]).all())  # every participant's copy
      oracle_rows.append({"length": length, "dtype": dtype, "op": op, "exact": exact})
oracle = pd.DataFrame(oracle_rows)
oracle.pivot_table(index="op", columns="dtype", values="exact", aggfunc="all")

# %% [markdown]
# ## What each participant sends
#
# The compiled HLO says exactly what moves. For the ring each participant sends
# 2(p−1)/p·n bytes — under 2n however many participants there are. The central root
# sends (p−1)·n and receives as much: its link is the bottleneck and grows with p.
# `hlo.audit_all_reduce` compiles an algorithm on p devices and reads the bytes from
# its `collective-permute` ops; `cost_model.schedule` gives the closed form beside it.

# %%
ps = [2, 4, 8] if SMALL else [2, 3, 4, 5, 6, 7, 8]
n_bytes = 4 * 840  # per participant, a multiple of every p here
sent_rows = []
for p in ps:
  for a in ("ring", "naive"):
    got_p = hlo.audit_all_reduce(a, p, n_bytes // 4)
    sent_rows.append(
      {
        "p": p,
        "algorithm": a,
        "sent / n (HLO)": got_p.max_sent_bytes / n_bytes,
        "sent / n (formula)": cost_model.schedule(a, p, n_bytes).max_sent_bytes / n_bytes,
      }
    )
sent = pd.DataFrame(sent_rows)
assert np.allclose(sent["sent / n (HLO)"], sent["sent / n (formula)"])
display(sent.pivot(index="p", columns="algorithm", values="sent / n (HLO)").round(3))

fig, ax = plt.subplots(figsize=(6, 3.5))
for a, d in sent.groupby("algorithm"):
  ax.plot(d["p"], d["sent / n (formula)"], color=style(a)["color"], lw=8, alpha=0.25)
  ax.plot(d["p"], d["sent / n (HLO)"], label=f"{a} (compiled HLO)", **style(a))
ax.plot([], [], color="0.5", lw=8, alpha=0.25, label="closed form")
ax.set(xlabel="participants p", ylabel="bytes sent by the busiest / n")
ax.set_title("the ring stays under 2n; the root grows with p")
ax.legend(loc="upper left", fontsize=8)
ax.grid(alpha=0.3)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## What this run showed

# %%
at_p = sent[sent["p"] == ps[-1]].set_index("algorithm")["sent / n (HLO)"]
identical = bool(np.array_equal(got, lib))
CONCLUSION = {
  "devices": DEVICES,
  "backend": jax.default_backend(),
  "permutes": hlo_table.iloc[0]["collective-permute"],
  "psum_diff": np.abs(got - ref).max(),
  "exact": int(oracle["exact"].sum()),
  "cases": len(oracle),
  "p": ps[-1],
  "ring_sent": at_p["ring"],
  "root_sent": at_p["naive"],
}
same = "matched the library's ring bit for bit" if identical else "differed from the library's ring"
vs_psum = (
  "equalled lax.psum bit for bit on random floats"
  if CONCLUSION["psum_diff"] == 0
  else f"differed from lax.psum by at most {CONCLUSION['psum_diff']:.2g} on random floats"
  " (the same numbers added in another order)"
)
print(
  f"On {DEVICES} emulated {CONCLUSION['backend']} devices the ring written in this notebook "
  f"{same}, with the same {CONCLUSION['permutes']} collective-permutes, and {vs_psum}. "
  f"On integer-valued inputs it equalled the NumPy oracle bit for bit in "
  f"{CONCLUSION['exact']} of {len(oracle)} op/dtype/shape cases. At p={ps[-1]} each ring "
  f"participant sent {CONCLUSION['ring_sent']:.2f}·n bytes, the central root "
  f"{CONCLUSION['root_sent']:.0f}·n."
)
