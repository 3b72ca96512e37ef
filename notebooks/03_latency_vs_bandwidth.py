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
# # 3 · Latency vs bandwidth
#
# Every all-reduce pays two kinds of cost: a fixed price per message step (α, the
# *latency*: a kernel launch, a rendezvous, a network round trip) and a price per byte
# moved (β, the inverse *bandwidth*). An algorithm with few steps but many bytes
# (recursive doubling: lg p steps of n bytes) wins on small messages; one with few
# bytes but many steps (the ring: 2(p−1) steps of n/p bytes) wins on large ones.
#
# Here we measure the algorithms on emulated devices nccl-tests style, fit α and β to
# the measurements, read off the crossover sizes, check what `algorithm="auto"` picks,
# and see why frameworks pack small gradients into buckets before reducing them.
#
# Emulated CPU devices share one process and one memory, so absolute numbers say
# little about a GPU cluster; the *shape* of the curves and the method carry over.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"  # CI runs the small mode
DEVICES = 8
# psum (XLA's own) and every candidate `auto` chooses from, so each gets its own fit
ALGORITHMS = [
  "psum",
  "ring",
  "recursive_doubling",
  "halving_doubling",
  "tree",
  "bidirectional_ring",
  "naive",
]
MIN_BYTES, MAX_BYTES = 1 << 10, (1 << 20 if SMALL else 16 << 20)  # per participant
FACTOR = 8 if SMALL else 4
ITERS, WARMUP = (5, 1) if SMALL else (10, 3)
FUSION_LAYERS, FUSION_D_MODEL = (2, 16) if SMALL else (8, 64)  # the transformer's gradients
FUSION_BUCKETS = ["per-leaf", "64KiB", "one"] if SMALL else ["per-leaf", "64KiB", "1MiB", "one"]
RESULTS = os.environ.get("ALLREDUCE_JAX_RESULTS", "../results")

# %%
import jax

jax.config.update("jax_num_cpu_devices", DEVICES)  # before the first JAX computation

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from allreduce_jax import cost_model
from allreduce_jax.tools import bench, fusion_bench
from allreduce_jax.tools.bench import format_size

OUT = Path(RESULTS) / "notebooks" / "03"
OUT.mkdir(parents=True, exist_ok=True)
print(jax.__version__, jax.default_backend(), len(jax.devices()), "devices")

# %% [markdown]
# ## The benchmark: every algorithm, side by side, at each size
#
# `bench.measure_size` places a verifiable input on the devices, compiles each
# algorithm separately, warms up, then times them **round robin** (call 1 of each, call
# 2 of each, ...) so that a slow moment of this shared machine hits all alike. Every
# result is checked against `lax.psum` (`#wrong`). As in nccl-tests,
# algbw = n/t and busbw = algbw·2(p−1)/p, the number to compare with a link's peak.
# `model(us)` is the prediction of the documented defaults (no fit yet); `vs psum` is
# the busbw ratio to XLA's own all-reduce.

# %%
sizes = bench.sweep_sizes(MIN_BYTES, MAX_BYTES, FACTOR, 4, DEVICES, uneven=not SMALL)
rows = []
print(bench.HEADER)
for n in sizes:
  at_n = bench.measure_size(ALGORITHMS, DEVICES, n, iters=ITERS, warmup=WARMUP)
  psum_bw = next(r["busbw_gbps"] for r in at_n if r["algorithm"] == "psum")
  for r in at_n:
    print(bench.format_row(r, psum_bw))
  rows += at_n
print(bench.summary(rows))
assert all(r["wrong"] == 0 for r in rows)

# %%
fig, ax = plt.subplots(figsize=(6.5, 4))
for alg in ALGORITHMS:
  mine = [r for r in rows if r["algorithm"] == alg]
  ax.plot([r["bytes"] for r in mine], [r["busbw_gbps"] for r in mine], "o-", label=alg)
ax.set_xscale("log", base=2)
ax.set_xlabel("bytes per participant")
ax.set_ylabel("bus bandwidth (GB/s)")
ax.set_title(f"busbw on {DEVICES} emulated {jax.default_backend()} devices (median of {ITERS})")
ax.grid(True, which="both", alpha=0.3)
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# Small messages reach a tiny fraction of the bandwidth: the time is almost all fixed
# cost. busbw climbs with size as the per-byte part takes over; the algorithm with the
# fewest steps leads on the left, the one with the fewest bytes on the right.
#
# ## The α-β model, fitted to these measurements
#
# `cost_model.schedule` gives each algorithm's step count and bytes on the critical
# path in closed form; time = α·steps + β·bytes + γ·bytes reduced is linear in
# (α, β, γ), so a least-squares fit over the measured rows gives them
# (`bench.fit_and_save`: one shared fit and one per algorithm, the way NCCL keeps a
# latency and a bandwidth per algorithm).

