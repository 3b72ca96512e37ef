"""gloo on a real wire: bytes per host, the half-duplex exchange, one collective at a time.

Measured on an emulated cluster (``allreduce-jax cluster``, shaped 200 Mbit/s links) and
traced to the sources, what the replay (:mod:`allreduce_jax.replay`) did not know:

- **Bytes per host** are the schedule's: :func:`schedule_bytes` sums a host's messages
  (the ring's ~2n, the parameter server root's (p-1)n) and the interface counters
  agree within TCP/IP headers (``experiments/emulated_network/``); :func:`link_params` prices
  those headers (:func:`payload_share`: 4.4 % of the link at a 1500-byte MTU).
- **A pairwise exchange runs half duplex over gloo.** When host A and B swap buffers in
  one ``ppermute``, XLA's gloo collective-permute posts the send before the receive
  (``xla/backends/cpu/collectives/gloo_communicator.cc``), and gloo's TCP pair sends
  its control messages through the same first-in-first-out queue as data
  (``gloo/transport/tcp/pair.cc``: ``send`` transmits at once if the peer's
  "ready to receive" arrived, and the following ``recv``'s "ready to receive" waits
  behind that payload). So the later of the two sends its whole payload before the
  earlier learns it may send: the two directions take turns. Gloo alone shows the
  order is the cause: the same exchange with the receive posted first ran at full
  duplex (one way's time at 1–16 MiB; ``experiments/gloo_pair_order/``, rows in
  ``experiments/gloo_pair_order/rows/gloo_pair_order.jsonl``); the fix is XLA's, out of reach of
  ``ppermute``. :func:`~allreduce_jax.replay.half_duplex` prices XLA as it is: in each step, a message whose
  reverse is in the same step shares the pair's time with it (its fraction becomes the
  sum of both). A shift (j → j+1) has no reverse message and keeps full duplex.
- **One collective at a time.** XLA:CPU's collective thunks all write one resource,
  the communicator (``xla/backends/cpu/runtime/collective_thunk.cc``:
  ``resource_uses``), so its executor runs them in program order, one after the other,
  even the ppermutes an algorithm issues together (the bidirectional ring's two lanes,
  a double-tree round). ``replay.messages(..., duplex=)`` lists a schedule that way (one step per
  ppermute: its own α, its own half-duplex check), so the two lanes of the
  bidirectional ring are two shifts in turn, not one exchange between neighbours.
- **Each link is a token bucket.** ``tc``'s ``tbf`` holds 4 ms of a link's rate
  (:func:`allreduce_jax.networks.bucket_bytes`); a link that was idle passes that much at
  veth speed, and every step's α of software time refills it. ``predict_seconds(...,
  bucket_s=)`` prices that (:func:`link_bucket_s` gives an emulated link's): it matters
  where a step's message is a few buckets long (1–4 MiB on 8 hosts). An exchange's two
  directions take turns (:func:`exchange_turns`), so the second direction's link refills
  while the first sends: each turn starts with a full bucket. One ``ppermute`` exchange
  on 4 hosts measured 1.31–1.34×, 1.77–1.86× and 1.93–1.96× a shift of the same bytes
  at 256 KiB, 1 MiB and 4 MiB (``experiments/gloo_pair_order/rows/half_duplex_sizes_p4.jsonl``),
  not 2×: the bucket each turn finds. A bucket holds at least 64 KiB, so a link slowed
  below 16.4 MB/s holds more than 4 ms of its rate (26 ms at 20 Mbit/s): where a schedule
  turns the slow link's direction often, each turn passes that much at once
  (``emulated_seconds(..., buckets=True)``, :func:`link_buckets`).

NumPy over the replay's schedules; it traces nothing and touches no device.
"""

from __future__ import annotations

import functools

import numpy as np

from allreduce_jax import cost_model, networks, replay


def emulated(network: str):
  """The topology that models ``allreduce-jax cluster --topology network``: its hosts
  have one link each, so ``switch`` is :func:`networks.switch` with one port (a host's
  messages of a step share its link, in and out); the others as
  :func:`networks.parse` reads them."""
  top = networks.parse(network)
  if isinstance(top, networks.Switch) and top.ports is None:
    return networks.switch(1)
  return top


