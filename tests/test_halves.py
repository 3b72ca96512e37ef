"""reduce_scatter and all_gather keep all_reduce's contracts, over every record with halves.

Each is compared with ``lax.psum_scatter``/``lax.all_gather`` and a NumPy oracle on
integer-valued inputs (sums exact in any order, so bit for bit), inside typed and
untyped shard_map; composed, they are the same algorithm's all-reduce bit for bit;
their gradients are lax's, and each is the other's transpose.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import (
  ALGORITHMS,
  Algorithm,
  all_gather,
  all_reduce,
  hlo,
  names,
  reduce_scatter,
  register,
)
from allreduce_jax.devices import submesh

HALVES = names(halves=True)


def _fits(algorithm, p):
  return algorithm != "halving_doubling" or p & (p - 1) == 0


def _put(x, mesh, spec=None):
  return jax.device_put(x, NamedSharding(mesh, P("i") if spec is None else spec))


def test_the_halves_are_the_expected_records():
  assert set(HALVES) == {"ring", "bidirectional_ring", "halving_doubling", "two_shot", "psum"}
  assert not ALGORITHMS["tree"].halves


@pytest.mark.parametrize(("p", "vma"), [(1, True), (3, False), (8, True)])
def test_every_half_matches_lax_numpy_and_the_all_reduce(p, vma):
  """One program per p: every algorithm, tiled and not, another dimension; every op
  where p is small (the program stays quick to compile)."""
  mesh = submesh((p,), ("i",))
  rng = np.random.default_rng(p)
  blocks = rng.integers(-20, 20, (p, 2 * p, 3)).astype(np.float32)  # participant i: blocks[i]
  algs = [a for a in HALVES if _fits(a, p)]

  def body(b):  # b: f32[1, 2p, 3]
    b = b[0]
    out = {"lax_rs": lax.psum_scatter(b, "i", tiled=True)}
    out["lax_ag"] = lax.all_gather(out["lax_rs"], "i", tiled=True)
    out["lax_ag_axis1"] = lax.all_gather(out["lax_rs"], "i", axis=1)
    out["lax_rs_dim1"] = lax.psum_scatter(jnp.tile(b[:, :1], (1, p)), "i", scatter_dimension=1)[
      None
    ]
    for a in algs:
      rs = reduce_scatter(b, "i", algorithm=a, tiled=True)  # f32[2, 3]
      out[f"{a}/rs"] = rs
      for op in ("mean", "max", "min") if p < 8 else ():
        out[f"{a}/rs_{op}"] = reduce_scatter(b, "i", op=op, algorithm=a, tiled=True)
      out[f"{a}/ag"] = all_gather(rs, "i", algorithm=a, tiled=True)  # f32[2p, 3]
      out[f"{a}/ag_axis1"] = all_gather(rs, "i", algorithm=a, axis=1)  # f32[2, p, 3]
      # untiled along dimension 1: x.shape[1] == p
      out[f"{a}/rs_dim1"] = reduce_scatter(
        jnp.tile(b[:, :1], (1, p)), "i", algorithm=a, scatter_dimension=1
      )[None]
      for op in ("sum", "mean") if p < 8 else ("mean",):
        whole = all_reduce(b, "i", op=op, algorithm=a)
        halves = all_gather(reduce_scatter(b, "i", op=op, algorithm=a, tiled=True), "i",
                            algorithm=a, tiled=True)  # fmt: skip
        out[f"{a}/composed_{op}"] = jnp.stack([whole, halves])
    return {k: v[None] for k, v in out.items()}

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=vma))
  got = {k: np.asarray(v) for k, v in f(_put(blocks, mesh)).items()}
  total = blocks.sum(0)  # f32[2p, 3]
  oracle = {
    "rs": total.reshape(p, 2, 3),
    "rs_mean": (total / np.float32(p)).reshape(p, 2, 3),
    "rs_max": blocks.max(0).reshape(p, 2, 3),
    "rs_min": blocks.min(0).reshape(p, 2, 3),
  }
  assert np.array_equal(got["lax_rs"], oracle["rs"])
  for a in algs:
    for k, want in oracle.items() if p < 8 else [("rs", oracle["rs"])]:
      if k == "rs_mean":  # XLA may divide by p as a multiplication: within 2 ulp
        np.testing.assert_array_max_ulp(got[f"{a}/{k}"], want, maxulp=2)
      else:
        assert np.array_equal(got[f"{a}/{k}"], want), (a, k)
    assert np.array_equal(got[f"{a}/ag"], got["lax_ag"]), a
    assert np.array_equal(got[f"{a}/ag_axis1"], got["lax_ag_axis1"]), a
    assert np.array_equal(got[f"{a}/rs_dim1"], got["lax_rs_dim1"]), a
    for op in ("sum", "mean") if p < 8 else ("mean",):
      whole, halves = np.moveaxis(got[f"{a}/composed_{op}"], 1, 0)
      assert np.array_equal(whole, halves), (a, op)  # the same algorithm, bit for bit


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
def test_tuple_axes_number_participants_as_lax_does(order):
  mesh = jax.make_mesh((2, 4), ("a", "b"))
  x = np.random.default_rng(0).integers(-9, 9, (8, 16)).astype(np.float32)

  def body(b):
    b = b[0]
    out = {"lax_rs": lax.psum_scatter(b, order, tiled=True)}
    out["lax_ag"] = lax.all_gather(out["lax_rs"], order, tiled=True)
    for a in ("ring", "halving_doubling", "two_shot"):
      out[f"{a}/rs"] = reduce_scatter(b, order, algorithm=a, tiled=True)
      out[f"{a}/ag"] = all_gather(out[f"{a}/rs"], order, algorithm=a, tiled=True)
    return {k: v[None] for k, v in out.items()}

  spec = P(("a", "b"))
  got = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))(_put(x, mesh, spec))
  for a in ("ring", "halving_doubling", "two_shot"):
    assert np.array_equal(got[f"{a}/rs"], got["lax_rs"]), a
    assert np.array_equal(got[f"{a}/ag"], got["lax_ag"]), a


def _grads(fn, vma, where):
  """d/dx of sum(w · fn(x)): taken inside the body, or outside the shard_map."""
  mesh = submesh((4,), ("i",))
  x = _put(jnp.arange(32.0).reshape(4, 8) % 7 - 3, mesh)
  w = _put(jnp.arange(32.0).reshape(4, 8) % 5 - 2, mesh)

  def loss(b, v):
    y = fn(b[0])
    return jnp.sum(v[0, : y.size].reshape(y.shape) * y)

  if where == "inside":
    body = lambda b, v: jax.grad(loss)(b, v)  # noqa: E731
    return np.asarray(
      jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=vma))(
        x, w
      )
    )
  per = jax.shard_map(
    lambda b, v: loss(b, v)[None], mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=vma
  )
  return np.asarray(jax.jit(jax.grad(lambda b: per(b, w).sum()))(x))


@pytest.mark.parametrize(("vma", "where"), [(True, "inside"), (True, "outside"), (False, "inside")])
def test_gradients_are_lax_s(vma, where):
  pairs = {
    "rs": (
      lambda b: lax.psum_scatter(b, "i", tiled=True),
      lambda a: lambda b: reduce_scatter(b, "i", algorithm=a, tiled=True),
    ),
    "ag": (
      lambda b: lax.all_gather(b[:2], "i", tiled=True),
      lambda a: lambda b: all_gather(b[:2], "i", algorithm=a, tiled=True),
    ),
  }
  for name, (ref, ours) in pairs.items():
    want = _grads(ref, vma, where)
    for a in HALVES:
      assert np.array_equal(_grads(ours(a), vma, where), want), (name, a, vma, where)


@pytest.mark.parametrize("vma", [True, False])
def test_each_half_transposes_to_the_other(vma):
  mesh = submesh((4,), ("i",))
  x = _put(jnp.arange(32.0) % 9 - 4, mesh)  # 8 per participant
  ct_rs = _put(jnp.arange(8.0) - 3, mesh)  # 2 per participant: a reduce-scatter's output
  ct_ag = _put(jnp.arange(32.0) % 11 - 5, mesh)  # 8 per participant: an all-gather's

  def body(b, c_rs, c_ag):
    out = {}
    for a in HALVES:
      rs = lambda v, a=a: reduce_scatter(v, "i", algorithm=a, tiled=True)  # noqa: E731
      ag = lambda v, a=a: all_gather(v, "i", algorithm=a, tiled=True)  # noqa: E731
      (out[f"{a}/rs_t"],) = jax.linear_transpose(rs, b)(c_rs)  # f32[8]
      (out[f"{a}/ag_t"],) = jax.linear_transpose(ag, c_rs)(c_ag)  # f32[2]
      out[f"{a}/ag"] = ag(c_rs)
      out[f"{a}/rs"] = rs(c_ag)
    return out

  f = jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=vma)
  got = {k: np.asarray(v) for k, v in jax.jit(f)(x, ct_rs, ct_ag).items()}
  for a in HALVES:
    assert np.array_equal(got[f"{a}/rs_t"], got[f"{a}/ag"]), a  # RSᵀ = AG
    assert np.array_equal(got[f"{a}/ag_t"], got[f"{a}/rs"]), a  # AGᵀ = RS (sum)


@pytest.mark.parametrize("algorithm", [a for a in HALVES if ALGORITHMS[a].hand_written])
def test_the_halves_compile_to_permutes_with_half_the_bytes(algorithm):
  p, n = 8, 1024  # float32 per participant
  mesh = submesh((p,), ("i",))
  x = _put(jnp.zeros(p * n), mesh)
  for half, f in (
    ("rs", lambda b: reduce_scatter(b, "i", algorithm=algorithm, tiled=True)),
    ("ag", lambda b: all_gather(b[: n // p], "i", algorithm=algorithm, tiled=True)),
  ):
    prog = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    a = hlo.audit(hlo.compiled_text(prog, x))
    assert a.permutes > 0 and a.counts["all-reduce"] == 0, (half, a.counts)
    assert a.max_sent_bytes == (p - 1) * n * 4 // p, (half, a.max_sent_bytes)


def _run(fn, shape=(4, 4), dtype=jnp.float32):
  mesh = submesh((4,), ("i",))
  x = _put(jnp.zeros(shape, dtype), mesh)
  return jax.shard_map(fn, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x)


@pytest.mark.parametrize(
  ("fn", "error", "match"),
  [
    (lambda b: reduce_scatter(b, "i", op="prod"), ValueError, r"op='prod'.*'sum'"),
    (lambda b: reduce_scatter(b, "i", algorithm="tree"), ValueError, r"algorithm='tree'.*'ring'"),
    (lambda b: all_gather(b, "i", algorithm="nope"), ValueError, r"algorithm='nope'"),
    (lambda b: reduce_scatter(b, "j"), ValueError, r"axis_name 'j' is not bound"),
    (lambda b: reduce_scatter(b[0, :3], "i", tiled=True), ValueError, r"x.shape\[0\] = 3.*4"),
    (lambda b: reduce_scatter(b, "i", scatter_dimension=2), ValueError, "scatter_dimension=2"),
    (lambda b: all_gather(b, "i", axis=3), ValueError, "axis=3"),
    (lambda b: all_gather(b, "i", tiled=1), TypeError, "tiled=1"),
    (lambda b: reduce_scatter(b, "i", "sum"), TypeError, "keyword arguments only"),
    (lambda b: reduce_scatter(b.astype(jnp.int32), "i", op="mean"), TypeError, "integer"),
    (lambda b: reduce_scatter(b[0, 0], "i"), ValueError, "scalar"),
  ],
)
def test_bad_input_is_a_one_line_error_naming_the_argument(fn, error, match):
  with pytest.raises(error, match=match) as info:
    _run(fn)
  assert "\n" not in str(info.value)


def test_halving_doubling_halves_refuse_a_non_power_of_two():
  mesh = submesh((3,), ("i",))
  x = _put(jnp.zeros(9), mesh)
  f = jax.shard_map(lambda b: reduce_scatter(b, "i", algorithm="halving_doubling", tiled=True),
                    mesh=mesh, in_specs=P("i"), out_specs=P("i"))  # fmt: skip
  with pytest.raises(ValueError, match=r"power-of-two.*has 3.*'ring'"):
    f(x)


def test_a_record_gives_both_halves_or_neither():
  ring = ALGORITHMS["ring"]
  with pytest.raises(ValueError, match="both reduce_scatter and all_gather"):
    register(Algorithm("half", ring.fn, auto=False, reduce_scatter=ring.reduce_scatter))
  assert "half" not in ALGORITHMS