# %%
fit_path = OUT / "cost_params.json"
fitted, fit_text, fit_table = bench.fit_and_save(rows, fit_path)
for name, q in [("shared", fitted.shared), *fitted.per_algorithm.items()]:
  d = cost_model.params_to_dict(q)
  print(
    f"{name:>20}: α = {d['alpha_us']:8.1f} µs   β = {d['beta_ns_per_byte']:7.3f} ns/B"
    f" ({d['bandwidth_gbps']:6.2f} GB/s)   γ = {d['gamma_ns_per_byte']:.3f} ns/B"
  )
print()
print(fit_text)

# %%
# bench.plot: measured medians with min-max bars, the fitted model dashed, the ring's
# latency-bound region shaded and the model's switch points marked.
bench.plot(rows, fitted, title=f"all-reduce time vs size, p={DEVICES}")
plt.show()

# %% [markdown]
# ## Crossover sizes
#
# Two questions, both answered from the fitted parameters:
#
# * **Where is one algorithm latency-bound?** Its latency term α·steps equals its
#   per-byte term at n* (`cost_model.balance_bytes`); for the ring
#   2(p−1)α = 2(p−1)/p·nβ gives n* = p·α/β. Below n* adding bytes is almost free.
# * **Where does the best algorithm change?** `cost_model.switch_points` finds the
#   sizes where the model's argmin changes, among the algorithms measured here.
#
# For contrast, the same numbers for the documented NVLink-class defaults
# (α = 5 µs, 100 GB/s). What sets the crossovers is α/β: the bytes a link could have
# moved in the time of one step's latency. A GPU link has a much smaller α but a far
# larger bandwidth, so its α/β — and every crossover — can sit at larger sizes than
# on emulated CPU devices.

# %%
custom = tuple(a for a in ALGORITHMS if a != "psum")


def kib(n):
  return f"{n / 1024:,.1f} KiB"


for name, params in [("fitted here", fitted), ("NVLink-class default", cost_model.DEFAULT_PARAMS)]:
  q = cost_model.resolve(params, "ring")
  print(f"{name}: ring's α/β = {kib(q.alpha / q.beta)}")
  for alg in custom:
    print(
      f"  {alg:>20} latency-bound below n* = {kib(cost_model.balance_bytes(alg, DEVICES, params))}"
    )
  for n, before, after in cost_model.switch_points(DEVICES, params, 8, 1 << 30, custom):
    print(f"  best algorithm changes {before} -> {after} at {kib(n)}")
switches = cost_model.switch_points(DEVICES, fitted, 8, 1 << 30, custom)
ring_star = cost_model.balance_bytes("ring", DEVICES, fitted)

# %%
wide = np.geomspace(8, 1 << 30, 200)
fig, ax = plt.subplots(figsize=(7, 4.5))
for alg in custom:
  ax.loglog(wide, [cost_model.predict_us(alg, DEVICES, n, fitted) for n in wide], label=alg)
ax.axvspan(wide[0], ring_star, color="0.92", zorder=0, label="ring latency-bound (n < n*)")
ax.set_xscale("log", base=2)
top = ax.get_ylim()[1]
for k, (n, before, after) in enumerate(switches):  # labels staggered downwards
  ax.axvline(n, color="tab:red", ls=":", lw=1)
  ax.text(n, top / 6**k, f" {before}→{after}\n at {kib(n)}", fontsize=7, color="tab:red", va="top")
ax.set_xlabel("bytes per participant")
ax.set_ylabel("predicted time (µs), fitted α-β model")
ax.set_title(f"the fitted model beyond the measured sizes, p={DEVICES}")
ax.grid(True, which="both", alpha=0.3)
ax.legend(fontsize=7, loc="lower right")
plt.show()

# %% [markdown]
# ## What `auto` picks
#
# `algorithm="auto"` makes the NCCL-style choice at trace time: the candidate with
# the smallest predicted time for this p and size, with the fit found in
# `$ALLREDUCE_JAX_COST_PARAMS` (else `results/cost_params.json`, else the defaults).
# We point it at the fit just made and time it side by side with the algorithm that
# was fastest at that size above. Every candidate was measured above, so each is priced
# with its own fit (a candidate left out would be priced with the shared one).