def schedule_bytes(
  algorithm: str, p: int, n_bytes: float, top=None, choices: dict | None = None
) -> np.ndarray:
  """``float[p]``: bytes participant i sends in ``algorithm``'s generated schedule for
  ``n_bytes`` per participant (its messages' fractions × n, summed over steps;
  ``choices``: its trace-time choices, default those of the cost parameters in effect)."""
  top = top or networks.switch()
  sizes = replay.axis_sizes(algorithm, p, top)
  sent = np.zeros(p)
  for step in replay.messages(algorithm, sizes, n_bytes, choices):
    for m in step:
      sent[m[0]] += m[2] * n_bytes
  return sent


def predict_seconds(
  algorithm: str,
  p: int,
  n_bytes: float,
  params: cost_model.Params,
  top=None,
  duplex: str = "half",
  bucket_s: float = 0.0,
  choices: dict | None = None,
) -> float:
  """The replayed time of ``algorithm`` (generated schedule) on ``top`` (default the
  switch) with ``params``; ``duplex="half"`` prices it as XLA:CPU and gloo run it (one
  ppermute at a time; exchanges at half duplex: ``replay.messages(..., duplex=)``), ``"recv_first"``
  as it would run with each receive posted first (one ppermute at a time, every link full
  duplex), ``"full"`` is :func:`replay.predict_seconds`'s assumption (a step's ppermutes
  together, every link full duplex). ``bucket_s > 0``: every directed link is a token bucket of that
  many seconds of its rate (:func:`bucket_replay`), or of its own where ``bucket_s`` holds
  one a directed link (:func:`link_buckets`); 0 prices every byte at the rate.
  ``choices``: the schedule's trace-time choices, as the run made them (a bench row's
  ``choices``, e.g. the double binary tree's chunk count); default those the cost
  parameters in effect make, which are the run's only if it traced with the same."""
  replay.check_duplex(duplex)
  bucket = np.asarray(bucket_s, dtype=float)
  if bucket.ndim > 1 or not np.all(bucket >= 0):
    raise ValueError(
      f"bucket_s={bucket_s!r}: expected seconds >= 0 (0: no bucket), or one per directed"
      " link (link_buckets)."
    )
  if p < 2:
    return 0.0
  top = top or networks.switch()
  if choices is None:  # the schedule's choices now, so that the buckets' loads are keyed by them
    choices = replay.trace_choices(algorithm, p, n_bytes)
  n_bytes = float(n_bytes)
  prof = replay.algorithm_profile(algorithm, p, top, n_bytes, choices=choices, duplex=duplex)
  params = cost_model.resolve(params, algorithm)
  if np.any(bucket):
    loads = _loads(algorithm, p, n_bytes, top, duplex, tuple(sorted(choices.items())))
    return float(_drain(prof, loads, n_bytes, params, bucket).sum())
  return float(prof.seconds(n_bytes, params).sum())


def choose(
  p: int,
  nbytes: float,
  params=None,
  candidates: tuple[str, ...] | None = None,
  *,
  topology=None,
  duplex: str = "half",
  bucket_s=0.0,
) -> str:
  """:func:`allreduce_jax.cost_model.choose` with the candidates priced as they run on
  ``topology``: ``duplex="half"`` as XLA:CPU runs them over gloo, ``"recv_first"`` with each
  receive posted first, ``"full"`` the replay's own assumption (:func:`predict_seconds`).
  ``bucket_s``: each link's token bucket, as :func:`predict_seconds` takes it (one value
  for every link, or one per link: :func:`link_buckets`; not with ``duplex="full"``).
  Without ``topology``: the flat formula, as ``cost_model.choose``."""
  replay.check_duplex(duplex)
  if np.any(bucket_s) and (topology is None or duplex == "full"):
    raise ValueError(
      f"choose: bucket_s prices a topology's links at duplex 'half' or 'recv_first', got"
      f" topology={'None' if topology is None else 'given'}, duplex={duplex!r}."
    )
  price = None
  if topology is not None and duplex != "full":
    price = functools.partial(predict_seconds, duplex=duplex, bucket_s=bucket_s)
  return cost_model.choose(p, nbytes, params, candidates, topology=topology, price=price)


