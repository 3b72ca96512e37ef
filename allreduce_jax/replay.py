"""Replay an all-reduce's message steps on a network (:mod:`allreduce_jax.networks`).

The flat α-β model (:mod:`allreduce_jax.cost_model`) charges every message step
α + (largest message)·β, wherever the messages go. On a real fabric a message
crosses several links and shares them with others, so two algorithms that send the
same bytes can differ by an order of magnitude. Here a schedule is data: a list of
steps, each a list of messages ``(src, dst, fraction_of_n, combined)`` (participants
numbered row-major over the mesh; ``combined``: the receiver reduces it). Each
message is routed on the topology, and a step costs

  α (+ per-hop latency × the longest route) + max over directed links of
  (bytes on the link / its capacity)·β (+ γ·the most bytes one participant reduces).

Steps run one after another (bulk-synchronous): no overlap between steps.

Schedules come from two places, checked equal at every p that can be traced
(``tests/test_topology.py``):

- :func:`traced_messages`: the executed program's own sends (the message log of
  ``_comm.send`` that ``trace`` draws), with their pairs and bytes;
- ``ALGORITHMS[name].messages(sizes)``: each algorithm's step generator (in its own
  module, registered with its record), used at thousands of participants where
  nothing can be traced.

How the steps run is :func:`messages`' ``duplex`` (:data:`DUPLEX`): ``"full"``, a step's
messages together on full-duplex links (the generators' own steps); ``"recv_first"``,
one step per ``ppermute``, as XLA:CPU runs its collectives one at a time (the record's
``ppermutes`` where a step holds several); ``"half"``, those steps with an exchange's two
directions taking turns, as XLA:CPU runs them over gloo (:func:`half_duplex`;
:mod:`allreduce_jax.gloo_model` says why).

What is modelled: full-duplex links, minimal-hop dimension-order routing on tori,
ideal ECMP (uplink load spread evenly) on fat trees, a dedicated NIC per participant
between islands. What is not: collisions of real routing beyond dimension order,
adaptive routing, congestion control, pipelining across steps, in-switch reduction
(NVLS / SHARP), and NCCL's multi-channel rings (several rings striped over every NIC).

Pure NumPy, except :func:`traced_messages`, which traces the real program with JAX.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import _comm, devices, registry
from allreduce_jax._machine import DEFAULT_PARAMS, Params, resolve
from allreduce_jax.networks import FatTree, Islands, Network, Torus, even_dims, switch
from allreduce_jax.registry import ALGORITHMS

#: One message: ``(src, dst, fraction_of_n, combined)`` (a 3-tuple is not combined).
Message = tuple
Step = list
Steps = list


def _arrays(step: Step):
  """A step's messages as arrays (src, dst, frac, combined)."""
  if not step:
    z = np.zeros(0, np.int64)
    return z, z, np.zeros(0), np.zeros(0, bool)
  src = np.fromiter((m[0] for m in step), np.int64, len(step))
  dst = np.fromiter((m[1] for m in step), np.int64, len(step))
  frac = np.fromiter((m[2] for m in step), np.float64, len(step))
  comb = np.fromiter((len(m) > 3 and bool(m[3]) for m in step), bool, len(step))
  return src, dst, frac, comb


