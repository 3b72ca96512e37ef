"""Running one ``allreduce-jax`` subcommand: its parser, its guards, its errors.

Each subcommand lives in its own module, which provides ``configure(parser)`` (adds its
options) and ``run(args) -> int`` (the exit status); :func:`run` imports it, parses its
options with every default shown in ``--help`` (:func:`subcommand_parser`), joins a
``jax.distributed`` run where the environment sets one up, turns Ctrl-C and what the
machine refused (a full disk, a foreign rows file, a missing extra) into one line, and
returns its status. ``allreduce_jax.cli`` calls it for the command line, ``report`` for
the commands it runs.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import signal
import sys
import threading

from allreduce_jax import distributed, progress, results
from allreduce_jax.results import RowsError, release_locks
from allreduce_jax.tools import COMMANDS, spares


def installed(module: str) -> bool:
  """Whether ``module`` can be imported (its package and it are installed)."""
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # its parent package is not there
    return False


def _default_text(default) -> str:
  if isinstance(default, (list, tuple)):
    return ",".join(map(str, default))
  return str(default)


#: Help text that states its own default: "(default ...", "default: ...", "Default 1" as
#: a sentence. "JAX's default 300" is someone else's default, so ours is still added.
_STATES_DEFAULT = re.compile(r"(^|\(|; |\. )default\b", re.IGNORECASE)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
  """Every option's default in ``--help`` (none for flags and options without one),
  once: not added where the help text states it already.

  Example:
    >>> p = argparse.ArgumentParser(formatter_class=HelpFormatter)
    >>> _ = p.add_argument("--wait", default=30, help="seconds (JAX's default 300)")
    >>> _ = p.add_argument("--n", default=1, help="processes. Default 1")
    >>> text = " ".join(p.format_help().split())
    >>> "(JAX's default 300) (default: 30)" in text, "Default 1 (default" in text
    (True, False)
  """

  def _get_help_string(self, action):
    text = (action.help or "").strip()
    if _STATES_DEFAULT.search(text) or action.default in (None, False, argparse.SUPPRESS):
      return text
    if action.option_strings or action.nargs in ("?", "*"):
      return f"{text} (default: {_default_text(action.default).replace('%', '%%')})"
    return text


def _show_defaults(parser: argparse.ArgumentParser) -> None:
  """Every option's default in ``parser``'s help, and in its sub-commands' (``train``)."""
  parser.formatter_class = HelpFormatter
  for action in parser._actions:
    if isinstance(action, argparse._SubParsersAction):
      for child in action.choices.values():
        _show_defaults(child)
    # argparse prints no help line (so no default) for an option without a help text
    elif action.help is None and action.option_strings and action.default is not None:
      action.help = "(default: " + _default_text(action.default).replace("%", "%%") + ")"


def subcommand_parser(name: str, module=None) -> argparse.ArgumentParser:
  """The parser of ``allreduce-jax NAME``: the tool module's ``configure(parser)``, with
  every default shown in ``--help``."""
  module = module or importlib.import_module(COMMANDS[name][0])
  sub = argparse.ArgumentParser(prog=f"allreduce-jax {name}", description=COMMANDS[name][1])
  module.configure(sub)
  _show_defaults(sub)
  return sub


#: How many ``main`` calls are running (``report`` runs the other commands through it).
_depth = 0