@functools.lru_cache(maxsize=4096)
def _loads(algorithm: str, p: int, n_bytes: float, top, duplex: str, choices: tuple):
  """For the token bucket, each step's link loads per turn (:func:`exchange_turns` of
  the posted step at ``duplex="half"``); None on a network without physical links.
  Cached: fits price the same schedules many times."""
  if not _has_links(top):
    return None
  sizes = replay.axis_sizes(algorithm, p, top)
  steps = replay.messages(algorithm, sizes, n_bytes, dict(choices), duplex)
  posted = None
  if duplex == "half":  # the posted steps the buckets take turns on, before their merge
    posted = replay.messages(algorithm, sizes, n_bytes, dict(choices), "recv_first")
  return _turn_loads(steps, top.fit(p), p, posted)


def _has_links(top) -> bool:
  """Whether ``top``'s hosts have physical links of their own, each a token bucket:
  ``switch(ports)``, a torus, a fat tree (not ``switch()`` nor islands)."""
  return isinstance(top, (networks.Torus, networks.FatTree)) or (
    isinstance(top, networks.Switch) and top.ports is not None
  )


def _link_vector(step: replay.Step, top, p: int) -> np.ndarray:
  """Every directed link's load in one step (units of n per capacity), in one fixed
  order for any step on ``p`` participants, an empty one included: the vector form of
  :func:`replay.step_link_loads`, whose per-host classes end at the step's highest
  participant (a zero message p-1 → p-1 pads them to p here)."""
  src = np.array([m[0] for m in step] + [p - 1])
  dst = np.array([m[1] for m in step] + [p - 1])
  frac = np.array([m[2] for m in step] + [0.0])
  loads = top.link_loads(src, dst, frac)
  return np.concatenate([np.ravel(loads[c]) for c in sorted(loads)])


def exchange_turns(step: replay.Step) -> tuple[replay.Step, ...]:
  """The parts of one ``ppermute`` step whose links move one after the other over gloo:
  an exchange (every message ``a → b`` has its reverse ``b → a`` in the step) runs in two
  turns, ``a → b`` for ``a < b`` then the reverse (:func:`~allreduce_jax.replay.half_duplex`: which peer sends
  first depends on who posted later; with equal fractions either order prices the same);
  any other step is one part, ``half_duplex``'s (a pair inside it shares its time)."""
  have = {(m[0], m[1]) for m in step}
  if step and all((m[1], m[0]) in have and m[0] != m[1] for m in step):
    return [m for m in step if m[0] < m[1]], [m for m in step if m[0] > m[1]]
  return (replay.half_duplex([step])[0],)


def bucket_replay(
  steps: replay.Steps,
  top,
  p: int,
  n_bytes: float,
  params: cost_model.Params,
  bucket_s: float | np.ndarray,
  posted: replay.Steps | None = None,
) -> np.ndarray:
  """``float[steps]``: each step's time when every directed link of ``top`` is a token
  bucket holding ``bucket_s`` seconds of its own rate (``tc``'s ``tbf``), or each its own
  where ``bucket_s`` holds one a directed link (:func:`link_buckets`).

  Every bucket starts full. A step first spends its fixed time ``f`` (α, the hops'
  latency, γ's reduction: the replay's step time at β = 0), during which every link
  refills: ``have = min(bucket, tokens + f)``. Each link then owes ``need`` seconds at
  the rate (its load × n·β) and passes ``have`` of them at once; the step's data time
  is the most any link still owes, ``d = max(0, max(need - have))``, during which every
  link refills again: ``tokens = min(bucket, have - need + d)``. With ``bucket_s = 0``
  this is the replay's own ``f + max(need)`` per step.

  ``posted``: the same steps, one per posted ``ppermute`` (``duplex="recv_first"``,
  before :func:`~allreduce_jax.replay.half_duplex` merged each exchange; ``steps`` then are its merge, which
  keeps its fixed time). Each step's data then moves in :func:`exchange_turns`: an
  exchange's first turn as above, then its second, whose links refilled during the
  first (``d = d1 + d2``). With ``bucket_s = 0`` that is the merged step's time again.

  Needs a network whose hosts have links (``switch(ports)``, ``torus``, ``fat_tree``):
  a message's own link (``switch()``) has no bucket to carry over, and ``islands``
  price by level."""
  _check_bucket_network(top)
  if posted is not None and len(posted) != len(steps):
    raise ValueError(f"posted: {len(posted)} steps where steps has {len(steps)}.")
  fit = top.fit(p)
  prof = replay.profile(steps, fit, p)
  return _drain(prof, _turn_loads(steps, fit, p, posted), n_bytes, params, bucket_s)


