# %% [markdown]
# # 1 · All-reduce from scratch
#
# In data-parallel training every worker computes a gradient on its own slice of the
# batch. Before the optimizer step the gradients must be **summed (or averaged) and the
# same result delivered to every worker**: that is an *all-reduce*. It runs once per
# step, on every parameter, so its cost sits directly on the training step time.
#
# This notebook starts from the simplest scheme (send everything to one place), then
# **writes the ring all-reduce from `lax.ppermute`** as its two halves, a
# *reduce-scatter* and an *all-gather*, checks each against XLA's own
# (`lax.psum_scatter`, `lax.all_gather`, `lax.psum`) and a NumPy sum, shows that the
# library's `all_reduce(..., algorithm="ring")` is exactly that algorithm, counts what
# each participant sends, and uses the halves the way ZeRO does: gradients
# reduce-scattered, each device updating only its slice of the parameters and of the
# optimizer state, parameters all-gathered.
#
# Along the way: cells that ask **you** for a number before the next cell computes it
# (write it where it says `guess = None`), and one **try this** exercise with a check
# (its solution is folded under "Solution"). `DEVICES` below is yours to change: the
# ring works for any number of devices and any buffer length.
#
# **Run time.** Full mode 17 s on 2 CPU cores; small mode
# (`ALLREDUCE_JAX_SMALL=1` in the environment, or the kernel "allreduce-jax small" in
# JupyterLab) 10–60 s: a smaller buffer, the NumPy comparison on fewer shapes,
# and the bytes counted at p = 2, 4 and 8 instead of every p from 2 to 8. Every
# sentence at the end is computed from the run.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"  # CI runs the small mode
DEVICES = 8  # emulated devices: any number from 2 up (try 3 or 6)
P_TRACE = 4  # participants in the step-by-step pictures (at most DEVICES)
N = 1_003 if SMALL else 100_003  # float32 per participant: no device count divides it

# %%
import jax

jax.config.update("jax_num_cpu_devices", DEVICES)  # before the first JAX computation

import math

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
import pandas as pd
from IPython.display import display
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import all_gather, all_reduce, cost_model, hlo, reduce_scatter, teach, trace
from allreduce_jax.palette import style

print(jax.__version__, jax.default_backend(), len(jax.devices()), "devices")
p_trace = min(P_TRACE, DEVICES)

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
frames = trace.run_trace("naive", p_trace)
trace.plot_trace(frames, f"naive (parameter server), p={p_trace}")
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
frames = trace.run_trace("ring", p_trace)
trace.plot_trace(
  frames, f"ring, p={p_trace}: steps 1..{p_trace - 1} reduce-scatter, then all-gather"
)
plt.show()
print(
  "after the reduce-scatter, complete chunks sit on the diagonal:",
  np.diag(frames[p_trace - 1].counts),
)

# %% [markdown]
# ## The ring, written out: two halves
#
# Inside `jax.shard_map` each participant runs the same function on its own block.
# `lax.axis_index` says who it is, `lax.ppermute(x, axis, pairs)` is one message step:
# every `(source, target)` pair sends `x` at the same time.
#
# * **Reduce-scatter** (`f32[p·c] → f32[c]`): participant i starts with its copy of
#   chunk i−1; in step s it passes its running partial sum to the right and adds its
#   own copy of the chunk that just arrived (chunk i−s−2). After p−1 steps it holds
#   chunk i summed over everyone.
# * **All-gather** (`f32[c] → f32[p·c]`): each participant's finished chunk goes round
#   the ring; in step s participant i receives chunk i−s−1 and puts it in place.
# * **All-reduce** = all-gather ∘ reduce-scatter. A buffer whose length p does not
#   divide is **padded** with zeros to a multiple of p (zeros add nothing to a sum) and
#   cut back afterwards.


