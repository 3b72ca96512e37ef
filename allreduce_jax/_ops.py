"""Reduction operators: how two partial results combine, and how the total is finished.

Each custom algorithm only ever calls ``op.combine(a, b)`` on pairs of blocks and
``op.finalize(total, p)`` once at the end, so an operator is fully described by
those two functions, plus the XLA collective of the same name and :func:`oracle`,
the NumPy statement of what the result must be.

Special values (the semantics, defined here once):

* ``sum``/``mean``: IEEE arithmetic. NaN anywhere gives NaN; ``+inf`` with ``-inf``
  gives NaN; an infinity with finite values stays that infinity. The sign of a zero
  total is not specified (XLA's reductions start from ``+0.0``).
* ``max``/``min``: IEEE 754-2019 ``maximum``/``minimum``, as ``numpy.maximum.reduce``
  and ``jnp.max`` for NaN: **NaN propagates**, so the result is NaN wherever any
  participant holds NaN; ``±inf`` are ordinary values; ``-0.0 < +0.0``, so the max
  of ``{-0.0, +0.0}`` is ``+0.0`` and the min is ``-0.0`` whatever the order.

These make every result independent of the order in which partial results meet,
so all algorithms and all participants agree bit for bit. XLA's own collectives do
not all follow them: ``lax.pmax``/``pmin`` on XLA:CPU skip NaN (and give ``-inf``/
``+inf`` where every participant holds NaN, and may return either zero), and over
gloo across processes they can return a participant's value that is not the max.
``allreduce-jax verify`` checks both sides against :func:`oracle` and reports the
collective's disagreements as backend findings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

OPS: tuple[str, ...] = ("sum", "mean", "max", "min")


@dataclass(frozen=True)
class Op:
  """An all-reduce operator.

  Attributes:
    name: one of :data:`OPS`.
    combine: elementwise binary reduction of two partial results, following the
      special-value semantics of the module docstring (NaN propagates through
      ``max``/``min``, ``-0.0 < +0.0``).
    finalize: ``(total, p) -> result``; divides by ``p`` for ``mean``.
    reference: the XLA collective of the same name (``lax.psum`` ...). It is the
      backend's and need not follow these semantics for special values.
  """

  name: str
  combine: Callable[[jax.Array, jax.Array], jax.Array]
  finalize: Callable[[jax.Array, int], jax.Array]
  reference: Callable[..., jax.Array]


def _ieee(reduce, plus_zero_wins: bool):
  """IEEE 754-2019 ``maximum``/``minimum`` on top of ``lax.max``/``lax.min``, stated
  explicitly rather than left to the backend's rounding of NaN and signed zeros."""

  def combine(a: jax.Array, b: jax.Array) -> jax.Array:
    if not jnp.issubdtype(a.dtype, jnp.inexact):
      return reduce(a, b)
    # Equal values: only -0.0 == +0.0 can differ in bits; pick by the sign bit.
    tie = jnp.where(jnp.signbit(a) == plus_zero_wins, b, a)
    r = jnp.where(a == b, tie, reduce(a, b))
    return jnp.where(jnp.isnan(a) | jnp.isnan(b), a + b, r)  # a + b: NaN

  combine.__name__ = f"ieee_{reduce.__name__}"
  return combine


# max: +0.0 wins a tie with -0.0 (a = -0.0 yields to b); min: -0.0 wins (a = +0.0 yields).
_max = _ieee(lax.max, plus_zero_wins=True)
_min = _ieee(lax.min, plus_zero_wins=False)


def _identity(total: jax.Array, p: int) -> jax.Array:
  del p
  return total


def _divide(total: jax.Array, p: int) -> jax.Array:
  # Same expression as lax.pmean (psum, then divide by the axis size), so that an
  # exact sum gives a bit-identical mean.
  return total / p


