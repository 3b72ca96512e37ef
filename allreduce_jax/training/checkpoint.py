"""Checkpoints of a synchronous run, so a run that loses a process resumes bitwise.

A checkpoint holds everything the next step depends on: the parameters and the
optimizer state (one participant's copy: every copy is bitwise identical), the step,
the data-order state (the seed of the shuffled example stream and how many examples
were consumed), and the run's history so far (losses, test accuracy). Resuming from
it and training on gives the same parameters, bit for bit, as a run never
interrupted, because the per-step program and its inputs are the same.

Saves go through orbax-checkpoint's ``CheckpointManager``: each step is written into a
temporary folder and renamed when complete, so a process killed during a save leaves
the previous checkpoint as the newest complete one; the next run deletes the torn
temporary folder (``cleanup_tmp_directories``) and restores the newest complete step.
Every process holds the same state, so in a multi-process run process 0 alone writes it,
in the background (a save holds training up only while orbax takes its copy: about
25 ms for the digits MLP on 4 emulated hosts), and each process reads it on its own.

Elastic resume (fewer workers than the checkpoint's, after ``launch|cluster
--elastic`` restarted the job on the surviving processes): each worker keeps its
batch of ``batch_per_worker`` examples, so the global batch shrinks from ``p·b`` to
``p'·b``, and the learning rate is scaled by ``p'/p`` (the linear scaling rule of
Goyal et al. 2017), so each example moves the parameters as much as before. The
example stream continues where it stopped; the run keeps its number of steps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

#: Complete checkpoints kept (older ones are deleted once a newer one is complete).
KEEP = 2


@dataclass
class State:
  """What a checkpoint holds (host arrays; one participant's copy).

  Attributes:
    step: steps done.
    params: the parameters after ``step`` steps.
    opt_state: the optimizer state after ``step`` steps.
    examples: examples consumed from the seed's example stream (the data order).
    workers: participants that trained the last step.
    learning_rate: the learning rate of the last step.
    losses: the training loss of every step done.
    eval_steps: the steps after which test accuracy was measured.
    test_acc: those accuracies.
    restarts: the steps this run resumed from, in order.
  """

  step: int
  params: Any
  opt_state: Any
  examples: int
  workers: int
  learning_rate: float
  losses: list[float] = field(default_factory=list)
  eval_steps: list[int] = field(default_factory=list)
  test_acc: list[float] = field(default_factory=list)
  restarts: list[int] = field(default_factory=list)


class CheckpointError(ValueError):
  """A checkpoint folder that does not belong to this run."""


def example_stream(n: int, start: int, count: int, seed: int) -> np.ndarray:
  """Examples ``start .. start + count`` of the seed's stream of reshuffled epochs
  (i32[count]); ``data.batch_indices(n, B, steps, seed)`` is its first ``B·steps``
  examples cut into batches."""
  rng = np.random.default_rng(seed)
  out, pos = [], 0
  while pos < start + count:
    perm = rng.permutation(n)
    lo, hi = max(start - pos, 0), min(start + count - pos, n)
    if lo < hi:
      out.append(perm[lo:hi])
    pos += n
  return (np.concatenate(out) if out else np.zeros(0, np.int64)).astype(np.int32)


class Checkpoints:
  """The checkpoints of one run in ``directory``, a save every ``every`` steps.

  ``identity``: what must match for a checkpoint to be resumed (the run's config but
  its worker count and learning rate, and the seed); a checkpoint of another run is a
  :class:`CheckpointError` naming the fields that differ.
  """

  def __init__(self, directory: str | Path, every: int, identity: dict[str, Any]):
    import orbax.checkpoint as ocp  # the train extra; imported when checkpoints are asked for

    if every < 1:
      raise ValueError(f"--checkpoint-every must be at least 1, got {every}.")
    self.ocp = ocp
    self.every = every
    self.identity = json.loads(json.dumps(identity))
    self.directory = Path(directory).absolute()
    self.learning_rate = float("nan")  # of the steps this process trains (saved with them)
    self.restarts: list[int] = []  # the steps this run resumed from
    # Every process holds the same state: process 0 alone writes it, in the background
    # (save returns once orbax has its copy), and each process reads it on its own: no
    # process waits for another in a save or a restore.
    me = jax.process_index()
    self.writes = me == 0
    self.directory.mkdir(parents=True, exist_ok=True)
    self.manager = ocp.CheckpointManager(
      self.directory,
      options=ocp.CheckpointManagerOptions(
        create=False,
        max_to_keep=KEEP,
        cleanup_tmp_directories=self.writes,  # a save torn by a kill: its temp folder goes
        enable_async_checkpointing=True,
        multiprocessing_options=ocp.options.MultiprocessingOptions(
          primary_host=me, active_processes={me}
        ),
      ),
    )
    # orbax removes torn temporary folders in the background and waits for that only in
    # its next save; wait now, so a run that only restores leaves none behind either.
    wait = getattr(self.manager, "_maybe_await_cleanup_tmp_directory", None)
    if wait is not None:
      wait()

  def latest(self) -> int | None:
    """The newest complete step saved, or None."""
    return self.manager.latest_step()

  def restore(self, params: Any, opt_state: Any) -> State | None:
    """The newest complete checkpoint (``params``/``opt_state``: fresh ones, the
    structure to restore into), or None if there is none."""
    step = self.latest()
    if step is None:
      return None
    ocp = self.ocp
    meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    differ = sorted(
      k
      for k in set(meta["identity"]) | set(self.identity)
      if meta["identity"].get(k) != self.identity.get(k)
    )
    if differ:
      theirs = ", ".join(f"{k}={meta['identity'].get(k)!r}" for k in differ)
      ours = ", ".join(f"{k}={self.identity.get(k)!r}" for k in differ)
      raise CheckpointError(
        f"--checkpoint-dir {self.directory}: its checkpoint (step {step}) is of another run"
        f" ({theirs}; this run has {ours}); give an empty folder."
      )
    got = self.manager.restore(
      step,
      args=ocp.args.Composite(
        arrays=ocp.args.StandardRestore({"params": params, "opt_state": opt_state})
      ),
    )
    as_np = lambda t: _as_numpy(t)  # noqa: E731
    return State(
      step=meta["step"],
      params=as_np(got["arrays"]["params"]),
      opt_state=as_np(got["arrays"]["opt_state"]),
      examples=meta["examples"],
      workers=meta["workers"],
      learning_rate=meta["learning_rate"],
      losses=meta["losses"],
      eval_steps=meta["eval_steps"],
      test_acc=meta["test_acc"],
      restarts=meta["restarts"],
    )

  def save(self, state: State) -> None:
    """Writes ``state`` as step ``state.step`` (atomically: temp folder, then rename), in
    the background; in process 0 only (the others hold the same state)."""
    if not self.writes:
      return
    ocp = self.ocp
    meta = {
      "identity": self.identity,
      "step": state.step,
      "examples": state.examples,
      "workers": state.workers,
      "learning_rate": state.learning_rate,
      "losses": [float(x) for x in state.losses],
      "eval_steps": list(state.eval_steps),
      "test_acc": [float(x) for x in state.test_acc],
      "restarts": list(state.restarts),
    }
    self.manager.save(
      state.step,
      args=ocp.args.Composite(
        arrays=ocp.args.StandardSave({"params": state.params, "opt_state": state.opt_state}),
        meta=ocp.args.JsonSave(meta),
      ),
      force=True,
    )

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def digest(tree: Any) -> str:
  """SHA-256 of a pytree's leaves (their dtypes, shapes and bytes, in tree order): equal
  digests, bitwise equal parameters."""
  import hashlib

  import jax

  h = hashlib.sha256()
  for leaf in jax.tree.leaves(tree):
    a = np.ascontiguousarray(np.asarray(leaf))
    h.update(f"{a.dtype}{a.shape}".encode())
    h.update(a.tobytes())
  return h.hexdigest()


def _as_numpy(tree: Any) -> Any:
  import jax

  return jax.tree.map(lambda a: np.asarray(a), tree)


def open_run(
  cfg: Any,
  seed: int,
  directory: str | Path,
  every: int,
  params: Any,
  opt_state: Any,
  elastic: bool = False,
) -> tuple[Checkpoints, State | None]:
  """The checkpoints of the synchronous run ``(cfg, seed)`` in ``directory/seed-S``
  and the state to resume from (None: start afresh). ``params``/``opt_state``: fresh
  ones (the structure). A checkpoint of another config is a :class:`CheckpointError`;
  one of another worker count too, unless ``elastic``."""
  import dataclasses

  identity = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("workers", "seeds")}
  identity = {**identity, "learning_rate": None, "seed": seed}  # lr: scaled by an elastic resume
  ckpt = Checkpoints(Path(directory) / f"seed-{seed}", every, identity)
  state = ckpt.restore(params, opt_state)
  ckpt.learning_rate = cfg.learning_rate
  if state is None:
    return ckpt, None
  if state.workers != cfg.workers and not elastic:
    raise CheckpointError(
      f"--checkpoint-dir {ckpt.directory}: its checkpoint (step {state.step}) was trained by"
      f" {state.workers} workers, this run has --workers {cfg.workers} (launch|cluster"
      " --elastic resumes on fewer)."
    )
  # Elastic: the same batch per worker, the learning rate scaled with the global batch.
  ckpt.learning_rate = state.learning_rate * cfg.workers / state.workers
  ckpt.restarts = [*state.restarts, state.step]
  return ckpt, state
