"""Option parsing shared by every subcommand: comma lists, sizes, ``--devices``.

Each subcommand's ``configure(parser)`` declares its options with these helpers, so
a list, a size or the device count is spelled and checked the same way everywhere.
"""

from __future__ import annotations

import argparse
import math
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from allreduce_jax import cost_model, names
from allreduce_jax._ops import OPS, get_op
from allreduce_jax._wire import WIRES
from allreduce_jax.results import RowsError, RowStore
from allreduce_jax.units import parse_size, seconds_problem


def csv_list(text: str) -> list[str]:
  """``"ring, tree,"`` -> ``["ring", "tree"]``: the parser of comma-separated options."""
  return [s.strip() for s in text.split(",") if s.strip()]


def int_list(text: str) -> list[int]:
  """``"2,4, 8"`` -> ``[2, 4, 8]`` (an argparse ``type``: a bad entry is a usage error).

  Example:
    >>> int_list("2,4, 8")
    [2, 4, 8]
  """
  try:
    return [int(s) for s in csv_list(text)]
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def text_table(rows: list[dict], columns: list[tuple[str, int, Callable[[dict], Any]]]) -> str:
  """A right-aligned, space-separated table: one ``(title, width, cell)`` per column,
  ``cell(row)`` the value to print (formatted already where it needs a format).

  Example:
    >>> print(text_table([{"p": 4}], [("p", 3, lambda r: r["p"]), ("2p", 4, lambda r: 2 * r["p"])]))
      p   2p
      4    8
  """
  lines = [" ".join(f"{title:>{width}}" for title, width, _ in columns)]
  lines += [" ".join(f"{cell(r):>{width}}" for _, width, cell in columns) for r in rows]
  return "\n".join(lines)


def size_list(text: str) -> list[int]:
  """``"1MiB,100MiB"`` -> byte counts (an argparse ``type``)."""
  try:
    return [parse_size(s) for s in csv_list(text)]
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e)) from None


def add_devices(parser: argparse.ArgumentParser) -> None:
  """``--devices N``: how many devices to run on (``devices.use_cpu_devices`` resolves
  the default: every visible GPU/TPU, 8 emulated devices on CPU)."""
  parser.add_argument(
    "--devices",
    type=positive_int,
    default=None,
    help="devices to use (default: every visible device on GPU/TPU, 8 emulated devices on"
    " CPU; ignored under jax.distributed)",
  )


def add_rows_out(parser: argparse.ArgumentParser, default: str) -> None:
  """A sweep's rows and figure: ``--out`` (JSON Lines, ``default``; appended, so a rerun
  resumes), ``--fresh`` (empty it first) and ``--plot`` (the figure, beside ``--out``)."""
  parser.add_argument("--out", default=default, help="JSON Lines file (appended; a rerun resumes)")
  parser.add_argument("--fresh", action="store_true", help="empty --out first instead of resuming")
  parser.add_argument("--plot", default=None, help="figure (default: --out with .png)")


def add_renamed(parser: argparse.ArgumentParser, old: str, new: str, example: str) -> None:
  """A removed option ``old``, hidden from ``--help``: using it is a usage error that
  names its replacement (``old`` was renamed ``new``, e.g. ``example``)."""

  class Renamed(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
      parser.error(f"{old} was renamed {new}, which takes a unit: e.g. {example}.")

  parser.add_argument(old, action=Renamed, nargs="?", help=argparse.SUPPRESS)


def wire_list(text: str) -> tuple[str | None, ...]:
  """``none,bf16,int8``: wire formats (an argparse ``type``; ``none`` is exact).

  Example:
    >>> wire_list("none,int8")
    (None, 'int8')
  """
  known = {("none" if w is None else w): w for w in WIRES}
  out = []
  for item in (t.strip() for t in text.split(",")):
    if item not in known:
      raise argparse.ArgumentTypeError(f"expected wire formats among {sorted(known)}, got {item!r}")
    out.append(known[item])
  return tuple(out)


def add_algorithms(parser: argparse.ArgumentParser, help: str = "comma-separated") -> None:
  """``--algorithms a,b``: registry names (checked; default None: every algorithm)."""
  parser.add_argument("--algorithms", type=algorithm_list, default=None, help=help)


# ----------------------------------------------------------------------------------------
# Checked values: every input problem found while parsing, as one line naming the option.
# argparse ``type`` functions raise ArgumentTypeError ("argument --dtype: ..."); the
# ``check_*`` / ``*_store`` helpers, used in ``run`` before any work, raise SystemExit.
# ----------------------------------------------------------------------------------------


def size(text: str) -> int:
  """``"1MiB"`` -> 1048576 (an argparse ``type``; argparse names the option)."""
  try:
    return parse_size(text, "")
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e).lstrip()) from None


