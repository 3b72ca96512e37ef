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
# stale-gradient SGD in a few lines and measures what staleness costs and what two
# classic mitigations buy, then runs **the two side by side on one simulated clock** —
# the synchronous step of the first section against a parameter server, the same
# workers' compute times, the same batches, the same initial weights — and finally
# prices communication on both sides and adds the methods between the two ends (Local
# SGD, DiLoCo, gossip). Cells ask you for numbers first, and one asks you to write the
# synchronous clock.
#
# **Run time.** Full mode 66 s on 2 CPU cores; small mode
# (`ALLREDUCE_JAX_SMALL=1` in the environment, or the kernel "allreduce-jax small" in
# JupyterLab) 30–120 s: fewer steps and updates, fewer staleness values, one seed,
# 4 workers between the ends. Small mode trains too briefly to separate the arms between
# the ends; the closing cell says which sentences it cannot support.

# %% tags=["parameters"]
import os

SMALL = os.environ.get("ALLREDUCE_JAX_SMALL", "0") == "1"  # CI runs the small mode
DEVICES = 8
BATCH = 16  # examples per worker per gradient
SYNC_STEPS = 60 if SMALL else 300
SYNC_EVAL_EVERY = 2  # steps between two test evaluations (the one clock times the target from them)
UPDATES = 200 if SMALL else 1500  # stale-gradient updates per run
TAUS = (0, 2, 8) if SMALL else (0, 1, 2, 4, 8, 16)
SEEDS = (0,) if SMALL else (0, 1, 2)
EVAL_EVERY = 25 if SMALL else 50
LR = 0.02  # per-gradient learning rate (batch 16); sync uses DEVICES × LR for its batch
COMPUTE = "exponential"  # the one clock's compute-time model (mean 1 per gradient)
TARGET = 0.9  # test accuracy the one-clock comparison times
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

