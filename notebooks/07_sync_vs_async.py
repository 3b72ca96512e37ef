# %% [markdown]
# # 7 · Synchronous vs asynchronous SGD
#
# **Synchronous** data parallelism: N workers each compute a gradient on their slice of
# the batch, an all-reduce averages them, and every worker applies the same update —
# mathematically one large-batch SGD step, whichever all-reduce algorithm runs.
#
# **Asynchronous** SGD (Downpour, Dean et al. 2012): no all-reduce and no waiting; each
# worker pushes its gradient to a parameter server as soon as it is ready and the server
# applies it at once. The catch: that gradient was computed on parameters that are τ
# updates old (its *staleness*).
#
# This notebook trains a small network on the 8×8 digits: synchronously on 8 emulated
# devices with the hand-written ring (and with `lax.pmean`, to compare), then writes
# stale-gradient SGD in a few lines and sweeps τ with two classic mitigations, and finally
# prices communication on both sides and adds the methods between the two ends (Local
# SGD, DiLoCo, gossip).
#
# **Run time.** Full mode takes about 3 minutes on 2 CPU cores. Small mode
# (`ALLREDUCE_JAX_SMALL=1` in the environment, or the kernel "allreduce-jax small" in
# JupyterLab) takes 30–80 seconds, depending on what else runs: fewer steps and updates, fewer staleness values, one
# seed, 4 workers between the ends. Small mode trains too briefly to separate the arms
# between the ends; the closing cell says which sentences it cannot support.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"  # CI runs the small mode
DEVICES = 8
BATCH = 16  # examples per worker per gradient
SYNC_STEPS = 60 if SMALL else 300
SYNC_EVAL_EVERY = 10 if SMALL else 25
UPDATES = 200 if SMALL else 1500  # stale-gradient updates per run
TAUS = (0, 2, 8) if SMALL else (0, 1, 2, 4, 8, 16)
SEEDS = (0,) if SMALL else (0, 1, 2)
EVAL_EVERY = 25 if SMALL else 50
LR = 0.02  # per-gradient learning rate (batch 16); sync uses DEVICES × LR for its batch
BETWEEN_WORKERS = 4 if SMALL else 8
BETWEEN_GRADIENTS = 160 if SMALL else 2400  # per-worker gradients per run, every arm
H = 10 if SMALL else 50  # local steps per round (Local SGD, DiLoCo)

# %%
import jax

jax.config.update("jax_num_cpu_devices", DEVICES)  # before the first JAX computation

from collections import deque

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
import pandas as pd
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import all_reduce_gradients
from allreduce_jax.training import (
  Setup,
  event_schedule,
  get_arm,
  get_workload,
  load_digits,
  make_model,
  run_arm,
)

print(jax.__version__, jax.default_backend(), len(jax.devices()), "devices")
data = load_digits()  # standardized 8×8 digits, a fixed train/test split
x_train, y_train = jnp.asarray(data.x_train), jnp.asarray(data.y_train)
x_test, y_test = jnp.asarray(data.x_test), jnp.asarray(data.y_test)
print(f"{len(x_train)} training and {len(x_test)} test images of {x_train.shape[1]} pixels")


def init(seed):
  """The project's MLP (64 → 128 → 10), split into its graph and its parameters."""
  graphdef, params = nnx.split(make_model("mlp", seed))
  return graphdef, params


