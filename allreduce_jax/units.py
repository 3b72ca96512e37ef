"""Sizes and rates with their units: the one parser and formatter of each.

Every byte count and every bandwidth a user types or reads goes through here, so
``100Gbit`` means the same thing to ``train --bandwidth``, ``scaling --link`` and
the cost model's presets, and a size prints the same way in a table, a figure and a
command line.

* **Sizes** (:func:`parse_size`, :func:`format_bytes`): bytes, with binary
  (``KiB``, ``MiB``, ``GiB``; also ``K``, ``M``, ``G``) or decimal (``KB``, ``MB``,
  ``GB``) prefixes.
* **Spreads** (:func:`spread`): ``median [min–max]`` of repeated measurements, the one
  cell format of every study's tables.
* **Rates** (:func:`parse_rate`, :func:`format_rate`): returned in **bytes per
  second**. The letter ``b`` decides the unit, as in the networking convention:
  lowercase ``b`` or ``bit`` is bits (``100Gbit``, ``100Gb/s``, ``100Gbps``,
  ``200Mbit``), uppercase ``B`` is bytes (``12.5GB/s``, ``12.5GBps``, ``1GiB/s``).
  Prefixes ``k``/``K``, ``M``, ``G``, ``T`` are powers of 1000, ``Ki``, ``Mi``,
  ``Gi``, ``Ti`` powers of 1024. A bare number has no unit and is refused (by every
  option that takes a rate: ``train --bandwidth``, ``scaling --link``, ``cluster
  --link``...): a 100 GbE link is ``100Gbit`` (12.5 GB/s), not ``100``. Note that Linux ``tc``
  reads ``mbps`` as *megabytes* per second; here ``Mbps`` is megabits, and
  :func:`tc_rate` writes the unambiguous ``...bit`` spelling ``tc`` also accepts.

Columns and fields that hold a rate name their unit: ``*_GBps`` is GB/s
(1e9 bytes per second), as nccl-tests' ``algbw``/``busbw`` columns are.

Example:
  >>> parse_rate("100Gbit") == parse_rate("12.5GB/s") == 12.5e9
  True
  >>> format_rate(12.5e9), format_bytes(16 << 20), parse_size("1KiB")
  ('12.5 GB/s (100 Gbit/s)', '16 MiB', 1024)
"""

from __future__ import annotations

import math
import re
import statistics
import threading
from collections.abc import Iterable

_SIZE_UNITS = {
  "": 1,
  "b": 1,
  "k": 1024,
  "kb": 1000,
  "kib": 1024,
  "m": 1024**2,
  "mb": 1000**2,
  "mib": 1024**2,
  "g": 1024**3,
  "gb": 1000**3,
  "gib": 1024**3,
}
_NUMBER = r"(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)"
_SIZE_RE = re.compile(rf"^\s*{_NUMBER}\s*([a-zA-Z]*)\s*$")
_RATE_RE = re.compile(rf"^\s*{_NUMBER}\s*([kKmMgGtT]i?)?\s*(bit/s|bits/s|bit|b/s|bps|B/s|Bps)\s*$")
_PREFIX = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}

#: What :func:`parse_rate` accepts, for error messages.
RATE_EXAMPLES = "100Gbit, 100Gb/s, 12.5GB/s, 200Mbit"

#: The one sentence every ``--help`` of a rate option ends with (``train --bandwidth``,
#: ``scaling --link``, ``cluster --link``...): the same units everywhere.
RATE_HELP = (
  "a rate with its unit, bits (100Gbit, 200Mbit) or bytes (12.5GB/s) per second;"
  " a bare number is refused"
)


def parse_size(text: str, name: str = "size") -> int:
  """``"64MiB"`` -> 67108864. Units: B, K/KiB/M/MiB/G/GiB (powers of 1024), KB/MB/GB
  (powers of 1000), case-insensitive.

  Raises ``ValueError`` naming ``name`` (e.g. ``--min-bytes``) for anything else.

  Example:
    >>> parse_size("1KiB"), parse_size("64MiB"), parse_size("1MB"), parse_size("4096")
    (1024, 67108864, 1000000, 4096)
  """
  m = _SIZE_RE.match(str(text))
  unit = m.group(2).lower() if m else None
  if m is None or unit not in _SIZE_UNITS:
    raise ValueError(
      f"{name} {text!r} is not a size: use an integer with an optional unit"
      " (B, KiB, MiB, GiB, K, M, G, KB, MB, GB), e.g. 1KiB or 64MiB."
    )
  value = float(m.group(1)) * _SIZE_UNITS[unit]
  if value < 1 or value != int(value):
    raise ValueError(f"{name} {text!r} must be a positive whole number of bytes.")
  return int(value)


