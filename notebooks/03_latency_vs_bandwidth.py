# %% [markdown]
# # 3 · Latency vs bandwidth
#
# Every all-reduce pays two kinds of cost: a fixed price per message step (α, the
# *latency*: a kernel launch, a rendezvous, a network round trip) and a price per byte
# moved (β, the inverse *bandwidth*). An algorithm with few steps but many bytes
# (recursive doubling: lg p steps of n bytes) wins on small messages; one with few
# bytes but many steps (the ring: 2(p−1) steps of n/p bytes) wins on large ones.
#
# Here we time the algorithms on emulated devices with a dozen lines of our own, fit α
# and β to the times with a few lines of least squares, read off where each algorithm
# stops being latency-bound and where the best one changes, check what
# `algorithm="auto"` would pick with this fit, on the sizes it was fitted on and on
# sizes it never saw, and see why frameworks pack small gradients into buckets before
# reducing them, with the fitted model's prediction of what packing saves beside the
# measurement. Two cells ask you for a number before the run computes it; one asks you
# to write an algorithm's α-β time.
#
# Emulated CPU devices share one process and one memory, so absolute numbers say
# little about a GPU cluster; the *shape* of the curves and the method carry over.
#
# **Run time.** Full mode 82 s on 2 CPU cores; small mode
# (`ALLREDUCE_JAX_SMALL=1` in the environment, or the kernel "allreduce-jax small" in
# JupyterLab) 15–90 s: four sizes from 8 KiB to 4 MiB instead of eight up to
# 16 MiB (two unseen sizes instead of four), four algorithms and psum instead of every
# `auto` candidate, fewer timed calls and a smaller model gradient for the bucketing. Every sentence at the end is
# computed from the run; where a run measures too little to support one, it says so.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"  # CI runs the small mode
DEVICES = 8
ITERS = 5 if SMALL else 9  # timed calls per algorithm and size (the median is kept)
LAYERS, D_MODEL = (2, 32) if SMALL else (16, 128)  # the model gradient of the last section

# %%
import jax

jax.config.update("jax_num_cpu_devices", DEVICES)  # before the first JAX computation

import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import display
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import all_reduce, all_reduce_tree, cost_model, names, teach
from allreduce_jax.palette import style
from allreduce_jax.units import format_bytes

# psum (XLA's own, the reference) and the candidates `auto` chooses from.
CANDIDATES = names(auto=True)
if SMALL:
  CANDIDATES = tuple(a for a in CANDIDATES if a in ("ring", "tree", "recursive_doubling", "swing"))
ALGORITHMS = ("psum", *CANDIDATES)
SIZES = [8 << 10, 64 << 10, 512 << 10, 4 << 20] if SMALL else [4**k << 10 for k in range(8)]
# sizes between those, never fitted on: where auto's picks are checked a second time
UNSEEN = [24 << 10, 1536 << 10] if SMALL else [2 << 10, 32 << 10, 512 << 10, 8 << 20]
mesh = jax.make_mesh((DEVICES,), ("i",))
print(jax.__version__, jax.default_backend(), len(jax.devices()), "devices")
print("sizes per participant:", ", ".join(format_bytes(n) for n in SIZES))

from allreduce_jax.results import source_commit

print("allreduce-jax at commit", source_commit() or "(not a git checkout)")

# %% [markdown]
# ## Timing an all-reduce, the way nccl-tests does
#
# Each participant holds `n` bytes of float32. The input is placed on the devices
# first; each algorithm is compiled and run once (the warm-up) before any timing; then
# the algorithms are timed **round robin** (call 1 of each, call 2 of each, ...) so a
# slow moment of the machine hits all alike, and the median is kept. Integer-valued
# inputs make every sum exact, so each result is compared with `psum`'s bit for bit.
# As in nccl-tests, algbw = n/t and busbw = algbw·2(p−1)/p: the number to compare with
# a link's peak.
#
# ### Predict before you run
#
# The largest size below is 512 times the smallest (8 KiB to 4 MiB in small mode, 1 KiB
# to 16 MiB... 16384 times in full mode). **How many times longer will the ring take at
# the largest size than at the smallest?**

# %% tags=["predict"]
guess = None  # the ring's time at the largest size / at the smallest


# %%
def compiled(algorithm):
  body = lambda b: all_reduce(b, "i", algorithm=algorithm)  # noqa: E731
  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))


