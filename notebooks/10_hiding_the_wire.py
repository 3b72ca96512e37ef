# %% [markdown]
# # 10 · Hiding the wire
#
# A data-parallel step computes a gradient, all-reduces it, and updates. Written that
# way the step costs **compute + communication**. Every system people train with does
# better: the backward pass produces the *last* layer's gradient first, so that bucket
# of gradients can travel while the backward goes on with the layers below (PyTorch
# DDP's buckets, XLA's latency-hiding scheduler). The step then pays the compute plus
# only the communication the backward could not cover.
#
# This notebook prices that schedule in a few inline lines, runs the library's
# `overlap.value_and_grad` on 8 emulated devices and checks its gradient against
# `jax.grad` followed by the all-reduce, then reads what the overlapped step measured
# on the emulated cluster (`experiments/overlap`, committed rows) against today's step
# and the floor no schedule can beat. Cells ask **you** for numbers first (write them
# where it says `guess = None`), and one **try this** exercise asks you to choose the
# bucket size (its solution is folded under "Solution").
#
# **Run time.** Full mode 6 s on 2 CPU cores; small mode
# (`ALLREDUCE_JAX_SMALL=1` in the environment, or the kernel "allreduce-jax small" in
# JupyterLab) 4–15 s: a narrower MLP in the in-process run; the measured section reads
# the same committed rows in both modes. Every sentence at the end is computed from the
# run and the rows.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"  # CI runs the small mode
DEVICES = 8
LAYERS = 4  # layers of the MLP run in process, one bucket each
WIDTH = 32 if SMALL else 256
BATCH = 4  # examples per device

# %%
import jax

jax.config.update("jax_num_cpu_devices", DEVICES)  # before the first JAX computation

import json

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import allreduce_jax
from allreduce_jax import all_reduce_tree, overlap, teach

print(jax.__version__, jax.default_backend(), len(jax.devices()), "devices")

from allreduce_jax.results import source_commit

print("allreduce-jax at commit", source_commit() or "(not a git checkout)")

# %% [markdown]
# ## 1 · Why the last layer's gradient is ready first
#
# An MLP computes `h1 = f(x W0)`, `h2 = f(h1 W1)`, …, then the loss. The backward pass
# runs the chain rule from the loss down: it needs `dL/dh_L` before `dL/dh_{L-1}`, so
# the gradient of the **last** weight matrix is finished first and the first layer's
# last. Cut the gradient into buckets in that order (one per layer here) and each
# bucket's all-reduce can start the moment its stage of the backward ends, while the
# next stage computes. Two streams:
#
# * compute: the forward, then backward stage 1, 2, …, k one after the other;
# * wire: bucket j's all-reduce starts when stage j has ended **and** the previous
#   bucket has left the wire.
#
# The step ends when the last all-reduce does. In code, the whole model:


# %%
def overlapped_step(forward, stages, comms):
  """When the last all-reduce ends: stage j's bucket leaves when it exists and the wire is free."""
  t = end = forward
  for stage, comm in zip(stages, comms):
    t += stage  # this bucket's gradients exist
    end = max(end, t) + comm  # its all-reduce ends
  return max(t, end)


FORWARD, STAGES, COMMS = 1.0, (0.5, 0.5, 0.5, 0.5), (0.6, 0.6, 0.6, 0.6)
after_backward = FORWARD + sum(STAGES) + sum(COMMS)  # today: compute, then every all-reduce
print(f"compute {FORWARD + sum(STAGES):.1f} s, communication {sum(COMMS):.1f} s")
print(f"today's step (the all-reduce after the backward): {after_backward:.1f} s")

# %% [markdown]
# ### Predict before you run
#
# A forward of 1 s, four backward stages of 0.5 s each, and each stage's bucket takes
# 0.6 s on the wire (2.4 s in all). Today's step is 3 + 2.4 = 5.4 s. **How long is the
# overlapped step?** (Draw the two streams on paper: when does the first bucket leave,
# and is the wire ever idle after that?)

