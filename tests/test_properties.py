"""Property tests: random shapes, values, ops, algorithms and participant counts."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import ALGORITHMS, all_reduce
from allreduce_jax.devices import mesh_for


@st.composite
def cases(draw):
  algorithm = draw(st.sampled_from(sorted(ALGORITHMS)))
  p = draw(st.sampled_from([2, 3, 4, 6, 7, 8]))
  shape = tuple(draw(st.lists(st.integers(1, 9), min_size=0, max_size=3)))
  op = draw(st.sampled_from(["sum", "mean", "max", "min"]))
  dtype = draw(st.sampled_from(["float32", "int32"] if op != "mean" else ["float32"]))
  seed = draw(st.integers(0, 2**31 - 1))
  return algorithm, p, shape, op, dtype, seed


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_random_cases_match_numpy_and_lax(case):
  algorithm, p, shape, op, dtype, seed = case
  rng = np.random.default_rng(seed)
  if dtype == "int32":
    x = rng.integers(-1000, 1000, size=(p, *shape)).astype(np.int32)
  else:
    x = (rng.standard_normal((p, *shape)) * 10.0 ** rng.integers(-3, 4)).astype(np.float32)
  mesh, axis = mesh_for(algorithm, p)
  ref_fn = {"sum": jax.lax.psum, "mean": jax.lax.pmean, "max": jax.lax.pmax, "min": jax.lax.pmin}[
    op
  ]
  f = jax.jit(
    jax.shard_map(
      lambda b: (
        all_reduce(b[0], axis, op=op, algorithm=algorithm)[None],
        ref_fn(b[0], axis)[None],
      ),
      mesh=mesh,
      in_specs=P(axis),
      out_specs=P(axis),
    )
  )
  got, ref = (
    np.asarray(a) for a in f(jax.device_put(jnp.asarray(x), NamedSharding(mesh, P(axis))))
  )
  expected = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[op](
    x.astype(np.float64), axis=0
  )
  for k in range(p):
    np.testing.assert_array_equal(got[k], got[0])  # identical everywhere
  if dtype == "int32" or op in ("max", "min"):
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[0], expected.astype(x.dtype))
  else:
    scale = np.abs(x.astype(np.float64)).sum(0) / (p if op == "mean" else 1)
    tol = 2 * p * np.finfo(np.float32).eps * scale + 1e-30
    assert np.all(np.abs(got[0] - expected) <= tol)
    assert np.all(np.abs(got[0] - ref[0]) <= tol)
