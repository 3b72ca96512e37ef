"""The overlapped gradient's contract, checked where it is used: in one process (imported
by tests/test_overlap.py) and across processes: run as a script under ``allreduce-jax
launch`` it checks the cases of :func:`plan` (``--all``: every algorithm and wire under
both typings) and prints one line per failure, then ``contract: N cases, F failed``.

The reference is today's step: ``all_reduce_tree({"g": jax.grad(loss)(params, x, y),
"loss": loss})`` with the same buckets, compiled as its own program. Inputs are random
floats, whose all-reduced bits depend on where each element sits in its bucket, so equal
bits mean equal buckets, offsets and algorithm.
"""

from __future__ import annotations

import itertools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

#: A 2-layer MLP in two buckets at BUCKET_BYTES: [b0 w0] and [b1 w1 loss] (sent first).
SIZES = (8, 16, 4)
BUCKET_BYTES = 600


def loss_fn(params, x, y):
  h = x
  for layer in params[:-1]:
    h = jnp.tanh(h @ layer["w"] + layer["b"])
  out = h @ params[-1]["w"] + params[-1]["b"]
  return jnp.mean((out - y) ** 2)


def inputs(mesh, axis, batch_per=4):
  """Parameters (replicated) and a batch sharded over ``axis``, random floats."""
  p = int(np.prod([mesh.shape[a] for a in ((axis,) if isinstance(axis, str) else axis)]))
  rng = np.random.default_rng(0)
  params = [
    {"w": rng.normal(size=(a, b)).astype(np.float32), "b": rng.normal(size=b).astype(np.float32)}
    for a, b in itertools.pairwise(SIZES)
  ]
  x = rng.normal(size=(p * batch_per, SIZES[0])).astype(np.float32)
  y = rng.normal(size=(p * batch_per, SIZES[-1])).astype(np.float32)
  rep, shard = NamedSharding(mesh, P()), NamedSharding(mesh, P(axis))

  def put(a, sharding):
    return jax.make_array_from_callback(a.shape, sharding, lambda i: a[i])

  return jax.tree.map(lambda a: put(a, rep), params), put(x, shard), put(y, shard)


def reference(mesh, axis, check_vma, **options):
  """``(loss, grads)`` of the non-overlapped step, one program."""
  from allreduce_jax import all_reduce_tree

  def body(params, x, y):
    if check_vma:  # each participant's own gradient (untyped, it is anyway)
      params = jax.tree.map(lambda a: jax.lax.pcast(a, axis, to="varying"), params)
    loss, g = jax.value_and_grad(loss_fn)(params, x, y)
    out = all_reduce_tree({"g": g, "loss": loss}, axis, bucket_bytes=BUCKET_BYTES, **options)
    return out["loss"], out["g"]

  specs = (P(), P(axis), P(axis))
  return jax.jit(
    jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=(P(), P()), check_vma=check_vma)
  )


def overlapped(mesh, axis, check_vma, mechanism, **options):
  """``(loss, grads)`` of the overlapped step; ``mechanism="in_body"``: the function
  called inside the caller's own ``jax.shard_map`` body."""
  from allreduce_jax import overlap

  kw = dict(bucket_bytes=BUCKET_BYTES, reduce_loss=True, check_vma=check_vma, **options)
  if mechanism != "in_body":
    return overlap.value_and_grad(loss_fn, axis, mechanism=mechanism, **kw)
  fn = overlap.value_and_grad(loss_fn, axis, **kw)
  specs = (P(), P(axis), P(axis))
  return jax.jit(
    jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=(P(), P()), check_vma=check_vma)
  )


def same_bits(a, b) -> bool:
  from allreduce_jax import devices

  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(leaves_a) == len(leaves_b) and all(
    np.array_equal(devices.fetch(u), devices.fetch(v)) for u, v in zip(leaves_a, leaves_b)
  )


def check(mesh, axis, algorithm, wire, op, check_vma, mechanism) -> bool:
  """Whether the overlapped step gives the reference's bits (every participant's copy:
  ``fetch`` gathers the replicated result, and the reference is identical everywhere)."""
  args = inputs(mesh, axis)
  options = dict(algorithm=algorithm, wire=wire, op=op)
  want = reference(mesh, axis, check_vma, **options)(*args)
  got = overlapped(mesh, axis, check_vma, mechanism, **options)(*args)
  return same_bits(got, want)


def cases():
  """Every (algorithm, wire) pair of the registry, with the mesh it runs on."""
  from allreduce_jax import ALGORITHMS

  for name, record in ALGORITHMS.items():
    for wire in record.wires:
      yield name, wire, record.axes


#: Across processes in CI: the ring, XLA's psum and the two-axis hierarchical algorithm
#: under both typings, and the ring over int8 (tests/test_overlap.py checks every pair in
#: one process; ``--all`` checks every pair here too).
ACROSS = {("ring", None), ("psum", None), ("hierarchical", None), ("ring", "int8")}


def plan(every: bool) -> list[tuple[str, str | None, int, bool, str]]:
  """``(algorithm, wire, axes, check_vma, op)`` to check across processes: the pairs of
  :data:`ACROSS` (``every``: every pair of the registry), each under both typings."""
  out = []
  for k, (name, wire, axes) in enumerate(cases()):
    if every or (name, wire) in ACROSS:
      for check_vma in (True, False):
        out.append((name, wire, axes, check_vma, ("mean", "sum")[(k + check_vma) % 2]))
  return out


def main(argv: list[str]) -> int:
  from allreduce_jax import devices
  from allreduce_jax.distributed import initialize_from_env

  initialize_from_env()
  flat = jax.make_mesh((jax.device_count(),), ("data",))
  two = devices.process_mesh()
  failed = 0
  todo = plan("--all" in argv)
  for name, wire, axes, check_vma, op in todo:
    mesh, axis = (flat, "data") if axes == 1 else (two, ("outer", "inner"))
    if not check(mesh, axis, name, wire, op, check_vma, "streams"):
      failed += 1
      print(f"FAILED {name} wire={wire} op={op} check_vma={check_vma}", flush=True)
  print(f"contract: {len(todo)} cases, {failed} failed", flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