# %% tags=["predict"]
guess = None  # the overlapped step, in seconds

# %%
schedule = overlap.Schedule(FORWARD, STAGES, COMMS)  # the library's model of the same step
assert abs(overlapped_step(FORWARD, STAGES, COMMS) - schedule.step_s) < 1e-12
teach.reveal(guess, schedule.step_s, what="the overlapped step", unit=" s")
print(
  f"{after_backward - schedule.step_s:.1f} s of the {sum(COMMS):.1f} s of communication hidden; "
  f"exposed after the backward: {schedule.exposed_s:.1f} s; the floor no schedule beats "
  f"(the last bucket cannot hide, the first cannot leave before stage 1): {schedule.floor_s:.1f} s"
)


# %%
def draw(schedule, ax, title):
  """The two streams of ``schedule`` as bars: compute above, the wire below."""
  t = end = schedule.forward_s
  ax.broken_barh([(0, t)], (1, 0.8), color="0.7")
  for j, (stage, comm) in enumerate(zip(schedule.stage_s, schedule.comm_s)):
    start = max(end, t + stage)
    ax.broken_barh([(t, stage)], (1, 0.8), color=f"C{j}")
    ax.broken_barh([(start, comm)], (0, 0.8), color=f"C{j}", alpha=0.7)
    t, end = t + stage, start + comm
  ax.set_yticks([0.4, 1.4], ["wire", "compute"])
  ax.set_xlabel("seconds")
  ax.set_title(title, fontsize=10)


fig, ax = plt.subplots(figsize=(7, 1.8))
draw(schedule, ax, "forward (grey), then each backward stage and its bucket's all-reduce")
plt.show()

# %% [markdown]
# ## 2 · The library's overlapped gradient, in process
#
# `overlap.value_and_grad(loss_fn, "data", bucket_bytes=...)` cuts the backward into
# one stage per bucket (readiest first) and dispatches each bucket's hand-written
# all-reduce as its own program on a second execution stream, so it runs while the next
# stage computes. Its contract: the gradients are **bit for bit** those of
# `all_reduce_tree(jax.grad(loss_fn)(...))` with the same buckets, i.e. only *when* each
# bucket is sent changes. Here it runs on the 8 emulated devices of this process (one
# machine, so nothing is slow on the wire; section 3 has the network), one layer per
# bucket, and is checked against that and against `lax.pmean` of `jax.grad`.