# %%
def ring_reduce_scatter(x, axis):  # x: f32[p*c] on each participant -> f32[c]
  p, i = lax.axis_size(axis), lax.axis_index(axis)
  c = x.shape[0] // p  # chunk length
  right = [(j, (j + 1) % p) for j in range(p)]  # everyone sends to its right neighbour

  def chunk(k):  # our own copy of chunk k (k is traced: i is)
    return lax.dynamic_slice_in_dim(x, (k % p) * c, c)

  acc = chunk(i - 1)
  for s in range(p - 1):  # one chunk per link per step
    acc = lax.ppermute(acc, axis, right) + chunk(i - s - 2)
  return acc  # chunk i, summed over all p participants


def ring_all_gather(block, axis):  # block: f32[c] on each participant -> f32[p*c]
  p, i = lax.axis_size(axis), lax.axis_index(axis)
  c = block.shape[0]
  right = [(j, (j + 1) % p) for j in range(p)]
  out = lax.dynamic_update_slice_in_dim(jnp.zeros(p * c, block.dtype), block, i * c, 0)
  for s in range(p - 1):
    block = lax.ppermute(block, axis, right)  # participant i-s-1's chunk
    out = lax.dynamic_update_slice_in_dim(out, block, ((i - s - 1) % p) * c, 0)
  return out


def ring_all_reduce(x, axis):  # x: f32[n], any n
  n, p = x.shape[0], lax.axis_size(axis)
  padded = jnp.pad(x, (0, -n % p))  # zeros up to a multiple of p
  return ring_all_gather(ring_reduce_scatter(padded, axis), axis)[:n]


# %% [markdown]
# First each half on its own, against XLA's: `lax.psum_scatter(x, axis, tiled=True)` (the
# reduce-scatter: participant i gets slice i of the sum) and `lax.all_gather(x, axis,
# tiled=True)`. Integer-valued inputs make every sum exact in any order, so both must
# agree **bit for bit**.

# %%
mesh = jax.make_mesh((DEVICES,), ("i",))
shard = NamedSharding(mesh, P("i"))


def per_device(f):
  """``f`` on each device's row ``T[n]``; the results stacked as ``T[p, ...]``."""
  body = lambda b: f(b[0])[None]  # noqa: E731
  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))


m = DEVICES * 5  # a multiple of p: the halves take whole chunks, as lax's do
ints = jax.device_put(
  np.random.default_rng(0).integers(-20, 20, (DEVICES, m)).astype(np.float32), shard
)
halves = pd.DataFrame(
  {
    "reduce-scatter": [
      np.array_equal(
        per_device(lambda b: ring_reduce_scatter(b, "i"))(ints),
        per_device(lambda b: lax.psum_scatter(b, "i", tiled=True))(ints),
      )
    ],
    "all-gather": [
      np.array_equal(
        per_device(lambda b: ring_all_gather(b[:5], "i"))(ints),
        per_device(lambda b: lax.all_gather(b[:5], "i", tiled=True))(ints),
      )
    ],
  },
  index=["bit for bit equal to lax's"],
)
assert halves.to_numpy().all()
halves

# %% [markdown]
# Now the whole all-reduce on random floats, one gradient-like block of `N` values per
# device (`N` is divisible by no device count up to 16, so the padding is used),
# next to XLA's `lax.psum` and the library's ring:

# %%
x = jax.device_put(jax.random.normal(jax.random.key(0), (DEVICES, N)), shard)
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
# same chunks, same order of additions. The library's halves are the notebook's too:

# %%
lib_rs = per_device(lambda b: reduce_scatter(b, "i", algorithm="ring", tiled=True))
lib_ag = per_device(lambda b: all_gather(b[:5], "i", algorithm="ring", tiled=True))
same_halves = bool(
  np.array_equal(lib_rs(ints), per_device(lambda b: ring_reduce_scatter(b, "i"))(ints))
  and np.array_equal(lib_ag(ints), per_device(lambda b: ring_all_gather(b[:5], "i"))(ints))
)
print("reduce_scatter and all_gather(algorithm='ring') == the notebook's halves:", same_halves)
assert same_halves

