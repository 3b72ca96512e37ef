"""Networks: switch, torus, fat tree, islands, each a declared set of hosts, links, routes and rates.

One object serves two users: the replay (:mod:`allreduce_jax.replay`) prices a step of
messages on it, vectorized (:meth:`Network.link_loads`, :meth:`Network.hops`), and an
emulated cluster can build it, link by link (:meth:`Network.hosts`,
:meth:`Network.links` with their rates, :meth:`Network.route`). Both are checked to
agree: the loads of the routes are the replay's loads (``tests/test_topology.py``).

The spec strings of the command line (``switch``, ``torus:16x16x16``, ``fat_tree:8:7``,
``islands:8:nvlink4:ib_ndr``) have one parse table, :data:`SPECS`; :func:`parse` reads
them and :func:`register_spec` adds a kind.

The emulated cluster's links are modelled here too: which networks take a rate per host
link (:func:`takes_link_rates`, :func:`with_link_rates`) and how much a shaped link's
token bucket holds (:func:`bucket_bytes`), so the cluster that shapes a link and the
replay that prices it read the same rule.

Pure NumPy: importing this module does not import JAX.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from allreduce_jax._machine import PRESETS, Params, parse_link


@dataclass(frozen=True)
class Link:
  """One full-duplex link between two nodes of a network: hosts are ``"h{i}"``
  (participant i), switches have names (``"switch"``, ``"leaf0"``, ``"spine"``...).

  Attributes:
    a, b: the two nodes.
    rate: its capacity in units of one host's link (a fat tree's 8-host leaf uplink at
      7:1 carries 8/7 host links' worth).
  """

  a: str
  b: str
  rate: float = 1.0


class Network(Protocol):
  """What every network declares (:class:`Switch`, :class:`Torus`, :class:`FatTree`,
  :class:`Islands` are the four).

  For the replay, vectorized over one step's messages (arrays ``src``, ``dst``,
  ``frac`` of participant numbers and fractions of n): :meth:`link_loads` (the load on
  every directed link, in units of n per link capacity, by link class) and
  :meth:`hops` (the route length of each message). For an emulation, per host:
  :meth:`hosts`, :meth:`links` (with their rates) and :meth:`route` (the nodes a
  message crosses). :meth:`fit` turns a family (``torus:3d``) into the network for
  ``p`` participants; :meth:`capacity` is the most participants it holds (None: any).
  """

  name: str

  def fit(self, p: int) -> Network: ...

  def capacity(self) -> int | None: ...

  def link_loads(self, src, dst, frac) -> dict[str, np.ndarray]: ...

  def hops(self, src, dst) -> np.ndarray: ...

  def hosts(self, p: int) -> tuple[str, ...]: ...

  def links(self, p: int) -> tuple[Link, ...]: ...

  def route(self, src: int, dst: int, p: int) -> tuple[str, ...]: ...


def _hosts(p: int) -> tuple[str, ...]:
  return tuple(f"h{i}" for i in range(p))


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
  and the bidirectional ring is no faster than the ring). ``rates``: hosts whose link
  runs at another rate, ``((host, fraction of a host link), ...)``, both directions
  (:func:`with_link_rates`).
  """

  ports: int | None = None
  hop_latency: float = 0.0
  rates: tuple[tuple[int, float], ...] = ()

  @property
  def name(self) -> str:
    return ("switch" if self.ports is None else f"switch:{self.ports}") + _rates_name(self.rates)

  def fit(self, p: int) -> Switch:
    return self

  def capacity(self) -> int | None:
    return None

  def link_loads(self, src, dst, frac) -> dict[str, np.ndarray]:
    n = int(max(src.max(), dst.max())) + 1
    r = _host_rates(self.rates, n)
    if self.ports is None:  # a message's own link runs at its slower end's rate
      return {"message": frac / np.minimum(r[src], r[dst])}
    return {
      "out": np.bincount(src, frac, n) / self.ports / r,
      "in": np.bincount(dst, frac, n) / self.ports / r,
    }

  def hops(self, src, dst) -> np.ndarray:
    return np.ones_like(src)

  def hosts(self, p: int) -> tuple[str, ...]:
    return _hosts(p)

  def links(self, p: int) -> tuple[Link, ...]:
    """Every host to the one switch, at ``ports`` host links' worth (1 without ports:
    the flat model's "own link per message" has no physical form)."""
    r = _host_rates(self.rates, p)
    return tuple(
      Link(h, "switch", float((self.ports or 1) * r[i])) for i, h in enumerate(_hosts(p))
    )

  def route(self, src: int, dst: int, p: int) -> tuple[str, ...]:
    return (f"h{src}", "switch", f"h{dst}")


