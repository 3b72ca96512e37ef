"""What the wire taught the replay (:mod:`allreduce_jax.gloo_model`), against closed forms."""

import numpy as np
import pytest

from allreduce_jax import cost_model, gloo_model, netns, networks, topology

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
  assert topology.half_duplex(shift) == shift
  pairs = [[(j, j ^ 1, 0.5, True) for j in range(4)]]
  assert topology.half_duplex(pairs) == [[(j, j ^ 1, 1.0, True) for j in range(4)]]


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
def test_receive_first_prices_exchanges_at_full_duplex_one_ppermute_at_a_time(p):
  """``duplex="recv_first"``: XLA with each receive posted first. Exchanges at full
  duplex (halving-doubling back to the ring's bytes, half its time at "half"); a shift
  unchanged; the bidirectional ring's lanes still one after the other, unlike "full"
  (where, on a ring of links, they run at once)."""
  params = gloo_model.link_params(25e6, 0.0)
  top = gloo_model.emulated("switch")
  ring_s = 2 * (p - 1) / p * N * params.beta
  for alg in ("halving_doubling", "recursive_doubling", "swing"):
    half = gloo_model.predict_seconds(alg, p, N, params, top)
    first = gloo_model.predict_seconds(alg, p, N, params, top, "recv_first")
    assert first == pytest.approx(half / 2)  # every step of these is an exchange
  hd = gloo_model.predict_seconds("halving_doubling", p, N, params, top, "recv_first")
  assert hd == pytest.approx(ring_s)
  ring = gloo_model.predict_seconds("ring", p, N, params, top, "recv_first")
  assert ring == pytest.approx(ring_s)  # p = 2: half duplex would be twice this
  ring_of_links = gloo_model.emulated(f"torus:{p}")
  for net in (top, ring_of_links):
    bidir = gloo_model.predict_seconds("bidirectional_ring", p, N, params, net, "recv_first")
    assert bidir == pytest.approx(ring_s)
  full = gloo_model.predict_seconds("bidirectional_ring", p, N, params, ring_of_links, "full")
  assert full == pytest.approx(ring_s / 2 if p > 2 else ring_s)  # p = 2: one link each way
  alpha = cost_model.Params(1e-3, 0.0)
  steps = len(topology.messages("halving_doubling", (p,), N, duplex="recv_first"))
  hd_alpha = gloo_model.predict_seconds("halving_doubling", p, N, alpha, top, "recv_first")
  assert hd_alpha == pytest.approx(steps * 1e-3)
  with pytest.raises(ValueError, match=r"duplex='both'.*'half', 'recv_first', 'full'"):
    gloo_model.predict_seconds("ring", p, N, params, top, "both")


@pytest.mark.parametrize("p", [2, 4, 8])
def test_one_ppermute_at_a_time_prices_the_bidirectional_ring_as_two_shifts_in_turn(p):
  """Its two lanes run one after the other (XLA:CPU serializes collectives), each a
  shift at full duplex: the ring's n·2(p-1)/p·β with twice the ring's steps, not the
  exchange between neighbours that one step of both lanes would be (2x at half duplex)."""
  steps = topology.messages("bidirectional_ring", (p,), N, duplex="recv_first")
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


# Each link a token bucket (tc's tbf): ``bucket_s`` seconds of its rate pass at once.
RATE = 25e6  # bytes/s: 200 Mbit/s, cluster --link's default
BETA = gloo_model.link_params(RATE, 0.0).beta


@pytest.mark.parametrize("net", ["switch", "fat_tree:4:2", "torus:8"])
@pytest.mark.parametrize("alg", ["ring", "halving_doubling", "double_binary_tree", "naive"])
def test_a_bucket_of_zero_is_the_replay_without_one(net, alg):
  params, top = gloo_model.link_params(RATE, 1.3e-3), gloo_model.emulated(net)
  plain = gloo_model.predict_seconds(alg, 8, N, params, top)
  steps = topology.messages(alg, topology.axis_sizes(alg, 8, top), N, duplex="half")
  per = gloo_model.bucket_replay(steps, top, 8, N, params, 0.0)
  assert per.sum() == pytest.approx(plain)
  assert per == pytest.approx(topology.profile(steps, top, 8).seconds(N, params))


