"""Rows of an emulated cluster beside the model of its network (:mod:`allreduce_jax.cluster_rows`):
each against the replay and the cut bound computed directly."""

import json

import pytest

from allreduce_jax import cluster_rows, gloo_model, results
from allreduce_jax.tools.faults import row_links

RATE = 25e6  # the rows' link rate, as cluster --link 200Mbit writes it in their key


def _key(net="switch", hosts=4, rate=RATE, faults=()):
  network = {"network": net, "hosts": hosts, "link_Bps": rate, "queue_s": 0.1}
  if faults:
    network["faults"] = list(faults)
  return json.dumps({"jax_version": "x", "network": network})


def _row(algorithm, n, seconds, **key):
  return {"schema": results.SCHEMA, "kind": "bench", "key": _key(**key), "algorithm": algorithm,
          "bytes": n, "time_us": seconds * 1e6, "wrong": 0}  # fmt: skip


def test_a_rows_network_and_link_rate_come_from_its_key():
  row = _row("ring", 1 << 20, 0.1, net="torus:4")
  assert cluster_rows.network(row)["network"] == "torus:4"
  assert cluster_rows.network({"key": json.dumps({"jax_version": "x"})}) is None
  assert cluster_rows.link_rate([row, {"kind": "bench"}]) == RATE
  with pytest.raises(ValueError, match="one link rate"):
    cluster_rows.link_rate([row, _row("ring", 1 << 20, 0.1, rate=2 * RATE)])
  with pytest.raises(ValueError, match="one link rate"):
    cluster_rows.link_rate([{"kind": "bench"}])


def test_healthy_alpha_fits_the_networks_blocks_rows_else_the_switchs(tmp_path):
  """``fit_alpha`` on ``blocks_{network}_{hosts}.jsonl`` at the rows' own link rate, the
  switch's file where the network has none, 0 where neither exists."""

  def write(name, alpha, net, p, rate):
    rows = [
      _row(a, n, gloo_model.emulated_seconds(a, p, n, net, rate=rate, alpha=alpha), net=net,
           hosts=p, rate=rate)
      for a in ("ring", "halving_doubling", "tree") for n in (4096, 65536)
    ]  # fmt: skip
    (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

  write("blocks_switch_4.jsonl", 1e-3, "switch", 4, RATE)
  write("blocks_torus_4_4.jsonl", 2e-3, "torus:4", 4, RATE / 2)  # read at its own rate
  assert cluster_rows.healthy_alpha(tmp_path, "torus:4", 4) == pytest.approx(2e-3)
  assert cluster_rows.healthy_alpha(tmp_path, "fat_tree:2:1", 4) == pytest.approx(1e-3)
  assert cluster_rows.healthy_alpha(tmp_path, "switch", 8) == 0.0


def _alpha(net, p):
  return 1e-3


def test_link_rate_cells_set_each_steady_row_beside_its_replay_and_bound():
  slow = "link:1=20Mbit@0"
  rows = [
    _row("ring", 1 << 20, 0.9, faults=[slow]),
    _row("psum", 1 << 20, 0.8, faults=[slow]),
    _row("ring", 1 << 20, 0.9, faults=["kill:2@1"]),  # no steady network: left out
    {**_row("ring", 1 << 20, 0.9), "wrong": 3},  # a wrong result: left out
    {**_row("ring", 1 << 20, 0.9), "key": json.dumps({"jax_version": "x"})},  # not a cluster
  ]
  cells = cluster_rows.link_rate_cells(rows, row_links, _alpha)
  assert [c["algorithm"] for c in cells] == ["ring", "psum"]
  ring, psum = cells
  want = gloo_model.emulated_seconds("ring", 4, 1 << 20, "switch", rate=RATE, alpha=1e-3,
                                     link_rates={1: 2.5e6})  # fmt: skip
  assert ring["replay_s"] == pytest.approx(want)
  assert psum["replay_s"] == pytest.approx(
    gloo_model.emulated_seconds("psum", 4, 1 << 20, "switch", rate=RATE, alpha=1e-3,
                                link_rates={1: 2.5e6})
  )  # fmt: skip
  bound = gloo_model.cut_bound_seconds(1 << 20, 4, rate=RATE, link_rates={1: 2.5e6})
  assert ring["bound_s"] == psum["bound_s"] == pytest.approx(bound)
  assert ring["measured_s"] == pytest.approx(0.9) and ring["link_rates"] == {1: 2.5e6}
  buckets = cluster_rows.link_rate_cells(rows[:1], row_links, _alpha, buckets=True)[0]
  with_buckets = gloo_model.emulated_seconds("ring", 4, 1 << 20, "switch", rate=RATE,
                                             alpha=1e-3, link_rates={1: 2.5e6}, buckets=True)  # fmt: skip
  assert buckets["replay_s"] == pytest.approx(with_buckets) != pytest.approx(want)


def test_auto_picks_price_the_measured_candidates_on_the_slowed_network():
  slow = ["link:1=20Mbit@0"]
  times = {"ring": 0.9, "halving_doubling": 0.7, "tree": 0.5, "psum": 0.4}
  rows = [_row(a, 1 << 20, t, faults=slow) for a, t in times.items()]
  (pick,) = cluster_rows.auto_picks(cluster_rows.link_rate_cells(rows, row_links, _alpha), _alpha)
  top = gloo_model.emulated_network("switch", 4, rate=RATE, link_rates={1: 2.5e6})
  want = gloo_model.choose(4, 1 << 20, gloo_model.link_params(RATE, 1e-3),
                           ("ring", "tree", "halving_doubling"), topology=top)  # fmt: skip
  assert pick["pick"] == want and pick["pick_s"] == pytest.approx(times[want])
  assert (pick["best"], pick["best_candidate"]) == ("psum", "tree")