def _number(kind, text: str, expected: str):
  """``kind(text)`` (``int``, ``float``), or the error that says what was ``expected``."""
  try:
    return kind(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def _int_at_least(text: str, low: int, expected: str) -> int:
  value = _number(int, text, expected)
  if value < low:
    raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
  return value


def positive_int(text: str) -> int:
  """An integer ≥ 1 (an argparse ``type``).

  Example:
    >>> positive_int("3")
    3
  """
  return _int_at_least(text, 1, "a positive integer")


def nonnegative_int(text: str) -> int:
  """An integer ≥ 0 (an argparse ``type``)."""
  return _int_at_least(text, 0, "an integer ≥ 0")


def nonnegative_float(text: str) -> float:
  """A finite number ≥ 0 (an argparse ``type``), e.g. a latency.

  Example:
    >>> nonnegative_float("0.5")
    0.5
  """
  value = _number(float, text, "a number ≥ 0")
  if not math.isfinite(value) or value < 0:
    raise argparse.ArgumentTypeError(f"expected a finite number ≥ 0, got {text!r}")
  return value


def positive_seconds(text: str) -> float:
  """A number of seconds > 0 that a timer can wait (an argparse ``type``: ``-T``,
  ``--timeout``; argparse names the option).

  Example:
    >>> positive_seconds("12.5")
    12.5
  """
  value = _number(float, text, "seconds")
  problem = seconds_problem(value)
  if problem:
    raise argparse.ArgumentTypeError(problem)
  return value


def nonempty(parse):
  """Wraps a list parser (``csv_list``, ``int_list``, ``size_list``) so that an empty
  list (``--sizes ''``) is an error instead of "everything" or nothing.

  Example:
    >>> nonempty(csv_list)("a,b")
    ['a', 'b']
  """

  def parse_nonempty(text: str):
    values = parse(text)
    if not values:
      raise argparse.ArgumentTypeError(f"expected at least one value, got {text!r}")
    return values

  parse_nonempty.__name__ = getattr(parse, "__name__", "list")
  return parse_nonempty


def positive_int_list(text: str) -> list[int]:
  """``"2,4,8"`` -> ``[2, 4, 8]``, every entry ≥ 1 and at least one."""
  values = nonempty(int_list)(text)
  bad = [v for v in values if v < 1]
  if bad:
    raise argparse.ArgumentTypeError(f"every value must be at least 1, got {bad[0]}")
  return values


def choice_list(choices, what: str = "names"):
  """A comma-list parser accepting only ``choices`` (a sequence, or a function
  returning one, so registry lookups happen at parse time) and at least one."""

  def parse(text: str) -> list[str]:
    allowed = tuple(choices() if callable(choices) else choices)
    values = csv_list(text)
    if not values:
      raise argparse.ArgumentTypeError(f"expected some of {', '.join(allowed)}; got none")
    for v in values:
      if v not in allowed:
        raise argparse.ArgumentTypeError(
          f"unknown {what[:-1] if what.endswith('s') else what} {v!r}; expected some of"
          f" {', '.join(allowed)}"
        )
    return list(dict.fromkeys(values))  # ring,ring: measured once

  return parse


def _algorithm_names() -> tuple[str, ...]:
  return names()


def _op_names() -> tuple[str, ...]:
  return OPS


#: ``--algorithms`` / ``--ops``: comma lists checked against the registry and OPS.
algorithm_list = choice_list(_algorithm_names, "algorithms")
op_list = choice_list(_op_names, "ops")


def op_choice(text: str) -> str:
  """One op of :data:`allreduce_jax._ops.OPS` (an argparse ``type``)."""
  if text not in _op_names():
    raise argparse.ArgumentTypeError(
      f"unknown op {text!r}; expected one of {', '.join(_op_names())}"
    )
  return text


def dtype_choice(text: str) -> str:
  """A dtype ``all_reduce`` can reduce and this process can hold, as its canonical
  name (an argparse ``type``): numeric, whole bytes per element (no ``int4``), and
  64-bit only with ``JAX_ENABLE_X64=1`` (JAX would silently use 32 bits).

  Example:
    >>> dtype_choice("float32"), dtype_choice("bfloat16")
    ('float32', 'bfloat16')
  """

  try:
    dt = jnp.dtype(text)
  except TypeError:
    raise argparse.ArgumentTypeError(f"unknown dtype {text!r}") from None
  kinds = (jnp.integer, jnp.floating, jnp.complexfloating)
  if not any(jnp.issubdtype(dt, k) for k in kinds):
    raise argparse.ArgumentTypeError(
      f"dtype {dt.name} cannot be all-reduced; expected a numeric dtype"
      " (float32, bfloat16, float16, int32, ...)"
    )
  if jnp.issubdtype(dt, jnp.integer) or jnp.issubdtype(dt, jnp.floating):
    info = jnp.iinfo(dt) if jnp.issubdtype(dt, jnp.integer) else jnp.finfo(dt)
    if info.bits < 8 * dt.itemsize:
      raise argparse.ArgumentTypeError(
        f"dtype {dt.name} packs {info.bits}-bit elements; expected a dtype of whole bytes"
      )
  bits = 8 * dt.itemsize // (2 if dt.kind == "c" else 1)  # complex: per component
  if bits == 64 and not jax.config.read("jax_enable_x64"):
    raise argparse.ArgumentTypeError(
      f"dtype {dt.name} needs 64-bit mode, which is off (JAX would silently use 32 bits);"
      " set JAX_ENABLE_X64=1"
    )
  return dt.name


#: nccl-tests' names (``-o``, ``-d``) for ops and dtypes spelled otherwise here.
NCCL_NAMES = {"avg": "mean", "float": "float32", "half": "float16", "double": "float64",
              "int": "int32"}  # fmt: skip

#: ``bench -d all``: nccl-tests' datatypes that ``all_reduce`` reduces (its fp8 types
#: are left out: the verifiable inputs are not exact there); 64-bit ones only with
#: ``JAX_ENABLE_X64=1``.
BENCH_DTYPES: tuple[str, ...] = ("int8", "uint8", "int32", "uint32", "int64", "uint64",
                                 "float16", "float32", "float64", "bfloat16")  # fmt: skip


def op_spec(text: str) -> list[str]:
  """``bench -o``: one op, a comma list or ``all`` (:data:`allreduce_jax._ops.OPS`;
  nccl-tests' ``avg`` is ``mean``; its ``prod``, ``mulsum`` are refused naming what is
  supported).

  Example:
    >>> op_spec("sum,avg"), op_spec("all")
    (['sum', 'mean'], ['sum', 'mean', 'max', 'min'])
  """
  if text.strip() == "all":
    return list(_op_names())
  out = []
  for v in nonempty(csv_list)(text):
    op = NCCL_NAMES.get(v, v)
    if op not in _op_names():
      raise argparse.ArgumentTypeError(
        f"unsupported op {v!r}; expected {', '.join(_op_names())} (nccl-tests' avg is mean),"
        " a comma list of them, or all"
      )
    out.append(op)
  return list(dict.fromkeys(out))


def dtype_spec(text: str) -> list[str]:
  """``bench -d``: one dtype, a comma list or ``all`` (:data:`BENCH_DTYPES` this
  process can hold); nccl-tests' ``float``, ``half``, ``double``, ``int`` too.

  Example:
    >>> dtype_spec("float,bfloat16"), "int64" in dtype_spec("all")
    (['float32', 'bfloat16'], False)
  """
  if text.strip() == "all":
    x64 = jax.config.read("jax_enable_x64")
    return [d for d in BENCH_DTYPES if x64 or jnp.dtype(d).itemsize < 8]
  out = []
  for v in nonempty(csv_list)(text):
    try:
      out.append(dtype_choice(NCCL_NAMES.get(v, v)))
    except argparse.ArgumentTypeError as e:
      raise argparse.ArgumentTypeError(
        f"{e}; expected some of {', '.join(BENCH_DTYPES)} (nccl-tests' float, half, double,"
        " int too) or all"
      ) from None
  return list(dict.fromkeys(out))


def dtype_list(text: str) -> list[str]:
  """Comma-separated :func:`dtype_choice` values, at least one."""
  return [dtype_choice(v) for v in nonempty(csv_list)(text)]


def check_op_dtypes(
  ops: list[str], dtypes: list[str], ops_arg: str = "--op", dtypes_arg: str = "--dtype"
) -> None:
  """Before any work: every requested (op, dtype) pair is defined (``mean`` needs a
  float, ``max``/``min`` a real dtype); raises SystemExit naming both options."""
  for op in ops:
    for dtype in dtypes:
      try:
        get_op(op, dtype)
      except (TypeError, ValueError) as e:
        raise SystemExit(f"{ops_arg} {op} with {dtypes_arg} {dtype}: {e}") from None


def output_path(path, arg: str = "--out"):
  """Before any work: ``path`` (a file to write, e.g. a figure or a fit) can be
  written: its folder exists or can be made, and it is not a folder. Returns a Path."""

  path = Path(path)
  if path.is_dir():
    raise SystemExit(f"{arg} {path}: is a folder; expected a file path.")
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise SystemExit(f"{arg} {path}: cannot create its folder ({e.strerror or e}).") from None
  if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
    raise SystemExit(f"{arg} {path}: cannot be written (permission denied).")
  return path


#: Figure formats matplotlib writes (``--plot`` must end in one of them).
FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".svgz", ".jpg", ".jpeg", ".eps", ".ps", ".tif",
                   ".tiff", ".webp", ".pgf")  # fmt: skip


