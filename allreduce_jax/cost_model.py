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
import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from allreduce_jax import replay
from allreduce_jax._cpu_params import CPU_FIT

# The machine parameters live a floor below (networks carry them too); re-exported here.
from allreduce_jax._machine import (
  DEFAULT_PARAMS,
  PRESETS,
  AnyParams,
  FittedParams,
  Params,
  params_to_dict,
  resolve,
)
from allreduce_jax._machine import params_from_dict as params_from_dict
from allreduce_jax._machine import parse_link as parse_link
from allreduce_jax.registry import ALGORITHMS, names


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
  return names(auto=True)


#: Where the command-line tools (``bench``, ``fusion``, ``scaling``) look for a fit
#: written by ``bench --fit``: the file named by this environment variable, else
#: :data:`DEFAULT_FIT_PATH` (relative to the working directory). The library never
#: reads them at trace time: ``algorithm="auto"`` uses :func:`current_params`.
FIT_ENV_VAR = "ALLREDUCE_JAX_COST_PARAMS"
DEFAULT_FIT_PATH = "results/cost_params.json"


def save_params(fitted: FittedParams, path) -> None:
  """Writes ``fitted`` as JSON (directories are created)."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(fitted.to_json(), indent=2, sort_keys=True) + "\n")


def load_params(path) -> FittedParams:
  """Reads a file written by :func:`save_params`."""
  return FittedParams.from_json(json.loads(Path(path).read_text()))


def default_fit_path():
  """The fit file the command-line tools read and ``bench --fit`` writes:
  ``$ALLREDUCE_JAX_COST_PARAMS`` or ``results/cost_params.json``."""
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
    warnings.warn(
      f"cost parameters in {path} could not be read ({e}); auto uses the defaults.", stacklevel=2
    )
    return backend_params()


def backend_params(backend: str | None = None) -> AnyParams:
  """The parameters shipped for ``backend`` (default: ``jax.default_backend()``).

  - ``"cpu"``: fitted on XLA:CPU with 8 emulated devices in one process by
    ``allreduce-jax bench --fit`` (the rows are
    ``experiments/latency_vs_bandwidth/rows/cpu_fit_bench.jsonl``,
    the fit is stored in ``allreduce_jax/_cpu_params.py``); it prices only the
    algorithms it measured, so ``auto`` chooses among those.
  - anything else: :data:`DEFAULT_PARAMS`, a documented guess (an NVLink-class link),
    not a measurement; fit your machine with ``bench --fit`` and pass the result with
    :func:`use_params`.
  """
  if backend is None:
    backend = jax.default_backend()
  if backend == "cpu":
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
def use_topology(topology, *, duplex: str = "full"):
  """Within this block, ``algorithm="auto"`` prices its candidates by replaying their
  message steps on ``topology`` (a network of :mod:`allreduce_jax.topology`, e.g.
  ``torus((16, 16, 16))`` or ``fat_tree(8, 7)``) instead of the flat α-β formula.
  A network with slower host links (:func:`allreduce_jax.topology.with_link_rates`) is
  how ``auto`` is told the links' rates. ``duplex``: how the collectives run, as
  :func:`allreduce_jax.gloo_model.predict_seconds` takes it: ``"full"`` (the replay's
  own assumption) or ``"half"`` (XLA:CPU over gloo: one ppermute at a time, an
  exchange's two directions in turn).

  Like :func:`use_params`, the block must enclose the tracing.

  Example:
    >>> from allreduce_jax import topology
    >>> with use_topology(topology.torus((64,))), use_params(Params(1e-6, 1e-9, 0.0)):
    ...   choose(64, 64 << 20, current_params(), ("halving_doubling", "swing"),
    ...          topology=current_topology())
    'swing'
  """
  replay.check_duplex(duplex)
  with _pushed(_active_topology, (topology, duplex)):
    yield topology


def current_topology():
  """The innermost :func:`use_topology` block's network, or None (the flat model)."""
  stack = _active_topology.get()
  return stack[-1][0] if stack else None


def current_duplex() -> str:
  """The innermost :func:`use_topology` block's ``duplex`` (``"full"`` outside every block)."""
  stack = _active_topology.get()
  return stack[-1][1] if stack else "full"


def pinned_params() -> AnyParams | None:
  """The innermost :func:`use_params` block's parameters, or None outside every block."""
  stack = _active_params.get()
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
  rows = list(rows)
  if not rows:
    raise ValueError("fit needs at least one measured row.")
  a = np.array([_features(alg, p, n) for alg, p, n, _ in rows], dtype=np.float64)
  t = np.array([sec for *_, sec in rows], dtype=np.float64)
  if np.any(t <= 0):
    raise ValueError("fit: measured times must be positive.")
  w = 1.0 / t if relative else np.ones_like(t)
  from scipy.optimize import nnls  # here: scipy.optimize takes longer to import than the
  # whole package, and only a fit needs it

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
  price=None,
) -> str:
  """NCCL-style selection: the candidate with the smallest predicted time.

  With ``topology`` (a network of :mod:`allreduce_jax.topology`: ``torus((16, 16, 16))``,
  ``fat_tree(8, 7)``, a switch with one slow host link from
  :func:`~allreduce_jax.topology.with_link_rates`...) each candidate that has a message
  generator is priced by replaying its steps on that network instead of the flat
  formula: ``price(algorithm, p, nbytes, params, topology) -> seconds``, by default
  :func:`allreduce_jax.replay.predict_seconds` (every link full duplex);
  :func:`allreduce_jax.gloo_model.choose` passes the replay of XLA:CPU over gloo.

  :math:`\\arg\\min_a\\, α_a·\\mathrm{steps}_a(p) + β_a·\\mathrm{bytes}_a(p, n) + γ_a·\\mathrm{reduced}_a(p, n)`.
  Ties go to the earlier candidate (ring first). With a :class:`FittedParams` that
  names the algorithms it measured (:func:`fitted_algorithms`), only those are
  candidates: an unmeasured algorithm would be priced by a model that may not hold
  on this backend (a CPU fit without ``bidirectional_ring`` chose it where it ran 2.3×
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
    candidates = tuple(
      a for a in candidates if a in ALGORITHMS and ALGORITHMS[a].messages is not None
    )
    if not candidates:
      raise ValueError("choose: no candidate has a message generator to replay.")
    price = price or replay.predict_seconds
    times = [price(a, p, nbytes, params, topology) for a in candidates]
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
  """Predicted time of ``algorithm`` on ``p`` devices of a two-level machine: the
  ``two_level`` field of its registry record (the formulas are the ``*_two_level``
  functions below).

  With a = ``per_node`` devices per node, b = p/a nodes, level 1 = inside a node,
  level 2 = between nodes (each device has its own NIC when ``nics_per_node = a``).
  Within one node (p ≤ a) every algorithm runs on the inner parameters; across nodes
  an algorithm without a two-level model is a ``ValueError``.
  """
  a = machine.per_node
  if p > a and p % a:
    raise ValueError(f"p={p} must be a multiple of per_node={a} on a two-level machine.")
  record = ALGORITHMS.get(algorithm)
  if record is not None and record.two_level is not None:
    return record.two_level(p, n, machine)
  if p <= a:
    return predict_seconds(algorithm, p, n, machine.inner)
  raise ValueError(f"algorithm={algorithm!r} has no two-level model.")


def _levels(p: int, machine: TwoLevel) -> tuple[int, int, Params, Params, float]:
  """(a, b, inner, outer, γ): a devices per node, b nodes, the slower γ of the two."""
  i, o = machine.inner, machine.outer
  return machine.per_node, p // machine.per_node, i, o, max(i.gamma, o.gamma)


def hierarchical_two_level(p: int, n: float, machine: TwoLevel) -> float:
  r"""Ring reduce-scatter and all-gather inside the node, the 1/a shard all-reduced by
  a ring across nodes (every device on its own NIC):
  :math:`2(a-1)α_1 + 2\frac{a-1}{a}nβ_1 + \frac{a-1}{a}nγ + T_{ring}(b, n/a; α_2, β_2, γ)`;
  within one node, the ring."""
  if p <= machine.per_node:
    return predict_seconds("ring", p, n, machine.inner)
  a, b, i, o, gamma = _levels(p, machine)
  t_in = 2 * (a - 1) * i.alpha + 2 * (a - 1) / a * n * i.beta + (a - 1) / a * n * gamma
  return t_in + predict_seconds("ring", b, n / a, o)


def ring_two_level(p: int, n: float, machine: TwoLevel) -> float:
  r"""NCCL's flat ring (``src/graph/tuning.cc``): of its 2(p-1) steps, 2(b-1) cross a
  node boundary (α₂), the rest are NVLink hops (α₁); several rings (channels) spread
  the bytes over every NIC, so each link carries :math:`2\frac{p-1}{p}n` at the slower
  of β₁ and β₂/NICs."""
  if p <= machine.per_node:
    return predict_seconds("ring", p, n, machine.inner)
  _, b, i, o, gamma = _levels(p, machine)
  inter = 2 * (b - 1)
  beta = max(i.beta, o.beta / max(1, machine.nics_per_node))
  return (
    (2 * (p - 1) - inter) * i.alpha
    + inter * o.alpha
    + 2 * (p - 1) / p * n * beta
    + (p - 1) / p * n * gamma
  )


def halving_doubling_two_level(p: int, n: float, machine: TwoLevel) -> float:
  """XOR partners at distance ≥ a are in another node: those lg b steps pay α₂ and β₂
  (each device through its own NIC), the lg a steps at distance < a pay α₁, β₁; the
  masks ≥ a carry n(1 - a/p) in total, those < a n(a-1)/p."""
  if p <= machine.per_node:
    return predict_seconds("halving_doubling", p, n, machine.inner)
  a, b, i, o, gamma = _levels(p, machine)
  la, lb = _lg(a), _lg(b)
  return (
    2 * (la * i.alpha + lb * o.alpha)
    + 2 * (n * (1 - a / p) * o.beta + n * (a - 1) / p * i.beta)
    + (p - 1) / p * n * gamma
  )


def recursive_doubling_two_level(p: int, n: float, machine: TwoLevel) -> float:
  """lg a full-buffer exchanges inside the node (α₁, β₁), lg b across (α₂, β₂)."""
  if p <= machine.per_node:
    return predict_seconds("recursive_doubling", p, n, machine.inner)
  a, b, i, o, gamma = _levels(p, machine)
  la, lb = _lg(a), _lg(b)
  return (la * i.alpha + lb * o.alpha) + n * (la * i.beta + lb * o.beta) + n * (la + lb) * gamma


def tree_two_level(p: int, n: float, machine: TwoLevel) -> float:
  """Binomial reduce and broadcast: the lg a levels inside the node pay α₁, β₁, the lg b
  across nodes α₂, β₂, full buffers each way."""
  if p <= machine.per_node:
    return predict_seconds("tree", p, n, machine.inner)
  a, b, i, o, gamma = _levels(p, machine)
  la, lb = _lg(a), _lg(b)
  return 2 * (la * (i.alpha + n * i.beta) + lb * (o.alpha + n * o.beta)) + (la + lb) * n * gamma