@pytest.mark.parametrize("p", [4, 8])
def test_the_ring_saves_one_bucket_and_pays_one_alpha_when_its_steps_outlast_the_bucket(p):
  """Each of the ring's 2(p-1) shifts owes T = n/p·β on every host link; α < B < T.
  The first step finds the buckets full (T - B of data), every later one only the α it
  just spent (T - α): α + (T - B) + (2(p-1) - 1)·T = 2(p-1)·T + α - B in all."""
  alpha, bucket = 1e-3, 4e-3
  t = N / p * BETA
  got = gloo_model.predict_seconds(
    "ring", p, N, gloo_model.link_params(RATE, alpha), gloo_model.emulated("switch"),
    bucket_s=bucket,
  )  # fmt: skip
  assert got == pytest.approx(2 * (p - 1) * t + alpha - bucket)


@pytest.mark.parametrize("alg", ["ring", "recursive_doubling", "halving_doubling"])
def test_an_exchanges_turns_each_find_a_full_bucket(alg):
  """On 2 hosts every step is an exchange, its two directions in turn: each turn owes
  T = (its message)·β on its own link, and the link of the second turn was idle while
  the first sent (T > B), so each turn passes a full bucket: α + 2(T - B) a step. The
  ring (2 steps of n/2), recursive doubling (1 step of n) and halving-doubling (n/2 then
  n/2) on one link each way: 2α + 2(nβ - 2B); recursive doubling's single step of n,
  α + 2(nβ - B). Merged into one step each (both directions at once on both links), only
  the first step would find full buckets and the second only its α back: 2nβ + α - B."""
  alpha, bucket = 1e-3, 4e-3
  params, top = gloo_model.link_params(RATE, alpha), gloo_model.emulated("switch")
  got = gloo_model.predict_seconds(alg, 2, N, params, top, bucket_s=bucket)
  steps = 1 if alg == "recursive_doubling" else 2
  assert got == pytest.approx(steps * alpha + 2 * (N * BETA - steps * bucket))
  merged = topology.messages(alg, (2,), N, duplex="half")
  one_bucket = gloo_model.bucket_replay(merged, top, 2, N, params, bucket).sum()
  assert one_bucket == pytest.approx(2 * N * BETA + alpha - bucket)


def test_exchange_turns_split_only_steps_that_are_all_exchange():
  pairs = [(j, j ^ 1, 0.5, True) for j in range(4)]
  assert gloo_model.exchange_turns(pairs) == (
    [(0, 1, 0.5, True), (2, 3, 0.5, True)],
    [(1, 0, 0.5, True), (3, 2, 0.5, True)],
  )
  shift = [(j, (j + 1) % 4, 0.25, True) for j in range(4)]
  assert gloo_model.exchange_turns(shift) == (shift,)
  mixed = [(0, 1, 0.5, True), (1, 0, 0.5, True), (2, 3, 0.5, True)]
  assert gloo_model.exchange_turns(mixed) == tuple(topology.half_duplex([mixed]))


@pytest.mark.parametrize("net", ["switch", "fat_tree:4:2", "torus:8"])
@pytest.mark.parametrize("alg", ["halving_doubling", "swing", "double_binary_tree"])
def test_turns_with_no_bucket_are_the_merged_replay(net, alg):
  """The turns change only what the buckets pass: at ``bucket_s = 0`` each exchange's two
  turns cost what :func:`half_duplex`'s merged step costs (same messages, one after the
  other on disjoint links)."""
  params, top = gloo_model.link_params(RATE, 1.3e-3), gloo_model.emulated(net)
  sizes = topology.axis_sizes(alg, 8, top)
  merged = topology.messages(alg, sizes, N, duplex="half")
  posted = topology.messages(alg, sizes, N, duplex="recv_first")
  per = gloo_model.bucket_replay(merged, top, 8, N, params, 0.0, posted)
  assert per == pytest.approx(topology.profile(merged, top, 8).seconds(N, params))
  with pytest.raises(ValueError, match="posted: 1 steps"):
    gloo_model.bucket_replay(merged, top, 8, N, params, 0.0, posted[:1])


