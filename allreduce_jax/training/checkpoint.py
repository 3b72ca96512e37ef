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

A restore checks what it reads: each checkpoint carries the SHA-256 of the arrays it
saved (:func:`digest`; orbax's OCDBT files keep no checksum of raw float data), and a
checkpoint whose arrays restore to another digest, or that cannot be read at all (a
file truncated, emptied or deleted), is refused with one line naming the step and
what to do (:class:`CheckpointError`); nothing of it is restored. A folder named like
a step that is not a complete checkpoint (no ``_CHECKPOINT_METADATA``, which orbax
writes last) is skipped, with a note.

Elastic resume (fewer workers than the checkpoint's, after ``launch|cluster
--elastic`` restarted the job on the surviving processes): each worker keeps its
batch of ``batch_per_worker`` examples, so the global batch shrinks from ``p·b`` to
``p'·b``, and the learning rate is scaled by ``p'/p`` (the linear scaling rule of
Goyal et al. 2017), so each example moves the parameters as much as before. The
example stream continues where it stopped; the run keeps its number of steps. A
checkpoint keeps the run's base learning rate (the one given, which a resume must
give again) and, as ``segments``, every step range with its workers and learning rate.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

#: Complete checkpoints kept (older ones are deleted once a newer one is complete).
KEEP = 2
#: The file orbax writes last into a step's folder: without it a folder is no checkpoint.
COMPLETE = "_CHECKPOINT_METADATA"


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
    segments: the step ranges trained so far, each ``{"from_step", "to_step",
      "workers", "learning_rate"}`` (one per start or restart; filled in by
      :meth:`Checkpoints.save` when empty).
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
  segments: list[dict] = field(default_factory=list)


class CheckpointError(ValueError):
  """A checkpoint folder that does not belong to this run, or a checkpoint that cannot
  be read or does not match its digest."""


#: What a checkpoint's ``meta`` item holds (a meta without one of them cannot be resumed).
META_KEYS = ("identity", "step", "examples", "workers", "learning_rate", "losses",
             "eval_steps", "test_acc", "restarts", "segments", "digest")  # fmt: skip


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
  its worker count, and the seed); a checkpoint of another run is a
  :class:`CheckpointError` naming the fields that differ, both values and the options
  that resume it.
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
    self.first_step = 0  # the step this process started from
    self.done_segments: list[dict] = []  # the step ranges of the checkpoint resumed from
    self.stray: list[int] = []  # folders named like steps that are not checkpoints
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
    steps = self.complete_steps()
    return steps[0] if steps else None

  def complete_steps(self) -> list[int]:
    """The complete steps saved, newest first; a folder named like a step that is not a
    complete checkpoint is skipped with a note (and left as it is)."""
    steps = sorted(self.manager.all_steps(), reverse=True)
    stray = [s for s in steps if not (self.directory / str(s) / COMPLETE).is_file()]
    self.stray = stray
    if stray:
      names = ", ".join(str(self.directory / str(s)) for s in stray)
      print(
        f"# checkpoints: skipping {names}: not a complete checkpoint (no {COMPLETE})",
        file=sys.stderr,
        flush=True,
      )
    return [s for s in steps if s not in stray]

  def _unreadable(self, step: int, why: str) -> CheckpointError:
    return CheckpointError(
      f"--checkpoint-dir {self.directory}: step {step} cannot be read ({why}); remove"
      f" {self.directory / str(step)} or give an empty folder."
    )

  def _read(self, step: int, **items) -> dict:
    """``items`` of ``step`` (orbax restore args by name); anything orbax or the files
    raise is a :class:`CheckpointError` naming the step."""
    _quiet_closed_loop()
    try:
      return self.manager.restore(step, args=self.ocp.args.Composite(**items))
    except Exception as e:  # orbax, tensorstore, json: a damaged or partial checkpoint
      raise self._unreadable(step, _cause(e)) from None

  def restore(self, params: Any, opt_state: Any) -> State | None:
    """The newest complete checkpoint (``params``/``opt_state``: fresh ones, the
    structure to restore into), or None if there is none. One of another run, one that
    cannot be read and one whose arrays do not match their digest are a
    :class:`CheckpointError`."""
    step = self.latest()
    if step is None:
      return None
    ocp = self.ocp
    meta = self._read(step, meta=ocp.args.JsonRestore())["meta"]
    missing = [k for k in META_KEYS if not isinstance(meta, dict) or k not in meta]
    if missing:
      raise self._unreadable(step, f"its meta has no {', '.join(missing)}")
    self._check_identity(step, meta["identity"])
    tree = {"params": params, "opt_state": opt_state}
    got = _as_numpy(self._read(step, arrays=ocp.args.StandardRestore(tree))["arrays"])
    if digest(got) != meta["digest"]:
      raise CheckpointError(
        f"--checkpoint-dir {self.directory}: step {step} is damaged (its arrays do not match"
        f" the digest saved with them); remove {self.directory / str(step)} to resume from"
        " the step before, or give an empty folder."
      )
    return State(
      step=meta["step"],
      params=got["params"],
      opt_state=got["opt_state"],
      examples=meta["examples"],
      workers=meta["workers"],
      learning_rate=meta["learning_rate"],
      losses=meta["losses"],
      eval_steps=meta["eval_steps"],
      test_acc=meta["test_acc"],
      restarts=meta["restarts"],
      segments=meta["segments"],
    )

  def _check_identity(self, step: int, theirs: Any) -> None:
    """A :class:`CheckpointError` naming the fields where ``theirs`` (the identity
    saved at ``step``) differs from this run's, both values and the options to resume."""
    theirs = theirs if isinstance(theirs, dict) else {}
    differ = sorted(
      k for k in set(theirs) | set(self.identity) if theirs.get(k) != self.identity.get(k)
    )
    if not differ:
      return
    saved = ", ".join(f"{k}={theirs.get(k)!r}" for k in differ)
    ours = ", ".join(f"{k}={self.identity.get(k)!r}" for k in differ)
    again = " ".join(_option(k, theirs[k]) for k in differ if k in theirs and k != "seed")
    raise CheckpointError(
      f"--checkpoint-dir {self.directory}: its checkpoint (step {step}) is of another run"
      f" ({saved}; this run has {ours}); "
      + (f"resume with {again} or give an empty folder." if again else "give an empty folder.")
    )

  def segments(self, step: int, workers: int, learning_rate: float) -> list[dict]:
    """The step ranges that trained the parameters of ``step``: those of the checkpoint
    resumed from, and this process's (from its first step to ``step``, on ``workers``
    at ``learning_rate``)."""
    mine = {"from_step": self.first_step, "to_step": step, "workers": workers,
            "learning_rate": learning_rate}  # fmt: skip
    return [*self.done_segments, mine] if step > self.first_step else list(self.done_segments)

  def save(self, state: State) -> None:
    """Writes ``state`` as step ``state.step`` (atomically: temp folder, then rename),
    with the digest of its arrays, in the background; in process 0 only (the others
    hold the same state)."""
    if not self.writes:
      return
    ocp = self.ocp
    arrays = {"params": state.params, "opt_state": state.opt_state}
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
      "segments": state.segments or self.segments(state.step, state.workers, state.learning_rate),
      "digest": digest(arrays),
    }
    path = self.directory / str(state.step)
    if path.exists() and not (path / COMPLETE).is_file():
      raise CheckpointError(
        f"--checkpoint-dir {self.directory}: {path} is in the way of step {state.step}'s"
        " checkpoint and is not one; move it away or give an empty folder."
      )
    self.manager.save(
      state.step,
      args=ocp.args.Composite(arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)),
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