@dataclass(frozen=True)
class Profile:
  """A schedule's per-step numbers on one topology, independent of n and the params.

  Attributes:
    topology: the (fitted) topology.
    load: ``{link class: float[steps]}``, the busiest link of that class per step,
      in units of n per link capacity.
    hops: ``int[steps]``: the longest route of each step.
    inter: ``bool[steps]``: some message leaves its island (``Islands`` only).
    reduced: ``float[steps]``: the most (fraction of n) any participant reduces.
    busiest: per step, ``(link class, index)`` of its most loaded link.
    flagged: the messages say whether they are combined (4-tuples); if not, ``reduced``
      is 0 and :func:`predict_seconds` prices γ from the closed form.
  """

  topology: Network
  load: dict[str, np.ndarray]
  hops: np.ndarray
  inter: np.ndarray
  reduced: np.ndarray
  busiest: list[tuple[str, int]] = field(repr=False)
  flagged: bool = True

  @property
  def steps(self) -> int:
    return len(self.hops)

  def max_load(self) -> np.ndarray:
    """``float[steps]``: the busiest link of any class, in units of n / capacity."""
    if not self.load:
      return np.zeros(self.steps)
    return np.max(np.stack(list(self.load.values())), axis=0)

  def seconds(self, n_bytes: float, params: Params) -> np.ndarray:
    """``float[steps]``: α (+ hop latency) + max load × β (+ γ × reduced) per step, for
    ``n_bytes`` per participant. ``Islands`` use their own α, β per level."""
    top = self.topology
    reduce = params.gamma * n_bytes * self.reduced
    if isinstance(top, Islands):
      a, b = top.intra, top.inter
      intra = np.maximum(self.load.get("intra out", 0), self.load.get("intra in", 0))
      inter = np.maximum(self.load.get("inter out", 0), self.load.get("inter in", 0))
      latency = np.where(self.inter, b.alpha, a.alpha)
      return latency + np.maximum(intra * a.beta, inter * b.beta) * n_bytes + reduce
    latency = params.alpha + top.hop_latency * self.hops
    return latency + self.max_load() * n_bytes * params.beta + reduce


