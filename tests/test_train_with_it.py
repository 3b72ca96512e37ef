"""The README's "Train with it" block runs as written and matches the same step with lax.pmean.

The block lives here (``TRAIN_WITH_IT``) and in README.md between
``<!-- train-with-it:start -->`` and ``<!-- train-with-it:end -->`` (the NNX step likewise
in docs/training.md): the runs use the documents' copies, and a test checks they agree.
Also: ``all_reduce_gradients`` chained before ``optax.adam`` trains a Flax
NNX MLP on digits like ``lax.pmean`` for every hand-written single-axis algorithm.
"""

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from sklearn.datasets import load_digits

from allreduce_jax import all_reduce_gradients, names
from allreduce_jax.gradients import AlreadyReducedError

README = Path(__file__).resolve().parents[1] / "README.md"
TRAINING_GUIDE = Path(__file__).resolve().parents[1] / "docs" / "training.md"
START, END = "<!-- train-with-it:start -->", "<!-- train-with-it:end -->"
ALGORITHM_ARG = 'algorithm="ring"'
TRANSFORM = 'all_reduce_gradients("data", algorithm="ring")'

TRAIN_WITH_IT = """\
import jax, jax.numpy as jnp, optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from sklearn.datasets import load_digits
from allreduce_jax import all_reduce_gradients
from allreduce_jax.distributed import initialize_from_env

jax.config.update("jax_num_cpu_devices", 8)  # a laptop: 8 emulated CPU devices (GPU/TPU: no effect)
initialize_from_env()  # started by `allreduce-jax launch` or a cluster's env: join the other processes
mesh = jax.make_mesh((jax.device_count(),), ("data",))  # every device of every process
rngs = nnx.Rngs(0)
model = nnx.Sequential(nnx.Linear(64, 32, rngs=rngs), nnx.relu, nnx.Linear(32, 10, rngs=rngs))
graphdef, params = nnx.split(model)
tx = optax.chain(all_reduce_gradients("data", algorithm="ring"), optax.adam(1e-2))
opt_state = tx.init(params)

def loss_fn(params, x, y):
  logits = nnx.merge(graphdef, params)(x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

@jax.jit
@jax.shard_map(mesh=mesh, in_specs=(P(), P(), P("data"), P("data")), out_specs=(P(), P()))
def step(params, opt_state, x, y):  # params replicated, batch sharded over "data"
  mine = jax.lax.pcast(params, "data", to="varying")  # differentiate per device
  grads = jax.grad(loss_fn)(mine, x, y)  # this device's gradient
  updates, opt_state = tx.update(grads, opt_state, params)  # hand-written all-reduce, then Adam
  return optax.apply_updates(params, updates), opt_state

x, y = load_digits(return_X_y=True)
x = jax.device_put(jnp.asarray(x[:1792] / 16, jnp.float32), NamedSharding(mesh, P("data")))
y = jax.device_put(jnp.asarray(y[:1792]), NamedSharding(mesh, P("data")))
print(f"loss before: {loss_fn(params, x, y):.2f}")  # prints about: loss before: 2.32
for _ in range(25):
  params, opt_state = step(params, opt_state, x, y)
print(f"loss after 25 steps: {loss_fn(params, x, y):.2f}")  # prints about: loss after 25 steps: 0.45
"""


NNX_STEP = """\
import jax, jax.numpy as jnp, optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from sklearn.datasets import load_digits
from allreduce_jax import all_reduce_gradients

jax.config.update("jax_num_cpu_devices", 8)  # a laptop: 8 emulated CPU devices (GPU/TPU: no effect)
mesh = jax.make_mesh((jax.device_count(),), ("data",))
model = nnx.Sequential(nnx.Linear(64, 32, rngs=nnx.Rngs(0)), nnx.relu, nnx.Linear(32, 10, rngs=nnx.Rngs(1)))
tx = optax.chain(all_reduce_gradients("data", algorithm="ring"), optax.adam(1e-2))
optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

def loss_fn(model, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

@nnx.jit
@nnx.shard_map(mesh=mesh, in_specs=(P(), P(), P("data"), P("data")), out_specs=P())
def step(model, optimizer, x, y):  # model and optimizer replicated, batch sharded over "data"
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  mine = nnx.merge(graphdef, jax.lax.pcast(params, "data", to="varying"), rest)  # per device
  grads = nnx.grad(loss_fn)(mine, x, y)  # this device's gradient
  optimizer.update(model, grads)  # hand-written all-reduce, then Adam, in place
  return jax.lax.pmean(loss_fn(model, x, y), "data")

x, y = load_digits(return_X_y=True)
x = jax.device_put(jnp.asarray(x[:1792] / 16, jnp.float32), NamedSharding(mesh, P("data")))
y = jax.device_put(jnp.asarray(y[:1792]), NamedSharding(mesh, P("data")))
for _ in range(25):
  loss = step(model, optimizer, x, y)
print(f"loss after 25 steps: {loss:.2f}")  # prints about: loss after 25 steps: 0.57
"""
NNX_START, NNX_END = "<!-- nnx-step:start -->", "<!-- nnx-step:end -->"