def run(argv: list[str]) -> int:
  """Runs ``allreduce-jax NAME ARGS...`` (``argv``: ``[NAME, *ARGS]``, NAME one of
  ``COMMANDS`` whose module imports) in this process and returns its exit status: its
  options parsed (:func:`subcommand_parser`), a ``jax.distributed`` run joined where the
  environment sets one up, Ctrl-C and the machine's refusals turned into one line.
  ``report`` runs the other commands through it."""
  name = argv[0]
  try:
    module = importlib.import_module(COMMANDS[name][0])
  except ModuleNotFoundError as e:
    raise SystemExit(f"allreduce-jax {name}: {_missing_extra(e, name)}") from None
  args = subcommand_parser(name, module).parse_args(argv[1:])
  if name not in ("launch", "cluster"):  # join a jax.distributed run if the environment sets one up
    spares.wait_if_spare(module, args)  # a spare of a restarting job: ready, then told to go
    distributed.main_guard()

  global _depth
  _depth += 1
  # Ctrl-C: Python's KeyboardInterrupt, noted, so one lost in a GC callback still stops
  # the command at its next row (results.on_sigint); only where the default is in place.
  guard = (
    _depth == 1
    and threading.current_thread() is threading.main_thread()
    and signal.getsignal(signal.SIGINT) is signal.default_int_handler
  )
  if guard:
    results.clear_interrupt()
    signal.signal(signal.SIGINT, results.on_sigint)
  try:
    try:
      code = _noted(int(module.run(args) or 0))
      progress.phase("finishing")  # a launcher's watchdog: exiting is not a step
      return code
    except KeyboardInterrupt:
      if _depth > 1:  # a command run by another (report): the outer one stops too
        raise
      print(f"allreduce-jax {name}: interrupted (Ctrl-C).", file=sys.stderr, flush=True)
      raise SystemExit(130) from None
    except ModuleNotFoundError as e:  # a dependency imported when first needed (scipy, sklearn)
      raise SystemExit(f"allreduce-jax {name}: {_missing_extra(e, name)}") from None
    except (RowsError, *_FAILURES) as e:  # what the machine refused: one line, no traceback
      raise SystemExit(f"allreduce-jax {name}: {_failure(e)}") from None
  except SystemExit as e:  # a failing command in a jax.distributed run leaves at once
    _noted(e.code)
    raise
  finally:
    _depth -= 1
    if guard:
      signal.signal(signal.SIGINT, signal.default_int_handler)
      results.clear_interrupt()
    release_locks()


#: Modules of the optional extras (pyproject.toml) -> the extra that installs them. The
#: core install (jax, numpy, optax, ml_dtypes) is the library alone.
EXTRAS: dict[str, str] = {
  "matplotlib": "cli",
  "scipy": "cli",
  "tqdm": "cli",
  "flax": "train",
  "sklearn": "train",
}


#: Subcommands that need more than the extra of their first missing module: ``train``
#: (which includes ``cli``) for every part of them.
COMMAND_EXTRAS: dict[str, str] = {"train": "train", "report": "train"}


def _missing_extra(e: ModuleNotFoundError, command: str = "") -> str:
  """One line naming the extra that installs the missing module ``e.name`` (and all
  else ``command`` needs); a module of no extra is re-raised (a bug or a broken
  install, with its traceback).

  Example:
    >>> _missing_extra(ModuleNotFoundError("No module named 'tqdm'", name="tqdm"), "report")
    "needs tqdm, which is not installed: pip install 'allreduce-jax[train]'."
  """
  top = (e.name or "").partition(".")[0]
  if top not in EXTRAS:
    raise e
  extra = COMMAND_EXTRAS.get(command, EXTRAS[top])
  return f"needs {top}, which is not installed: pip install 'allreduce-jax[{extra}]'."


def _noted(code):
  """``code``; in a ``jax.distributed`` run a non-zero one is noted so that this process
  exits at once instead of waiting in JAX's shutdown barrier (distributed.note_exit)."""
  if _depth == 1 and code:
    distributed.note_exit(code)
  return code


def _failure(e: BaseException) -> str:
  """One line for an error the user's machine raised while a command ran."""
  if isinstance(e, RowsError):
    return str(e)
  if isinstance(e, MemoryError) or type(e).__name__ == "_ArrayMemoryError":
    return (
      f"out of memory ({str(e).splitlines()[0] if str(e) else 'MemoryError'});"
      " choose smaller sizes."
    )
  where = f"{e.filename}: " if getattr(e, "filename", None) else ""
  return f"{where}{e.strerror or e} (errno {e.errno})." if e.errno else f"{where}{e}."


#: Exceptions of the machine, not of the code: each ends a command with one line.
_FAILURES = (MemoryError, OSError)
