"""Small helpers shared by the algorithm modules: axes, permutations, padding."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from allreduce_jax import _wire

AxisName = str | tuple[str, ...]


def axes_tuple(axis_name: AxisName) -> tuple[str, ...]:
  """``'x'`` -> ``('x',)``; a tuple of names is put in the mesh's axis order.

  ``lax.axis_index(('b', 'a'))`` linearizes in the order given, but ``lax.ppermute``
  over ``('b', 'a')`` numbers participants in the mesh's order (JAX 0.10), so a
  schedule built from one and sent with the other would misroute. Using the mesh
  order for both keeps them consistent; the reduction over the product of the axes
  does not depend on the order.
  """
  if not isinstance(axis_name, (tuple, list)):
    return (axis_name,)
  names = tuple(axis_name)
  try:
    mesh_order = tuple(jax.sharding.get_abstract_mesh().axis_names)
  except Exception:  # pragma: no cover - outside a mesh context in older JAX
    return names
  if all(a in mesh_order for a in names):
    return tuple(sorted(names, key=mesh_order.index))
  return names


def size(axis_name: AxisName) -> int:
  """Number of participants along ``axis_name`` (product over a tuple), static."""
  return int(lax.axis_size(axes_tuple(axis_name)))


def index(axis_name: AxisName) -> jax.Array:
  """This participant's linear index along ``axis_name`` (traced int32)."""
  return lax.axis_index(axes_tuple(axis_name))


def make_varying(x: jax.Array, axis_name: AxisName) -> jax.Array:
  """Marks ``x`` as varying over ``axis_name`` (no data movement).

  Typed shard_map tracks which mesh axes a value varies over; a ppermute result is
  always varying, so the input is made varying too before the two are mixed.
  A no-op when shard_map runs with ``check_vma=False``.
  """
  aval = jax.typeof(x)
  mat = getattr(aval, "manual_axis_type", None)  # jax >= 0.10
  varying = mat.varying if mat is not None else getattr(aval, "vma", frozenset())
  manual = _manual_axes()  # vmap(axis_name=...) axes are not typed: nothing to mark
  missing = tuple(a for a in axes_tuple(axis_name) if a not in varying and a in manual)
  if not missing:
    return x
  if hasattr(lax, "pcast"):
    return lax.pcast(x, missing, to="varying")
  return lax.pvary(x, missing)  # jax < 0.8


def _manual_axes() -> frozenset:
  """The shard_map (manual) mesh axes bound here; empty outside shard_map (``vmap``)."""
  try:
    return frozenset(jax.sharding.get_abstract_mesh().manual_axes)
  except Exception:  # pragma: no cover - depends on the JAX version
    return frozenset()


# Trace-time message log used by ``allreduce_jax.trace`` to draw an algorithm's real
# schedule; None (the default) records nothing.
_message_log: list | None = None


@contextlib.contextmanager
def recording_messages():
  """While active, every :func:`send` traced appends ``(axis_name, pairs, received)``;
  each entry's ``.step`` is the :func:`concurrent` block it was sent in (None: its own step)."""
  global _message_log
  previous, _message_log = _message_log, []
  try:
    yield _message_log
  finally:
    _message_log = previous


class _Message(tuple):
  """A log entry ``(axis_name, pairs, received)`` with the ``step`` it belongs to."""

  step: int | None = None


_step: int | None = None  # the open concurrent() block, if any
_steps = itertools.count()


@contextlib.contextmanager
def concurrent():
  """The sends traced inside form ONE message step: independent transfers in flight
  together, like the two lanes of a bidirectional ring. Outside such a block every
  send is its own step. Only the recorded schedule (``topology.traced_messages``)
  reads this; the program is unchanged."""
  global _step
  previous = _step
  _step = next(_steps) if previous is None else previous
  try:
    yield
  finally:
    _step = previous


def send(x: jax.Array, axis_name: AxisName, pairs: Sequence[tuple[int, int]]) -> jax.Array:
  """One message step: ``x`` travels along each ``(source, target)`` pair.

  Participants that receive nothing get zeros (``lax.ppermute`` semantics).
  Inside ``_wire.using(fmt)`` (``all_reduce(..., wire=...)``) a float message travels
  encoded in that wire format and arrives decoded (``_wire.roundtrip``): the one
  place every algorithm's messages are narrowed.
  """
  fmt = _wire.active()
  if fmt is None or not jnp.issubdtype(x.dtype, jnp.floating) or x.shape[0] == 0:
    received = _ppermute(x, axes_tuple(axis_name), list(pairs))
  else:
    msg = _ppermute(_wire.encode(fmt, x), axes_tuple(axis_name), list(pairs))
    received = _wire.decode(fmt, msg, x.shape[0], x.dtype)
  if _message_log is not None:
    entry = _Message((axis_name, list(pairs), received))
    entry.step = _step
    _message_log.append(entry)
  return received