# %% [markdown]
# ### Predict before you run
#
# The compiled program of the ring holds one `collective-permute` (XLA's name for a
# `ppermute`) per message step. **How many does it hold at p = `DEVICES`?** Write your
# number, then run the next two cells.

# %% tags=["predict"]
guess = None  # your number of collective-permutes

# %%
programs = {"ring written above": mine, "all_reduce(algorithm='ring')": library, "lax.psum": xla}
audits = {name: hlo.audit(hlo.compiled_text(f, x)) for name, f in programs.items()}
teach.reveal(
  guess, audits["ring written above"].permutes, what=f"collective-permutes at p={DEVICES}"
)

# %% [markdown]
# Each of the 2(p−1) steps is one `collective-permute` in the compiled HLO, and
# `allreduce_jax.hlo` reads what each one carries:

# %%
n_pad = N + (-N % DEVICES)
hlo_table = pd.DataFrame(
  {
    name: {
      "collective-permute": a.permutes,
      "all-reduce": a.counts["all-reduce"],
      "bytes sent per participant, through permutes": a.max_sent_bytes,
      "of which / (2(p−1)/p · 4·n_padded)": a.max_sent_bytes
      / (2 * (DEVICES - 1) / DEVICES * 4 * n_pad),
    }
    for name, a in audits.items()
  }
).T
assert hlo_table.iloc[0].equals(hlo_table.iloc[1])
assert hlo_table.iloc[0]["collective-permute"] == 2 * (DEVICES - 1)
hlo_table

# %% [markdown]
# `lax.psum` sends no `collective-permute`: it compiles to **one `all-reduce` op** over the
# whole 4·n-byte buffer, and the HLO does not say how XLA's runtime moves it (between
# emulated devices of one process, through shared memory; across processes, through its
# collectives library, gloo on CPU and NCCL on GPU, each with its own algorithm). So the
# audit cannot count its bytes: its 0 above means "none through permutes", not "nothing
# sent". Whatever it does, it must move at least the bound 2(p−1)/p·n per participant
# (Patarasuk & Yuan), which is what the ring sends. The hand-written ring spells out
# every step, which is what lets us count, change and time them.
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
  lambda b: jnp.stack([all_reduce(b, "i", op=op, algorithm="ring") for op in OPS])
)
oracle_rows = []
for length in lengths:
  blocks = np.random.default_rng(length).integers(-20, 20, (DEVICES, length))
  want = {op: reduce(blocks, axis=0) for op, reduce in OPS.items()}  # the oracle
  for dtype in ("float32", "bfloat16", "int32"):
    x_int = jax.device_put(jnp.asarray(blocks, dtype), shard)
    got_ops = np.asarray(ring_ops(x_int), np.float64)  # [participant, op, element]
    for k, op in enumerate(OPS):
      exact = bool((got_ops[:, k] == want[op]).all())  # every participant's copy
      oracle_rows.append({"length": length, "dtype": dtype, "op": op, "exact": exact})
oracle = pd.DataFrame(oracle_rows)
oracle.pivot_table(index="op", columns="dtype", values="exact", aggfunc="all")

# %% [markdown]
# ### Try this: the central scheme, written by you
#
# Write the parameter server of the first picture from `lax.ppermute`: in steps
# s = 1 … p−1 participant s sends its block to participant 0 (a `ppermute` with the
# single pair `(s, 0)`; everyone who receives nothing gets zeros); participant 0 adds
# them up; then in steps s = 1 … p−1 participant 0 sends the total to participant s.
# Every participant must end with the sum, in 2(p−1) message steps.


# %% tags=["exercise"]
def naive_all_reduce(x, axis):  # x: f32[n] on each participant -> the sum, on each
  raise NotImplementedError("your turn: write it with lax.ppermute")


