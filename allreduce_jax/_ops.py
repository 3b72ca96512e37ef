"""Reduction operators: how two partial results combine, and how the total is finished.

Each custom algorithm only ever calls ``op.combine(a, b)`` on pairs of blocks, and
``op.finalize(total, p)`` is applied once to every element of the total (by
``all_reduce`` to the whole result, or, where an algorithm hands each participant's
reduced slice out, by the algorithm to that slice: ``_comm.finished``; it is
elementwise, so the bits are the same), so an operator is fully described by
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

* **Subnormals** (below ``finfo.tiny``, e.g. ``1e-40`` in float32): ``max``/``min``
  are exact for them in every float dtype (float32, bfloat16, float16, float64 under
  x64, the float8 types): they compare a monotone integer key of the bits, never the
  floats, because XLA:CPU compares floats with denormals treated as zero (so
  ``1e-40 == 2e-40`` there, and ``lax.pmax`` returns 0). ``sum``/``mean`` are **kept
  as XLA computes them on purpose**: XLA:CPU flushes subnormal operands and results of
  additions to zero (``[1, 2, 3, 4]·1e-40`` sums to ``0.0``), as ``lax.psum`` does;
  exact subnormal sums would cost a software adder on every element.
* **NaN bits**: every NaN in a result is the dtype's canonical quiet NaN (``jnp.nan``:
  sign 0, quiet bit only), whatever the inputs' signs and payloads, so participants
  that met their partial results in different orders (recursive doubling) still hold
  the same bits. Ordering the operands by rank is not enough on its own: recursive
  doubling adds ``where(upper, recv, x) + where(upper, x, recv)``, and LLVM folds that
  to ``x + recv`` (``fadd`` is commutative to it, NaN payloads unspecified), so each
  partner's own NaN wins. The replacement is one primitive, :data:`canonical_nan_p`,
  that autodiff treats as the identity (it changes no number, only which NaN), so
  ``sum``/``mean`` stay linear maps: ``jax.linear_transpose``, ``jax.vjp`` and
  ``jax.jvp`` go through them as through ``lax.psum``.

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
from jax.extend import core as jex_core
from jax.interpreters import ad, batching, mlir

OPS: tuple[str, ...] = ("sum", "mean", "max", "min")


@dataclass(frozen=True)
class Op:
  """An all-reduce operator.

  Attributes:
    name: one of :data:`OPS`.
    combine: elementwise binary reduction of two partial results, following the
      special-value semantics of the module docstring (NaN propagates through
      ``max``/``min``, ``-0.0 < +0.0``).
    finalize: ``(total, p) -> result``, elementwise; divides by ``p`` for ``mean``;
      every NaN becomes the canonical one.
    reference: the XLA collective of the same name (``lax.psum`` ...). It is the
      backend's and need not follow these semantics for special values.
  """

  name: str
  combine: Callable[[jax.Array, jax.Array], jax.Array]
  finalize: Callable[[jax.Array, int], jax.Array]
  reference: Callable[..., jax.Array]


def _sort_key(a: jax.Array) -> jax.Array:
  """A signed-integer key ordered like ``a``'s floats: ``-inf < ... < -0.0 < +0.0 < ...
  < +inf``, subnormals included, computed on the bits (no float compare, so no
  denormals-are-zero). Sub-byte floats (float4) go through float32 first, where all
  their values are normal; sign-less ones (``float8_e8m0fnu``) use their bits as is."""
  dtype = jnp.dtype(a.dtype)
  info = jnp.finfo(dtype)
  if info.bits < 8 * dtype.itemsize:  # float4: exactly representable, normal in float32
    return _sort_key(a.astype(jnp.float32))
  bits = 8 * dtype.itemsize
  if not float(info.min) < 0:  # no sign bit: the bits are the order
    return lax.bitcast_convert_type(a, jnp.dtype(f"uint{bits}"))
  i = lax.bitcast_convert_type(a, jnp.dtype(f"int{bits}"))
  # Negative floats: flip every bit but the sign, so a larger magnitude is smaller.
  return i ^ ((i >> (bits - 1)) & jnp.iinfo(i.dtype).max)


def _replace_nans(x: jax.Array) -> jax.Array:
  return jnp.where(jnp.isnan(x), jnp.array(jnp.nan, x.dtype), x)


#: ``x`` with every NaN made the canonical quiet NaN: a select on the data, but to
#: autodiff the identity (linear, its own tangent map, transposed to the identity),
#: so an exact ``sum``/``mean`` stays linear (its select would not transpose).
canonical_nan_p = jex_core.Primitive("allreduce_canonical_nan")
canonical_nan_p.def_impl(_replace_nans)
canonical_nan_p.def_abstract_eval(lambda aval: aval)
mlir.register_lowering(canonical_nan_p, mlir.lower_fun(_replace_nans, multiple_results=False))
ad.deflinear2(canonical_nan_p, lambda ct, x: (ct,))
batching.defvectorized(canonical_nan_p)


def _canonical_nan(x: jax.Array) -> jax.Array:
  """``x`` with every NaN replaced by the dtype's canonical quiet NaN (``jnp.nan``)."""
  if not jnp.issubdtype(x.dtype, jnp.floating) or not _has_nan(x.dtype):
    return x
  return canonical_nan_p.bind(x)


def _has_nan(dtype) -> bool:
  with np.errstate(invalid="ignore", over="ignore"):
    return bool(np.isnan(np.asarray(np.nan).astype(jnp.dtype(dtype))))


def _ieee(reduce, greater: bool):
  """IEEE 754-2019 ``maximum``/``minimum``, stated on the bits rather than left to
  the backend's float compare (denormals-as-zero), NaN rounding and signed zeros."""

  def combine(a: jax.Array, b: jax.Array) -> jax.Array:
    if not jnp.issubdtype(a.dtype, jnp.inexact):
      return reduce(a, b)
    ka, kb = _sort_key(a), _sort_key(b)  # -0.0 < +0.0, exact for subnormals
    r = jnp.where(ka >= kb if greater else ka <= kb, a, b)  # equal keys: equal bits
    if not _has_nan(a.dtype):
      return r
    return jnp.where(jnp.isnan(a) | jnp.isnan(b), jnp.array(jnp.nan, a.dtype), r)

  combine.__name__ = f"ieee_{reduce.__name__}"
  return combine


# max: +0.0 wins a tie with -0.0; min: -0.0 wins (the key orders -0.0 below +0.0).
_max = _ieee(lax.max, greater=True)
_min = _ieee(lax.min, greater=False)


def _identity(total: jax.Array, p: int) -> jax.Array:
  del p
  return _canonical_nan(total)  # the same NaN bits on every participant


def _divide(total: jax.Array, p: int) -> jax.Array:
  # Same expression as lax.pmean (psum, then divide by the axis size), so that an
  # exact sum gives a bit-identical mean.
  return _canonical_nan(total / p)


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