_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}
_TIME_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(s|ms|us|µs)\s*$")


def parse_duration(text: str, name: str = "duration") -> float:
  """``"10ms"`` -> 0.01 seconds. Units: s, ms, us (or µs); a unit is required.

  Raises ``ValueError`` naming ``name`` (e.g. ``--queue``) for anything else.

  Example:
    >>> parse_duration("10ms"), parse_duration("0.5s"), parse_duration("250us")
    (0.01, 0.5, 0.00025)
  """
  m = _TIME_RE.match(str(text))
  if m is None:
    raise ValueError(f"{name} {text!r} is not a duration: use a number and s, ms or us, e.g. 10ms.")
  value = float(m.group(1)) * _TIME_UNITS[m.group(2)]
  if value <= 0:
    raise ValueError(f"{name} {text!r} must be positive.")
  return value


#: The longest a timer can wait (``threading.TIMEOUT_MAX``, about 292 years): a timeout
#: or a fault time beyond it (or infinite, or NaN) would fail inside the timer thread.
MAX_SECONDS = float(threading.TIMEOUT_MAX)


def seconds_problem(value: float, low: float = 0.0) -> str | None:
  """Why ``value`` is not a number of seconds a timer can wait (more than ``low``,
  finite, at most :data:`MAX_SECONDS`), or None.

  Example:
    >>> seconds_problem(30.0), seconds_problem(float("nan")), seconds_problem(0.0)
    (None, 'expected a finite number of seconds, got nan', 'must be more than 0 seconds, got 0')
  """
  if not math.isfinite(value):
    return f"expected a finite number of seconds, got {value:g}"
  if not value > low:
    return f"must be more than {low:g} seconds, got {value:g}"
  if value > MAX_SECONDS:
    return f"must be at most {MAX_SECONDS:.3g} seconds (about 292 years), got {value:g}"
  return None


def format_bytes(nbytes: float, sep: str = " ") -> str:
  """A byte count as people read it, the one size label of tables, figures and
  messages: the largest binary unit it reaches, at most one decimal and none where it
  would be ``.0`` (``1 KiB``, ``128 KiB``, ``1001.6 KiB``), plain bytes below 1 KiB.
  ``sep=""`` writes an option value to type (``16KiB``); exact ones read back with
  :func:`parse_size`.

  Example:
    >>> format_bytes(4096), format_bytes(3 << 20), format_bytes(1000), format_bytes(1025638)
    ('4 KiB', '3 MiB', '1000 B', '1001.6 KiB')
    >>> format_bytes(131064), format_bytes(4.5e9), format_bytes(0.5), format_bytes(16 << 10, sep="")
    ('128 KiB', '4.2 GiB', '0.5 B', '16KiB')
  """
  for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
    if nbytes >= scale * (1 - 0.05 / 1024):  # 1048575 bytes: 1 MiB, not 1024 KiB
      return f"{nbytes / scale:.1f}".removesuffix(".0") + sep + unit
  return (f"{int(nbytes)}" if nbytes == int(nbytes) else f"{nbytes:.3g}") + sep + "B"


def spread(
  xs: Iterable[float],
  fmt: str = ".2f",
  *,
  scale: float = 1.0,
  unit: str = "",
  alone: bool = False,
  empty: str = "—",
  brackets: str = "[]",
) -> str:
  """``median [min–max]`` of ``xs``, the one way a table cell shows repeated
  measurements: each of the three values times ``scale`` and written with the format
  spec ``fmt`` (``"auto"``: two decimals below 10, one below 100, none above, chosen by
  the median), ``unit`` after the median (``"×"``); ``alone``: a single value is written
  without its range; ``empty`` where ``xs`` holds nothing; ``brackets``: the range's
  (``"()"``: ``median (min–max)``).

  Example:
    >>> spread([1.0, 3.0, 2.0]), spread([0.5, 1.5], ".1f", unit="×")
    ('2.00 [1.00–3.00]', '1.0× [0.5–1.5]')
    >>> spread([0.0123, 0.0150], "auto", scale=1e3), spread([7.0], ".0f", alone=True), spread([])
    ('13.6 [12.3–15.0]', '7', '—')
  """
  xs = list(xs)
  if not xs:
    return empty
  mid, lo, hi = statistics.median(xs) * scale, min(xs) * scale, max(xs) * scale
  if fmt == "auto":
    fmt = ".2f" if mid < 10 else ".1f" if mid < 100 else ".0f"
  if alone and len(xs) == 1:
    return f"{mid:{fmt}}{unit}"
  return f"{mid:{fmt}}{unit} {brackets[0]}{lo:{fmt}}–{hi:{fmt}}{brackets[1]}"


