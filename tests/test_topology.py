"""Topology replay: generators equal the traced schedules, replay equals closed forms,
the reduce-scatter table at p = 64, the flat model on a switch and the two-level model on islands."""

import itertools
import math

import numpy as np
import pytest

from allreduce_jax import ALGORITHMS, cost_model, topology
from allreduce_jax.topology import Params

REPLAYABLE = [n for n, r in ALGORITHMS.items() if r.messages is not None and r.hand_written]
PRICED = [n for n, r in ALGORITHMS.items() if r.messages is not None and r.schedule is not None]


def _canon(steps, flags: bool):
  return [
    sorted(
      (int(m[0]), int(m[1]), round(float(m[2]), 12)) + ((bool(m[3]),) if flags else ()) for m in s
    )
    for s in steps
  ]


def _generate(name, sizes):
  gen = ALGORITHMS[name].messages
  return gen(sizes, n_bytes=None) if topology.takes_size(gen) else gen(sizes)


@pytest.mark.parametrize("name", REPLAYABLE)
def test_generator_equals_trace(name):
  """Every record's generator equals the schedule recorded from its real trace, at every
  p = 2..8 (pairs, bytes, step grouping; the combined flags where the generator has them)."""
  for p in range(2, 9):
    sizes, traced = topology.traced_messages(name, p)
    generated = _generate(name, sizes)
    flags = all(len(m) > 3 for s in generated for m in s)
    assert _canon(generated, flags) == _canon(traced, flags), (name, p, sizes)


@pytest.mark.parametrize("name", REPLAYABLE)
def test_ppermute_steps_equal_the_trace_one_send_a_step(name):
  """``Algorithm.ppermutes`` (else ``messages``, whose steps must then be single sends)
  equals the real trace with every send its own step, at p = 2..8: what XLA:CPU runs
  one collective at a time."""
  gen = ALGORITHMS[name].ppermutes or ALGORITHMS[name].messages
  for p in range(2, 9):
    sizes, traced = topology.traced_messages(name, p, grouped=False)
    generated = gen(sizes, n_bytes=None) if topology.takes_size(gen) else gen(sizes)
    flags = all(len(m) > 3 for s in generated for m in s)
    assert _canon(generated, flags) == _canon(traced, flags), (name, p, sizes)


def test_trace_marks_reduction_and_lanes():
  _, steps = topology.traced_messages("bidirectional_ring", 4)
  assert len(steps) == 6 and all(len(s) == 8 for s in steps)  # two lanes per step
  assert [s[0][3] for s in steps] == [True] * 3 + [False] * 3


# -- closed forms and the table at p = 64 (reduce-scatter bandwidth term in units of n·β) ---


def _rho(s):
  return sum((-2) ** i for i in range(s + 1))


def _near_first(p):  # reference generator: XOR partners, nearest first
  return [
    [(r, r ^ (1 << s), 2.0 ** -(s + 1), True) for r in range(p)] for s in range(p.bit_length() - 1)
  ]


def _swing(p):  # reference generator: r ± ρ(s)
  return [
    [
      (r, (r + _rho(s)) % p if r % 2 == 0 else (r - _rho(s)) % p, 2.0 ** -(s + 1), True)
      for r in range(p)
    ]
    for s in range(p.bit_length() - 1)
  ]


