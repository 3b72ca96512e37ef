"""The faults study's ``slow-cc`` and ``slow-alone`` subcommands: bad input is one line
naming the argument."""

from pathlib import Path

import pytest
import study_script

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "faults" / "faults.py"


def _faults():
  return study_script.load(SCRIPT)


@pytest.mark.parametrize(
  "argv, says",
  [
    (["slow-cc"], "expects RUNS (a positive whole number) and a congestion control"),
    (["slow-cc", "x", "cubic"], "got x cubic"),
    (["slow-cc", "0", "cubic"], "expects RUNS"),
    (["slow-cc", "1", "cubic", "ring,nope"], "ALGORITHMS expects registered algorithms"),
    (["slow-cc", "1", "cubic", "--slow", "3"], "--slow expects host 1's link at 1/k"),
    (["slow-cc", "1", "cubic", "--slow", "x"], "--slow expects a comma list of numbers"),
    (["slow-cc", "1", "no_such_cc"], "--congestion-control no_such_cc:"),
    (["slow-alone", "all"], "slow-alone expects nothing, or every [RUNS] [CC]"),
    (["slow-alone", "every", "0"], "got every 0"),
    (["slow-alone", "every", "x"], "RUNS a positive whole number"),
    (["slow-alone", "every", "2", "reno", "more"], "got every 2 reno more"),
    (["slow-alone", "every", "2", "no_such_cc"], "--congestion-control no_such_cc:"),
    (["slow-alone", "every", "1", "--slow", "5"], "--slow expects host 1's link at 1/k"),
    (["slow-alone", "every", "--slow", "x"], "--slow expects a comma list of numbers"),
    (["slow-alone", "--slow", "2"], "--slow and --net expect every"),
    (["slow-alone", "every", "1", "--net", "ring"], "--net expects one of switch, switch-8"),
    (["slow-alone", "--net", "torus"], "--slow and --net expect every"),
    (["slow-alone", "every", "--net"], "--net expects a value"),
  ],
)
def test_bad_input_is_one_line_naming_it(argv, says):
  with pytest.raises(SystemExit) as e:
    _faults().main(argv)
  message = str(e.value)
  assert says in message and "\n" not in message