# %%
os.environ[cost_model.FIT_ENV_VAR] = str(fit_path)
fastest = {
  n: min(
    (r for r in rows if r["bytes"] == n and r["algorithm"] in custom), key=lambda r: r["time_us"]
  )
  for n in sizes
}
auto_rows = {}
print(f"{'size':>8} {'auto picks':>20} {'fastest measured':>20} {'auto (µs)':>10} {'it (µs)':>10}")
for n in sizes:
  best = fastest[n]["algorithm"]
  at_n = bench.measure_size(["auto", best], DEVICES, n, iters=ITERS, warmup=WARMUP, params=fitted)
  assert all(r["wrong"] == 0 for r in at_n)
  auto_rows[n] = at_n[0]
  print(
    f"{format_size(n):>8} {at_n[0]['chosen']:>20} {best:>20}"
    f" {at_n[0]['time_us']:>10.0f} {at_n[1]['time_us']:>10.0f}"
  )
agree = sum(auto_rows[n]["chosen"] == fastest[n]["algorithm"] for n in sizes)

# %% [markdown]
# ## Tensor fusion: why small gradients must be bucketed
#
# A model's gradient is a pytree of many leaves, most of them small (biases, norms).
# Reduced leaf by leaf, each all-reduce pays the full latency term, so L leaves cost
# about L·2(p−1)α + 2(p−1)/p·Nβ. Packed into B buckets they cost
# B·2(p−1)α + 2(p−1)/p·Nβ: the bytes are the same, the fixed costs are divided by L/B.
# PyTorch DDP uses 25 MB buckets, Horovod a 64–128 MB fusion buffer.
#
# `fusion_bench.measure_model` times `all_reduce_tree` (ring) on the gradient pytree
# of the training CNN and of a GPT-like transformer, per leaf and in buckets, side by
# side, and checks every result against `psum`.

# %%
buckets = {b: fusion_bench.BUCKETS[b] for b in FUSION_BUCKETS}
models = {
  "cnn": fusion_bench.cnn_shapes(),
  "transformer": fusion_bench.transformer_shapes(FUSION_LAYERS, FUSION_D_MODEL),
}
fusion_rows = []
for model, shapes in models.items():
  fusion_rows += fusion_bench.measure_model(
    model, shapes, "ring", DEVICES, buckets, ITERS, WARMUP, fitted
  )
print(fusion_bench.format_rows(fusion_rows))
assert all(r["wrong"] == 0 for r in fusion_rows)

# %%
fig, ax = plt.subplots(figsize=(6.5, 4))
width = 0.8 / len(models)
for k, model in enumerate(models):
  mine = [r for r in fusion_rows if r["model"] == model]
  x = np.arange(len(mine)) + k * width
  ax.bar(
    x, [r["time_us"] / 1e3 for r in mine], width, label=f"{model} ({mine[0]['n_leaves']} leaves)"
  )
  for xi, r in zip(x, mine):
    ax.text(xi, r["time_us"] / 1e3, f"{r['n_buckets']}", ha="center", va="bottom", fontsize=7)
ax.set_xticks(np.arange(len(FUSION_BUCKETS)) + width * (len(models) - 1) / 2, FUSION_BUCKETS)
ax.set_xlabel("bucket size (number above a bar: all-reduces issued)")
ax.set_ylabel("time of one gradient all-reduce (ms)")
ax.set_title(f"ring all-reduce of a gradient pytree, p={DEVICES}")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## What this run showed

# %%
by = {(r["algorithm"], r["bytes"]): r for r in rows}
small_n, big_n = sizes[0], sizes[-1]
best_small = min(custom, key=lambda a: by[a, small_n]["time_us"])
best_big = min(custom, key=lambda a: by[a, big_n]["time_us"])
ring_fit = cost_model.params_to_dict(fitted.get("ring"))
tr = {r["bucket"]: r for r in fusion_rows if r["model"] == "transformer"}
cross = "; ".join(f"{b}→{a} at {kib(n)}" for n, b, a in switches) or "no change in 8 B–1 GiB"
print(
  f"On {DEVICES} emulated {jax.default_backend()} devices, at {format_size(small_n)} the fastest "
  f"hand-written algorithm was {best_small} ({by[best_small, small_n]['time_us']:.0f} µs, ring "
  f"{by['ring', small_n]['time_us']:.0f} µs) and at {format_size(big_n)} it was {best_big} "
  f"({by[best_big, big_n]['busbw_gbps']:.2f} GB/s busbw; psum "
  f"{by['psum', big_n]['busbw_gbps']:.2f} GB/s). The ring's own fit gives α = "
  f"{ring_fit['alpha_us']:.0f} µs per step and {ring_fit['bandwidth_gbps']:.2f} GB/s, so it "
  f"is latency-bound below about {kib(ring_star)} here; the model's best algorithm "
  f"changes {cross}. auto's pick matched the fastest measured algorithm at {agree}/{len(sizes)} "
  f"sizes. Bucketing the {tr['per-leaf']['n_leaves']}-leaf transformer gradient into one "
  f"all-reduce was {tr['one']['speedup_vs_per_leaf']:.1f}x faster than reducing it leaf by leaf."
)