def test_a_bucket_larger_than_every_message_leaves_only_alpha():
  params = gloo_model.link_params(RATE, 2e-3)
  n = 64 << 10  # the ring's messages: 16 and 8 KiB, under 1 ms a link; the bucket 10 s
  for p, steps in [(4, 6), (8, 14)]:
    got = gloo_model.predict_seconds(
      "ring", p, n, params, gloo_model.emulated("switch"), bucket_s=10.0
    )
    assert got == pytest.approx(steps * 2e-3)


def test_a_bucket_refills_between_small_steps_only_by_the_time_spent():
  """The ring on 4 hosts, T = 3 ms a message, α = 1 ms, B = 4 ms: step 1 is free (1 ms
  left), step 2 finds 1 + 1 = 2 ms (owes 1), steps 3-6 find α (owe 2 each)."""
  alpha, bucket = 1e-3, 4e-3
  n = 4 * 3e-3 / BETA
  top = gloo_model.emulated("switch")
  params = gloo_model.link_params(RATE, alpha)
  steps = topology.messages("ring", (4,), n, duplex="half")
  per = gloo_model.bucket_replay(steps, top, 4, n, params, bucket)
  assert per * 1e3 == pytest.approx([1, 2, 3, 3, 3, 3])
  assert gloo_model.predict_seconds("ring", 4, n, params, top, bucket_s=bucket) == pytest.approx(
    15e-3
  )


def test_a_bucket_needs_physical_links_and_seconds():
  params = gloo_model.link_params(RATE, 0.0)
  with pytest.raises(ValueError, match="physical links"):
    gloo_model.predict_seconds("ring", 4, N, params, topology.switch(), bucket_s=4e-3)
  with pytest.raises(ValueError, match="physical links"):
    gloo_model.predict_seconds(
      "ring", 4, N, params, topology.parse("islands:2:nvlink4:ib_ndr"), bucket_s=4e-3
    )
  with pytest.raises(ValueError, match="bucket_s=-1"):
    gloo_model.predict_seconds("ring", 4, N, params, gloo_model.emulated("switch"), bucket_s=-1)


def test_an_emulated_links_bucket_is_tbf_burst_over_its_rate():
  assert gloo_model.link_bucket_s(RATE) == pytest.approx(0.004)  # 100 KB at 200 Mbit/s
  assert gloo_model.link_bucket_s(1e6) == pytest.approx(65536 / 1e6)  # the 64 KiB floor
  cmd = netns._shape("ns", "dev", RATE)
  assert cmd[cmd.index("burst") + 1] == str(networks.bucket_bytes(RATE)) == "100000"
  with pytest.raises(ValueError, match="rate_bytes_per_s=0"):
    gloo_model.link_bucket_s(0)


def test_a_slowed_links_bucket_holds_64_kib_of_its_own_rate():
  """``link_buckets``: tbf's burst over each link's own rate, 4 ms at 200 Mbit/s and the
  64 KiB floor at 20 Mbit/s (26 ms), host 1's link both ways; healthy links keep 4 ms."""
  got = gloo_model.link_buckets("switch", 4, rate=RATE, link_rates={1: RATE / 10})
  slow = 65536 / (RATE / 10)
  assert got == pytest.approx([0.004, slow, 0.004, 0.004] * 2)  # in, then out
  assert gloo_model.link_buckets("switch", 4, rate=RATE) == pytest.approx([0.004] * 8)


