"""Structure from the compiled HLO: custom algorithms are collective-permutes only,
and the bytes they move match the closed-form schedule (`cost_model.schedule`)."""

import jax.numpy as jnp
import pytest

from allreduce_jax import cost_model, hlo, names
from allreduce_jax.devices import inner_size

N = 16 * 3 * 5 * 7  # float32 elements: divisible by 2p for every p below, so no padding


def _audit(algorithm, p, n=N, dtype=jnp.float32):
  inner = inner_size(algorithm, p)
  return hlo.audit_all_reduce(algorithm, p, n, dtype), inner


CUSTOM = names(hand_written=True, priced=True)


@pytest.mark.parametrize("p", [2, 3, 5, 8])
@pytest.mark.parametrize("algorithm", CUSTOM)
def test_permutes_and_bytes_match_schedule(algorithm, p):
  audit, inner = _audit(algorithm, p)
  expected = cost_model.schedule(algorithm, p, N * 4, inner)
  assert audit.counts["all-reduce"] == 0, "a hand-written algorithm must not call XLA's all-reduce"
  assert set(audit.counts) == {"collective-permute"}
  assert audit.permutes == expected.permutes
  assert audit.max_sent_bytes == expected.max_sent_bytes


def test_psum_is_one_all_reduce():
  audit, _ = _audit("psum", 8)
  assert audit.counts["all-reduce"] == 1 and audit.permutes == 0


def test_ring_traffic_per_participant_approaches_2n():
  # The bandwidth-optimal property: 2(p-1)/p·n, the same for every participant.
  for p in (2, 4, 8):
    audit, _ = _audit("ring", p)
    assert set(audit.sent_bytes.values()) == {2 * (p - 1) * N * 4 // p}


def test_schedule_hand_computed_values():
  n = 1024
  assert cost_model.schedule("ring", 4, n).max_sent_bytes == 1536  # 2·3/4·1024
  assert cost_model.schedule("recursive_doubling", 8, n).max_sent_bytes == 3 * n
  assert cost_model.schedule("recursive_doubling", 6, n).permutes == 2 + 2
  assert cost_model.schedule("halving_doubling", 6, n).max_sent_bytes == 2 * 3 / 4 * n + n
  assert cost_model.schedule("tree", 5, n).max_sent_bytes == 3 * n
  assert cost_model.schedule("naive", 5, n).max_sent_bytes == 4 * n
  assert cost_model.schedule("hierarchical", 8, n, inner=4).max_sent_bytes == 1536 + 256
