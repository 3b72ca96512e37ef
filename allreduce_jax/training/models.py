"""Flax NNX models (an MLP and a small CNN for the digits, a byte-level transformer LM)
and their pure loss.

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
import numpy as np
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


class CausalSelfAttention(nnx.Module):
  """Multi-head causal self-attention, written out (one fused QKV projection)."""

  def __init__(self, d_model: int, heads: int, *, rngs: nnx.Rngs):
    if d_model % heads:
      raise ValueError(f"d_model={d_model} must be divisible by heads={heads}.")
    self.heads = heads
    self.qkv = nnx.Linear(d_model, 3 * d_model, rngs=rngs)
    self.proj = nnx.Linear(d_model, d_model, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:  # x: f32[B, T, D] -> f32[B, T, D]
    b, t, d = x.shape
    h = self.heads
    q, k, v = jnp.split(self.qkv(x).reshape(b, t, 3, h, d // h), 3, axis=2)  # f32[B, T, 1, H, Dh]
    q, k, v = q[:, :, 0], k[:, :, 0], v[:, :, 0]  # f32[B, T, H, Dh]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(d // h))  # f32[B, H, T, T]
    causal = jnp.tril(jnp.ones((t, t), bool))
    scores = jnp.where(causal, scores, jnp.float32(-1e30))
    att = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, t, d)  # f32[B, T, D]
    return self.proj(out)


class Block(nnx.Module):
  """Pre-LayerNorm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))`` (4x, GELU)."""

  def __init__(self, d_model: int, heads: int, *, rngs: nnx.Rngs):
    self.ln1 = nnx.LayerNorm(d_model, rngs=rngs)
    self.attn = CausalSelfAttention(d_model, heads, rngs=rngs)
    self.ln2 = nnx.LayerNorm(d_model, rngs=rngs)
    self.up = nnx.Linear(d_model, 4 * d_model, rngs=rngs)
    self.down = nnx.Linear(4 * d_model, d_model, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x + self.attn(self.ln1(x))
    return x + self.down(nnx.gelu(self.up(self.ln2(x))))


class CharLM(nnx.Module):
  """A small byte-level GPT: token + learned position embeddings, ``layers`` pre-LN
  blocks, final LayerNorm, linear head over the vocabulary.

  Maps ``x``: i32[B, T] (T <= ``context``) to next-byte logits f32[B, T, vocab_size].
  """

  def __init__(
    self,
    vocab_size: int = 256,
    context: int = 64,
    d_model: int = 64,
    layers: int = 2,
    heads: int = 4,
    *,
    rngs: nnx.Rngs,
  ):
    self.tok = nnx.Embed(vocab_size, d_model, rngs=rngs)
    self.pos = nnx.Embed(context, d_model, rngs=rngs)
    self.blocks = nnx.List([Block(d_model, heads, rngs=rngs) for _ in range(layers)])
    self.ln = nnx.LayerNorm(d_model, rngs=rngs)
    self.head = nnx.Linear(d_model, vocab_size, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:  # x: i32[B, T] -> f32[B, T, V]
    h = self.tok(x) + self.pos(jnp.arange(x.shape[1]))[None]  # f32[B, T, D]
    for block in self.blocks:
      h = block(h)
    return self.head(self.ln(h))


MODELS = ("mlp", "cnn", "lm")

#: The LM's default shape: ~0.1 M parameters, trains on 2 CPU cores in a minute or two.
LM_DEFAULTS = {"vocab_size": 256, "context": 64, "d_model": 64, "layers": 2, "heads": 4}


def make_model(
  name: str = "mlp", seed: int = 0, hidden: Sequence[int] = (128,), **lm_kwargs
) -> nnx.Module:
  """Builds a model by name.

  Args:
    name: ``"mlp"``, ``"cnn"`` or ``"lm"`` (:class:`CharLM`).
    seed: initialization seed.
    hidden: the MLP's hidden widths (ignored otherwise).
    **lm_kwargs: overrides of :data:`LM_DEFAULTS` for the LM.

  Returns:
    A freshly initialized NNX module: f32[B, 64] -> logits f32[B, 10] for the
    digits models, i32[B, T] -> f32[B, T, vocab] for the LM.

  Example:
    >>> make_model("cnn")(jnp.zeros((2, 64), jnp.float32)).shape
    (2, 10)
    >>> make_model("lm")(jnp.zeros((2, 64), jnp.int32)).shape
    (2, 64, 256)
  """
  if name == "mlp":
    return MLP(tuple(hidden), rngs=nnx.Rngs(seed))
  if name == "cnn":
    return CNN(rngs=nnx.Rngs(seed))
  if name == "lm":
    return CharLM(**{**LM_DEFAULTS, **lm_kwargs}, rngs=nnx.Rngs(seed))
  raise ValueError(f"model={name!r} is not supported; expected one of {MODELS}.")


def n_params(params: Any) -> int:
  """Number of scalars in a parameter pytree."""
  return int(sum(np.prod(a.shape) for a in jax.tree.leaves(params)))


def split(model: nnx.Module) -> tuple[Any, Any, Any]:
  """``(graphdef, params, rest)``: the static structure, the ``nnx.Param`` state, the rest."""
  return nnx.split(model, nnx.Param, ...)


def logits_fn(graphdef, params, rest, x: jax.Array) -> jax.Array:
  """Logits f32[B, 10] of the model ``(graphdef, params, rest)`` on ``x``: f32[B, 64]."""
  return nnx.merge(graphdef, params, rest)(x)


def loss_fn(graphdef, params, rest, x: jax.Array, y: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy (a scalar f32; nats per byte for the LM) on a batch:
  ``x``: f32[B, 64] and ``y``: i32[B], or ``x``, ``y``: i32[B, T] for the LM."""
  logits = logits_fn(graphdef, params, rest, x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def accuracy(graphdef, params, rest, x: jax.Array, y: jax.Array) -> jax.Array:
  """Fraction (f32 scalar) of ``x`` classified as ``y`` (next-byte accuracy for the LM)."""
  pred = jnp.argmax(logits_fn(graphdef, params, rest, x), axis=-1)
  return jnp.mean((pred == y).astype(jnp.float32))


def metrics(graphdef, params, rest, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(mean cross-entropy, accuracy)`` of the model on ``(x, y)``, from one forward pass."""
  logits = logits_fn(graphdef, params, rest, x)
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  acc = jnp.mean((jnp.argmax(logits, axis=-1) == y).astype(jnp.float32))
  return loss, acc


OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")

#: AdamW's default weight decay (DiLoCo's inner optimizer; Douillard et al. 2023 use 0.1).
ADAMW_WEIGHT_DECAY = 0.1


def make_optimizer(name: str, learning_rate: float, momentum: float = 0.9):
  """An optax optimizer by name: ``"sgd"``, ``"momentum"`` (SGD with momentum), ``"adam"``
  or ``"adamw"`` (weight decay :data:`ADAMW_WEIGHT_DECAY`).

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
  if name == "adamw":
    return _standard_promotion(optax.adamw(learning_rate, weight_decay=ADAMW_WEIGHT_DECAY))
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
