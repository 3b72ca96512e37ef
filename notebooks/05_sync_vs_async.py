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
# # 5 · Synchronous vs asynchronous SGD
#
# **Synchronous** data parallelism: N workers each compute a gradient on their slice of
# the batch, an all-reduce averages them, and every worker applies the same update —
# mathematically one large-batch SGD step, however the all-reduce is implemented.
#
# **Asynchronous** SGD (Downpour, Dean et al. 2012): no all-reduce and no waiting; each
# worker pushes its gradient to a parameter server as soon as it is ready and the server
# applies it at once. The catch: that gradient was computed on parameters that are τ
# updates old (its *staleness*).
#
# Here we train a Flax MLP on the 8×8 digits, synchronously on 8 emulated devices with
# the hand-written ring and with `lax.psum`, then replay asynchronous SGD at fixed
# staleness τ and try the two classic mitigations.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"  # CI runs the small mode
DEVICES = 8
SYNC_ALGORITHMS = ["ring", "psum"] if SMALL else ["ring", "psum", "halving_doubling"]
SYNC_STEPS = 40 if SMALL else 300
SYNC_EVAL_EVERY = 10 if SMALL else 25
STALENESS_UPDATES = 200 if SMALL else 1500
TAUS = (0, 2, 8) if SMALL else (0, 1, 2, 4, 8, 16)
SEEDS = (0,) if SMALL else (0, 1, 2)
STALENESS_EVAL_EVERY = 25 if SMALL else 50
TARGET = 0.9 if SMALL else 0.95  # test accuracy that counts as "trained"

# %%
import jax

jax.config.update("jax_num_cpu_devices", DEVICES)  # before the first JAX computation


import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

from allreduce_jax.tools import report
from allreduce_jax.training import async_sim, experiments, tables

OUT = report.results_dir("notebooks", "05")  # the repository's results/, wherever this runs
print(jax.__version__, jax.default_backend(), len(jax.devices()), "devices")

# %% [markdown]
# ## The optax route
#
# The same hand-written all-reduce in the step a Flax user writes: parameters
# replicated (`in_specs=P()`), the batch sharded over `"data"`, and
# `all_reduce_gradients` chained before Adam where `lax.pmean` would sit. Each device
# differentiates its own copy (`lax.pcast(..., to="varying")`): under typed
# `shard_map`, `jax.grad` with respect to replicated parameters would already *sum* the
# gradients with XLA's all-reduce, which `all_reduce_gradients` refuses with an error
# (see `docs/gradients.md`). We train a few steps with the ring and with `lax.pmean` and
# compare the parameters.

# %%
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from sklearn.datasets import load_digits

from allreduce_jax import all_reduce_gradients


