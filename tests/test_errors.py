"""Bad input raises a clear error naming the argument and the valid choices."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import ALGORITHMS, OPS, all_reduce, all_reduce_tree
from allreduce_jax._devices import submesh


def _run(fn, dtype=jnp.float32, shape=(4, 3)):
  mesh = submesh((4,), ("i",))
  x = jax.device_put(jnp.zeros(shape, dtype), NamedSharding(mesh, P("i")))
  return jax.shard_map(fn, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x)


def test_unknown_op_lists_ops():
  with pytest.raises(ValueError, match=r"op='prod'.*\('sum', 'mean', 'max', 'min'\)"):
    _run(lambda b: all_reduce(b, "i", op="prod"))
  assert OPS == ("sum", "mean", "max", "min")


def test_unknown_algorithm_lists_algorithms():
  with pytest.raises(ValueError, match=r"algorithm='butterfly'.*'ring'"):
    _run(lambda b: all_reduce(b, "i", algorithm="butterfly"))


def test_non_numeric_dtype():
  with pytest.raises(TypeError, match="dtype bool"):
    _run(lambda b: all_reduce(b, "i"), dtype=jnp.bool_)


def test_integer_mean():
  with pytest.raises(TypeError, match=r"op=.mean.*integer"):
    _run(lambda b: all_reduce(b, "i", op="mean"), dtype=jnp.int32)


def test_unbound_axis_name_names_the_bound_ones():
  with pytest.raises(ValueError, match=r"axis_name 'j' is not bound.*\('i',\)"):
    _run(lambda b: all_reduce(b, "j"))


def test_axis_name_outside_shard_map():
  with pytest.raises(ValueError, match="not bound"):
    all_reduce(jnp.ones(3), "i")


def test_malformed_axis_name():
  with pytest.raises(TypeError, match="axis_name=3"):
    _run(lambda b: all_reduce(b, 3))


@pytest.mark.parametrize("axis_name", ["i", ("i",)])
def test_hierarchical_needs_two_axes(axis_name):
  with pytest.raises(ValueError, match=r"hierarchical.*tuple of at least 2 mesh axis names"):
    _run(lambda b: all_reduce(b, axis_name, algorithm="hierarchical"))


@pytest.mark.parametrize("bucket_bytes", [-1, 1.5, "4MiB", True])
def test_bad_bucket_bytes(bucket_bytes):
  with pytest.raises(ValueError, match="bucket_bytes"):
    _run(lambda b: all_reduce_tree({"a": b}, "i", bucket_bytes=bucket_bytes)["a"])


def test_registry_is_complete():
  expected = {
    "ring", "bidirectional_ring", "tree", "recursive_doubling", "halving_doubling",
    "naive", "hierarchical", "psum",
  }  # fmt: skip
  assert expected <= set(ALGORITHMS)
