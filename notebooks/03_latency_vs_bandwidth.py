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

# %%
import jax

jax.config.update("jax_num_cpu_devices", DEVICES)  # before the first JAX computation

# %matplotlib inline
import pandas as pd
from IPython.display import display

from allreduce_jax import cost_model, names
from allreduce_jax.tools import bench, fusion_bench, plot, report
from allreduce_jax.units import format_bytes, parse_size

# The sizes are the report's (`allreduce-jax report`): one definition for both.
BENCH = report.settings("bench", smoke=SMALL)
FUSION = report.settings("fusion", smoke=SMALL)
# psum (XLA's own, the reference) and every candidate `auto` chooses from, so each
# gets its own fit.
ALGORITHMS = [*names(hand_written=False, axes=1), *names(auto=True)]
OUT = report.results_dir("notebooks", "03")
print(jax.__version__, jax.default_backend(), len(jax.devices()), "devices;", BENCH)

# %% [markdown]
# ## The benchmark: every algorithm, side by side, at each size
#
# `bench.measure_size` places a verifiable input on the devices, compiles each
# algorithm separately, warms up, then times them **round robin** (call 1 of each, call
# 2 of each, ...) so that a slow moment of this shared machine hits all alike. Every
# result is checked against `lax.psum` (`wrong`). As in nccl-tests,
# algbw = n/t and busbw = algbw·2(p−1)/p, the number to compare with a link's peak.

# %%
sizes = bench.sweep_sizes(
  parse_size(BENCH["min_bytes"]), parse_size(BENCH["max_bytes"]), BENCH["factor"], 4, DEVICES,
  uneven=not SMALL,
)  # fmt: skip
rows = []
for n in sizes:
  rows += bench.measure_size(ALGORITHMS, DEVICES, n, iters=BENCH["iters"], warmup=BENCH["warmup"])
measured = pd.DataFrame(rows)
assert (measured["wrong"] == 0).all()
measured.pivot(index="bytes", columns="algorithm", values="busbw_GBps").round(4)

# %%
plot.busbw(rows)

# %% [markdown]
# Bus bandwidth in GB/s above. Small messages reach a tiny fraction of the bandwidth:
# the time is almost all fixed cost. busbw climbs with size as the per-byte part takes
# over; the algorithm with the fewest steps leads on the left, the one with the fewest
# bytes on the right.
#
# ## The α-β model, fitted to these measurements
#
# `cost_model.schedule` gives each algorithm's step count and bytes on the critical
# path in closed form; time = α·steps + β·bytes + γ·bytes reduced is linear in
# (α, β, γ), so a non-negative least-squares fit over the measured rows gives them
# (`bench.fit_and_save`: one shared fit and one per algorithm, the way NCCL keeps a
# latency and a bandwidth per algorithm). For one algorithm at one p the bytes reduced
# are a fixed multiple of the bytes sent, so its own γ cannot be told from β: it shows
# as NaN below and β includes it.

# %%
fit_path = OUT / "cost_params.json"
fitted, fit_text, fit_table = bench.fit_and_save(rows, fit_path)
display(pd.DataFrame(bench.fit_params_table(fitted)).set_index("fit").round(4))
errors = pd.DataFrame(fit_table)
errors.pivot(index="bytes", columns="algorithm", values="fit_err").round(2)

# %% [markdown]
# The relative error of each algorithm's own fit, per size (0.1 = the model 10 % slow).
# The library's `bench` figure shows the same: measured medians with min–max bars, the
# fitted model dashed, the ring's latency-bound region shaded and the model's switch
# points marked.

# %%
plot.bench(rows, fitted, title=f"all-reduce time vs size, p={DEVICES}")

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
custom = [a for a in ALGORITHMS if a in names(hand_written=True)]
defaults = cost_model.DEFAULT_PARAMS
balance = pd.DataFrame(
  {
    name: {a: cost_model.balance_bytes(a, DEVICES, params) / 1024 for a in custom}
    for name, params in [("fitted here", fitted), ("NVLink-class default", defaults)]
  }
).round(1)
balance.index.name = "latency-bound below (KiB)"
display(balance)
switches = cost_model.switch_points(DEVICES, fitted, 8, 1 << 30, custom)
pd.DataFrame(
  [
    {"params": name, "from": before, "to": after, "at (KiB)": round(n / 1024, 1)}
    for name, params in [("fitted here", fitted), ("NVLink-class default", defaults)]
    for n, before, after in cost_model.switch_points(DEVICES, params, 8, 1 << 30, custom)
  ]
)