def measure(n_bytes, algorithms, iters=ITERS):
  """Median seconds per call of each algorithm on ``n_bytes`` per participant."""
  rng = np.random.default_rng(n_bytes)
  x = rng.integers(-8, 8, (DEVICES * n_bytes // 4,)).astype(np.float32)  # exact sums
  x = jax.device_put(x, NamedSharding(mesh, P("i")))
  fns = {a: compiled(a) for a in algorithms}
  reference = np.asarray(fns["psum"](x))
  for a, f in fns.items():  # compile, warm up, check
    assert np.array_equal(np.asarray(f(x)), reference), f"{a} is wrong at {n_bytes} B"
  times = {a: [] for a in algorithms}
  for _ in range(iters):
    for a, f in fns.items():
      start = time.perf_counter()
      f(x).block_until_ready()
      times[a].append(time.perf_counter() - start)
  return {a: float(np.median(t)) for a, t in times.items()}


rows = []
for n in SIZES:
  for a, t in measure(n, ALGORITHMS).items():
    busbw = n / t * 2 * (DEVICES - 1) / DEVICES / 1e9
    rows.append({"algorithm": a, "bytes": n, "time_us": 1e6 * t, "busbw_GBps": busbw})
measured = pd.DataFrame(rows)
ring_t = measured[measured["algorithm"] == "ring"].set_index("bytes")["time_us"]
teach.reveal(
  guess, ring_t[SIZES[-1]] / ring_t[SIZES[0]],
  what=f"the ring's time at {format_bytes(SIZES[-1])} / at {format_bytes(SIZES[0])} "
  f"({SIZES[-1] // SIZES[0]:,} times the bytes)",
)  # fmt: skip
measured.pivot(index="bytes", columns="algorithm", values="time_us").round(0)

# %%
fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4))
for a, d in measured.groupby("algorithm", sort=False):
  ax_t.plot(d["bytes"], d["time_us"], label=a, **style(a))
  ax_b.plot(d["bytes"], d["busbw_GBps"], label=a, **style(a))
for ax, what in ((ax_t, "time per all-reduce (µs)"), (ax_b, "bus bandwidth (GB/s)")):
  ax.set(xscale="log", yscale="log", xlabel="bytes per participant", ylabel=what)
  ax.grid(alpha=0.3)
ax_b.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
fig.suptitle(f"measured on {DEVICES} emulated {jax.default_backend()} devices")
fig.tight_layout()
plt.show()

# %% [markdown]
# Small messages reach a tiny fraction of the bandwidth: the time is almost all fixed
# cost, and it hardly moves as the size grows. Further right the per-byte part takes
# over and busbw climbs.
#
# ## The α-β model, fitted with least squares
#
# `cost_model.schedule(a, p, n)` gives an algorithm's schedule in closed form: its
# sequential message `steps` and the bytes on its critical path (`beta_bytes`). The
# model says time = α·steps + β·beta_bytes, linear in (α, β), so each algorithm's own
# α and β come from an ordinary least-squares fit over its measured sizes. Dividing
# each row by the measured time makes the fit minimise *relative* errors, so the
# microsecond sizes count as much as the millisecond ones. (The local reduction, γ per
# byte, is a fixed multiple of the bytes sent for one algorithm at one p: it cannot be
# told apart from β, so β includes it.)

# %%
fits = {}
for a, d in measured.groupby("algorithm", sort=False):
  sched = [cost_model.schedule(a, DEVICES, n) for n in d["bytes"]]
  A = np.array([[s.steps, s.beta_bytes] for s in sched])  # one row per size
  t = d["time_us"].to_numpy() * 1e-6
  coef, *_ = np.linalg.lstsq(A / t[:, None], np.ones(len(t)), rcond=None)
  if (coef < 0).any():  # a cost cannot be negative: fit the other term alone
    keep = coef > 0
    coef = np.zeros(2)
    coef[keep] = np.linalg.lstsq(A[:, keep] / t[:, None], np.ones(len(t)), rcond=None)[0]
  alpha, beta = coef
  model = A @ coef
  fits[a] = {
    "alpha_us": 1e6 * alpha,
    "GBps": 1e-9 / beta if beta > 0 else np.nan,
    "worst error": np.abs(model / t - 1).max(),
    # How much of the largest measured time the per-byte term explains.
    "per-byte share at the largest size": beta * A[-1, 1] / t[-1],
  }
fit_table = pd.DataFrame(fits).T
fit_table.round(3)

