"""One colour, marker and line style per algorithm, the same in every figure.

:func:`style` derives an algorithm's look from its place in the registry
(:data:`~allreduce_jax.ALGORITHMS`, in registration order), so a newly registered
algorithm gets a look of its own with no edit here. A few entries are fixed: XLA's
own collective (``psum``, the reference) is black, ``auto`` grey with a star, an MPI
baseline (``mpi``) dark grey with a cross. A compressed wire format keeps the
algorithm's colour and marker and changes the line style (bf16 dashed, int8 dotted,
fp8 dash-dotted), so one algorithm in several wire formats reads as one family of lines.

The module needs no plotting library: the values are matplotlib's names for colours,
markers and line styles, passed through as keyword arguments::

  from allreduce_jax.palette import style
  ax.plot(x, y, label="ring", **style("ring"))
  ax.plot(x, y, label="ring, int8 wire", **style("ring", wire="int8"))
"""

from __future__ import annotations

import zlib

from allreduce_jax.registry import ALGORITHMS

__all__ = ["COLORS", "FIXED", "MARKERS", "WIRE_LINESTYLES", "label", "style"]

#: Colours for the hand-written algorithms, in registry order (matplotlib's tab10
#: without its grey, then two more): a new algorithm takes the next one.
COLORS: tuple[str, ...] = (
  "#1f77b4",  # blue
  "#ff7f0e",  # orange
  "#2ca02c",  # green
  "#d62728",  # red
  "#9467bd",  # purple
  "#8c564b",  # brown
  "#e377c2",  # pink
  "#bcbd22",  # olive
  "#17becf",  # cyan
  "#393b79",  # indigo
  "#e7ba52",  # gold
  "#7b4173",  # plum
)

#: Markers, in the same order. Twelve colours and eleven markers: the k-th algorithm
#: gets colour k mod 12 and marker k mod 11, so 132 algorithms have distinct pairs.
MARKERS: tuple[str, ...] = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "h", "p")

#: Line styles, in the same order (lines that coincide stay visible).
_LINESTYLES: tuple[str, ...] = ("-", "--", "-.", ":")

#: Entries that do not follow the registry order.
FIXED: dict[str, dict] = {
  "psum": {"color": "black", "marker": "o", "linestyle": "-"},
  "auto": {"color": "#7f7f7f", "marker": "*", "linestyle": "--"},
  "mpi": {"color": "#4d4d4d", "marker": "x", "linestyle": "-."},
}

#: A compressed wire format's line style (the exact program, wire None: the algorithm's).
WIRE_LINESTYLES: dict[str, str] = {"bf16": "--", "int8": ":", "fp8": "-."}


def _index(algorithm: str) -> int:
  """The algorithm's place among the registered algorithms without a fixed entry; a
  name the registry does not hold (rows of an algorithm registered elsewhere) gets a
  stable place after them, from its name."""
  free = [a for a in ALGORITHMS if a not in FIXED and ALGORITHMS[a].hand_written]
  if algorithm in free:
    return free.index(algorithm)
  return len(free) + zlib.crc32(algorithm.encode()) % 97


def style(algorithm: str, wire: str | None = None) -> dict:
  """The look of ``algorithm`` (sent in ``wire``) in every figure.

  Args:
    algorithm: a registry name (or any name: an unknown one gets a stable look too).
      XLA's own collectives (records with ``hand_written=False``) share ``psum``'s.
    wire: a compressed wire format (``"bf16"``, ``"int8"``, ``"fp8"``) or None/``"none"``
      for the exact program.

  Returns:
    ``{"color", "marker", "linestyle"}``: matplotlib keyword arguments (a copy).

  Example:
    >>> style("psum")
    {'color': 'black', 'marker': 'o', 'linestyle': '-'}
    >>> style("ring")["color"] == style("ring", wire="int8")["color"]
    True
  """
  if not isinstance(algorithm, str) or not algorithm:
    raise ValueError(f"algorithm={algorithm!r}: expected an algorithm name (a string).")
  record = ALGORITHMS.get(algorithm)
  if algorithm in FIXED:
    out = dict(FIXED[algorithm])
  elif record is not None and not record.hand_written:
    out = dict(FIXED["psum"])
  else:
    k = _index(algorithm)
    out = {
      "color": COLORS[k % len(COLORS)],
      "marker": MARKERS[k % len(MARKERS)],
      "linestyle": _LINESTYLES[k % len(_LINESTYLES)],
    }
  if wire not in (None, "none"):
    if wire not in WIRE_LINESTYLES:
      raise ValueError(f"wire={wire!r}: expected None, 'none' or one of {list(WIRE_LINESTYLES)}.")
    out["linestyle"] = WIRE_LINESTYLES[wire]
  return out


def label(algorithm: str, wire: str | None = None) -> str:
  """The legend text for ``algorithm`` in ``wire``: ``"ring"``, ``"ring, int8 wire"``.

  Example:
    >>> label("ring", "int8"), label("ring", "none")
    ('ring, int8 wire', 'ring')
  """
  return algorithm if wire in (None, "none") else f"{algorithm}, {wire} wire"
