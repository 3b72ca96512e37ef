"""Training rows live in the one row store, :mod:`allreduce_jax.results` (re-exported here)."""

from __future__ import annotations

import os

from allreduce_jax.results import RowsError, RowStore, environment, run_key


class Results(RowStore):
  """The training sweeps' :class:`~allreduce_jax.results.RowStore`; the row kind
  defaults to the file's stem (``staleness.jsonl`` holds ``"staleness"`` rows)."""

  def __init__(self, path: str | os.PathLike, kind: str | None = None, context=None):
    super().__init__(path, kind or os.path.splitext(os.path.basename(path))[0], context)


__all__ = ["Results", "RowStore", "RowsError", "environment", "run_key"]
