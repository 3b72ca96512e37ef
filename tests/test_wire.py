"""Wire formats (``all_reduce(..., wire=...)``) and the quantize-once ``two_shot``.

References: the NumPy replay of the same arithmetic (``allreduce_jax.wire_error``,
bit for bit), the float64 sum with a stated error bound, and the compiled HLO's
``collective-permute`` payloads.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import ALGORITHMS, _wire, all_reduce, names, wire_error
from allreduce_jax.devices import mesh_for
from allreduce_jax.hlo import audit_all_reduce

LOSSY = tuple(w for w in _wire.WIRES if _wire.get(w).lossy)


def _run(algorithm, x, wire, op="sum"):
  """``x: f32[p, n]`` -> every participant's result, ``f32[p, n]``."""
  p, n = x.shape
  mesh, axis = mesh_for(algorithm, p)
  f = jax.jit(
    jax.shard_map(
      lambda b: all_reduce(b, axis, op=op, algorithm=algorithm, wire=wire),
      mesh=mesh,
      in_specs=P(axis),
      out_specs=P(axis),
    )
  )
  out = f(jax.device_put(jnp.asarray(x.reshape(-1)), NamedSharding(mesh, P(axis))))
  return np.asarray(out).reshape(p, n)


def _bound(algorithm, x, wire):
  """The stated bound on any element's error: (message steps) x u x max_e Σ_j |x_j[e]|.

  Every quantization on an element's path adds at most u times its block's absmax,
  which never exceeds the largest sum of absolute values (plus the earlier errors:
  the factor 1.01); no path holds more quantizations than the schedule has steps.
  """
  p, n = x.shape
  steps = ALGORITHMS[algorithm].schedule(p, 4.0 * n, 2).steps
  return 1.01 * steps * _wire.get(wire).unit_error * np.abs(x).sum(0).max()


@pytest.mark.parametrize("algorithm", names(hand_written=True, priced=True))
def test_int8_replicas_identical_and_error_bounded(algorithm):
  # p = 6: not a power of two (the fold) and hierarchical's 2 x 3; n = 300: a partial block.
  x = np.random.default_rng(1).standard_normal((6, 300)).astype(np.float32)
  out = _run(algorithm, x, "int8")
  assert all(np.array_equal(out[0].view(np.uint32), r.view(np.uint32)) for r in out)
  err = np.abs(out[0].astype(np.float64) - x.astype(np.float64).sum(0)).max()
  assert 0 < err <= _bound(algorithm, x, "int8")


@pytest.mark.parametrize("wire", LOSSY)
@pytest.mark.parametrize("algorithm", ["ring", "two_shot", "halving_doubling"])
def test_every_format_identical_replicas(algorithm, wire):
  x = np.random.default_rng(2).standard_normal((4, 700)).astype(np.float32)
  out = _run(algorithm, x, wire)
  assert all(np.array_equal(out[0].view(np.uint32), r.view(np.uint32)) for r in out)
  err = np.abs(out[0].astype(np.float64) - x.astype(np.float64).sum(0)).max()
  assert err <= _bound(algorithm, x, wire)


@pytest.mark.parametrize("wire", (None, *LOSSY))
@pytest.mark.parametrize("algorithm", wire_error.REPLAYED)
def test_matches_numpy_replay_bit_for_bit(algorithm, wire):
  # The replay is the independent statement of the arithmetic (and what p = 1024 uses).
  x = np.random.default_rng(3).standard_normal((4, 1000)).astype(np.float32)
  out = _run(algorithm, x, wire)
  assert np.array_equal(out[0], wire_error.replay(algorithm, x, wire))


def test_error_matches_the_model():
  # A NumPy model of the same quantization (16,384 normal floats, relative L2): int8 ring 8.6e-3 at
  # p = 2 and 1.45e-2 at p = 8; quantize-once ~1.0e-2 at every p. Within 20 %.
  rng = np.random.default_rng(0)
  for p, ring_model in ((2, 8.6e-3), (8, 1.45e-2)):
    x = rng.standard_normal((p, 16384)).astype(np.float32)
    ring = wire_error.relative_error(wire_error.replay("ring", x, "int8"), x)
    once = wire_error.relative_error(wire_error.replay("two_shot", x, "int8"), x)
    assert abs(ring / ring_model - 1) < 0.2
    assert abs(once / 1.0e-2 - 1) < 0.2


