"""Test setup for tests/ and the doctests in allreduce_jax/: 8 emulated CPU devices, fixed
before any JAX backend starts."""

import os
import shutil
import signal
import tempfile

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite's emulated clusters check plumbing, not time: they need not wait for a
# measuring cluster (allreduce-jax cluster --concurrent).
os.environ.setdefault("ALLREDUCE_JAX_CLUSTER_CONCURRENT", "1")

import jax

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_dtype_promotion", "strict")

# Start the backend now: a command run in-process later with --devices N < 8 would
# otherwise shrink this test worker's device count for every test after it.
jax.devices()


def pytest_configure(config):
  """Ctrl-C reaches the programs the tests start, however the suite was started: a
  background job of a non-interactive shell (``nohup make test &``) begins with SIGINT
  ignored, every child would inherit that, and the tests that interrupt a launcher,
  a cluster or a bench with SIGINT would wait for an exit that never comes."""
  if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_stay_in_the_session(tmp_path_factory):
  """Points ``TMPDIR`` (and :mod:`tempfile`) at a directory of this test session,
  removed at its end: the launcher's per-process logs (kept for a user, in a fresh
  ``allreduce-jax-launch-*`` directory of every run), the doctests' scratch files and
  those of every subprocess a test starts do not pile up in ``/tmp``."""
  tmp = tmp_path_factory.mktemp("tmpdir")
  saved = os.environ.get("TMPDIR"), tempfile.tempdir
  os.environ["TMPDIR"] = tempfile.tempdir = str(tmp)
  yield
  if saved[0] is None:
    os.environ.pop("TMPDIR", None)
  else:
    os.environ["TMPDIR"] = saved[0]
  tempfile.tempdir = saved[1]
  shutil.rmtree(tmp, ignore_errors=True)