# %%
mesh = jax.make_mesh((DEVICES,), ("data",))
rng = np.random.default_rng(0)
weights = [
  (rng.normal(size=(WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32) for _ in range(LAYERS)
]
x = rng.normal(size=(DEVICES * BATCH, WIDTH)).astype(np.float32)
y = rng.normal(size=(DEVICES * BATCH, WIDTH)).astype(np.float32)
weights = jax.device_put(weights, NamedSharding(mesh, P()))  # replicated
x, y = (jax.device_put(a, NamedSharding(mesh, P("data"))) for a in (x, y))  # sharded batch


def loss_fn(weights, x, y):  # one device's loss on its BATCH examples
  for w in weights[:-1]:
    x = jnp.tanh(x @ w)
  return jnp.mean((x @ weights[-1] - y) ** 2)


layer_bytes = WIDTH * WIDTH * 4
fn = overlap.value_and_grad(loss_fn, "data", algorithm="ring", bucket_bytes=layer_bytes)
loss, grads = fn(weights, x, y)

order = []  # what was dispatched, in order, and which layer each stage's gradient is
fn.programs(weights, x, y).run(
  weights, x, y, on_dispatch=lambda kind, i, outs: order.append((kind, i, len(outs)))
)
print("dispatch order:", ", ".join(f"{kind} {i}" for kind, i, _ in order))


@jax.jit
@jax.shard_map(mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=(P(), P()))
def after(weights, x, y):
  """Today's step: jax.grad, then the same buckets all-reduced; and lax.pmean's."""
  g = jax.grad(loss_fn)(jax.lax.pcast(weights, "data", to="varying"), x, y)
  ring = all_reduce_tree(g, "data", op="mean", algorithm="ring", bucket_bytes=layer_bytes)
  return ring, jax.lax.pmean(g, "data")


ring, pmean = after(weights, x, y)
bitwise = all(np.array_equal(a, b) for a, b in zip(grads, ring))
pmean_gap = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(grads, pmean))
scale = max(float(jnp.max(jnp.abs(b))) for b in pmean)
print(f"equal to all_reduce_tree(jax.grad) bit for bit: {bitwise}")
print(f"largest difference from lax.pmean(jax.grad): {pmean_gap:.1e} (gradients up to {scale:.2f})")

# %% [markdown]
# The dispatch order is the schedule of section 1: the forward, then stage 0 (the last
# layer's gradient) and at once its all-reduce, then stage 1, and so on. The difference
# from `lax.pmean` is rounding: the ring adds the eight gradients in another order.
#
# ## 3 · What it measured on the emulated cluster
#
# `experiments/overlap` ran a 6-layer MLP (width 768, a bucket per layer) on 2 and 4
# emulated hosts behind a 200 Mbit/s switch, where one all-reduce of the gradient costs
# about as much as the backward. Each variant: per run the median of its trials (a
# trial: the slowest host's time), then the median over the runs. From its rows:
#
# * **today**: the fused gradient, then every bucket's all-reduce (one program);
# * **overlapped**: `overlap.value_and_grad`, two execution streams;
# * **floor**: `T_forward + max(T_backward + T_last, T_first_stage + T_comm)`, from the
#   measured forward, stages and buckets;
# * the **hidden** communication `compute + comm − step`, against the **hideable**
#   `min(T_comm − T_last, T_backward − T_first_stage)`.

# %%
rows_dir = os.path.join(  # the checkout's committed rows, whatever folder this notebook runs in
  os.path.dirname(allreduce_jax.__file__), "..", "experiments", "overlap", "rows"
)
with open(os.path.join(rows_dir, "cells.jsonl")) as f:
  rows = [json.loads(line) for line in f]


def slowest(row, kind):
  """Per trial, the slowest host's end of each ``kind`` event, in order; then their medians."""
  per_trial = [
    [max([e[3] for e in sorted(host[t], key=lambda e: e[1]) if e[0] == kind][j]
         for host in row["timeline"])
     for j in range(sum(e[0] == kind for e in row["timeline"][0][t]))]
    for t in range(len(row["timeline"][0]))
  ]  # fmt: skip
  return np.median(per_trial, axis=0)


def figures(v):
  """One run's figures from its rows by variant (each the median of its trials)."""
  med = {k: float(np.median(r["times_s"])) for k, r in v.items()}
  compute, comm, forward = med["compute"], med["comm"], med["forward"]
  backward = compute - forward
  staged = np.diff([slowest(v["stages"], "forward")[0], *slowest(v["stages"], "stage")])
  first = backward * staged[0] / staged.sum()  # the backward before bucket 0 exists
  last = np.diff([0.0, *slowest(v["comm"], "reduce")])[-1]  # the last bucket's all-reduce
  floor = forward + max(backward + last, first + comm)
  return {
    "compute": compute, "comm": comm, "today": med["after"], "overlapped": med["streams"],
    "floor": floor, "hidden": (compute + comm - med["streams"])
    / max(min(comm - last, backward - first), 1e-9),
  }  # fmt: skip


ring = [  # the ring at 200 Mbit/s, a bucket per layer
  r for r in rows if r["algorithm"] == "ring" and r["wire"] is None
  and r["network"]["link_Bps"] == 25e6 and r["bucket_layers"] == 1.0
]  # fmt: skip
measured = {}
for hosts in (2, 4):
  runs = sorted({r["run"] for r in ring if r["hosts"] == hosts})
  per_run = [
    figures({r["variant"]: r for r in ring if r["hosts"] == hosts and r["run"] == k}) for k in runs
  ]
  measured[hosts] = {k: float(np.median([f[k] for f in per_run])) for k in per_run[0]}
  measured[hosts]["runs"] = len(runs)
for hosts, m in measured.items():
  print(
    f"{hosts} hosts: compute {m['compute']:.2f} s + comm {m['comm']:.2f} s = "
    f"{m['compute'] + m['comm']:.2f} s; today {m['today']:.2f} s, overlapped "
    f"{m['overlapped']:.2f} s, floor {m['floor']:.2f} s"
  )

# %%
hosts_list = list(measured)
fig, ax = plt.subplots(figsize=(6.5, 3.2))
bars = {
  "compute + comm": "compute+comm",
  "today's step": "today",
  "overlapped": "overlapped",
  "floor": "floor",
}
for k, (label, key) in enumerate(bars.items()):
  values = [
    measured[h]["compute"] + measured[h]["comm"] if key == "compute+comm" else measured[h][key]
    for h in hosts_list
  ]
  ax.bar(np.arange(len(hosts_list)) + 0.2 * (k - 1.5), values, 0.2, label=label, color=f"C{k}")
ax.set_xticks(range(len(hosts_list)), [f"{h} hosts" for h in hosts_list])
ax.set_ylabel("step time (s)")
ax.set_title("the 6-layer MLP on the 200 Mbit/s switch, committed rows", fontsize=10)
ax.legend(fontsize=8, loc="upper left")
plt.show()

# %% [markdown]
# ### Predict before you run
#
# On 4 hosts four processes share this machine's two cores, and the all-reduce costs
# less than half the compute. **What fraction of the hideable communication did the
# overlapped step hide there?** (1 would be a perfect schedule.)

# %% tags=["predict"]
guess = None  # hidden / hideable on 4 hosts, from 0 to 1

# %%
teach.reveal(guess, measured[4]["hidden"], what="hidden / hideable on 4 hosts")
print(f"on 2 hosts: {measured[2]['hidden']:.2f}")

# %% [markdown]
# Today's step is already below compute + comm: XLA:CPU runs one compiled program as a
# dependency graph, so the buckets' all-reduces start beside what is left of the fused
# gradient. The overlapped step makes the schedule explicit and lands near its floor. On
# 4 hosts four processes share two cores and more of the communication stays exposed
# after the backward: there the study measured each all-reduce running slower beside the
# backward than alone (`wire ×` in its `tables.md`), while the backward barely slowed.
#
# ## 4 · Try this: the bucket size
#
# Small buckets leave early but each pays a fixed cost on the wire (a latency α per
# all-reduce); large buckets pay it rarely but start late and leave a large last bucket
# exposed. A 12-layer network: each layer's backward takes 0.1 s and its gradient 0.08 s
# on the wire, every bucket adds α = 0.05 s, the forward takes 0.6 s. Buckets hold
# consecutive layers, the same number each. **Set `BUCKET_LAYERS` to the layers per
# bucket (1, 2, 3, 4, 6 or 12) that gives the shortest overlapped step**; `bucketed(k)`
# is its schedule, if you want to try them.


# %%
def bucketed(k, layers=12, layer_s=0.1, wire_s=0.08, alpha=0.05, forward=0.6):
  """The overlapped step's schedule with ``k`` layers per bucket."""
  n = layers // k
  return overlap.Schedule(forward, (k * layer_s,) * n, (k * wire_s + alpha,) * n)


print("one bucket for everything:", f"{bucketed(12).step_s:.2f} s")

# %% tags=["exercise"]
BUCKET_LAYERS = 12  # layers per bucket: 1, 2, 3, 4, 6 or 12


# %% tags=["check"]
def bucket_is_best():
  steps = {k: bucketed(k).step_s for k in (1, 2, 3, 4, 6, 12)}
  best = min(steps, key=steps.get)
  if BUCKET_LAYERS != best:
    return False, f"{BUCKET_LAYERS} layers per bucket take {steps[BUCKET_LAYERS]:.2f} s"
  return True


teach.check(
  bucket_is_best,
  right="that size balances one bucket's wire time against one stage, so the wire never idles and the last bucket is short.",
  wrong="another bucket size gives a shorter step; try each k in bucketed(k).step_s",
)

# %% [markdown] tags=["solution"]
# <details><summary>Solution</summary>
#
# ```python
# BUCKET_LAYERS = min((1, 2, 3, 4, 6, 12), key=lambda k: bucketed(k).step_s)  # 2
# ```
# With 1 layer a bucket takes 0.13 s on the wire against a 0.1 s stage: the wire is the
# bottleneck and pays α twelve times. With 2 (0.21 s against 0.2 s) the two streams
# almost keep pace; from 3 on the compute leads and the last bucket, exposed, grows.
# </details>

# %%
steps = {k: bucketed(k).step_s for k in (1, 2, 3, 4, 6, 12)}
best_k = min(steps, key=steps.get)
fig, axes = plt.subplots(2, 1, figsize=(7, 3.4), sharex=True)
draw(bucketed(best_k), axes[0], f"{best_k} layers per bucket: {steps[best_k]:.2f} s")
draw(bucketed(12), axes[1], f"one bucket: {steps[12]:.2f} s")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Conclusion

# %%
m2, m4 = measured[2], measured[4]
CONCLUSION = {
  "step": schedule.step_s,
  "after": after_backward,
  "floor": schedule.floor_s,
  "devices": DEVICES,
  "layers": LAYERS,
  "bitwise": "bit for bit" if bitwise else "not bit for bit",
  "pmean_gap": pmean_gap,
  "hosts": hosts_list,
  "today": [measured[h]["today"] for h in hosts_list],
  "overlapped": [measured[h]["overlapped"] for h in hosts_list],
  "floors": [measured[h]["floor"] for h in hosts_list],
  "sums": [measured[h]["compute"] + measured[h]["comm"] for h in hosts_list],
  "hidden": [measured[h]["hidden"] for h in hosts_list],
  "best_k": best_k,
  "best_step": steps[best_k],
  "one_bucket": steps[12],
  "lesson": {
    "model_overlap_beats_after": bool(schedule.step_s < after_backward),
    "overlapped_is_all_reduce_tree_bitwise": bitwise,
    "overlapped_close_to_pmean": bool(pmean_gap <= 1e-5 * max(scale, 1.0)),
    "measured_today_below_compute_plus_comm": bool(
      all(measured[h]["today"] < measured[h]["compute"] + measured[h]["comm"] for h in hosts_list)
    ),
    "measured_within_1_15_of_floor": bool(
      all(measured[h]["overlapped"] <= 1.15 * measured[h]["floor"] for h in hosts_list)
    ),
    "best_bucket_layers": best_k,
  },
}
c = CONCLUSION
print(
  f"In the two-stream model the overlapped step took {c['step']:.1f} s against {c['after']:.1f} s "
  f"with the all-reduce after the backward, at its floor of {c['floor']:.1f} s."
)
print(
  f"On {c['devices']} emulated devices the library's overlapped gradient of a {c['layers']}-layer "
  f"MLP equalled all_reduce_tree of jax.grad {c['bitwise']}, and lax.pmean of jax.grad to "
  f"{c['pmean_gap']:.1e}."
)
print(
  "On the emulated cluster (committed rows): "
  + "; ".join(
    f"{h} hosts, compute + comm {s:.2f} s, today's step {t:.2f} s, overlapped {o:.2f} s, "
    f"floor {f:.2f} s, {hd:.2f} of the hideable communication hidden"
    for h, s, t, o, f, hd in zip(
      c["hosts"], c["sums"], c["today"], c["overlapped"], c["floors"], c["hidden"]
    )
  )
  + "."
)
print(
  f"With α per bucket, {c['best_k']} layers per bucket gave the shortest modelled step, "
  f"{c['best_step']:.2f} s, against {c['one_bucket']:.2f} s for one bucket."
)