from allreduce_jax import all_reduce_gradients, teach
from allreduce_jax.training import (
  ComputeTimes,
  Setup,
  event_schedule,
  get_arm,
  get_workload,
  harmonic,
  load_digits,
  make_model,
  ps_schedule,
  run_arm,
  sync_schedule,
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


def worker_batches(seed, iterations):
  """i32[DEVICES, iterations, BATCH]: the examples of worker w's k-th gradient, one
  stream per worker, so every arm that computes worker w's k-th gradient sees the same."""
  return np.stack(
    [
      np.random.default_rng([seed, w]).integers(0, len(x_train), (iterations, BATCH))
      for w in range(DEVICES)
    ]
  )


from allreduce_jax.results import source_commit

print("allreduce-jax at commit", source_commit() or "(not a git checkout)")


# %% [markdown]
# ## 1 · Synchronous: one large-batch step, on the hand-written ring
#
# The step a Flax user writes: parameters replicated (`in_specs=P()`), the batch sharded
# over `"data"` (16 examples per device: worker w's batch on device w), and
# `all_reduce_gradients` chained before the optimizer where `lax.pmean` would sit. Each
# device differentiates its own copy (`lax.pcast(..., to="varying")`): under typed
# `shard_map`, `jax.grad` with respect to replicated parameters would already *sum* the
# gradients with XLA's all-reduce, which `all_reduce_gradients` refuses with an error
# (see `docs/gradients.md`). The same run (same initial weights, same batches) trains once
# with the ring and once with `lax.pmean`.

# %%
mesh = jax.make_mesh((DEVICES,), ("data",))
pmean = optax.GradientTransformation(
  lambda params: optax.EmptyState(),
  lambda updates, state, params=None: (jax.lax.pmean(updates, "data"), state),
)


def train_sync(first, seed=0):
  """SYNC_STEPS synchronous steps; returns the final parameters and f64[evals, 2]:
  (step, test accuracy)."""
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

  batches = worker_batches(seed, SYNC_STEPS)  # [worker, step, example]
  shard = NamedSharding(mesh, P("data"))
  curve = [(0, test_accuracy(graphdef, params))]
  for s in range(SYNC_STEPS):
    idx = batches[:, s].reshape(-1)  # worker w's batch lands on device w
    xb, yb = jax.device_put(x_train[idx], shard), jax.device_put(y_train[idx], shard)
    params, opt_state = step(params, opt_state, xb, yb)
    if (s + 1) % SYNC_EVAL_EVERY == 0:
      curve.append((s + 1, test_accuracy(graphdef, params)))
  return params, np.array(curve)


ring = all_reduce_gradients("data", algorithm="ring")
ring_params, ring_curve = train_sync(ring)
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
# gradient as it arrives and counts how many updates landed since that worker read.
#
# ### Predict before you run
#
# With N = 8 workers and exponential compute times (mean 1), **what is the mean staleness
# of an applied gradient?**

# %% tags=["predict"]
guess = None  # mean staleness τ with 8 workers

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
means = {}
taus_of = {}
for n in (4, DEVICES, 2 * DEVICES):
  taus_of[n] = ps_staleness(n, 20_000, lambda: rng.exponential())
  means[n] = taus_of[n].mean()
teach.reveal(guess, means[DEVICES], what=f"mean staleness with {DEVICES} workers")

# %%
fig, ax = plt.subplots(figsize=(6.5, 3.5))
for n, tau in taus_of.items():
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
# While one worker computes, the other N − 1 each push one gradient on average, so the
# mean staleness is N − 1 whatever the compute-time distribution; its tail is not (here
# a few gradients are more than 4(N − 1) updates old).
#
# %% [markdown]
# ## 3 · What staleness costs, and two mitigations
#
# To isolate staleness, every update below uses a gradient exactly τ updates old:
# w_{t+1} = w_t − η·g(w_{t−τ}), with momentum SGD (0.9) and 16 examples per update.
# A `deque` of the last τ + 1 parameter versions is all it takes. τ = 0 is plain
# sequential SGD with batch 16 (not the synchronous run of section 1, whose updates use
# 8 × 16 examples: section 4 puts that one on the clock). Each mitigation is one line:
#
# * **η/τ** (staleness-aware learning rate, Zhang et al. 2016): divide the gradient by τ.
# * **DC-ASGD** (Zheng et al. 2017): correct the stale gradient towards the current
#   parameters with a first-order Taylor term, g(w_now) ≈ g + H·(w_now − w_read), the
#   Hessian H approximated by λ·g⊙g: **g + λ·g⊙g⊙(w_now − w_read)**.
#
# **λ on the gradient's scale.** λ·g⊙g stands for a curvature, so its size must follow
# the gradient's: MXNet's constant default λ = 0.04 was set for other models, and on this
# one at τ = 8 its correction is too small to matter (it is run below at τ = 8 to show
# it). The paper's adaptive variant, **DC-ASGD-a**, divides by the gradients' own
# running size, per element: λ_t = λ0 / √(MS_t + ε) with MS_t = m·MS_{t−1} + (1 − m)·g_t²
# (an exponential mean of g², as RMSprop keeps), so λ_t·g⊙g ≈ λ0·|g| whatever the scale
# of the loss. λ0 = 2 and m = 0.95 are an open implementation's defaults, ε = 10⁻⁷.
# (A constant λ = 16 also helped at τ = 8 here, and diverged at τ = 16: a constant must be
# retuned with the staleness, the adaptive one was not.)
#
# Every arm sees the same initial weights and the same batches in the same order.

# %%
DC_LAMBDA0, DC_DECAY = 2.0, 0.95  # DC-ASGD-a
tx = optax.sgd(LR, momentum=0.9)


def make_stale_step(graphdef):
  @jax.jit
  def step(params, opt_state, ms, read, idx, scale, lam0, lam):
    g = jax.grad(loss_fn, argnums=1)(graphdef, read, x_train[idx], y_train[idx])
    ms = jax.tree.map(lambda m, g: DC_DECAY * m + (1 - DC_DECAY) * g * g, ms, g)  # mean g²
    # scale = 1/τ for η/τ; DC-ASGD: g + λ·g⊙g⊙(w_now − w_read), λ = lam0/√(ms + ε) + lam
    g = jax.tree.map(
      lambda g, w, r, m: scale * (g + (lam0 / jnp.sqrt(m + 1e-7) + lam) * g * g * (w - r)),
      g,
      params,
      read,
      ms,
    )
    updates, opt_state = tx.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, ms

  return step


def train_stale(tau, method, seed):
  graphdef, params = init(seed)
  step, opt_state = make_stale_step(graphdef), tx.init(params)
  ms = jax.tree.map(jnp.zeros_like, params)
  scale = 1.0 / tau if method == "η/τ" and tau > 0 else 1.0
  lam0 = DC_LAMBDA0 if method == "DC-ASGD" else 0.0
  lam = 0.04 if method == "DC-ASGD λ=0.04" else 0.0  # MXNet's constant, for comparison
  history = deque([params] * (tau + 1), maxlen=tau + 1)  # history[0]: τ updates old
  batches = np.random.default_rng(seed).integers(0, len(x_train), (UPDATES, BATCH))
  curve = [(0, test_accuracy(graphdef, params))]
  for t in range(UPDATES):
    params, opt_state, ms = step(params, opt_state, ms, history[0], batches[t], scale, lam0, lam)
    history.append(params)
    if (t + 1) % EVAL_EVERY == 0:
      curve.append((t + 1, test_accuracy(graphdef, params)))
  return np.array(curve)


METHODS = ["plain async", "η/τ", "DC-ASGD"]
tau_max = max(TAUS)
runs = {(0, "sequential", s): train_stale(0, "plain async", s) for s in SEEDS}
runs |= {(t, m, s): train_stale(t, m, s) for t in TAUS if t > 0 for m in METHODS for s in SEEDS}
TAU_DC = 8  # where DC-ASGD is compared with MXNet's constant λ (a τ of both modes)
runs |= {(TAU_DC, "DC-ASGD λ=0.04", s): train_stale(TAU_DC, "DC-ASGD λ=0.04", s) for s in SEEDS}


def curve_of(tau, method):
  """Mean over seeds of the learning curve: f64[evals, 2] (updates, accuracy)."""
  return np.mean([c for (t, m, s), c in runs.items() if (t, m) == (tau, method)], axis=0)


def final(tau, method):
  return float(curve_of(tau, method)[-1, 1])


early = min(8 * EVAL_EVERY, UPDATES)  # where the correction acts: the first updates


def at(tau, method, updates=early):
  c = curve_of(tau, method)
  return float(c[c[:, 0] == updates, 1][0])


taus_pos = [t for t in TAUS if t > 0]
sweep = pd.DataFrame(
  {
    **{f"{m}: final": [final(t, m) for t in taus_pos] for m in METHODS},
    **{f"{m}: after {early}": [at(t, m) for t in taus_pos] for m in ("plain async", "DC-ASGD")},
  },
  index=pd.Index(taus_pos, name="τ"),
)
print(f"test accuracy after {UPDATES} updates ('final') and after {early}, mean of "
      f"{len(SEEDS)} seed(s); τ = 0 (sequential SGD, batch {BATCH}): {final(0, 'sequential'):.3f}")  # fmt: skip
print(f"at τ = {TAU_DC}, DC-ASGD with MXNet's λ = 0.04: {at(TAU_DC, 'DC-ASGD λ=0.04'):.3f} after "
      f"{early}, {final(TAU_DC, 'DC-ASGD λ=0.04'):.3f} final (plain async: {at(TAU_DC, 'plain async'):.3f}, "
      f"{final(TAU_DC, 'plain async'):.3f})")  # fmt: skip
sweep.round(3)

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
for m, marker in zip(METHODS, "osx"):
  axes[0].plot(taus_pos, sweep[f"{m}: final"], marker=marker, label=m)
axes[0].axhline(final(0, "sequential"), color="k", ls="--", label=f"τ = 0: sequential SGD, batch {BATCH}")  # fmt: skip
axes[0].set_xscale("log", base=2)
axes[0].set_xlabel("staleness τ (updates)")
axes[0].set_ylabel(f"test accuracy after {UPDATES} updates")
axes[0].set_title(f"final accuracy vs staleness ({len(SEEDS)} seed(s))", fontsize=10)
shown = [
  ((0, "sequential"), "k--", f"τ = 0: sequential SGD, batch {BATCH}"),
  ((tau_max, "plain async"), "o-", f"plain async, τ = {tau_max}"),
  ((tau_max, "η/τ"), "s-", f"η/τ, τ = {tau_max}"),
  ((tau_max, "DC-ASGD"), "x-", f"DC-ASGD-a (λ0 = {DC_LAMBDA0:g}), τ = {tau_max}"),
  *(
    [((tau_max, "DC-ASGD λ=0.04"), "+:", f"DC-ASGD λ = 0.04, τ = {tau_max}")]
    if tau_max == TAU_DC
    else []
  ),
]
for key, fmt, name in shown:
  axes[1].plot(*curve_of(*key).T, fmt, ms=4, label=name)
axes[1].axvline(early, color="0.6", lw=0.8)
axes[1].set_xlabel("updates applied")
axes[1].set_ylabel("test accuracy")
axes[1].set_ylim(0, 1)
axes[1].set_title(f"learning curves at τ = {tau_max}", fontsize=10)
for ax in axes:
  ax.grid(True, alpha=0.3)
fig.legend(*axes[1].get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8)
fig.tight_layout(rect=(0, 0.12, 1, 1))
plt.show()

# %% [markdown]
# With momentum 0.9 the optimizer already averages over about ten past gradients, so a
# small τ changes little (asynchrony acts like extra momentum, Mitliagkas et al. 2016),
# while a large τ slows the start and can make the effective step overshoot. η/τ trades
# that instability for smaller steps. DC-ASGD acts **early** (left of the grey line):
# there the gradients are large and the parameters move fast, so w_now − w_read is large
# and the correction is a real part of the step; later both shrink and, where plain
# async does not fall apart, the curves meet. At τ = 8 the constant λ = 0.04 moves plain
# async's curve far less than the adaptive λ does. The closing cell gives the numbers.
#
# %% [markdown]
# ## 4 · The mission's comparison, on one clock
#
# Now the two ends of this notebook against each other. Eight workers compute gradients;
# worker w's k-th gradient takes a compute time drawn once (exponential, mean 1: the
# time unit is one mean gradient computation) and uses the same 16 examples
# (`worker_batches`) in both arms:
#
# * **sync**: section 1's step with the hand-written ring. Step k starts when step k − 1
#   has ended and ends when the slowest of the eight k-th gradients is done: the clock
#   adds the largest of the eight times. One update per step, from 8 × 16 examples.
# * **async**: a parameter server (section 2's event loop, `ps_schedule` in the library)
#   on the same compute times. Each gradient is applied the moment it is done, computed
#   on the parameters its worker read when it started, τ updates ago (section 3's stale
#   step, with whatever τ the schedule gives). One update per gradient, from 16 examples.
#
# Both start from the same weights and compute the same number of gradients. The
# communication is not charged here: for this 9,610-parameter model one all-reduce or
# one push costs microseconds against milliseconds of compute (section 5 and notebook 8
# price it, with a 100 M-parameter model where it is not negligible).
#
# ### Try this: the synchronous clock
#
# Given the compute times `t` (an array f64[S, N]: row k holds every worker's k-th
# gradient time) and a fixed communication time per step, write when each synchronous
# step ends. The check compares with the library's `sync_schedule`.


# %% tags=["exercise"]
def sync_clock(t, comm=0.0):  # t: f64[S, N] -> f64[S], the time each step ends
  raise NotImplementedError("your turn: each step waits for its slowest worker")


# %% tags=["check"]
def clock_is_right():
  times = ComputeTimes(COMPUTE, DEVICES, seed=7)
  want = sync_schedule(COMPUTE, DEVICES, 50, seed=7, allreduce_time=0.1, times=times).time
  got = np.asarray(sync_clock(times.rows(50), 0.1))
  if got.shape != want.shape or not np.allclose(got, want):
    return False, f"step 50 ends at {got.reshape(-1)[-1]:.3f}, the library says {want[-1]:.3f}"
  return True


teach.check(
  clock_is_right,
  right="each step ends after its slowest gradient and the exchange: the running sum of the row maxima plus comm.",
  wrong="a step ends when its slowest worker is done, plus the communication, after the previous step",
)

# %% [markdown] tags=["solution"]
# <details><summary>Solution</summary>
#
# ```python
# def sync_clock(t, comm=0.0):  # t: f64[S, N] -> f64[S], the time each step ends
#   return np.cumsum(t.max(axis=1) + comm)
# ```
# </details>

# %% [markdown]
# ### Predict before you run
#
# With exponential compute times a synchronous step waits, on average, for the largest of
# 8 draws, while the parameter server never waits. **How many times as many gradients
# per unit of time does the parameter server apply?**

# %% tags=["predict"]
guess = None  # async gradients per unit time / sync gradients per unit time

# %%
clock = {}
for seed in SEEDS:
  times = ComputeTimes(COMPUTE, DEVICES, seed=100 + seed)  # one draw per (worker, gradient)
  sync_s = sync_schedule(COMPUTE, DEVICES, SYNC_STEPS, seed, times=times)
  async_s = ps_schedule(times, DEVICES * SYNC_STEPS)  # the same number of gradients
  clock[seed] = (sync_s, async_s)
rate = np.mean(
  [
    (DEVICES * SYNC_STEPS / a.time[-1]) / (DEVICES * SYNC_STEPS / s.time[-1])
    for s, a in clock.values()
  ]
)
teach.reveal(guess, rate, what="gradients per unit time, parameter server / sync")
print(
  f"the closed form: H_{DEVICES} = {harmonic(DEVICES):.3f} (the mean of the largest of {DEVICES} draws)"
)


# %%
def train_async(seed, schedule):
  """Replays ``schedule`` (an AsyncSchedule): update t applies worker w's k-th gradient,
  computed at the parameters τ updates old. Returns f64[evals, 3]: (updates, time, accuracy)."""
  graphdef, params = init(seed)
  step, opt_state = make_stale_step(graphdef), tx.init(params)
  ms = jax.tree.map(jnp.zeros_like, params)
  batches = worker_batches(seed, int(schedule.clock.max()) + 1)
  history = deque([params], maxlen=int(schedule.staleness.max()) + 1)  # history[-1 - τ]: τ old
  curve = [(0, 0.0, test_accuracy(graphdef, params))]
  every = DEVICES * SYNC_EVAL_EVERY  # the same gradients between evaluations as sync's
  for t, (tau, w, k) in enumerate(zip(schedule.staleness, schedule.worker, schedule.clock)):
    read = history[max(-1 - int(tau), -len(history))]
    params, opt_state, ms = step(params, opt_state, ms, read, batches[w, k], 1.0, 0.0, 0.0)
    history.append(params)
    if (t + 1) % every == 0:
      curve.append((t + 1, schedule.time[t], test_accuracy(graphdef, params)))
  return np.array(curve)


def first_time(curve, target=TARGET):  # curve: (updates, time, accuracy) rows
  hit = np.flatnonzero(curve[:, 2] >= target)
  return (curve[hit[0], 1], curve[hit[0], 0]) if hit.size else (np.nan, np.nan)


runs_clock = {}
for seed in SEEDS:
  sync_s, async_s = clock[seed]
  _, sc = (ring_params, ring_curve) if seed == 0 else train_sync(ring, seed)
  steps = sc[:, 0].astype(int)
  sync_time = np.where(steps > 0, sync_s.time[np.maximum(steps - 1, 0)], 0.0)
  runs_clock["sync", seed] = np.c_[steps, sync_time, sc[:, 1]]
  runs_clock["async", seed] = train_async(seed, async_s)

one_clock = pd.DataFrame(
  [
    {
      "arm": arm,
      "seed": seed,
      "time to target": first_time(c)[0],
      "updates to target": first_time(c)[1],
      "final accuracy": c[-1, 2],
      "simulated time": c[-1, 1],
      "updates": c[-1, 0],
    }
    for (arm, seed), c in runs_clock.items()
  ]
)
print(f"{DEVICES} workers, {COMPUTE} compute times, {DEVICES * SYNC_STEPS} gradients per arm; "
      f"target {TARGET:.0%}; median over {len(SEEDS)} seed(s):")  # fmt: skip
one_clock.groupby("arm").median(numeric_only=True).drop(columns="seed").round(3)

# %%
labels = {
  "sync": f"sync: section 1's step, ring all-reduce, batch {DEVICES}×{BATCH}",
  "async": f"async: parameter server, batch {BATCH}, gradients τ old",
}
fig, (ax_t, ax_u) = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
for arm, marker in (("sync", "o-"), ("async", "s-")):
  c = np.mean([runs_clock[arm, s] for s in SEEDS], axis=0)
  ax_t.plot(c[:, 1], c[:, 2], marker, ms=3, label=labels[arm])
  ax_u.plot(c[:, 0], c[:, 2], marker, ms=3, label=labels[arm])
for ax in (ax_t, ax_u):
  ax.axhline(TARGET, color="k", lw=0.8, ls=":")
  ax.grid(True, alpha=0.3)
  ax.set_ylim(0, 1)
ax_t.set_xlabel("simulated time (mean gradient computations)")
ax_u.set_xlabel("updates applied (sync: one per step of 8 gradients)")
ax_u.set_xscale("log")
ax_t.set_ylabel("test accuracy")
fig.suptitle(
  f"one clock: {DEVICES} workers, {COMPUTE} compute times (mean of {len(SEEDS)} seed(s))"
)
fig.legend(*ax_t.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=9)
fig.tight_layout(rect=(0, 0.09, 1, 1))
plt.show()

# %% [markdown]
# Per update, sync is far ahead: each of its updates averages eight gradients. Per unit
# of time the parameter server applies H_8 ≈ 2.7 times as many gradients, each computed
# on parameters about seven updates old. The table above says which effect won on this
# clock; the closing cell states it.
#
# ## 5 · Communication, charged on both sides, and the methods between the ends
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
clock_med = one_clock.groupby("arm").median(numeric_only=True)
t_sync, t_async = clock_med.loc["sync", "time to target"], clock_med.loc["async", "time to target"]
u_sync, u_async = (
  clock_med.loc["sync", "updates to target"],
  clock_med.loc["async", "updates to target"],
)
both_reached = bool(np.isfinite([t_sync, t_async]).all())
tau8 = 8  # in TAUS in both modes
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
  "sequential": final(0, "sequential"),
  "taus": taus_pos,
  "plain": [final(t, "plain async") for t in taus_pos],
  "tau_max": tau_max,
  "eta_tau": final(tau_max, "η/τ"),
  "dcasgd": final(tau_max, "DC-ASGD"),
  "best_at_tau_max": best_tau_max,
  "early": early,
  "plain_early": at(tau_max, "plain async"),
  "dc_early": at(tau_max, "DC-ASGD"),
  "tau_dc": TAU_DC,
  "plain_early_8": at(TAU_DC, "plain async"),
  "dc_early_8": at(TAU_DC, "DC-ASGD"),
  "dc004_early": at(TAU_DC, "DC-ASGD λ=0.04"),
  "mxnet_lambda": 0.04,
  "dc_lambda0": DC_LAMBDA0,
  "rate": rate,
  "target": TARGET,
  "workers": BETWEEN_WORKERS,
  "gradients": BETWEEN_GRADIENTS,
  "H": H,
  "bytes_ratio": summary.loc["sync", "bytes_per_sample"]
  / summary.loc[f"diloco_h{H}", "bytes_per_sample"],
  "diloco": acc[f"diloco_h{H}"],
  "sync": acc["sync"],
  "gossip": acc["gossip"],
  "server": acc["async"],
  "lesson": {
    "ring_is_pmean_s_run": bool(param_gap < 1e-4 and acc_gap <= 0.02),
    "staleness_is_n_minus_1": bool(abs(means[DEVICES] - (DEVICES - 1)) < 0.3),
    "staleness_costs": bool(at(tau8, "plain async") < at(0, "sequential") - 0.02),
    "dcasgd_acts_early": bool(at(TAU_DC, "DC-ASGD") > at(TAU_DC, "plain async") + 0.02),
    "dc_lambda_004_moves_less_than_adaptive": bool(
      abs(at(TAU_DC, "DC-ASGD λ=0.04") - at(TAU_DC, "plain async"))
      < 0.5 * abs(at(TAU_DC, "DC-ASGD") - at(TAU_DC, "plain async"))
    ),
    "async_applies_more_gradients_per_time": bool(rate > 1.5),
    "sync_needs_fewer_updates": bool(both_reached and u_sync < u_async),
    "first_to_target_in_time": (
      ("async" if t_async < t_sync else "sync") if both_reached else "neither"
    ),
    "diloco_sends_fewer_bytes": bool(
      summary.loc[f"diloco_h{H}", "bytes_per_sample"] < summary.loc["sync", "bytes_per_sample"]
    ),
  },
}
if both_reached:
  CONCLUSION |= {"t_sync": t_sync, "t_async": t_async, "u_sync": u_sync, "u_async": u_async}
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
  + f". At τ = {c['tau_max']} η/τ reached {c['eta_tau']:.1%} and DC-ASGD (λ0 = {c['dc_lambda0']:g}, "
  f"adaptive) {c['dcasgd']:.1%}; the best there was {c['best_at_tau_max']}. After "
  f"{c['early']} updates, where the correction acts, DC-ASGD stood at {c['dc_early']:.1%} "
  f"against plain async's {c['plain_early']:.1%} at τ = {c['tau_max']}, and at "
  f"{c['dc_early_8']:.1%} against {c['plain_early_8']:.1%} at τ = {c['tau_dc']} (with MXNet's "
  f"constant λ = {c['mxnet_lambda']:g}: {c['dc004_early']:.1%})."
)
if both_reached:
  first = c["lesson"]["first_to_target_in_time"]
  print(
    f"On one clock ({c['devices']} workers, {COMPUTE} compute times, the same batches and "
    f"weights), the parameter server applied {c['rate']:.2f} times as many gradients per unit "
    f"of time as sync; sync reached {c['target']:.0%} test accuracy after {c['u_sync']:.0f} "
    f"updates and {c['t_sync']:.1f} time units, async after {c['u_async']:.0f} updates and "
    f"{c['t_async']:.1f}: {first} got there first."
  )
else:
  print(
    f"On one clock the parameter server applied {c['rate']:.2f} times as many gradients per "
    f"unit of time as sync, but not both arms reached {c['target']:.0%} in this budget, so this "
    "run does not say which got there first."
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
