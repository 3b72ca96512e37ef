"""The HLO audit sweep in subprocesses with their own device counts (compile-only)."""

import pytest

from allreduce_jax.tools import audit


@pytest.mark.parametrize("p", [4, 16])
def test_audit_subprocess_matches_the_model(p):
  rows = audit.audit_subprocess(p, 4096, ("ring", "naive", "hierarchical"), timeout=300)
  assert {r["algorithm"] for r in rows} == {"ring", "naive", "hierarchical"}
  for r in rows:
    assert r["p"] == p and r["match"], r
    assert r["all_reduce_ops"] == 0
  ring = next(r for r in rows if r["algorithm"] == "ring")
  naive = next(r for r in rows if r["algorithm"] == "naive")
  assert ring["permutes"] == 2 * (p - 1)
  assert ring["sent_over_n"] == pytest.approx(2 * (p - 1) / p)  # -> 2n
  assert naive["sent_over_n"] == pytest.approx(p - 1)  # the root: linear in p


def test_sweep_resumes(tmp_path):
  out = tmp_path / "audit.jsonl"
  rows = audit.sweep([2], 1024, out, algorithms=("ring",))
  assert len(rows) == 1
  assert audit.sweep([2], 1024, out, algorithms=("ring",)) == rows  # nothing re-run
