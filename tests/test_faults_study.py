"""The faults study's command lines (``run.py``, ``run_failures.py``): bad input is one line
naming the argument, before any cluster runs."""

from pathlib import Path

import pytest
import study_script

FAULTS = Path(__file__).resolve().parents[1] / "experiments" / "faults"


@pytest.mark.parametrize(
  "argv, says",
  [
    (["slow-cc"], "the following arguments are required: runs, cc"),
    (["slow-cc", "x", "cubic"], "argument runs: expects a positive whole number, got 'x'"),
    (["slow-cc", "0", "cubic"], "argument runs: expects a positive whole number"),
    (["slow-cc", "1", "cubic", "ring,nope"], "argument algorithms: expects registered algorithms"),
    (["slow-cc", "1", "cubic", "--slow", "3"], "--slow: expects host 1's link at 1/k"),
    (["slow-cc", "1", "cubic", "--slow", "x"], "--slow: expects a comma list of numbers"),
    (["slow-cc", "1", "no_such_cc"], "--congestion-control no_such_cc:"),
    (["slow-alone", "all"], "argument every: invalid choice: 'all'"),
    (["slow-alone", "every", "0"], "argument runs: expects a positive whole number, got '0'"),
    (["slow-alone", "every", "x"], "argument runs: expects a positive whole number"),
    (["slow-alone", "every", "2", "reno", "more"], "unrecognized arguments: more"),
    (["slow-alone", "every", "2", "no_such_cc"], "--congestion-control no_such_cc:"),
    (["slow-alone", "every", "1", "--slow", "5"], "--slow: expects host 1's link at 1/k"),
    (["slow-alone", "every", "--slow", "x"], "--slow: expects a comma list of numbers"),
    (["slow-alone", "--slow", "2"], "--slow and --net expect every"),
    (["slow-alone", "every", "1", "--net", "ring"], "argument --net: invalid choice: 'ring'"),
    (["slow-alone", "--net", "torus"], "--slow and --net expect every"),
    (["slow-alone", "every", "--net"], "argument --net: expected one argument"),
    (["slow-cases", "nope"], "expected cases among switch-more"),
    (["nope"], "invalid choice: 'nope'"),
  ],
)
def test_bad_input_is_one_line_naming_it(argv, says):
  with pytest.raises(SystemExit) as e:
    study_script.load(FAULTS / "run.py").parse(argv)
  message = str(e.value)
  assert says in message and "\n" not in message


@pytest.mark.parametrize(
  "argv, says",
  [
    (["kill", "ring,nope"], "argument algorithms: expects registered algorithms, got nope"),
    (["down", "--for", "x"], "argument --for: expects a comma list of numbers, got 'x'"),
    (["recovery", "nope"], "expects one of uninterrupted, restart, elastic, got 'nope'"),
    (["slow-host", "--seeds", "a"], "argument --seeds"),
  ],
)
def test_failures_bad_input_is_one_line_naming_it(argv, says):
  with pytest.raises(SystemExit) as e:
    study_script.load(FAULTS / "run_failures.py").parser().parse_args(argv)
  message = str(e.value)
  assert says in message and "\n" not in message


def test_the_campaigns_build_the_commands_they_ran():
  """``slow-alone every``'s bench run as the committed rows name it: the network, host 1's
  link fault, bench in blocks; ``--slow`` and ``--net`` default to 1/10 on the switch."""
  run = study_script.load(FAULTS / "run.py")
  args = run.parse(["slow-alone", "every", "3"])
  assert (args.runs, args.slow, args.net, args.cc) == (3, (10,), "switch", None)
  b = run.Bench(8, "switch", run.SLOW[10], "ring", "1MiB", more=("--order", "blocks"))
  argv = b.argv("OUT")
  assert argv[argv.index("--fault") + 1] == "link:1=20Mbit@0"
  assert argv[argv.index("--hosts") + 1] == "8" and argv[-2:] == ["--order", "blocks"]
  idle = run.Bench(4, "switch", None, "ring", "4MiB", idle_restart=False)
  assert idle.argv("OUT")[idle.argv("OUT").index("--") + 1 :][:2] == ["sh", "-c"]
  assert idle.mark == {"slow_start_after_idle": 0} and b.mark == {}