def optax_route(first, steps=10):
  mesh = jax.make_mesh((DEVICES,), ("data",))
  rngs = nnx.Rngs(0)
  model = nnx.Sequential(nnx.Linear(64, 32, rngs=rngs), nnx.relu, nnx.Linear(32, 10, rngs=rngs))
  graphdef, params = nnx.split(model)
  tx = optax.chain(first, optax.adam(1e-2))
  opt_state = tx.init(params)

  def loss_fn(params, x, y):
    logits = nnx.merge(graphdef, params)(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @jax.jit
  @jax.shard_map(mesh=mesh, in_specs=(P(), P(), P("data"), P("data")), out_specs=(P(), P()))
  def step(params, opt_state, x, y):
    grads = jax.grad(loss_fn)(jax.lax.pcast(params, "data", to="varying"), x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  x, y = load_digits(return_X_y=True)
  n = len(x) // DEVICES * DEVICES
  x = jax.device_put(jnp.asarray(x[:n] / 16, jnp.float32), NamedSharding(mesh, P("data")))
  y = jax.device_put(jnp.asarray(y[:n]), NamedSharding(mesh, P("data")))
  for _ in range(steps):
    params, opt_state = step(params, opt_state, x, y)
  return params, float(loss_fn(params, x, y))


pmean = optax.GradientTransformation(
  lambda params: optax.EmptyState(),
  lambda updates, state, params=None: (jax.lax.pmean(updates, "data"), state),
)
ring_params, ring_loss = optax_route(all_reduce_gradients("data", algorithm="ring"))
pmean_params, pmean_loss = optax_route(pmean)
gap = max(
  float(jnp.max(jnp.abs(a - b)))
  for a, b in zip(jax.tree.leaves(ring_params), jax.tree.leaves(pmean_params))
)
print(f"loss after 10 Adam steps: ring {ring_loss:.4f}, lax.pmean {pmean_loss:.4f}")
print(f"largest parameter difference: {gap:.1e}")

# %% [markdown]
# ## Synchronous data parallelism on the hand-written all-reduce
#
# `experiments.run_sync` gives each of the 8 participants its own copy of the
# parameters and optimizer state and its own shard of each batch (16 examples each);
# per step it averages the gradients with `all_reduce_tree(..., algorithm=...)` and
# applies the same optax update everywhere. Nothing but the all-reduce keeps the copies
# equal, so `replicas_identical` checks the algorithm on every step of a real training
# run. The seeds fix the initial weights and the batch order, so the runs differ only
# in the all-reduce.

# %%
sync_rows = {}
for alg in SYNC_ALGORITHMS:
  cfg = experiments.SyncConfig(
    workers=DEVICES,
    steps=SYNC_STEPS,
    eval_every=SYNC_EVAL_EVERY,
    algorithm=alg,
    target=TARGET,
  )
  sync_rows[alg] = experiments.run_sync(cfg, seed=0)
  r = sync_rows[alg]
  print(
    f"{alg:>18}: test acc {r['final_test_acc']:.4f}, final loss {r['final_loss']:.6f},"
    f" replicas identical: {r['replicas_identical']}, {r['wall_s']:.1f} s"
  )
assert all(r["replicas_identical"] for r in sync_rows.values())

# %%
fig, ax = plt.subplots(figsize=(6, 3.8))
styles = ["o-", "x--", "s:"]
for (alg, r), style in zip(sync_rows.items(), styles):
  ax.plot(r["eval_steps"], r["test_acc"], style, ms=5, label=f"sync, {alg}")
ax.set_xlabel(f"synchronous steps (batch {DEVICES}×16)")
ax.set_ylabel("test accuracy")
ax.set_ylim(0, 1)
ax.set_title("the same training run, whatever the all-reduce")
ax.grid(True, alpha=0.3)
ax.legend()
plt.show()
ref = sync_rows["psum"]
acc_gap = max(
  abs(a - b) for r in sync_rows.values() for a, b in zip(r["test_acc"], ref["test_acc"])
)
loss_gap = max(abs(r["final_loss"] - ref["final_loss"]) for r in sync_rows.values())
print(
  f"largest test-accuracy difference to psum: {acc_gap:.2g}; final-loss difference: {loss_gap:.2g}"
)

# %% [markdown]
# The curves lie on top of each other: summing in a different order changes the last
# bits of a float, not the trajectory.
#
# ## Where staleness comes from
#
# With N asynchronous workers, while one worker computes its gradient the other N−1
# each push one on average, so the mean staleness is N−1 whatever the distribution of
# compute times; how long the tail is depends on it. `async_sim.event_schedule` plays
# the parameter server's event loop in NumPy:

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
for n in (4, DEVICES, 2 * DEVICES):
  s = async_sim.event_schedule("exponential", n, 20_000, seed=0)
  h = np.bincount(s.staleness) / len(s.staleness)
  ax.plot(np.arange(h.size), h, label=f"N={n}: mean τ = {s.staleness.mean():.2f}")
ax.set_xlabel("staleness τ (updates applied since the gradient's parameters were read)")
ax.set_ylabel("fraction of updates")
ax.set_xlim(0, 6 * DEVICES)
ax.set_title("async SGD, exponential compute times")
ax.legend()
plt.show()

# %% [markdown]
# ## The staleness sweep
#
# To isolate the effect of staleness, every update below uses a gradient exactly τ
# updates old: w_{t+1} = w_t − η·g(w_{t−τ}). The replay keeps the last τ+1 parameter
# snapshots in a ring buffer and runs as one jitted `lax.scan`
# (`async_sim.make_replay`); every arm sees the same initial weights and the same
# batches (16 examples per update) in the same order. τ = 0 is plain sequential SGD —
# what synchronous training computes.
#
# Mitigations, each a one-line change to the gradient before the optimizer:
#
# * **η/τ** (staleness-aware learning rate, Zhang et al. 2016): divide the gradient by τ.
# * **DC-ASGD** (Zheng et al. 2017): first-order correction towards the current
#   parameters, g + λ·g⊙g⊙(w_now − w_read), λ = 0.04.
#
# Runs are appended to `staleness.jsonl` as they finish and skipped when the notebook
# runs again with the same settings.

# %%
scfg = experiments.StalenessConfig(
  updates=STALENESS_UPDATES,
  taus=TAUS,
  seeds=SEEDS,
  eval_every=STALENESS_EVAL_EVERY,
  target=TARGET,
)
stale_rows = experiments.run_staleness_sweep(scfg, OUT / "staleness", log=lambda line: None)
display(Markdown(tables.staleness_table(stale_rows)))

# %%
methods = ["async", "async_eta_tau", "dcasgd"]
base = [r for r in stale_rows if r["method"] == "sync"]
taus_pos = [t for t in TAUS if t > 0]
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
for m in methods:
  acc = [
    [r["final_test_acc"] for r in stale_rows if r["method"] == m and r["tau"] == t]
    for t in taus_pos
  ]
  axes[0].errorbar(
    taus_pos, [np.mean(a) for a in acc], [np.std(a) for a in acc], fmt="o-", capsize=3, label=m
  )
axes[0].axhline(
  np.mean([r["final_test_acc"] for r in base]), color="k", ls="--", label="τ = 0 (sync)"
)
axes[0].set_xscale("log", base=2)
axes[0].set_xlabel("staleness τ (updates)")
axes[0].set_ylabel(f"test accuracy after {STALENESS_UPDATES} updates")
axes[0].set_title(f"final accuracy vs staleness (mean ± std of {len(SEEDS)} seed(s))", fontsize=10)
axes[0].legend(fontsize=8)
tau_max = max(TAUS)
for m, style in zip(["sync", *methods], ["k--", "o-", "s-", "x:"]):
  rs = [r for r in stale_rows if r["method"] == m and r["tau"] == (0 if m == "sync" else tau_max)]
  x = rs[0]["eval_updates"]
  y = np.mean([r["test_acc"] for r in rs], axis=0)
  axes[1].plot(x, y, style, ms=4, label="τ = 0 (sync)" if m == "sync" else m)
axes[1].set_xlabel("updates applied")
axes[1].set_ylabel("test accuracy")
axes[1].set_ylim(0, 1)
axes[1].set_title(f"learning curves at τ = {tau_max}", fontsize=10)
axes[1].legend(fontsize=8)
for ax in axes:
  ax.grid(True, alpha=0.3)
fig.tight_layout()
plt.show()

# %% [markdown]
# Staleness slows learning per update, and more with larger τ; with momentum 0.9 the
# optimizer already averages over ~10 past gradients, so a small τ costs little
# (asynchrony acts like extra momentum, Mitliagkas et al. 2016) while a large one makes
# the effective step overshoot. η/τ trades that instability for smaller steps; DC-ASGD
# keeps the step size and corrects the direction.
#
# In wall-clock terms async has the advantage of never waiting — notebook 6 puts both
# on the same simulated clock with real-looking compute-time distributions.

# %% [markdown]
# ## What this run showed


# %%
def mean_acc(method, tau):
  return float(
    np.mean([r["final_test_acc"] for r in stale_rows if r["method"] == method and r["tau"] == tau])
  )


sync0 = mean_acc("sync", 0)
best_m = max(methods, key=lambda m: mean_acc(m, tau_max))
identical = all(r["replicas_identical"] for r in sync_rows.values())
plain = ", ".join(f"{mean_acc('async', t):.1%} at τ={t}" for t in taus_pos)
print(
  f"Synchronous training on {DEVICES} emulated devices with the hand-written "
  f"{', '.join(a for a in SYNC_ALGORITHMS if a != 'psum')} all-reduce followed psum's trajectory "
  f"(largest test-accuracy difference {acc_gap:.2g}, final-loss difference {loss_gap:.2g}, "
  f"replicas identical: {identical}) and reached {ref['final_test_acc']:.1%} test accuracy in "
  f"{SYNC_STEPS} steps. In the staleness sweep ({STALENESS_UPDATES} updates, {len(SEEDS)} "
  f"seed(s)), τ = 0 reached {sync0:.1%}; plain async reached "
  f"{plain}. At τ = {tau_max} "
  f"η/τ reached {mean_acc('async_eta_tau', tau_max):.1%} and DC-ASGD "
  f"{mean_acc('dcasgd', tau_max):.1%}; the best method there was {best_m}."
)