# %% [markdown]
# `GBps` is 1/β; where the fit finds no positive per-byte cost it shows NaN: the
# sizes measured never left the latency-bound regime. The last column is the fraction
# of the largest measured time that the per-byte term accounts for — near 0, β is a
# guess.

# %%
sizes_fine = np.geomspace(min(SIZES), max(SIZES), 50)
fig, ax = plt.subplots(figsize=(8, 4.5))
for a, d in measured.groupby("algorithm", sort=False):
  s = style(a)
  ax.plot(d["bytes"], d["time_us"], marker=s["marker"], color=s["color"], ls="none", label=a)
  alpha, gbps = fits[a]["alpha_us"] * 1e-6, fits[a]["GBps"]
  beta = 1e-9 / gbps if gbps > 0 else 0.0
  model = [
    alpha * cost_model.schedule(a, DEVICES, n).steps
    + beta * cost_model.schedule(a, DEVICES, n).beta_bytes
    for n in sizes_fine
  ]
  ax.plot(sizes_fine, 1e6 * np.array(model), color=s["color"], ls="--", lw=1)
ax.set(xscale="log", yscale="log", xlabel="bytes per participant", ylabel="µs")
ax.set_title(f"measured (markers) and each algorithm's fitted α-β model (dashed), p={DEVICES}")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
ax.grid(alpha=0.3)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Where an algorithm stops being latency-bound, and where the best one changes
#
# * An algorithm is **latency-bound** below the size n* where its latency term equals
#   its per-byte term: α·steps = β·beta_bytes(n*). For the ring, 2(p−1)α = 2(p−1)/p·n·β
#   gives n* = p·α/β. Below n*, adding bytes is almost free.
# * The **best algorithm** at a size is the one with the smallest predicted time, as
#   NCCL decides per size. Evaluating every fitted model on a fine grid of sizes and
#   taking the argmin shows where it changes.
#
# What sets both is α/β: the bytes a link could have moved in the time of one step's
# latency. A GPU link has a far smaller α but a far larger bandwidth, so its crossovers
# can sit at larger sizes than on emulated CPU devices.

# %%
hand_written = [a for a in CANDIDATES if fits[a]["GBps"] > 0]
n_star = {
  a: fits[a]["alpha_us"] * 1e-6 * cost_model.schedule(a, DEVICES, 1.0).steps
  / (1e-9 / fits[a]["GBps"] * cost_model.schedule(a, DEVICES, 1.0).beta_bytes)
  for a in hand_written
}  # fmt: skip
display(pd.Series({a: format_bytes(int(n)) for a, n in n_star.items()}, name="latency-bound below"))

grid = np.geomspace(8, 1 << 30, 400)
predicted = np.array(
  [
    [
      fits[a]["alpha_us"] * 1e-6 * cost_model.schedule(a, DEVICES, n).steps
      + 1e-9 / fits[a]["GBps"] * cost_model.schedule(a, DEVICES, n).beta_bytes
      for n in grid
    ]
    for a in hand_written
  ]
)
best = predicted.argmin(0)
changes = [
  (grid[k], hand_written[best[k - 1]], hand_written[best[k]])
  for k in range(1, len(grid))
  if best[k] != best[k - 1]
]
pd.DataFrame([(format_bytes(int(n)), a, b) for n, a, b in changes], columns=["at", "from", "to"])

# %%
fig, ax = plt.subplots(figsize=(8, 4.5))
for k, a in enumerate(hand_written):
  ax.plot(grid, 1e6 * predicted[k], label=a, **{**style(a), "marker": None})
ax.axvspan(min(SIZES), max(SIZES), color="0.9", zorder=0, label="measured sizes")
for k, (n, _, _) in enumerate(changes):
  ax.axvline(n, color="0.3", ls=(0, (6, 3)), lw=1, label="the best one changes" if k == 0 else None)
ax.set(xscale="log", yscale="log", xlabel="bytes per participant", ylabel="predicted µs")
ax.set_title(f"the fitted models beyond the measured sizes, p={DEVICES}")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
ax.grid(alpha=0.3)
fig.tight_layout()
plt.show()

# %% [markdown]
# ### Try this: halving-doubling's α-β time
#
# Halving-doubling (Rabenseifner) takes 2 lg p message steps and puts 2(p−1)/p·n bytes
# on its busiest link, the ring's bytes. Write its predicted time for n bytes per
# participant on p participants (a power of two), given α (seconds per step) and β
# (seconds per byte). The check compares it with `cost_model.schedule` at p = 8 and 64
# and three sizes.


