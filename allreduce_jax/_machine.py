"""Machine parameters of the α-β-γ model: :class:`Params`, :class:`FittedParams`, presets.

The bottom floor under :mod:`allreduce_jax.cost_model` (which re-exports every name
here) and :mod:`allreduce_jax.networks` (whose networks carry these parameters): it
imports no other module of the package but :mod:`allreduce_jax.units`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from allreduce_jax import units


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
  ``LATENCY_US,RATE``, the rate with its unit as :func:`units.parse_rate` reads every
  rate (``5,400Gbit``, ``3.4,450GB/s``); a bare number is refused, as everywhere.

  Raises ``ValueError`` with a one-line message naming ``name``.

  Example:
    >>> p = parse_link("5,100Gbit")
    >>> round(p.alpha * 1e6, 3), round(1 / p.beta / 1e9, 3), parse_link("5,12.5GB/s") == p
    (5.0, 12.5, True)
  """
  if text in PRESETS:
    return PRESETS[text]
  expected = (
    f"expected 'latency_us,rate' with the rate's unit (e.g. 5,400Gbit or 5,50GB/s)"
    f" or a preset ({', '.join(PRESETS)})"
  )
  try:
    lat_text, bw_text = text.split(",")
    lat = float(lat_text.strip().removesuffix("us").removesuffix("µs"))
    if not math.isfinite(lat) or lat < 0:
      raise ValueError
  except ValueError:
    raise ValueError(f"{name} {text!r}: {expected}.") from None
  try:
    bw = units.parse_rate_GBps(bw_text, name)
  except ValueError:
    bare = bw_text.strip().replace(".", "", 1).isdigit()
    why = "has no unit" if bare else "is not a rate"
    raise ValueError(f"{name} {text!r}: {bw_text.strip()!r} {why}; {expected}.") from None
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
