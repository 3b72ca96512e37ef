"""Communication audit of a compiled XLA program: which collectives it runs and how
many bytes each participant sends through ``collective-permute``."""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax._api import all_reduce
from allreduce_jax.devices import mesh_for

_DTYPE_BYTES = {
  "pred": 1,
  "s8": 1,
  "u8": 1,
  "s16": 2,
  "u16": 2,
  "f16": 2,
  "bf16": 2,
  "s32": 4,
  "u32": 4,
  "f32": 4,
  "s64": 8,
  "u64": 8,
  "f64": 8,
  "c64": 8,
  "c128": 16,
}
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# `%name = f32[128]{0} collective-permute(...)` or `... = (f32[..], ...) collective-permute-start(`
_OP_RE = re.compile(r"=\s*(?P<shape>\(?[a-z0-9]+\[[0-9,]*\][^=]*?)\s(?P<op>[a-z\-]+)\(")
_ARRAY_RE = re.compile(r"([a-z0-9]+)\[([0-9,]*)\]")
_PAIRS_RE = re.compile(r"source_target_pairs=\{([0-9,{} ]*)\}")


@dataclass
class CommAudit:
  """What the compiled program communicates.

  Attributes:
    counts: collective op name -> number of ops (async ``-start``/``-done`` pairs
      count once, under the plain name).
    compile_s: lowering + compile time, when :func:`audit_all_reduce` compiled it.
    permute_bytes: bytes of each ``collective-permute``'s payload, in program order.
    sent_bytes: device id -> bytes that device sends through collective-permutes.
    permute_dtypes: the element type of each ``collective-permute``'s payload
      (``"f32"``, ``"s8"``, ``"u16"``...), in program order.
  """

  counts: Counter = field(default_factory=Counter)
  permute_bytes: list[int] = field(default_factory=list)
  sent_bytes: dict[int, int] = field(default_factory=dict)
  permute_dtypes: list[str] = field(default_factory=list)
  compile_s: float | None = None

  @property
  def permutes(self) -> int:
    return self.counts["collective-permute"]

  @property
  def max_sent_bytes(self) -> int:
    return max(self.sent_bytes.values(), default=0)


def _nbytes(shape_text: str) -> int:
  m = _ARRAY_RE.search(shape_text)  # first array of a tuple: the operand of -start
  if m is None:
    return 0
  dims = [int(d) for d in m.group(2).split(",") if d]
  return _DTYPE_BYTES[m.group(1)] * int(np.prod(dims, dtype=np.int64))


def audit(hlo_text: str) -> CommAudit:
  """Parses compiled HLO text (``jit(f).lower(...).compile().as_text()``).

  Example:
    >>> text = ('%cp = f32[4]{0} collective-permute(f32[4]{0} %x), channel_id=1, '
    ...         'source_target_pairs={{0,1},{1,0}}')
    >>> a = audit(text)
    >>> a.permutes, a.sent_bytes
    (1, {0: 16, 1: 16})
  """
  result = CommAudit()
  for line in hlo_text.splitlines():
    m = _OP_RE.search(line)
    if m is None:
      continue
    op = m.group("op")
    if op.endswith("-done"):
      continue
    base = op.removesuffix("-start")
    if base not in _COLLECTIVES:
      continue
    result.counts[base] += 1
    if base == "collective-permute":
      nbytes = _nbytes(m.group("shape"))
      result.permute_bytes.append(nbytes)
      first = _ARRAY_RE.search(m.group("shape"))
      result.permute_dtypes.append(first.group(1) if first else "")
      pairs = _PAIRS_RE.search(line)
      if pairs:
        for src, _dst in re.findall(r"\{(\d+),(\d+)\}", pairs.group(1)):
          result.sent_bytes[int(src)] = result.sent_bytes.get(int(src), 0) + nbytes
  return result


def compiled_text(fn, *args) -> str:
  """HLO text of ``fn`` (a jitted function) compiled for ``args``."""
  return fn.lower(*args).compile().as_text()


def audit_all_reduce(
  algorithm: str, p: int, n: int, dtype="float32", wire: str | None = None
) -> CommAudit:
  """Compiles ``all_reduce`` of ``n`` elements on ``p`` of this process's devices
  (on the mesh :func:`allreduce_jax.devices.mesh_for` gives it), sending in wire
  format ``wire``, and audits its HLO.

  Example:
    >>> audit_all_reduce("ring", 4, 1024).max_sent_bytes  # 2·3/4·4096 bytes
    6144
  """

  mesh, axis = mesh_for(algorithm, p)
  spec = P(axis)
  x = jax.ShapeDtypeStruct((p * n,), jnp.dtype(dtype), sharding=NamedSharding(mesh, spec))
  f = jax.jit(
    jax.shard_map(
      lambda b: all_reduce(b, axis, op="sum", algorithm=algorithm, wire=wire),
      mesh=mesh,
      in_specs=spec,
      out_specs=spec,
    )
  )
  t0 = time.perf_counter()
  result = audit(compiled_text(f, x))
  result.compile_s = time.perf_counter() - t0
  return result