def _readme_block(start: str = START, end: str = END) -> str | None:
  """The ```python block between the markers in README.md or docs/training.md, or None."""
  text = "".join(p.read_text() for p in (README, TRAINING_GUIDE) if p.exists())
  if start not in text or end not in text:
    return None
  section = text[text.index(start) + len(start) : text.index(end)]
  m = re.search(r"```python\n(.*?)```", section, re.S)
  return m.group(1) if m else ""


def _pmean_transform(axis_name):
  """The reference: lax.pmean where all_reduce_gradients sits."""

  def update(updates, state, params=None):
    del params
    return jax.lax.pmean(updates, axis_name), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _run(src: str) -> dict:
  ns = {"_pmean_transform": _pmean_transform}
  with jax.numpy_dtype_promotion("standard"):  # user code: optax's Adam mixes int and float
    exec(compile(src, "<train-with-it>", "exec"), ns)
  return ns


# The README's block is a user's script (it sets the device count and joins a cluster from
# the environment), so it runs as one: in its own process, which writes its final
# parameters and loss to an .npz.
_SAVE = """
with jax.numpy_dtype_promotion("standard"):  # user code: optax's Adam mixes int and float
  exec(compile(sys.argv[1], "<train-with-it>", "exec"))
  loss = float(loss_fn(params, x, y))
np.savez(sys.argv[2], *[np.asarray(leaf) for leaf in jax.tree.leaves(params)], loss=loss)
"""
_SCRIPT = (
  "import sys\nimport jax, numpy as np, optax\n" + inspect.getsource(_pmean_transform) + _SAVE
)


