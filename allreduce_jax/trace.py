"""Watch an algorithm run: who holds which contributions after every message step.

Participant ``j`` starts with element ``k`` set to ``2**j + k * 2**p`` (int32), and the
algorithm sums. Any partial sum over a set S of participants is then
``mask(S) + |S|·k·2**p``, so every received element tells exactly which element it is
and whose contributions it already contains. Recording every ``ppermute`` of the real
compiled program (``_comm.recording_messages``) and decoding what arrived gives each
participant's knowledge after each step: the picture is drawn from the execution, not
from a description of the algorithm.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import _comm, devices
from allreduce_jax._api import all_reduce


@dataclass(frozen=True)
class Frame:
  """State after one message step.

  Attributes:
    step: 0 for the initial state, then 1, 2, ... per ``ppermute``.
    pairs: the step's ``(source, target)`` pairs over the flattened axis index.
    known: ``bool[p, n, p]``: ``known[i, k, j]`` — participant i's copy of element k
      already contains participant j's contribution.
  """

  step: int
  pairs: tuple[tuple[int, int], ...]
  known: np.ndarray

  @property
  def counts(self) -> np.ndarray:
    """``int[p, n]``: how many contributions each participant's element k holds."""
    return self.known.sum(-1)


def _encode(p: int, n: int) -> np.ndarray:
  j = np.arange(p)[:, None]
  k = np.arange(n)[None, :]
  return ((1 << j) + (k << p)).astype(np.int32)  # int32[p, n]


def _decode(values: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray]:
  """int values -> (element index or -1 for nothing/padding, contributor mask bits)."""
  mask = values & ((1 << p) - 1)
  count = np.array([bin(int(m)).count("1") for m in mask.ravel()]).reshape(mask.shape)
  k = np.where(count > 0, (values >> p) // np.maximum(count, 1), -1)
  bits = (mask[..., None] >> np.arange(p)) & 1
  return k, bits.astype(bool)


def run_trace(algorithm: str, p: int, n: int | None = None) -> list[Frame]:
  """Runs ``algorithm`` on ``p`` participants with ``n`` elements (default p) each and
  returns the knowledge of every participant after every message step.

  Example:
    >>> frames = run_trace("ring", 4)
    >>> len(frames) - 1  # 2(p-1) steps
    6
    >>> frames[-1].counts.min() == 4  # everyone has everything
    np.True_
  """
  if not 1 <= p <= 20:
    raise ValueError(f"p={p}: tracing encodes participants as bits; use 1 <= p <= 20.")
  n = p if n is None else n
  if n < 1 or (n * p) << p >= 2**31:
    raise ValueError(f"n={n} is too large to encode for p={p}.")
  mesh, axis = devices.mesh_for(algorithm, p)
  x = _encode(p, n)

  def body(block):
    with _comm.recording_messages() as log:
      out = all_reduce(block[0], axis, op="sum", algorithm=algorithm)
    # Per-participant received payloads, and the flattened index for each log entry.
    received = [r[None] for _, _, r in log]
    return out[None], received

  # Trace once to learn the static schedule (pairs and their axis) in order.
  with _comm.recording_messages() as schedule_log:
    jax.eval_shape(
      jax.shard_map(lambda b: all_reduce(b[0], axis, op="sum", algorithm=algorithm)[None], mesh=mesh,
                    in_specs=P(axis), out_specs=P(axis)),
      jax.ShapeDtypeStruct(x.shape, jnp.int32, sharding=NamedSharding(mesh, P(axis))),
    )  # fmt: skip
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(axis), out_specs=P(axis)))
  _, received = f(jax.device_put(jnp.asarray(x), NamedSharding(mesh, P(axis))))

  known = np.zeros((p, n, p), bool)
  known[np.arange(p), :, np.arange(p)] = True
  frames = [Frame(0, (), known.copy())]
  shape = mesh.devices.shape
  for step, ((sub_axis, pairs, _), payload) in enumerate(zip(schedule_log, received), 1):
    payload = devices.fetch(payload)  # int32[p, m]
    global_pairs = _comm.global_pairs(sub_axis, pairs, axis, shape)
    targets = {t for _, t in global_pairs}
    k, bits = _decode(payload, p)
    for t in targets:
      for slot in range(payload.shape[1]):
        if k[t, slot] >= 0:
          known[t, k[t, slot]] |= bits[t, slot]
    frames.append(Frame(step, tuple(global_pairs), known.copy()))
  return frames


