# %% [markdown]
# # 4 · Compressed all-reduce: fewer bytes, a growing error
#
# Notebook 3 showed that large all-reduces are bandwidth-bound: their time is the bytes
# moved. Sending fewer bytes is the next idea. `all_reduce(x, "i", wire="int8")` sends
# every message as block-absmax int8 (one float32 scale per 256 elements, in the same
# message): about a quarter of the bytes. But the result is no longer exact. A ring
# re-encodes the running partial sum at every hop, so each hop adds a fresh rounding
# error on a larger sum; `two_shot` (notebook 2) sends every slice straight to its
# owner, encoded once.
#
# Here we write the int8 codec in a few lines of NumPy and check it against the
# library's, follow one ring chunk hop by hop, check that the library's JAX program does
# exactly this arithmetic, watch the error grow with p, and read what the quarter of the
# bytes buys in time on a real (emulated) link. Two cells ask you for a number first;
# one asks you to write two-shot's arithmetic.
#
# **Run time.** Full mode 29 s on 2 CPU cores; small mode
# (`ALLREDUCE_JAX_SMALL=1` in the environment, or the kernel "allreduce-jax small" in
# JupyterLab) 4–16 s: the hop-by-hop replay follows 16 participants instead of
# 256, with a smaller buffer, and the time saved is read from the study's committed
# rows only (full mode also measures it on an emulated 4-host switch where Linux network
# namespaces can be made). Every sentence at the end is computed from the run.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"
P_RING = 16 if SMALL else 256  # participants of the hop-by-hop replay
N = 4096 if SMALL else 16384  # float32 elements per participant
LIVE = not SMALL  # also time the int8 ring on an emulated 4-host switch (about 40 s)

# %%
import jax
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import all_reduce, netns, teach, wire_error
from allreduce_jax.devices import mesh_for, use_cpu_devices
from allreduce_jax.palette import label, style

use_cpu_devices(8)  # 8 emulated CPU devices (before the first computation)
rng = np.random.default_rng(0)

from allreduce_jax.results import source_commit

print("allreduce-jax at commit", source_commit() or "(not a git checkout)")

# %% [markdown]
# ## The int8 codec, inline
#
# Cut the message into blocks of 256 elements. Each block travels as one float32
# **scale** s = absmax/127 and 256 **codes** round(x/s), integers in [−127, 127], one
# byte each; the receiver multiplies back. The scale is rounded to 16 significant bits
# first, so that code × scale (7 + 16 bits) is exact in float32: every receiver of the
# same message decodes the same bits, and a value decoded and encoded again comes back
# unchanged.

# %%
BLOCK = 256


def int8_encode(x):  # x: f32[n], n a multiple of 256 -> (codes i8[n/256, 256], scales f32[n/256])
  blocks = x.reshape(-1, BLOCK)
  scale = (np.abs(blocks).max(axis=1) / np.float32(127)).astype(np.float32)
  bits = scale.view(np.uint32)
  scale = ((bits + np.uint32(0x80)) & np.uint32(0xFFFFFF00)).view(np.float32)  # 16 bits
  safe = np.where(scale > 0, scale, 1).astype(np.float32)  # an all-zero block: codes 0
  codes = np.clip(np.round(blocks / safe[:, None]), -127, 127).astype(np.int8)
  return codes, scale


def int8_decode(codes, scale):  # -> f32[n]
  return (codes.astype(np.float32) * scale[:, None]).reshape(-1)


x = rng.standard_normal((P_RING, N)).astype(np.float32)
codes, scales = int8_encode(x[0])
mine = int8_decode(codes, scales)
same_codec = bool(np.array_equal(mine, wire_error.np_roundtrip("int8", x[0])))
print(f"{codes.nbytes + scales.nbytes:,} bytes on the wire for {x[0].nbytes:,} bytes of float32")
print("decoded == the library's codec, bit for bit:", same_codec)
assert same_codec

# %% [markdown]
# ### Predict before you run
#
# **How many bytes per element does a message on this wire carry, scales included?**
# (float32: 4.)

# %% tags=["predict"]
guess = None  # bytes per element, int8 wire

# %%
teach.reveal(guess, (codes.nbytes + scales.nbytes) / x[0].size, what="bytes per element, int8 wire")

# %% [markdown]
# ## One chunk around the ring
#
# Chunk k starts at participant k+1; at each hop the partial sum is encoded, sent,
# decoded and the next participant adds its own copy. The exact sum of the same
# contributions is carried beside it.

# %%
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
# ### Try this: two-shot's arithmetic
#
# Write what every participant holds after `all_reduce(..., algorithm="two_shot",
# wire="int8")`, in NumPy, with the codec above (`wire_error.np_roundtrip("int8", v)` is
# the same encode-then-decode of a float32 vector `v`). Cut each participant's block into p
# slices of n/p (n is a multiple of p here); the owner k of slice k starts from its own
# copy and adds, in float32 and in this order, the encoded copies of participants k−1,
# k−2, …, k−(p−1) (mod p); its sum is encoded once more on its way to everyone.


