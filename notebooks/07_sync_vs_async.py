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
# staleness τ and try the two classic mitigations. Then we charge communication on both
# sides and add the methods the field uses *between* the two ends — Local SGD, DiLoCo
# and gossip (D-PSGD) — on the digits and on a small byte-level transformer language
# model trained on Python's own documentation.

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
# Between the ends (Local SGD, DiLoCo, gossip) on one time model, digits and the LM
BETWEEN_WORKERS = 4 if SMALL else 8
BETWEEN_GRADIENTS = 160 if SMALL else 2400  # per-worker gradients per run, every arm
H_SHORT, H_LONG = (4, 10) if SMALL else (8, 50)  # local steps per round
DIGITS_ARMS = ["sync", "async", f"local_sgd_h{H_SHORT}", f"diloco_h{H_LONG}", "gossip"]
DIGITS_ARMS += [] if SMALL else [f"local_sgd_h{H_LONG}", "diloco_h100", "gossip_ring", "ssp4"]
LM_ARMS = ["sync", f"diloco_h{H_LONG}", "gossip", "async"]
LM_BATCH = 8  # windows of 64 bytes per worker-gradient (16 for digits)

# %%
import jax

jax.config.update("jax_num_cpu_devices", DEVICES)  # before the first JAX computation


import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

from allreduce_jax.tools import report
from allreduce_jax.training import async_sim, experiments, figures, tables

OUT = report.results_dir("notebooks", "07")  # the repository's results/, wherever this runs
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
# In wall-clock terms async has the advantage of never waiting — notebook 8 puts both
# on the same simulated clock with real-looking compute-time distributions.

# %% [markdown]
# ## Communication, charged on both sides
#
# Every arm below runs on one clock (`allreduce_jax.training.arms`): simulated compute
# (log-normal σ = 0.5 compute times, one worker 4× slower) **plus** communication priced
# by the project's cost model on 100 GbE — sync pays one all-reduce per step, the
# parameter server a push and a pull per gradient through its one link (a FIFO queue),
# and the arms between the ends pay what they send:
#
# * **Local SGD(H)** (Stich 2019): H local steps per worker, then one all-reduce (mean)
#   of the *parameters* — the hand-written ring inside `shard_map`, once every H steps.
# * **DiLoCo(H)** (Douillard et al. 2023): inner AdamW for H steps, then an outer
#   Nesterov SGD step (lr 0.7, momentum 0.9) on the averaged pseudo-gradient
#   Δ = θ − mean(θ_i). Same bytes as Local SGD(H).
# * **Gossip D-PSGD** (Lian et al. 2017): no all-reduce at all; every step each worker
#   averages its parameters with one ring neighbour (alternating pairings) — one
#   `ppermute` of the parameters per step, executed on the emulated devices.
#
# What each sends, per training sample, for this MLP and for a 100 M-parameter model:

# %%
import pandas as pd

from allreduce_jax.training import arms, configs, gossip, local, models

mlp_params = models.n_params(models.split(models.make_model("mlp", 0))[1])
names = ["sync", "async", f"local_sgd_h{H_SHORT}", f"diloco_h{H_LONG}", "gossip"]
price = pd.DataFrame(
  {
    f"{label}: {unit}": [
      fn(arms.get_arm(a))(arms.Setup(workers=BETWEEN_WORKERS, model_params=size)) for a in names
    ]
    for size, label in [(mlp_params, "MLP"), (100_000_000, "100 M")]
    for unit, fn in [
      ("bytes / sample", lambda arm: arm.bytes_per_sample),
      ("one exchange (ms)", lambda arm: lambda s: 1e3 * arm.comm_seconds(s)),
    ]
  },
  index=names,
)
display(price.style.format("{:,.3g}"))

# %% [markdown]
# The gossip claim, checked in the compiled program: one step of gossip sends the
# parameters once (n bytes per participant, one `collective-permute`), against
# 2(p−1)/p · n for the ring all-reduce of synchronous SGD — in 2(p−1) messages.

# %%
g_mlp, w_mlp, r_mlp = models.split(models.make_model("mlp", 0))
audit = gossip.audit_step_bytes(g_mlp, w_mlp, r_mlp, BETWEEN_WORKERS)
print(
  f"p = {BETWEEN_WORKERS}, n = {audit['param_bytes']:,} bytes: gossip sends "
  f"{audit['sent_bytes_per_step']:,.0f} bytes per step per participant in "
  f"{audit['permutes_per_step']:.0f} collective-permute; the ring all-reduce sends "
  f"{audit['ring_allreduce_bytes']:,} (= 2(p−1)/p · n)"
)

