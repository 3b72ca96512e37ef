"""Reduction operators: how two partial results combine, and how the total is finished.

Each custom algorithm only ever calls ``op.combine(a, b)`` on pairs of blocks and
``op.finalize(total, p)`` once at the end, so an operator is fully described by
those two functions plus the XLA collective that serves as its reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax

OPS: tuple[str, ...] = ("sum", "mean", "max", "min")


@dataclass(frozen=True)
class Op:
  """An all-reduce operator.

  Attributes:
    name: one of :data:`OPS`.
    combine: elementwise binary reduction of two partial results, with the NaN
      and Inf behaviour of XLA's all-reduce: ``sum`` propagates NaN (and
      inf - inf = NaN); ``max``/``min`` skip NaN like C's ``fmax``/``fmin``, which
      is what ``lax.pmax``/``pmin`` do on XLA:CPU (and NCCL's float max/min); a
      result is NaN only where every participant holds NaN.
    finalize: ``(total, p) -> result``; divides by ``p`` for ``mean``.
    reference: the XLA collective with the same meaning (``lax.psum`` ...).
  """

  name: str
  combine: Callable[[jax.Array, jax.Array], jax.Array]
  finalize: Callable[[jax.Array, int], jax.Array]
  reference: Callable[..., jax.Array]


def _nan_skipping(reduce):
  """``fmax``/``fmin``: NaN loses against a number (IEEE 754-2008 maxNum/minNum)."""

  def combine(a: jax.Array, b: jax.Array) -> jax.Array:
    if not jnp.issubdtype(a.dtype, jnp.inexact):
      return reduce(a, b)
    return jnp.where(jnp.isnan(a), b, jnp.where(jnp.isnan(b), a, reduce(a, b)))

  combine.__name__ = f"nan_skipping_{reduce.__name__}"
  return combine


_fmax = _nan_skipping(lax.max)
_fmin = _nan_skipping(lax.min)


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
  "max": Op("max", _fmax, _identity, lax.pmax),
  "min": Op("min", _fmin, _identity, lax.pmin),
}


#: The XLA collective that performs each combine as one all-reduce.
XLA_COLLECTIVE = {lax.add: lax.psum, _fmax: lax.pmax, _fmin: lax.pmin}


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