# %% tags=["check"]
def naive_is_right():
  f = per_device(lambda b: naive_all_reduce(b, "i"))
  got = np.asarray(f(ints))
  want = np.broadcast_to(np.asarray(ints).sum(0), got.shape)
  if not np.array_equal(got, want):
    return False, f"{int((got != want).any(1).sum())} of {DEVICES} participants hold a wrong sum"
  a = hlo.audit(hlo.compiled_text(f, ints))
  if a.counts["all-reduce"] or a.permutes != 2 * (DEVICES - 1):
    return (
      False,
      f"it compiled to {a.permutes} collective-permutes and {a.counts['all-reduce']} all-reduce",
    )
  return True


teach.check(
  naive_is_right,
  right=f"every participant holds the sum, bit for bit, after 2(p−1) = {2 * (DEVICES - 1)} message steps through participant 0.",
  wrong="every participant must hold the NumPy sum after 2(p−1) ppermute steps and no lax.psum",
)

# %% [markdown] tags=["solution"]
# <details><summary>Solution</summary>
#
# ```python
# def naive_all_reduce(x, axis):  # x: f32[n] on each participant -> the sum, on each
#   p, i = lax.axis_size(axis), lax.axis_index(axis)
#   total = x
#   for s in range(1, p):  # collect: participant s sends to 0 (the others get zeros)
#     total = total + lax.ppermute(x, axis, [(s, 0)])
#   out = jnp.where(i == 0, total, jnp.zeros_like(total))  # only 0's total is the sum
#   for s in range(1, p):  # hand back: 0 sends the total to s
#     out = out + lax.ppermute(total, axis, [(0, s)])
#   return out
# ```
# </details>

# %% [markdown]
# ## What each participant sends
#
# ### Predict before you run
#
# At p = 8, **how many bytes does each ring participant send, in units of its buffer
# size n?** (And the central root? Count its messages.)

# %% tags=["predict"]
guess = None  # the ring's bytes sent per participant / n, at p = 8

# %%
teach.reveal(guess, cost_model.schedule("ring", 8, 4096).max_sent_bytes / 4096,
             what="bytes a ring participant sends at p=8, in units of n")  # fmt: skip

# %% [markdown]
# The ring sends 2(p−1)/p·n bytes per participant — under 2n however many participants
# there are. The central root sends (p−1)·n and receives as much: its link is the
# bottleneck and grows with p. `hlo.audit_all_reduce` compiles an algorithm on p devices
# and reads the bytes from its `collective-permute` ops; `cost_model.schedule` gives the
# closed form beside it.