def holdings(frame: Frame) -> list[list[str]]:
  """``[participant][element]``: whose contributions that participant's copy of the
  element holds, as their numbers run together (``"03"``: the partial sum x0 + x3).

  Example:
    >>> [" ".join(h) for h in holdings(run_trace("ring", 4)[1])]
    ['0 0 03 0', '1 1 1 01', '12 2 2 2', '3 23 3 3']
  """
  p = frame.known.shape[-1]
  return [
    ["".join(str(j) for j in range(p) if held[j]) for held in participant]
    for participant in frame.known
  ]


def _covered(sets: list[np.ndarray]) -> bool:
  """Whether some of ``sets`` (bool[p] each) are pairwise disjoint and cover all p."""
  for r in range(1, len(sets) + 1):
    for chosen in itertools.combinations(sets, r):
      total = np.sum(chosen, axis=0)
      if np.all(total == 1):
        return True
  return False


def after_a_death(frame: Frame, dead: int) -> dict[str, int]:
  """What the survivors hold of each element if participant ``dead`` dies after
  ``frame``'s step: ``held``: elements whose total a survivor already holds;
  ``completable``: elements whose total the survivors' partial sums still add up to
  (some of them disjoint and covering everyone, the dead one's contribution included);
  ``lost``: elements for which they do not (the step must be done again, without the
  dead one or from a checkpoint). Counts over the elements, of what the algorithm's
  working copies hold (the survivors' own inputs are not counted).

  Example:
    >>> after_a_death(run_trace("ring", 4)[3], dead=1)  # after the reduce-scatter
    {'held': 3, 'completable': 0, 'lost': 1}
  """
  p, n, _ = frame.known.shape
  if not 0 <= dead < p:
    raise ValueError(f"dead={dead}: expected a participant in 0..{p - 1}.")
  out = {"held": 0, "completable": 0, "lost": 0}
  for k in range(n):
    sets = [frame.known[i, k] for i in range(p) if i != dead]
    if any(s.all() for s in sets):
      out["held"] += 1
    elif _covered(sets):
      out["completable"] += 1
    else:
      out["lost"] += 1
  return out


def failure_table(algorithm: str, p: int = 4) -> str:
  """Markdown: ``algorithm``'s executed schedule on ``p`` participants (``p`` elements
  each), what every participant holds after each step (:func:`holdings`), and what
  the survivors hold if one participant dies after it (:func:`after_a_death`). The
  tables of ``docs/faults.md``."""
  if not 2 <= p <= 12:
    raise ValueError(f"p={p}: the failure table is for 2 <= p <= 12.")
  frames = run_trace(algorithm, p)
  head = ["step", "sends", *[f"participant {i}" for i in range(p)]]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for f in frames:
    sends = " ".join(f"{s}→{t}" for s, t in f.pairs) or "–"
    cells = [f"`{' '.join(h)}`" for h in holdings(f)]
    lines.append(f"| {f.step or 'start'} | {sends} | " + " | ".join(cells) + " |")
  head = ["dies after step", *[f"participant {i}" for i in range(p)]]
  lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for f in frames:
    cells = []
    for dead in range(p):
      counts = after_a_death(f, dead)
      cells.append(", ".join(f"{v} {k}" for k, v in counts.items() if v))
    lines.append(f"| {f.step or 'start'} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot_trace(frames: list[Frame], title: str = "", max_cols: int = 8):
  """Small multiples: one panel per step, rows = participants, columns = elements,
  colour and number = contributions held. Arrows of the step listed in the title."""
  import matplotlib.pyplot as plt  # here: only drawing needs matplotlib (~0.5 s to import)

  cols = min(max_cols, len(frames))
  rows = -(-len(frames) // cols)
  p, n = frames[0].counts.shape
  fig, axes = plt.subplots(rows, cols, figsize=(1.0 + 0.45 * n * cols, 0.9 + 0.45 * p * rows),
                           squeeze=False)  # fmt: skip
  for ax in axes.ravel()[len(frames) :]:
    ax.axis("off")
  for ax, frame in zip(axes.ravel(), frames):
    ax.imshow(frame.counts, vmin=0, vmax=p, cmap="Blues")
    for (i, k), c in np.ndenumerate(frame.counts):
      ax.text(
        k, i, str(c), ha="center", va="center", fontsize=7, color="white" if c > p / 2 else "black"
      )
    label = "start" if frame.step == 0 else f"step {frame.step}"
    if frame.pairs and len(frame.pairs) <= 3:
      label += "\n" + " ".join(f"{s}→{t}" for s, t in frame.pairs)
    ax.set_title(label, fontsize=8)
    ax.set_xticks(range(n))
    ax.set_yticks(range(p))
    ax.tick_params(labelsize=6)
  axes[0, 0].set_ylabel("participant")
  axes[-1, 0].set_xlabel("element")
  fig.suptitle(title or "contributions held by each participant after each message step")
  fig.tight_layout()
  return fig