def profile(steps: Steps, topology: Network, p: int | None = None) -> Profile:
  """Routes every step of ``steps`` on ``topology`` (fitted to ``p`` participants,
  default: the highest participant number in the schedule + 1).

  Identical steps (the same list object repeated, as the generators return them) are
  routed once, so a 16384-participant ring (32766 steps) costs two routings.
  """
  if p is None:
    p = 1 + max((max(m[0], m[1]) for s in _distinct_steps(steps) for m in s), default=0)
  top = topology.fit(p)
  cache: dict[int, tuple] = {}
  rows = []
  for step in steps:
    key = id(step)
    if key not in cache:
      src, dst, frac, comb = _arrays(step)
      if len(src) == 0:
        cache[key] = ({}, 0, False, 0.0, ("none", 0))
      else:
        loads = top.link_loads(src, dst, frac)
        peak = {c: float(v.max()) if v.size else 0.0 for c, v in loads.items()}
        cls = max(peak, key=peak.get)
        where = int(np.argmax(loads[cls])) if loads[cls].size else 0
        inter = isinstance(top, Islands) and bool(np.any(src // top.group != dst // top.group))
        reduced = float(np.bincount(dst[comb], frac[comb]).max()) if comb.any() else 0.0
        cache[key] = (peak, int(top.hops(src, dst).max()), inter, reduced, (cls, where))
    rows.append(cache[key])
  classes = sorted({c for r in rows for c in r[0]})
  return Profile(
    top,
    {c: np.array([r[0].get(c, 0.0) for r in rows]) for c in classes},
    np.array([r[1] for r in rows], dtype=np.int64),
    np.array([r[2] for r in rows], dtype=bool),
    np.array([r[3] for r in rows], dtype=np.float64),
    [r[4] for r in rows],
    any(len(m) > 3 for s in _distinct_steps(steps) for m in s[:1]),
  )


@dataclass(frozen=True)
class Replay:
  """The result of :func:`replay`.

  Attributes:
    seconds: total predicted time.
    step_seconds: ``float[steps]``, each step's time.
    max_load: ``float[steps]``: each step's busiest directed link, in units of n per
      link capacity (× n·β = its bandwidth time).
    profile: the per-step :class:`Profile` (busiest link of each step, hops...).
  """

  seconds: float
  step_seconds: np.ndarray
  max_load: np.ndarray
  profile: Profile


def replay(steps: Steps, topology: Network, n_bytes: float, params: Params) -> Replay:
  """Prices a message schedule on a topology, step after step.

  Args:
    steps: a list of steps, each a list of ``(src, dst, fraction_of_n[, combined])``
      (from ``ALGORITHMS[name].messages(sizes)`` or :func:`traced_messages`).
    topology: :func:`switch`, :func:`torus`, :func:`fat_tree` or :func:`islands`.
    n_bytes: bytes per participant.
    params: α, β, γ (a ``cost_model.Params``) of one participant's link.

  Returns:
    A :class:`Replay`.

  Example:
    >>> from allreduce_jax.topology import ring_messages, torus
    >>> r = replay(ring_messages((8,)), torus((8,)), 1e6, Params(1e-6, 1e-9, 0.0))
    >>> round(r.seconds * 1e6, 3)  # 14 steps of α + n/8 β
    1764.0
  """
  prof = profile(steps, topology)
  per = prof.seconds(n_bytes, params)
  return Replay(float(per.sum()), per, prof.max_load(), prof)


def bandwidth_term(steps: Steps, topology: Network) -> float:
  """Σ over steps of the busiest link's load: the β term in units of n·β."""
  return float(profile(steps, topology).max_load().sum())


def step_link_loads(step: Step, topology: Network) -> dict[str, np.ndarray]:
  """Every directed link's load in one step (units of n per capacity): the picture of
  which links carry how much (the tools' ``plot.step_loads``)."""
  src, dst, frac, _ = _arrays(step)
  p = int(max(src.max(), dst.max())) + 1
  return topology.fit(p).link_loads(src, dst, frac)


TRACE_N = 3360


def traced_messages(
  algorithm: str, p: int, n: int = TRACE_N, *, grouped: bool = True
) -> tuple[tuple[int, ...], Steps]:
  """The executed schedule of ``ALGORITHMS[algorithm]`` on ``p`` participants, from its
  real trace: every ``_comm.send``'s pairs (mapped to row-major participant numbers),
  its bytes as a fraction of the ``n``-element buffer, and whether the receiver
  combines it (the received value reaches the reduction in the traced program).

  Returns ``(sizes, steps)``: the mesh axis sizes it ran on (``devices.mesh_for``) and
  the steps (sends inside one ``_comm.concurrent()`` block form one step; with
  ``grouped=False`` every send is its own step, as ``Algorithm.ppermutes`` lists them).
  Needs p devices; imports JAX.
  """
  record = ALGORITHMS[algorithm]
  mesh, axis = devices.mesh_for(algorithm, p)
  shape = tuple(mesh.devices.shape)
  if p == 1:
    return shape, []

  def body(block):  # block: f32[1, n]
    flat = _comm.make_varying(block[0], axis)
    return record.fn(flat, axis, lax.atan2)[None]  # atan2 marks the reduction

  with _comm.recording_messages() as log:
    closed = jax.make_jaxpr(jax.shard_map(body, mesh=mesh, in_specs=P(axis), out_specs=P(axis)))(
      jax.ShapeDtypeStruct((p, n), jnp.float32, sharding=NamedSharding(mesh, P(axis)))
    )
  combined = _combined_flags(closed.jaxpr)
  if len(combined) != len(log):
    raise RuntimeError(f"{algorithm}: {len(log)} sends logged, {len(combined)} ppermutes traced.")
  steps: Steps = []
  last = None
  for entry, comb in zip(log, combined):
    sub_axis, pairs, received = entry
    frac = received.shape[0] / n
    msgs = [(s, t, frac, comb) for s, t in _comm.global_pairs(sub_axis, pairs, axis, shape)]
    group = getattr(entry, "step", None) if grouped else None
    if group is not None and group == last:
      steps[-1].extend(msgs)
    else:
      steps.append(msgs)
    last = group
  return shape, steps


def _subjaxprs(eqn):
  for v in eqn.params.values():
    for j in v if isinstance(v, (tuple, list)) else (v,):
      j = getattr(j, "jaxpr", j)
      if hasattr(j, "eqns"):
        yield j


def _combined_flags(jaxpr) -> list[bool]:
  """Per ppermute (in program order): does its result reach ``atan2`` (the marked
  reduction) before it is sent again?"""
  order: list[tuple] = []

  def collect(j):
    for k, eqn in enumerate(j.eqns):
      if eqn.primitive.name == "ppermute":
        order.append((j, k))
      for sub in _subjaxprs(eqn):
        collect(sub)

  def reaches(j, start: int, tainted: set) -> bool:
    for eqn in j.eqns[start:]:
      if not any(not hasattr(v, "val") and v in tainted for v in eqn.invars):
        continue
      if eqn.primitive.name == "ppermute":
        continue  # the next message: what it carries is that step's business
      if eqn.primitive.name == "atan2":
        return True
      for sub in _subjaxprs(eqn):
        if reaches(sub, 0, set(sub.invars)):
          return True
      tainted.update(eqn.outvars)
    return False

  collect(jaxpr)
  return [reaches(j, k + 1, set(j.eqns[k].outvars)) for j, k in order]


def axis_sizes(algorithm: str, p: int, topology: Network | None = None) -> tuple[int, ...]:
  """The mesh axis sizes to price ``algorithm`` on ``p`` participants: ``(p,)`` for one
  axis; for k axes the topology's own levels where it has them (islands / leaves as
  the inner axis; a torus's dimensions, one axis each, when the record takes that many),
  else as even as possible."""
  k = ALGORITHMS[algorithm].axes
  if k == 1:
    return (p,)
  top = topology.fit(p) if topology is not None else None
  inner = {Islands: "group", FatTree: "hosts_per_leaf"}.get(type(top))
  if inner and p % getattr(top, inner) == 0 and p > getattr(top, inner):
    g = getattr(top, inner)
    return (*even_dims(p // g, k - 1), g)
  if isinstance(top, Torus) and math.prod(top.dims) == p:
    if k <= len(top.dims):  # a record takes at least k axes: one per torus dimension
      return top.dims
    if k == 2 and len(top.dims) > 1:  # the inner axis on one ring of the last dimension
      return (p // top.dims[-1], top.dims[-1])
  return tuple(sorted(even_dims(p, k)))


DUPLEX = ("half", "recv_first", "full")
"""The ``duplex`` values the replay takes (:func:`messages`, :func:`algorithm_profile`,
:func:`allreduce_jax.gloo_model.predict_seconds`, ``cost_model.use_topology``): XLA:CPU
over gloo as it is, as it would be with each receive posted first, and the generators'
own full-duplex steps."""


def check_duplex(duplex: str) -> None:
  """A ``ValueError`` naming ``duplex`` unless it is one of :data:`DUPLEX`."""
  if duplex not in DUPLEX:
    raise ValueError(f"duplex={duplex!r}: expected one of {', '.join(map(repr, DUPLEX))}.")


def half_duplex(steps: Steps) -> Steps:
  """The schedule as gloo runs it: in every step, a message ``a → b`` whose reverse
  ``b → a`` is in the same step carries both fractions (the pair takes turns).
  Identical steps stay shared (one conversion each), so long schedules stay cheap."""
  converted: dict[int, list] = {}
  out = []
  for step in steps:
    key = id(step)
    if key not in converted:
      pair = {}
      for m in step:
        pair[(m[0], m[1])] = pair.get((m[0], m[1]), 0.0) + m[2]
      new = []
      for m in step:
        back = pair.get((m[1], m[0]), 0.0)
        new.append((m[0], m[1], m[2] + back, *m[3:]))
      converted[key] = new
    out.append(converted[key])
  return out


_GENERATED: dict = {}  # key -> (steps, distinct messages), oldest first
#: The most distinct messages the schedule cache keeps (~150 bytes each in Python): a
#: sweep to 16384 participants generates schedules of millions of messages per p.
CACHE_MESSAGES = 4_000_000


def _distinct_steps(steps: Steps):
  """Each step object of ``steps`` once (generators repeat one list for the ring's
  identical steps)."""
  return {id(s): s for s in steps}.values()


def distinct_messages(steps: Steps) -> int:
  """Messages in ``steps``, counting a step object repeated (as generators return the
  ring's) once: what the schedule holds in memory."""
  return sum(len(s) for s in _distinct_steps(steps))


def takes_size(generator) -> bool:
  """Whether a message generator takes ``n_bytes=`` (its steps depend on the size)."""
  try:
    return "n_bytes" in inspect.signature(generator).parameters
  except (TypeError, ValueError):
    return False


def trace_choices(algorithm: str, p: int, n_bytes: float | None) -> dict:
  """The choices ``algorithm``'s schedule makes at trace time for ``n_bytes`` on ``p``
  participants under the cost parameters in effect (``ALGORITHMS[a].choices``; the
  double binary tree's chunk count): ``{}`` for an algorithm that makes none or
  without a size."""
  record = ALGORITHMS[algorithm]
  if record.choices is None or n_bytes is None:
    return {}
  return dict(record.choices(p, n_bytes))


def generator_kwargs(algorithm: str, generator, sizes: tuple[int, ...], n_bytes, choices) -> dict:
  """The keyword arguments ``algorithm``'s message ``generator`` (its ``messages`` or
  ``ppermutes``) is called with: the trace-time ``choices`` (given, else
  :func:`trace_choices` now), else ``n_bytes=`` for a generator that takes the size;
  they are also what its schedule is cached under."""
  if choices is None:
    choices = trace_choices(algorithm, math.prod(sizes), n_bytes)
  if choices:
    return dict(choices)
  return {"n_bytes": n_bytes} if n_bytes is not None and takes_size(generator) else {}


def messages(
  algorithm: str,
  sizes: tuple[int, ...],
  n_bytes: float | None = None,
  choices: dict | None = None,
  duplex: str = "full",
) -> Steps:
  """``ALGORITHMS[algorithm].messages(sizes)``, cached: the most recent schedules up to
  :data:`CACHE_MESSAGES` messages in all (always the newest one). A schedule that
  depends on the size is generated for ``n_bytes`` as the algorithm would trace it
  (its ``choices``: given, else under the cost parameters in effect, like the
  pipelined double binary tree's chunk count), and cached under those choices.

  ``duplex`` (:data:`DUPLEX`): ``"full"``, those steps; ``"recv_first"``, one step per
  ``ppermute`` as XLA:CPU runs them (the record's ``ppermutes`` where its message steps
  hold several, else its ``messages``, each step already one ppermute); ``"half"``, those
  with every exchange at half duplex (:func:`half_duplex`), as XLA:CPU runs them over
  gloo."""
  which = _generator(algorithm, duplex)
  kwargs = generator_kwargs(
    algorithm, getattr(ALGORITHMS[algorithm], which), sizes, n_bytes, choices
  )
  steps = _generated(algorithm, sizes, kwargs, which)
  return half_duplex(steps) if duplex == "half" else steps


def _generator(algorithm: str, duplex: str) -> str:
  """Which generator of ``algorithm``'s record gives its steps at ``duplex``: its
  ``ppermutes`` (one step per ppermute) where it has them and they run one at a time."""
  check_duplex(duplex)
  record = ALGORITHMS[algorithm]
  return "ppermutes" if duplex != "full" and record.ppermutes is not None else "messages"


def _generated(
  algorithm: str, sizes: tuple[int, ...], kwargs: dict, which: str = "messages"
) -> Steps:
  """``ALGORITHMS[algorithm].messages(sizes, **kwargs)`` (or its ``ppermutes``,
  ``which``) through the bounded cache, keyed on the generator's keyword arguments
  (:func:`generator_kwargs`)."""
  record = ALGORITHMS[algorithm]
  if record.messages is None:
    raise ValueError(f"algorithm={algorithm!r} has no message generator to replay.")
  key = (algorithm, which, tuple(sizes), tuple(sorted(kwargs.items())))
  if key not in _GENERATED:
    steps = getattr(record, which)(tuple(sizes), **kwargs)
    count = distinct_messages(steps)
    held = sum(c for _, c in _GENERATED.values())
    while _GENERATED and held + count > CACHE_MESSAGES:
      held -= _GENERATED.pop(next(iter(_GENERATED)))[1]  # the oldest first
    _GENERATED[key] = (steps, count)
  return _GENERATED[key][0]


_PROFILES: dict = {}


def algorithm_profile(
  algorithm: str,
  p: int,
  topology: Network,
  n_bytes: float | None = None,
  sizes: tuple[int, ...] | None = None,
  choices: dict | None = None,
  duplex: str = "full",
) -> Profile:
  """:func:`profile` of ``algorithm``'s generated schedule at ``p`` (cached; ``n_bytes``,
  ``choices`` and ``duplex`` as :func:`messages` takes them; ``sizes``: the mesh axis
  sizes, default :func:`axis_sizes` on this topology)."""
  sizes = tuple(sizes) if sizes is not None else axis_sizes(algorithm, p, topology)
  generator = getattr(ALGORITHMS[algorithm], _generator(algorithm, duplex))
  kwargs = generator_kwargs(algorithm, generator, sizes, n_bytes, choices)
  key = (algorithm, sizes, topology, tuple(sorted(kwargs.items())), duplex)
  if key not in _PROFILES:
    if len(_PROFILES) > 4096:
      _PROFILES.clear()
    _PROFILES[key] = profile(messages(algorithm, sizes, n_bytes, choices, duplex), topology, p)
  return _PROFILES[key]


def predict_seconds(
  algorithm: str,
  p: int,
  n_bytes: float,
  params,
  topology: Network | None = None,
  sizes: tuple[int, ...] | None = None,
  choices: dict | None = None,
) -> float:
  """Replayed time of ``algorithm`` on ``p`` participants of ``topology`` (default the
  flat :func:`switch`); ``params`` a ``Params`` or ``FittedParams`` (its entry for the
  algorithm); ``sizes``: the mesh axis sizes (default :func:`axis_sizes`);
  ``choices``: the schedule's trace-time choices (:func:`trace_choices`; a bench row's
  ``choices``), default those the cost parameters in effect make."""
  if p < 2:
    return 0.0
  q = resolve(params, algorithm)
  topology = topology or switch()
  sizes = tuple(sizes) if sizes is not None else axis_sizes(algorithm, p, topology)
  prof = algorithm_profile(algorithm, p, topology, n_bytes, sizes, choices)
  t = float(prof.seconds(n_bytes, q).sum())
  record = ALGORITHMS[algorithm]
  if not prof.flagged and record.schedule is not None and q.gamma:
    # A generator without the ``combined`` flags: γ from the closed form instead.
    inner = sizes[-1] if record.axes > 1 else None
    t += q.gamma * record.schedule(p, n_bytes, inner).gamma_bytes
  return t


def candidates(names: Sequence[str] | None = None) -> tuple[str, ...]:
  """``names`` (default: ``auto``'s candidates) that have a message generator."""
  names = registry.names(auto=True) if names is None else names
  return tuple(a for a in names if a in ALGORITHMS and ALGORITHMS[a].messages is not None)


def choose(
  p: int,
  n_bytes: float,
  params=None,
  topology: Network | None = None,
  candidates_: Sequence[str] | None = None,
) -> str:
  """The candidate with the smallest replayed time on ``topology`` (ties: the earlier).

  Example:
    >>> from allreduce_jax.topology import torus
    >>> choose(64, 64 << 20, Params(5e-6, 1e-10, 0.0), torus((64,)),
    ...        ("ring", "halving_doubling"))
    'ring'
  """
  names = tuple(candidates_) if candidates_ is not None else candidates()
  if not names:
    raise ValueError("choose needs at least one candidate with a message generator.")
  params = DEFAULT_PARAMS if params is None else params
  times = [predict_seconds(a, p, n_bytes, params, topology) for a in names]
  return names[min(range(len(names)), key=times.__getitem__)]