def figure_path(path, arg: str = "--plot"):
  """Before any work: ``path`` is a figure file to write (an image suffix, writable)."""
  path = Path(path)
  if path.suffix.lower() not in FIGURE_SUFFIXES:
    raise SystemExit(
      f"{arg} {path}: not a figure file; use a path ending in"
      f" {', '.join(FIGURE_SUFFIXES[:4])}, ... (e.g. bench.png)."
    )
  return output_path(path, arg)


def params_file(path, arg: str = "--params"):
  """Before any work: the cost-parameter fit in ``path`` (written by ``bench --fit``),
  loaded; a missing file, a folder, a FIFO or a device (never opened, so nothing
  hangs) or a file that is not a fit is refused with one line."""

  path = Path(path)
  try:
    mode = path.stat().st_mode
  except FileNotFoundError:
    raise SystemExit(f"{arg} {path}: no such file (write one with bench --fit).") from None
  except OSError as e:
    raise SystemExit(f"{arg} {path}: cannot be read ({e.strerror or e}).") from None
  if not stat.S_ISREG(mode):
    what = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a FIFO or a device?)"
    raise SystemExit(f"{arg} {path}: is {what}; expected a fit file written by bench --fit.")
  try:
    return cost_model.load_params(path)
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    why = f"{type(e).__name__}: {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
    raise SystemExit(
      f"{arg} {path}: not a cost-parameter file written by bench --fit ({why})."
    ) from None