def _check_bucket_network(top) -> None:
  if not _has_links(top):
    raise ValueError(
      f"top={top!r}: a token bucket needs a network of physical links (switch(1), torus,"
      " fat_tree; gloo_model.emulated(spec) gives the one a cluster builds)."
    )


def _turn_loads(steps: replay.Steps, fit, p: int, posted) -> list[list[np.ndarray]]:
  """Per step, its directed links' loads (units of n per capacity) in each turn: the
  step itself, or its posted step's :func:`exchange_turns`. Identical steps share one
  list."""
  memo: dict[int, list[np.ndarray]] = {}
  out = []
  for i, step in enumerate(steps):
    if id(step) not in memo:
      parts = (step,) if posted is None else exchange_turns(posted[i])
      memo[id(step)] = [_link_vector(part, fit, p) for part in parts]
    out.append(memo[id(step)])
  return out


def _drain(prof, loads, n_bytes: float, params: cost_model.Params, bucket_s: float) -> np.ndarray:
  """:func:`bucket_replay`'s time per step from the routed profile and the turns' loads."""
  if loads is None:
    raise ValueError(
      "top: a token bucket needs a network of physical links (switch(1), torus, fat_tree;"
      " gloo_model.emulated(spec) gives the one a cluster builds)."
    )
  fixed = prof.seconds(n_bytes, cost_model.Params(params.alpha, 0.0, params.gamma))
  scale = n_bytes * params.beta
  full = np.asarray(bucket_s, dtype=float)
  shape = loads[0][0].shape if loads else (0,)
  if full.ndim and loads and full.shape != shape:
    raise ValueError(
      f"bucket_s: {full.shape[0]} buckets where the network has {shape[0]} directed links"
      " (link_buckets gives one each)."
    )
  full = np.broadcast_to(full, shape)
  tokens = full.copy()
  out = np.empty(len(loads))
  for i, parts in enumerate(loads):
    tokens = np.minimum(full, tokens + fixed[i])
    out[i] = fixed[i]
    for load in parts:
      need = load * scale
      data = max(0.0, float(np.max(need - tokens)))
      tokens = np.minimum(full, tokens - need + data)
      out[i] += data
  return out


def link_bucket_s(rate_bytes_per_s: float) -> float:
  """Seconds of its own rate that an emulated link's token bucket holds
  (:func:`allreduce_jax.networks.bucket_bytes` / rate): 4 ms from 16.4 MB/s up. A fat
  tree's uplinks, at k/r host links' rate, hold 4 ms of theirs too (for rates where
  64 KiB is not the floor)."""
  if not rate_bytes_per_s > 0:
    raise ValueError(f"rate_bytes_per_s={rate_bytes_per_s!r}: expected bytes/s > 0.")
  return networks.bucket_bytes(rate_bytes_per_s) / rate_bytes_per_s


def link_buckets(
  network: str, p: int, *, rate: float, link_rates: dict[int, float] | None = None
) -> np.ndarray:
  """``float[links]``: each directed link's token bucket in seconds of its own rate, as
  ``allreduce-jax cluster`` shapes the links of :func:`emulated_network` (``rate``, and
  ``link_rates`` ``{host: bytes/s}`` where not): :func:`link_bucket_s` of that link's
  rate, in the order :func:`predict_seconds`'s ``bucket_s`` takes them. A bucket holds
  4 ms of its link's rate but at least 64 KiB, so a link slowed below 16.4 MB/s holds
  more than 4 ms of it: 26 ms at 20 Mbit/s, 262 ms at 2 Mbit/s. A link's rate is read
  off the network as the ratio of its loads without and with ``link_rates`` (every host
  sending to every other loads every link); one faster than a host link (a fat tree's
  uplink) is priced at a host link's rate, the same 4 ms above 16.4 MB/s.

  Example:
    >>> (link_buckets("switch", 2, rate=25e6, link_rates={1: 2.5e6}) * 1e3).round(1).tolist()
    [4.0, 26.2, 4.0, 26.2]
  """
  top = emulated_network(network, p, rate=rate, link_rates=link_rates).fit(p)
  _check_bucket_network(top)
  pairs = [(a, b, 1.0) for a in range(p) for b in range(p) if a != b]
  slow = _link_vector(pairs, top, p)
  healthy = _link_vector(pairs, emulated_network(network, p, rate=rate).fit(p), p)
  share = np.divide(healthy, slow, out=np.ones_like(slow), where=slow > 0)
  return np.array([link_bucket_s(rate * min(f, 1.0)) for f in share])


