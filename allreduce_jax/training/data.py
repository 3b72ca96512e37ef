"""The data: scikit-learn's handwritten digits, and a byte-level text corpus that ships with Python.

Digits ship inside scikit-learn (no download): 1797 images of 8x8 pixels, 10
classes. The split and the standardization are fixed by a seed, so every run and
every method sees exactly the same train and test sets. Mini-batch orders are
drawn in NumPy from their own seed (independent of model init and of the
compute-time schedules).

The text (:func:`load_text`) is Python's own: the help topics of ``pydoc_data`` or
the standard library's source files, cut into next-byte windows with a fixed
train/validation split. Both datasets expose ``x_train, y_train, x_test, y_test``
and ``n_train``, so every trainer takes either.
"""

from __future__ import annotations

import functools
import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

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
  # here: scikit-learn takes about a second to import and only this loader needs it
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


# ------------------------------------------------------------------ a text corpus for the LM

#: Text sources that ship with Python (no download).
TEXT_SOURCES = ("topics", "stdlib")


@dataclass(frozen=True)
class TextCorpus:
  """A byte-level language-modelling split, shaped like :class:`Digits`.

  ``x_*``: i32[n, T] windows of bytes; ``y_*``: i32[n, T] the same windows shifted by
  one byte (the next-byte targets). The vocabulary is the 256 byte values.
  ``sha256`` fingerprints the raw text (it changes with the Python version that
  ships it); ``n_bytes`` is its length.
  """

  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  source: str
  sha256: str
  n_bytes: int
  vocab_size: int = 256

  @property
  def n_train(self) -> int:
    return int(self.x_train.shape[0])

  @property
  def context(self) -> int:
    return int(self.x_train.shape[1])


def corpus_text(source: str = "topics", max_bytes: int | None = None) -> bytes:
  """The raw text of a corpus that ships with Python, as UTF-8 bytes.

  * ``"topics"``: ``pydoc_data.topics.topics`` (the language reference's help
    topics, ~466 KB of English prose and grammar on CPython 3.11), joined in sorted
    key order.
  * ``"stdlib"``: the standard library's own ``Lib/*.py`` files (top level only,
    sorted by name), read from ``sysconfig.get_paths()["stdlib"]``.

  Args:
    source: one of :data:`TEXT_SOURCES`.
    max_bytes: keep only the first this many bytes (``None``: all).

  Example:
    >>> corpus_text("topics", max_bytes=24)
    b'The "assert" statement\\n*'
  """
  if source == "topics":
    from pydoc_data.topics import topics  # here: a 700 KB text, read only for the corpus

    raw = "".join(topics[k] for k in sorted(topics)).encode("utf-8")
  elif source == "stdlib":
    root = Path(sysconfig.get_paths()["stdlib"])
    parts, total = [], 0
    for path in sorted(root.glob("*.py"), key=lambda p: p.name):
      parts.append(path.read_bytes())
      total += len(parts[-1])
      if max_bytes is not None and total >= max_bytes:
        break
    raw = b"".join(parts)
  else:
    raise ValueError(f"source={source!r} is not supported; expected one of {TEXT_SOURCES}.")
  if max_bytes is not None:
    if max_bytes < 1:
      raise ValueError(f"max_bytes must be >= 1 or None, got {max_bytes}.")
    raw = raw[:max_bytes]
  return raw


@functools.lru_cache(maxsize=4)
def load_text(
  source: str = "topics",
  context: int = 64,
  val_every: int = 10,
  max_val_windows: int | None = 256,
  max_bytes: int | None = None,
) -> TextCorpus:
  """Cuts a bundled corpus into next-byte windows with a fixed train/validation split.

  The byte stream is cut into consecutive non-overlapping blocks of ``context + 1``
  bytes; block ``k`` gives ``x = block[:-1]``, ``y = block[1:]``. Every
  ``val_every``-th block (``k % val_every == val_every - 1``) is validation, the
  rest is training: no window is in both, both sample the whole text. Nothing is
  random, so the split is the same on every call (and on every machine with the
  same Python).

  Args:
    source: one of :data:`TEXT_SOURCES`.
    context: T, bytes per window.
    val_every: one block in this many is held out (>= 2).
    max_val_windows: keep this many validation windows, evenly spaced (``None``:
      all); bounds the evaluation's cost.
    max_bytes: use only the first this many bytes of the text.

  Returns:
    A :class:`TextCorpus`.

  Example:
    >>> c = load_text(context=64)
    >>> c.x_train.shape[1], c.x_test.shape, c.vocab_size
    (64, (256, 64), 256)
    >>> bool((c.x_train[:, 1:] == c.y_train[:, :-1]).all())
    True
  """
  if context < 1:
    raise ValueError(f"context must be >= 1, got {context}.")
  if val_every < 2:
    raise ValueError(f"val_every must be >= 2, got {val_every}.")
  raw = corpus_text(source, max_bytes)
  stream = np.frombuffer(raw, np.uint8).astype(np.int32)
  n_blocks = stream.size // (context + 1)
  if n_blocks < val_every:
    raise ValueError(
      f"the text has {stream.size} bytes: fewer than {val_every} blocks of {context + 1}."
    )
  blocks = stream[: n_blocks * (context + 1)].reshape(n_blocks, context + 1)
  is_val = np.arange(n_blocks) % val_every == val_every - 1
  train, val = blocks[~is_val], blocks[is_val]
  if max_val_windows is not None and val.shape[0] > max_val_windows:
    keep = np.linspace(0, val.shape[0] - 1, max_val_windows).round().astype(np.int64)
    val = val[keep]
  return TextCorpus(
    x_train=np.ascontiguousarray(train[:, :-1]),
    y_train=np.ascontiguousarray(train[:, 1:]),
    x_test=np.ascontiguousarray(val[:, :-1]),
    y_test=np.ascontiguousarray(val[:, 1:]),
    source=source,
    sha256=hashlib.sha256(raw).hexdigest(),
    n_bytes=len(raw),
  )
