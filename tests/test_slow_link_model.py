"""The replay with one slow host link, against closed forms: the ring's time with the slow
link's bandwidth term, the cut bound n/r, and bad input named."""

import itertools

import numpy as np
import pytest

from allreduce_jax import cost_model, gloo_model, topology

N = 4 << 20
RATE = 25e6  # bytes/s, 200 Mbit/s
SHARE = gloo_model.payload_share()


@pytest.mark.parametrize("p", [4, 8])
@pytest.mark.parametrize("slow", [0.5, 0.1, 0.01])
def test_ring_on_a_switch_takes_the_slow_links_bandwidth_term(p, slow):
  # The ring's 2(p-1) shifts each move n/p through every link, the slow one included, in
  # both directions at once: 2(p-1)·α + 2(p-1)/p·n / (slow rate · payload share).
  alpha = 1.3e-3
  t = gloo_model.emulated_seconds(
    "ring", p, N, "switch", rate=RATE, alpha=alpha, link_rates={1: slow * RATE}
  )
  assert t == pytest.approx(2 * (p - 1) * alpha + 2 * (p - 1) / p * N / (slow * RATE * SHARE))
  healthy = gloo_model.emulated_seconds("ring", p, N, "switch", rate=RATE, alpha=0.0)
  assert healthy == pytest.approx(2 * (p - 1) / p * N / (RATE * SHARE))


def test_a_fat_trees_slow_host_link_prices_as_on_the_switch():
  # Non-blocking fat tree (2 hosts a leaf, 1:1): its host links are the bottleneck, as on
  # the switch; the ring crosses host 1's link with 2(p-1)/p·n each way.
  params = cost_model.Params(0.0, 1.0 / RATE, 0.0)
  net = topology.with_link_rates(topology.fat_tree(2, 1.0), {1: 0.1}, p=4)
  t = gloo_model.predict_seconds("ring", 4, N, params, net)
  assert t == pytest.approx(1.5 * N / (0.1 * RATE))
  assert [lk.rate for lk in net.links(4)][:4] == [1.0, 0.1, 1.0, 1.0]


def test_a_ring_of_links_slows_both_links_of_the_host():
  # torus:8, host 1 at 1/10: links 0-1 and 1-2 run at 1/10 (each at its slower end's rate,
  # as cluster --fault shapes both ends); the ring's shifts cross 0->1 and 1->2.
  params = cost_model.Params(0.0, 1.0 / RATE, 0.0)
  net = topology.with_link_rates(topology.torus(8), {1: 0.1}, p=8)
  assert [lk.rate for lk in net.links(8)][:3] == [0.1, 1.0, 0.1]
  t = gloo_model.predict_seconds("ring", 8, N, params, net)
  assert t == pytest.approx(2 * 7 / 8 * N / (0.1 * RATE))
  # Two links around the slow host: the cut bound is half the switch's.
  both = gloo_model.cut_bound_seconds(N, 4, rate=RATE, link_rates={1: RATE / 10}, network="torus:4")
  assert both == pytest.approx(N / (2 * RATE / 10 * SHARE))


@pytest.mark.parametrize("spec", ["switch:1", "switch:2", "fat_tree:4:2", "torus:8", "torus:4x4",
                                  "torus:2x3x2"])  # fmt: skip
def test_routes_over_the_links_rates_carry_the_replayed_loads(spec):
  """With two hosts slowed, every message routed over ``links`` (its load divided by each
  link's rate) gives the loads ``link_loads`` replays: the emulation's network and the
  replay's agree link by link."""
  net = topology.with_link_rates(topology.parse(spec), {1: 0.1, 5: 0.5})
  p = net.capacity() or 12
  rng = np.random.default_rng(1)
  src = rng.integers(0, p, 60)
  dst = (src + rng.integers(1, p, 60)) % p
  frac = rng.random(60)
  rate = {}
  for link in net.links(p):
    rate[link.a, link.b] = rate[link.b, link.a] = link.rate
  load: dict = {}
  for s, d, f in zip(src.tolist(), dst.tolist(), frac.tolist()):
    for a, b in itertools.pairwise(net.route(s, d, p)):
      load[a, b] = load.get((a, b), 0.0) + f / rate[a, b]
  model = net.fit(p).link_loads(src, dst, frac)
  want = sorted(round(float(v), 9) for arr in model.values() for v in np.ravel(arr) if v > 1e-12)
  assert sorted(round(v, 9) for v in load.values()) == want
  assert min(rate.values()) < max(rate.values())  # the slowed links are there