@dataclass(frozen=True)
class Torus:
  """A k-ary n-cube: participant i sits on node i (row-major over ``dims``, the last
  dimension fastest); messages take the minimal-hop route dimension by dimension
  (dim 0 first), ties going forward; ``wrap=False`` is a mesh without wraparound.

  ``dims=None`` is a family: :meth:`fit` picks the most even ``ndim``-dimensional
  shape for each participant count (``torus:3d`` on the command line). ``rates``: hosts
  whose links run at another rate (:func:`with_link_rates`); a link runs at its slower
  end's.
  """

  dims: tuple[int, ...] | None
  wrap: bool = True
  hop_latency: float = 0.0
  ndim: int = 0
  rates: tuple[tuple[int, float], ...] = ()

  @property
  def name(self) -> str:
    if self.dims is None:
      return f"torus:{self.ndim}d" + ("" if self.wrap else ":nowrap") + _rates_name(self.rates)
    shape = "x".join(map(str, self.dims))
    return f"torus:{shape}" + ("" if self.wrap else ":nowrap") + _rates_name(self.rates)

  def capacity(self) -> int | None:
    return None if self.dims is None else math.prod(self.dims)

  def fit(self, p: int) -> Torus:
    if self.dims is None:
      return Torus(even_dims(p, self.ndim), self.wrap, self.hop_latency, rates=self.rates)
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
        if self.rates:
          loads[f"dim{d}{sign}"] = loads[f"dim{d}{sign}"] / self._link_rates(d, sign)
    return loads or {"none": np.zeros(1)}

  def _link_rates(self, d: int, sign: str) -> np.ndarray:
    """``float[line, c]``: the rate of dimension d's link from coordinate c (to c+1 for
    ``+``, c-1 for ``-``), in host links: its slower end's (:func:`with_link_rates`)."""
    k = self.dims[d]
    node = np.moveaxis(np.arange(math.prod(self.dims)).reshape(self.dims), d, -1).reshape(-1, k)
    r = _host_rates(self.rates, math.prod(self.dims))
    return np.minimum(r[node], r[np.roll(node, -1 if sign == "+" else 1, axis=1)])

  def hops(self, src, dst) -> np.ndarray:
    h = np.zeros_like(src)
    for *_, dist, _fw in self._routes(src, dst):
      h = h + dist
    return h

  def hosts(self, p: int) -> tuple[str, ...]:
    return _hosts(math.prod(self.fit(p).dims))

  def links(self, p: int) -> tuple[Link, ...]:
    """Point-to-point links between neighbours along every dimension (with the
    wraparound unless ``wrap=False``; a dimension of 2 has one link)."""
    dims = self.fit(p).dims
    rate = _host_rates(self.rates, math.prod(dims))
    out, seen = [], set()
    for r in range(math.prod(dims)):  # each link once, from its lower-numbered end
      c = np.unravel_index(r, dims)
      for d, k in enumerate(dims):
        for step in (1, -1):
          if k == 1 or (not self.wrap and not 0 <= c[d] + step < k):
            continue
          to = list(c)
          to[d] = (c[d] + step) % k
          j = int(np.ravel_multi_index(to, dims))
          if frozenset((r, j)) not in seen:
            seen.add(frozenset((r, j)))
            out.append(Link(f"h{r}", f"h{j}", float(min(rate[r], rate[j]))))
    return tuple(out)

  def route(self, src: int, dst: int, p: int) -> tuple[str, ...]:
    """Dimension order (dim 0 first), the minimal way round each ring (ties forward;
    without wraparound the direct way): the hosts a message crosses, both ends included."""
    dims = self.fit(p).dims
    at, goal = list(np.unravel_index(src, dims)), np.unravel_index(dst, dims)
    path = [f"h{src}"]
    for d, k in enumerate(dims):
      fwd = (goal[d] - at[d]) % k
      if self.wrap:
        step, n = (1, fwd) if fwd <= k - fwd else (-1, k - fwd)
      else:
        step, n = (1 if goal[d] >= at[d] else -1), abs(int(goal[d]) - int(at[d]))
      for _ in range(n):
        at[d] = (at[d] + step) % k
        path.append(f"h{int(np.ravel_multi_index(at, dims))}")
    return tuple(path)


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
  host links' worth (``oversubscription`` r:1); hosts have one link each, at the
  ``rates`` :func:`with_link_rates` sets (a host link's rate otherwise)."""

  hosts_per_leaf: int
  oversubscription: float = 1.0
  hop_latency: float = 0.0
  rates: tuple[tuple[int, float], ...] = ()

  @property
  def name(self) -> str:
    return f"fat_tree:{self.hosts_per_leaf}:{self.oversubscription:g}" + _rates_name(self.rates)

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
    r = _host_rates(self.rates, n)
    return {
      "host out": np.bincount(src, frac, n) / r,
      "host in": np.bincount(dst, frac, n) / r,
      "leaf up": np.bincount(src[cross] // k, frac[cross], leaves) / up,
      "leaf down": np.bincount(dst[cross] // k, frac[cross], leaves) / up,
    }

  def hops(self, src, dst) -> np.ndarray:
    return np.where(src // self.hosts_per_leaf == dst // self.hosts_per_leaf, 2, 4)

  def hosts(self, p: int) -> tuple[str, ...]:
    return _hosts(p)

  def links(self, p: int) -> tuple[Link, ...]:
    """Each host to its leaf; each leaf to the spine at k/r host links' worth."""
    k = self.hosts_per_leaf
    up = k / self.oversubscription
    leaves = -(-p // k)
    r = _host_rates(self.rates, p)
    return tuple(Link(f"h{i}", f"leaf{i // k}", float(r[i])) for i in range(p)) + tuple(
      Link(f"leaf{j}", "spine", up) for j in range(leaves)
    )

  def route(self, src: int, dst: int, p: int) -> tuple[str, ...]:
    a, b = src // self.hosts_per_leaf, dst // self.hosts_per_leaf
    if a == b:
      return (f"h{src}", f"leaf{a}", f"h{dst}")
    return (f"h{src}", f"leaf{a}", "spine", f"leaf{b}", f"h{dst}")


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

  def hosts(self, p: int) -> tuple[str, ...]:
    return _hosts(p)

  def links(self, p: int) -> tuple[Link, ...]:
    """Each host to its island's switch (rate: the island port's speed in NIC units,
    β₂/β₁) and through its own NIC to the network between islands (rate 1)."""
    fast = self.inter.beta / self.intra.beta if self.intra.beta > 0 else math.inf
    return tuple(Link(f"h{i}", f"island{i // self.group}", fast) for i in range(p)) + tuple(
      Link(f"h{i}", "inter") for i in range(p)
    )

  def route(self, src: int, dst: int, p: int) -> tuple[str, ...]:
    a, b = src // self.group, dst // self.group
    return (f"h{src}", f"island{a}" if a == b else "inter", f"h{dst}")


def _host_rates(rates: tuple[tuple[int, float], ...], n: int) -> np.ndarray:
  """``float[n]``: each of hosts 0..n-1's link rate in host links (1 unless ``rates``
  says otherwise; hosts >= n are not in this step)."""
  r = np.ones(n)
  for host, rate in rates:
    if host < n:
      r[host] = rate
  return r


def _rates_name(rates: tuple[tuple[int, float], ...]) -> str:
  return "".join(f" h{h}@{r:g}" for h, r in rates)


def takes_link_rates(net: Network) -> bool:
  """Whether ``net``'s host links can run at rates of their own (:func:`with_link_rates`):
  a switch, a fat tree or a torus; not islands, whose levels are priced as a whole.

  Example:
    >>> takes_link_rates(switch(1)), takes_link_rates(torus((8,))), takes_link_rates(
    ...   islands(4, "nvlink4", "ib_ndr"))
    (True, True, False)
  """
  return isinstance(net, (Switch, FatTree, Torus))


def with_link_rates(net: Network, rates: dict[int, float], p: int | None = None) -> Network:
  """``net`` with host links at other rates: ``rates`` maps a host (participant number) to
  its link's rate as a fraction of a host link's (0.1: a tenth), both directions, as
  ``allreduce-jax cluster --fault link:H=RATE@0`` sets it. Hosts not named keep theirs.
  ``switch(ports)`` (the host's ports together), ``switch()`` (a message at its slower
  end's rate), ``fat_tree`` (the host's link to its leaf) and ``torus`` (every link of the
  host: a link runs at its slower end's rate, as ``cluster --fault`` shapes both ends).
  ``p``: the hosts there are, to refuse one that is not. Replaces any rates ``net`` had.

  Example:
    >>> slow = with_link_rates(switch(1), {1: 0.1})
    >>> [lk.rate for lk in slow.links(3)]
    [1.0, 0.1, 1.0]
  """
  if not takes_link_rates(net):
    raise ValueError(
      f"net={getattr(net, 'name', net)!r}: per-host link rates need a switch, a fat tree or"
      " a torus."
    )
  out = []
  for host, rate in dict(rates).items():
    if (
      isinstance(host, bool)
      or not isinstance(host, (int, np.integer))
      or host < 0
      or (p is not None and host >= p)
    ):
      hosts = f"0..{p - 1}" if p is not None else "a participant number >= 0"
      raise ValueError(f"rates: host {host!r} is not one of the hosts ({hosts}).")
    if not (isinstance(rate, (int, float, np.floating)) and 0 < rate < math.inf):
      raise ValueError(f"rates: host {host}'s rate {rate!r} is not a fraction > 0.")
    if rate != 1:
      out.append((int(host), float(rate)))
  return dataclasses.replace(net, rates=tuple(sorted(out)))


def bucket_bytes(rate: float) -> int:
  """The bytes an emulated link's token bucket holds (``tc``'s ``tbf`` ``burst``, as
  ``allreduce-jax cluster`` shapes every link and ``--fault link:`` reshapes one): 4 ms of
  ``rate`` bytes/s, at least 64 KiB (a GSO segment). A link idle that long passes them at
  veth speed; :func:`allreduce_jax.gloo_model.predict_seconds` prices it (``bucket_s``).

  Example:
    >>> bucket_bytes(25e6), bucket_bytes(2.5e6)  # 200 and 20 Mbit/s
    (100000, 65536)
  """
  return max(64 * 1024, int(rate * 0.004))


#: The networks shipped here (any object with :class:`Network`'s methods is priced too).
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
  of :data:`PRESETS`)."""
  if group < 1:
    raise ValueError(f"islands group must be at least 1, got {group}.")
  label = f"islands:{group}:{intra}:{inter}" if isinstance(intra, str) else ""
  intra = PRESETS[intra] if isinstance(intra, str) else intra
  inter = PRESETS[inter] if isinstance(inter, str) else inter
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


# ----------------------------------------------------------------------------------------
# The spec strings: one parse table.
# ----------------------------------------------------------------------------------------


def _parse_switch(rest: list[str]) -> Switch:
  if len(rest) > 1:
    raise ValueError
  return switch(int(rest[0]) if rest else None)


def _parse_torus(rest: list[str]) -> Torus:
  if not (1 <= len(rest) <= 2 and rest[-1] in ("nowrap", "wrap", rest[0])):
    raise ValueError
  wrap = not (len(rest) == 2 and rest[1] == "nowrap")
  if rest[0].endswith("d"):
    if rest[0] not in ("1d", "2d", "3d"):
      raise ValueError
    return torus(rest[0], wrap)
  return torus(tuple(int(d) for d in rest[0].split("x")), wrap)


def _parse_fat_tree(rest: list[str]) -> FatTree:
  if len(rest) != 2:
    raise ValueError
  return fat_tree(int(rest[0]), float(rest[1]))


def _parse_islands(rest: list[str]) -> Islands:
  if len(rest) != 3:
    raise ValueError
  top = islands(int(rest[0]), *(parse_link(t) for t in rest[1:]))
  return Islands(top.group, top.intra, top.inter, f"islands:{rest[0]}:{rest[1]}:{rest[2]}")


#: kind -> (the form the error message names, builder from the ``:``-separated rest).
#: A builder raises ``ValueError`` (or ``KeyError``) on a malformed rest.
SPECS: dict[str, tuple[str, Callable[[list[str]], Network]]] = {
  "switch": ("switch[:ports]", _parse_switch),
  "torus": ("torus:AxBxC[:nowrap] or torus:1d|2d|3d", _parse_torus),
  "fat_tree": ("fat_tree:HOSTS_PER_LEAF:OVERSUBSCRIPTION", _parse_fat_tree),
  "islands": (
    "islands:GROUP:INTRA:INTER (INTRA/INTER a preset {presets} or latency_us,bandwidth,"
    " e.g. 5,400Gbit)",
    _parse_islands,
  ),
}


def register_spec(kind: str, form: str, build: Callable[[list[str]], Network]) -> None:
  """Adds a spec kind to :data:`SPECS`: ``parse("kind:...")`` calls ``build(rest)``
  (``rest``: the ``:``-separated fields after the kind); ``form`` is how the error
  message names it. ``scaling --topology`` and everything else that parses a spec
  takes it from there."""
  if not kind or ":" in kind:
    raise ValueError(f"register_spec: kind must be a non-empty name without ':', got {kind!r}.")
  SPECS[kind] = (form, build)


def parse(text: str, arg: str = "--topology") -> Network:
  """``switch[:ports]``, ``torus:16x16x16[:nowrap]`` / ``torus:3d``, ``fat_tree:8:7``,
  ``islands:8:nvlink4:ib_ndr`` (presets or ``latency_us,bandwidth`` as
  :func:`cost_model.parse_link` reads them), or a kind added by
  :func:`register_spec` -> a network. Raises ``ValueError`` with a one-line message
  naming ``arg``.

  Example:
    >>> parse("fat_tree:8:7").name
    'fat_tree:8:7'
  """
  kind, *rest = text.strip().split(":")
  if kind in SPECS:
    try:
      return SPECS[kind][1](rest)
    except (ValueError, KeyError):
      pass
  forms = [form.format(presets="/".join(PRESETS)) for form, _ in SPECS.values()]
  raise ValueError(f"{arg} {text!r}: expected {', '.join(forms[:-1])}, or {forms[-1]}.")
