"""experiments/mpi_peer/tables.py: the best peer over the best hand-written algorithm is
taken within the same launch (one launch per Open MPI algorithm forced), not across a run's
launches; cells take the median of a run's launches."""

from __future__ import annotations

from pathlib import Path

import pytest
import study_script

tables = study_script.load(Path(__file__).parents[1] / "experiments" / "mpi_peer" / "tables.py")


def _row(algorithm: str, seconds: float, launch: str, mpi: str | None = None) -> dict:
  return {"algorithm": algorithm, "mpi_algorithm": mpi, "bytes": 1 << 20,
          "time_us": seconds * 1e6, "run": launch.split("_alg")[0], "launch": launch}  # fmt: skip


def test_the_peer_is_paired_with_the_hand_written_algorithm_of_its_own_launch():
  # run1: three launches; Open MPI's ring ran only in alg4's, where the ring took 1.1 s
  data = [
    _row("ring", 1.0, "run1_alg0"), _row("psum", 1.5, "run1_alg0"),
    _row("ring", 1.0, "run1_alg3"), _row("psum", 1.5, "run1_alg3"),
    _row("ring", 1.1, "run1_alg4"), _row("psum", 1.5, "run1_alg4"),
    _row("mpi", 1.2, "run1_alg4", "ring"),
  ]  # fmt: skip
  assert tables.times(data)[("ring", 1 << 20)] == {"run1": 1.0}  # median of the 3 launches
  own, peer, ratios = tables.best_ratio(data, 1 << 20)
  assert (own, peer) == ("ring", "mpi(ring)")
  assert ratios == [pytest.approx(1.2 / 1.1)]  # not 1.2 / 1.0 across launches


def test_a_peer_in_every_launch_takes_the_median_of_the_per_launch_ratios():
  # the ring is slowed in one launch (a slow MPI algorithm's skew): its ratio is one of three
  data = [_row("ring", t, f"run2_alg{a}") for a, t in ((0, 1.0), (3, 2.0), (5, 1.0))]
  data += [_row("psum", t, f"run2_alg{a}") for a, t in ((0, 1.1), (3, 1.0), (5, 1.2))]
  _, peer, ratios = tables.best_ratio(data, 1 << 20)
  assert peer == "psum" and ratios == [pytest.approx(1.1)]  # median of 1.1, 0.5, 1.2


def test_a_run_with_launches_in_blocks_takes_those_only():
  # psum after a slow algorithm in round robin (0.40 s); in blocks 0.31 s
  data = [_row("ring", 0.33, "run1_alg0"), _row("psum", 0.40, "run1_alg0")]
  data += [
    {**_row(a, t, "run1_alg5"), "order": "blocks"} for a, t in (("ring", 0.34), ("psum", 0.31))
  ]
  assert tables.times(data)[("psum", 1 << 20)] == {"run1": 0.31}
  assert tables.best_ratio(data, 1 << 20) == ("ring", "psum", [pytest.approx(0.31 / 0.34)])


def test_settings_shares_are_the_ring_bound_over_the_time_and_ratios_stay_in_their_launch():
  # p = 4 at 25 MB/s: the ring's bound for 1 MiB is 1.5 MiB / 25e6 s; two launches of run1
  key = '{"network": {"link_Bps": 25000000.0}}'
  bound = 1.5 * (1 << 20) / 25e6
  data = [
    {**_row(a, t, launch), "n_devices": 4, "key": key}
    for a, t, launch in (("ring", bound, "run1_alg0"), ("halving_doubling", 2 * bound, "run1_alg0"),
                         ("ring", 2 * bound, "run1_alg4"), ("halving_doubling", 3 * bound, "run1_alg4"))
  ]  # fmt: skip
  share, ratio = tables._shares(data)
  assert share[("ring", 1 << 20)] == [pytest.approx(1 / 1.5)]  # the median launch: 1.5 bounds
  assert share[("halving_doubling", 1 << 20)] == [pytest.approx(1 / 2.5)]
  assert ratio[("halving_doubling", 1 << 20)] == [pytest.approx(1.75)]  # median of 2 and 1.5