def available_memory() -> int | None:
  """Bytes of memory this machine can still give (``MemAvailable``), None if unknown."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  return None


def check_memory(need: int, what: str, fix: str) -> None:
  """Before allocating: ``need`` bytes fit in the available host memory (CPU backend),
  else one line naming ``what`` needs how much and ``fix``."""
  have = available_memory()
  if have is None or jax.default_backend() != "cpu" or need <= have:
    return
  raise SystemExit(
    f"{what} needs about {need / 2**30:.1f} GiB of memory, but {have / 2**30:.1f} GiB are"
    f" available; {fix}."
  )


def output_dir(path, arg: str = "--log-dir"):
  """Before any work: ``path`` is (or can be made) a writable folder. Returns a Path."""

  path = Path(path)
  if path.exists() and not path.is_dir():
    raise SystemExit(f"{arg} {path}: is a file; expected a folder.")
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise SystemExit(f"{arg} {path}: cannot create the folder ({e.strerror or e}).") from None
  if not os.access(path, os.W_OK):
    raise SystemExit(f"{arg} {path}: cannot be written (permission denied).")
  return path


def _main_process() -> bool:
  """Process 0 of a ``jax.distributed`` run, or a single process (no backend started)."""
  return not jax.distributed.is_initialized() or jax.process_index() == 0


def check_rows(path, kind: str, arg: str = "--out") -> None:
  """Before any work, changing nothing: the rows file behind ``arg`` is ours (or
  absent) and can be written (:func:`row_store` then locks it). Lets a command name
  the user's own ``--out`` before options whose defaults derive from it."""
  try:
    RowStore(path, kind).check()
  except RowsError as e:
    raise SystemExit(f"{arg}: {e}") from None


def row_store(path, kind: str, *, fresh: bool = False, context=None, arg: str = "--out"):
  """Before any work: the :class:`~allreduce_jax.results.RowStore` behind ``arg``,
  checked (ours or absent, writable), locked for this run by the writing process
  (process 0: a second command on the same file is refused with one line) and,
  with ``fresh``, emptied; a foreign file (``--out notes.csv``, another command's
  rows) is refused with one line."""
  store = RowStore(path, kind, context=context)
  try:
    store.check()
    if _main_process():
      store.lock()
      if fresh:
        store.reset()
  except RowsError as e:
    raise SystemExit(f"{arg}: {e}") from None
  return store
