"""The figures: one look per algorithm (``allreduce_jax.palette``) in every figure the
tools draw, legends inside the saved image and off the data, compressed results split
by wire format, a network's rows drawn against that network's model."""

import pytest

from allreduce_jax import ALGORITHMS, palette


def test_every_registered_algorithm_has_its_own_look():
  looks = {a: palette.style(a) for a in ALGORITHMS}
  pairs = [(s["color"], s["marker"]) for s in looks.values()]
  assert len(set(pairs)) == len(pairs), looks
  # the colours alone tell them apart too (the palette has one per algorithm)
  assert len({s["color"] for s in looks.values()}) == len(looks)
  assert looks["psum"] == {"color": "black", "marker": "o", "linestyle": "-"}


def test_a_wire_keeps_the_colour_and_marker_and_changes_the_line():
  exact = palette.style("ring")
  assert palette.style("ring", "none") == exact
  lines = {palette.style("ring", w)["linestyle"] for w in (None, "bf16", "int8", "fp8")}
  assert len(lines) == 4
  for w in ("bf16", "int8", "fp8"):
    s = palette.style("ring", w)
    assert (s["color"], s["marker"]) == (exact["color"], exact["marker"])


def test_an_unknown_name_gets_a_stable_look_and_bad_input_one_line():
  assert palette.style("not_registered") == palette.style("not_registered")
  with pytest.raises(ValueError, match="wire='int4'"):
    palette.style("ring", "int4")
  with pytest.raises(ValueError, match="algorithm=None"):
    palette.style(None)