def loss_fn(graphdef, params, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(nnx.merge(graphdef, params)(x), y).mean()


def test_accuracy(graphdef, params):
  return float((nnx.merge(graphdef, params)(x_test).argmax(-1) == y_test).mean())


from allreduce_jax.results import source_commit

print("allreduce-jax at commit", source_commit() or "(not a git checkout)")


# %% [markdown]
# ## 1 · Synchronous: one large-batch step, on the hand-written ring
#
# The step a Flax user writes: parameters replicated (`in_specs=P()`), the batch sharded
# over `"data"` (16 examples per device), and `all_reduce_gradients` chained before the
# optimizer where `lax.pmean` would sit. Each device differentiates its own copy
# (`lax.pcast(..., to="varying")`): under typed `shard_map`, `jax.grad` with respect to
# replicated parameters would already *sum* the gradients with XLA's all-reduce, which
# `all_reduce_gradients` refuses with an error (see `docs/gradients.md`). The same run
# (same initial weights, same batches) trains once with the ring and once with
# `lax.pmean`.

# %%
mesh = jax.make_mesh((DEVICES,), ("data",))
pmean = optax.GradientTransformation(
  lambda params: optax.EmptyState(),
  lambda updates, state, params=None: (jax.lax.pmean(updates, "data"), state),
)


def train_sync(first, seed=0):
  graphdef, params = init(seed)
  tx = optax.chain(first, optax.sgd(DEVICES * LR, momentum=0.9))  # linear lr scaling
  opt_state = tx.init(params)

  @jax.jit
  @jax.shard_map(mesh=mesh, in_specs=(P(), P(), P("data"), P("data")), out_specs=(P(), P()))
  def step(params, opt_state, x, y):
    grads = jax.grad(loss_fn, argnums=1)(
      graphdef, jax.lax.pcast(params, "data", to="varying"), x, y
    )
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  rng = np.random.default_rng(seed)
  shard = NamedSharding(mesh, P("data"))
  curve = [(0, test_accuracy(graphdef, params))]
  for s in range(1, SYNC_STEPS + 1):
    idx = rng.integers(0, len(x_train), DEVICES * BATCH)
    xb, yb = jax.device_put(x_train[idx], shard), jax.device_put(y_train[idx], shard)
    params, opt_state = step(params, opt_state, xb, yb)
    if s % SYNC_EVAL_EVERY == 0:
      curve.append((s, test_accuracy(graphdef, params)))
  return params, np.array(curve)


ring_params, ring_curve = train_sync(all_reduce_gradients("data", algorithm="ring"))
pmean_params, pmean_curve = train_sync(pmean)
param_gap = max(
  float(jnp.max(jnp.abs(a - b)))
  for a, b in zip(jax.tree.leaves(ring_params), jax.tree.leaves(pmean_params))
)
acc_gap = float(np.max(np.abs(ring_curve[:, 1] - pmean_curve[:, 1])))
print(f"largest parameter difference after {SYNC_STEPS} steps: {param_gap:.1e}")
print(f"largest test-accuracy difference along the way: {acc_gap:.3f}")

fig, ax = plt.subplots(figsize=(6.5, 3.5))
ax.plot(*ring_curve.T, "o-", label="all_reduce_gradients(algorithm='ring')")
ax.plot(*pmean_curve.T, "x--", color="black", label="lax.pmean")
ax.set_xlabel(f"synchronous steps (batch {DEVICES} × {BATCH})")
ax.set_ylabel("test accuracy")
ax.set_ylim(0, 1)
ax.set_title("the same training run, whichever all-reduce")
ax.grid(True, alpha=0.3)
ax.legend(loc="lower right")
fig.tight_layout()
plt.show()

# %% [markdown]
# The two curves lie on top of each other: the ring adds the same numbers as XLA's
# all-reduce in another order, which changes the last bits of a float, not the training.
#
# ## 2 · Where staleness comes from
#
# A parameter server's event loop in a few lines: each worker reads the current version
# of the parameters, computes for a random time, and pushes; the server applies each
# gradient as it arrives and counts how many updates landed since that worker read. With
# N workers, while one computes the other N − 1 each push one gradient on average, so the
# mean staleness is N − 1 whatever the compute-time distribution; its tail is not.

# %%
import heapq


def ps_staleness(n_workers, n_updates, draw):
  version, taus = 0, []
  busy = [(draw(), w, 0) for w in range(n_workers)]  # (finish time, worker, version read)
  heapq.heapify(busy)
  while len(taus) < n_updates:
    t, w, read = heapq.heappop(busy)
    taus.append(version - read)  # updates applied since this worker read
    version += 1
    heapq.heappush(busy, (t + draw(), w, version))
  return np.array(taus)


rng = np.random.default_rng(0)
fig, ax = plt.subplots(figsize=(6.5, 3.5))
means = {}
for n in (4, DEVICES, 2 * DEVICES):
  tau = ps_staleness(n, 20_000, lambda: rng.exponential())
  means[n] = tau.mean()
  ax.plot(np.bincount(tau) / len(tau), label=f"N = {n}: mean τ = {tau.mean():.2f}")
ax.set_xlabel("staleness τ (updates applied since the gradient's parameters were read)")
ax.set_ylabel("fraction of updates")
ax.set_xlim(0, 6 * DEVICES)
ax.set_title("a parameter server, exponential compute times")
ax.grid(True, alpha=0.3)
ax.legend()
fig.tight_layout()
plt.show()
lib = event_schedule("exponential", DEVICES, 20_000, seed=0).staleness.mean()
print(f"the library's event_schedule at N = {DEVICES}: mean τ = {lib:.2f} (N − 1 = {DEVICES - 1})")

# %% [markdown]
# ## 3 · What staleness costs, and two mitigations
#
# To isolate staleness, every update below uses a gradient exactly τ updates old:
# w_{t+1} = w_t − η·g(w_{t−τ}), with momentum SGD (0.9) and 16 examples per update.
# A `deque` of the last τ + 1 parameter versions is all it takes. τ = 0 is plain
# sequential SGD, what synchronous training computes. Each mitigation is one line:
#
# * **η/τ** (staleness-aware learning rate, Zhang et al. 2016): divide the gradient by τ.
# * **DC-ASGD** (Zheng et al. 2017): correct the gradient towards the current parameters,
#   g + λ·g⊙g⊙(w_now − w_read), with λ = 0.04.
#
# Every arm sees the same initial weights and the same batches in the same order.

# %%
DC_LAMBDA = 0.04
tx = optax.sgd(LR, momentum=0.9)


def make_stale_step(graphdef):
  @jax.jit
  def step(params, opt_state, read, idx, scale, lam):
    g = jax.grad(loss_fn, argnums=1)(graphdef, read, x_train[idx], y_train[idx])
    # scale = 1/τ for η/τ; lam = λ for DC-ASGD: g + λ·g⊙g⊙(w_now − w_read)
    g = jax.tree.map(lambda g, w, r: scale * (g + lam * g * g * (w - r)), g, params, read)
    updates, opt_state = tx.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  return step


def train_stale(tau, method, seed):
  graphdef, params = init(seed)
  step, opt_state = make_stale_step(graphdef), tx.init(params)
  scale = 1.0 / tau if method == "η/τ" and tau > 0 else 1.0
  lam = DC_LAMBDA if method == "DC-ASGD" else 0.0
  history = deque([params] * (tau + 1), maxlen=tau + 1)  # history[0]: τ updates old
  batches = np.random.default_rng(seed).integers(0, len(x_train), (UPDATES, BATCH))
  curve = [(0, test_accuracy(graphdef, params))]
  for t in range(UPDATES):
    params, opt_state = step(params, opt_state, history[0], batches[t], scale, lam)
    history.append(params)
    if (t + 1) % EVAL_EVERY == 0:
      curve.append((t + 1, test_accuracy(graphdef, params)))
  return np.array(curve)


METHODS = ["plain async", "η/τ", "DC-ASGD"]
runs = {(0, "sync", s): train_stale(0, "plain async", s) for s in SEEDS}
runs |= {(t, m, s): train_stale(t, m, s) for t in TAUS if t > 0 for m in METHODS for s in SEEDS}


def final(tau, method):
  """Mean over seeds of the final test accuracy."""
  return float(np.mean([c[-1, 1] for (t, m, s), c in runs.items() if (t, m) == (tau, method)]))


taus_pos = [t for t in TAUS if t > 0]
sweep = pd.DataFrame({m: [final(t, m) for t in taus_pos] for m in METHODS}, index=taus_pos)
sweep.index.name = "τ"
print(f"final test accuracy after {UPDATES} updates, mean of {len(SEEDS)} seed(s);", end=" ")
print(f"τ = 0 (sequential SGD): {final(0, 'sync'):.3f}")
sweep.round(3)

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
for m, marker in zip(METHODS, "osx"):
  axes[0].plot(taus_pos, sweep[m], marker=marker, label=m)
axes[0].axhline(final(0, "sync"), color="k", ls="--", label="τ = 0 (sync)")
axes[0].set_xscale("log", base=2)
axes[0].set_xlabel("staleness τ (updates)")
axes[0].set_ylabel(f"test accuracy after {UPDATES} updates")
axes[0].set_title(f"final accuracy vs staleness ({len(SEEDS)} seed(s))", fontsize=10)
tau_max = max(TAUS)
for key, style in zip([(0, "sync"), *[(tau_max, m) for m in METHODS]], ["k--", "o-", "s-", "x:"]):
  c = np.mean([c for (t, m, s), c in runs.items() if (t, m) == key], axis=0)
  axes[1].plot(*c.T, style, ms=4, label="τ = 0 (sync)" if key[1] == "sync" else key[1])
axes[1].set_xlabel("updates applied")
axes[1].set_ylabel("test accuracy")
axes[1].set_ylim(0, 1)
axes[1].set_title(f"learning curves at τ = {tau_max}", fontsize=10)
for ax in axes:
  ax.grid(True, alpha=0.3)
fig.legend(*axes[1].get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=9)
fig.tight_layout(rect=(0, 0.08, 1, 1))
plt.show()

# %% [markdown]
# With momentum 0.9 the optimizer already averages over about ten past gradients, so a
# small τ changes little (asynchrony acts like extra momentum, Mitliagkas et al. 2016),
# while a large τ makes the effective step overshoot. η/τ trades that instability for
# smaller steps; DC-ASGD keeps the step size and corrects the direction. The table above
# says which of them helped in this run.
#
# ## 4 · Communication, charged on both sides, and the methods between the ends
#
# In wall-clock terms asynchrony never waits for a straggler (notebook 8), but its
# messages are not free: a parameter server receives every gradient and sends back the
# parameters through its one link. Between the two ends the field uses:
#
# * **Local SGD(H)** (Stich 2019): H local steps per worker, then one all-reduce (mean) of
#   the *parameters*.
# * **DiLoCo(H)** (Douillard et al. 2023): inner AdamW for H steps, then an outer Nesterov
#   step on the averaged pseudo-gradient Δ = θ − mean(θ_i). Same bytes as Local SGD(H).
# * **Gossip D-PSGD** (Lian et al. 2017): no all-reduce; every step each worker averages
#   its parameters with one ring neighbour — one `ppermute` of the parameters.
#
# Each is a record of `allreduce_jax.training.ARMS` with its schedule, its training and
# its price. What each sends per training sample, for this MLP and for a 100 M-parameter
# model, on the default link:

# %%
arm_names = ["sync", "async", f"local_sgd_h{H}", f"diloco_h{H}", "gossip"]
mlp_params = sum(a.size for a in jax.tree.leaves(init(0)[1]))
price = pd.DataFrame(
  {
    f"{label}: {what}": [
      fn(get_arm(a), Setup(workers=BETWEEN_WORKERS, model_params=size)) for a in arm_names
    ]
    for size, label in [(mlp_params, "MLP"), (100_000_000, "100 M")]
    for what, fn in [
      ("bytes / sample", lambda arm, s: arm.bytes_per_sample(s)),
      ("one exchange (ms)", lambda arm, s: 1e3 * arm.comm_seconds(s)),
    ]
  },
  index=arm_names,
)
print(f"{BETWEEN_WORKERS} workers, {mlp_params:,} MLP parameters, link {Setup().network}")
price.map(lambda v: f"{v:,.0f}" if v >= 100 else f"{v:.3g}")

# %% [markdown]
# Now train them all on one simulated clock: log-normal compute times with one worker 4×
# slower, communication priced at the MLP's size; every arm computes the same number of
# per-worker gradients from the same weights.

# %%
wl = get_workload("digits_mlp", smoke=SMALL)
between = Setup(
  workers=BETWEEN_WORKERS,
  speeds=(1.0,) * (BETWEEN_WORKERS - 1) + (0.25,),
  gradients=BETWEEN_GRADIENTS,
)
rows = pd.DataFrame([run_arm(get_arm(a), between, wl, s) for a in arm_names for s in SEEDS])
summary = rows.groupby("arm", sort=False).agg(
  final_accuracy=("final_metric", "median"),
  reached=("time_to_target", lambda t: f"{t.notna().sum()}/{len(t)}"),
  time_to_target_s=("time_to_target", "median"),
  bytes_per_sample=("bytes_per_sample", "median"),
)
print(f"target {wl.target}; median over {len(SEEDS)} seed(s)")
summary.round(4)

# %%
fig, ax = plt.subplots(figsize=(7, 3.8))
for (a, r), ls in zip(rows[rows["seed"] == SEEDS[0]].set_index("arm").iterrows(), ["-", "--"] * 5):
  ax.plot(r["eval_time"], r["test_metric"], ls, marker=".", label=a)
ax.axhline(wl.target, color="k", lw=0.8, ls=":")
ax.set_xlabel("simulated seconds (compute + communication)")
ax.set_ylabel("test accuracy")
ax.set_ylim(0.5, 1.0)
ax.set_title(f"{BETWEEN_WORKERS} workers, one 4× slower (seed {SEEDS[0]})")
ax.grid(True, alpha=0.3)
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# Local SGD and DiLoCo average once every H steps, so they send H times fewer bytes than
# sync for the same gradients; on a model this small the bytes saved buy little time (one
# all-reduce costs microseconds here) and the slow worker still delays every round.
# Gossip sends n bytes per participant per step against the ring all-reduce's 2(p−1)/p·n,
# in one message instead of 2(p−1), and its workers only approximately agree (their
# average is what is evaluated).
# The same arms on a byte-level transformer language model, which separates them more,
# are in the training study (`experiments/sync_vs_async/`): that run takes far longer
# than a notebook should.
#
# ## What this run showed


# %%
best_tau_max = max(METHODS, key=lambda m: final(tau_max, m))
acc = summary["final_accuracy"]
CONCLUSION = {
  "devices": DEVICES,
  "param_gap": param_gap,
  "sync_steps": SYNC_STEPS,
  "acc_gap": acc_gap,
  "sync_accuracy": ring_curve[-1, 1],
  "mean_staleness": means[DEVICES],
  "n_minus_1": DEVICES - 1,
  "updates": UPDATES,
  "seeds": len(SEEDS),
  "sequential": final(0, "sync"),
  "taus": taus_pos,
  "plain": [final(t, "plain async") for t in taus_pos],
  "eta_tau": final(tau_max, "η/τ"),
  "dcasgd": final(tau_max, "DC-ASGD"),
  "best_at_tau_max": best_tau_max,
  "workers": BETWEEN_WORKERS,
  "gradients": BETWEEN_GRADIENTS,
  "H": H,
  "bytes_ratio": summary.loc["sync", "bytes_per_sample"]
  / summary.loc[f"diloco_h{H}", "bytes_per_sample"],
  "diloco": acc[f"diloco_h{H}"],
  "sync": acc["sync"],
  "gossip": acc["gossip"],
  "server": acc["async"],
}
c = CONCLUSION
print(
  f"Synchronous training on {c['devices']} devices with the hand-written ring followed "
  f"lax.pmean's run: the largest parameter difference was {c['param_gap']:.1e} after "
  f"{c['sync_steps']} steps, the test accuracies differed by at most {c['acc_gap']:.3f}, "
  f"and the run ended at {c['sync_accuracy']:.1%}."
)
print(
  f"A simulated parameter server with {c['devices']} workers had mean staleness "
  f"{c['mean_staleness']:.2f}, as the theory says: one fewer than the workers, {c['n_minus_1']}."
)
print(
  f"With every gradient τ updates old ({c['updates']} updates, {c['seeds']} seed(s)), "
  f"sequential SGD (no staleness) reached {c['sequential']:.1%}; plain async "
  + ", ".join(f"{a:.1%} at τ = {t}" for t, a in zip(c["taus"], c["plain"]))
  + f". At the largest τ η/τ reached {c['eta_tau']:.1%} and DC-ASGD {c['dcasgd']:.1%}; "
  f"the best there was {c['best_at_tau_max']}."
)
print(
  f"Between the ends ({c['workers']} workers, {c['gradients']} gradients each), "
  f"DiLoCo(H = {c['H']}) sent {c['bytes_ratio']:.0f}× fewer bytes per sample than sync "
  f"and ended at {c['diloco']:.1%} against sync's {c['sync']:.1%}; gossip ended at "
  f"{c['gossip']:.1%}, the parameter server at {c['server']:.1%}."
)
if SMALL:
  print(
    "Small mode trains too few rounds of Local SGD and DiLoCo to rank the arms between "
    "the ends; the full mode's run is the one to read for that."
  )
