"""The slow host as a pipelined leaf: against lax.psum/pmax and NumPy, replicas bitwise
identical, its schedule against the traced program, its replay against the closed form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import _comm, gloo_model
from allreduce_jax.devices import submesh, use_cpu_devices
from allreduce_jax.slow_leaf import (
  slow_leaf_all_reduce,
  slow_leaf_messages,
  slow_leaf_seconds,
  stage_chunks,
)

use_cpu_devices(8)


def _run(p, x, *, leaf, chunks, op="sum", check_vma=True):
  """Every participant's result (``[p, *shape]``) and psum's (or pmax's...) on p devices."""
  mesh = submesh((p,), ("i",))
  ref = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}.get(op, lax.psum)

  def body(v):  # v: T[1, *shape], this participant's block
    got = slow_leaf_all_reduce(v[0], "i", leaf=leaf, chunks=chunks, op=op)
    return got[None], ref(v[0], "i")[None]

  f = jax.jit(
    jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=(P("i"), P("i")), check_vma=check_vma)
  )
  xs = jax.device_put(x, NamedSharding(mesh, P("i")))
  got, want = f(xs)
  return np.asarray(got), np.asarray(want)


def _inputs(p, shape, dtype=np.float32, seed=0):
  """Small integers: every sum exact in any order, so the comparison is bitwise."""
  rng = np.random.default_rng(seed)
  return rng.integers(-8, 9, size=(p, *shape)).astype(dtype)


@pytest.mark.parametrize(
  "p, leaf, chunks, n, check_vma",
  [(2, 0, 3, 7, True), (2, 1, 1, 1, False), (3, 2, 4, 11, True), (4, 1, 8, 37, False),
   (4, 0, 3, 64, True), (5, 4, 2, 13, False)],
)  # fmt: skip
def test_sum_matches_psum_and_numpy_bitwise(p, leaf, chunks, n, check_vma):
  x = _inputs(p, (n,))
  got, want = _run(p, x, leaf=leaf, chunks=chunks, check_vma=check_vma)
  oracle = x.sum(axis=0)
  assert np.array_equal(want[0], oracle)
  for r in range(p):  # every replica: psum's bits, NumPy's value
    assert np.array_equal(got[r], oracle), (r, got[r], oracle)


def test_ops_shapes_and_identical_replicas_on_random_floats():
  p, leaf = 4, 2
  x = np.random.default_rng(1).standard_normal((p, 3, 7)).astype(np.float32)
  for op, oracle in [("max", x.max(0)), ("min", x.min(0)), ("mean", x.mean(0))]:
    got, want = _run(p, x, leaf=leaf, chunks=3, op=op)
    if op != "mean":  # pmax/pmin: the same element, bit for bit
      assert np.array_equal(got[0], want[0]), op
    assert got.shape == (p, 3, 7)
    assert all(np.array_equal(got[r], got[0]) for r in range(p)), op
    np.testing.assert_allclose(got[0], oracle, rtol=1e-6, err_msg=op)
  got, want = _run(p, x, leaf=leaf, chunks=5)  # sum in another order than psum's
  assert all(np.array_equal(got[r].view(np.uint32), got[0].view(np.uint32)) for r in range(p))
  np.testing.assert_allclose(got[0], x.sum(0), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


def test_int32_and_a_scalar():
  x = _inputs(3, (), np.int32)
  got, want = _run(3, x, leaf=1, chunks=4)
  assert got.dtype == np.int32 and np.array_equal(got, want)


@pytest.mark.parametrize(
  "kwargs, match",
  [({"leaf": 4, "chunks": 2}, "leaf=4"), ({"leaf": -1, "chunks": 2}, "leaf=-1"),
   ({"leaf": 0, "chunks": 0}, "chunks=0"), ({"leaf": 0, "chunks": 2.5}, "chunks=2.5"),
   ({"leaf": 0, "chunks": 2, "op": "prod"}, "op='prod'")],
)  # fmt: skip
def test_a_bad_argument_is_one_line_naming_it(kwargs, match):
  with pytest.raises(ValueError, match=match) as e:
    _run(4, _inputs(4, (5,)), **kwargs)
  assert "\n" not in str(e.value)


def test_schedule_is_what_the_program_sends():
  # The traced ppermutes (pairs and sizes), one per step, against slow_leaf_messages.
  p, leaf, k = 4, 1, 3
  n = k * (p - 1) * 2  # a multiple of k(p-1): no padding
  mesh = submesh((p,), ("i",))
  f = jax.shard_map(
    lambda v: slow_leaf_all_reduce(v, "i", leaf=leaf, chunks=k), mesh=mesh, in_specs=P("i"),
    out_specs=P(),
  )  # fmt: skip
  with _comm.recording_messages() as log:
    jax.jit(f).lower(jax.device_put(jnp.zeros(p * n, jnp.float32), NamedSharding(mesh, P("i"))))
  traced = [[(s, d, got.shape[0] / n) for s, d in pairs] for _, pairs, got in log]
  want = [[(s, d, f) for s, d, f, _ in step] for step in slow_leaf_messages(p, leaf=leaf, chunks=k)]
  assert traced == want
  # The leaf sends n and receives n, from two different hosts in each stage.
  sent = sum(f for step in want for s, d, f in step if s == leaf)
  got = sum(f for step in want for s, d, f in step if d == leaf)
  assert sent == pytest.approx(1) and got == pytest.approx(1)
  both = [st for st in want if len(st) == 2]
  assert len(both) == k - 1 and all(st[0][1] != st[1][0] for st in both)  # a != b


def test_stage_chunks_never_sends_a_chunk_of_padding():
  assert stage_chunks(100, 4, 8) == 8 and stage_chunks(5, 4, 8) == 2 and stage_chunks(1, 2, 8) == 1


@pytest.mark.parametrize(
  "p, leaf, k, slow", [(2, 1, 4, 0.1), (3, 0, 5, 1.0), (4, 1, 8, 0.1), (8, 5, 16, 0.01)]
)
def test_replay_matches_the_closed_form(p, leaf, k, slow):
  rate, alpha, n = 25e6, 1e-3, 4 * 2**20
  s = gloo_model.payload_share()
  r, rs = rate * s, rate * slow * s
  stage = n / (k * rs)
  # p = 2: one healthy host is a and b, so the k-1 middle stages are exchanges (half duplex).
  slow_part = (k + 1) * stage if p > 2 else (2 * (k - 1) + 2) * stage
  ring_steps = 2 * k * (p - 2)
  # p = 3: the two healthy hosts' ring steps are exchanges too.
  ring = 2 * (p - 2) / (p - 1) * n / r * (2 if p == 3 else 1)
  closed = (k + 1 + ring_steps) * alpha + slow_part + ring
  got = slow_leaf_seconds(
    p, n, leaf=leaf, chunks=k, rate=rate, alpha=alpha, link_rates={leaf: rate * slow}
  )
  assert got == pytest.approx(closed, rel=1e-9)
  bound = gloo_model.cut_bound_seconds(n, p, rate=rate, link_rates={leaf: rate * slow})
  if p > 2 and slow <= 0.01:
    data = got - (k + 1 + ring_steps) * alpha  # the bytes' time: near the bound
    assert data / bound == pytest.approx(1 + 1 / k + 2 * (p - 2) / (p - 1) * slow)