def test_each_direction_of_a_slowed_link_passes_its_own_bucket_at_once():
  """The parameter server on 2 hosts, host 1 at 1/10: step 1 sends n up host 1's link,
  step 2 n down it. Each direction's bucket is full when its step starts, so each step
  owes T - B of data (T = 10 n β, B = 64 KiB at the slow rate): 2α + 2(T - B). A bucket of
  4 ms on every link passes only that much of the slow link's."""
  alpha, n = 1e-3, 1 << 20
  slow = {1: RATE / 10}
  t, b = 10 * n * BETA, 65536 / (RATE / 10)
  kw = dict(rate=RATE, alpha=alpha, link_rates=slow)
  own = gloo_model.emulated_seconds("naive", 2, n, "switch", buckets=True, **kw)
  assert own == pytest.approx(2 * alpha + 2 * (t - b))
  four_ms = gloo_model.emulated_seconds("naive", 2, n, "switch", bucket_s=0.004, **kw)
  assert four_ms == pytest.approx(2 * alpha + 2 * (t - 0.004))
  none = gloo_model.emulated_seconds("naive", 2, n, "switch", **kw)
  assert none == pytest.approx(2 * alpha + 2 * t)
  with pytest.raises(ValueError, match="buckets=True"):
    gloo_model.emulated_seconds("naive", 2, n, "switch", bucket_s=0.004, buckets=True, **kw)
  params, top = gloo_model.link_params(RATE, alpha), gloo_model.emulated("switch")
  with pytest.raises(ValueError, match="4 buckets where the network has 8 directed links"):
    gloo_model.predict_seconds("naive", 4, n, params, top, bucket_s=np.full(4, 0.004))


def test_the_double_trees_chunks_follow_the_parameters_in_effect_not_a_stale_cache():
  """The double binary tree picks its chunk count at trace time from the cost parameters
  in effect; the replay's caches are keyed on that choice, and a model handed a run's
  ``choices`` prices the schedule that ran whatever is in effect."""
  from allreduce_jax import _dbtree

  n, top, price = 1 << 20, gloo_model.emulated("switch"), gloo_model.link_params(RATE, 1e-3)
  guess, cpu = cost_model.DEFAULT_PARAMS, cost_model.FittedParams.from_json(cost_model.CPU_FIT)
  k_guess, k_cpu = _dbtree.choose_chunks(8, n, guess), _dbtree.choose_chunks(8, n, cpu)
  assert k_guess != k_cpu  # else this test shows nothing

  def direct(k):  # the generator itself, no cache
    steps = topology.half_duplex(_dbtree.double_binary_tree_ppermutes((8,), chunks=k))
    return float(topology.profile(steps, top, 8).seconds(n, price).sum())

  seen = {}
  for params, k in [(guess, k_guess), (cpu, k_cpu), (guess, k_guess)]:
    with cost_model.use_params(params):
      assert topology.trace_choices("double_binary_tree", 8, n) == {"chunks": k}
      seen[k] = gloo_model.predict_seconds("double_binary_tree", 8, n, price, top)
      full = topology.predict_seconds("double_binary_tree", 8, n, price, topology.switch())
    assert seen[k] == pytest.approx(direct(k))
    flat = _dbtree.double_binary_tree_messages((8,), chunks=k)
    assert full == pytest.approx(topology.predict_seconds("double_binary_tree", 8, n, price,
                                                          topology.switch(), choices={"chunks": k}))  # fmt: skip
    assert len(topology.messages("double_binary_tree", (8,), n, {"chunks": k})) == len(flat)
  with cost_model.use_params(guess):  # the run's choices win over those in effect
    ran = gloo_model.predict_seconds(
      "double_binary_tree", 8, n, price, top, choices={"chunks": k_cpu}
    )
  assert ran == pytest.approx(direct(k_cpu)) and ran != pytest.approx(direct(k_guess))
  assert topology.trace_choices("ring", 8, n) == {}