_OP_TABLE = {
  "sum": Op("sum", lax.add, _identity, lax.psum),
  "mean": Op("mean", lax.add, _divide, lax.pmean),
  "max": Op("max", _max, _identity, lax.pmax),
  "min": Op("min", _min, _identity, lax.pmin),
}


#: The XLA collective that performs each combine as one all-reduce.
XLA_COLLECTIVE = {lax.add: lax.psum, _max: lax.pmax, _min: lax.pmin}


def get_op(op: str, dtype) -> Op:
  """Returns the :class:`Op` named ``op`` after checking it suits ``dtype``.

  Raises:
    ValueError: ``op`` is not one of :data:`OPS`.
    TypeError: ``dtype`` is not numeric, or ``op="mean"`` on an integer dtype,
      or ``max``/``min`` on a complex dtype.
  """
  if not isinstance(op, str):
    raise TypeError(f"op={op!r} must be a string, one of {OPS}.")
  if op not in _OP_TABLE:
    raise ValueError(f"op={op!r} is not supported; expected one of {OPS}.")
  dtype = jnp.dtype(dtype)
  if not (
    jnp.issubdtype(dtype, jnp.integer)
    or jnp.issubdtype(dtype, jnp.floating)
    or jnp.issubdtype(dtype, jnp.complexfloating)
  ):
    raise TypeError(
      f"x has dtype {dtype}, which all_reduce cannot reduce; expected a numeric"
      " dtype (float32, bfloat16, float16, float64, int32, ...)."
    )
  if op == "mean" and jnp.issubdtype(dtype, jnp.integer):
    raise TypeError(
      f"op='mean' is not defined for the integer dtype {dtype}: the average is"
      " not an integer. Use op='sum' and divide, or cast x to a float dtype."
    )
  if op in ("max", "min") and jnp.issubdtype(dtype, jnp.complexfloating):
    raise TypeError(f"op={op!r} is not defined for the complex dtype {dtype}.")
  return _OP_TABLE[op]


def oracle(op: str, x: np.ndarray) -> np.ndarray:
  """What ``all_reduce(x_i, op=op)`` must give, computed by NumPy from all inputs.

  Args:
    op: one of :data:`OPS`.
    x: ``T[p, ...]``, participant ``i``'s block in ``x[i]``.

  Returns:
    ``T[...]``: the reduction over axis 0 with the special-value semantics of the
    module docstring, in ``x.dtype``. Sums are accumulated exactly (float64, or
    int64 wrapped to the dtype as two's-complement hardware does), then rounded
    once: on inputs whose partial sums are exact (``verify``'s verifiable inputs)
    every correct algorithm matches it bit for bit.
  """
  x = np.asarray(x)
  dtype = x.dtype
  if np.issubdtype(dtype, np.integer):
    wide = x.astype(np.int64)
    total = {"sum": wide.sum, "max": wide.max, "min": wide.min}[op](axis=0)
    return np.asarray(total).astype(dtype)  # wraps like the device's int adds
  wide = x.astype(np.complex128 if np.issubdtype(dtype, np.complexfloating) else np.float64)
  if op in ("sum", "mean"):
    with np.errstate(invalid="ignore"):  # inf - inf = NaN, as intended
      total = wide.sum(axis=0)
    if op == "mean":
      total = total / x.shape[0]
    return np.asarray(total).astype(dtype)
  with np.errstate(invalid="ignore"):
    best = wide.max(axis=0) if op == "max" else wide.min(axis=0)  # NaN propagates
    zeros = wide == 0
    plus = np.any(zeros & ~np.signbit(wide), axis=0)
    minus = np.any(zeros & np.signbit(wide), axis=0)
  # A zero result takes the sign the order-free rule gives: max prefers +0.0, min -0.0.
  signed = np.where(plus, 0.0, -0.0) if op == "max" else np.where(minus, -0.0, 0.0)
  return np.asarray(np.where(best == 0, signed, best)).astype(dtype)
