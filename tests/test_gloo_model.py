"""What the wire taught the replay (:mod:`allreduce_jax.gloo_model`), against closed forms."""

import pytest

from allreduce_jax import cost_model, gloo_model, topology

N = 16 << 20


@pytest.mark.parametrize("p", [2, 4, 8])
def test_schedule_bytes_c1_ring_near_2n_and_c2_root_carries_p_minus_1_n(p):
  ring = gloo_model.schedule_bytes("ring", p, N)
  assert ring == pytest.approx([2 * (p - 1) / p * N] * p)
  naive = gloo_model.schedule_bytes("naive", p, N)
  assert naive[0] == pytest.approx((p - 1) * N)  # the root sends every result back
  assert naive[1:] == pytest.approx([N] * (p - 1))


def test_half_duplex_doubles_an_exchange_and_leaves_a_shift_alone():
  shift = [[(j, (j + 1) % 4, 0.25, True) for j in range(4)]]
  assert gloo_model.half_duplex(shift) == shift
  pairs = [[(j, j ^ 1, 0.5, True) for j in range(4)]]
  assert gloo_model.half_duplex(pairs) == [[(j, j ^ 1, 1.0, True) for j in range(4)]]


def test_payload_share_is_tcp_segments_in_ethernet_frames():
  assert gloo_model.payload_share() == pytest.approx(1448 / 1514)
  assert gloo_model.payload_share(9000) == pytest.approx(8948 / 9014)
  assert gloo_model.link_params(25e6, 1e-3, 9000).beta == pytest.approx(9014 / 8948 / 25e6)
  with pytest.raises(ValueError, match="mtu=40"):
    gloo_model.payload_share(40)


def test_half_duplex_prices_halving_doubling_at_twice_the_ring_on_one_link_hosts():
  params = gloo_model.link_params(25e6, 0.0)
  top = gloo_model.emulated("switch")
  ring = gloo_model.predict_seconds("ring", 4, N, params, top)
  assert ring == pytest.approx(2 * 3 / 4 * N / 25e6 * 1514 / 1448)
  assert gloo_model.predict_seconds("halving_doubling", 4, N, params, top, "full") == pytest.approx(
    ring
  )
  assert gloo_model.predict_seconds("halving_doubling", 4, N, params, top) == pytest.approx(
    2 * ring
  )
  # full duplex is exactly the replay's own prediction
  full = topology.predict_seconds("recursive_doubling", 8, N, params, top)
  assert gloo_model.predict_seconds(
    "recursive_doubling", 8, N, params, top, "full"
  ) == pytest.approx(full)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_one_ppermute_at_a_time_prices_the_bidirectional_ring_as_two_shifts_in_turn(p):
  """Its two lanes run one after the other (XLA:CPU serializes collectives), each a
  shift at full duplex: the ring's n·2(p-1)/p·β with twice the ring's steps, not the
  exchange between neighbours that one step of both lanes would be (2x at half duplex)."""
  steps = gloo_model.ppermute_steps("bidirectional_ring", (p,), N)
  assert len(steps) == 4 * (p - 1)
  beta = gloo_model.link_params(25e6, 0.0)
  top = gloo_model.emulated("switch")
  ring = 2 * (p - 1) / p * N * beta.beta
  bidir = gloo_model.predict_seconds("bidirectional_ring", p, N, beta, top)
  assert bidir == pytest.approx(ring if p > 2 else 2 * ring)  # p = 2: each lane is an exchange
  alpha = gloo_model.predict_seconds("bidirectional_ring", p, N, cost_model.Params(1e-3, 0), top)
  assert alpha == pytest.approx(4 * (p - 1) * 1e-3)


def test_double_tree_ppermutes_are_its_plan():
  from allreduce_jax import _dbtree

  for p, k in [(5, 1), (8, 4)]:
    steps = _dbtree.double_binary_tree_ppermutes((p,), chunks=k)
    perms = [perm for rnd in _dbtree.plan(p, k) for perm in rnd]
    assert [len(s) for s in steps] == [len(perm) for perm in perms]
    for s in steps:  # each a partial permutation: one send and one receive at most a host
      assert len({m[0] for m in s}) == len(s) == len({m[1] for m in s})
    # the same transfers as the round-grouped generator
    flat = sorted(m for s in steps for m in s)
    assert flat == sorted(m for s in _dbtree.double_binary_tree_messages((p,), chunks=k) for m in s)


def test_emulated_switch_has_one_link_per_host():
  assert gloo_model.emulated("switch") == topology.switch(1)
  assert gloo_model.emulated("torus:8") == topology.parse("torus:8")
  with pytest.raises(ValueError, match="duplex='both'"):
    gloo_model.predict_seconds("ring", 4, N, cost_model.Params(0, 1e-9), duplex="both")