def span(xs: Iterable[float], fmt: str = ".2f", empty: str = "–") -> str:
  """``min–max`` of ``xs``, each written with ``fmt``: one value where they read the same,
  ``empty`` where ``xs`` holds nothing.

  Example:
    >>> span([1.0, 3.0, 2.0]), span([2.001, 1.999]), span([], ".0f")
    ('1.00–3.00', '2.00', '–')
  """
  xs = list(xs)
  if not xs:
    return empty
  lo, hi = format(min(xs), fmt), format(max(xs), fmt)
  return lo if lo == hi else f"{lo}–{hi}"


def parse_rate(text: str, name: str = "rate") -> float:
  """A rate with its unit -> **bytes per second**.

  Bits: ``bit``, ``bit/s``, ``b/s``, ``bps`` (lowercase ``b``); bytes: ``B/s``,
  ``Bps``. Decimal prefixes k/K, M (or m), G (or g), T (or t); binary Ki, Mi, Gi, Ti.
  Raises ``ValueError`` naming ``name`` for a bare number, an unknown unit, or a rate
  that is not finite and positive.

  Example:
    >>> [parse_rate(t) for t in ("100Gbit", "100Gb/s", "100Gbps", "12.5GB/s", "12.5GBps")]
    [12500000000.0, 12500000000.0, 12500000000.0, 12500000000.0, 12500000000.0]
    >>> parse_rate("200Mbit"), parse_rate("1GiB/s"), parse_rate("8bit")
    (25000000.0, 1073741824.0, 1.0)
  """
  m = _RATE_RE.match(str(text))
  if m is None:
    bare = _SIZE_RE.match(str(text)) and not _SIZE_RE.match(str(text)).group(2)
    why = "has no unit" if bare else "is not a rate"
    raise ValueError(
      f"{name} {text!r} {why}: write the unit, bits (b, bit) or bytes (B) per second,"
      f" e.g. {RATE_EXAMPLES}."
    )
  number, prefix, unit = m.group(1), m.group(2) or "", m.group(3)
  if prefix.endswith("i"):
    scale = 1024.0 ** ("kmgt".index(prefix[0].lower()) + 1)
  else:
    scale = _PREFIX[prefix.lower()]
  value = float(number) * scale / (1 if unit in ("B/s", "Bps") else 8)
  if not (math.isfinite(value) and value > 0):
    raise ValueError(f"{name} {text!r} is not a positive rate: e.g. {RATE_EXAMPLES}.")
  return value


def parse_rate_GBps(text: str, name: str = "rate") -> float:
  """:func:`parse_rate` in GB/s (1e9 bytes per second), the unit of ``*_GBps`` fields.

  Example:
    >>> parse_rate_GBps("100Gbit"), parse_rate_GBps("450GB/s")
    (12.5, 450.0)
  """
  return parse_rate(text, name) / 1e9


def format_rate(bytes_per_s: float) -> str:
  """Bytes per second -> ``'12.5 GB/s (100 Gbit/s)'``: the byte rate, and the bit rate
  network links are sold by.

  Example:
    >>> format_rate(1.25e9), format_rate(450e9), format_rate(25e6)
    ('1.25 GB/s (10 Gbit/s)', '450 GB/s (3.6 Tbit/s)', '25 MB/s (200 Mbit/s)')
  """
  return f"{_decimal(bytes_per_s)}B/s ({_decimal(bytes_per_s * 8)}bit/s)"


def tc_rate(bytes_per_s: float) -> str:
  """The rate in the spelling Linux ``tc`` reads unambiguously: bits per second with a
  decimal prefix (``200Mbit``, ``1.5Gbit``); :func:`parse_rate` reads it back.

  Example:
    >>> tc_rate(parse_rate("200Mbit")), tc_rate(12.5e9), tc_rate(8e3)
    ('200Mbit', '100Gbit', '64kbit')
  """
  bits = bytes_per_s * 8
  for unit, scale in (("Gbit", 1e9), ("Mbit", 1e6), ("kbit", 1e3)):
    if bits >= scale:
      return f"{bits / scale:.6g}{unit}"
  return f"{bits:.6g}bit"


def _decimal(x: float) -> str:
  for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if x >= scale:
      return f"{x / scale:.3g} {unit}"
  return f"{x:.3g} "
