"""Swing, the double binary tree, near-first halving-doubling and the k-axis
hierarchical scheme: their structure (partners, trees, colouring), their message
generators against the traced program, their HLO against the schedule, and
exactness at the cases the registry-wide tests do not reach (explicit chunk counts,
a 3-axis mesh)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import ALGORITHMS, _comm, _dbtree, all_reduce, cost_model, hlo, topology
from allreduce_jax._comm import global_pairs
from allreduce_jax._hierarchical import hierarchical, hierarchical_messages
from allreduce_jax._near import near_first_partners
from allreduce_jax._recursive import butterfly_tables
from allreduce_jax._swing import rho, swing_partners
from allreduce_jax.devices import submesh
from allreduce_jax.tools import verify

NEW = ("swing", "double_binary_tree", "halving_doubling_near")


def test_rho_and_swing_partners():
  assert [rho(s) for s in range(7)] == [1, -1, 3, -5, 11, -21, 43]
  assert swing_partners(8) == [
    [1, 0, 3, 2, 5, 4, 7, 6],
    [7, 2, 1, 4, 3, 6, 5, 0],
    [3, 6, 5, 0, 7, 2, 1, 4],
  ]
  for p in (2, 4, 16, 256, 1024):
    partners = swing_partners(p)
    for step in partners:  # perfect matchings
      assert all(step[step[r]] == r != step[r] for r in range(p))
    butterfly_tables(p, partners)  # raises unless every step halves the groups
  with pytest.raises(ValueError, match="power of two"):
    swing_partners(6)


def test_butterfly_tables_reject_a_step_that_does_not_halve():
  bad = near_first_partners(8)
  bad[2] = bad[0]  # XOR 1 twice: the last step exchanges within a finished group
  with pytest.raises(ValueError, match="halve"):
    butterfly_tables(8, bad)


def test_near_first_keeps_big_halves_near():
  steps = ALGORITHMS["halving_doubling_near"].messages((8,))
  far = ALGORITHMS["swing"].messages((8,))
  assert [max(abs(s - t) for s, t, *_ in step) for step in steps[:3]] == [1, 2, 4]
  assert [step[0][2] for step in steps] == [0.5, 0.25, 0.125, 0.125, 0.25, 0.5]
  ring_distance = [max(min(abs(s - t), 8 - abs(s - t)) for s, t, *_ in step) for step in far[:3]]
  assert ring_distance == [1, 1, 3]  # |rho(s)|


def test_nccl_double_tree_shapes():
  # The figures of NCCL's src/graph/trees.cc: p = 12 (mirror) and p = 13 (shift).
  a, b = _dbtree.double_tree(12)
  assert a.root == 0 and a.children[0] == (8,) and a.children[8] == (4, 10)
  assert a.children[4] == (2, 6) and a.children[10] == (9, 11)
  assert b.root == 11 and b.children[11] == (3,) and set(b.children[3]) == {1, 7}
  assert set(b.children[7]) == {5, 9}
  a, b = _dbtree.double_tree(13)
  assert a.children[8] == (4, 12) and a.parent[13 - 1] == 8
  assert b.root == 1 and b.children[1] == (9,) and set(b.children[9]) == {5, 0}
  assert b.children[0] == (11,) and set(b.children[11]) == {10, 12}


@pytest.mark.parametrize("p", range(2, 34))
def test_double_tree_is_complementary_and_shallow(p):
  a, b = _dbtree.double_tree(p)
  for t in (a, b):
    assert t.height[t.root] == math.ceil(math.log2(p))
    for r in range(p):
      assert len(t.children[r]) <= 2 and all(t.parent[c] == r for c in t.children[r])
  if p % 2 == 0:  # mirror: no participant forwards in both trees
    assert not [r for r in range(p) if a.children[r] and b.children[r]]


@pytest.mark.parametrize("p", [2, 3, 5, 8, 13])
@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_plan_is_partial_permutations_with_max_degree_steps(p, k):
  rounds = _dbtree.plan(p, k)
  deg = _dbtree.degrees(p, k)
  assert len(rounds) == k + 2 * math.ceil(math.log2(p)) - 1 == deg["port"].shape[0]
  for rnd, up, down in zip(rounds, deg["up"].max(axis=1), deg["down"].max(axis=1)):
    assert len(rnd) == up + down  # König: max-degree colour classes, up and down apart
    for step in rnd:
      assert len({e.src for e in step}) == len(step) == len({e.dst for e in step})
      assert len({e.mode for e in step}) == 1
  # Every chunk of both trees goes up every non-root edge and down every edge once.
  moves = [e for rnd in rounds for step in rnd for e in step]
  assert len(moves) == 2 * 2 * (p - 1) * k


def test_double_tree_schedule_limits():
  n = 1 << 24
  s1 = _dbtree.double_binary_tree_schedule(8, n, chunks=1)
  s32 = _dbtree.double_binary_tree_schedule(8, n, chunks=32)
  assert (s1.steps, s32.steps) == (6, 37)  # k + 2*3 - 1
  assert s32.max_sent_bytes == 2 * n
  assert (s1.beta_bytes, s32.beta_bytes) == (6 * n / 2, 37 * n / 64)  # a chunk per round
  assert cost_model.schedule("tree", 8, n).beta_bytes == 6 * n
  q = cost_model.Params(alpha=100e-6, beta=1e-9, gamma=0.0)
  assert _dbtree.choose_chunks(8, 1 << 10, q) == 1  # latency-bound: no pipelining
  assert _dbtree.choose_chunks(8, 64 << 20, q) == 32  # bandwidth-bound: deep pipeline


def _run(fn, mesh, axis, x):
  spec = P(axis)
  f = jax.jit(jax.shard_map(lambda b: fn(b[0])[None], mesh=mesh, in_specs=spec, out_specs=spec))
  return np.asarray(f(jax.device_put(x, NamedSharding(mesh, spec))))


@pytest.mark.parametrize("p, k", [(5, 1), (6, 3), (7, 4), (8, 16)])
def test_double_binary_tree_explicit_chunks_is_exact(p, k):
  x = verify.verifiable_input(p, (37,), "float32")
  mesh = submesh((p,), ("i",))

  def fn(b):
    b = _comm.make_varying(b, "i")
    return _dbtree.double_binary_tree_chunks(b, "i", jnp.add, chunks=k)

  got = _run(fn, mesh, "i", x)
  for r in range(p):
    np.testing.assert_array_equal(got[r], x.sum(0))


def _canon(steps):
  return [
    sorted((int(m[0]), int(m[1]), round(float(m[2]), 12), bool(m[3])) for m in s) for s in steps
  ]


@pytest.mark.parametrize("algorithm", [*NEW, "hierarchical"])
@pytest.mark.parametrize("p", [3, 6, 8])
def test_messages_equal_the_traced_schedule(algorithm, p):
  # Pairs, bytes, step grouping (a tree round is one step) and combined flags.
  sizes, traced = topology.traced_messages(algorithm, p)
  assert _canon(ALGORITHMS[algorithm].messages(sizes)) == _canon(traced)


def test_hierarchical_messages_on_three_axes_equal_the_traced_schedule():
  mesh, axis = submesh((2, 2, 2), ("x", "y", "z")), ("x", "y", "z")
  n = 8 * 16
  spec = P(axis)
  with _comm.recording_messages() as log:
    jax.eval_shape(
      jax.shard_map(
        lambda b: hierarchical(_comm.make_varying(b[0], axis), axis, jnp.add)[None],
        mesh=mesh,
        in_specs=spec,
        out_specs=spec,
      ),
      jax.ShapeDtypeStruct((8, n), jnp.float32, sharding=NamedSharding(mesh, spec)),
    )
  traced = [
    (sorted(global_pairs(sub, pairs, axis, (2, 2, 2))), received.shape[0] / n)
    for sub, pairs, received in log
  ]
  generated = hierarchical_messages((2, 2, 2))
  assert [(sorted((s, t) for s, t, *_ in step), step[0][2]) for step in generated] == traced
  assert [step[0][3] for step in generated] == [True, True, True, False, False, False]


@pytest.mark.parametrize("p", [3, 8])
def test_hlo_with_explicit_chunks_matches_the_schedule(p):
  n = 4 * 1024  # float32 elements: divisible by 2k
  k = 4
  mesh = submesh((p,), ("i",))
  spec = P("i")

  def body(b):
    b = _comm.make_varying(b, "i")
    return _dbtree.double_binary_tree_chunks(b, "i", jnp.add, chunks=k)

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
  x = jax.ShapeDtypeStruct((p * n,), jnp.float32, sharding=NamedSharding(mesh, spec))
  audit = hlo.audit(hlo.compiled_text(f, x))
  want = _dbtree.double_binary_tree_schedule(p, 4 * n, chunks=k)
  assert set(audit.counts) == {"collective-permute"}
  assert audit.permutes == want.permutes
  assert audit.max_sent_bytes == want.max_sent_bytes


def test_hierarchical_on_three_axes_is_exact_and_matches_its_schedule():
  mesh = submesh((2, 2, 2), ("x", "y", "z"))
  axis = ("x", "y", "z")
  x = verify.verifiable_input(8, (2, 3 * 5), "float32")
  for op, ref in (("sum", x.sum(0)), ("max", x.max(0))):
    got = _run(lambda b, op=op: all_reduce(b, axis, op=op, algorithm="hierarchical"), mesh, axis, x)
    for r in range(8):
      np.testing.assert_array_equal(got[r], ref)
  n = 8 * 64  # float32 elements, no padding
  spec = P(axis)
  f = jax.jit(
    jax.shard_map(
      lambda b: hierarchical(_comm.make_varying(b, axis), axis, jnp.add),
      mesh=mesh,
      in_specs=spec,
      out_specs=spec,
    )
  )
  sds = jax.ShapeDtypeStruct((8 * n,), jnp.float32, sharding=NamedSharding(mesh, spec))
  audit = hlo.audit(hlo.compiled_text(f, sds))
  want = cost_model.schedule("hierarchical", 8, 4 * n, inner=(2, 2))
  assert audit.permutes == want.permutes == 6
  # z: RS + AG of n/2 each; y: of n/4 each; x: a ring of 2 on n/4, 2 steps of n/8.
  assert audit.max_sent_bytes == want.max_sent_bytes == 4 * n * (1 + 1 / 2 + 1 / 4)
  # Two levels through the same formula as before: (b, a) = (2, 4).
  two = cost_model.schedule("hierarchical", 8, 1024, inner=4)
  assert two == cost_model.schedule("hierarchical", 8, 1024, inner=(4,))


def test_schedules_of_the_butterflies_equal_halving_doublings():
  for p in (2, 3, 5, 8, 12, 1024):
    hd = cost_model.schedule("halving_doubling", p, 1e6)
    assert cost_model.schedule("swing", p, 1e6) == hd
    assert cost_model.schedule("halving_doubling_near", p, 1e6) == hd