# %%
plot.model(
  DEVICES, fitted, custom, title=f"the fitted model beyond the measured sizes, p={DEVICES}"
)

# %% [markdown]
# ## What `auto` picks
#
# `algorithm="auto"` makes the NCCL-style choice at trace time: the candidate with
# the smallest predicted time for this p and size, under `cost_model.current_params()`.
# We hand it the fit just made (`cost_model.use_params`) and time it side by side with
# the algorithm that was fastest at that size above. Every candidate was measured
# above, so each is priced with its own fit.

# %%
fastest = measured[measured["algorithm"].isin(custom)].loc[
  lambda d: d.groupby("bytes")["time_us"].idxmin()
]
auto_rows = []
with cost_model.use_params(fitted):
  for _, best in fastest.iterrows():
    n = int(best["bytes"])
    at_n = bench.measure_size(
      ["auto", best["algorithm"]], DEVICES, n, iters=BENCH["iters"], warmup=BENCH["warmup"],
      params=fitted,
    )  # fmt: skip
    assert all(r["wrong"] == 0 for r in at_n)
    auto_rows.append(
      {
        "size": format_bytes(n),
        "auto picks": at_n[0]["chosen"],
        "fastest measured": best["algorithm"],
        "auto (µs)": round(at_n[0]["time_us"]),
        "it (µs)": round(at_n[1]["time_us"]),
      }
    )
auto_table = pd.DataFrame(auto_rows).set_index("size")
agree = int((auto_table["auto picks"] == auto_table["fastest measured"]).sum())
auto_table

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
buckets = dict(fusion_bench.BUCKETS)
models = {
  "cnn": fusion_bench.cnn_shapes(),
  "transformer": fusion_bench.transformer_shapes(FUSION["layers"], FUSION["d_model"]),
}
fusion_rows = []
for model, shapes in models.items():
  fusion_rows += fusion_bench.measure_model(
    model, shapes, "ring", DEVICES, buckets, FUSION["iters"], FUSION["warmup"], fitted
  )
fusion = pd.DataFrame(fusion_rows)
assert (fusion["wrong"] == 0).all()
display(fusion.pivot(index="bucket", columns="model", values="n_buckets").loc[list(buckets)])
fusion.pivot(index="bucket", columns="model", values="speedup_vs_per_leaf").loc[
  list(buckets)
].round(2)

# %%
plot.fusion(fusion_rows, list(buckets))

# %% [markdown]
# ## What this run showed

# %%
by = measured.set_index(["algorithm", "bytes"])
small_n, big_n = sizes[0], sizes[-1]
best_small = min(custom, key=lambda a: by.loc[(a, small_n), "time_us"])
best_big = min(custom, key=lambda a: by.loc[(a, big_n), "time_us"])
ring_fit = cost_model.params_to_dict(fitted.get("ring"))
ring_star = cost_model.balance_bytes("ring", DEVICES, fitted)
tr = fusion[fusion["model"] == "transformer"].set_index("bucket")
cross = (
  "; ".join(f"{b}→{a} at {n / 1024:,.1f} KiB" for n, b, a in switches) or "no change in 8 B–1 GiB"
)
print(
  f"On {DEVICES} emulated {jax.default_backend()} devices, at {format_bytes(small_n)} the fastest "
  f"hand-written algorithm was {best_small} ({by.loc[(best_small, small_n), 'time_us']:.0f} µs, "
  f"ring {by.loc[('ring', small_n), 'time_us']:.0f} µs) and at {format_bytes(big_n)} it was "
  f"{best_big} ({by.loc[(best_big, big_n), 'busbw_GBps']:.3f} GB/s busbw; psum "
  f"{by.loc[('psum', big_n), 'busbw_GBps']:.3f} GB/s). The ring's own fit gives α = "
  f"{ring_fit['alpha_us']:.0f} µs per step and {ring_fit['bandwidth_GBps']:.2f} GB/s, so it "
  f"is latency-bound below about {ring_star / 1024:,.1f} KiB here; the model's best algorithm "
  f"changes {cross}. auto's pick matched the fastest measured algorithm at {agree}/{len(sizes)} "
  f"sizes. Bucketing the {tr.loc['per-leaf', 'n_leaves']}-leaf transformer gradient into one "
  f"all-reduce was {tr.loc['one', 'speedup_vs_per_leaf']:.1f}x faster than reducing it leaf by leaf."
)