# %% tags=["exercise"]
def hd_seconds(n, p, alpha, beta):  # n bytes per participant, p a power of two
  raise NotImplementedError("your turn: α·steps + β·bytes on the busiest link")


# %% tags=["check"]
def hd_is_right():
  q = cost_model.DEFAULT_PARAMS
  for p in (8, 64):
    for n in (1 << 10, 1 << 20, 1 << 30):
      s = cost_model.schedule("halving_doubling", p, n)
      want = q.alpha * s.steps + q.beta * s.beta_bytes
      got = hd_seconds(n, p, q.alpha, q.beta)
      if not np.isclose(got, want, rtol=1e-9):
        return False, f"at p={p}, n={format_bytes(n)}: {got:.4g} s, the model says {want:.4g} s"
  return True


teach.check(
  hd_is_right,
  right="2 lg p·α + 2(p−1)/p·n·β, the model's time: the ring's bytes in far fewer steps.",
  wrong="halving-doubling's time is α per step times 2 lg p steps plus β times 2(p−1)/p·n bytes",
)

# %% [markdown] tags=["solution"]
# <details><summary>Solution</summary>
#
# ```python
# def hd_seconds(n, p, alpha, beta):  # n bytes per participant, p a power of two
#   lg = int(np.log2(p))
#   return 2 * lg * alpha + 2 * (p - 1) / p * n * beta
# ```
# </details>

# %% [markdown]
# ## What `auto` would pick
#
# `algorithm="auto"` makes the same NCCL-style choice at trace time, from the
# parameters in effect: `cost_model.FittedParams` holds one (α, β) per algorithm, and
# `cost_model.use_params(fit)` makes a fit current (`auto` then compiles to its pick).
# `cost_model.choose` tells the pick without compiling. Is it the algorithm that was
# fastest at each measured size?

# %%
own = {
  a: cost_model.Params(fits[a]["alpha_us"] * 1e-6, 1e-9 / fits[a]["GBps"]) for a in hand_written
}
fit = cost_model.FittedParams(own[hand_written[0]], own, meta={"algorithms": hand_written})
by = measured.set_index(["algorithm", "bytes"])["time_us"]
picks = []
for n in SIZES:
  pick = cost_model.choose(DEVICES, n, fit)
  fastest = min(CANDIDATES, key=lambda a: by[(a, n)])
  picks.append(
    {
      "size": format_bytes(n),
      "auto picks": pick,
      "fastest measured": fastest,
      "pick (µs)": round(by[(pick, n)]),
      "fastest (µs)": round(by[(fastest, n)]),
    }
  )
picks = pd.DataFrame(picks).set_index("size")
picks

# %% [markdown]
# That was the easy test: the fit was made from those very sizes. A model earns its keep
# on sizes it has not seen. Below, sizes between the measured ones (`UNSEEN`), timed the
# same way, against what `auto` picks there with the same fit:

# %%
unseen = []
for n in UNSEEN:
  t = measure(n, ALGORITHMS)
  pick = cost_model.choose(DEVICES, n, fit)
  fastest = min(CANDIDATES, key=t.get)
  unseen.append(
    {
      "size": format_bytes(n),
      "auto picks": pick,
      "fastest measured": fastest,
      "pick (µs)": round(1e6 * t[pick]),
      "fastest (µs)": round(1e6 * t[fastest]),
      "pick / fastest": t[pick] / t[fastest],
    }
  )
unseen = pd.DataFrame(unseen).set_index("size")
unseen.round(2)

# %% [markdown]
# ## Tensor fusion: why small gradients are bucketed
#
# A model's gradient is a pytree of many leaves, most of them small (biases, norms).
# Reduced leaf by leaf, each all-reduce pays the full latency term, so L leaves cost
# about L·2(p−1)α + 2(p−1)/p·Nβ. Packed into one flat buffer they cost
# 2(p−1)α + 2(p−1)/p·Nβ: the same bytes, the fixed cost paid once. PyTorch DDP uses
# 25 MB buckets, Horovod a 64–128 MB fusion buffer.
#
# `all_reduce_tree(tree, axis, bucket_bytes=...)` does the packing: `bucket_bytes=0`
# is one all-reduce per leaf, `None` one bucket per dtype. Below, the gradient of a
# small GPT-style transformer (12 leaves per layer), reduced with the ring both ways.
#
# ### Predict before you run
#
# **How many times faster will one bucket be than one all-reduce per leaf?** (The
# model: LAYERS layers of 12 leaves plus 4; the next cell prints the count.)

