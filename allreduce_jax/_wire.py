"""Wire formats: what a message looks like on the wire, in ONE place.

Every hand-written algorithm sends through :func:`allreduce_jax._comm.send`; inside
:func:`using` that helper encodes each float message with the active
:class:`WireFormat`, sends the narrow payload with one ``lax.ppermute`` and decodes
it on arrival. Algorithms never see the format, except that they call
:func:`allreduce_jax._comm.settle` where a participant keeps a value it also sends
(the start of an all-gather or broadcast phase), so that sender and receivers hold
the same bits.

Formats (``all_reduce(..., wire=...)``):

* ``None``: the input dtype, exact (the default).
* ``"bf16"``: round to bfloat16, travel as its ``uint16`` bits (XLA:CPU widens a
  bfloat16 ``collective-permute`` to float32; its bits stay 2 bytes). 2 B/element.
* ``"int8"``: block-absmax int8: per block of :data:`BLOCK` = 256 elements one
  float32 scale ``s = absmax/127`` (rounded to 16 significant bits, see below),
  values ``round(x/s)`` in [-127, 127]. The scales travel in the same message as
  their 4 bytes, so one message is ``int8[n + 4·ceil(n/256)]``: 1.016 B/element.
* ``"fp8"``: the same blocks with ``s = absmax/448`` and values in
  ``float8_e4m3fn`` (4 significant bits), as their ``uint8`` bits: 1.016 B/element.

Every format is a projection: ``decode(encode(decode(encode(x)))) ==
decode(encode(x))`` bit for bit, so forwarding a received message re-encodes it to
the same bytes ("the all-gather forwards what it received"). For the block formats
this is why the scale is rounded to 16 significant bits: then ``q·s`` is exact in
float32 (7 + 16 bits for int8, 4 + 16 for fp8), the block's largest value decodes
to exactly ``127·s`` (``448·s``), and re-encoding finds ``s`` again even if the
division by 127 is off by an ulp (XLA may multiply by the reciprocal).

Special values and range (``all_reduce``'s contract for a lossy wire; every participant
holds the same bits in every case, ``tests/test_lossy_wire_contract.py``):

* ``bf16`` rounds like ``astype(bfloat16)``: NaN stays NaN, ±inf stay ±inf, and a
  finite value beyond bfloat16's largest (3.39e38: float32 values near float32's max;
  a float16 65504 rounds to 65536 and the float16 result overflows) becomes ±inf.
* In a block format, a NaN or infinity anywhere in a block (an input's, or a partial
  sum that overflowed) makes that whole decoded block NaN: its scale is not finite.
  Which elements share a block depends on the algorithm's messages (blocks of 256
  from each message's start). Finite values up to the dtype's max travel within the
  bound. Zeros stay zeros.
* bfloat16/float16 inputs are reduced in float32 and rounded once: a total beyond
  the dtype's max is ±inf, as the exact sum's rounding would be.

So every element of a result is either within the error bound of the exact sum or
not finite (NaN, ±inf), and where the exact sum is not finite, neither is the
result: never a wrong finite value. Integers never travel lossy: ``all_reduce``
refuses a lossy wire for them (``TypeError``), ``all_reduce_tree`` sends its integer
buckets exact.

Error per quantization (each element, against the value encoded): at most ``u`` times
the block's absolute maximum, ``u`` = :attr:`WireFormat.unit_error` (1/254 for int8,
2^-4 for fp8 e4m3, and 2^-8 relative to the element itself for bf16). How many
quantization errors reach an element depends on the algorithm's path:
``allreduce_jax.wire_error.quantizations`` counts them on its own program.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

#: Elements per scale in the block formats (flashinfer's and ZeRO++'s default).
BLOCK = 256
_SCALE_BYTES = 4  # one float32 scale per block, inside the message


@dataclass(frozen=True)
class WireFormat:
  """One wire format.

  Attributes:
    name: the ``wire=`` value.
    lossy: False only for ``None`` (exact).
    levels: the largest code a block scale maps the absmax to (127, 448), or 0 for
      a format without scales (bf16).
    unit_error: the bound on one quantization's error of an element, as a fraction
      of its block's absmax (block formats) or of the element (bf16).
    summary: one line for ``--help`` and tables.
  """

  name: str
  lossy: bool
  levels: float
  unit_error: float
  summary: str

  def bytes_per_element(self, n: int = 1 << 20, itemsize: int = 4) -> float:
    """Bytes one message of ``n`` elements puts on the wire per element, scales included
    (``itemsize``: the input dtype's, for the exact format)."""
    if not self.lossy:
      return float(itemsize)
    if self.levels == 0:
      return 2.0
    return (n + _SCALE_BYTES * -(-n // BLOCK)) / n


FORMATS: dict[str | None, WireFormat] = {
  None: WireFormat(None, False, 0, 0.0, "the input dtype, exact"),
  "bf16": WireFormat("bf16", True, 0, 2.0**-8, "bfloat16 bits as uint16 (2 B/element)"),
  "int8": WireFormat(
    "int8", True, 127, 1 / 254, "int8, one f32 absmax scale per 256 elements (1.016 B)"
  ),
  "fp8": WireFormat(
    "fp8", True, 448, 2.0**-4, "float8_e4m3fn, one f32 absmax scale per 256 (1.016 B)"
  ),
}

#: The ``wire=`` values, exact first.
WIRES: tuple[str | None, ...] = tuple(FORMATS)

#: Not a format to send in, and not in :data:`FORMATS`: every element carries ``2·k + s``
#: instead of a value, k the quantizations it has been through and s = 1 while it is on
#: the grid (received or settled: encoding it again changes nothing). Each message
#: ``encode`` counts one more quantization unless s = 1. Combining two partial results
#: adds their counts (``wire_error.quantizations`` runs an algorithm's own program
#: with it, so an error bound follows the real path of every element).
COUNTING = WireFormat("count", True, 0, 1.0, "quantizations per element (analysis only)")


def get(wire: str | None) -> WireFormat:
  """The :class:`WireFormat` named ``wire``: TypeError if ``wire`` is neither None nor a
  string (a list, say), ValueError naming the choices if it is an unknown name."""
  if wire is not None and not isinstance(wire, str):
    raise TypeError(
      f"wire={wire!r} must be None or a string, one of {list(WIRES)}; got a {type(wire).__name__}."
    )
  if wire not in FORMATS:
    raise ValueError(f"wire={wire!r} is not supported; expected one of {list(WIRES)}.")
  return FORMATS[wire]


# The format active while an algorithm is traced (None: exact). Set by all_reduce
# through using(); read by _comm.send at trace time, like the message log.
_active: WireFormat | None = None


@contextlib.contextmanager
def using(wire: str | WireFormat | None):
  """While active, :func:`allreduce_jax._comm.send` encodes float messages with ``wire``
  (a name, or a :class:`WireFormat` such as :data:`COUNTING`)."""
  global _active
  previous, fmt = _active, wire if isinstance(wire, WireFormat) else get(wire)
  _active = fmt if fmt.lossy else None
  try:
    yield
  finally:
    _active = previous


def active() -> WireFormat | None:
  """The lossy format in force now, or None (exact)."""
  return _active


def _round_16_bits(s: jax.Array) -> jax.Array:
  """``s`` (>= 0) rounded to the nearest float32 with at most 16 significant bits."""
  bits = lax.bitcast_convert_type(s, jnp.uint32)
  bits = (bits + jnp.uint32(0x80)) & jnp.uint32(0xFFFFFF00)
  return lax.bitcast_convert_type(bits, jnp.float32)


def _block_scales(x32: jax.Array, levels: float) -> tuple[jax.Array, jax.Array]:
  """``x32: f32[n]`` -> (blocks ``f32[nb, BLOCK]`` zero-padded, scales ``f32[nb]``)."""
  n = x32.shape[0]
  nb = -(-n // BLOCK)
  blocks = (jnp.pad(x32, (0, nb * BLOCK - n)) if n % BLOCK else x32).reshape(nb, BLOCK)
  absmax = jnp.max(jnp.abs(blocks), axis=1)  # NaN propagates: the block decodes to NaN
  return blocks, _round_16_bits(absmax / jnp.float32(levels))


def encode(fmt: WireFormat, x: jax.Array) -> jax.Array:
  """``x: T[n]`` float -> the message: ``u16[n]`` (bf16) or ``int8[n + 4·nb]`` (codes,
  then the scales' bytes)."""
  if fmt is COUNTING:  # one more quantization, unless the element is on the grid
    return jnp.where(x % 2 == 1, x, x + 3)
  if fmt.levels == 0:
    return lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)
  n = x.shape[0]
  blocks, s = _block_scales(x.astype(jnp.float32), fmt.levels)
  ok = (s > 0) & jnp.isfinite(s)
  scaled = blocks / jnp.where(ok, s, 1.0)[:, None]
  # |scaled| <= levels·(1 + 2^-16): the rounded scale may be a hair small.
  scaled = jnp.clip(jnp.where(ok[:, None], scaled, 0.0), -fmt.levels, fmt.levels)
  if fmt.name == "int8":
    codes = jnp.round(scaled).astype(jnp.int8)
  else:
    codes = lax.bitcast_convert_type(scaled.astype(jnp.float8_e4m3fn), jnp.int8)
  scale_bytes = lax.bitcast_convert_type(s, jnp.int8).reshape(-1)  # int8[4·nb]
  codes = codes.reshape(-1)
  return jnp.concatenate([codes[:n] if n % BLOCK else codes, scale_bytes])


def decode(fmt: WireFormat, msg: jax.Array, n: int, dtype) -> jax.Array:
  """The inverse of :func:`encode` for an ``n``-element message: ``T[n]`` in ``dtype``."""
  if fmt is COUNTING:
    return msg.astype(dtype)
  if fmt.levels == 0:
    return lax.bitcast_convert_type(msg, jnp.bfloat16).astype(dtype)
  nb = -(-n // BLOCK)
  codes = msg[:n]
  s = lax.bitcast_convert_type(msg[n:].reshape(nb, _SCALE_BYTES), jnp.float32)  # f32[nb]
  if fmt.name == "int8":
    vals = codes.astype(jnp.float32)
  else:
    vals = lax.bitcast_convert_type(codes, jnp.float8_e4m3fn).astype(jnp.float32)
  if n % BLOCK:
    vals = jnp.pad(vals, (0, nb * BLOCK - n))
  out = (vals.reshape(nb, BLOCK) * s[:, None]).reshape(-1)  # broadcast, no gather
  return (out[:n] if n % BLOCK else out).astype(dtype)


def roundtrip(fmt: WireFormat | None, x: jax.Array) -> jax.Array:
  """``decode(encode(x))``: what a receiver of ``x`` holds; ``x`` itself when exact."""
  if fmt is None or not jnp.issubdtype(x.dtype, jnp.floating) or x.shape[0] == 0:
    return x
  return decode(fmt, encode(fmt, x), x.shape[0], x.dtype)


# --- the same arithmetic in NumPy (the reference for tests and the p = 1024 replay) ---


def np_roundtrip(wire: str | None, x: np.ndarray) -> np.ndarray:
  """NumPy statement of ``decode(encode(x))`` for float32 ``x: f32[..., n]``, each row
  along the last axis one message (bit for bit the same arithmetic as the JAX codec)."""
  fmt = get(wire)
  x = np.asarray(x, np.float32)
  if not fmt.lossy or x.size == 0:
    return x
  if fmt.levels == 0:
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)
  *lead, n = x.shape
  nb = -(-n // BLOCK)
  pad = [(0, 0)] * len(lead) + [(0, nb * BLOCK - n)]
  blocks = np.pad(x, pad).reshape(*lead, nb, BLOCK)
  with np.errstate(invalid="ignore", over="ignore"):
    absmax = np.max(np.abs(blocks), axis=-1)
    s = (absmax / np.float32(fmt.levels)).astype(np.float32)
  bits = s.view(np.uint32)
  s = ((bits + np.uint32(0x80)) & np.uint32(0xFFFFFF00)).view(np.float32)
  ok = (s > 0) & np.isfinite(s)
  with np.errstate(invalid="ignore", divide="ignore"):
    scaled = np.where(ok[..., None], blocks / np.where(ok, s, 1)[..., None], 0)
  scaled = np.clip(scaled.astype(np.float32), -fmt.levels, fmt.levels)
  if fmt.name == "int8":
    vals = np.round(scaled).astype(np.float32)
  else:
    vals = scaled.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
  with np.errstate(invalid="ignore"):
    out = (vals * s[..., None]).astype(np.float32)
  return out.reshape(*lead, nb * BLOCK)[..., :n]


__all__ = ["BLOCK", "FORMATS", "WIRES", "WireFormat", "get", "np_roundtrip", "using"]
