"""Option parsing shared by every subcommand."""

from __future__ import annotations


def csv_list(text: str) -> list[str]:
  """``"ring, tree,"`` -> ``["ring", "tree"]``: the parser of comma-separated options."""
  return [s.strip() for s in text.split(",") if s.strip()]