def _cause(e: BaseException, limit: int = 160) -> str:
  """The innermost cause of ``e``, its first line, at most ``limit`` characters."""
  while e.__cause__ is not None or (e.__context__ is not None and not e.__suppress_context__):
    e = e.__cause__ or e.__context__
  text = (str(e).strip().splitlines() or [""])[0]
  text = f"{type(e).__name__}: {text}" if text else type(e).__name__
  return text if len(text) <= limit else text[: limit - 1] + "…"


def _quiet_closed_loop() -> None:
  """Drops the noise of a failed restore: tensorstore still completes the reads the
  failure cut short and reports each to orbax's event loop, closed by then ("Event loop
  is closed" through ``sys.unraisablehook``, a traceback each, even after the error is
  raised); they say nothing more than the error. Every other unraisable exception is
  shown as before."""
  shown = sys.unraisablehook
  if getattr(shown, "quiet_closed_loop", False):
    return

  def hook(unraisable):
    e = unraisable.exc_value
    if not (isinstance(e, RuntimeError) and str(e) == "Event loop is closed"):
      shown(unraisable)

  hook.quiet_closed_loop = True
  sys.unraisablehook = hook


def _option(field_name: str, value: Any) -> str:
  """``--field-name VALUE`` as the command line takes it (``--learning-rate 0.05``)."""
  if isinstance(value, list | tuple):
    text = ",".join(map(str, value))
  else:
    text = "none" if value is None else str(value)
  return f"--{field_name.replace('_', '-')} {text}"


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

  # The learning rate given is the run's base rate: a resume must give it again (an
  # elastic one trains at it scaled by its workers, from the last step's rate).
  identity = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("workers", "seeds")}
  identity = {**identity, "seed": seed}
  ckpt = Checkpoints(Path(directory) / f"seed-{seed}", every, identity)
  state = ckpt.restore(params, opt_state)
  _check_in_the_way(ckpt, 0 if state is None else state.step, cfg.steps)
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
  ckpt.first_step, ckpt.done_segments = state.step, list(state.segments)
  return ckpt, state


def _check_in_the_way(ckpt: Checkpoints, first: int, steps: int) -> None:
  """Before training from step ``first`` to ``steps``: a folder named like a step this
  run will save that is not a checkpoint is a :class:`CheckpointError` now, not after
  the steps before it were trained."""
  saves = [s for s in ckpt.stray if first < s <= steps and (s % ckpt.every == 0 or s == steps)]
  if saves:
    path = ckpt.directory / str(saves[-1])
    raise CheckpointError(
      f"--checkpoint-dir {ckpt.directory}: {path} is not a complete checkpoint (no {COMPLETE})"
      f" and is in the way of step {saves[-1]}'s; move it away or give an empty folder."
    )
