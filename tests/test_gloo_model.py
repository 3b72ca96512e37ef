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


def test_half_duplex_prices_halving_doubling_at_twice_the_ring_on_one_link_hosts():
  params = gloo_model.link_params(25e6, 0.0)
  top = gloo_model.emulated("switch")
  ring = gloo_model.predict_seconds("ring", 4, N, params, top)
  assert ring == pytest.approx(2 * 3 / 4 * N / 25e6)
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


def test_emulated_switch_has_one_link_per_host():
  assert gloo_model.emulated("switch") == topology.switch(1)
  assert gloo_model.emulated("torus:8") == topology.parse("torus:8")
  with pytest.raises(ValueError, match="duplex='both'"):
    gloo_model.predict_seconds("ring", 4, N, cost_model.Params(0, 1e-9), duplex="both")