# %% tags=["predict"]
guess = None  # per-leaf time / one-bucket time

# %%
d, h = D_MODEL, 4 * D_MODEL
shapes = {"wte": (1024, d), "wpe": (256, d)}
for k in range(LAYERS):
  layer = {"ln1": [(d,), (d,)], "qkv": [(d, 3 * d), (3 * d,)], "proj": [(d, d), (d,)]}
  layer |= {"ln2": [(d,), (d,)], "fc": [(d, h), (h,)], "out": [(h, d), (d,)]}
  shapes |= {f"h{k}/{name}/{j}": s for name, pair in layer.items() for j, s in enumerate(pair)}
shapes |= {"ln_f/scale": (d,), "ln_f/bias": (d,)}
tree = {k: np.ones((DEVICES, *s), np.float32) for k, s in shapes.items()}  # each block: ones
tree = jax.device_put(tree, NamedSharding(mesh, P("i")))
n_bytes = sum(4 * int(np.prod(s)) for s in shapes.values())


def fused(bucket_bytes):
  body = lambda t: all_reduce_tree(t, "i", algorithm="ring", bucket_bytes=bucket_bytes)  # noqa: E731
  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))


fusion_fns = {"per leaf": fused(0), "one bucket": fused(None)}
for f in fusion_fns.values():  # compile, warm up, check: each leaf sums to p
  assert all(np.all(np.asarray(v) == DEVICES) for v in jax.tree.leaves(f(tree)))
fusion_times = {k: [] for k in fusion_fns}
for _ in range(ITERS):
  for k, f in fusion_fns.items():
    start = time.perf_counter()
    jax.block_until_ready(f(tree))
    fusion_times[k].append(time.perf_counter() - start)
fusion = pd.Series({k: 1e6 * float(np.median(t)) for k, t in fusion_times.items()}, name="µs")
print(f"{len(shapes)} leaves, {format_bytes(n_bytes)} per participant")
teach.reveal(guess, fusion["per leaf"] / fusion["one bucket"], what="per leaf / one bucket")
fusion.round(0).to_frame()

# %% [markdown]
# The formula of this section, evaluated with the ring's own fitted α and β: per leaf, the
# sum over the leaves of the ring's time for that leaf's bytes; one bucket, the ring's
# time for all of them.

# %%
ring_gbps = fits["ring"]["GBps"]
ring_q = cost_model.Params(
  fits["ring"]["alpha_us"] * 1e-6, 1e-9 / ring_gbps if ring_gbps > 0 else 0.0
)
per_leaf = sum(cost_model.predict_seconds("ring", DEVICES, 4 * int(np.prod(s)), ring_q) for s in shapes.values())  # fmt: skip
one_bucket = cost_model.predict_seconds("ring", DEVICES, n_bytes, ring_q)
formula = pd.DataFrame(
  {"measured (µs)": fusion, "formula (µs)": [1e6 * per_leaf, 1e6 * one_bucket]}
)
formula["measured / formula"] = formula["measured (µs)"] / formula["formula (µs)"]
formula.loc["per leaf / one bucket"] = formula.loc["per leaf"] / formula.loc["one bucket"]
formula.round(2)

# %% [markdown]
# The last row is the point: from two numbers fitted on single all-reduces, the formula
# says that packing pays and gives the size of the gain, to within a small factor (the
# closing cell prints both). The absolute times it leaves short, because it counts only
# the all-reduces: `all_reduce_tree` also copies every leaf into the bucket and
# back out (a pass over all the bytes on each side), per leaf each small buffer is padded
# to a multiple of p, and the many small steps of a per-leaf program run one after another
# on the host (the same fixed costs that α measured, plus the time to launch and finish
# each op).

# %% [markdown]
# ## What this run showed