# %% tags=["exercise"]
def my_two_shot(x):  # x: f32[p, n], participant i's block in row i -> f32[n]
  raise NotImplementedError("your turn: each slice encoded once, summed at its owner")


# %% tags=["check"]
def two_shot_is_right():
  for q in (2, 5, 8):
    got = my_two_shot(x[:q, : q * 64])
    want = wire_error.replay("two_shot", x[:q, : q * 64], "int8")
    if got is None or not np.array_equal(np.asarray(got, np.float32), want):
      return False, f"at p={q} the result differs from the library's replay"
  return True


teach.check(
  two_shot_is_right,
  right="bit for bit the library's replay: each slice is encoded once on its way to its owner and once on its way back, whatever p.",
  wrong="the owner adds the encoded copies in the order k−1, k−2, …, then the sum is encoded once more",
)

# %% [markdown] tags=["solution"]
# <details><summary>Solution</summary>
#
# ```python
# def my_two_shot(x):  # x: f32[p, n], participant i's block in row i -> f32[n]
#   p, n = x.shape
#   slices = x.reshape(p, p, n // p)  # [holder, slice, n/p]
#   out = []
#   for k in range(p):  # the owner of slice k
#     acc = slices[k, k].copy()
#     for d in range(1, p):
#       acc = acc + wire_error.np_roundtrip("int8", slices[(k - d) % p, k])
#     out.append(wire_error.np_roundtrip("int8", acc))  # the all-gather's encoding
#   return np.concatenate(out)
# ```
# </details>

# %% [markdown]
# ## The error against p
#
# Below, the error after every hop of the ring (over all chunks together), with an int8
# and a bf16 wire, and beside it int8 `two_shot` run at p = 2, 3, … participants: there
# every slice is encoded once on its way to its owner and once more on its way back,
# whatever p is.
#
# ### Predict before you run
#
# Hop k rounds a partial sum of k contributions. On log-log axes a power law is a
# straight line whose slope is its exponent: **what slope will the int8 ring's error
# have against the hop count?**

# %% tags=["predict"]
guess = None  # the exponent x in error ∝ hops^x, int8 ring

# %%
steps = np.arange(1, P_RING + 1)
once = [
  wire_error.relative_error(wire_error.replay("two_shot", x[:q], "int8"), x[:q])
  for q in range(2, P_RING + 1)
]
growth = {
  "ring": np.polyfit(np.log(steps), np.log(hops["int8"]), 1)[0],
  "two_shot": np.polyfit(np.log(steps[1:]), np.log(once), 1)[0],
}
teach.reveal(guess, growth["ring"], what="slope of the int8 ring's error against the hop count")

# %%
fig, ax = plt.subplots(figsize=(7.5, 5))
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
# Hop k rounds a partial sum of k contributions, whose size grows like √k, so its
# rounding error does too; the independent errors of hops 1 … k add up to
# √(1 + … + k) ≈ k/√2 units, while the exact sum grows like √k: the *relative* error grows
# like √k, a slope of ½. Encoded once, two_shot's error does not grow with p.
#
# ## What the quarter of the bytes buys
#
# In one process bytes are free and the codec is pure cost. On a link they are the cost.
# The compression study timed the ring with each wire on an emulated switch of 4 hosts
# linked at 200 Mbit/s each way (`allreduce-jax cluster`, an idle machine, the slowest
# host's median of 5 calls; at 16 MiB three repeats). Its rows are committed:

# %%
import allreduce_jax  # the checkout's committed rows, whatever folder this notebook runs in

study = os.path.join(
  os.path.dirname(allreduce_jax.__file__), "..", "experiments", "compression", "rows"
)
switch = pd.read_json(os.path.join(study, "cluster_switch4_200Mbit.jsonl"), lines=True)
switch["wire"] = switch["wire"].fillna("float32")
table = switch[switch["algorithm"] == "ring"].pivot(index="bytes", columns="wire", values="time_us")
table = table[["float32", "bf16", "int8"]] / 1e3
table["float32 / int8"] = table["float32"] / table["int8"]
table.index = [f"{n // 2**20} MiB" for n in table.index]
repeats = pd.read_json(os.path.join(study, "repeats_16MiB.jsonl"), lines=True)
repeats = repeats[repeats["algorithm"] == "ring"]
repeats["wire"] = repeats["wire"].fillna("float32")
ratios = (
  repeats.pivot_table(index="repeat", columns="wire", values="time_us")
  .eval("float32 / int8")
  .to_numpy()
)
print("ring all-reduce time on the 200 Mbit/s switch, ms per call (the study's rows):")
table.round(2)