def payload_share(mtu: int = 1500) -> float:
  """The share of a shaped link's bytes that is TCP payload in bulk transfer: a full
  segment carries ``mtu - 52`` payload bytes (20 of IPv4, 32 of TCP with timestamps)
  in an ``mtu + 14``-byte frame (the Ethernet header, which ``tc`` counts): 0.956 at
  1500, 0.993 at 9000. The plain-TCP ring on the emulated switch reaches 0.951–0.955
  of the rate (``experiments/emulated_network/tcp_ring_ceiling.py``)."""
  if mtu <= 52:
    raise ValueError(f"mtu={mtu!r}: expected more than 52 bytes (IPv4 + TCP headers).")
  return (mtu - 52) / (mtu + 14)


def link_params(rate_bytes_per_s: float, alpha_s: float, mtu: int = 1500) -> cost_model.Params:
  """α-β parameters of an emulated link for gloo's payload: β from its rate and the
  frames' headers (:func:`payload_share` at ``mtu``), α (per step) as fitted."""
  return cost_model.Params(alpha_s, 1.0 / (rate_bytes_per_s * payload_share(mtu)), 0.0)


# The replay against the wire: what an emulated network's measured rows are compared with.

PROBE_BYTES = (4096, 65536)
"""The sizes per participant (4 and 64 KiB) whose measured times :func:`fit_alpha` fits α
on by default: small enough that the per-step time dominates, large enough to leave the
launch noise of the smallest calls behind."""


def emulated_seconds(
  algorithm: str,
  p: int,
  n_bytes: float,
  network: str,
  *,
  rate: float,
  alpha: float,
  duplex: str = "half",
  bucket_s: float = 0.0,
  mtu: int = 1500,
  choices: dict | None = None,
  link_rates: dict[int, float] | None = None,
  buckets: bool = False,
) -> float:
  """The replayed time of ``algorithm`` on ``p`` hosts of the emulated network that
  ``allreduce-jax cluster --topology network`` builds (:func:`emulated`), every link
  shaped to ``rate`` bytes/s (β of gloo's payload at ``mtu``, :func:`link_params`) and
  ``alpha`` seconds per step: :func:`predict_seconds` on that network. ``link_rates``:
  hosts whose link runs at another rate, ``{host: bytes/s}``, both directions (what
  ``cluster --fault link:H=RATE@0`` sets; :func:`emulated_network`).

  With ``bucket_s = 0`` it is linear in α, ``steps·α + the bytes' time`` (with
  ``duplex="half"``: exchanges at half duplex, one ``ppermute`` at a time); ``bucket_s``
  prices each link's token bucket (:func:`link_bucket_s` gives an emulated link's).

  Args:
    algorithm: a key of ``ALGORITHMS``.
    p: hosts (one participant each).
    n_bytes: bytes per participant.
    network: a ``cluster --topology`` spec: ``"switch"``, ``"fat_tree:4:2"``, ``"torus:8"``.
    rate: each host link's rate in bytes/s (25e6 for 200 Mbit/s).
    alpha: seconds per step (:func:`fit_alpha`).
    duplex, bucket_s, choices: as :func:`predict_seconds` takes them.
    mtu: the links' MTU (the frames' header share of the rate).
    link_rates: ``{host: bytes/s}`` for the hosts whose link is not at ``rate`` (a
      bucket, ``bucket_s``, then holds that many seconds of each link's own rate).
    buckets: every link's token bucket as the cluster shapes it (:func:`link_buckets`:
      64 KiB at least, so a slowed link's holds more seconds of its rate than a healthy
      one's); instead of ``bucket_s``.

  Returns:
    Seconds.
  """
  if not rate > 0:
    raise ValueError(f"rate={rate!r}: expected a link rate in bytes/s > 0.")
  if buckets and np.any(bucket_s):
    raise ValueError(
      f"bucket_s={bucket_s!r} with buckets=True: expected one of them (buckets: each link's own)."
    )
  params = link_params(rate, alpha, mtu)
  top = emulated_network(network, p, rate=rate, link_rates=link_rates)
  if buckets:
    bucket_s = link_buckets(network, p, rate=rate, link_rates=link_rates)
  return predict_seconds(algorithm, p, n_bytes, params, top, duplex, bucket_s, choices)