# %%
small_n, big_n = SIZES[0], SIZES[-1]
best_small = min(CANDIDATES, key=lambda a: by[(a, small_n)])
best_big = min(CANDIDATES, key=lambda a: by[(a, big_n)])
ring = fits["ring"]
# The fit speaks for the bandwidth only if the per-byte term is a real part of the time.
ring_measurable = (
  ring["alpha_us"] > 0 and ring["GBps"] > 0 and ring["per-byte share at the largest size"] > 0.25
)
CONCLUSION = {
  "p": DEVICES,
  "backend": jax.default_backend(),
  "small_bytes": small_n,
  "big_bytes": big_n,
  "best_small": best_small,
  "best_small_us": by[(best_small, small_n)],
  "ring_small_us": by[("ring", small_n)],
  "best_big": best_big,
  "best_big_busbw": measured.set_index(["algorithm", "bytes"]).loc[(best_big, big_n), "busbw_GBps"],
  "psum_big_busbw": measured.set_index(["algorithm", "bytes"]).loc[("psum", big_n), "busbw_GBps"],
  "agree": int((picks["auto picks"] == picks["fastest measured"]).sum()),
  "sizes": len(SIZES),
  "leaves": len(shapes),
  "fusion_speedup": fusion["per leaf"] / fusion["one bucket"],
  "formula_speedup": per_leaf / one_bucket,
  "unseen": len(UNSEEN),
  "unseen_agree": int((unseen["auto picks"] == unseen["fastest measured"]).sum()),
  "unseen_worst": float(unseen["pick / fastest"].max()),
  "ring_growth": ring_t[SIZES[-1]] / ring_t[SIZES[0]],
  "byte_growth": SIZES[-1] // SIZES[0],
}
CONCLUSION["lesson"] = {
  "time_grows_far_slower_than_bytes": bool(
    CONCLUSION["ring_growth"] < CONCLUSION["byte_growth"] / 4
  ),
  "fusion_pays": bool(CONCLUSION["fusion_speedup"] > 2),
  "the_formula_says_fusion_pays": bool(CONCLUSION["formula_speedup"] > 2),
  "auto_within_half_again_on_unseen_sizes": bool(CONCLUSION["unseen_worst"] < 1.5),
}
sentences = [
  f"From {format_bytes(small_n)} to {format_bytes(big_n)} per participant ({CONCLUSION['byte_growth']:,} "
  f"times the bytes) the ring's time grew {CONCLUSION['ring_growth']:.1f} times.",
  f"On {DEVICES} emulated {CONCLUSION['backend']} devices, at {format_bytes(small_n)} per "
  f"participant the fastest hand-written algorithm was {best_small} "
  f"({CONCLUSION['best_small_us']:.0f} µs; the ring {CONCLUSION['ring_small_us']:.0f} µs), and at "
  f"{format_bytes(big_n)} it was {best_big} ({CONCLUSION['best_big_busbw']:.3f} GB/s busbw; psum "
  f"{CONCLUSION['psum_big_busbw']:.3f} GB/s).",
]
if ring_measurable:
  CONCLUSION |= {"ring_alpha_us": ring["alpha_us"], "ring_GBps": ring["GBps"]}
  CONCLUSION["ring_n_star"] = n_star["ring"]
  sentences.append(
    f"The ring's own fit gives α = {ring['alpha_us']:.0f} µs per step and "
    f"{ring['GBps']:.2f} GB/s, so it is latency-bound below about "
    f"{n_star['ring'] / 1024:,.0f} KiB here."
  )
else:
  sentences.append(
    f"Up to {format_bytes(big_n)} the ring's per-byte cost is too small a part of its time"
    " for the fit to tell its latency from its bandwidth: this run cannot say where it stops"
    " being latency-bound (run without small mode for larger sizes)."
  )
if changes and ring_measurable:
  n0, before, after = changes[0]
  CONCLUSION |= {"first_change_bytes": n0, "before": before, "after": after}
  sentences.append(
    f"In the fitted model the best algorithm first changes from {before} to {after} at about "
    f"{n0 / 1024:,.0f} KiB."
  )
elif ring_measurable:
  CONCLUSION |= {"only": hand_written[best[0]], "grid_lo": grid[0], "grid_hi": grid[-1]}
  sentences.append(
    f"In the fitted model {CONCLUSION['only']} stays the best algorithm from "
    f"{format_bytes(int(grid[0]))} to {format_bytes(int(grid[-1]))}."
  )
c = CONCLUSION
sentences.append(
  f"With this fit, auto's pick was the fastest measured algorithm at {c['agree']} of "
  f"{len(SIZES)} sizes it was fitted on, and at {c['unseen_agree']} of {c['unseen']} sizes it "
  f"never saw, where its pick took at most {c['unseen_worst']:.2f} times the fastest's time. "
  f"Packing the {len(shapes)}-leaf transformer gradient into one bucket made its all-reduce "
  f"{c['fusion_speedup']:.1f}x faster than leaf by leaf; the α-β formula with the ring's fit "
  f"predicted {c['formula_speedup']:.1f}x."
)
print("\n".join(sentences))
