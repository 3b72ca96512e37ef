"""Typing a hand-written all-reduce result like ``lax.psum``'s: invariant over the axes.

Under JAX's typed ``shard_map`` (``check_vma=True``, the default) every value has a
type saying which mesh axes it varies over. ``lax.psum`` returns a value *invariant*
over the reduced axes, and autodiff relies on that type: the cotangent of an
invariant value is one shared value, transposed by a ``pvary`` (no communication).
A hand-written all-reduce is built from ``lax.ppermute``, whose results are always
*varying*, so without help its result is typed varying even though every
participant holds the same bits; a loss computed from it on every participant is
then counted once per participant by autodiff (p× psum's gradient).

:func:`as_invariant` closes that gap with one primitive, ``allreduce_invariant``:

- forward: the identity (it lowers to nothing: no communication, the bits are
  unchanged), typed invariant over the given axes;
- meaning, as a linear map: "participant 0's copy" (every copy is equal, so this
  is the value everyone holds);
- transpose: the cotangent on participant 0 and zeros elsewhere. Transposing the
  hand-written algorithm (its ``ppermute``\\ s run in reverse) then sums these over
  the participants, so each input receives the cotangent once: exactly the
  ``pvary``'d cotangent ``lax.psum``'s own transpose gives, and the backward pass
  communicates with ``ppermute`` only.

Under ``check_vma=False`` nothing is typed, ``lax.psum`` transposes to a ``psum``
(each input receives the sum of every participant's cotangent), and so does the
untyped hand-written algorithm: :func:`as_invariant` is then not applied.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jex_core
from jax.interpreters import ad, batching, mlir

from allreduce_jax import _comm
from allreduce_jax._comm import AxisName


def varying_axes(x) -> frozenset:
  """The mesh axes ``x`` is typed as varying over (empty outside typed shard_map)."""
  aval = jax.typeof(x)
  mat = getattr(aval, "mat", None) or getattr(aval, "manual_axis_type", None)  # jax 0.10
  if mat is not None:
    return frozenset(mat.varying)
  return frozenset(getattr(aval, "vma", frozenset()))  # jax < 0.10


def typed(axis_name: AxisName) -> bool:
  """True inside a typed ``shard_map`` (``check_vma=True``) over ``axis_name``.

  Probes with a scalar: under ``check_vma=False`` a ``pcast`` to varying leaves the
  type unchanged (nothing is tracked), under ``check_vma=True`` it records the axes.
  """
  axes = _comm.axes_tuple(axis_name)
  try:
    probe = _comm.make_varying(jnp.zeros((), jnp.float32), axes)
  except (ValueError, NameError, TypeError):  # not inside shard_map over these axes
    return False  # the caller's own checks report the unbound axis
  return all(a in varying_axes(probe) for a in axes)


invariant_p = jex_core.Primitive("allreduce_invariant")


def _abstract_eval(aval, *, axes):
  mat = aval.mat
  return aval.update(manual_axis_type=mat.update(varying=mat.varying - frozenset(axes)))


def _impl(x, *, axes):  # only reached outside shard_map, where nothing is typed
  del axes
  return x


def _transpose(ct, x, *, axes):
  del x
  ct = _comm.make_varying(ct, axes)
  first = lax.axis_index(axes) == 0
  return (jnp.where(first, ct, jnp.zeros_like(ct)),)


def _batch(vals, dims, *, axes):
  (x,), (d,) = vals, dims
  return invariant_p.bind(x, axes=axes), d


invariant_p.def_impl(_impl)
invariant_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(invariant_p, lambda ctx, x, *, axes: [x])
ad.deflinear2(invariant_p, _transpose)
batching.primitive_batchers[invariant_p] = _batch


def as_invariant(y: jax.Array, axis_name: AxisName) -> jax.Array:
  """``y`` (equal on every participant of ``axis_name``) typed invariant over it.

  A no-op where ``y`` is not typed varying over those axes (``check_vma=False``,
  or XLA's own collective). The caller guarantees that every participant holds
  the same value: the hand-written all-reduce does (bit-identical copies).
  """
  axes = tuple(a for a in _comm.axes_tuple(axis_name) if a in varying_axes(y))
  if not axes:
    return y
  return invariant_p.bind(y, axes=axes)
