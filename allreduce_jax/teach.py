"""The notebooks' prompts and checks: "predict before you run" and "try this".

A prompt is a cell where the learner writes a number (``guess = None``, then their
estimate); the next cell computes the true value and calls :func:`reveal`, which
prints both and the gap. An exercise is a cell the learner edits, followed by a cell
that calls :func:`check`: one sentence saying what is right, or what is not yet.
The solution sits folded in the markdown cell after the check, and the notebook
tests run every check against it (``tests/test_notebooks.py``), so an exercise
cannot rot.

Example:
  >>> reveal(None, 1.75, what="bytes sent / n")
  bytes sent / n: 1.75. (No guess yet: write yours in the cell above, run both again.)
  >>> reveal(2, 1.75, what="bytes sent / n")
  bytes sent / n: 1.75; you guessed 2: 14% too high.
  >>> check(lambda: 1 + 1 == 2, "1 + 1 is 2.", "1 + 1 is not 2.")
  ✓ Right: 1 + 1 is 2.
  >>> check(lambda: agree([("at p=4", 1.5, 1.5), ("at p=8", 2.0, 1.75)]), "right.", "not yet")
  ✗ Not yet: not yet (at p=8: 2, expected 1.75)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

#: The first character of a check's sentence: right, or not yet.
RIGHT, NOT_YET = "✓", "✗"


def _fmt(value: Any, digits: int) -> str:
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return str(value)
  if float(value).is_integer() and abs(value) < 1e15:
    return f"{int(value):,}"
  return f"{value:.{digits}g}"


def reveal(guess: Any, truth: Any, *, what: str, unit: str = "", digits: int = 3) -> None:
  """Prints the true value of a prompt beside the learner's ``guess``.

  Args:
    guess: what the learner wrote (None: nothing yet).
    truth: the value the notebook computed.
    what: the quantity, as the prompt named it.
    unit: appended to both numbers (``" µs"``, ``" B"``).
    digits: significant digits shown.

  A number is compared by its relative gap ``guess / truth - 1``; a text answer as
  written, case aside. Returns nothing, so a cell that ends with it shows only the line.
  """
  shown = f"{_fmt(truth, digits)}{unit}"
  if guess is None:
    print(f"{what}: {shown}. (No guess yet: write yours in the cell above, run both again.)")
    return
  if isinstance(truth, str) or isinstance(guess, str):
    same = str(guess).strip().lower() == str(truth).strip().lower()
    print(f"{what}: {shown}; you guessed {guess}: {'right' if same else 'not this time'}.")
    return
  guess, truth_f = float(guess), float(truth)
  if truth_f == 0:
    gap = guess - truth_f
    verdict = "exactly" if gap == 0 else f"off by {_fmt(gap, digits)}{unit}"
  else:
    gap = guess / truth_f - 1
    if abs(gap) < 0.005:
      verdict = "spot on"
    else:
      verdict = f"{abs(gap):.0%} too {'high' if gap > 0 else 'low'}"
  print(f"{what}: {shown}; you guessed {_fmt(guess, digits)}{unit}: {verdict}.")


def check(claim: bool | Callable[[], Any], right: str, wrong: str) -> None:
  """Prints one sentence: ``✓ Right: <right>`` or ``✗ Not yet: <wrong>``.

  Args:
    claim: a bool, or a function returning a bool or ``(bool, detail)``; the
      function is called here, so an exception in the learner's code (an
      exercise still raising ``NotImplementedError``) is reported, not raised.
    right: the sentence when the claim holds.
    wrong: the sentence when it does not (``detail``, if any, is appended).

  Returns nothing, so a cell that ends with it shows only the sentence.
  """
  detail = ""
  try:
    ok = claim() if callable(claim) else claim
    if isinstance(ok, tuple):
      ok, detail = ok
  except NotImplementedError as e:
    print(f"{NOT_YET} Not yet: the cell above still raises NotImplementedError ({e}).")
    return
  except Exception as e:  # the learner's code failed: say how, and go on
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    print(f"{NOT_YET} Not yet: {wrong} ({type(e).__name__}: {first})")
    return
  if ok:
    print(f"{RIGHT} Right: {right}")
  else:
    print(f"{NOT_YET} Not yet: {wrong}" + (f" ({detail})" if detail else ""))


def agree(
  cases: Iterable[tuple[str, Any, Any]], *, rtol: float = 1e-5, digits: int = 4
) -> bool | tuple[bool, str]:
  """A claim for :func:`check`: ``True`` when each ``(where, got, want)`` of ``cases`` has
  ``got`` within ``rtol`` of ``want`` (NumPy's ``isclose``), else ``(False, "where: got,
  expected want")`` for the first that is not. ``cases`` may be a generator: the learner's
  code then runs, and may raise, inside the check."""
  for where, got, want in cases:
    if not abs(got - want) <= 1e-8 + rtol * abs(want):
      return False, f"{where}: {_fmt(got, digits)}, expected {_fmt(want, digits)}"
  return True


__all__ = ["NOT_YET", "RIGHT", "agree", "check", "reveal"]