def test_the_flat_switch_prices_a_message_at_its_slower_end():
  params = cost_model.Params(0.0, 1.0 / RATE, 0.0)
  net = topology.with_link_rates(topology.switch(), {1: 0.25})
  steps = [[(0, 1, 1.0)], [(2, 3, 1.0)]]
  assert topology.profile(steps, net, 4).seconds(N, params).tolist() == pytest.approx(
    [N / (0.25 * RATE), N / RATE]
  )


@pytest.mark.parametrize("slow", [1.0, 0.5, 0.1])
def test_cut_bound_is_n_over_the_slowest_link(slow):
  bound = gloo_model.cut_bound_seconds(N, 4, rate=RATE, link_rates={1: slow * RATE})
  assert bound == pytest.approx(N / (slow * RATE * SHARE))
  # The ring moves 2(p-1)/p·n through that link: 1.5 × the bound at p = 4 (α = 0).
  ring = gloo_model.emulated_seconds(
    "ring", 4, N, "switch", rate=RATE, alpha=0.0, link_rates={1: slow * RATE}
  )
  assert ring / bound == pytest.approx(1.5)
  # No algorithm the replay knows beats the bound.
  for alg in ("bidirectional_ring", "tree", "halving_doubling", "naive"):
    t = gloo_model.emulated_seconds(
      alg, 4, N, "switch", rate=RATE, alpha=0.0, link_rates={1: slow * RATE}
    )
    assert t >= bound * (1 - 1e-9), alg


def test_auto_told_the_rates_picks_by_the_replay():
  params = gloo_model.link_params(RATE, 0.5e-3)
  net = gloo_model.emulated_network("switch", 4, rate=RATE, link_rates={1: 0.1 * RATE})
  cands = ("ring", "tree", "halving_doubling", "naive")
  with cost_model.use_topology(net, duplex="half"):
    pick = gloo_model.choose(
      4, N, params, cands, topology=cost_model.current_topology(),
      duplex=cost_model.current_duplex(),
    )  # fmt: skip
  times = {a: gloo_model.predict_seconds(a, 4, N, params, net, "half") for a in cands}
  assert pick == min(times, key=times.get)
  assert cost_model.current_duplex() == "full"
  with pytest.raises(ValueError, match="duplex='both'"):
    with cost_model.use_topology(net, duplex="both"):
      pass


@pytest.mark.parametrize(
  ("rates", "message"),
  [
    ({9: 1e6}, r"^link_rates: host 9 is not one of the hosts \(0\.\.3\)\.$"),
    ({1: 0.0}, r"^link_rates: host 1's rate 0\.0 is not bytes/s > 0\.$"),
    ({1: -5e6}, r"^link_rates: host 1's rate -5000000\.0 is not bytes/s > 0\.$"),
  ],
)
def test_bad_link_rates_are_one_line_naming_the_argument(rates, message):
  with pytest.raises(ValueError, match=message):
    gloo_model.emulated_seconds("ring", 4, N, "switch", rate=RATE, alpha=0.0, link_rates=rates)


def test_with_link_rates_refuses_what_it_cannot_price():
  with pytest.raises(ValueError, match=r"^rates: host 4 is not one of the hosts"):
    topology.with_link_rates(topology.switch(1), {4: 0.5}, p=4)
  with pytest.raises(ValueError, match=r"^rates: host 1's rate nan is not a fraction > 0\.$"):
    topology.with_link_rates(topology.switch(1), {1: float("nan")})
  isl = topology.parse("islands:2:nvlink4:ib_ndr")
  with pytest.raises(ValueError, match=r"^net='islands:2:nvlink4:ib_ndr': per-host link rates"):
    topology.with_link_rates(isl, {1: 0.5})


def test_auto_traced_with_the_rates_and_half_duplex_compiles_to_the_replayed_pick():
  # 8 hosts, host 1 at 1/10, 4 MiB: the half-duplex replay (XLA:CPU over gloo) picks the
  # ring, the full-duplex one halving-doubling; auto traced inside use_topology(..., duplex=)
  # compiles to the pick of the duplex it was told.
  from allreduce_jax import hlo

  params = gloo_model.link_params(RATE, 0.5e-3)
  net = gloo_model.emulated_network("switch", 8, rate=RATE, link_rates={1: RATE / 10})
  n = 1 << 20  # float32 elements: 4 MiB
  picks = {d: gloo_model.choose(8, 4 * n, params, topology=net, duplex=d) for d in ("half", "full")}
  assert picks["half"] != picks["full"]
  for duplex, pick in picks.items():
    with cost_model.use_params(params), cost_model.use_topology(net, duplex=duplex):
      got = hlo.audit_all_reduce("auto", 8, n)
    want = hlo.audit_all_reduce(pick, 8, n)
    assert (got.permutes, got.max_sent_bytes) == (want.permutes, want.max_sent_bytes), duplex
