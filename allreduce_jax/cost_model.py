"""The α-β-γ cost model of every algorithm (Hockney; Thakur, Rabenseifner & Gropp 2005).

Notation: p participants, n bytes per participant, α seconds of latency per message
step, β seconds per byte on a link, γ seconds per byte of local reduction.

:func:`schedule` gives, per algorithm, the communication schedule in closed form:
the sequential message steps (what α multiplies), the bytes on the critical path
(what β multiplies), the bytes reduced (γ), the number of ``collective-permute``
ops the hand-written JAX code issues, and the most bytes any one participant sends.
The HLO audit checks the last two against the compiled program.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass
from pathlib import Path

from allreduce_jax import units


@dataclass(frozen=True)
class Schedule:
  """Closed-form communication schedule of one all-reduce.

  Attributes:
    steps: sequential message steps on the critical path (× α).
    beta_bytes: bytes serialized on the busiest link on the critical path (× β).
    gamma_bytes: bytes reduced on the critical path (× γ).
    permutes: ``collective-permute`` ops in the hand-written JAX program.
    max_sent_bytes: the most bytes any one participant sends.
  """

  steps: float
  beta_bytes: float
  gamma_bytes: float
  permutes: int
  max_sent_bytes: float


@dataclass(frozen=True)
class Params:
  """Machine parameters: α (s per step), β (s per byte), γ (s per byte reduced)."""

  alpha: float
  beta: float
  gamma: float = 0.0

  @classmethod
  def from_link(cls, latency_us: float, bandwidth_GBps: float, reduce_GBps: float = math.inf):
    """From a per-step latency (µs) and a link bandwidth (GB/s, 1e9 bytes/s)."""
    gamma = 0.0 if math.isinf(reduce_GBps) else 1.0 / (reduce_GBps * 1e9)
    return cls(latency_us * 1e-6, 1.0 / (bandwidth_GBps * 1e9), gamma)


#: Documented defaults (used until a fit exists): roughly a NVLink-class GPU link.
DEFAULT_PARAMS = Params.from_link(latency_us=5.0, bandwidth_GBps=100.0, reduce_GBps=1000.0)


def _lg(p: int) -> int:
  return (p - 1).bit_length()  # ⌈lg p⌉


def _pof2(p: int) -> int:
  return 1 << (p.bit_length() - 1)


def _ring(p: int, n: float, directions: int = 1) -> Schedule:
  share = (p - 1) / p * n
  return Schedule(2 * (p - 1), 2 * share / directions, share, 2 * (p - 1) * directions, 2 * share)


def _empty() -> Schedule:
  return Schedule(0, 0.0, 0.0, 0, 0.0)


def ring_schedule(p: int, n: float, inner: int | None = None) -> Schedule:
  """Ring (and XLA's ``psum``, modelled as a ring): 2(p-1) steps of n/p bytes."""
  return _ring(p, n)


def bidirectional_ring_schedule(p: int, n: float, inner: int | None = None) -> Schedule:
  """Two rings in opposite directions on half the buffer each."""
  return _ring(p, n, directions=2)


def recursive_doubling_schedule(p: int, n: float, inner: int | None = None) -> Schedule:
  """lg p full-buffer exchanges (+2 for MPICH's fold when p is not a power of two)."""
  L, fold = _pof2(p).bit_length() - 1, int(p != _pof2(p))
  return Schedule(L + 2 * fold, n * (L + 2 * fold), n * (L + fold), L + 2 * fold, n * (L + fold))


def halving_doubling_schedule(p: int, n: float, inner: int | None = None) -> Schedule:
  """Rabenseifner: recursive-halving reduce-scatter + recursive-doubling all-gather."""
  pof2 = _pof2(p)
  L, fold = pof2.bit_length() - 1, int(p != pof2)
  share = (pof2 - 1) / pof2 * n
  return Schedule(
    2 * L + 2 * fold,
    2 * share + 2 * fold * n,
    share + fold * n,
    2 * L + 2 * fold,
    2 * share + fold * n,
  )


def tree_schedule(p: int, n: float, inner: int | None = None) -> Schedule:
  """Binomial reduce then broadcast: 2⌈lg p⌉ full-buffer steps."""
  d = _lg(p)
  return Schedule(2 * d, 2 * d * n, d * n, 2 * d, d * n)


def naive_schedule(p: int, n: float, inner: int | None = None) -> Schedule:
  """Parameter server: p-1 full buffers in and out of the root's link."""
  return Schedule(2 * (p - 1), 2 * (p - 1) * n, (p - 1) * n, 2 * (p - 1), (p - 1) * n)


def hierarchical_schedule(p: int, n: float, inner=None) -> Schedule:
  """Ring reduce-scatter over the inner a, ring all-reduce of n/a over the outer b;
  with ``inner`` a tuple of the sizes below the outermost axis, the same down any
  number of levels (:func:`hierarchical_levels_schedule`)."""
  return hierarchical_levels_schedule(p, n, inner)


def halving_doubling_near_schedule(p: int, n: float, inner: int | None = None) -> Schedule:
  """Near-first halving-doubling: the same steps and bytes as far-first (MPICH) in the
  flat model; only the distances differ (a topology sees them, this model does not)."""
  return halving_doubling_schedule(p, n)


def swing_schedule(p: int, n: float, inner: int | None = None) -> Schedule:
  """Swing (bandwidth-optimal): 2 lg p halving/doubling steps with partners r ± ρ(s),
  MPICH's fold for non-powers of two; in the flat model the same counts as
  Rabenseifner's halving-doubling."""
  return halving_doubling_schedule(p, n)


def double_binary_tree_schedule(
  p: int, n: float, inner: int | None = None, chunks: int | None = None
) -> Schedule:
  """Pipelined double binary tree with k chunks per tree (k: ``chunks``, else the
  model's choice for (p, n), as the algorithm picks it at trace time).

  steps = k + 2⌈lg p⌉ - 1 rounds of n/(2k)-byte chunks; beta_bytes = steps·n/(2k)
  (each pair on its own link, the flat model's convention: → n/2; one NIC per
  participant would carry ≈ 2n); gamma_bytes sums the busiest participant's
  combines per round (→ n); permutes: per round the busiest participant's upward
  plus downward transfers; max_sent_bytes = (1 + children)·n/2 over both trees (≤ 2n).
  See ``allreduce_jax._dbtree.cost``.
  """
  from allreduce_jax import _dbtree  # lazy: the plan lives with the algorithm

  k = chunks or _dbtree.choose_chunks(p, n)
  c = _dbtree.cost(p, n, k)
  return Schedule(c["steps"], c["beta_bytes"], c["gamma_bytes"], c["permutes"], c["max_sent_bytes"])


def _axis_sizes(p: int, inner) -> tuple[int, ...]:
  """Mesh axis sizes, outer first, from ``inner``: an int a (two levels, p/a × a) or
  the tuple of every axis size below the outermost."""
  inner = (inner,) if isinstance(inner, int) else tuple(inner or ())
  below = math.prod(inner)
  if not inner or any(a < 1 for a in inner) or p % below:
    raise ValueError(f"hierarchical needs inner sizes dividing p={p}; got inner={inner}.")
  return (p // below, *inner)


def hierarchical_levels_schedule(p: int, n: float, inner) -> Schedule:
  """Hierarchical over any number of axes: ring reduce-scatter down the inner axes
  (innermost first), ring all-reduce on the outermost, all-gather back up.

  ``inner``: the sizes of the axes below the outermost, outer first (``(a1, a2)`` on
  an a0 × a1 × a2 mesh), or one int for two levels."""
  sizes = _axis_sizes(p, inner)
  total, shard = _empty(), n
  for a in reversed(sizes[1:]):
    rs = Schedule(a - 1, (a - 1) / a * shard, (a - 1) / a * shard, a - 1, (a - 1) / a * shard)
    total = Schedule(
      total.steps + 2 * rs.steps,
      total.beta_bytes + 2 * rs.beta_bytes,
      total.gamma_bytes + rs.gamma_bytes,
      total.permutes + 2 * rs.permutes,
      total.max_sent_bytes + 2 * rs.max_sent_bytes,
    )
    shard = shard / a
  outer = _ring(sizes[0], shard) if sizes[0] > 1 else _empty()
  return Schedule(
    total.steps + outer.steps,
    total.beta_bytes + outer.beta_bytes,
    total.gamma_bytes + outer.gamma_bytes,
    total.permutes + outer.permutes,
    total.max_sent_bytes + outer.max_sent_bytes,
  )


def schedule(algorithm: str, p: int, n: float, inner: int | None = None) -> Schedule:
  """The closed-form schedule of ``algorithm`` on ``p`` participants, ``n`` bytes each.

  The formula is the ``schedule`` field of the algorithm's registry record
  (``ALGORITHMS[algorithm].schedule``), so an algorithm a user registers is priced
  like the built-in ones.

  Args:
    algorithm: a key of ``ALGORITHMS`` whose record has a ``schedule``.
    p: participant count.
    n: bytes per participant.
    inner: for multi-axis algorithms (``hierarchical``), the size a of the inner
      (fast) level; p = a·b.

  Returns:
    A :class:`Schedule`.

  Example:
    >>> s = schedule("ring", 8, 1024)
    >>> s.steps, s.beta_bytes, s.max_sent_bytes
    (14, 1792.0, 1792.0)
  """
  from allreduce_jax._api import ALGORITHMS  # lazy: _api imports this module

  if p < 1:
    raise ValueError(f"p must be at least 1, got {p}.")
  record = ALGORITHMS.get(algorithm)
  if record is None or record.schedule is None:
    raise ValueError(f"algorithm={algorithm!r} has no cost model.")
  if p == 1:
    return _empty()
  return record.schedule(p, n, inner)


def predict_seconds(
  algorithm: str, p: int, n: float, params=DEFAULT_PARAMS, inner: int | None = None
) -> float:
  """α·steps + β·bytes + γ·reduced bytes, in seconds.

  ``params`` is a :class:`Params` or a :class:`FittedParams` (its entry for
  ``algorithm`` is used); ``auto`` is predicted as the algorithm it would pick.
  """
  if algorithm == "auto":
    algorithm = choose(p, n, params)
  params = resolve(params, algorithm)
  s = schedule(algorithm, p, n, inner)
  return params.alpha * s.steps + params.beta * s.beta_bytes + params.gamma * s.gamma_bytes


def predict_us(
  algorithm: str, p: int, nbytes: float, params=None, inner: int | None = None
) -> float:
  """Predicted all-reduce time in µs (:data:`DEFAULT_PARAMS` when ``params`` is None;
  a :class:`Params` or :class:`FittedParams` otherwise)."""
  return 1e6 * predict_seconds(algorithm, p, nbytes, params or DEFAULT_PARAMS, inner)


def lower_bound_seconds(p: int, n: float, params: Params) -> float:
  """max(⌈lg p⌉α, 2(p-1)/p·nβ) (Patarasuk & Yuan 2009)."""
  return max(_lg(p) * params.alpha, 2 * (p - 1) / p * n * params.beta)


# ----------------------------------------------------------------------------------------
# Fitted parameters, presets, two-level machines and the NCCL-style argmin.
# ----------------------------------------------------------------------------------------


def auto_candidates() -> tuple[str, ...]:
  """Algorithms :func:`choose` (and ``algorithm="auto"``) picks from: the registry
  records with ``auto=True`` (hand-written, single-axis, with a cost model)."""
  from allreduce_jax._api import ALGORITHMS

  return tuple(name for name, r in ALGORITHMS.items() if r.auto)


#: Where the command-line tools (``bench``, ``fusion``, ``scaling``) look for a fit
#: written by ``bench --fit``: the file named by this environment variable, else
#: :data:`DEFAULT_FIT_PATH` (relative to the working directory). The library never
#: reads them at trace time: ``algorithm="auto"`` uses :func:`current_params`.
FIT_ENV_VAR = "ALLREDUCE_JAX_COST_PARAMS"
DEFAULT_FIT_PATH = "results/cost_params.json"

#: Hardware presets, per link and direction. α for NVLink is NCCL's
#: default Simple-protocol ring hop latency on NVLink (3.4 µs, ``src/graph/tuning.cc``);
#: γ assumes a reduction at ~1 TB/s of HBM bandwidth on GPUs. Override any of them
#: with measured values (``--inner``/``--outer`` in ``allreduce-jax scaling``).
PRESETS: dict[str, Params] = {
  "nvlink4": Params.from_link(latency_us=3.4, bandwidth_GBps=450.0, reduce_GBps=1000.0),
  "ib_ndr": Params.from_link(latency_us=5.0, bandwidth_GBps=50.0, reduce_GBps=1000.0),
  "tpu_v5e_ici": Params.from_link(latency_us=1.0, bandwidth_GBps=45.0, reduce_GBps=1000.0),
  # Ethernet: IEEE 802.3ae (10 Gb/s) and 802.3ba (100 Gb/s) line rates, i.e. 1.25 and
  # 12.5 GB/s per direction; α is NCCL's per-hop network latency for the Simple-protocol
  # ring (9.6 µs, ``hwLat[NET]`` in ``src/graph/tuning.cc``). Kernel TCP is slower.
  "10gbe": Params.from_link(latency_us=9.6, bandwidth_GBps=1.25, reduce_GBps=1000.0),  # 10 Gbit/s
  "100gbe": Params.from_link(latency_us=9.6, bandwidth_GBps=12.5, reduce_GBps=1000.0),  # 100 Gbit/s
  "default": DEFAULT_PARAMS,
}


def parse_link(text: str, name: str = "--link") -> Params:
  """A link from the command line: a preset name (:data:`PRESETS`) or
  ``LATENCY_US,BANDWIDTH``, the bandwidth a rate with its unit (``5,400Gbit``,
  ``3.4,450GB/s``; a bare number is GB/s, as this format always read).

  Raises ``ValueError`` with a one-line message naming ``name``.

  Example:
    >>> p = parse_link("5,100Gbit")
    >>> round(p.alpha * 1e6, 3), round(1 / p.beta / 1e9, 3), parse_link("5,12.5") == p
    (5.0, 12.5, True)
  """
  if text in PRESETS:
    return PRESETS[text]
  try:
    lat_text, bw_text = text.split(",")
    lat = float(lat_text.strip().removesuffix("us").removesuffix("µs"))
    try:
      bw = float(bw_text)
    except ValueError:
      bw = units.parse_rate_GBps(bw_text, name)
    if not (math.isfinite(lat) and math.isfinite(bw)) or lat < 0 or bw <= 0:
      raise ValueError
  except ValueError:
    raise ValueError(
      f"{name} {text!r}: expected 'latency_us,bandwidth' (e.g. 5,400Gbit or 5,50GB/s;"
      f" a bare bandwidth is GB/s) or a preset ({', '.join(PRESETS)})."
    ) from None
  return Params.from_link(lat, bw, reduce_GBps=1000.0)


def params_to_dict(params: Params) -> dict[str, float]:
  """``{"alpha_us", "beta_ns_per_byte", "gamma_ns_per_byte", "bandwidth_GBps"}``."""
  return {
    "alpha_us": params.alpha * 1e6,
    "beta_ns_per_byte": params.beta * 1e9,
    "gamma_ns_per_byte": params.gamma * 1e9,
    "bandwidth_GBps": (1e-9 / params.beta) if params.beta > 0 else math.inf,
  }


def params_from_dict(d: dict[str, float]) -> Params:
  """Inverse of :func:`params_to_dict`."""
  return Params(d["alpha_us"] * 1e-6, d["beta_ns_per_byte"] * 1e-9, d["gamma_ns_per_byte"] * 1e-9)


@dataclass(frozen=True)
class FittedParams:
  """Parameters fitted on one platform: one shared set and, optionally, one per algorithm.

  NCCL keeps a latency and a bandwidth per (algorithm, protocol); likewise a
  per-algorithm fit absorbs implementation constants (extra copies, rendezvous
  cost) that one shared (α, β, γ) cannot.

  Attributes:
    shared: α, β, γ fitted on every algorithm's rows together.
    per_algorithm: algorithm -> its own α, β, γ.
    meta: where the fit came from (backend, device count, rows, errors...).
  """

  shared: Params
  per_algorithm: dict[str, Params]
  meta: dict

  def get(self, algorithm: str) -> Params:
    """The parameters to use for ``algorithm`` (its own fit if any, else shared)."""
    return self.per_algorithm.get(algorithm, self.shared)

  def to_json(self) -> dict:
    return {
      "shared": params_to_dict(self.shared),
      "per_algorithm": {a: params_to_dict(q) for a, q in self.per_algorithm.items()},
      "meta": self.meta,
    }

  @classmethod
  def from_json(cls, d: dict) -> FittedParams:
    return cls(
      params_from_dict(d["shared"]),
      {a: params_from_dict(q) for a, q in d.get("per_algorithm", {}).items()},
      d.get("meta", {}),
    )


AnyParams = Params | FittedParams


def resolve(params: AnyParams | None, algorithm: str) -> Params:
  """A plain :class:`Params` for ``algorithm`` from any parameter object (None: defaults)."""
  if params is None:
    return DEFAULT_PARAMS
  if isinstance(params, FittedParams):
    return params.get(algorithm)
  return params


def save_params(fitted: FittedParams, path) -> None:
  """Writes ``fitted`` as JSON (directories are created)."""
  import json
  from pathlib import Path

  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(fitted.to_json(), indent=2, sort_keys=True) + "\n")


def load_params(path) -> FittedParams:
  """Reads a file written by :func:`save_params`."""
  import json
  from pathlib import Path

  return FittedParams.from_json(json.loads(Path(path).read_text()))


def default_fit_path():
  """The fit file the command-line tools read and ``bench --fit`` writes:
  ``$ALLREDUCE_JAX_COST_PARAMS`` or ``results/cost_params.json``."""
  import os
  from pathlib import Path

  return Path(os.environ.get(FIT_ENV_VAR) or DEFAULT_FIT_PATH)


def load_default_params() -> AnyParams:
  """For the command-line tools: the fit in :func:`default_fit_path` if that file
  exists and parses, else the running backend's shipped defaults
  (:func:`backend_params`). The library itself never calls this at trace time."""
  path = default_fit_path()
  if not Path(path).exists():
    return backend_params()
  try:
    return load_params(path)
  except (OSError, ValueError, KeyError, TypeError) as e:
    import warnings

    warnings.warn(
      f"cost parameters in {path} could not be read ({e}); auto uses the defaults.", stacklevel=2
    )
    return backend_params()


def backend_params(backend: str | None = None) -> AnyParams:
  """The parameters shipped for ``backend`` (default: ``jax.default_backend()``).

  - ``"cpu"``: fitted on XLA:CPU with 8 emulated devices on a 2-core machine by
    ``allreduce-jax bench --fit`` (the rows are ``docs/results/reuse/cpu_fit_bench.jsonl``,
    the fit is stored in ``allreduce_jax/_cpu_params.py``); it prices only the
    algorithms it measured, so ``auto`` chooses among those.
  - anything else: :data:`DEFAULT_PARAMS`, a documented guess (an NVLink-class link),
    not a measurement; fit your machine with ``bench --fit`` and pass the result with
    :func:`use_params`.
  """
  if backend is None:
    import jax

    backend = jax.default_backend()
  if backend == "cpu":
    from allreduce_jax._cpu_params import CPU_FIT

    return FittedParams.from_json(CPU_FIT)
  return DEFAULT_PARAMS


@contextlib.contextmanager
def _pushed(stack: contextvars.ContextVar[tuple], value):
  """Pushes ``value`` on the context-local ``stack`` for the block; the innermost wins."""
  token = stack.set((*stack.get(), value))
  try:
    yield
  finally:
    stack.reset(token)


_active_params: contextvars.ContextVar[tuple[AnyParams, ...]] = contextvars.ContextVar(
  "allreduce_jax_cost_params", default=()
)


@contextlib.contextmanager
def use_params(params: AnyParams):
  """Within this block, ``algorithm="auto"`` (and :func:`current_params`) uses ``params``.

  The choice is made at trace time, so the block must enclose the tracing
  (the first call of a ``jax.jit`` function, or ``.lower(...)``).

  Example:
    >>> with use_params(Params(100e-6, 1e-12, 0.0)):  # latency-bound machine
    ...   choose(8, 1024, current_params())
    'recursive_doubling'
  """
  if not isinstance(params, (Params, FittedParams)):
    raise TypeError(
      f"use_params expects cost_model.Params or FittedParams, got {type(params).__name__}"
      " (load a fit file with cost_model.load_params(path))."
    )
  with _pushed(_active_params, params):
    yield params


_active_topology: contextvars.ContextVar[tuple] = contextvars.ContextVar(
  "allreduce_jax_topology", default=()
)


@contextlib.contextmanager
def use_topology(topology):
  """Within this block, ``algorithm="auto"`` prices its candidates by replaying their
  message steps on ``topology`` (a network of :mod:`allreduce_jax.topology`, e.g.
  ``torus((16, 16, 16))`` or ``fat_tree(8, 7)``) instead of the flat α-β formula.

  Like :func:`use_params`, the block must enclose the tracing.

  Example:
    >>> from allreduce_jax import topology
    >>> with use_topology(topology.torus((64,))), use_params(Params(1e-6, 1e-9, 0.0)):
    ...   choose(64, 64 << 20, current_params(), ("halving_doubling", "swing"),
    ...          topology=current_topology())
    'swing'
  """
  with _pushed(_active_topology, topology):
    yield topology


def current_topology():
  """The innermost :func:`use_topology` block's network, or None (the flat model)."""
  stack = _active_topology.get()
  return stack[-1] if stack else None


def current_params(backend: str | None = None) -> AnyParams:
  """What ``algorithm="auto"`` uses now: the innermost :func:`use_params` block's
  parameters, else :func:`backend_params` for the running backend."""
  stack = _active_params.get()
  return stack[-1] if stack else backend_params(backend)


def describe_params(params: AnyParams | None) -> str:
  """One line saying which parameters these are (for tables and logs)."""
  if params is None:
    return "none"
  if isinstance(params, FittedParams):
    meta = params.meta
    origin = meta.get("source", "a fit")
    algs = ",".join(sorted(fitted_algorithms(params) or ())) or "shared only"
    devices = meta.get("n_devices")
    return f"{origin} ({meta.get('backend', '?')}, {devices} devices; fitted: {algs})"
  d = params_to_dict(params)
  named = next((k for k, q in PRESETS.items() if q == params), None)
  label = f"preset {named!r}" if named else "explicit Params"
  return f"{label} (α = {d['alpha_us']:.2f} µs, β = {d['beta_ns_per_byte']:.4f} ns/B)"


def fitted_algorithms(params: AnyParams | None) -> frozenset[str] | None:
  """The algorithms a fit measured (its per-algorithm entries and
  ``meta["algorithms"]``); None for plain :class:`Params` or a fit that names none
  (then every candidate is priced with the shared parameters)."""
  if not isinstance(params, FittedParams):
    return None
  measured = set(params.per_algorithm) | set(params.meta.get("algorithms", ()))
  return frozenset(measured) or None


def _features(algorithm: str, p: int, n: float, inner: int | None = None) -> list[float]:
  s = schedule(algorithm, p, n, inner)
  return [float(s.steps), float(s.beta_bytes), float(s.gamma_bytes)]


def gamma_identifiable(rows) -> bool:
  """Whether rows ``(algorithm, p, n_bytes, seconds)`` can tell γ from β.

  γ (per byte reduced) is identifiable only if the rows' ``gamma_bytes`` are not a
  fixed multiple of their ``beta_bytes`` (plus steps): for one algorithm at one p
  they always are (the ring sends 2(p-1)/p·n and reduces (p-1)/p·n, ratio 2:1), so a
  per-algorithm fit at fixed p can only give β + γ/2 together. Mixing algorithms
  with different byte ratios (the shared fit) or several p separates them.

  Example:
    >>> gamma_identifiable([("ring", 8, n, 1.0) for n in (1e3, 1e6)])
    False
    >>> gamma_identifiable([(a, 8, n, 1.0) for a in ("ring", "recursive_doubling") for n in (1e3, 1e6)])
    True
  """
  import numpy as np

  a = np.array([_features(alg, p, n) for alg, p, n, _ in rows], dtype=np.float64)
  if len(a) < 3:
    return False
  a = a / np.maximum(np.max(np.abs(a), axis=0), 1e-300)
  return bool(np.linalg.matrix_rank(a, tol=1e-9) == 3)


def fit(rows, relative: bool = True) -> Params:
  r"""Least-squares fit of α, β, γ to measured times.

  Each row gives ``(algorithm, p, n_bytes, seconds)``; the model is linear in the
  parameters, :math:`t = α·\mathrm{steps} + β·\mathrm{beta\_bytes} + γ·\mathrm{gamma\_bytes}`
  with the counts from :func:`schedule`. With ``relative=True`` each equation is
  divided by its measured time, so a 4 KiB and a 64 MiB row weigh the same (times
  span orders of magnitude). Parameters are constrained to be non-negative.

  Args:
    rows: iterable of ``(algorithm, p, n_bytes, seconds)``.
    relative: minimize relative rather than absolute squared error.

  Returns:
    The fitted :class:`Params`. Where γ is not identifiable from ``rows``
    (:func:`gamma_identifiable`), γ is 0 and β absorbs the reduction cost.

  Example:
    >>> true = Params(10e-6, 1e-9, 0.5e-9)
    >>> rows = [(a, 8, n, predict_seconds(a, 8, n, true))
    ...         for a in ("ring", "recursive_doubling") for n in (1e3, 1e5, 1e7)]
    >>> q = fit(rows)
    >>> round(q.alpha * 1e6, 3), round(q.beta * 1e9, 3), round(q.gamma * 1e9, 3)
    (10.0, 1.0, 0.5)
  """
  import numpy as np

  rows = list(rows)
  if not rows:
    raise ValueError("fit needs at least one measured row.")
  a = np.array([_features(alg, p, n) for alg, p, n, _ in rows], dtype=np.float64)
  t = np.array([sec for *_, sec in rows], dtype=np.float64)
  if np.any(t <= 0):
    raise ValueError("fit: measured times must be positive.")
  w = 1.0 / t if relative else np.ones_like(t)
  from scipy.optimize import nnls

  cols = 3 if gamma_identifiable(rows) else 2  # else: no γ column, β absorbs it
  a = a[:, :cols]
  scale = np.maximum(np.max(np.abs(a), axis=0), 1e-300)  # condition the columns
  x, _ = nnls(a * w[:, None] / scale, t * w)
  x = np.append(x / scale, [0.0] * (3 - cols))
  return Params(float(x[0]), float(x[1]), float(x[2]))


def fit_all(rows, per_algorithm: bool = True, meta: dict | None = None) -> FittedParams:
  """One shared fit over the hand-written algorithms' rows plus (if ``per_algorithm``)
  one fit per algorithm (``psum`` too: modelled as a ring, its own fit gives XLA's
  effective α, β, γ; it is left out of the shared fit).

  ``meta["gamma_identified"]`` says, for ``"shared"`` and each algorithm, whether
  its γ could be told from β (:func:`gamma_identifiable`); where not, γ is 0 and
  should be shown as unknown, not as 0."""
  from allreduce_jax._api import ALGORITHMS

  rows = list(rows)
  ours = [r for r in rows if ALGORITHMS[r[0]].hand_written]  # XLA's is not our schedule
  shared = fit(ours or rows)
  identified = {"shared": gamma_identifiable(ours or rows)}
  per: dict[str, Params] = {}
  if per_algorithm:
    for alg in sorted({r[0] for r in rows}):
      mine = [r for r in rows if r[0] == alg]
      if len({r[2] for r in mine}) >= 2:
        per[alg] = fit(mine)
        identified[alg] = gamma_identifiable(mine)
  measured = sorted({r[0] for r in rows})  # choose() never picks an algorithm outside it
  return FittedParams(
    shared, per, {**(meta or {}), "gamma_identified": identified, "algorithms": measured}
  )


def choose(
  p: int,
  nbytes: float,
  params: AnyParams | None = None,
  candidates: tuple[str, ...] | None = None,
  topology=None,
) -> str:
  """NCCL-style selection: the candidate with the smallest predicted time.

  With ``topology`` (a network of :mod:`allreduce_jax.topology`: ``torus((16, 16, 16))``,
  ``fat_tree(8, 7)``...) each candidate that has a message generator is priced by
  replaying its steps on that network instead of the flat formula.

  :math:`\\arg\\min_a\\, α_a·\\mathrm{steps}_a(p) + β_a·\\mathrm{bytes}_a(p, n) + γ_a·\\mathrm{reduced}_a(p, n)`.
  Ties go to the earlier candidate (ring first). With a :class:`FittedParams` that
  names the algorithms it measured (:func:`fitted_algorithms`), only those are
  candidates: an unmeasured algorithm would be priced by a model that may not hold
  on this backend (issue 10: a fit without ``bidirectional_ring`` chose it, 2.3×
  slower than the ring).

  Example:
    >>> choose(8, 1024, Params(100e-6, 1e-9, 0.0))  # latency-bound: fewest steps
    'recursive_doubling'
    >>> choose(8, 64 << 20, Params(1e-6, 1e-9, 1e-9),  # bandwidth-bound
    ...        candidates=("ring", "bidirectional_ring", "tree", "recursive_doubling"))
    'bidirectional_ring'
  """
  candidates = auto_candidates() if candidates is None else tuple(candidates)
  if not candidates:
    raise ValueError("choose needs at least one candidate algorithm.")
  measured = fitted_algorithms(params)
  if measured is not None:  # a fit prices only what it measured
    kept = tuple(a for a in candidates if a in measured)
    if not kept:
      raise ValueError(
        f"the fit in use measured {sorted(measured)}, none of the candidates"
        f" {list(candidates)}; measure them (bench --fit --algorithms ...) or pass"
        " plain cost_model.Params."
      )
    candidates = kept
  if topology is not None:
    from allreduce_jax import topology as replay  # lazy: it imports this module

    candidates = tuple(a for a in candidates if a in replay.candidates(candidates))
    if not candidates:
      raise ValueError("choose: no candidate has a message generator to replay.")
    times = [replay.predict_seconds(a, p, nbytes, params, topology) for a in candidates]
  else:
    times = [predict_seconds(a, p, nbytes, resolve(params, a)) for a in candidates]
  return candidates[min(range(len(candidates)), key=times.__getitem__)]


def balance_bytes(algorithm: str, p: int, params: AnyParams | None = None) -> float:
  """The size n* (bytes per participant) at which ``algorithm``'s latency term
  α·steps equals its per-byte terms β·beta_bytes + γ·gamma_bytes.

  Below n* the all-reduce is latency-bound (fewer steps win), above it
  bandwidth-bound (fewer bytes win). For the ring, 2(p-1)α = 2(p-1)/p·n·β gives
  n* = p·α/β (with γ = 0): it grows with p. ``inf`` when the per-byte terms are 0.

  Example:
    >>> balance_bytes("ring", 8, Params(5e-6, 1e-9, 0.0))  # 8 · 5 µs / (1 ns/B)
    40000.0
  """
  q = resolve(params, algorithm)
  s = schedule(algorithm, p, 1.0)  # steps are size-independent, bytes linear in n
  per_byte = q.beta * s.beta_bytes + q.gamma * s.gamma_bytes
  return math.inf if per_byte <= 0 else q.alpha * s.steps / per_byte


def switch_points(
  p: int,
  params: AnyParams | None,
  lo: float,
  hi: float,
  candidates: tuple[str, ...] | None = None,
  points: int = 200,
) -> list[tuple[float, str, str]]:
  """The sizes in ``[lo, hi]`` (bytes per participant) where :func:`choose`'s pick
  changes, as ``(n, before, after)``: the crossover sizes of the α-β model.

  A geometric grid of ``points`` sizes locates each change, then bisection (in
  log size) pins it to within 0.1%.

  Example:
    >>> [(round(n, -3), a, b) for n, a, b in switch_points(
    ...   8, Params(100e-6, 1e-9, 0.0), 1e3, 1e8, candidates=("ring", "recursive_doubling"))]
    [(880000.0, 'recursive_doubling', 'ring')]
  """
  if not 0 < lo < hi:
    raise ValueError(f"switch_points needs 0 < lo < hi, got lo={lo}, hi={hi}.")
  candidates = auto_candidates() if candidates is None else tuple(candidates)
  grid = [lo * (hi / lo) ** (k / (points - 1)) for k in range(points)]
  out = []
  prev_n, prev = grid[0], choose(p, grid[0], params, candidates)
  for n in grid[1:]:
    best = choose(p, n, params, candidates)
    if best != prev:
      a, b = prev_n, n
      while b / a > 1.001:
        mid = math.sqrt(a * b)
        if choose(p, mid, params, candidates) == prev:
          a = mid
        else:
          b = mid
      out.append((math.sqrt(a * b), prev, best))
    prev_n, prev = n, best
  return out


@dataclass(frozen=True)
class TwoLevel:
  """A machine of nodes with ``per_node`` devices: fast links inside a node
  (``inner``, e.g. NVLink) and slow links between nodes (``outer``, e.g. one
  InfiniBand NIC per device: ``nics_per_node``)."""

  inner: Params
  outer: Params
  per_node: int = 8
  nics_per_node: int = 8


def predict_two_level_seconds(algorithm: str, p: int, n: float, machine: TwoLevel) -> float:
  r"""Predicted time of ``algorithm`` on ``p`` devices of a two-level machine.

  With a = ``per_node`` devices per node, b = p/a nodes, level 1 = inside a node,
  level 2 = between nodes (each device has its own NIC when ``nics_per_node = a``):

  - ``hierarchical``: ring reduce-scatter and all-gather inside the node, the 1/a
    shard all-reduced by a ring across nodes (every device on its own NIC):
    :math:`2(a-1)α_1 + 2rac{a-1}{a}nβ_1 + rac{a-1}{a}nγ + T_{ring}(b, n/a; α_2, β_2, γ)`.
  - ``ring`` (NCCL's flat ring, ``src/graph/tuning.cc``): of its 2(p-1) steps,
    2(b-1) cross a node boundary (α₂), the rest are NVLink hops (α₁); several rings
    (channels) spread the bytes over every NIC, so each link carries
    :math:`2rac{p-1}{p}n` at the slower of β₁ and β₂/NICs.
  - ``halving_doubling`` / ``recursive_doubling`` / ``tree``: XOR/binomial partners
    at distance ≥ a are in another node: those lg b steps pay α₂ and β₂ (each device
    through its own NIC), the lg a steps at distance < a pay α₁, β₁.

  Within one node (p ≤ a) every algorithm runs on the inner parameters.
  """
  a = machine.per_node
  if p <= a:
    return predict_seconds(
      "ring" if algorithm == "hierarchical" else algorithm, p, n, machine.inner
    )
  if p % a:
    raise ValueError(f"p={p} must be a multiple of per_node={a} on a two-level machine.")
  b = p // a
  i, o = machine.inner, machine.outer
  gamma = max(i.gamma, o.gamma)
  if algorithm == "hierarchical":
    t_in = 2 * (a - 1) * i.alpha + 2 * (a - 1) / a * n * i.beta + (a - 1) / a * n * gamma
    return t_in + predict_seconds("ring", b, n / a, o)
  if algorithm == "ring":
    inter = 2 * (b - 1)
    beta = max(i.beta, o.beta / max(1, machine.nics_per_node))
    return (
      (2 * (p - 1) - inter) * i.alpha
      + inter * o.alpha
      + 2 * (p - 1) / p * n * beta
      + (p - 1) / p * n * gamma
    )
  la, lb = _lg(a), _lg(b)
  if algorithm == "halving_doubling":  # masks ≥ a carry n(1 - a/p) in total, < a: n(a-1)/p
    return (
      2 * (la * i.alpha + lb * o.alpha)
      + 2 * (n * (1 - a / p) * o.beta + n * (a - 1) / p * i.beta)
      + (p - 1) / p * n * gamma
    )
  if algorithm == "recursive_doubling":
    return (la * i.alpha + lb * o.alpha) + n * (la * i.beta + lb * o.beta) + n * (la + lb) * gamma
  if algorithm == "tree":
    return 2 * (la * (i.alpha + n * i.beta) + lb * (o.alpha + n * o.beta)) + (la + lb) * n * gamma
  raise ValueError(f"algorithm={algorithm!r} has no two-level model.")
