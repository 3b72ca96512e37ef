"""Replay an all-reduce's message steps on a network: switch, torus, fat tree, islands.

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
- ``ALGORITHMS[name].messages(sizes)``: each algorithm's step generator (the ones
  for the original algorithms are at the end of this module), used at thousands
  of participants where nothing can be traced.

What is modelled: full-duplex links, minimal-hop dimension-order routing on tori,
ideal ECMP (uplink load spread evenly) on fat trees, a dedicated NIC per participant
between islands. What is not: collisions of real routing beyond dimension order,
adaptive routing, congestion control, pipelining across steps, in-switch reduction
(NVLS / SHARP), and NCCL's multi-channel rings (several rings striped over every NIC).

Pure Python and NumPy: importing this module does not import JAX.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from allreduce_jax import cost_model
from allreduce_jax.cost_model import Params

#: One message: ``(src, dst, fraction_of_n, combined)`` (a 3-tuple is not combined).
Message = tuple
Step = list
Steps = list


# ----------------------------------------------------------------------------------------
# Topologies. Each turns one step's messages (arrays src, dst, frac) into link loads.
# Loads are in units of n (bytes per participant) divided by the link's capacity
# relative to a participant's own link, so "load × n × β" is seconds.
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Switch:
  """Full bisection: every participant on one non-blocking switch.

  ``ports=None`` gives every message of a step its own full-speed link: exactly the
  flat α-β model (:func:`cost_model.predict_seconds`), including its assumption that
  the bidirectional ring's two lanes run at once. ``ports=k``: each participant has k
  links (NICs) that its messages of a step share evenly, in and out (k = 1: one NIC,
  and the bidirectional ring is no faster than the ring).
  """

  ports: int | None = None
  hop_latency: float = 0.0

  @property
  def name(self) -> str:
    return "switch" if self.ports is None else f"switch:{self.ports}"

  def fit(self, p: int) -> Switch:
    return self

  def capacity(self) -> int | None:
    return None

  def link_loads(self, src, dst, frac) -> dict[str, np.ndarray]:
    if self.ports is None:
      return {"message": frac.copy()}
    n = int(max(src.max(), dst.max())) + 1
    return {
      "out": np.bincount(src, frac, n) / self.ports,
      "in": np.bincount(dst, frac, n) / self.ports,
    }

  def hops(self, src, dst) -> np.ndarray:
    return np.ones_like(src)


@dataclass(frozen=True)
class Torus:
  """A k-ary n-cube: participant i sits on node i (row-major over ``dims``, the last
  dimension fastest); messages take the minimal-hop route dimension by dimension
  (dim 0 first), ties going forward; ``wrap=False`` is a mesh without wraparound.

  ``dims=None`` is a family: :meth:`fit` picks the most even ``ndim``-dimensional
  shape for each participant count (``torus:3d`` on the command line).
  """

  dims: tuple[int, ...] | None
  wrap: bool = True
  hop_latency: float = 0.0
  ndim: int = 0

  @property
  def name(self) -> str:
    if self.dims is None:
      return f"torus:{self.ndim}d" + ("" if self.wrap else ":nowrap")
    return "torus:" + "x".join(map(str, self.dims)) + ("" if self.wrap else ":nowrap")

  def capacity(self) -> int | None:
    return None if self.dims is None else math.prod(self.dims)

  def fit(self, p: int) -> Torus:
    if self.dims is None:
      return Torus(even_dims(p, self.ndim), self.wrap, self.hop_latency)
    if p > math.prod(self.dims):
      raise ValueError(f"{self.name} has {math.prod(self.dims)} nodes; p={p} does not fit.")
    return self

  def _routes(self, src, dst):
    """Per dimension: (line index, start coordinate, hops, forward?) of every message."""
    dims = self.dims
    s, t = np.unravel_index(src, dims), np.unravel_index(dst, dims)
    out = []
    for d, k in enumerate(dims):
      if k == 1:
        continue
      fwd = (t[d] - s[d]) % k
      if self.wrap:
        forward = fwd <= k - fwd
        dist = np.where(forward, fwd, k - fwd)
      else:
        forward = t[d] >= s[d]
        dist = np.abs(t[d] - s[d])
      # While routing dim d, dims < d are already at the target, dims > d at the source.
      coords = [t[j] if j < d else s[j] for j in range(len(dims)) if j != d]
      others = tuple(k2 for j, k2 in enumerate(dims) if j != d)
      line = np.ravel_multi_index(coords, others) if others else np.zeros_like(src)
      out.append((d, k, line, s[d], dist, forward))
    return out

  def link_loads(self, src, dst, frac) -> dict[str, np.ndarray]:
    """``{"dim{d}+": load[line, c]}``: the link from coordinate c to c+1 (c to c-1 for
    ``-``) on each line of dimension d."""
    loads = {}
    for d, k, line, start, dist, forward in self._routes(src, dst):
      lines = math.prod(self.dims) // k
      for sign, mask in (("+", forward), ("-", ~forward)):
        m = mask & (dist > 0)
        # Backward arcs are forward arcs in reversed coordinates (c -> k-1-c).
        c0 = start[m] if sign == "+" else k - 1 - start[m]
        arc = _arc_loads(lines, k, line[m], c0, dist[m], frac[m])
        loads[f"dim{d}{sign}"] = arc if sign == "+" else arc[:, ::-1]  # index: link's source
    return loads or {"none": np.zeros(1)}

  def hops(self, src, dst) -> np.ndarray:
    h = np.zeros_like(src)
    for *_, dist, _fw in self._routes(src, dst):
      h = h + dist
    return h


def _arc_loads(lines: int, k: int, line, c0, length, frac) -> np.ndarray:
  """Adds ``frac`` on links c0, c0+1, ..., c0+length-1 (mod k) of each line: difference
  arrays, so a step of p messages costs O(p + nodes) whatever the distances."""
  diff = np.zeros((lines, k + 1))
  end = c0 + length
  np.add.at(diff, (line, c0), frac)
  np.add.at(diff, (line, np.minimum(end, k)), -frac)
  wrapped = end > k
  np.add.at(diff, (line[wrapped], 0), frac[wrapped])
  np.add.at(diff, (line[wrapped], end[wrapped] - k), -frac[wrapped])
  return np.cumsum(diff, axis=1)[:, :k]


@dataclass(frozen=True)
class FatTree:
  """Two tiers: ``hosts_per_leaf`` participants per leaf switch (participant i on leaf
  i // k), leaves joined by a spine with ideal ECMP. Each leaf's uplink carries k/r
  host links' worth (``oversubscription`` r:1); hosts have one link each."""

  hosts_per_leaf: int
  oversubscription: float = 1.0
  hop_latency: float = 0.0

  @property
  def name(self) -> str:
    return f"fat_tree:{self.hosts_per_leaf}:{self.oversubscription:g}"

  def capacity(self) -> int | None:
    return None

  def fit(self, p: int) -> FatTree:
    return self

  def link_loads(self, src, dst, frac) -> dict[str, np.ndarray]:
    k = self.hosts_per_leaf
    n = int(max(src.max(), dst.max())) + 1
    leaves = -(-n // k)
    cross = src // k != dst // k
    up = k / self.oversubscription  # uplink capacity in host links
    return {
      "host out": np.bincount(src, frac, n),
      "host in": np.bincount(dst, frac, n),
      "leaf up": np.bincount(src[cross] // k, frac[cross], leaves) / up,
      "leaf down": np.bincount(dst[cross] // k, frac[cross], leaves) / up,
    }

  def hops(self, src, dst) -> np.ndarray:
    return np.where(src // self.hosts_per_leaf == dst // self.hosts_per_leaf, 2, 4)


@dataclass(frozen=True)
class Islands:
  """NVLink-style islands of ``group`` participants (participant i in island i // g)
  on a switch (``intra``: α₁, β₁ per participant port), each participant with its own
  NIC into a full-bisection network between islands (``inter``: α₂, β₂). A step pays
  α₂ if any message leaves its island, else α₁; its bytes pay β₁ on the busiest
  island port and β₂ on the busiest NIC, whichever is slower.

  This is :class:`cost_model.TwoLevel` with one NIC per device, as a topology: the
  replay equals :func:`cost_model.predict_two_level_seconds` for ``hierarchical``,
  ``halving_doubling``, ``recursive_doubling`` and ``tree``; for ``ring`` the closed
  form credits NCCL's channels (rings striped over every NIC, only 2(b-1) steps
  paying α₂), which a step-by-step replay of one ring does not.
  """

  group: int
  intra: Params
  inter: Params
  label: str = ""

  @property
  def name(self) -> str:
    return self.label or f"islands:{self.group}"

  def capacity(self) -> int | None:
    return None

  def fit(self, p: int) -> Islands:
    return self

  def link_loads(self, src, dst, frac) -> dict[str, np.ndarray]:
    n = int(max(src.max(), dst.max())) + 1
    cross = src // self.group != dst // self.group
    loads = {}
    for name, mask in (("intra", ~cross), ("inter", cross)):
      loads[f"{name} out"] = np.bincount(src[mask], frac[mask], n)
      loads[f"{name} in"] = np.bincount(dst[mask], frac[mask], n)
    return loads

  def hops(self, src, dst) -> np.ndarray:
    return np.where(src // self.group == dst // self.group, 1, 2)


Topology = Switch | Torus | FatTree | Islands


def switch(ports: int | None = None) -> Switch:
  """Full bisection (see :class:`Switch`); ``switch()`` is the flat α-β model."""
  if ports is not None and ports < 1:
    raise ValueError(f"switch ports must be at least 1, got {ports}.")
  return Switch(ports)


def torus(dims, wrap: bool = True, hop_latency: float = 0.0) -> Torus:
  """A torus of shape ``dims`` (1, 2 or 3 dimensions; an int k means k-ary 1-D), or,
  with ``dims="3d"`` (or ``2d``, ``1d``), the family of the most even shapes."""
  if isinstance(dims, str) and dims[:-1].isdigit() and dims.endswith("d"):
    return Torus(None, wrap, hop_latency, int(dims[:-1]))
  dims = (dims,) if isinstance(dims, int) else tuple(int(d) for d in dims)
  if not 1 <= len(dims) <= 3 or any(d < 1 for d in dims):
    raise ValueError(f"torus dims must be 1 to 3 positive sizes, got {dims}.")
  return Torus(dims, wrap, hop_latency)


def fat_tree(hosts_per_leaf: int, oversubscription: float = 1.0, hop_latency: float = 0.0):
  """Two-tier fat tree (see :class:`FatTree`)."""
  if hosts_per_leaf < 1 or not 0 < oversubscription < math.inf:  # nan, inf: refused
    raise ValueError(
      f"fat_tree needs hosts_per_leaf >= 1 and oversubscription > 0, got"
      f" {hosts_per_leaf}, {oversubscription}."
    )
  return FatTree(hosts_per_leaf, float(oversubscription), hop_latency)


def islands(group: int, intra: Params | str, inter: Params | str) -> Islands:
  """Islands of ``group`` on ``intra`` links joined by ``inter`` (Params or preset names
  of :data:`cost_model.PRESETS`)."""
  if group < 1:
    raise ValueError(f"islands group must be at least 1, got {group}.")
  label = f"islands:{group}:{intra}:{inter}" if isinstance(intra, str) else ""
  intra = cost_model.PRESETS[intra] if isinstance(intra, str) else intra
  inter = cost_model.PRESETS[inter] if isinstance(inter, str) else inter
  return Islands(group, intra, inter, label)


def even_dims(p: int, ndim: int) -> tuple[int, ...]:
  """``p`` as ``ndim`` factors as even as possible, largest first: 16384, 3 -> (32, 32, 16)."""
  factors, q, f = [], p, 2
  while q > 1:
    while q % f == 0:
      factors.append(f)
      q //= f
    f += 1
  dims = [1] * ndim
  for f in sorted(factors, reverse=True):
    dims[dims.index(min(dims))] *= f
  return tuple(sorted(dims, reverse=True))


def parse(text: str, arg: str = "--topology") -> Topology:
  """``switch[:ports]``, ``torus:16x16x16[:nowrap]`` / ``torus:3d``, ``fat_tree:8:7``,
  ``islands:8:nvlink4:ib_ndr`` (presets or ``latency_us,bandwidth`` as :func:`cost_model.parse_link` reads them) -> a topology.
  Raises ``ValueError`` with a one-line message naming ``arg``."""
  kind, *rest = text.strip().split(":")
  try:
    if kind == "switch" and len(rest) <= 1:
      return switch(int(rest[0]) if rest else None)
    if kind == "torus" and 1 <= len(rest) <= 2 and rest[-1] in ("nowrap", "wrap", rest[0]):
      wrap = not (len(rest) == 2 and rest[1] == "nowrap")
      if rest[0].endswith("d"):
        if rest[0] not in ("1d", "2d", "3d"):
          raise ValueError
        return torus(rest[0], wrap)
      return torus(tuple(int(d) for d in rest[0].split("x")), wrap)
    if kind == "fat_tree" and len(rest) == 2:
      return fat_tree(int(rest[0]), float(rest[1]))
    if kind == "islands" and len(rest) == 3:
      links = [cost_model.parse_link(t, arg) for t in rest[1:]]
      top = islands(int(rest[0]), *links)
      return Islands(top.group, top.intra, top.inter, f"islands:{rest[0]}:{rest[1]}:{rest[2]}")
  except (ValueError, KeyError):
    pass
  raise ValueError(
    f"{arg} {text!r}: expected switch[:ports], torus:AxBxC[:nowrap] or torus:1d|2d|3d,"
    f" fat_tree:HOSTS_PER_LEAF:OVERSUBSCRIPTION, or islands:GROUP:INTRA:INTER"
    f" (INTRA/INTER a preset {'/'.join(cost_model.PRESETS)} or latency_us,bandwidth, e.g. 5,400Gbit)."
  )


# ----------------------------------------------------------------------------------------
# Replay.
# ----------------------------------------------------------------------------------------


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

  topology: Topology
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


def profile(steps: Steps, topology: Topology, p: int | None = None) -> Profile:
  """Routes every step of ``steps`` on ``topology`` (fitted to ``p`` participants,
  default: the highest participant number in the schedule + 1).

  Identical steps (the same list object repeated, as the generators return them) are
  routed once, so a 16384-participant ring (32766 steps) costs two routings.
  """
  if p is None:
    distinct = {id(s): s for s in steps}.values()
    p = 1 + max((max(m[0], m[1]) for s in distinct for m in s), default=0)
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
    any(len(m) > 3 for s in {id(s): s for s in steps}.values() for m in s[:1]),
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


def replay(steps: Steps, topology: Topology, n_bytes: float, params: Params) -> Replay:
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
    >>> r = replay(ring_messages((8,)), torus((8,)), 1e6, Params(1e-6, 1e-9, 0.0))
    >>> round(r.seconds * 1e6, 3)  # 14 steps of α + n/8 β
    1764.0
  """
  prof = profile(steps, topology)
  per = prof.seconds(n_bytes, params)
  return Replay(float(per.sum()), per, prof.max_load(), prof)


def bandwidth_term(steps: Steps, topology: Topology) -> float:
  """Σ over steps of the busiest link's load: the β term in units of n·β."""
  return float(profile(steps, topology).max_load().sum())


def step_link_loads(step: Step, topology: Topology) -> dict[str, np.ndarray]:
  """Every directed link's load in one step (units of n per capacity): the picture of
  which links carry how much (:func:`plot_step_loads`)."""
  src, dst, frac, _ = _arrays(step)
  p = int(max(src.max(), dst.max())) + 1
  return topology.fit(p).link_loads(src, dst, frac)


# ----------------------------------------------------------------------------------------
# Registry side: generators of the original algorithms, recording from a trace, pricing
# and choosing by replayed cost.
# ----------------------------------------------------------------------------------------


def _shift(p: int, d: int, frac: float, combined: bool, base: int = 0, stride: int = 1):
  return [(base + j * stride, base + ((j + d) % p) * stride, frac, combined) for j in range(p)]


def ring_messages(sizes: Sequence[int]) -> Steps:
  """Ring: p-1 reduce-scatter steps (combined) then p-1 all-gather steps of n/p."""
  (p,) = sizes
  if p < 2:
    return []
  rs, ag = _shift(p, 1, 1 / p, True), _shift(p, 1, 1 / p, False)
  return [rs] * (p - 1) + [ag] * (p - 1)


def bidirectional_ring_messages(sizes: Sequence[int]) -> Steps:
  """Two lanes of n/(2p), one each way, in every one of the 2(p-1) steps."""
  (p,) = sizes
  if p < 2:
    return []
  f = 1 / (2 * p)
  rs = _shift(p, 1, f, True) + _shift(p, -1, f, True)
  ag = _shift(p, 1, f, False) + _shift(p, -1, f, False)
  return [rs] * (p - 1) + [ag] * (p - 1)


def tree_messages(sizes: Sequence[int]) -> Steps:
  """Binomial reduce to 0 (masks 1, 2, 4, ...) then broadcast back, full buffers."""
  (p,) = sizes
  masks = [1 << k for k in range((p - 1).bit_length())]
  up = [[(j, j - m, 1.0, True) for j in range(m, p, 2 * m)] for m in masks]
  down = [[(j, j + m, 1.0, False) for j in range(0, p - m, 2 * m)] for m in reversed(masks)]
  return up + down


def _fold_steps(p: int):
  pof2 = 1 << (p.bit_length() - 1)
  rem = p - pof2

  def real(r):
    return 2 * r + 1 if r < rem else r + rem

  fold = [[(2 * k, 2 * k + 1, 1.0, True) for k in range(rem)]] if rem else []
  unfold = [[(2 * k + 1, 2 * k, 1.0, False) for k in range(rem)]] if rem else []
  return pof2, real, fold, unfold


def recursive_doubling_messages(sizes: Sequence[int]) -> Steps:
  """MPICH fold to a power of two, lg p full-buffer XOR exchanges, unfold."""
  (p,) = sizes
  if p < 2:
    return []
  pof2, real, fold, unfold = _fold_steps(p)
  masks = [1 << k for k in range(pof2.bit_length() - 1)]
  mid = [[(real(r), real(r ^ m), 1.0, True) for r in range(pof2)] for m in masks]
  return fold + mid + unfold


def halving_doubling_messages(sizes: Sequence[int]) -> Steps:
  """Rabenseifner, MPICH (far-first) order: halving at distance pof2/2 ... 1 with
  n/2, n/4, ... then doubling at 1 ... pof2/2 with n/pof2 ... n/2."""
  (p,) = sizes
  if p < 2:
    return []
  pof2, real, fold, unfold = _fold_steps(p)
  L = pof2.bit_length() - 1
  rs = [
    [(real(r), real(r ^ (pof2 >> (s + 1))), 1 / 2 ** (s + 1), True) for r in range(pof2)]
    for s in range(L)
  ]
  ag = [
    [(real(r), real(r ^ (1 << s)), (1 << s) / pof2, False) for r in range(pof2)] for s in range(L)
  ]
  return fold + rs + ag + unfold


def naive_messages(sizes: Sequence[int]) -> Steps:
  """Everyone to participant 0, one at a time, then 0 to everyone, full buffers."""
  (p,) = sizes
  return [[(k, 0, 1.0, True)] for k in range(1, p)] + [[(0, k, 1.0, False)] for k in range(1, p)]


#: A trace of n = 3360 float32 elements: divisible by every padding of p <= 8 (2p, pof2).
TRACE_N = 3360


def traced_messages(algorithm: str, p: int, n: int = TRACE_N) -> tuple[tuple[int, ...], Steps]:
  """The executed schedule of ``ALGORITHMS[algorithm]`` on ``p`` participants, from its
  real trace: every ``_comm.send``'s pairs (mapped to row-major participant numbers),
  its bytes as a fraction of the ``n``-element buffer, and whether the receiver
  combines it (the received value reaches the reduction in the traced program).

  Returns ``(sizes, steps)``: the mesh axis sizes it ran on (``_devices.mesh_for``) and
  the steps (sends inside one ``_comm.concurrent()`` block form one step). Needs p
  devices; imports JAX.
  """
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from allreduce_jax import _comm, _devices
  from allreduce_jax._api import ALGORITHMS
  from allreduce_jax.trace import _global_pairs

  record = ALGORITHMS[algorithm]
  mesh, axis = _devices.mesh_for(algorithm, p)
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
    msgs = [(s, t, frac, comb) for s, t in _global_pairs(sub_axis, pairs, axis, shape)]
    group = getattr(entry, "step", None)
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


def axis_sizes(algorithm: str, p: int, topology: Topology | None = None) -> tuple[int, ...]:
  """The mesh axis sizes to price ``algorithm`` on ``p`` participants: ``(p,)`` for one
  axis; for k axes the topology's own levels where it has them (islands / leaves as
  the inner axis; a torus's dimensions, one axis each, when the record takes that many),
  else as even as possible."""
  from allreduce_jax._api import ALGORITHMS

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


_GENERATED: dict = {}


def _takes_size(generator) -> bool:
  import inspect

  try:
    return "n_bytes" in inspect.signature(generator).parameters
  except (TypeError, ValueError):
    return False


def messages(algorithm: str, sizes: tuple[int, ...], n_bytes: float | None = None) -> Steps:
  """``ALGORITHMS[algorithm].messages(sizes)`` (with ``n_bytes=`` for generators whose
  schedule depends on the size, like the pipelined double binary tree), cached."""
  from allreduce_jax._api import ALGORITHMS

  record = ALGORITHMS[algorithm]
  if record.messages is None:
    raise ValueError(f"algorithm={algorithm!r} has no message generator to replay.")
  sized = _takes_size(record.messages) and n_bytes is not None
  key = (algorithm, tuple(sizes), n_bytes if sized else None)
  if key not in _GENERATED:
    if len(_GENERATED) > 256:
      _GENERATED.clear()
    kwargs = {"n_bytes": n_bytes} if sized else {}
    _GENERATED[key] = record.messages(tuple(sizes), **kwargs)
  return _GENERATED[key]


_PROFILES: dict = {}


def algorithm_profile(
  algorithm: str,
  p: int,
  topology: Topology,
  n_bytes: float | None = None,
  sizes: tuple[int, ...] | None = None,
) -> Profile:
  """:func:`profile` of ``algorithm``'s generated schedule at ``p`` (cached; ``n_bytes``
  only matters to generators that take it; ``sizes``: the mesh axis sizes, default
  :func:`axis_sizes` on this topology)."""
  from allreduce_jax._api import ALGORITHMS

  sizes = tuple(sizes) if sizes is not None else axis_sizes(algorithm, p, topology)
  sized = _takes_size(ALGORITHMS[algorithm].messages)
  key = (algorithm, sizes, topology, n_bytes if sized else None)
  if key not in _PROFILES:
    if len(_PROFILES) > 4096:
      _PROFILES.clear()
    _PROFILES[key] = profile(messages(algorithm, sizes, n_bytes), topology, p)
  return _PROFILES[key]


def predict_seconds(
  algorithm: str,
  p: int,
  n_bytes: float,
  params,
  topology: Topology | None = None,
  sizes: tuple[int, ...] | None = None,
) -> float:
  """Replayed time of ``algorithm`` on ``p`` participants of ``topology`` (default the
  flat :func:`switch`); ``params`` a ``Params`` or ``FittedParams`` (its entry for the
  algorithm); ``sizes``: the mesh axis sizes (default :func:`axis_sizes`)."""
  from allreduce_jax._api import ALGORITHMS

  if p < 2:
    return 0.0
  q = cost_model.resolve(params, algorithm)
  topology = topology or switch()
  sizes = tuple(sizes) if sizes is not None else axis_sizes(algorithm, p, topology)
  prof = algorithm_profile(algorithm, p, topology, n_bytes, sizes)
  t = float(prof.seconds(n_bytes, q).sum())
  record = ALGORITHMS[algorithm]
  if not prof.flagged and record.schedule is not None and q.gamma:
    # A generator without the ``combined`` flags: γ from the closed form instead.
    inner = sizes[-1] if record.axes > 1 else None
    t += q.gamma * record.schedule(p, n_bytes, inner).gamma_bytes
  return t


def candidates(names: Sequence[str] | None = None) -> tuple[str, ...]:
  """``names`` (default: ``auto``'s candidates) that have a message generator."""
  from allreduce_jax._api import ALGORITHMS

  names = cost_model.auto_candidates() if names is None else names
  return tuple(a for a in names if a in ALGORITHMS and ALGORITHMS[a].messages is not None)


def choose(
  p: int,
  n_bytes: float,
  params=None,
  topology: Topology | None = None,
  candidates_: Sequence[str] | None = None,
) -> str:
  """The candidate with the smallest replayed time on ``topology`` (ties: the earlier).

  Example:
    >>> choose(64, 64 << 20, Params(5e-6, 1e-10, 0.0), torus((64,)),
    ...        ("ring", "halving_doubling"))
    'ring'
  """
  names = tuple(candidates_) if candidates_ is not None else candidates()
  if not names:
    raise ValueError("choose needs at least one candidate with a message generator.")
  params = cost_model.DEFAULT_PARAMS if params is None else params
  times = [predict_seconds(a, p, n_bytes, params, topology) for a in names]
  return names[min(range(len(names)), key=times.__getitem__)]


def plot_step_loads(steps: dict, topology: Topology, title: str = ""):
  """One panel per schedule: the load of every directed link in one step (bars, units
  of n per capacity; link classes side by side). ``steps``: name -> one step. Returns
  the Figure: where a step's messages pile up (the middle of a ring for far partners)."""
  from matplotlib.figure import Figure

  fig = Figure(figsize=(9, 1.0 + 1.3 * len(steps)))
  axes = fig.subplots(len(steps), 1, squeeze=False, sharex=True)[:, 0]
  for ax, (name, step) in zip(axes, steps.items()):
    loads = step_link_loads(step, topology)
    x0 = 0
    for cls, v in loads.items():
      v = np.ravel(v)
      ax.bar(np.arange(x0, x0 + len(v)), v, width=0.9, label=cls)
      x0 += len(v) + 1
    peak = max(float(np.max(v)) for v in loads.values())
    ax.set_title(f"{name}: busiest link carries {peak:.3g} n", fontsize=8, loc="left")
    ax.set_ylabel("load (× n)", fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
  axes[0].legend(fontsize=6, ncol=4, loc="upper right")
  axes[-1].set_xlabel("directed link (grouped by class)")
  fig.suptitle(title or f"link loads of one step on {topology.name}", fontsize=10)
  fig.tight_layout()
  return fig


def plot_winners(rows: Sequence[dict]):
  """Where each algorithm wins: one panel per scenario (topology), participants on x,
  size on y, the fastest algorithm's name in each cell (rows of
  ``tools.scaling.sweep_topology``). Returns the Figure."""
  from matplotlib.figure import Figure

  scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
  algs = list(dict.fromkeys(r["algorithm"] for r in rows))
  fig = Figure(figsize=(5.2 * len(scenarios), 3.2))
  axes = fig.subplots(1, len(scenarios), squeeze=False)[0]
  cmap = __import__("matplotlib").colormaps["tab10"]
  for ax, sc in zip(axes, scenarios):
    mine = [r for r in rows if r["scenario"] == sc]
    ps = sorted({r["p"] for r in mine})
    sizes = sorted({r["bytes"] for r in mine})
    grid = np.full((len(sizes), len(ps)), np.nan)
    for r in mine:
      if r["algorithm"] == r["best"]:
        i, j = sizes.index(r["bytes"]), ps.index(r["p"])
        grid[i, j] = algs.index(r["best"])
        short = r["best"].replace("halving_doubling", "hd").replace("double_binary_tree", "dbt")
        ax.text(j, i, short.replace("_", "\n"), ha="center", va="center", fontsize=5.5)
    ax.imshow(grid, cmap=cmap, vmin=0, vmax=9, aspect="auto", alpha=0.6, origin="lower")
    ax.set_xticks(range(len(ps)), [str(p) for p in ps], fontsize=6, rotation=90)
    ax.set_yticks(range(len(sizes)), [_human(n) for n in sizes], fontsize=7)
    ax.set_xlabel("participants p")
    ax.set_title(f"fastest on {sc}", fontsize=9)
  axes[0].set_ylabel("bytes per participant")
  fig.tight_layout()
  return fig


def plot_over_flat(rows: Sequence[dict], n_bytes: float):
  """Replayed time / flat-model time per algorithm vs p, one panel per scenario, at one
  size: how much each network slows each schedule down. Returns the Figure."""
  from matplotlib.figure import Figure

  scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
  fig = Figure(figsize=(4.6 * len(scenarios), 3.4))
  axes = fig.subplots(1, len(scenarios), squeeze=False, sharey=True)[0]
  for ax, sc in zip(axes, scenarios):
    mine = [r for r in rows if r["scenario"] == sc and r["bytes"] == n_bytes]
    for a in dict.fromkeys(r["algorithm"] for r in mine):
      rs = sorted((r for r in mine if r["algorithm"] == a), key=lambda r: r["p"])
      ax.plot([r["p"] for r in rs], [r["over_flat"] for r in rs], "o-", ms=3, label=a)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title(f"{sc}, {_human(n_bytes)} per participant", fontsize=9)
    ax.set_xlabel("participants p")
    ax.grid(True, which="both", alpha=0.3)
  axes[0].set_ylabel("replayed time / flat α-β time")
  axes[0].legend(fontsize=6)
  fig.tight_layout()
  return fig


def _human(n: float) -> str:
  for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if n >= scale:
      return f"{n / scale:g} {unit}"
  return f"{n:g} B"
