"""all_reduce_tree: buckets by dtype and size, same answer as per-leaf lax collectives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import all_reduce_tree, plan_buckets
from allreduce_jax.devices import submesh
from allreduce_jax.tools import verify


def _tree(p):
  shapes = {"w1": (4, 3), "b1": (3,), "w2": (3, 5), "step": (), "emb": (7, 2)}
  dtypes = {"w1": "float32", "b1": "float32", "w2": "bfloat16", "step": "int32", "emb": "float32"}
  return {
    k: verify.verifiable_input(p, s, dtypes[k], seed=len(k)) for k, s in shapes.items()
  }, shapes


@pytest.mark.parametrize("bucket_bytes", [None, 0, 40, 1 << 20])
@pytest.mark.parametrize("algorithm", ["ring", "halving_doubling", "psum"])
def test_tree_matches_per_leaf_psum(algorithm, bucket_bytes):
  p = 4
  mesh = submesh((p,), ("i",))
  host, shapes = _tree(p)
  tree = {k: jax.device_put(v, NamedSharding(mesh, P("i"))) for k, v in host.items()}

  def body(t):
    local = jax.tree.map(lambda a: a[0], t)
    got = all_reduce_tree(local, "i", op="sum", algorithm=algorithm, bucket_bytes=bucket_bytes)
    ref = jax.tree.map(lambda a: jax.lax.psum(a, "i"), local)
    return jax.tree.map(lambda a: a[None], (got, ref))

  got, ref = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))(tree)
  assert jax.tree.structure(got) == jax.tree.structure(tree)
  for k in host:
    g, r = np.asarray(got[k]), np.asarray(ref[k])
    assert g.shape == (p, *shapes[k]) and g.dtype == host[k].dtype
    np.testing.assert_array_equal(g, r, err_msg=k)


def test_sum_is_the_default_op_as_in_all_reduce():
  mesh = submesh((4,), ("i",))
  x = jax.device_put(jnp.arange(4.0), NamedSharding(mesh, P("i")))
  f = jax.shard_map(
    lambda b: all_reduce_tree([b], "i")[0], mesh=mesh, in_specs=P("i"), out_specs=P("i")
  )
  np.testing.assert_array_equal(np.asarray(jax.jit(f)(x)), 6.0)


def test_plan_buckets_examples():
  leaves = [np.zeros(4, np.float32), np.zeros(2, np.int32), np.zeros(4, np.float32)]
  assert plan_buckets(leaves, None) == [[0, 2], [1]]
  assert plan_buckets(leaves, 0) == [[0], [1], [2]]
  assert plan_buckets(leaves, 32) == [[0, 2], [1]]
  assert plan_buckets(leaves, 16) == [[0], [1], [2]]


@settings(max_examples=200, deadline=None)
@given(
  sizes=st.lists(st.integers(0, 64), min_size=0, max_size=30),
  kinds=st.lists(st.sampled_from(["float32", "bfloat16", "int32"]), min_size=30, max_size=30),
  bucket_bytes=st.one_of(st.none(), st.integers(0, 300)),
)
def test_plan_buckets_properties(sizes, kinds, bucket_bytes):
  leaves = [np.zeros(n, kinds[k]) for k, n in enumerate(sizes)]
  buckets = plan_buckets(leaves, bucket_bytes)
  # A partition of all leaves, each bucket of one dtype, in order within a bucket.
  assert sorted(k for b in buckets for k in b) == list(range(len(leaves)))
  for b in buckets:
    assert len({leaves[k].dtype for k in b}) == 1
    assert b == sorted(b)
    if bucket_bytes is not None and len(b) > 1:
      assert sum(leaves[k].nbytes for k in b) <= bucket_bytes
  if bucket_bytes is None:
    assert len(buckets) == len({leaf.dtype for leaf in leaves})
