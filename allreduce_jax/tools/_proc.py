"""Starting a subcommand as a process that dies with its launcher: what ``launch`` and the
engines of ``cluster --launcher mpirun|slurm`` (:mod:`allreduce_jax.tools.engines`) share."""

from __future__ import annotations

import os
import sys

from allreduce_jax.tools import COMMANDS


class LaunchError(Exception):
  """A launch that cannot start (bad arguments, port in use...)."""


# Each child starts as this prefix (Linux), which asks for SIGKILL when the launcher
# dies (PR_SET_PDEATHSIG, kept across exec), checks that the launcher did not die
# before that, and execs the command in the same process. A prefix, not
# ``preexec_fn``: ``preexec_fn`` makes Python fork the launcher, which JAX warns
# against (and may deadlock) once it is initialised, as it is when the report runs
# ``cluster`` in-process after its other sections; without it Python uses vfork.
_DIE_WITH_PARENT = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
if os.getppid() != int(sys.argv[1]):
  sys.exit(1)
try:
  os.execvp(sys.argv[2], sys.argv[2:])
except OSError as e:
  print(f"cannot start {sys.argv[2]!r}: {e.strerror}", file=sys.stderr)
  sys.exit(127)
"""


def die_with_parent(argv: list[str]) -> list[str]:
  """``argv`` wrapped so that the program dies with this process (Linux; elsewhere ``argv`` as it is).

  The wrapper asks the kernel for SIGKILL when its parent exits (``PR_SET_PDEATHSIG``), then
  execs ``argv``: a launcher that is itself killed leaves no process behind. Used by ``launch``
  and by the engines of ``cluster --launcher mpirun|slurm``.
  """
  if not sys.platform.startswith("linux"):
    return argv
  return [sys.executable, "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]


def command_argv(command: list[str]) -> list[str]:
  if command and command[0] == "--":
    command = command[1:]
  if not command:
    raise LaunchError(
      "give the command to run after '--', e.g. 'allreduce-jax launch -n 2 -- verify'."
    )
  if command[0] == "launch":
    raise LaunchError("'launch -- launch' is not supported: give a subcommand such as verify.")

  if command[0] in COMMANDS:
    return [sys.executable, "-m", "allreduce_jax", *command]
  return command
