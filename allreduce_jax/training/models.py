"""Flax NNX models for the digits (an MLP and a small CNN) and their pure loss.

Training code works on pure pytrees: :func:`split` turns a model into
``(graphdef, params, rest)`` once, and :func:`loss_fn` / :func:`accuracy` rebuild
the module with ``nnx.merge`` inside traced code, so parameters can be stacked
into ring buffers, sharded or vmapped like any other pytree.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

N_PIXELS = 64
N_CLASSES = 10


class MLP(nnx.Module):
  """``64 -> hidden... -> 10`` with ReLU."""

  def __init__(self, hidden: Sequence[int] = (128,), *, rngs: nnx.Rngs):
    sizes = [N_PIXELS, *hidden]
    self.hidden = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in itertools.pairwise(sizes)])
    self.out = nnx.Linear(sizes[-1], N_CLASSES, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:  # x: f32[B, 64] -> f32[B, 10]
    for layer in self.hidden:
      x = nnx.relu(layer(x))
    return self.out(x)


class CNN(nnx.Module):
  """Two 3x3 convolutions (16, 32 channels), 2x2 average pool, linear head."""

  def __init__(self, *, rngs: nnx.Rngs):
    self.conv1 = nnx.Conv(1, 16, (3, 3), rngs=rngs)
    self.conv2 = nnx.Conv(16, 32, (3, 3), rngs=rngs)
    self.out = nnx.Linear(4 * 4 * 32, N_CLASSES, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:  # x: f32[B, 64] -> f32[B, 10]
    x = x.reshape(x.shape[0], 8, 8, 1)  # f32[B, 8, 8, 1]
    x = nnx.relu(self.conv1(x))  # f32[B, 8, 8, 16]
    x = nnx.relu(self.conv2(x))  # f32[B, 8, 8, 32]
    x = x.reshape(x.shape[0], 4, 2, 4, 2, 32).mean(
      axis=(2, 4)
    )  # 2x2 average pool: f32[B, 4, 4, 32]
    return self.out(x.reshape(x.shape[0], -1))


MODELS = ("mlp", "cnn")


def make_model(name: str = "mlp", seed: int = 0, hidden: Sequence[int] = (128,)) -> nnx.Module:
  """Builds a model by name.

  Args:
    name: ``"mlp"`` or ``"cnn"``.
    seed: initialization seed.
    hidden: the MLP's hidden widths (ignored for the CNN).

  Returns:
    A freshly initialized NNX module mapping f32[B, 64] to logits f32[B, 10].

  Example:
    >>> make_model("cnn")(jnp.zeros((2, 64), jnp.float32)).shape
    (2, 10)
  """
  if name == "mlp":
    return MLP(tuple(hidden), rngs=nnx.Rngs(seed))
  if name == "cnn":
    return CNN(rngs=nnx.Rngs(seed))
  raise ValueError(f"model={name!r} is not supported; expected one of {MODELS}.")


def split(model: nnx.Module) -> tuple[Any, Any, Any]:
  """``(graphdef, params, rest)``: the static structure, the ``nnx.Param`` state, the rest."""
  return nnx.split(model, nnx.Param, ...)


def logits_fn(graphdef, params, rest, x: jax.Array) -> jax.Array:
  """Logits f32[B, 10] of the model ``(graphdef, params, rest)`` on ``x``: f32[B, 64]."""
  return nnx.merge(graphdef, params, rest)(x)


def loss_fn(graphdef, params, rest, x: jax.Array, y: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy (a scalar f32) on ``x``: f32[B, 64], ``y``: i32[B]."""
  logits = logits_fn(graphdef, params, rest, x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def accuracy(graphdef, params, rest, x: jax.Array, y: jax.Array) -> jax.Array:
  """Fraction (f32 scalar) of ``x`` classified as ``y``."""
  pred = jnp.argmax(logits_fn(graphdef, params, rest, x), axis=-1)
  return jnp.mean((pred == y).astype(jnp.float32))


OPTIMIZERS = ("sgd", "momentum", "adam")


def make_optimizer(name: str, learning_rate: float, momentum: float = 0.9):
  """An optax optimizer by name: ``"sgd"``, ``"momentum"`` (SGD with momentum) or ``"adam"``.

  Example:
    >>> make_optimizer("adam", 1e-3) is not None
    True
  """
  if not learning_rate > 0:
    raise ValueError(f"learning_rate must be > 0, got {learning_rate}.")
  if name == "sgd":
    return optax.sgd(learning_rate)
  if name == "momentum":
    return optax.sgd(learning_rate, momentum=momentum)
  if name == "adam":
    return _standard_promotion(optax.adam(learning_rate))
  raise ValueError(f"optimizer={name!r} is not supported; expected one of {OPTIMIZERS}.")


def _standard_promotion(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """Runs ``tx`` under JAX's standard dtype promotion.

  optax's Adam bias correction computes ``decay ** count`` (a Python float to the
  power of an int32 step count), which ``jax_numpy_dtype_promotion="strict"``
  (as in the tests) rejects; the result is the same float32 either way.
  """

  def init(params):
    with jax.numpy_dtype_promotion("standard"):
      return tx.init(params)

  def update(updates, state, params=None):
    with jax.numpy_dtype_promotion("standard"):
      return tx.update(updates, state, params)

  return optax.GradientTransformation(init, update)
