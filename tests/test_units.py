"""allreduce_jax.units: the one size and rate parser, against closed-form conversions."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allreduce_jax import cost_model, units
from allreduce_jax.results import upgrade


@pytest.mark.parametrize(
  "text, bytes_per_s",
  [
    ("100Gbit", 100e9 / 8),
    ("100Gb/s", 100e9 / 8),
    ("100Gbps", 100e9 / 8),
    ("100 Gbit/s", 100e9 / 8),
    ("12.5GB/s", 12.5e9),
    ("12.5GBps", 12.5e9),
    ("200Mbit", 200e6 / 8),
    ("200mbit", 200e6 / 8),  # tc's spelling of megabits
    ("10kbit", 10e3 / 8),
    ("1Tbit", 1e12 / 8),
    ("1GiB/s", 2.0**30),
    ("8Mibit", 2.0**20),
    ("1e3MB/s", 1e9),
    ("64bit", 8.0),
  ],
)
def test_parse_rate_closed_form(text, bytes_per_s):
  assert units.parse_rate(text) == pytest.approx(bytes_per_s, rel=1e-12)
  assert units.parse_rate_GBps(text) == pytest.approx(bytes_per_s / 1e9, rel=1e-12)


@pytest.mark.parametrize(
  "text, why", [("100", "has no unit"), ("12.5", "has no unit"), ("100Gb", "is not a rate"),
                ("fast", "is not a rate"), ("0Gbit", "is not a positive rate"), ("100GiB", "is not")],
)  # fmt: skip
def test_parse_rate_refuses_with_the_name(text, why):
  with pytest.raises(ValueError, match=f"--bandwidth '{text}' {why}"):
    units.parse_rate(text, "--bandwidth")


@given(st.floats(min_value=1e-3, max_value=1e6))
def test_bits_are_one_eighth_of_bytes(x):
  assert units.parse_rate(f"{x!r}Gbit") == pytest.approx(units.parse_rate(f"{x!r}GB/s") / 8)


def test_format_rate_and_tc_round_trip():
  for text in ("100Gbit", "200Mbit", "12.5GB/s", "450GB/s"):
    r = units.parse_rate(text)
    assert units.parse_rate(units.tc_rate(r)) == pytest.approx(r)
    byte_part, bit_part = units.format_rate(r).removesuffix(")").split(" (")
    assert units.parse_rate(byte_part.replace(" ", "")) == pytest.approx(r, rel=1e-2)
    assert units.parse_rate(bit_part.replace(" ", "")) == pytest.approx(r, rel=1e-2)


@given(st.integers(min_value=1, max_value=1 << 40))
def test_format_bytes_round_trips_exact_sizes(n):
  text = units.format_bytes(n)
  value, unit = text.split(" ")  # one space between the number and its unit
  scale = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]
  assert not value.endswith(".0") and len(value.partition(".")[2]) <= 1
  assert abs(float(value) * scale - n) <= 0.0501 * scale  # within half the last decimal
  assert 1 <= float(value) < 1024 or unit == "GiB" or (unit == "B" and n < 1024)
  if n % scale == 0:  # exact: reads back, and without the space as an option value
    assert units.parse_size(text) == units.parse_size(units.format_bytes(n, sep="")) == n


def test_presets_state_their_rates():
  # 100 GbE is 100 Gbit/s = 12.5 GB/s per direction; 10 GbE a tenth of it.
  assert 1 / cost_model.PRESETS["100gbe"].beta == pytest.approx(units.parse_rate("100Gbit"))
  assert 1 / cost_model.PRESETS["10gbe"].beta == pytest.approx(units.parse_rate("10Gbit"))
  link = cost_model.parse_link("5,400Gbit")
  assert link.alpha == pytest.approx(5e-6) and 1 / link.beta == pytest.approx(50e9)
  assert cost_model.parse_link("5,50GB/s") == link
  with pytest.raises(ValueError, match="--link '5,50': '50' has no unit"):
    cost_model.parse_link("5,50")  # a bare number is refused, as by every rate option
  with pytest.raises(ValueError, match="--link '5,fast'"):
    cost_model.parse_link("5,fast")
  assert math.isclose(cost_model.params_to_dict(link)["bandwidth_GBps"], 50.0)


def test_old_rows_read_with_the_new_column_names():
  row = upgrade({"algbw_gbps": 1.0, "busbw_gbps": 1.75})
  assert row["algbw_GBps"] == 1.0 and row["busbw_GBps"] == 1.75
