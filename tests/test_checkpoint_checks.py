"""Checkpoints that check what they restore.

A checkpoint carries the digest of its arrays, and a restore compares it: a flipped bit
in a data file is refused, not trained on. A checkpoint that cannot be read (a file
truncated, emptied or deleted) is one line naming the step and what to do, and nothing
of it is restored; a folder named like a step that is not a checkpoint is skipped. A
resume with another learning rate is refused like one of another model; a run's row
records every step range with its workers and learning rate; the last step is saved
whatever ``--checkpoint-every`` is.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from allreduce_jax.cli import main
from allreduce_jax.training import checkpoint, configs
from allreduce_jax.training import experiments as ex

ROOT = Path(__file__).resolve().parents[1]
SIZE = 1 << 16  # float32 values of the parameters: a data file of a few hundred KiB


def _state(step: int) -> checkpoint.State:
  w = np.random.default_rng(step).standard_normal(SIZE, np.float32)
  return checkpoint.State(step, {"w": w}, ({"m": w[:100] * 2},), examples=step, workers=1,
                          learning_rate=0.1, losses=[1.0])  # fmt: skip


def _restore(directory: Path):
  ck = checkpoint.Checkpoints(directory, 1, {"run": "damaged"})
  try:
    z = np.zeros(SIZE, np.float32)
    return ck.restore({"w": z}, ({"m": z[:100]},))  # an optimizer state is a tuple
  finally:
    ck.close()


def _saved(directory: Path, steps=(1,)) -> Path:
  ck = checkpoint.Checkpoints(directory, 1, {"run": "damaged"})
  for step in steps:
    ck.save(_state(step))
  ck.close()
  return directory / str(steps[-1])


def _largest_data_file(step_dir: Path) -> Path:
  return max((step_dir / "arrays").rglob("d/*"), key=lambda p: p.stat().st_size)


def _flip_a_bit(path: Path) -> None:
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 1
  path.write_bytes(bytes(data))


DAMAGE = {
  "a bit flipped": lambda s: _flip_a_bit(_largest_data_file(s)),
  "data truncated": lambda s: (f := _largest_data_file(s)).write_bytes(f.read_bytes()[:100]),
  "data emptied": lambda s: _largest_data_file(s).write_bytes(b""),
  "meta truncated": lambda s: (f := s / "meta" / "metadata").write_text(f.read_text()[:20]),
  "_METADATA deleted": lambda s: (s / "arrays" / "_METADATA").unlink(),
  "manifest deleted": lambda s: (s / "arrays" / "manifest.ocdbt").unlink(),
  "arrays/d deleted": lambda s: shutil.rmtree(s / "arrays" / "d"),
  "arrays deleted": lambda s: shutil.rmtree(s / "arrays"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_checkpoint_is_refused_in_one_line(tmp_path, damage):
  step = _saved(tmp_path, steps=(1, 2))
  assert _restore(tmp_path).step == 2  # undamaged: restored
  DAMAGE[damage](step)
  with pytest.raises(checkpoint.CheckpointError) as e:
    _restore(tmp_path)
  text = str(e.value)
  assert "\n" not in text and text.startswith(f"--checkpoint-dir {tmp_path}: step 2 ")
  assert ("is damaged" if damage == "a bit flipped" else "cannot be read (") in text
  assert f"remove {step}" in text


def test_a_folder_that_is_not_a_checkpoint_is_skipped(tmp_path, capsys):
  _saved(tmp_path, steps=(1, 2))
  (tmp_path / "5").mkdir()  # no checkpoint: a stray folder, newer than the good step 2
  (tmp_path / "5" / "notes.txt").write_text("not a checkpoint")
  state = _restore(tmp_path)
  assert state.step == 2 and np.array_equal(state.params["w"], _state(2).params["w"])
  assert f"skipping {tmp_path / '5'}: not a complete checkpoint" in capsys.readouterr().err
  assert (tmp_path / "5" / "notes.txt").exists()  # left as it is


def test_train_sync_on_a_damaged_checkpoint_is_one_line_and_exit_2(tmp_path):
  ck, out = tmp_path / "ck", tmp_path / "out"
  argv = ["train", "sync", "--smoke", "--workers", "2", "--steps", "4", "--eval-every", "2",
          "--checkpoint-dir", str(ck), "--checkpoint-every", "2"]  # fmt: skip
  assert main([*argv, "--out", str(out)]) == 0
  shutil.rmtree(ck / "seed-0" / "4")
  shutil.rmtree(ck / "seed-0" / "2" / "arrays" / "d")  # the reads that fail the most noisily
  res = subprocess.run([sys.executable, "-m", "allreduce_jax", *argv, "--out", str(out) + "2"],
                       capture_output=True, text=True, cwd=ROOT)  # fmt: skip
  assert res.returncode == 2, res.stderr[-3000:]
  assert res.stderr.count("\n") == 1, res.stderr[-3000:]  # no traceback, no noise
  assert f"--checkpoint-dir {ck / 'seed-0'}: step 2 cannot be read (" in res.stderr
  assert "sha256" not in res.stdout  # nothing trained


def test_resuming_with_another_learning_rate_is_refused_and_rows_record_every_rate(tmp_path):
  cfg = configs.SyncConfig.smoke(workers=4, steps=12, eval_every=4)
  ex.run_sync(cfg, 0, checkpoint_dir=tmp_path, checkpoint_every=4)
  shutil.rmtree(tmp_path / "seed-0" / "12")  # as if killed after step 8's save
  faster = configs.SyncConfig.smoke(workers=4, steps=12, eval_every=4, learning_rate=0.5)
  with pytest.raises(checkpoint.CheckpointError) as e:
    ex.run_sync(faster, 0, checkpoint_dir=tmp_path, checkpoint_every=4)
  assert "(step 8) is of another run (learning_rate=0.05; this run has learning_rate=0.5);" in (
    str(e.value)
  )
  assert str(e.value).endswith("resume with --learning-rate 0.05 or give an empty folder.")
  with pytest.raises(checkpoint.CheckpointError, match=r"learning_rate=0\.05; this run has"):
    ex.run_sync(configs.SyncConfig.smoke(workers=3, steps=12, eval_every=4, learning_rate=0.5),
                0, checkpoint_dir=tmp_path, checkpoint_every=4, elastic=True)  # fmt: skip
  three = configs.SyncConfig.smoke(workers=3, steps=12, eval_every=4)
  row = ex.run_sync(three, 0, checkpoint_dir=tmp_path, checkpoint_every=4, elastic=True)
  assert row["restarts"] == [8]
  assert row["segments"] == [
    {"from_step": 0, "to_step": 8, "workers": 4, "learning_rate": 0.05},
    {"from_step": 8, "to_step": 12, "workers": 3, "learning_rate": 0.05 * 3 / 4},
  ]
  assert row["config"]["learning_rate"] == 0.05  # the base rate given; segments: what trained


def test_the_last_step_is_saved_whatever_checkpoint_every_is(tmp_path):
  row = ex.run_sync(configs.SyncConfig.smoke(workers=2, steps=3), 0, checkpoint_dir=tmp_path,
                    checkpoint_every=1_000_000)  # fmt: skip
  assert sorted(p.name for p in (tmp_path / "seed-0").iterdir()) == ["3"]
  again = ex.run_sync(configs.SyncConfig.smoke(workers=2, steps=3), 0, checkpoint_dir=tmp_path,
                      checkpoint_every=1_000_000)  # fmt: skip
  assert again["restarts"] == [3] and again["params_sha256"] == row["params_sha256"]
  assert row["segments"] == [{"from_step": 0, "to_step": 3, "workers": 2, "learning_rate": 0.05}]


def test_a_folder_in_the_way_of_a_save_is_refused_before_training(tmp_path):
  (tmp_path / "seed-0" / "4").mkdir(parents=True)  # where step 4's checkpoint would go
  with pytest.raises(checkpoint.CheckpointError, match=r"seed-0/4 is not a complete checkpoint"):
    ex.run_sync(configs.SyncConfig.smoke(workers=2, steps=8), 0, checkpoint_dir=tmp_path,
                checkpoint_every=4)  # fmt: skip
