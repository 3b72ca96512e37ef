"""Options of ``launch`` and ``cluster`` checked before anything starts, in one line.

A timeout that is NaN, infinite or beyond what a timer can wait, an ``--init-timeout``
below 1 (it reached every process as an environment variable and a traceback each),
``--restarts -1``, an ``--output`` rank that does not exist, a ``--counters`` path that
cannot be written (it was found after the run, losing the counters), a link faster than
``tc`` shapes and a fault time a timer cannot wait: each refused before a process
starts or a namespace is built, naming the option.
"""

from __future__ import annotations

import pytest

from allreduce_jax.cli import main

BAD_NUMBERS = [
  ("cluster", "--restarts", "-1", "must be at least 0, got -1"),
  ("cluster", "--timeout", "0", "must be more than 0 seconds, got 0"),
  ("cluster", "--timeout", "nan", "expected a finite number of seconds, got nan"),
  ("launch", "--timeout", "inf", "expected a finite number of seconds, got inf"),
  (
    "launch",
    "--timeout",
    "1e308",
    "must be at most 9.22e+09 seconds (about 292 years), got 1e+308",
  ),
  ("launch", "--init-timeout", "0", "must be at least 1, got 0"),
  ("launch", "--init-timeout", "-5", "must be at least 1, got -5"),
  ("cluster", "--shutdown-timeout", "0", "must be at least 1, got 0"),
]


@pytest.mark.parametrize("command, option, value, says", BAD_NUMBERS)
def test_a_bad_number_is_refused_by_the_parser(command, option, value, says, capsys):
  size = ["--hosts", "2"] if command == "cluster" else ["-n", "2"]
  with pytest.raises(SystemExit):
    main([command, *size, option, value, "--", "verify"])
  last = capsys.readouterr().err.strip().splitlines()[-1]  # after argparse's usage
  assert last == f"allreduce-jax {command}: error: argument {option}: {says}"


REFUSED_BEFORE_BUILDING = [
  (["--output", "5"], "--output must be all, none or a rank in 0..1, got '5'."),
  (["--link", "1e40Gbit"], "--link 1e40Gbit: at most 8000Gbit, the most tc shapes a link"),
  (["--fault", "link:0=1e30Gbit@1"], "rate '1e30Gbit' is above 8000Gbit, the most tc shapes"),
  (["--fault", "kill:1@99999999999999999999"], "its time must be at most 9.22e+09 seconds"),
  (["--fault", "down:0@0.2+99999999999999"], "its duration must be at most 9.22e+09 seconds"),
  (["--fault", "down:0@1+."], "its duration '.' is not a number of seconds"),
]


@pytest.mark.parametrize("options, says", REFUSED_BEFORE_BUILDING)
def test_cluster_refuses_before_building_anything(options, says, capsys):
  assert main(["cluster", "--hosts", "2", *options, "--", "verify"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and says in err, err  # one line, no banner: nothing was built
  assert err.startswith("allreduce-jax cluster: ")


def test_launch_refuses_a_rank_it_does_not_start(capsys):
  assert main(["launch", "-n", "2", "--output", "7", "--", "verify"]) == 2
  err = capsys.readouterr().err
  assert err == "allreduce-jax launch: --output must be all, none or a rank in 0..1, got '7'.\n"


def test_cluster_counters_path_is_checked_before_the_run(tmp_path, capsys):
  (tmp_path / "a_file").write_text("")
  counters = tmp_path / "a_file" / "c.json"  # its folder cannot be made
  with pytest.raises(SystemExit) as e:
    main(["cluster", "--hosts", "2", "--counters", str(counters), "--", "verify"])
  assert str(e.value).startswith(f"--counters {counters}: cannot create its folder")
  assert "# cluster:" not in capsys.readouterr().err


def test_an_unknown_collectives_variable_is_refused_in_one_process_too():
  import os
  import subprocess
  import sys

  from allreduce_jax import distributed

  with pytest.raises(
    ValueError, match="ALLREDUCE_JAX_COLLECTIVES='bogus' must be one of gloo, mpi"
  ):
    distributed.initialize_from_env({distributed.ENV_COLLECTIVES: "bogus"})
  assert distributed.initialize_from_env({distributed.ENV_COLLECTIVES: "gloo"}) is False
  env = {**os.environ, distributed.ENV_COLLECTIVES: "bogus"}
  res = subprocess.run([sys.executable, "-m", "allreduce_jax", "verify", "--devices", "2",
                        "--algorithms", "ring", "--shapes", "3"], env=env, capture_output=True,
                       text=True)  # fmt: skip
  assert res.returncode != 0 and res.stderr.count("\n") == 1, res.stderr
  assert "ALLREDUCE_JAX_COLLECTIVES='bogus'" in res.stderr and "PASS" not in res.stdout
