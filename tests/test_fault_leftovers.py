"""What ``cpu:`` faults leave on the machine, removed whoever ends the run.

A cluster killed (even by SIGKILL) leaves its ``cpu:`` fault's cgroup behind unless
its watchdog removes it; ``cluster down`` removes what a dead cluster left; on cgroup
v2 the ``+cpu`` a run wrote to the root's ``cgroup.subtree_control`` is taken back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from allreduce_jax import netns
from allreduce_jax.cli import main
from allreduce_jax.tools import cluster, faults

ROOT = Path(__file__).resolve().parents[1]
# Every host all-gathers in a loop for about `seconds` (the cluster is killed during it).
LOOPER = """
import sys, time
from allreduce_jax import distributed
distributed.initialize_from_env()
import numpy as np
from jax.experimental import multihost_utils
end = time.monotonic() + float(sys.argv[1])
x = np.ones(1000, np.float32)
while True:
  x[-1] = time.monotonic() > end
  if multihost_utils.process_allgather(x)[:, -1].any():
    break
"""


@pytest.fixture
def privileged():
  problem = netns.root_problem()
  if problem:
    pytest.skip(f"cluster as root: {problem}")
  if faults.cgroup_version() is None:
    pytest.skip("no CPU cgroup controller on this machine")


def _dead_pid() -> int:
  proc = subprocess.Popen(["true"])
  proc.wait()
  return proc.pid


def _cgroup_root() -> Path:
  return faults.CGROUP if faults.cgroup_version() == 2 else faults.CGROUP / "cpu"


@pytest.mark.timeout(200)
def test_a_killed_clusters_cpu_cgroup_is_removed_by_its_watchdog(privileged, tmp_path):
  script, logs = tmp_path / "looper.py", tmp_path / "logs"
  script.write_text(LOOPER)
  argv = [sys.executable, "-m", "allreduce_jax", "cluster", "--hosts", "2", "--concurrent",
          "--log-dir", str(logs), "--fault", "cpu:1=0.5@0.2", "--", sys.executable, str(script),
          "120"]  # fmt: skip
  proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  tag = netns.tag_for(proc.pid)
  try:
    deadline = time.monotonic() + 150
    while not (logs / "faults.jsonl").exists():
      assert proc.poll() is None and time.monotonic() < deadline, "the cpu fault never applied"
      time.sleep(0.1)
    (row,) = map(json.loads, (logs / "faults.jsonl").read_text().splitlines())
    assert row["event"] == "cpu" and "failed" not in row["what"], row
    assert faults.cgroups(f"{tag}-"), "no cgroup made"
    proc.kill()  # SIGKILL: no clean-up of its own
    proc.wait()
    deadline = time.monotonic() + 15
    while faults.cgroups(f"{tag}-") or netns.leftovers(tag):
      assert time.monotonic() < deadline, (faults.cgroups(f"{tag}-"), netns.leftovers(tag))
      time.sleep(0.1)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
    faults.remove_cgroups(f"{tag}-")
    netns.down(tag)


def test_cluster_down_removes_a_dead_clusters_cgroups(privileged, capsys):
  tag = netns.tag_for(_dead_pid())
  group = _cgroup_root() / f"{tag}-host1"
  group.mkdir()
  try:
    assert main(["cluster", "down"]) == 0
    assert f"removed 1 cluster(s): {tag}" in capsys.readouterr().out
    assert not group.exists()
  finally:
    if group.exists():
      group.rmdir()


def _fake_v2(tmp_path, monkeypatch, controllers: str) -> Path:
  """A cgroup v2 root in a temp folder: its subtree_control holds ``controllers``."""
  root = tmp_path / "cgroup"
  root.mkdir()
  (root / "cgroup.controllers").write_text("cpu io memory\n")
  (root / "cgroup.subtree_control").write_text(controllers)
  monkeypatch.setattr(faults, "CGROUP", root)
  monkeypatch.setattr(faults, "CPU_NOTES", tmp_path / "notes")
  return root


def test_on_cgroup_v2_the_cpu_controller_a_run_enabled_is_disabled_again(tmp_path, monkeypatch):
  root = _fake_v2(tmp_path, monkeypatch, "io memory\n")
  faults._enable_cpu_controller("arj-7")
  assert (root / "cgroup.subtree_control").read_text() == "+cpu"  # what a write does here
  assert faults.remove_cgroups("arj-8-") == [] and (faults.CPU_NOTES / "arj-7").exists()
  faults.remove_cgroups("arj-7-")
  assert (root / "cgroup.subtree_control").read_text() == "-cpu"
  assert not (faults.CPU_NOTES / "arj-7").exists()
  # Enabled before the run: left as it was.
  (root / "cgroup.subtree_control").write_text("cpu io memory\n")
  faults._enable_cpu_controller("arj-9")
  faults.remove_cgroups("arj-9-")
  assert (root / "cgroup.subtree_control").read_text() == "cpu io memory\n"


def test_the_watchdog_of_a_killed_cluster_removes_its_cgroups_and_restores_v2(tmp_path,
                                                                              monkeypatch):  # fmt: skip
  root = _fake_v2(tmp_path, monkeypatch, "io\n")
  faults._enable_cpu_controller("arj-7")
  (root / "arj-7-host1").mkdir()
  (root / "cpu").mkdir()
  (root / "cpu" / "arj-7-host2").mkdir()  # (a v1 layout beside it: both are looked at)
  (root / "arj-70-host1").mkdir()  # another cluster's: kept
  watchdog = subprocess.Popen([sys.executable, "-c", cluster._WATCHDOG, "arj-7", str(root),
                               str(faults.CPU_NOTES)], stdin=subprocess.PIPE)  # fmt: skip
  watchdog.stdin.close()  # as when the cluster command dies
  assert watchdog.wait(30) == 0
  assert not (root / "arj-7-host1").exists() and not (root / "cpu" / "arj-7-host2").exists()
  assert (root / "arj-70-host1").exists()
  assert (root / "cgroup.subtree_control").read_text() == "-cpu"
  assert not (faults.CPU_NOTES / "arj-7").exists()
