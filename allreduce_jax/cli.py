"""The ``allreduce-jax`` command line: the dispatcher.

Each subcommand lives in its own module of the tools wing (``tools.COMMANDS``); a command
is run by :func:`allreduce_jax.tools.dispatch.run`. Modules are imported only when their
subcommand runs, so ``allreduce-jax --help`` starts no JAX backend.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys

from allreduce_jax.tools import COMMANDS, dispatch


def _version() -> str:
  try:
    return importlib.metadata.version("allreduce-jax")
  except importlib.metadata.PackageNotFoundError:  # pragma: no cover - not installed
    return "unknown"


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog="allreduce-jax",
    description="See, measure and reuse all-reduce in JAX.",
  )
  parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
  sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
  for name, (_, help_text) in COMMANDS.items():
    sub.add_parser(name, help=help_text, description=help_text, add_help=False)
  return parser


def main(argv: list[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = build_parser()
  if not argv or argv[0].startswith("-"):
    parser.parse_args(argv)  # prints help / usage errors
    return 2
  if argv[0] not in COMMANDS or not dispatch.installed(COMMANDS[argv[0]][0]):
    parser.parse_args(argv)  # "invalid choice" with the list of commands
    return 2
  return dispatch.run(argv)


if __name__ == "__main__":
  raise SystemExit(main())