def settle(x: jax.Array) -> jax.Array:
  """What a receiver of ``x`` would hold: ``x`` on the active wire format's grid
  (``x`` itself when exact).

  An algorithm calls it where a participant keeps a value it also sends on (a
  finished chunk before the all-gather, the root's total before the broadcast), so
  that it holds the same bits as everyone it sends to. Encoding a settled value
  gives the same message again (every format is a projection), so forwarding it
  changes nothing.
  """
  return _wire.roundtrip(_wire.active(), x)


@dataclass
class Finishing:
  """The op's finish (``mean``'s division, canonical NaNs) for one ``all_reduce``
  over ``axes``; ``applied`` turns true when an algorithm applied it to its pieces."""

  axes: tuple[str, ...]
  fn: Callable[[jax.Array], jax.Array]
  applied: bool = False


_finishing: Finishing | None = None


@contextlib.contextmanager
def finishing(fn: Callable[[jax.Array], jax.Array], axis_name: AxisName):
  """Within: :func:`finished` applies ``fn`` to the finished pieces of an all-reduce
  over the whole ``axis_name``. Yields the :class:`Finishing`; when its ``applied``
  is false afterwards, the caller applies ``fn`` to the whole result itself."""
  global _finishing
  saved, _finishing = _finishing, Finishing(axes_tuple(axis_name), fn)
  try:
    yield _finishing
  finally:
    _finishing = saved


def finished(x: jax.Array, axis_name: AxisName) -> jax.Array:
  """``x`` is a finished piece of the result (reduced over all of ``axis_name``)
  that its owner is about to hand out unchanged: apply the op's finish here, once,
  to n/p elements instead of the whole result on every participant.

  An algorithm calls it only where *every* element of its result passes through it
  (the ring's, two-shot's and the butterfly's reduced slices before their
  all-gather). Over a sub-axis (a stage of a hierarchical scheme), under a lossy
  wire (the decoded result is finished, as its error analysis assumes) or outside
  :func:`finishing` it returns ``x`` and the whole result is finished at the end.
  Elementwise, so the bits are those of finishing the whole result.
  """
  f = _finishing
  if f is None or axes_tuple(axis_name) != f.axes or _wire.active() is not None:
    return x
  f.applied = True
  return f.fn(x)


def _ppermute(x: jax.Array, axes: tuple[str, ...], pairs: list[tuple[int, int]]) -> jax.Array:
  """``lax.ppermute``; under ``jax.vmap(..., axis_name=...)``, whose batching rule takes
  full permutations only, a partial one (a tree's step) is completed with filler pairs
  and the receivers outside ``pairs`` get zeros, as ppermute gives them."""
  manual = _manual_axes()
  p = size(axes)
  if all(a in manual for a in axes) or len(pairs) == p:
    return lax.ppermute(x, axes, perm=pairs)
  sources, targets = {s for s, _ in pairs}, {t for _, t in pairs}
  filler = zip(sorted(set(range(p)) - sources), sorted(set(range(p)) - targets))
  received = lax.ppermute(x, axes, perm=pairs + list(filler))
  mine = jnp.isin(index(axes), jnp.asarray(sorted(targets), jnp.int32))
  return jnp.where(mine, received, jnp.zeros_like(received))


def shift_pairs(p: int, d: int) -> list[tuple[int, int]]:
  """Every participant ``j`` sends to ``(j + d) mod p``: one hop around a ring."""
  return [(j, (j + d) % p) for j in range(p)]


def pad_to_multiple(flat: jax.Array, m: int) -> jax.Array:
  """Zero-pads a 1-D array to a length that is a multiple of ``m``."""
  extra = (-flat.shape[0]) % m
  return jnp.pad(flat, (0, extra)) if extra else flat


def chunk(flat: jax.Array, k: jax.Array, c: int) -> jax.Array:
  """The ``k``-th block of ``c`` elements of ``flat`` (``k`` may be traced)."""
  return lax.dynamic_slice_in_dim(flat, k * c, c)


def global_pairs(sub_axis, pairs, axis, mesh_shape) -> list[tuple[int, int]]:
  """Maps pairs over ``sub_axis`` (one axis of a k-D mesh over ``axis``) to row-major
  participant numbers of the whole mesh."""
  if axes_tuple(sub_axis) == axes_tuple(axis):
    return [tuple(pair) for pair in pairs]
  names = axes_tuple(axis)
  pos = names.index(sub_axis)
  out = []
  for index in np.ndindex(*mesh_shape):
    for src, dst in pairs:
      if index[pos] == src:
        to = list(index)
        to[pos] = dst
        out.append((int(np.ravel_multi_index(index, mesh_shape)),
                    int(np.ravel_multi_index(tuple(to), mesh_shape))))  # fmt: skip
  return out