def test_wire_none_is_the_exact_program():
  x = np.random.default_rng(4).standard_normal((8, 333)).astype(np.float32)
  exact = _run("ring", x, None)
  assert np.array_equal(exact, _run("ring", x, wire=None))
  mesh, axis = mesh_for("ring", 8)
  ref = jax.jit(
    jax.shard_map(lambda b: all_reduce(b, axis), mesh=mesh, in_specs=P(axis), out_specs=P(axis))
  )(jax.device_put(jnp.asarray(x.reshape(-1)), NamedSharding(mesh, P(axis))))
  assert np.array_equal(exact.reshape(-1), np.asarray(ref))


def test_codec_is_a_projection_and_nan_poisons_its_block():
  x = np.random.default_rng(5).standard_normal(1000).astype(np.float32) * 1e3
  for wire in LOSSY:
    once = _wire.np_roundtrip(wire, x)
    assert np.array_equal(once, _wire.np_roundtrip(wire, once))
    jax_once = np.asarray(jax.jit(lambda v, w=wire: _wire.roundtrip(_wire.get(w), v))(x))
    assert np.array_equal(jax_once, once)
  y = x.copy()
  y[300] = np.nan
  out = _wire.np_roundtrip("int8", y)
  assert np.isnan(out[256:512]).all() and not np.isnan(out[:256]).any()
  assert np.array_equal(_wire.np_roundtrip("int8", np.zeros(7, np.float32)), np.zeros(7))


def test_refusals():
  mesh, axis = mesh_for("ring", 2)
  x = jax.device_put(jnp.ones(4), NamedSharding(mesh, P(axis)))

  def call(**kw):
    return jax.jit(
      jax.shard_map(
        lambda b: all_reduce(b, axis, **kw), mesh=mesh, in_specs=P(axis), out_specs=P(axis)
      )
    )(x)

  for op in ("max", "min"):
    with pytest.raises(ValueError, match=f"op='{op}' with wire='int8'"):
      call(op=op, wire="int8")
  with pytest.raises(ValueError, match="algorithm='psum' cannot send in wire='bf16'"):
    call(algorithm="psum", wire="bf16")
  with pytest.raises(ValueError, match="wire='int4' is not supported"):
    call(wire="int4")
  xi = jax.device_put(jnp.ones(4, jnp.int32), NamedSharding(mesh, P(axis)))
  with pytest.raises(TypeError, match="wire='int8' needs a floating-point x"):
    jax.jit(
      jax.shard_map(
        lambda b: all_reduce(b, axis, wire="int8"), mesh=mesh, in_specs=P(axis), out_specs=P(axis)
      )
    )(xi)
  assert np.array_equal(np.asarray(call(op="max", wire=None)), np.ones(4))


@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
def test_hlo_payload_bytes(algorithm):
  # Asserted on the compiled program: int8 (scales included) <= 0.26x f32, bf16 = 0.5x.
  p, n = 8, 8192
  f32 = audit_all_reduce(algorithm, p, n)
  bf16 = audit_all_reduce(algorithm, p, n, wire="bf16")
  int8 = audit_all_reduce(algorithm, p, n, wire="int8")
  assert set(f32.permute_dtypes) == {"f32"}
  assert set(bf16.permute_dtypes) == {"u16"} and set(int8.permute_dtypes) == {"s8"}
  assert bf16.max_sent_bytes / f32.max_sent_bytes == 0.5
  assert int8.max_sent_bytes / f32.max_sent_bytes <= 0.26
  assert int8.permutes == f32.permutes  # the scales travel inside the same messages
  record = ALGORITHMS[algorithm]
  assert int8.max_sent_bytes / n == pytest.approx(record.wire_bytes(p, "int8", n), rel=0.01)


def test_verify_checks_a_lossy_wire_against_its_bound():
  from allreduce_jax.tools import verify

  rows = verify.run_case("ring", 4, dtypes=("float32", "int32"), shapes=((300,),), wire="int8")
  assert {(r.op, r.dtype) for r in rows} == {("sum", "float32"), ("mean", "float32")}
  assert all(r.passed and r.replicas_identical and r.wire == "int8" for r in rows)
  assert any(not r.bit_exact for r in rows) and all(r.tolerance > 0 for r in rows)


def test_audit_tool_checks_the_narrow_payload():
  from allreduce_jax.tools.audit import audit_in_process

  (row,) = audit_in_process(4, 4096, ("two_shot",), wire="int8")
  assert row["match"] and row["payload_dtypes"] == ["s8"]
  assert row["sent_over_n"] == pytest.approx(0.254 * 2 * 3 / 4, rel=0.02)
