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

import math
from dataclasses import dataclass


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
  def from_link(cls, latency_us: float, bandwidth_gbps: float, reduce_gbps: float = math.inf):
    """From a per-step latency (µs) and a link bandwidth (GB/s, 1e9 bytes/s)."""
    gamma = 0.0 if math.isinf(reduce_gbps) else 1.0 / (reduce_gbps * 1e9)
    return cls(latency_us * 1e-6, 1.0 / (bandwidth_gbps * 1e9), gamma)


#: Documented defaults (used until a fit exists): roughly a NVLink-class GPU link.
DEFAULT_PARAMS = Params.from_link(latency_us=5.0, bandwidth_gbps=100.0, reduce_gbps=1000.0)


def _lg(p: int) -> int:
  return (p - 1).bit_length()  # ⌈lg p⌉


def _pof2(p: int) -> int:
  return 1 << (p.bit_length() - 1)


def _ring(p: int, n: float, directions: int = 1) -> Schedule:
  share = (p - 1) / p * n
  return Schedule(2 * (p - 1), 2 * share / directions, share, 2 * (p - 1) * directions, 2 * share)


def schedule(algorithm: str, p: int, n: float, inner: int | None = None) -> Schedule:
  """The closed-form schedule of ``algorithm`` on ``p`` participants, ``n`` bytes each.

  Args:
    algorithm: a key of ``ALGORITHMS`` (``psum`` is modelled as a ring, which is
      what XLA:CPU and NCCL use for large buffers).
    p: participant count.
    n: bytes per participant.
    inner: for ``hierarchical``, the size a of the inner (fast) level; p = a·b.

  Returns:
    A :class:`Schedule`.

  Example:
    >>> s = schedule("ring", 8, 1024)
    >>> s.steps, s.beta_bytes, s.max_sent_bytes
    (14, 1792.0, 1792.0)
  """
  if p < 1:
    raise ValueError(f"p must be at least 1, got {p}.")
  if p == 1:
    return Schedule(0, 0.0, 0.0, 0, 0.0)
  if algorithm in ("ring", "psum"):
    return _ring(p, n)
  if algorithm == "bidirectional_ring":
    return _ring(p, n, directions=2)
  pof2 = _pof2(p)
  L, fold = pof2.bit_length() - 1, int(p != pof2)
  if algorithm == "recursive_doubling":
    return Schedule(L + 2 * fold, n * (L + 2 * fold), n * (L + fold), L + 2 * fold, n * (L + fold))
  if algorithm == "halving_doubling":
    share = (pof2 - 1) / pof2 * n
    return Schedule(
      2 * L + 2 * fold,
      2 * share + 2 * fold * n,
      share + fold * n,
      2 * L + 2 * fold,
      2 * share + fold * n,
    )
  if algorithm == "tree":
    d = _lg(p)
    return Schedule(2 * d, 2 * d * n, d * n, 2 * d, d * n)
  if algorithm == "naive":
    return Schedule(2 * (p - 1), 2 * (p - 1) * n, (p - 1) * n, 2 * (p - 1), (p - 1) * n)
  if algorithm == "hierarchical":
    if inner is None or inner < 1 or p % inner:
      raise ValueError(f"hierarchical needs inner dividing p={p}; got inner={inner}.")
    a, b = inner, p // inner
    rs = Schedule(a - 1, (a - 1) / a * n, (a - 1) / a * n, a - 1, (a - 1) / a * n)
    outer = _ring(b, n / a) if b > 1 else Schedule(0, 0.0, 0.0, 0, 0.0)
    return Schedule(
      2 * rs.steps + outer.steps,
      2 * rs.beta_bytes + outer.beta_bytes,
      rs.gamma_bytes + outer.gamma_bytes,
      2 * rs.permutes + outer.permutes,
      2 * rs.max_sent_bytes + outer.max_sent_bytes,
    )
  raise ValueError(f"algorithm={algorithm!r} has no cost model.")


def predict_seconds(
  algorithm: str, p: int, n: float, params: Params = DEFAULT_PARAMS, inner: int | None = None
) -> float:
  """α·steps + β·bytes + γ·reduced bytes, in seconds."""
  s = schedule(algorithm, p, n, inner)
  return params.alpha * s.steps + params.beta * s.beta_bytes + params.gamma * s.gamma_bytes


def predict_us(
  algorithm: str, p: int, nbytes: float, params: Params | None = None, inner: int | None = None
) -> float:
  """Predicted all-reduce time in µs (default parameters when ``params`` is None)."""
  return 1e6 * predict_seconds(algorithm, p, nbytes, params or DEFAULT_PARAMS, inner)


def lower_bound_seconds(p: int, n: float, params: Params) -> float:
  """max(⌈lg p⌉α, 2(p-1)/p·nβ) (Patarasuk & Yuan 2009)."""
  return max(_lg(p) * params.alpha, 2 * (p - 1) / p * n * params.beta)