# %%
ps = sorted({p for p in ([2, 4, 8] if SMALL else range(2, 9)) if p <= DEVICES} | {DEVICES})
n_elems = 8 * math.lcm(*ps)  # per participant, a multiple of every p here
sent_rows = []
for p in ps:
  for a in ("ring", "naive"):
    got_p = hlo.audit_all_reduce(a, p, n_elems)
    sent_rows.append(
      {
        "p": p,
        "algorithm": a,
        "sent / n (HLO)": got_p.max_sent_bytes / (4 * n_elems),
        "sent / n (formula)": cost_model.schedule(a, p, 4 * n_elems).max_sent_bytes / (4 * n_elems),
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
# ## The halves apart: a ZeRO step
#
# Data parallelism keeps a whole copy of the parameters **and of the optimizer state**
# on every device: with Adam that is two more floats per parameter, three copies of the
# model where one would do. ZeRO (Rajbhandari et al. 2020) and PyTorch's FSDP cut them
# into p slices with the all-reduce's own halves:
#
# 1. every device computes its gradient (all n values) from the full parameters;
# 2. **reduce-scatter** (mean) the gradients: device i gets slice i of the averaged
#    gradient, exactly the slice the all-reduce would have computed;
# 3. device i runs Adam on **its slice only**: its slice of the parameters, its slice of
#    Adam's moments;
# 4. **all-gather** the updated slices: every device has the full parameters again.
#
# Adam works element by element, so updating slice i alone computes the same bits as
# updating the whole vector and keeping slice i. The two steps below train a
# least-squares model for a few steps (each device its own batch), one with the
# all-reduce and every device updating everything, one ZeRO's way; they must agree
# bit for bit. Both run the same jitted `adam_update`: on replicated arrays it updates
# everything on every device, on arrays sliced over the devices each device updates its
# own slice. (Written inside each shard_map instead, the update would be fused with
# whatever made the gradient, differently in the two programs, and XLA may then round
# a·b + c once, as a fused multiply-add, in one and twice in the other: the same
# numbers to the last bit but one.)
#
# ### Predict before you run
#
# Per step, **how many bytes does a ZeRO participant send, as a multiple of what the
# all-reduce step's participant sends?**

# %% tags=["predict"]
guess = None  # bytes sent by the ZeRO step / bytes sent by the all-reduce step

# %%
STEPS = 3
rng = np.random.default_rng(1)
batch_x = jax.device_put(rng.standard_normal((DEVICES, 16, N)).astype(np.float32) / np.sqrt(N), shard)  # fmt: skip
batch_y = jax.device_put(rng.standard_normal((DEVICES, 16)).astype(np.float32), shard)
tx = optax.adam(1e-2)
c = -(-N // DEVICES)  # the slice each device owns (the last ones padded)


def loss(w, xb, yb):  # w: f32[N]; xb: f32[16, N]; yb: f32[16]
  return jnp.mean((xb @ w - yb) ** 2)


@jax.jit
def adam_update(g, state, w):  # element by element: on whatever slice a device holds
  updates, state = tx.update(g, state, w)
  return optax.apply_updates(w, updates), state


@jax.jit
@jax.shard_map(mesh=mesh, in_specs=(P(), P("i"), P("i")), out_specs=P())
def dp_gradient(w, xb, yb):  # w: all N parameters, on every device
  g = jax.grad(loss)(lax.pcast(w, "i", to="varying"), xb[0], yb[0])  # this device's gradient
  return all_reduce(g, "i", op="mean", algorithm="ring")  # f32[N], the mean, on every device


@jax.jit
@jax.shard_map(mesh=mesh, in_specs=(P("i"), P("i"), P("i")), out_specs=P("i"))
def zero_gradient(w_slice, xb, yb):  # w_slice: f32[c], device i's slice of the parameters
  w = all_gather(w_slice, "i", algorithm="ring", tiled=True)[:N]  # f32[N]: all of them
  g = jnp.pad(jax.grad(loss)(w, xb[0], yb[0]), (0, DEVICES * c - N))  # f32[p*c]
  return reduce_scatter(g, "i", op="mean", algorithm="ring", tiled=True)  # f32[c]: slice i


w0 = jax.random.normal(jax.random.key(2), (N,)) * 0.1
# Adam's moments sliced like the parameters; its step count is one number on every device
opt_shardings = jax.tree.map(
  lambda a: NamedSharding(mesh, P("i") if a.ndim else P()), tx.init(jnp.zeros(DEVICES * c))
)
w_dp, s_dp = w0, tx.init(w0)  # replicated: every device holds all of both
w_zero = jax.device_put(jnp.pad(w0, (0, DEVICES * c - N)), shard)  # device i: [i*c, (i+1)*c)
s_zero = jax.device_put(tx.init(w_zero), opt_shardings)
agree = []
for _ in range(STEPS):
  w_dp, s_dp = adam_update(dp_gradient(w_dp, batch_x, batch_y), s_dp, w_dp)
  w_zero, s_zero = adam_update(zero_gradient(w_zero, batch_x, batch_y), s_zero, w_zero)
  agree.append(bool(np.array_equal(np.asarray(w_zero)[:N], np.asarray(w_dp))))
sent_dp = hlo.audit(hlo.compiled_text(dp_gradient, w_dp, batch_x, batch_y)).max_sent_bytes
sent_zero = hlo.audit(hlo.compiled_text(zero_gradient, w_zero, batch_x, batch_y)).max_sent_bytes
teach.reveal(guess, sent_zero / sent_dp, what="bytes the ZeRO step sends / the all-reduce step's")

# %%
held = pd.DataFrame(
  {"all-reduce step": [N, 2 * N, sent_dp], "ZeRO step": [c, 2 * c, sent_zero]},
  index=["parameters kept per device", "Adam moments kept per device", "bytes sent per step"],
)
print(
  f"after each of {STEPS} steps, ZeRO's parameters == the all-reduce step's, bit for bit:", agree
)
assert all(agree)
held

# %% [markdown]
# The same bytes (a reduce-scatter plus an all-gather *is* an all-reduce) and the same
# parameters, bit for bit, with a p-th of the parameters and of the optimizer state kept
# per device between steps. ZeRO's stages 1 and 2 keep the full parameters on every
# device and shard only the optimizer state (and the gradients); the step above shards
# the parameters too (ZeRO-3, PyTorch's FSDP) and gathers them for the step's forward
# and backward pass. FSDP does that layer by layer and frees each layer's parameters
# after the forward, so it gathers them again for the backward pass: one more
# all-gather, 1.5 times the all-reduce's bytes, for a model that no longer has to fit
# whole on one device.
#
# ## What this run showed

# %%
at_p = sent[sent["p"] == ps[-1]].set_index("algorithm")["sent / n (HLO)"]
identical = bool(np.array_equal(got, lib))
CONCLUSION = {
  "devices": DEVICES,
  "backend": jax.default_backend(),
  "n": N,
  "permutes": int(hlo_table.iloc[0]["collective-permute"]),
  "psum_diff": np.abs(got - ref).max(),
  "exact": int(oracle["exact"].sum()),
  "cases": len(oracle),
  "p": ps[-1],
  "ring_sent": at_p["ring"],
  "root_sent": at_p["naive"],
  "zero_steps": STEPS,
  "slice": c,
  "zero_bytes_ratio": sent_zero / sent_dp,
  "lesson": {
    "ring_is_the_library_s": identical and same_halves,
    "halves_equal_lax_s": bool(halves.to_numpy().all()),
    "oracle_exact": bool(oracle["exact"].all()),
    "ring_under_2n": bool(at_p["ring"] < 2),
    "root_sends_more": bool(at_p["naive"] > at_p["ring"]),
    "zero_equals_all_reduce_step": all(agree),
    "zero_sends_the_same": bool(sent_zero == sent_dp),
  },
}
same = "matched the library's ring bit for bit" if identical else "differed from the library's ring"
vs_psum = (
  "equalled lax.psum bit for bit on random floats"
  if CONCLUSION["psum_diff"] == 0
  else f"differed from lax.psum by at most {CONCLUSION['psum_diff']:.2g} on random floats"
  " (the same numbers added in another order)"
)
c_ = CONCLUSION
print(
  f"On {DEVICES} emulated {c_['backend']} devices the ring written in this notebook, its "
  f"reduce-scatter and all-gather equal to lax.psum_scatter's and lax.all_gather's bit for "
  f"bit, {same} on {c_['n']:,} floats per participant (padded to a multiple of p), with the "
  f"same {c_['permutes']} collective-permutes, and {vs_psum}. On integer-valued inputs it "
  f"equalled the NumPy oracle bit for bit in {c_['exact']} of {c_['cases']} op/dtype/shape "
  f"cases. At p={c_['p']} each ring participant sent {c_['ring_sent']:.2f}·n bytes, the "
  f"central root {c_['root_sent']:.0f}·n."
)
print(
  f"The ZeRO step (gradients reduce-scattered, each device updating its slice, parameters "
  f"all-gathered) ended {c_['zero_steps']} steps with the all-reduce step's parameters bit for "
  f"bit, keeping {c_['slice']:,} of the {c_['n']:,} parameters and their Adam moments per "
  f"device and sending "
  f"{c_['zero_bytes_ratio']:.2f} times the all-reduce step's bytes."
)