def _run_script(src: str, tmp_path: Path) -> tuple[list[np.ndarray], float]:
  """(the final parameters' leaves, the final loss) of ``src`` run in its own process."""
  out = tmp_path / f"run{len(list(tmp_path.glob('run*.npz')))}.npz"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  res = subprocess.run(
    [sys.executable, "-c", _SCRIPT, src, str(out)],
    env=env, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
  with np.load(out) as z:
    leaves = [z[f"arr_{i}"] for i in range(len(z.files) - 1)]
    return leaves, float(z["loss"])


_REFERENCE: dict = {}


def _reference_params(src: str, tmp_path: Path):
  if src not in _REFERENCE:
    assert src.count(TRANSFORM) == 1
    _REFERENCE[src] = _run_script(src.replace(TRANSFORM, '_pmean_transform("data")'), tmp_path)[0]
  return _REFERENCE[src]


@pytest.mark.parametrize("algorithm", ["ring", "halving_doubling", "tree"])
def test_train_with_it_block_matches_pmean(algorithm, tmp_path):
  src = _readme_block() or TRAIN_WITH_IT
  assert src.count(ALGORITHM_ARG) == 1
  got, loss = _run_script(src.replace(ALGORITHM_ARG, f"algorithm={algorithm!r}"), tmp_path)
  want = _reference_params(src, tmp_path)
  assert len(got) == len(want) > 0
  for got_leaf, want_leaf in zip(got, want):
    np.testing.assert_allclose(got_leaf, want_leaf, rtol=0, atol=1e-5)
  assert loss < 1.0  # it trained (about 2.3 at the start)


OVERLAPPED_START, OVERLAPPED_END = (
  "<!-- train-overlapped:start -->",
  "<!-- train-overlapped:end -->",
)
NNX_OVERLAPPED = "<!-- nnx-overlapped:start -->", "<!-- nnx-overlapped:end -->"
SAME_BUCKETS = 'all_reduce_gradients("data", algorithm="ring", bucket_bytes=1024)'


def _one_step(src: str) -> str:
  assert src.count("range(25)") == 1
  return src.replace("range(25)", "range(1)")


def test_overlapped_block_gives_the_bits_of_the_step_with_the_same_buckets(tmp_path):
  """The README's overlapped training (overlap.value_and_grad, then Adam in its own jit) and
  the first block with all_reduce_gradients(..., bucket_bytes=1024): after one step the same
  parameters, bit for bit (Adam's first step follows the gradient's bits). Later steps may
  differ in the last bit: Adam compiled apart rounds differently from Adam fused into the
  step (XLA:CPU contracts multiply-adds); test_docs_blocks checks the printed losses."""
  overlapped = _readme_block(OVERLAPPED_START, OVERLAPPED_END)
  assert overlapped and "bucket_bytes=1024" in overlapped
  first = (_readme_block() or TRAIN_WITH_IT).replace(TRANSFORM, SAME_BUCKETS)
  got, got_loss = _run_script(_one_step(overlapped), tmp_path)
  want, want_loss = _run_script(_one_step(first), tmp_path)
  assert len(got) == len(want) > 0 and got_loss == want_loss
  for got_leaf, want_leaf in zip(got, want):
    np.testing.assert_array_equal(got_leaf, want_leaf)


def test_nnx_overlapped_block_gives_the_bits_of_the_nnx_step():
  """docs/training.md's nnx.Optimizer training with overlap.value_and_grad against its NNX
  step with all_reduce_gradients(..., bucket_bytes=1024): one step, the same bits."""
  overlapped = _readme_block(*NNX_OVERLAPPED)
  assert overlapped
  got = nnx.state(_run(_one_step(overlapped))["model"], nnx.Param)
  step = (_readme_block(NNX_START, NNX_END) or NNX_STEP).replace(TRANSFORM, SAME_BUCKETS)
  want = nnx.state(_run(_one_step(step))["model"], nnx.Param)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_readme_holds_the_tested_block():
  assert _readme_block() == TRAIN_WITH_IT
  assert _readme_block(NNX_START, NNX_END) == NNX_STEP


def test_nnx_native_step_matches_pmean_under_check_vma():
  """nnx.Optimizer + nnx.shard_map under the default check_vma: the README's NNX step
  (a varying copy of the parameters, the NNX spelling of fix (1)) equals the same step
  with lax.pmean; without the copy, all_reduce_gradients refuses the pre-summed grads."""
  src = _readme_block(NNX_START, NNX_END) or NNX_STEP
  src = src.replace("range(25)", "range(10)")
  got = nnx.state(_run(src)["model"], nnx.Param)
  want = nnx.state(_run(src.replace(TRANSFORM, '_pmean_transform("data")'))["model"], nnx.Param)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5)
  naive = src.replace(
    'mine = nnx.merge(graphdef, jax.lax.pcast(params, "data", to="varying"), rest)', "mine = model"
  )
  with pytest.raises(AlreadyReducedError, match="already invariant"):
    _run(naive)


# ---- Flax NNX MLP on digits, optax.adam, check_vma=False, every algorithm ----

HAND_WRITTEN_1D = names(axes=1, hand_written=True, priced=True)


def _digits_run(transform, p=8, steps=10):
  mesh = jax.make_mesh((p,), ("data",), devices=jax.devices()[:p])
  rngs = nnx.Rngs(0)
  model = nnx.Sequential(nnx.Linear(64, 32, rngs=rngs), nnx.relu, nnx.Linear(32, 10, rngs=rngs))
  graphdef, params = nnx.split(model, nnx.Param)
  tx = optax.chain(transform, optax.adam(1e-2))
  opt_state = tx.init(params)

  def loss_fn(params, x, y):
    logits = nnx.merge(graphdef, params)(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @jax.jit
  @jax.shard_map(
    mesh=mesh, in_specs=(P(), P(), P("data"), P("data")), out_specs=(P(), P()), check_vma=False
  )
  def step(params, opt_state, x, y):
    grads = jax.grad(loss_fn)(params, x, y)  # untyped: this device's gradient
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  x, y = load_digits(return_X_y=True)
  n = (len(x) // (4 * p)) * 4 * p
  x = jax.device_put(jnp.asarray(x[:n] / 16, jnp.float32), NamedSharding(mesh, P("data")))
  y = jax.device_put(jnp.asarray(y[:n]), NamedSharding(mesh, P("data")))
  with jax.numpy_dtype_promotion("standard"):  # optax's Adam mixes int and float
    for _ in range(steps):
      params, opt_state = step(params, opt_state, x, y)
  return params


@pytest.mark.parametrize("algorithm", HAND_WRITTEN_1D)
def test_digits_mlp_with_adam_matches_pmean_without_check_vma(algorithm):
  if "digits" not in _REFERENCE:
    _REFERENCE["digits"] = _digits_run(_pmean_transform("data"))
  want = _REFERENCE["digits"]
  got = _digits_run(all_reduce_gradients("data", algorithm=algorithm))
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5)