def emulated_network(
  network: str, p: int, *, rate: float, link_rates: dict[int, float] | None = None
):
  """:func:`emulated`'s network with the hosts of ``link_rates`` (``{host: bytes/s}``,
  both directions of its link) at those rates, ``rate`` bytes/s being every other host
  link's: :func:`allreduce_jax.networks.with_link_rates` with each rate as a fraction of
  ``rate``. A switch or a fat tree; a bad host or rate is a one-line ``ValueError``
  naming ``link_rates``.

  Example:
    >>> emulated_network("switch", 4, rate=25e6, link_rates={1: 2.5e6}).name
    'switch:1 h1@0.1'
  """
  top = emulated(network)
  if not link_rates:
    return top
  for host, r in link_rates.items():
    if not (isinstance(r, (int, float)) and 0 < r < float("inf")):
      raise ValueError(f"link_rates: host {host!r}'s rate {r!r} is not bytes/s > 0.")
  try:
    return networks.with_link_rates(top, {h: r / rate for h, r in link_rates.items()}, p)
  except ValueError as e:
    raise ValueError(f"link_rates: {str(e).split(': ', 1)[1]}") from None


def cut_bound_seconds(
  n_bytes: float,
  p: int,
  *,
  rate: float,
  link_rates: dict[int, float] | None = None,
  network: str = "switch",
  mtu: int = 1500,
) -> float:
  """The least time any exact all-reduce of ``n_bytes`` per host needs on ``p`` hosts of
  the emulated ``network`` whose links run at ``rate`` bytes/s (``link_rates``: ``{host:
  bytes/s}`` where not), from the cut around each host: every other host's result depends
  on host h's n bytes and h's result on the others' sum (n bytes of it that h cannot
  know), so n bytes leave h and n bytes enter it, at best at once (full-duplex links):

  :math:`T \\ge \\max_h n / (c_h \\cdot s)`, ``c_h`` the bytes/s of h's links together
  (one link on a switch or a fat tree; on a ring of links two, each at its slower end's
  rate), ``s`` the payload share of the wire (:func:`payload_share`). On healthy links of
  a switch the ring's 2(p−1)/p·n per direction is 1.5× it at p = 4; with one slow link,
  the ring still moves 1.5n through it; a schedule that makes the slow host a leaf whose
  sending and receiving overlap (it sends its n once and receives the sum once) n.

  Example:
    >>> round(cut_bound_seconds(25e6, 4, rate=25e6, link_rates={1: 2.5e6}), 2)  # 10 / 0.956
    10.46
  """
  if p < 2:
    return 0.0
  top = emulated_network(network, p, rate=rate, link_rates=link_rates).fit(p)
  cut = dict.fromkeys(top.hosts(p), 0.0)
  for lk in top.links(p):
    for end in (lk.a, lk.b):
      if end in cut:
        cut[end] += lk.rate
  return n_bytes / (min(cut.values()) * rate * payload_share(mtu))


def replay_steps(algorithm: str, p: int, n_bytes: float, network: str, duplex: str = "half") -> int:
  """The number of steps the replay charges α for: the slope of :func:`emulated_seconds`
  in α (without a bucket), e.g. 2(p−1) for the ring and 2·lg p for halving-doubling, one
  step per ``ppermute`` at ``duplex="half"``/``"recv_first"``."""
  top = emulated(network)
  return int(replay.algorithm_profile(algorithm, p, top, n_bytes, duplex=duplex).steps)