# The replay against the wire: emulated_seconds, fit_alpha, steady_step_seconds.


def _beta(mtu=1500):
  return 1 / (RATE * gloo_model.payload_share(mtu))


@pytest.mark.parametrize("p", [2, 4, 8])
def test_emulated_seconds_is_steps_alpha_plus_the_ring_bytes_at_the_payload_rate(p):
  """On 2 hosts the ring's shift is an exchange (0 → 1 and 1 → 0): twice the bytes' time."""
  alpha = 1.5e-3
  got = gloo_model.emulated_seconds("ring", p, N, "switch", rate=RATE, alpha=alpha)
  turns = 2 if p == 2 else 1
  assert got == pytest.approx(2 * (p - 1) * alpha + turns * 2 * (p - 1) / p * N * _beta())
  assert gloo_model.replay_steps("ring", p, N, "switch") == 2 * (p - 1)
  # jumbo frames carry a larger share of the rate as payload
  jumbo = gloo_model.emulated_seconds("ring", p, N, "switch", rate=RATE, alpha=0.0, mtu=9000)
  assert jumbo == pytest.approx(turns * 2 * (p - 1) / p * N * _beta(9000))


def test_emulated_seconds_halving_doubling_exchanges_take_turns_at_half_duplex():
  p, alpha = 8, 1e-3
  half = gloo_model.emulated_seconds("halving_doubling", p, N, "switch", rate=RATE, alpha=alpha)
  full = gloo_model.emulated_seconds(
    "halving_doubling", p, N, "switch", rate=RATE, alpha=alpha, duplex="full"
  )
  steps = 2 * 3  # 2 lg p
  assert gloo_model.replay_steps("halving_doubling", p, N, "switch") == steps
  assert full == pytest.approx(steps * alpha + 2 * (p - 1) / p * N * _beta())
  assert half == pytest.approx(steps * alpha + 2 * 2 * (p - 1) / p * N * _beta())
  with pytest.raises(ValueError, match="rate=0"):
    gloo_model.emulated_seconds("ring", 4, N, "switch", rate=0, alpha=0.0)


def _rows(alpha, p, net, sizes, bucket_s=0.0, noise=()):
  rows = []
  for i, (a, n) in enumerate((a, n) for a in ("ring", "halving_doubling", "tree") for n in sizes):
    t = gloo_model.emulated_seconds(a, p, n, net, rate=RATE, alpha=alpha, bucket_s=bucket_s)
    t += noise[i] if noise else 0.0
    rows.append({"algorithm": a, "bytes": n, "time_us": t * 1e6})
  return rows


@pytest.mark.parametrize("net,p", [("switch", 4), ("torus:8", 8), ("fat_tree:4:2", 8)])
def test_fit_alpha_recovers_the_alpha_that_made_the_rows(net, p):
  rows = _rows(1.2e-3, p, net, (4096, 65536, 1 << 20))
  assert gloo_model.fit_alpha(rows, p, net, rate=RATE) == pytest.approx(1.2e-3)
  bucket = gloo_model.link_bucket_s(RATE)
  rows = _rows(1.2e-3, p, net, (4096, 65536), bucket)
  got = gloo_model.fit_alpha(rows, p, net, rate=RATE, bucket_s=bucket)
  assert got == pytest.approx(1.2e-3, abs=1e-7)