def _rs(name, p, fallback=None):
  """The reduce-scatter half of a registered generator (its first lg p / p-1 steps), or
  the reference generator while the algorithm is not registered."""
  if name not in ALGORITHMS:
    return fallback(p)
  steps = ALGORITHMS[name].messages((p,))
  return steps[: len(steps) // 2]


@pytest.mark.parametrize("p", [8, 64, 1024])
def test_closed_forms_on_a_ring(p):
  ring1d = topology.torus((p,))
  far = topology.bandwidth_term(_rs("halving_doubling", p), ring1d)
  near = topology.bandwidth_term(_rs("halving_doubling_near", p, _near_first), ring1d)
  assert far == pytest.approx(p / 3 * (1 - 1 / p**2), abs=1e-9)
  assert near == pytest.approx(math.log2(p) / 2, abs=1e-9)
  assert topology.bandwidth_term(_rs("ring", p), ring1d) == pytest.approx((p - 1) / p, abs=1e-9)


def test_reduce_scatter_table_at_64():
  """The reduce-scatter bandwidth term of ring, far- and near-first halving and Swing at
  p = 64 on a 1-D torus and a 7:1 fat tree (exact values of the replay)."""
  ring1d, tapered = topology.torus((64,)), topology.fat_tree(8, 7)
  rows = {
    "ring": _rs("ring", 64),
    "far": _rs("halving_doubling", 64),
    "near": _rs("halving_doubling_near", 64, _near_first),
    "swing": _rs("swing", 64, _swing),
  }
  got = {k: topology.bandwidth_term(v, ring1d) for k, v in rows.items()}
  assert got == pytest.approx(
    {"ring": 0.984375, "far": 21.328125, "near": 3.0, "swing": 1.546875}, abs=1e-9
  )
  got = {k: topology.bandwidth_term(v, tapered) for k, v in rows.items()}
  assert got == pytest.approx(
    {"ring": 0.984375, "far": 6.234375, "near": 1.640625, "swing": 1.8125}, abs=1e-9
  )
  # Flat α-β: every one of them is (p-1)/p.
  got = {k: topology.bandwidth_term(v, topology.switch()) for k, v in rows.items()}
  assert got == pytest.approx(dict.fromkeys(rows, 63 / 64), abs=1e-9)


@pytest.mark.parametrize("r", [1, 2, 4, 7])
def test_fat_tree_matches_reference_script(r):
  """An independent copy of the reference computation (host links 1, leaf uplinks k/r)."""

  def reference(sched, k):
    tot = 0.0
    for step in sched:
      host, up = {}, {}
      for s, t, m, _ in step:
        host[("o", s)] = host.get(("o", s), 0) + m
        host[("i", t)] = host.get(("i", t), 0) + m
        if s // k != t // k:
          up[("u", s // k)] = up.get(("u", s // k), 0) + m
          up[("d", t // k)] = up.get(("d", t // k), 0) + m
      tot += max(max(host.values()), max(up.values(), default=0) / (k / r))
    return tot

  for p, k in ((64, 8), (256, 16)):
    for sched in (_rs("halving_doubling", p), _near_first(p), _swing(p), _rs("ring", p)):
      assert topology.bandwidth_term(sched, topology.fat_tree(k, r)) == pytest.approx(
        reference(sched, k), abs=1e-9
      )


# -- switch = flat model; islands = the two-level model ---------------------------------


@pytest.mark.parametrize("name", PRICED)
def test_switch_equals_flat_model(name):
  q = cost_model.DEFAULT_PARAMS
  k = ALGORITHMS[name].axes
  for p in (2, 3, 5, 8, 12, 64):
    if k > 1 and p in (2, 3, 5):
      continue
    sizes = topology.axis_sizes(name, p)
    inner = sizes[-1] if k > 1 else None
    for n in (1e3, 1e6, 1e9):
      flat = cost_model.predict_seconds(name, p, n, q, inner=inner)
      assert topology.predict_seconds(name, p, n, q) == pytest.approx(flat, rel=0.01), (p, n)


@pytest.mark.parametrize("name", ["hierarchical", "halving_doubling", "recursive_doubling", "tree"])
def test_islands_equal_two_level_model(name):
  if ALGORITHMS[name].messages is None:
    pytest.skip(f"{name} has no message generator")
  presets = cost_model.PRESETS
  machine = cost_model.TwoLevel(presets["nvlink4"], presets["ib_ndr"], 8, 8)
  net = topology.islands(8, "nvlink4", "ib_ndr")
  for p in (16, 64, 1024):
    for n in (1e3, 1e8):
      got = topology.predict_seconds(name, p, n, presets["ib_ndr"], net)
      want = cost_model.predict_two_level_seconds(name, p, n, machine)
      assert got == pytest.approx(want, rel=1e-9), (p, n)


def test_islands_ring_differs_from_nccl_channels():
  """The closed form credits NCCL's ring with every NIC (channels); one replayed ring
  pays the one NIC its boundary message crosses, α₂ on every step."""
  presets = cost_model.PRESETS
  machine = cost_model.TwoLevel(presets["nvlink4"], presets["ib_ndr"], 8, 8)
  net = topology.islands(8, "nvlink4", "ib_ndr")
  got = topology.predict_seconds("ring", 64, 1e8, presets["ib_ndr"], net)
  assert got > 4 * cost_model.predict_two_level_seconds("ring", 64, 1e8, machine)


# -- topologies --------------------------------------------------------------------------


def test_torus_dimension_order_routing():
  t = topology.torus((4, 4))
  # (0,0) -> (2,3): dim 0 forward 2 hops (tie goes forward), dim 1 backward 1 hop (wrap).
  loads = topology.step_link_loads([(0, 11, 1.0)], t)
  assert loads["dim0+"].sum() == 2 and loads["dim1-"].sum() == 1 and loads["dim1+"].sum() == 0
  assert loads["dim0+"][0, 0] == 1 and loads["dim0+"][0, 1] == 1  # column 0, links 0->1->2
  assert loads["dim1-"][2, 0] == 1  # row 2 (routed dim 0 first), link 0 -> 3 (wrap)
  assert topology.torus((4, 4), wrap=False).hops(np.array([0]), np.array([15]))[0] == 6
  assert topology.torus((4, 4)).hops(np.array([0]), np.array([15]))[0] == 2


def test_torus_family_and_capacity():
  assert topology.even_dims(16384, 3) == (32, 32, 16)
  assert topology.torus("3d").fit(64).dims == (4, 4, 4)
  with pytest.raises(ValueError, match="does not fit"):
    topology.torus((4, 4)).fit(17)


def test_replay_terms():
  q = Params(2e-6, 1e-9, 1e-10)
  steps = ALGORITHMS["ring"].messages((8,))
  r = topology.replay(steps, topology.torus((8,), hop_latency=1e-7), 8e6, q)
  # 14 steps of α + 1 hop + n/8·β, plus γ on the 7 reduce-scatter steps.
  want = 14 * (2e-6 + 1e-7 + 1e6 * 1e-9) + 7 * 1e6 * 1e-10
  assert r.seconds == pytest.approx(want, rel=1e-12)
  assert r.max_load.tolist() == [1 / 8] * 14
  one_nic = topology.replay(
    ALGORITHMS["bidirectional_ring"].messages((8,)), topology.switch(1), 8e6, q
  )
  assert one_nic.max_load.tolist() == [1 / 8] * 14  # both lanes share the NIC


def test_parse_topologies():
  assert topology.parse("switch") == topology.switch()
  assert topology.parse("torus:16x16x16").dims == (16, 16, 16)
  assert topology.parse("torus:8x8:nowrap").wrap is False
  assert topology.parse("torus:3d").ndim == 3
  assert topology.parse("fat_tree:8:7") == topology.fat_tree(8, 7)
  isl = topology.parse("islands:8:nvlink4:ib_ndr")
  assert isl.group == 8 and isl.inter == cost_model.PRESETS["ib_ndr"]
  assert topology.parse("islands:4:3,450GB/s:5,50GB/s").intra.beta == pytest.approx(1 / 450e9)
  for bad in ("torus", "torus:16xx", "torus:4d", "fat_tree:8", "islands:8:nvlink4:warp", "mesh"):
    with pytest.raises(ValueError, match="--topology") as e:
      topology.parse(bad)
    assert "\n" not in str(e.value)


def test_choose_by_replayed_cost():
  q = Params(5e-6, 1e-10, 0.0)
  # Flat α-β ties ring and halving-doubling on bytes and prefers the fewer steps;
  # on a 1-D torus halving-doubling's far steps lose.
  assert topology.choose(64, 64 << 20, q, topology.switch(), ("ring", "halving_doubling")) == (
    "halving_doubling"
  )
  assert (
    topology.choose(64, 64 << 20, q, topology.torus((64,)), ("ring", "halving_doubling")) == "ring"
  )


def test_cost_model_choose_takes_a_topology():
  q = Params(5e-6, 1e-10, 0.0)
  pair = ("ring", "halving_doubling")
  assert cost_model.choose(64, 64 << 20, q, pair) == "halving_doubling"  # flat: fewer steps
  assert cost_model.choose(64, 64 << 20, q, pair, topology=topology.torus((64,))) == "ring"


def test_scaling_topology_cli(tmp_path):
  import json

  from allreduce_jax.cli import main

  out = tmp_path / "scaling.jsonl"
  argv = ["scaling", "--topology", "torus:2d", "--topology", "fat_tree:8:7", "--max-p", "32"]
  assert (
    main([*argv, "--sizes", "1MiB", "--algorithms", "ring,halving_doubling", "--out", str(out)])
    == 0
  )
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert {r["scenario"] for r in rows} == {"torus:2d", "fat_tree:8:7"}
  assert {r["p"] for r in rows} == {8, 16, 32} and {r["algorithm"] for r in rows} == {
    "ring",
    "halving_doubling",
  }
  assert all(r["predicted_us"] >= r["flat_us"] * (1 - 1e-9) for r in rows)  # no network beats flat
  assert out.with_suffix(".png").exists()
  for bad, arg in (("torus:16xx", "--topology"), ("fast", "--link")):
    opt = ["--topology", bad] if arg == "--topology" else ["--topology", "switch", "--link", bad]
    with pytest.raises(SystemExit, match=arg):
      main(["scaling", *opt, "--out", str(out)])
  # A schedule too big to replay is refused up front, naming it and the way out.
  with pytest.raises(SystemExit, match=r"two_shot has about \d+M messages at p=16384; .*--max-p"):
    main(["scaling", "--topology", "switch", "--algorithms", "ring,two_shot", "--out", str(out)])
  small = ["--max-p", "64", "--sizes", "1MiB", "--algorithms", "ring,two_shot"]
  assert main(["scaling", "--topology", "switch", *small, "--out", str(out)]) == 0


def test_replay_message_estimate_is_close_to_the_count():
  from allreduce_jax.tools import scaling

  for a in (*scaling.topology_algorithms(), "two_shot"):
    est = scaling.replay_messages_at(a, 512)
    true = topology.distinct_messages(
      topology.messages(a, topology.axis_sizes(a, 512, topology.switch()))
    )
    assert true <= est * 1.05 and (est <= 1.2 * true or ALGORITHMS[a].axes > 1), (a, est, true)


def test_auto_inside_use_topology_picks_the_replayed_choice():
  # On 8 participants at 16 MiB the flat model picks one algorithm and a 7:1 fat tree
  # with 2 hosts per leaf another; auto traced inside use_topology must compile to the
  # replayed choice (same collective-permute count and bytes as that algorithm).
  from allreduce_jax import cost_model, hlo
  from allreduce_jax import topology as t

  params = cost_model.Params(5e-6, 1e-9, 0.0)
  n = 1 << 22  # float32 elements: 16 MiB
  net = t.fat_tree(2, 7)
  flat = cost_model.choose(8, 4 * n, params)
  replayed = cost_model.choose(8, 4 * n, params, topology=net)
  assert flat != replayed
  with cost_model.use_params(params), cost_model.use_topology(net):
    got = hlo.audit_all_reduce("auto", 8, n)
  want = hlo.audit_all_reduce(replayed, 8, n)
  assert (got.permutes, got.max_sent_bytes) == (want.permutes, want.max_sent_bytes)
  assert cost_model.current_topology() is None  # the block is closed


# -- the declared networks: hosts, links with rates, routes (what an emulation builds) -----


@pytest.mark.parametrize(
  "spec",
  [
    "switch:1",
    "switch:2",
    "torus:8",
    "torus:4x4",
    "torus:4x4:nowrap",
    "torus:2x3x2",
    "fat_tree:4:2",
  ],
)
def test_routes_and_rates_carry_the_replayed_loads(spec):
  """Routing every message along ``route`` over ``links`` (each load divided by its link's
  rate) gives the same directed-link loads as the vectorized ``link_loads`` the replay
  uses, and on tori and fat trees ``hops`` is the route's length: two implementations of
  one network agree."""
  net = topology.parse(spec)
  p = net.capacity() or 16
  rng = np.random.default_rng(0)
  src = rng.integers(0, p, 60)
  dst = (src + rng.integers(1, p, 60)) % p
  frac = rng.random(60)
  assert net.hosts(p) == tuple(f"h{i}" for i in range(p))
  rate = {}
  for link in net.links(p):
    rate[link.a, link.b] = rate[link.b, link.a] = link.rate
  load: dict = {}
  for s, d, f in zip(src.tolist(), dst.tolist(), frac.tolist()):
    path = net.route(s, d, p)
    assert (path[0], path[-1]) == (f"h{s}", f"h{d}")
    for a, b in itertools.pairwise(path):
      load[a, b] = load.get((a, b), 0.0) + f / rate[a, b]  # KeyError: a route off the links
  model = net.fit(p).link_loads(src, dst, frac)
  want = sorted(round(float(v), 9) for arr in model.values() for v in np.ravel(arr) if v > 1e-12)
  assert sorted(round(v, 9) for v in load.values()) == want
  if not spec.startswith("switch"):
    hops = [len(net.route(s, d, p)) - 1 for s, d in zip(src.tolist(), dst.tolist())]
    assert net.fit(p).hops(src, dst).tolist() == hops


def test_a_registered_network_kind_reaches_scaling(tmp_path):
  """Adding a network spec is one ``register_spec``: parse and ``scaling --topology`` take it."""
  import json

  from allreduce_jax.cli import main

  topology.register_spec("ring", "ring:NODES", lambda rest: topology.torus((int(*rest),)))
  try:
    assert topology.parse("ring:16") == topology.torus((16,))
    with pytest.raises(ValueError, match="ring:NODES"):
      topology.parse("ring:x")
    out = tmp_path / "scaling.jsonl"
    argv = ["scaling", "--topology", "ring:16", "--max-p", "16", "--sizes", "1MiB"]
    assert main([*argv, "--algorithms", "ring,halving_doubling", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["scenario"] for r in rows} == {"torus:16"} and {r["p"] for r in rows} == {8, 16}
  finally:
    del topology.SPECS["ring"]


def test_schedule_cache_is_bounded_by_messages(monkeypatch):
  """The replay's schedule cache keeps at most ``CACHE_MESSAGES`` distinct messages
  (the newest schedule always): the notebook-06 sweep to 16384 participants ran out of
  memory when it kept 256 schedules whatever their size."""
  from allreduce_jax import replay

  monkeypatch.setattr(replay, "_GENERATED", {})
  monkeypatch.setattr(replay, "CACHE_MESSAGES", 3000)
  for p in (64, 256, 1024):  # recursive doubling: lg p steps of p distinct messages
    steps = replay.messages("recursive_doubling", (p,))
    assert steps == ALGORITHMS["recursive_doubling"].messages((p,))
    held = sum(c for _, c in replay._GENERATED.values())
    assert held <= max(3000, replay.distinct_messages(steps))
  assert list(replay._GENERATED) == [
    ("recursive_doubling", "messages", (1024,), ())
  ]  # 10240 > 3000
  assert replay.distinct_messages(ALGORITHMS["ring"].messages((1024,))) == 2 * 1024


def test_the_scale_sweep_leaves_out_quadratic_schedules():
  """``two_shot`` (p-1 shifts of p messages each way) and ``naive`` are for small p:
  not in the default ``scaling --topology`` sweep, which the others reach at 16384."""
  from allreduce_jax.tools import scaling

  swept = scaling.topology_algorithms()
  assert "two_shot" not in swept and "naive" not in swept
  assert {"ring", "swing", "double_binary_tree", "hierarchical"} <= set(swept)
  assert len(ALGORITHMS["two_shot"].messages((16,))) == 2 * 15
