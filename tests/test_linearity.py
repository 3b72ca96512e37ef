"""An exact ``all_reduce`` (``op="sum"``/``"mean"``, ``wire=None``) is a linear map, for
every algorithm of the registry, and every participant holds the same bits.

The first five tests are mpi4jax's tests of its ``allreduce``
(``tests/collective_ops/test_allreduce.py``: ``test_allreduce_transpose_jit``,
``test_allreduce_transpose2_jit``, ``test_allreduce_vjp``;
``tests/collective_ops/test_allreduce_matvec.py``: ``test_matvec_transpose_jit``,
``test_matvec_vjp_jit``) ported onto ``all_reduce`` inside a ``jax.shard_map`` body.
Each runs the same program with ``lax.psum``/``lax.pmean`` and must agree with it, and
with the closed form: under ``check_vma=True`` the transpose of a sum over the axis
hands each participant the (invariant) cotangent, as mpi4jax's does; under
``check_vma=False`` nothing is typed and the transpose is a sum of the cotangents
(``psum``'s transpose is ``psum``). Then the same maps taken outside the body (of a
function that calls ``shard_map``), and NaN bits on every participant.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import ALGORITHMS, all_reduce
from allreduce_jax.devices import submesh

NP = 4
ALL = tuple(ALGORITHMS)
OPS = ("sum", "mean")
REFERENCE = {"sum": lax.psum, "mean": lax.pmean}
M, N = 5, 60  # mpi4jax's matvec: A is m x n, its columns split over the participants


def _layout(algorithm):
  """(mesh, axis_name, spec of a per-participant axis) for ``algorithm`` on NP devices."""
  if ALGORITHMS[algorithm].axes > 1:
    names = ("o", "i")
    return submesh((2, NP // 2), names), names, P(names)
  return submesh((NP,), ("r",)), "r", P("r")


def _reducer(algorithm, axis, op):
  if algorithm == "lax":
    return lambda t: REFERENCE[op](t, axis)
  return lambda t: all_reduce(t, axis, op=op, algorithm=algorithm)


def _data():
  k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(123), 4)
  a = np.asarray(jax.random.uniform(k1, (M, N)))
  x = np.asarray(jax.random.uniform(k2, (N,)))
  y = np.asarray(jax.random.uniform(k3, (M,)))
  vprime = np.asarray(jax.random.uniform(k4, (M,)))
  return a, x, y, vprime


@functools.cache
def _inside(algorithm, vma):
  """Every ported map taken inside the body, for ``algorithm`` and for ``lax``, as
  ``{(who, op, test): every participant's result}``: one compiled program."""
  mesh, axis, spec = _layout(algorithm)
  a, x, y, vprime = _data()
  arr = np.arange(1.0, 2 * NP + 1, dtype=np.float32)  # f32[2p]: 2 per participant

  def body(arr_b, a_b, x_b, y_r, v_r):  # arr_b: f32[2], a_b: f32[M, N/p], x_b: f32[N/p]
    ones = jnp.ones((2,), jnp.float32)  # a constant: invariant under check_vma=True
    out = {}
    for who in ("lax", algorithm):
      for op in OPS:
        f = _reducer(who, axis, op)

        def lt(c, f=f):  # mpi4jax: linear_transpose(lambda x: allreduce(x), arr)
          return jax.linear_transpose(f, arr_b)(c)[0]

        out[who, op, "transpose"] = lt(ones)
        # Transposing twice gives the map back (lt's output is per participant).
        out[who, op, "transpose2"] = jax.linear_transpose(lt, ones)(arr_b)[0]
        res, vjp_fun = jax.vjp(f, arr_b)
        out[who, op, "vjp_res"], out[who, op, "vjp"] = res, vjp_fun(ones)[0]

        def mv(xl, f=f):  # x and the columns of A distributed, the result everywhere
          return f(a_b @ xl)

        out[who, op, "matvec_transpose"] = jax.linear_transpose(mv, x_b)(y_r)[0]
        res, vjp_fun = jax.vjp(mv, x_b)
        out[who, op, "matvec_res"], out[who, op, "matvec_vjp"] = res, vjp_fun(v_r)[0]
    # Every participant's copy comes back (a leading axis of one per participant).
    return {k: v[None] for k, v in out.items()}

  f = jax.jit(
    jax.shard_map(
      body,
      mesh=mesh,
      in_specs=(spec, P(None, spec[0]), spec, P(), P()),
      out_specs=spec,
      check_vma=vma,
    )
  )
  put = lambda v, s: jax.device_put(jnp.asarray(v, jnp.float32), NamedSharding(mesh, s))  # noqa: E731
  args = (put(arr, spec), put(a, P(None, spec[0])), put(x, spec), put(y, P()), put(vprime, P()))
  return {k: np.asarray(v) for k, v in f(*args).items()}


def _check(algorithm, vma, test, want):
  """``algorithm``'s result of ``test`` equals psum's and ``want(op)`` (per participant,
  ``T[p, ...]``), and every participant of a replicated result holds the same bits."""
  got = _inside(algorithm, vma)
  for op in OPS:
    mine, ref = got[algorithm, op, test], got["lax", op, test]
    np.testing.assert_allclose(mine, ref, rtol=2e-6, atol=1e-6, err_msg=f"{op} vs lax")
    np.testing.assert_allclose(mine, want(op), rtol=2e-6, atol=1e-6, err_msg=f"{op} closed form")


def _scale(op, vma):
  """What a cotangent of ones becomes per element under the transpose: 1 typed (the
  cotangent is invariant: each input receives it once), p untyped (psum of the
  cotangents); mean divides by p."""
  s = 1.0 if vma else float(NP)
  return s / NP if op == "mean" else s


PARAMS = [pytest.param(a, v, id=f"{a}-vma{int(v)}") for a in ALL for v in (True, False)]


@pytest.mark.parametrize("algorithm, vma", PARAMS)
def test_allreduce_transpose_jit(algorithm, vma):
  _check(algorithm, vma, "transpose", lambda op: np.full((NP, 2), _scale(op, vma), np.float32))


@pytest.mark.parametrize("algorithm, vma", PARAMS)
def test_allreduce_transpose2_jit(algorithm, vma):
  # The transpose of the transpose is the all-reduce itself, typed or not.
  arr = np.arange(1.0, 2 * NP + 1, dtype=np.float32).reshape(NP, 2)
  total = arr.sum(0)

  def want(op):
    return np.broadcast_to(total / NP if op == "mean" else total, (NP, 2))

  _check(algorithm, vma, "transpose2", want)


@pytest.mark.parametrize("algorithm, vma", PARAMS)
def test_allreduce_vjp(algorithm, vma):
  arr = np.arange(1.0, 2 * NP + 1, dtype=np.float32).reshape(NP, 2)
  total = arr.sum(0)
  _check(
    algorithm,
    vma,
    "vjp_res",
    lambda op: np.broadcast_to(total / NP if op == "mean" else total, (NP, 2)),
  )
  _check(algorithm, vma, "vjp", lambda op: np.full((NP, 2), _scale(op, vma), np.float32))
  got = _inside(algorithm, vma)[algorithm, "sum", "vjp_res"]
  assert (got.view(np.uint32) == got[0].view(np.uint32)).all()  # the same bits everywhere


def _matvec_want(vec, vma, op):
  """``(A.T @ vec)`` split over the participants, scaled as the transpose scales it."""
  a = _data()[0]
  return (a.T @ vec * _scale(op, vma)).reshape(NP, N // NP)


@pytest.mark.parametrize("algorithm, vma", PARAMS)
def test_matvec_transpose_jit(algorithm, vma):
  y = _data()[2]
  _check(algorithm, vma, "matvec_transpose", lambda op: _matvec_want(y, vma, op))


@pytest.mark.parametrize("algorithm, vma", PARAMS)
def test_matvec_vjp_jit(algorithm, vma):
  a, x, _, vprime = _data()

  def want_res(op):
    return np.broadcast_to(a @ x / (NP if op == "mean" else 1), (NP, M))

  _check(algorithm, vma, "matvec_res", want_res)
  _check(algorithm, vma, "matvec_vjp", lambda op: _matvec_want(vprime, vma, op))


# ------------------------------------------------------------ outside the shard_map body


@functools.cache
def _outside(algorithm, vma, out_spec):
  """Linear maps of ``F = shard_map(all-reduce)`` taken from outside, for ``algorithm``
  and ``lax``: ``{(who, op, what): global array}``, one compiled program."""
  mesh, axis, spec = _layout(algorithm)
  out_specs = spec if out_spec == "per_participant" else P()
  x = jnp.arange(1.0, 2 * NP + 1, dtype=jnp.float32)  # f32[2p]
  ct = jnp.arange(1.0, (2 * NP if out_spec == "per_participant" else 2) + 1) * 0.5

  def program(x, ct):
    out = {}
    for who in ("lax", algorithm):
      for op in OPS:
        red = _reducer(who, axis, op)
        f = jax.shard_map(red, mesh=mesh, in_specs=spec, out_specs=out_specs, check_vma=vma)
        lt = jax.linear_transpose(f, x)
        out[who, op, "transpose"] = lt(ct)[0]
        out[who, op, "transpose2"] = jax.linear_transpose(lambda c, lt=lt: lt(c)[0], ct)(x)[0]
        res, vjp_fun = jax.vjp(f, x)
        out[who, op, "vjp_res"], out[who, op, "vjp"] = res, vjp_fun(ct)[0]
    return out

  put = lambda v, s: jax.device_put(jnp.asarray(v, jnp.float32), NamedSharding(mesh, s))  # noqa: E731
  got = jax.jit(program)(put(x, spec), put(ct, out_specs))
  return {k: np.asarray(v) for k, v in got.items()}


@pytest.mark.parametrize("out_spec", ["per_participant", "replicated"])
@pytest.mark.parametrize("algorithm, vma", PARAMS)
def test_transpose_and_vjp_outside_the_body_match_psum(algorithm, vma, out_spec):
  got = _outside(algorithm, vma, out_spec)
  x = np.arange(1.0, 2 * NP + 1, dtype=np.float32)
  for op in OPS:
    for what in ("transpose", "transpose2", "vjp_res", "vjp"):
      np.testing.assert_allclose(
        got[algorithm, op, what], got["lax", op, what], rtol=2e-6, err_msg=f"{op} {what}"
      )
    total = x.reshape(NP, 2).sum(0) / (NP if op == "mean" else 1)
    forward = np.tile(total, NP) if out_spec == "per_participant" else total
    np.testing.assert_allclose(got[algorithm, op, "vjp_res"], forward, rtol=2e-6)
    np.testing.assert_allclose(got[algorithm, op, "transpose2"], forward, rtol=2e-6)
    if out_spec == "per_participant" or vma:  # F = tile(sum of blocks): F^T = tile(sum)
      ct = np.arange(1.0, forward.shape[0] + 1, dtype=np.float32) * 0.5
      blocks = ct.reshape(-1, 2).sum(0) / (NP if op == "mean" else 1)
      np.testing.assert_allclose(got[algorithm, op, "transpose"], np.tile(blocks, NP), rtol=2e-6)


# ------------------------------------------------------------------------ identical bits


def _nan_inputs(p, n=600, seed=0):
  """``f32[p, n]``: normals, NaNs of every sign and payload, and infinities of both signs."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((p, n)).astype(np.float32)
  payload = rng.integers(0, 1 << 22, size=(p, n)).astype(np.uint32)
  sign = rng.integers(0, 2, size=(p, n)).astype(np.uint32) << 31
  nans = (np.uint32(0x7FC00000) | payload | sign).view(np.float32)
  x = np.where(rng.random((p, n)) < 0.3, nans, x)
  infs = np.where(rng.random((p, n)) < 0.5, np.inf, -np.inf).astype(np.float32)
  return np.where(rng.random((p, n)) < 0.1, infs, x).astype(np.float32)


@pytest.mark.parametrize("algorithm", ALL)
def test_every_participant_holds_the_same_bits_nans_included(algorithm):
  # The same canonical NaN everywhere while the map stays linear (above): recursive
  # doubling's partners add their two operands in opposite orders once compiled.
  for p in (NP, 5) if ALGORITHMS[algorithm].axes == 1 else (NP,):
    if ALGORITHMS[algorithm].axes > 1:
      mesh, axis, spec = _layout(algorithm)
    else:
      mesh, axis, spec = submesh((p,), ("r",)), "r", P("r")
    x = _nan_inputs(p)

    def body(b, axis=axis):  # b: f32[1, n]
      return tuple(all_reduce(b[0], axis, op=op, algorithm=algorithm)[None] for op in OPS)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
    for op, got in zip(OPS, f(jax.device_put(x, NamedSharding(mesh, spec)))):
      got = np.asarray(got)
      bits = got.view(np.uint32)
      assert (bits == bits[0]).all(), (op, p, int((bits != bits[0]).any(0).sum()))
      nan = np.isnan(got[0])
      assert nan.any() and (bits[0][nan] == 0x7FC00000).all()
