"""The step-by-step trace is decoded from the real execution; check it against the
schedule each algorithm promises."""

import itertools

import numpy as np
import pytest

from allreduce_jax import cost_model, names, trace
from allreduce_jax.devices import inner_size

CUSTOM = names(hand_written=True, priced=True)


@pytest.mark.parametrize("p", [4, 5])
@pytest.mark.parametrize("algorithm", CUSTOM)
def test_trace_ends_with_everyone_knowing_everything(algorithm, p):
  frames = trace.run_trace(algorithm, p)
  inner = inner_size(algorithm, p)
  assert len(frames) - 1 == cost_model.schedule(algorithm, p, 4 * p, inner).permutes
  assert frames[0].counts.tolist() == np.ones((p, p), int).tolist()
  assert frames[-1].known.all()
  # Knowledge only grows.
  for a, b in itertools.pairwise(frames):
    assert np.all(b.known >= a.known)


def test_ring_reduce_scatter_leaves_chunk_i_on_participant_i():
  p = 4
  frames = trace.run_trace("ring", p)
  after_rs = frames[p - 1].counts  # after p-1 steps
  assert np.array_equal(np.diag(after_rs), np.full(p, p))
  assert (after_rs[~np.eye(p, dtype=bool)] < p).all()


def test_naive_funnels_everything_through_the_root():
  p = 4
  frames = trace.run_trace("naive", p)
  for f in frames[1:p]:
    assert all(t == 0 for _, t in f.pairs)
  assert frames[p - 1].counts[0].tolist() == [p] * p
  assert (frames[p - 1].counts[1:] == 1).all()


def test_bad_sizes():
  with pytest.raises(ValueError, match="p=40"):
    trace.run_trace("ring", 40)


def test_after_a_death_counts_what_the_survivors_hold():
  ring = trace.run_trace("ring", 4)
  assert trace.after_a_death(ring[0], 2) == {"held": 0, "completable": 0, "lost": 4}
  # One step in: participant 1 holds x0 + x1 of element 0, the others their own: completable.
  assert trace.after_a_death(ring[1], 0) == {"held": 0, "completable": 1, "lost": 3}
  assert trace.after_a_death(ring[-1], 3) == {"held": 4, "completable": 0, "lost": 0}
  # The parameter server's root dies before sending the sum: every element is lost.
  naive = trace.run_trace("naive", 4)
  assert trace.after_a_death(naive[3], 0) == {"held": 0, "completable": 0, "lost": 4}
  assert trace.after_a_death(naive[3], 1) == {"held": 4, "completable": 0, "lost": 0}
  with pytest.raises(ValueError, match="dead=4"):
    trace.after_a_death(ring[0], 4)


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "naive"])
def test_docs_faults_tables_are_the_library_s(algorithm):
  """docs/faults.md's tables are generated: regenerate them with trace.failure_table."""
  from pathlib import Path

  doc = (Path(__file__).resolve().parents[1] / "docs" / "faults.md").read_text()
  assert trace.failure_table(algorithm, 4) in doc, f"regenerate {algorithm}'s table"
