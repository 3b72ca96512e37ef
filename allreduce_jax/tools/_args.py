"""Option parsing shared by every subcommand: comma lists, sizes, ``--devices``.

Each subcommand's ``configure(parser)`` declares its options with these helpers, so
a list, a size or the device count is spelled and checked the same way everywhere.
"""

from __future__ import annotations

import argparse
import re

_UNITS = {
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
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def csv_list(text: str) -> list[str]:
  """``"ring, tree,"`` -> ``["ring", "tree"]``: the parser of comma-separated options."""
  return [s.strip() for s in text.split(",") if s.strip()]


def int_list(text: str) -> list[int]:
  """``"2,4, 8"`` -> ``[2, 4, 8]`` (an argparse ``type``: a bad entry is a usage error).

  Example:
    >>> int_list("2,4, 8")
    [2, 4, 8]
  """
  try:
    return [int(s) for s in csv_list(text)]
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


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
  if m is None or unit not in _UNITS:
    raise ValueError(
      f"{name} {text!r} is not a size: use an integer with an optional unit"
      " (B, KiB, MiB, GiB, K, M, G, KB, MB, GB), e.g. 1KiB or 64MiB."
    )
  value = float(m.group(1)) * _UNITS[unit]
  if value < 1 or value != int(value):
    raise ValueError(f"{name} {text!r} must be a positive whole number of bytes.")
  return int(value)


def format_size(nbytes: float) -> str:
  """4096 -> '4KiB' (exact binary units where possible, else bytes).

  Example:
    >>> format_size(4096), format_size(3 << 20), format_size(1000)
    ('4KiB', '3MiB', '1000B')
  """
  for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
    if nbytes >= scale and nbytes % scale == 0:
      return f"{int(nbytes // scale)}{unit}"
  return f"{int(nbytes)}B"


def size_list(text: str) -> list[int]:
  """``"1MiB,100MiB"`` -> byte counts (an argparse ``type``)."""
  try:
    return [parse_size(s) for s in csv_list(text)]
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e)) from None


def add_devices(parser: argparse.ArgumentParser, default: int = 8) -> None:
  """``--devices N``: how many devices to run on (emulated CPU devices when on CPU)."""
  parser.add_argument(
    "--devices",
    type=int,
    default=default,
    help="devices to use (on CPU: emulated devices; ignored under jax.distributed)",
  )