def test_fit_alpha_is_least_squares_over_the_probe_sizes_only():
  """Noisy rows: α equals NumPy's least squares of (t - bytes' time) on the step counts;
  rows at other sizes (here 1 MiB, wildly off) do not count."""
  p, net = 4, "switch"
  noise = [3e-4, -2e-4, 5e-4, 1e-4, -4e-4, 2e-4]
  rows = _rows(1e-3, p, net, (4096, 65536), noise=noise)
  rows.append({"algorithm": "ring", "bytes": 1 << 20, "time_us": 1e9})
  k = np.array([gloo_model.replay_steps(r["algorithm"], p, r["bytes"], net) for r in rows[:-1]])
  b = np.array(
    [
      gloo_model.emulated_seconds(r["algorithm"], p, r["bytes"], net, rate=RATE, alpha=0.0)
      for r in rows[:-1]
    ]
  )
  t = np.array([r["time_us"] * 1e-6 for r in rows[:-1]])
  want = np.linalg.lstsq(k[:, None].astype(float), t - b, rcond=None)[0][0]
  assert gloo_model.fit_alpha(rows, p, net, rate=RATE) == pytest.approx(want)
  assert gloo_model.fit_alpha(rows[-1:], p, net, rate=RATE) == 0.0  # no probe row
  assert gloo_model.fit_alpha(rows, p, net, rate=RATE, probe_bytes=(4096,)) != pytest.approx(want)


def test_steady_step_seconds_shift_and_exchange_closed_forms():
  """Back to back, a shift's links never idle: each step's α refills α of tokens, which
  the bytes then spend, so a step takes n·β. An exchange's directions take turns, and
  each turn's links idled through the other turn: each turn starts with a full bucket,
  so α + 2(n·β − bucket)."""
  p, n, alpha = 4, 4 << 20, 1e-3
  bucket = gloo_model.link_bucket_s(RATE)
  shift = [(j, (j + 1) % p, 1.0) for j in range(p)]
  exchange = [(j, j ^ 1, 1.0) for j in range(p)]
  kw = {"rate": RATE, "alpha": alpha, "bucket_s": bucket}
  assert gloo_model.steady_step_seconds(shift, p, n, "switch", **kw) == pytest.approx(n * _beta())
  assert gloo_model.steady_step_seconds(exchange, p, n, "switch", **kw) == pytest.approx(
    alpha + 2 * (n * _beta() - bucket)
  )


def test_traced_params_accepts_shipped_fit_rows_and_names_a_foreign_one():
  params = cost_model.backend_params("cpu")
  pred = cost_model.predict_us("ring", 4, 1 << 20, params)
  row = {"kind": "bench", "algorithm": "ring", "n_devices": 4, "bytes": 1 << 20}
  assert gloo_model.traced_params([{**row, "predicted_us": pred}, {"kind": "other"}]) == params
  with pytest.raises(ValueError, match="ring row at 1048576 bytes on 4 hosts"):
    gloo_model.traced_params([{**row, "predicted_us": 2 * pred}])


def test_choose_with_each_links_bucket_is_the_argmin_of_that_replay():
  """``choose(..., bucket_s=link_buckets(...))`` picks the candidate the replay with those
  buckets prices fastest; on a 4-host ring of links with host 1 at 1/10 that is the
  bidirectional ring (each direction's 64 KiB bucket refills while the other runs), where
  the replay without buckets prices it as the ring and picks the ring (ties: ring first)."""
  net, slow = "torus:4", {1: RATE / 10}
  top = gloo_model.emulated_network(net, 4, rate=RATE, link_rates=slow)
  params = gloo_model.link_params(RATE, 0.45e-3)
  cands = ("ring", "bidirectional_ring", "tree", "halving_doubling")
  bucket = gloo_model.link_buckets(net, 4, rate=RATE, link_rates=slow)
  priced = {
    a: gloo_model.predict_seconds(a, 4, 1 << 20, params, top, bucket_s=bucket) for a in cands
  }
  got = gloo_model.choose(4, 1 << 20, params, cands, topology=top, bucket_s=bucket)
  assert got == min(priced, key=priced.get) == "bidirectional_ring"
  assert gloo_model.choose(4, 1 << 20, params, cands, topology=top) == "ring"
  with pytest.raises(ValueError, match="bucket_s prices a topology's links"):
    gloo_model.choose(4, 1 << 20, params, cands, topology=top, duplex="full", bucket_s=bucket)
