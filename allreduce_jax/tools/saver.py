"""A process that saves 16 MiB checkpoints as fast as it can, to be killed during a save.

    python -m allreduce_jax.tools.saver DIR     # prints "saving", then saves steps 1, 2, ...

Step k's arrays all hold k (its losses ``[k]``, its examples ``k``), so :func:`restore`
and :func:`complete` tell whether a restore came from one complete checkpoint. A run
started again on ``DIR`` continues after the newest complete checkpoint there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from allreduce_jax.training import checkpoint

SIZE = 1 << 22  # float32 values a checkpoint: 16 MiB
OPT_SIZE = 1000
IDENTITY = {"run": "torn"}


def _checkpoints(directory: str | Path):
  return checkpoint.Checkpoints(directory, 1, IDENTITY)


def save(directory: str | Path, steps: int = 100_000) -> None:
  """Saves ``steps`` checkpoints after the newest in ``directory``, printing "saving"
  (flushed) before the first."""
  ck = _checkpoints(directory)
  start = (ck.latest() or 0) + 1
  print("saving", flush=True)
  for step in range(start, start + steps):
    a = np.full((SIZE,), step, np.float32)
    ck.save(checkpoint.State(step, {"w": a}, {"m": a[:OPT_SIZE]}, examples=step, workers=1,
                             learning_rate=0.1, losses=[float(step)]))  # fmt: skip
  ck.close()


def restore(directory: str | Path):
  """The newest complete checkpoint in ``directory`` (a ``checkpoint.State``), or None;
  a torn save there is removed."""
  ck = _checkpoints(directory)
  try:
    z = np.zeros((SIZE,), np.float32)
    return ck.restore({"w": z}, {"m": z[:OPT_SIZE]})
  finally:
    ck.close()


def complete(state) -> bool:
  """Whether every value of ``state`` (from :func:`restore`) is its step's."""
  return bool(
    state is not None
    and state.losses == [float(state.step)]
    and state.examples == state.step
    and np.all(state.params["w"] == state.step)
    and np.all(state.opt_state["m"] == state.step)
  )


def main(argv: list[str]) -> None:
  if len(argv) != 1:
    raise SystemExit(f"saver: expected one argument, the checkpoint folder DIR; got {argv!r}.")
  save(argv[0])


if __name__ == "__main__":
  main(sys.argv[1:])
