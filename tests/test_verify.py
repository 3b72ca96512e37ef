"""NaN/±inf/±0 semantics of the ops, the NumPy oracle, and verify's backend findings.

The semantics are defined once in ``allreduce_jax._ops``; these tests pin them, check
that every hand-written algorithm follows them, and that a backend collective which
differs from the oracle is a finding, not a failure (``--strict`` makes it one).
"""

import re

import jax.numpy as jnp
import numpy as np
import pytest

from allreduce_jax import ALGORITHMS, cli
from allreduce_jax._ops import get_op, oracle
from allreduce_jax.tools import backend_oracle, verify

HAND_WRITTEN = [a for a, r in ALGORITHMS.items() if r.hand_written]
nan, inf = np.nan, np.inf


def _bits_equal(a, b) -> bool:
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  return bool(np.array_equal(np.isnan(a), np.isnan(b))) and bool(
    np.array_equal(a.view(np.uint32)[~np.isnan(a)], b.view(np.uint32)[~np.isnan(b)])
  )


@pytest.mark.parametrize(
  "column, want_max, want_min",
  [
    ([1.0, nan, 3.0, 0.0], nan, nan),  # NaN on one participant propagates
    ([nan, nan, nan, nan], nan, nan),  # lax.pmax on XLA:CPU gives -inf here
    ([1.0, inf, -inf, 0.0], inf, -inf),  # infinities are ordinary values
    ([-0.0, 0.0, -0.0, -0.0], 0.0, -0.0),  # -0.0 < +0.0, whatever the order
    ([0.0, -0.0, 0.0, 0.0], 0.0, -0.0),
    ([-0.0, -0.0, -0.0, -0.0], -0.0, -0.0),
    ([-3.0, -0.0, -5.0, -1.0], -0.0, -5.0),
  ],
)
def test_oracle_semantics(column, want_max, want_min):
  x = np.asarray(column, np.float32)[:, None]  # f32[p=4, 1]
  assert _bits_equal(oracle("max", x), [want_max])
  assert _bits_equal(oracle("min", x), [want_min])


def test_combine_is_order_free_and_matches_the_oracle():
  values = np.asarray([nan, inf, -inf, -0.0, 0.0, 1.0, -1.0], np.float32)
  a, b = np.meshgrid(values, values)
  for op in ("max", "min"):
    combine = get_op(op, jnp.float32).combine
    ab = np.asarray(combine(jnp.asarray(a), jnp.asarray(b)))
    ba = np.asarray(combine(jnp.asarray(b), jnp.asarray(a)))
    assert _bits_equal(ab, ba), op
    want = oracle(op, np.stack([a, b]))
    assert _bits_equal(ab, want), op


def test_oracle_sums_exactly_and_wraps_integers():
  x = np.asarray([[inf], [-inf]], np.float32)
  assert np.isnan(oracle("sum", x)).all()
  big = np.asarray([[2**31 - 1], [1]], np.int32)
  assert oracle("sum", big)[0] == -(2**31)
  assert oracle("mean", np.asarray([[1.0], [2.0]], np.float32))[0] == 1.5


def test_agreement_counts_signed_zeros_only_for_max_min():
  got, want = np.asarray([0.0], np.float32), np.asarray([-0.0], np.float32)
  assert verify.agreement(got, want, "sum").ok
  assert not verify.agreement(got, want, "max").ok
  a = verify.agreement(np.asarray([1.0, 3.0]), np.asarray([1.0, nan]), "max")
  assert (a.bad, a.first) == (1, 1)


def test_special_inputs_cover_every_pattern():
  x = verify.special_input(3, (4,), "float32")  # f32[p, V, 4]
  assert x.shape == (3, len(verify.SPECIALS), 4)
  for v, (name, _) in enumerate(verify.SPECIALS):
    assert verify.special_label((4,), v * 4) == name
  assert verify.special_label((4,), 1) == "verifiable value"
  assert np.isnan(x[:, 1, 0]).all() and np.isnan(x[:, 0, 0]).sum() == 1
  assert np.signbit(x[:, 8, 0]).all() and (x[:, 8, 0] == 0).all()


@pytest.mark.parametrize("algorithm", HAND_WRITTEN)
def test_hand_written_algorithms_follow_the_semantics(algorithm):
  rows = verify.run_case(
    algorithm, 4, ops=("sum", "max", "min"), dtypes=("float32",), kinds=("special",), shapes=((3,),)
  )
  assert rows and all(r.passed and r.bit_exact for r in rows), [r.detail for r in rows]


def test_a_backend_collective_that_differs_is_a_finding_not_a_failure(capsys):
  argv = ["verify", "--participants", "4", "--algorithms", "ring,psum", "--dtypes", "float32"]
  argv += ["--shapes", "3", "--kinds", "special"]
  assert cli.main(argv) == 0
  out = capsys.readouterr().out
  assert "FAIL" not in out
  assert re.search(r"^ring +max +float32 +4 .* PASS$", out, re.M)
  findings = [line for line in out.splitlines() if line.startswith("backend finding:")]
  for line in findings:
    assert re.match(r"backend finding: lax\.p\w+ .*p=4 special inputs: .*got .*, oracle ", line)
  strict = cli.main([*argv, "--strict"])
  capsys.readouterr()
  assert strict == (1 if findings else 0)


