"""The algorithm registry: the :class:`Algorithm` record, :data:`ALGORITHMS`, :func:`register`
and :func:`names`.

The bottom floor of the package: it imports no other module of it but the wire
formats (:mod:`allreduce_jax._wire`, itself on the floor). Each algorithm
module (``_ring.py``, ``_tree.py``, ...) registers its own complete record when it is
imported; ``_api`` imports them in the registry's order. Everything that needs to know
about an algorithm (dispatch, the cost model, the topology replay, bench, verify,
audit, scaling, the report, the notebooks) reads these records; nothing special-cases
a name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from allreduce_jax import _wire

#: A per-shard all-reduce: ``fn(flat: T[n], axis_name, combine) -> T[n]``.
ShardFn = Callable[..., Any]
#: A per-shard reduce-scatter: ``fn(flat: T[p*c], axis_name, combine) -> T[c]``,
#: participant ``i`` (in the mesh's order) getting reduced chunk ``i``.
ReduceScatterFn = Callable[..., Any]
#: A per-shard all-gather: ``fn(block: T[c], axis_name) -> T[p*c]``, block ``j``
#: of the result being participant ``j``'s.
AllGatherFn = Callable[..., Any]


@dataclass(frozen=True)
class Algorithm:
  """One registry record: everything a consumer needs to know about an algorithm.

  Tools, tests, the report and the notebooks derive every subset of algorithms
  from these fields; nothing outside the algorithm's own module special-cases a name.
  New fields get a default, so every existing record stays valid.

  Attributes:
    name: the registry key (``all_reduce(..., algorithm=name)``).
    fn: the per-shard function ``fn(flat: T[n], axis_name, combine) -> T[n]``.
    axes: how many mesh axes it takes: 1 means one axis name (or a tuple of names
      treated as their product, like ``lax.psum``); k > 1 means a tuple of at least
      k names, one per level, outer first (``hierarchical``: ``(outer, inner)``);
      ``devices.mesh_for`` builds a k-axis mesh for it.
    hand_written: False for XLA's own collective (the reference).
    auto: a candidate for ``algorithm="auto"`` (needs ``axes == 1`` and ``schedule``).
    schedule: the closed-form cost, ``schedule(p, n_bytes, inner) -> cost_model.Schedule``
      (``inner`` = the inner axis size for multi-axis algorithms); None: not priced.
    messages: the step generator for topology replay, ``messages(sizes) -> steps``:
      ``sizes`` are the mesh axis sizes (``(p,)`` for one axis), each step is a list of
      ``(src, dst, fraction_of_n[, combined])`` with participants numbered in mesh
      (row-major) order; it must equal the schedule traced from ``fn``. None: not
      replayable.
    ppermutes: the same schedule one step per ``ppermute``, for records whose
      ``messages`` steps hold several ppermutes in flight together (a ``_comm.concurrent``
      block: the bidirectional ring's two lanes, a double-tree round), same signature;
      it must equal the traced schedule with every send its own step. A backend that
      runs its collectives one at a time (XLA:CPU, over gloo) runs these steps in turn:
      :mod:`allreduce_jax.gloo_model` prices them so. None: each ``messages`` step is
      one ppermute.
    two_level: the time on a two-level machine (nodes of fast links joined by slow
      ones), ``two_level(p, n_bytes, machine: cost_model.TwoLevel) -> seconds``; None:
      no two-level model (``cost_model.predict_two_level_seconds`` then prices it on
      the inner links within one node and refuses it across nodes).
    at_scale: swept to thousands of participants by ``allreduce-jax scaling`` (both
      its two-level and its ``--topology`` sweep); False for a baseline whose schedule
      is not meant for that (``naive``: 2(p-1) distinct steps through one root;
      ``two_shot``: 2(p-1) distinct steps of p messages each, O(p²) to replay).
    summary: one line for ``--help`` and tables.
    lossy: True if the result is not exact even with ``wire=None`` (then verify
      checks it against an error bound, and ``auto`` never picks it).
    wires: the wire formats (``all_reduce(..., wire=...)``) it can send in; every
      hand-written algorithm sends through ``_comm.send``, so all of ``_wire.WIRES``.
    reduce_scatter, all_gather: the algorithm's two halves as per-shard functions
      of their own (:data:`ReduceScatterFn`, :data:`AllGatherFn`), for
      :func:`allreduce_jax.reduce_scatter` and :func:`allreduce_jax.all_gather`:
      the reduce-scatter leaves participant ``i`` chunk ``i`` of the reduction, the
      all-gather hands every participant's block to everyone; the all-reduce is the
      one followed by the other. None: no halves (a tree reduces to a root, not to
      slices). Both or neither.
    choices: the choices its schedule makes at trace time, ``choices(p, n_bytes) ->
      dict``, from the cost parameters in effect (``cost_model.use_params``, else the
      backend's), as keyword arguments its ``messages``, ``ppermutes`` and
      ``schedule`` take (the double binary tree: ``{"chunks": k}``). ``bench`` records
      them in each row (``choices``), the replay keys its caches on them, and a model
      handed a row's choices prices the schedule that ran. None: it makes none.
  """

  name: str
  fn: ShardFn
  axes: int = 1
  hand_written: bool = True
  auto: bool = True
  schedule: Callable[..., Any] | None = None
  messages: Callable[..., list] | None = None
  ppermutes: Callable[..., list] | None = None
  two_level: Callable[..., float] | None = None
  at_scale: bool = True
  summary: str = ""
  lossy: bool = False
  wires: tuple[str | None, ...] = _wire.WIRES
  choices: Callable[..., dict] | None = None
  reduce_scatter: ReduceScatterFn | None = None
  all_gather: AllGatherFn | None = None

  @property
  def halves(self) -> bool:
    """True if the record has a reduce-scatter and an all-gather of its own."""
    return self.reduce_scatter is not None and self.all_gather is not None

  def __call__(self, flat, axis_name, combine):
    return self.fn(flat, axis_name, combine)

  def wire_bytes(
    self, p: int, wire: str | None = None, n: int = 1 << 20, itemsize: int = 4, inner=None
  ):
    """Bytes the busiest participant puts on the wire per input element, for an
    ``n``-element float input of ``itemsize`` bytes sent in format ``wire`` (scales
    included); None if the record has no schedule or cannot send in ``wire``. A
    multi-axis algorithm needs the mesh's ``inner`` size(s), as its ``schedule`` does.

    Example:
      >>> round(ALGORITHMS["ring"].wire_bytes(8, "int8") / ALGORITHMS["ring"].wire_bytes(8), 3)
      0.254
    """
    if self.schedule is None or wire not in self.wires:
      return None
    per_element = _wire.get(wire).bytes_per_element(max(1, n // max(p, 1)), itemsize)
    return self.schedule(p, n * per_element, inner).max_sent_bytes / n


#: name -> :class:`Algorithm` record, in registration order. :func:`register` adds one.
ALGORITHMS: dict[str, Algorithm] = {}


def register(record: Algorithm, *, replace: bool = False) -> Algorithm:
  """Adds ``record`` to :data:`ALGORITHMS`; verify, bench, audit, scaling and the
  report pick it up from there with no other change.

  Example:
    >>> from allreduce_jax import ALGORITHMS, Algorithm, register
    >>> def via_psum(flat, axis_name, combine):  # flat: T[n]
    ...   return ALGORITHMS["psum"](flat, axis_name, combine)
    >>> _ = register(Algorithm("my_psum", via_psum, auto=False, summary="a toy"))
    >>> "my_psum" in ALGORITHMS
    True
    >>> del ALGORITHMS["my_psum"]
  """
  if not isinstance(record, Algorithm):
    raise TypeError(f"register expects an Algorithm record, got {type(record).__name__}.")
  if not record.name or not isinstance(record.name, str):
    raise ValueError(f"Algorithm.name must be a non-empty str, got {record.name!r}.")
  if record.name in ALGORITHMS and not replace:
    raise ValueError(f"algorithm {record.name!r} is already registered (pass replace=True).")
  if record.axes < 1:
    raise ValueError(f"Algorithm.axes must be at least 1, got {record.axes}.")
  if record.auto and (record.axes != 1 or record.schedule is None):
    raise ValueError(
      f"algorithm {record.name!r}: auto=True needs axes=1 and a schedule (the cost model)."
    )
  if record.auto and record.lossy:
    raise ValueError(f"algorithm {record.name!r}: a lossy algorithm cannot be an auto candidate.")
  if (record.reduce_scatter is None) != (record.all_gather is None):
    raise ValueError(
      f"algorithm {record.name!r}: give both reduce_scatter and all_gather, or neither."
    )
  ALGORITHMS[record.name] = record
  return record


def names(
  *,
  axes: int | None = None,
  hand_written: bool | None = None,
  auto: bool | None = None,
  priced: bool | None = None,
  replayable: bool | None = None,
  two_level: bool | None = None,
  at_scale: bool | None = None,
  halves: bool | None = None,
) -> tuple[str, ...]:
  """Registry keys filtered by record fields, in registration order.

  ``priced``: has a ``schedule``; ``replayable``: has a ``messages`` generator;
  ``two_level``: has a two-level model; ``halves``: has a reduce-scatter and an
  all-gather of its own; the others: the fields of those names.

  Example:
    >>> names(axes=1, hand_written=True)[:3]
    ('ring', 'bidirectional_ring', 'tree')
  """
  return tuple(
    r.name
    for r in ALGORITHMS.values()
    if (axes is None or r.axes == axes)
    and (hand_written is None or r.hand_written == hand_written)
    and (auto is None or r.auto == auto)
    and (priced is None or (r.schedule is not None) == priced)
    and (replayable is None or (r.messages is not None) == replayable)
    and (two_level is None or (r.two_level is not None) == two_level)
    and (at_scale is None or r.at_scale == at_scale)
    and (halves is None or r.halves == halves)
  )


def check_algorithm(algorithm: str) -> None:
  """``ValueError`` naming the argument and the choices unless ``algorithm`` is a key."""
  if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
    raise ValueError(
      f"algorithm={algorithm!r} is not supported; expected one of {sorted(ALGORITHMS)}."
    )


__all__ = [
  "ALGORITHMS",
  "Algorithm",
  "AllGatherFn",
  "ReduceScatterFn",
  "ShardFn",
  "check_algorithm",
  "names",
  "register",
]
