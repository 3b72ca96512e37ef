"""scikit-learn's handwritten digits: a fixed stratified split, standardized.

The data ships inside scikit-learn (no download): 1797 images of 8x8 pixels, 10
classes. The split and the standardization are fixed by a seed, so every run and
every method sees exactly the same train and test sets. Mini-batch orders are
drawn in NumPy from their own seed (independent of model init and of the
compute-time schedules).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Digits:
  """The split: ``x_*``: f32[n, 64] standardized pixels; ``y_*``: i32[n] labels."""

  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray

  @property
  def n_train(self) -> int:
    return int(self.x_train.shape[0])


@functools.lru_cache(maxsize=4)
def load_digits(test_fraction: float = 0.25, seed: int = 0) -> Digits:
  """Loads the digits with a stratified train/test split, standardized on train.

  Each pixel is centred and scaled by the training set's mean and standard deviation
  (pixels that are constant on the training set are only centred).

  Args:
    test_fraction: fraction of the 1797 images held out for testing, in (0, 1).
    seed: the split's seed (fixed by default so all runs share one split).

  Returns:
    A :class:`Digits` (1347 train / 450 test images with the defaults).

  Example:
    >>> d = load_digits()
    >>> d.x_train.shape, d.x_test.shape, d.y_train.dtype
    ((1347, 64), (450, 64), dtype('int32'))
  """
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}.")
  from sklearn.datasets import load_digits as _sk_load
  from sklearn.model_selection import train_test_split

  x, y = _sk_load(return_X_y=True)
  x_tr, x_te, y_tr, y_te = train_test_split(
    x, y, test_size=test_fraction, stratify=y, random_state=seed
  )
  mean = x_tr.mean(axis=0)
  std = x_tr.std(axis=0)
  std = np.where(std > 0, std, 1.0)
  return Digits(
    x_train=((x_tr - mean) / std).astype(np.float32),
    y_train=y_tr.astype(np.int32),
    x_test=((x_te - mean) / std).astype(np.float32),
    y_test=y_te.astype(np.int32),
  )


def batch_indices(n: int, batch_size: int, steps: int, seed: int) -> np.ndarray:
  """Indices of ``steps`` mini-batches, epoch by epoch without replacement.

  Args:
    n: dataset size.
    batch_size: examples per batch (at most ``n``).
    steps: number of batches.
    seed: seed of the shuffling.

  Returns:
    i32[steps, batch_size]: consecutive reshuffled epochs cut into batches.

  Example:
    >>> batch_indices(10, 4, 3, seed=0).shape
    (3, 4)
  """
  if batch_size < 1 or batch_size > n:
    raise ValueError(f"batch_size must be in 1..{n}, got {batch_size}.")
  if steps < 0:
    raise ValueError(f"steps must be >= 0, got {steps}.")
  rng = np.random.default_rng(seed)
  need = steps * batch_size
  epochs = -(-need // n) if need else 0
  order = np.concatenate([rng.permutation(n) for _ in range(epochs)] or [np.zeros(0, np.int64)])
  return order[:need].reshape(steps, batch_size).astype(np.int32)
