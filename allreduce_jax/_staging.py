"""A backward pass cut into stages, one per gradient bucket, the readiest bucket first.

``jax.vjp`` returns the pullback as a pytree whose leaves are the residuals of the
forward pass; its jaxpr, ``(residuals, cotangent, loss) -> (gradient leaves, [loss])``,
says which equations each gradient needs. Given the buckets of
:func:`allreduce_jax.fusion.plan_buckets`, stage k holds the equations that bucket k's
leaves need and that no earlier stage computed; the next bucket is the one whose
missing equations cost the fewest flops (for a network of layers: the last layer's
bucket first, then the layer below, as DDP orders them). Nothing is recomputed: a
value an earlier stage computed is handed on (its ``exports``).

Evaluating a stage binds the same primitives the fused ``jax.grad`` program binds,
with ``jit`` calls inlined (XLA inlines them too), so each gradient's arithmetic is
the same; whether the separately compiled programs give the same bits is checked by
the tests of :mod:`allreduce_jax.overlap` (XLA:CPU: they do, for the models tested).
A backward written as one ``lax.scan`` over layers is one equation: its buckets are
ready together, and the stages after the first hold nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex
from jax.extend.core import primitives

from allreduce_jax.fusion import plan_buckets

#: Call primitives whose body is evaluated in line (XLA inlines calls as well).
_INLINED = (primitives.jit_p, primitives.closed_call_p)


@dataclass(frozen=True)
class Stage:
  """One stage of the backward: the equations that finish bucket ``bucket``.

  ``inputs``: the variables it reads that an earlier program produced (residuals,
  the cotangent, the loss, an earlier stage's exports); ``exports``: the variables it
  computes that a later stage reads; ``outputs``: the bucket's leaves in bucket order
  (variables or literals of the jaxpr's outputs)."""

  bucket: int
  eqns: tuple
  inputs: tuple
  exports: tuple
  outputs: tuple


@dataclass(frozen=True)
class Backward:
  """The staged backward: ``jaxpr`` maps ``(*residuals, cotangent, loss)`` to the
  gradient leaves (then the loss, with ``reduce_loss``); ``buckets`` are
  :func:`~allreduce_jax.fusion.plan_buckets`' for those leaves; ``stages`` run in
  order, one per bucket."""

  jaxpr: Any  # jax.extend.core.ClosedJaxpr
  buckets: list[list[int]]
  stages: list[Stage]

  @property
  def invars(self) -> list:
    return list(self.jaxpr.jaxpr.invars)

  def start_env(self, values) -> dict:
    """The environment a stage is evaluated in: the jaxpr's constants, then
    ``values`` for its input variables (a dict or a list in ``invars`` order)."""
    env = dict(zip(self.jaxpr.jaxpr.constvars, self.jaxpr.consts))
    env.update(values if isinstance(values, dict) else zip(self.invars, values))
    return env


def read(env: dict, atom) -> Any:
  """The value of a jaxpr variable or literal (a literal as an array of its type)."""
  if isinstance(atom, jex.Literal):
    return jnp.full(atom.aval.shape, atom.val, atom.aval.dtype)
  return env[atom]


def evaluate(eqns, env: dict) -> None:
  """Binds ``eqns`` in order, reading and writing ``env`` (as ``jax.core.eval_jaxpr``,
  with ``jit`` calls evaluated in line)."""
  for eqn in eqns:
    args = [read(env, v) for v in eqn.invars]
    if eqn.primitive in _INLINED:
      inner = eqn.params["jaxpr"]
      sub = dict(zip(inner.jaxpr.constvars, inner.consts))
      sub.update(zip(inner.jaxpr.invars, args))
      evaluate(inner.jaxpr.eqns, sub)
      outs = [read(sub, v) for v in inner.jaxpr.outvars]
    else:
      with eqn.ctx.manager:
        outs = eqn.primitive.bind(*args, **eqn.primitive.get_bind_params(eqn.params))
      if not eqn.primitive.multiple_results:
        outs = [outs]
    for v, out in zip(eqn.outvars, outs):
      if not isinstance(v, jex.DropVar):
        env[v] = out


def _flops(eqn) -> int:
  """What an equation costs, roughly: a dot's multiply-adds, else its output size."""
  size = sum(int(np.prod(v.aval.shape)) for v in eqn.outvars)
  if eqn.primitive.name == "dot_general":
    (contracting, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval.shape
    size *= 2 * int(np.prod([lhs[d] for d in contracting]))
  return size


def stage_backward(pullback, loss: jax.Array, bucket_bytes: int, reduce_loss: bool) -> Backward:
  """Cuts ``pullback`` (from ``jax.vjp`` of a scalar ``loss``) into stages.

  ``reduce_loss``: the loss is one more leaf after the gradients (it rides in the
  last bucket of its dtype, as ``all_reduce_tree({"g": grads, "loss": loss})`` packs
  it). Call it where the pullback's residuals live (inside the ``shard_map`` body, or
  under ``jax.eval_shape`` of one): the jaxpr carries their types.
  """
  residuals, treedef = jax.tree.flatten(pullback)

  def backward(residuals, cotangent, loss):
    (grads,) = jax.tree.unflatten(treedef, residuals)(cotangent)
    return [*jax.tree.leaves(grads), *([loss] if reduce_loss else [])]

  nested = jax.make_jaxpr(backward)(residuals, loss, loss)

  def inline(*args):
    env = dict(zip(nested.jaxpr.constvars, nested.consts))
    env.update(zip(nested.jaxpr.invars, args))
    evaluate(nested.jaxpr.eqns, env)
    return [read(env, v) for v in nested.jaxpr.outvars]

  closed = jax.make_jaxpr(inline)(*residuals, loss, loss)
  jaxpr = closed.jaxpr
  leaves = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in jaxpr.outvars]
  buckets = plan_buckets(leaves, bucket_bytes)
  return Backward(closed, buckets, _stages(jaxpr, buckets))


def _stages(jaxpr, buckets: list[list[int]]) -> list[Stage]:
  producer = {v: i for i, eqn in enumerate(jaxpr.eqns) for v in eqn.outvars}

  def needed(atoms) -> set[int]:
    need: set[int] = set()
    todo = [a for a in atoms if not isinstance(a, jex.Literal)]
    while todo:
      i = producer.get(todo.pop())
      if i is not None and i not in need:
        need.add(i)
        todo.extend(a for a in jaxpr.eqns[i].invars if not isinstance(a, jex.Literal))
    return need

  needs = [needed([jaxpr.outvars[k] for k in b]) for b in buckets]
  done: set[int] = set()
  order, parts = [], []
  left = list(range(len(buckets)))
  while left:  # the bucket whose missing equations cost least; ties: the later bucket
    b = min(left, key=lambda b: (sum(_flops(jaxpr.eqns[i]) for i in needs[b] - done), -b))
    left.remove(b)
    order.append(b)
    parts.append(sorted(needs[b] - done))
    done |= needs[b]
  reads = []  # per stage: the variables its equations and outputs read
  for b, part in zip(order, parts):
    atoms = [a for i in part for a in jaxpr.eqns[i].invars]
    atoms += [jaxpr.outvars[k] for k in buckets[b]]
    reads.append({a for a in atoms if not isinstance(a, jex.Literal)})
  consts = set(jaxpr.constvars)  # every program holds the constants itself
  stages = []
  for s, (b, part) in enumerate(zip(order, parts)):
    made = {v for i in part for v in jaxpr.eqns[i].outvars if not isinstance(v, jex.DropVar)}
    later = set().union(*reads[s + 1 :]) if s + 1 < len(reads) else set()
    stages.append(
      Stage(
        bucket=b,
        eqns=tuple(jaxpr.eqns[i] for i in part),
        inputs=tuple(sorted(reads[s] - made - consts, key=_var_order(jaxpr))),
        exports=tuple(sorted(made & later, key=_var_order(jaxpr))),
        outputs=tuple(jaxpr.outvars[k] for k in buckets[b]),
      )
    )
  return stages


def _var_order(jaxpr):
  """A sort key putting variables in definition order (inputs, then equations)."""
  rank = {v: i for i, v in enumerate([*jaxpr.constvars, *jaxpr.invars])}
  for eqn in jaxpr.eqns:
    for v in eqn.outvars:
      rank.setdefault(v, len(rank))
  return rank.__getitem__