def test_verify_rows_keep_their_input_kind_and_name_the_oracle(tmp_path, capsys):
  from allreduce_jax.results import read_rows

  out = tmp_path / "verify.jsonl"
  argv = ["verify", "--participants", "2", "--algorithms", "ring", "--dtypes", "float32"]
  assert cli.main([*argv, "--ops", "max", "--shapes", "3", "--out", str(out)]) == 0
  capsys.readouterr()
  rows = read_rows(out, "verify")
  assert {r["kind"] for r in rows} == {"verify"}  # the store's own field
  assert {r["input_kind"] for r in rows} == set(verify.KINDS)  # the input kind, kept
  assert {r["reference"] for r in rows} == {verify.REFERENCE}
  assert {r["backend_collective"] for r in rows} == {"lax.pmax"}
  assert all(r["bit_exact"] for r in rows if r["input_kind"] == "verifiable")


def test_a_wrong_algorithm_still_fails_on_special_inputs(capsys, monkeypatch):
  import dataclasses

  ring = ALGORITHMS["ring"]

  def nan_skipping(flat, axis_name, combine):  # the old fmax behaviour
    out = ring(jnp.nan_to_num(flat, nan=-jnp.inf), axis_name, combine)
    return out

  monkeypatch.setitem(ALGORITHMS, "ring", dataclasses.replace(ring, fn=nan_skipping))
  argv = ["verify", "--participants", "2", "--algorithms", "ring", "--dtypes", "float32"]
  rc = cli.main([*argv, "--shapes", "3", "--kinds", "special", "--ops", "max"])
  out = capsys.readouterr().out
  assert rc == 1
  assert re.search(r"^FAIL ring max float32 p=2 special .*NaN", out, re.M)


def test_backend_oracle_mode_in_one_process(capsys):
  argv = ["verify", "--participants", "2", "--backend-oracle", "--dtypes", "float32,int32"]
  rc = cli.main([*argv, "--shapes", "3", "--kinds", "verifiable,special"])
  out = capsys.readouterr().out
  assert rc == 0
  for name in backend_oracle.COLLECTIVES:
    assert re.search(rf"^lax\.{name} +float32 +2 +verifiable +\d+ +0 +ok +agrees$", out, re.M)
  assert re.search(r"^# backend oracle: \d+ of \d+ .* hand-written: 0 failed", out, re.M)


@pytest.mark.parametrize(
  "argv, message",
  [
    (["--dtypes", "complex64", "--ops", "max"], "--dtypes complex64 with --ops max"),
    (["--dtypes", "bool"], "--dtypes: dtype bool cannot be all-reduced"),
    # 64-bit without x64: refused up front, as bench does (it ran as float32 and
    # printed "FAIL ... got 1.49343, oracle 1.49343").
    (["--dtypes", "float64"], "--dtypes: dtype float64 needs 64-bit mode, which is off"),
    # A selection that leaves nothing to compare is an error, not "0 cases, all agree".
    (["--wire", "int8", "--ops", "max"], "--wire int8 is checked on op sum/mean of float"),
    (["--wire", "int8", "--dtypes", "int32"], "--dtypes int32 --kinds"),
    (["--wire", "int8", "--algorithms", "psum"], "none of --algorithms psum can send in it"),
    (["--dtypes", "int32", "--ops", "mean"], "leaves nothing to check"),
    (["--devices", "0"], "--devices"),
    (["--backend-oracle", "--repeat", "0"], "--repeat: must be at least 1"),
  ],
)
def test_bad_arguments_are_one_line(argv, message, capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(["verify", *argv])
  text = f"{e.value.code} {capsys.readouterr().err}"
  assert message in text and "Traceback" not in text


def test_a_lossy_bound_counts_the_quantizations_on_the_path(capsys):
  # Recursive doubling at p = 4 quantizes both partners' values at each of its 2 steps:
  # 6 quantization errors reach an element, where the old bound allowed 2 (its step
  # count) and 2 of 2048 random elements were reported 0.065 off.
  from allreduce_jax import wire_error
  from allreduce_jax.devices import mesh_for

  assert cli.main(["verify", "--participants", "4", "--wire", "int8", "--algorithms",
                   "recursive_doubling", "--shapes", "2048"]) == 0  # fmt: skip
  out = capsys.readouterr().out
  assert "# 12 cases to compare" in out and ": 12 passed, 0 failed" in out
  counted = {}
  for p in (2, 4, 8):
    for algorithm in ("ring", "recursive_doubling", "two_shot", "tree"):
      counted[algorithm, p] = wire_error.quantizations(algorithm, *mesh_for(algorithm, p), 300)
  for p in (2, 4, 8):  # the closed forms: p for the ring, 2(p - 1) for recursive doubling
    assert counted["ring", p] == counted["two_shot", p] == counted["tree", p] == p
    assert counted["recursive_doubling", p] == 2 * (p - 1)


def test_a_large_run_says_up_front_how_many_cases_and_a_quick_one(capsys, monkeypatch):
  from allreduce_jax.tools import verify

  monkeypatch.setattr(verify, "run_case", lambda *a, **k: [])  # announce only
  assert cli.main(["verify", "--devices", "2", "--participants", "2"]) == 1  # 0 compared
  out = capsys.readouterr().out
  n = verify.count_cases(verify.OPS, verify.DTYPES, verify.KINDS, verify.SHAPES)
  assert f"# {len(verify.ALGORITHMS) * n} cases to compare" in out
  assert f"allreduce-jax verify {verify.QUICK}" in out
