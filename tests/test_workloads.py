"""Workloads that do not saturate: the text corpus, the byte-level LM, the strict CNN."""

from __future__ import annotations

import socket

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from allreduce_jax.training import data, lm, models


def test_corpus_is_deterministic_and_needs_no_network(monkeypatch):
  def no_network(*args, **kwargs):
    raise AssertionError("the corpus loader tried to open a socket")

  monkeypatch.setattr(socket, "socket", no_network)
  monkeypatch.setattr(socket, "create_connection", no_network)
  a = data.load_text.__wrapped__(context=32)
  b = data.load_text.__wrapped__(context=32)
  assert a.sha256 == b.sha256 and a.n_bytes > 100_000
  for name in ("x_train", "y_train", "x_test", "y_test"):
    np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
  assert a.x_train.dtype == np.int32 and a.x_train.max() < a.vocab_size
  # next-byte targets; the splits are disjoint blocks (a few windows repeat verbatim in the
  # text itself, e.g. underlines of headings)
  assert (a.x_train[:, 1:] == a.y_train[:, :-1]).all()
  train = {r.tobytes() for r in a.x_train}
  assert sum(r.tobytes() in train for r in a.x_test) < 0.1 * len(a.x_test)
  stdlib = data.load_text.__wrapped__("stdlib", context=32, max_bytes=50_000)
  assert stdlib.n_bytes == 50_000 and stdlib.x_test.shape[1] == 32


def test_corpus_rejects_bad_arguments():
  with pytest.raises(ValueError, match="source"):
    data.corpus_text("wikipedia")
  with pytest.raises(ValueError, match="val_every"):
    data.load_text.__wrapped__(val_every=1)
  with pytest.raises(ValueError, match="fewer than"):
    data.load_text.__wrapped__(context=64, max_bytes=300)


def test_lm_is_causal():
  model = models.make_model("lm", 0, **lm.LM_SMOKE)
  x = np.arange(32, dtype=np.int32)[None] + 40
  y = x.copy()
  y[0, 20] = 99  # changing byte 20 must not change predictions before it
  a, b = model(jnp.asarray(x)), model(jnp.asarray(y))
  np.testing.assert_allclose(a[0, :20], b[0, :20], atol=1e-6)
  assert not np.allclose(a[0, 20:], b[0, 20:])


def test_lm_loss_decreases_on_a_smoke_config():
  corpus = data.load_text(context=32)
  model = models.make_model("lm", 0, **lm.LM_SMOKE)
  graphdef, params, rest = models.split(model)
  loss0, _ = models.metrics(graphdef, params, rest, corpus.x_test, corpus.y_test)
  losses = lm.train_single(model, corpus, steps=60, batch=16)  # nnx.Optimizer, in place
  graphdef, params, rest = models.split(model)
  loss1, acc1 = models.metrics(graphdef, params, rest, corpus.x_test, corpus.y_test)
  assert losses[-10:].mean() < losses[:10].mean() - 1.0
  assert float(loss1) < float(loss0) - 1.5 and float(acc1) > 0.15


def test_workloads_build():
  w = lm.lm_workload(smoke=True)
  assert w.metric == "loss" and w.reached(w.target - 0.1) and not w.reached(w.target + 0.1)
  logits = w.make_model(0)(jnp.zeros((2, w.data.context), jnp.int32))
  assert logits.shape == (2, w.data.context, 256)
  c = lm.cnn_strict_workload()
  assert c.target == 0.98 and c.metric == "accuracy"
  assert jax.tree.leaves(models.split(c.make_model(0))[1])
