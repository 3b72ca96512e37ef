"""The faults study's command lines, ``run.py``'s and ``run_failures.py``'s: bad input is one
line naming the argument, and each subcommand's help is the comment on its usage line in
the script's docstring. A module of the study, imported by both scripts.
"""

from __future__ import annotations

import argparse
import functools


class Parser(argparse.ArgumentParser):
  """Bad input is one line naming the argument (no usage lines)."""

  def error(self, message):
    raise SystemExit(f"{self.prog}: {message}.")


def parser(prog: str, doc: str):
  """``prog``'s parser, described by ``doc``'s first paragraph, and ``add(name, run,
  *arguments)``, which adds subcommand ``name`` (see :func:`subcommand`)."""
  p = Parser(prog=prog, description=doc.split("\n\n")[0])
  sub = p.add_subparsers(dest="command", required=True)
  return p, functools.partial(subcommand, sub, prog, doc)


def subcommand(sub, prog: str, doc: str, name: str, run, *arguments: tuple[list[str], dict]):
  """Subcommand ``name`` of ``sub`` running ``run(args)``, with ``arguments`` (names,
  options); its help the comment (after ``# ``) on the line of ``doc`` that shows
  ``prog name``."""
  usage = next(x for x in doc.splitlines() if f"{prog} {name} " in x)
  s = sub.add_parser(name, help=usage.split("# ")[-1] if "# " in usage else None)
  for names, options in arguments:
    s.add_argument(*names, **options)
  s.set_defaults(run=run)