def fit_alpha(
  rows,
  p: int,
  network: str,
  *,
  rate: float,
  duplex: str = "half",
  bucket_s: float = 0.0,
  probe_bytes: tuple[int, ...] = PROBE_BYTES,
  mtu: int = 1500,
  max_alpha: float = 0.02,
) -> float:
  """α per step that makes :func:`emulated_seconds` fit the measured ``rows`` at the
  probe sizes, by least squares over ``(time - model)²``.

  Without a bucket the model is ``t = k·α + b`` per row (``k`` steps, ``b`` its bytes'
  time at α = 0), so α = Σ k(t − b) / Σ k², floored at 0. With ``bucket_s > 0`` the
  bucket's refill during α makes the time nonlinear in α: a golden-section search on
  ``[0, max_alpha]``.

  Args:
    rows: ``bench`` rows (``algorithm``, ``bytes``, ``time_us``) of one network and host
      count; rows at other sizes than ``probe_bytes`` are ignored.
    p, network, rate, duplex, bucket_s, mtu: as :func:`emulated_seconds` takes them.
    probe_bytes: the sizes per participant fitted on (default :data:`PROBE_BYTES`).
    max_alpha: the search's upper end in seconds (with a bucket).

  Returns:
    Seconds per step (0.0 when no row is at a probe size).
  """
  small = [r for r in rows if r["bytes"] in probe_bytes]
  if not small:
    return 0.0
  if bucket_s:

    def err(a):
      return sum(
        (emulated_seconds(r["algorithm"], p, r["bytes"], network, rate=rate, alpha=a,
                          duplex=duplex, bucket_s=bucket_s, mtu=mtu) - r["time_us"] * 1e-6) ** 2
        for r in small
      )  # fmt: skip

    return _golden_min(err, 0.0, max_alpha)
  num = den = 0.0
  for r in small:
    k = replay_steps(r["algorithm"], p, r["bytes"], network, duplex)
    b = emulated_seconds(
      r["algorithm"], p, r["bytes"], network, rate=rate, alpha=0.0, duplex=duplex, mtu=mtu
    )
    num += k * (r["time_us"] * 1e-6 - b)
    den += k * k
  return max(num / den, 0.0) if den else 0.0


def _golden_min(f, lo: float, hi: float, tol: float = 1e-8) -> float:
  """The minimum of a unimodal ``f`` on ``[lo, hi]`` to within ``tol`` (golden section)."""
  g = (5**0.5 - 1) / 2
  a, b = lo, hi
  c, d = b - g * (b - a), a + g * (b - a)
  fc, fd = f(c), f(d)
  while b - a > tol:
    if fc <= fd:
      b, d, fd = d, c, fc
      c = b - g * (b - a)
      fc = f(c)
    else:
      a, c, fc = c, d, fd
      d = a + g * (b - a)
      fd = f(d)
  return (a + b) / 2


def steady_step_seconds(
  step: replay.Step,
  p: int,
  n_bytes: float,
  network: str,
  *,
  rate: float,
  alpha: float,
  bucket_s: float,
  repeats: int = 4,
) -> float:
  """The time of one ``ppermute`` step (messages ``(src, dst, fraction)``) once it runs
  back to back: the last of ``repeats`` identical calls, each link's token bucket drained
  by the ones before (:func:`bucket_replay`, an exchange's two directions in turn). A
  shift ``j → j+1`` passes n at the rate; an exchange ``j ↔ j^1`` at most twice that."""
  posted = [list(step)] * repeats
  top = emulated(network)
  params = link_params(rate, alpha)
  steps = replay.half_duplex(posted)
  return float(bucket_replay(steps, top, p, n_bytes, params, bucket_s, posted)[-1])


def traced_params(rows) -> cost_model.Params:
  """The cost parameters that ``bench`` rows of CPU hosts traced with when no fit file was
  given: the shipped CPU fit (``cost_model.backend_params("cpu")``), which chose e.g. the
  double binary tree's chunk count. Checked, not assumed: every ring row's
  ``predicted_us`` and every row's recorded ``choices`` must be that fit's, else a
  ``ValueError`` names the row (the replay would price another schedule than the one that
  ran). Rows of other kinds than ``"bench"`` are skipped."""
  params = cost_model.backend_params("cpu")
  with cost_model.use_params(params):
    for r in rows:
      if r.get("kind") != "bench":
        continue
      alg, p, n = r["algorithm"], r["n_devices"], r["bytes"]
      ours = cost_model.predict_us(alg, p, n, params) if alg == "ring" else None
      off = ours is not None and abs(ours - r["predicted_us"]) > 1e-6 * ours
      if off or r.get("choices") not in (None, replay.trace_choices(alg, p, n) or None):
        raise ValueError(
          f"rows: the {alg} row at {n} bytes on {p} hosts traced with other cost parameters"
          " than the shipped CPU fit; the replay would price another schedule than the one"
          " that ran."
        )
  return params