# %% [markdown]
# ## Between the ends, on the digits
#
# Every arm computes the same number of per-worker gradients, starts from the same
# weights and sees the same batches; the table counts time to the target in simulated
# seconds *including* communication and the bytes sent per sample. Runs resume from
# `table_c.jsonl`.

# %%
tc_setup = dict(
  workers=BETWEEN_WORKERS,
  speeds=(1.0,) * (BETWEEN_WORKERS - 1) + (0.25,),
  gradients=BETWEEN_GRADIENTS,
  seeds=SEEDS,
)
digit_cfg = configs.TableCConfig(workloads=("digits_mlp",), arms=tuple(DIGITS_ARMS), **tc_setup)
digit_rows = experiments.run_table_c(digit_cfg, OUT / "between", smoke=SMALL, log=lambda line: None)
display(Markdown(tables.setup_line(digit_cfg) + "\n\n" + tables.table_c(digit_rows)))
local.bytes_figure(digit_rows)
plt.show()

# %% [markdown]
# DiLoCo averages once every H steps, so it sends H× fewer bytes than sync for the same
# number of gradients. In the full run (8 workers, 2400 gradients each, 3 seeds;
# `docs/results/training/between/digits`) DiLoCo(50) ended within 0.3 points of sync's
# accuracy with 50× fewer bytes, and its outer Nesterov step recovered what plain Local
# SGD(50) lost (over a point); the small CI mode runs too few rounds to show it. On a
# model this small the bytes saved buy no time: the all-reduce costs microseconds, the
# global model only exists at round ends, and the slow worker delays every round. Gossip sends about half of the ring all-reduce's bytes, in one message
# instead of 2(p−1), and only approximately agrees (the workers' average is evaluated).
#
# ## The same arms on a language model
#
# `lm` is a 2-layer byte-level transformer (d_model 64, 4 heads, context 64, Flax NNX,
# Adam) trained on the help topics that ship with Python (`pydoc_data.topics`, no
# download), with a fixed train/validation split; the metric is validation loss in nats
# per byte (lower is better). Small mode trains a 1-layer, d_model-32 smoke version.

# %%
lm_cfg = configs.TableCConfig(
  workloads=("lm",), arms=tuple(LM_ARMS), batch_per_worker=LM_BATCH, **tc_setup
)
lm_rows = experiments.run_table_c(lm_cfg, OUT / "between_lm", smoke=SMALL, log=lambda line: None)
display(Markdown(tables.setup_line(lm_cfg) + "\n\n" + tables.table_c(lm_rows)))
figures.table_c_figure(lm_rows)
plt.show()

# %% [markdown]
# The LM is where the ends and the middle separate. In the full run
# (`docs/results/training/between/lm`, 3 seeds) sync reached the 2.2 nats/byte target
# in ~190 of 300 steps and ended near 1.79; DiLoCo ended near 2.37 at H = 50 *and* at
# H = 10, so on this short budget its gap is mostly not the averaging interval: Local
# SGD with H = 1 (Adam on each worker's small batch, parameters averaged every step)
# already ends ~0.37 above sync. Per-worker Adam normalises each worker's own noisy
# gradient before averaging; sync takes one Adam step on the averaged gradient. The
# parameter server (Adam on stale single-worker gradients) is the furthest from sync.

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


def median(rows, arm, field):
  return float(np.median([r[field] for r in rows if r["arm"] == arm]))


sync_acc, dil_acc = (
  median(digit_rows, "sync", "final_metric"),
  median(digit_rows, f"diloco_h{H_LONG}", "final_metric"),
)
ratio = median(digit_rows, "sync", "bytes_per_sample") / median(
  digit_rows, f"diloco_h{H_LONG}", "bytes_per_sample"
)
lm_line = ", ".join(f"{a} {median(lm_rows, a, 'final_metric'):.2f}" for a in LM_ARMS)
print(
  f"Between the ends ({BETWEEN_WORKERS} workers, {BETWEEN_GRADIENTS} gradients each, median of "
  f"{len(SEEDS)} seed(s)): on the digits DiLoCo(H={H_LONG}) reached {dil_acc:.1%} against "
  f"sync's {sync_acc:.1%} ({100 * (dil_acc - sync_acc):+.2f} points) sending {ratio:.0f}× fewer "
  f"bytes; gossip sent {audit['sent_bytes_per_step'] / audit['ring_allreduce_bytes']:.2f}× the "
  f"ring all-reduce's bytes per step. LM validation loss (nats/byte): {lm_line}."
)