# %% [markdown]
# ### Predict before you run
#
# The int8 ring puts 0.254 of the float32 ring's bytes on the wire. **How many times
# faster was it at 16 MiB per host?**

# %% tags=["predict"]
guess = None  # float32 ring time / int8 ring time at 16 MiB

# %%
teach.reveal(
  guess, float(np.median(ratios)), what="float32 / int8 ring time at 16 MiB (median of 3)"
)
print(f"the three repeats: {', '.join(f'{r:.2f}' for r in sorted(ratios))}")

# %% [markdown]
# Less than the 3.9× the bytes alone would give: every ring step also pays a fixed cost
# (a TCP round trip, gloo's handshake, a kernel), and every message is encoded and decoded
# on a CPU that the 4 hosts share. Below 1 MiB the fixed costs dominate and the gain
# shrinks. In full mode the next cell measures the same thing on a switch built here.

# %%
live = None
why = netns.privilege_problem()
if not LIVE:
  print("small mode: no cluster started; the study's rows above are the measurement")
elif why:
  print(f"skipped: the emulated cluster cannot be built here: {why}")
else:
  import contextlib
  import io
  import tempfile

  from allreduce_jax import cli

  with tempfile.TemporaryDirectory() as tmp:
    rows = os.path.join(tmp, "bench.jsonl")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      rc = cli.main(
        ["cluster", "--hosts", "4", "--link", "200Mbit", "--timeout", "600", "--", "bench",
         "--algorithms", "ring", "--wires", "none,int8", "-b", "16MiB", "-e", "16MiB",
         "-n", "3", "-w", "1", "--no-uneven", "--out", rows]
      )  # fmt: skip
    assert rc == 0, err.getvalue()[-2000:]
    bench = pd.read_json(rows, lines=True)
  bench["wire"] = bench["wire"].fillna("float32")
  live = bench.set_index("wire")["time_us"] / 1e3
  print(f"measured here, ms per call: {live.round(1).to_dict()}; float32 / int8 = "
        f"{live['float32'] / live['int8']:.2f}")  # fmt: skip

# %% [markdown]
# ## What this run showed

# %%
CONCLUSION = {
  "first": hops["int8"][0],
  "last": hops["int8"][-1],
  "p": P_RING,
  "bf16": hops["bf16"][-1],
  "two_shot": once[-1],
  "ring_slope": growth["ring"],
  "two_shot_slope": growth["two_shot"],
  "devices": p,
  "bytes_per_element": (codes.nbytes + scales.nbytes) / x[0].size,
  "block": BLOCK,
  "hosts": 4,  # the study's switch
  "link_mbit": 200,
  "study_bytes": 16 << 20,
  "speedup_16MiB": float(np.median(ratios)),
  "speedup_lo": float(ratios.min()),
  "speedup_hi": float(ratios.max()),
  "lesson": {
    "codec_is_the_library_s": same_codec,
    "ring_error_grows": bool(growth["ring"] > 0.3),
    "two_shot_flat": bool(abs(growth["two_shot"]) < 0.2),
    "int8_faster_on_a_link": bool(np.median(ratios) > 1.5),
  },
}
c = CONCLUSION
print(
  f"The int8 codec written here (1 byte per element plus a float32 scale per {c['block']}: "
  f"{c['bytes_per_element']:.3f} bytes per element) decoded bit for bit as the library's. With "
  f"an int8 wire the ring's relative error was {c['first']:.2e} after one hop and "
  f"{c['last']:.2e} at p = {P_RING}, growing like p^{c['ring_slope']:.2f}; a bf16 wire ended "
  f"at {c['bf16']:.2e}. int8 two_shot, each slice encoded once, ended at {c['two_shot']:.2e} "
  f"(growing like p^{c['two_shot_slope']:.2f}). The JAX program on {p} devices gave the NumPy "
  f"replay's result bit for bit."
)
print(
  f"On the study's {c['hosts']}-host {c['link_mbit']} Mbit/s switch the int8 ring was {c['speedup_16MiB']:.2f}× "
  f"[{c['speedup_lo']:.2f}–{c['speedup_hi']:.2f}] as fast as the float32 ring at {c['study_bytes'] // 2**20} MiB per host."
)
if live is not None:
  CONCLUSION["live_speedup"] = float(live["float32"] / live["int8"])
  CONCLUSION["lesson"]["int8_faster_here"] = bool(CONCLUSION["live_speedup"] > 1.5)
  print(f"Measured in this run on a switch built here: {CONCLUSION['live_speedup']:.2f}×.")
else:
  reason = (
    "small mode starts no cluster" if not LIVE else "the emulated cluster cannot be built here"
  )
  CONCLUSION["too_short"] = {"int8_faster_here": reason}
  print(f"No link was measured in this run ({reason}); the study's rows are the measurement.")
