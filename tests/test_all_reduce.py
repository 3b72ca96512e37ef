"""Every algorithm against XLA's collectives: ops × dtypes × participant counts × shapes.

Inputs and comparison rules live in ``allreduce_jax.tools.verify`` (the same code behind
``allreduce-jax verify``): bit-exact on verifiable and integer inputs, 2 ulp for
``mean``, the summation bound for random floats, and identical replicas always.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import ALGORITHMS, Algorithm, all_reduce, names, register
from allreduce_jax.devices import mesh_for, submesh
from allreduce_jax.tools import verify

PARTICIPANTS = (1, 2, 3, 4, 5, 8)
SHAPES = ((), (1,), (3, 7))  # 0-d, one element, 2-D (21 elements: not divisible by 2, 4, 5, 8)


def _failures(rows):
  return [r for r in rows if not r.passed]


#: Participant counts at which only sum and max run (every dtype and input kind):
#: the schedule is the op's combine applied along the same messages, and min and mean
#: (sum, then one division) are checked at every smaller p. XLA's compile time grows
#: with the number of permutes, which is largest here.
LARGE_P = (5, 8)


#: The participant count ``make test-fast`` checks (4: the prime length 13 is padded); the
#: others are marked slow.
FAST_P = (4,)


@pytest.mark.parametrize(
  "p", [p if p in FAST_P else pytest.param(p, marks=pytest.mark.slow) for p in PARTICIPANTS]
)
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_matches_lax_collective(algorithm, p):
  # Every op (sum and max at LARGE_P) x dtype x input kind on a prime length (13:
  # padded for every p > 1); the shape sweep below runs at one participant count.
  ops = ("sum", "max") if p in LARGE_P else verify.OPS
  rows = verify.run_case(algorithm, p, ops=ops, shapes=((13,),))
  # Integer mean and integer NaN/Inf inputs are not defined: 4*3*3 float + 3*2 int,
  # and subnormal inputs for max/min of the floats: 2*3 (2*3*3 + 2*2 + 1*3 for sum, max).
  assert len(rows) == (2 * 3 * 3 + 2 * 2 + 1 * 3 if p in LARGE_P else 4 * 3 * 3 + 3 * 2 + 2 * 3)
  assert not _failures(rows), "\n".join(map(str, _failures(rows)))
  assert all(r.bit_exact for r in rows if r.kind == "verifiable" or r.dtype == "int32")


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_any_shape(algorithm):
  # Shapes are handled before the schedule, whatever the values: verifiable and random
  # inputs here (NaN, ±inf, ±0 and subnormals run on every algorithm and p above).
  kinds = ("verifiable", "random")
  rows = verify.run_case(
    algorithm, 5, dtypes=("float32", "bfloat16", "int32"), kinds=kinds, shapes=SHAPES
  )
  assert {r.shape for r in rows} == set(SHAPES) and {r.kind for r in rows} == set(kinds)
  assert not _failures(rows), "\n".join(map(str, _failures(rows)))


def test_verifiable_inputs_are_exact_in_bfloat16():
  # The premise of bit-exact comparison: no partial sum of the inputs rounds.
  x = verify.verifiable_input(8, (97,), "float32")
  assert np.abs(x).max() <= 15 and np.abs(np.cumsum(x, axis=0)).max() < 2**8
  assert np.array_equal(x, verify.verifiable_input(8, (97,), "bfloat16").astype(np.float32))


def test_rank_coding_exposes_a_misrouted_chunk():
  # A ring that forgets the rotation (everyone reduces chunk 0's schedule) must fail.
  def wrong_ring(flat, axis_name, combine):
    from allreduce_jax import _comm

    p = _comm.size(axis_name)
    rolled = jnp.roll(flat, 1)  # one element off
    return ALGORITHMS["ring"](rolled, axis_name, combine) if p > 1 else flat

  register(Algorithm("broken", wrong_ring, auto=False))  # a record, as the registry holds
  try:
    rows = verify.run_case("broken", 4, ops=("sum",), dtypes=("float32",), shapes=((13,),))
  finally:
    del ALGORITHMS["broken"]
  assert _failures(rows)


@pytest.mark.parametrize("algorithm", names(axes=1))
def test_tuple_axis_names_reduce_over_the_product(algorithm):
  mesh = submesh((2, 4), ("a", "b"))
  x = verify.verifiable_input(8, (2, 5), "float32")
  xs = jax.device_put(x, NamedSharding(mesh, P(("a", "b"))))
  for axes, expected in (
    (("a", "b"), x.sum(0)),
    (("b", "a"), x.sum(0)),
    ("b", x.reshape(2, 4, 2, 5).sum(1).repeat(4, axis=0).reshape(8, 2, 5)[0]),
  ):
    f = jax.jit(
      jax.shard_map(
        lambda b, axes=axes: all_reduce(b[0], axes, op="sum", algorithm=algorithm)[None],
        mesh=mesh,
        in_specs=P(("a", "b")),
        out_specs=P(("a", "b")),
      )
    )
    got = np.asarray(f(xs))
    ref = x.reshape(2, 4, 2, 5).sum(1) if axes == "b" else None
    for k in range(8):
      want = ref[k // 4] if axes == "b" else expected
      np.testing.assert_array_equal(got[k], want, err_msg=f"{algorithm} {axes} participant {k}")


@pytest.mark.parametrize("shape", [(2, 4), (4, 2), (1, 8), (8, 1)])
def test_hierarchical_on_every_2d_factorization(shape):
  mesh = submesh(shape, ("outer", "inner"))
  x = verify.verifiable_input(8, (11,), "float32")
  xs = jax.device_put(x, NamedSharding(mesh, P(("outer", "inner"))))
  f = jax.jit(
    jax.shard_map(
      lambda b: all_reduce(b[0], ("outer", "inner"), op="max", algorithm="hierarchical")[None],
      mesh=mesh,
      in_specs=P(("outer", "inner")),
      out_specs=P(("outer", "inner")),
    )
  )
  got = np.asarray(f(xs))
  for k in range(8):
    np.testing.assert_array_equal(got[k], x.max(0))


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_gradient_equals_gradient_through_psum(algorithm):
  mesh, axis = mesh_for(algorithm, 8)
  x = jnp.asarray(verify.random_input(8, (6,), "float32", seed=3))
  w = jnp.asarray(verify.random_input(8, (6,), "float32", seed=4))  # per-participant weights
  sharding = NamedSharding(mesh, P(axis))
  x, w = jax.device_put(x, sharding), jax.device_put(w, sharding)

  def loss(x, algo):
    y = jax.shard_map(
      lambda b: all_reduce(b[0], axis, op="sum", algorithm=algo)[None],
      mesh=mesh,
      in_specs=P(axis),
      out_specs=P(axis),
    )(x)
    return jnp.sum(jnp.sin(y) * w)  # cotangents differ per participant

  with jax.set_mesh(mesh):
    g = jax.jit(jax.grad(loss), static_argnums=1)(x, algorithm)
    g_ref = jax.jit(jax.grad(loss), static_argnums=1)(x, "psum")
  np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_results_keep_shape_and_dtype_and_work_with_check_vma_false(algorithm):
  mesh, axis = mesh_for(algorithm, 4)
  x = jax.device_put(jnp.ones((4, 2, 3), jnp.bfloat16), NamedSharding(mesh, P(axis)))
  f = jax.shard_map(
    lambda b: all_reduce(b, axis, op="mean", algorithm=algorithm),
    mesh=mesh,
    in_specs=P(axis),
    out_specs=P(),
    check_vma=False,
  )
  y = jax.jit(f)(x)
  assert y.shape == (1, 2, 3) and y.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(y, np.float32), 1.0)


#: Algorithms whose participants each hand out a reduced slice (the all-gather after a
#: reduce-scatter): the op's finish (mean's division, canonical NaNs) runs on that slice.
FINISHED_PER_SLICE = {
  "ring": [(8,)],
  "bidirectional_ring": [(4,), (4,)],  # one slice per lane
  "two_shot": [(8,)],
  "halving_doubling": [(8,)],
  "halving_doubling_near": [(8,)],
  "swing": [(8,)],
}


def _finish_shapes(monkeypatch, algorithm, axes, mesh_shape, names_, wire=None):
  """The shapes the op's finish ran on in one traced ``mean`` over 8 participants with
  64 elements each, and the result (checked against NumPy: exact, as 8 divides exactly)."""
  from allreduce_jax import _api

  seen, real = [], _api.get_op

  def spy(op, dtype):
    r = real(op, dtype)
    return dataclasses.replace(r, finalize=lambda t, p: (seen.append(t.shape), r.finalize(t, p))[1])

  monkeypatch.setattr(_api, "get_op", spy)
  mesh = submesh(mesh_shape, names_)
  x = verify.verifiable_input(8, (64,), "float32")
  x[1, 3] = np.nan  # canonical NaN bits in the result, whoever finished them
  f = jax.jit(
    jax.shard_map(
      lambda b: all_reduce(b[0], axes, op="mean", algorithm=algorithm, wire=wire)[None],
      mesh=mesh,
      in_specs=P(names_),
      out_specs=P(names_),
    )
  )
  got = np.asarray(f(jax.device_put(x, NamedSharding(mesh, P(names_)))))
  want = x.sum(0) / 8
  for k in range(8):
    if wire is None:
      np.testing.assert_array_equal(got[k], want, err_msg=f"{algorithm} participant {k}")
    assert got[k].view(np.uint32)[3] == np.float32(np.nan).view(np.uint32)
  return seen


@pytest.mark.parametrize("algorithm", sorted(set(names()) - {"hierarchical", "auto"}))
def test_the_ops_finish_runs_once_on_what_each_participant_hands_out(algorithm, monkeypatch):
  # A slice per participant where the algorithm hands finished slices out (a pass over
  # n/p elements), the whole result otherwise; never twice, never on a partial sum.
  seen = _finish_shapes(monkeypatch, algorithm, "i", (8,), ("i",))
  assert seen == FINISHED_PER_SLICE.get(algorithm, [(64,)])


def test_the_finish_stays_whole_under_a_lossy_wire_and_for_a_stage_of_a_hierarchy(monkeypatch):
  # A lossy wire finishes the decoded result; hierarchical's stages (a ring over one
  # axis of two) hold partial sums, so the finish waits for the whole result.
  assert _finish_shapes(monkeypatch, "ring", "i", (8,), ("i",), wire="bf16") == [(64,)]
  two_axes = ("outer", "inner")
  assert _finish_shapes(monkeypatch, "hierarchical", two_axes, (2, 4), two_axes) == [(64,)]
