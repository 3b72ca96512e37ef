"""Trust: rows never deleted, one writer per file, exact
max/min below 1e-38, identical NaN bits, the right process blamed, one-line errors."""

from __future__ import annotations

import json

import pytest

from allreduce_jax import cost_model
from allreduce_jax.cli import main
from allreduce_jax.results import RowsError, RowStore, release_locks


def _keys(path):
  return [json.loads(line)["key"] for line in path.read_text().splitlines()]


# ---------------------------------------------------------------- 1. rows never deleted


def test_the_readme_scaling_commands_share_one_file(tmp_path, monkeypatch):
  monkeypatch.setenv(cost_model.FIT_ENV_VAR, str(tmp_path / "none.json"))
  out = tmp_path / "s.jsonl"
  assert main(["scaling", "--smoke", "--out", str(out)]) == 0
  first = _keys(out)
  assert main(["scaling", "--smoke", "--topology", "switch", "--out", str(out)]) == 0
  both = _keys(out)
  assert both[: len(first)] == first and len(both) > len(first)  # appended, none deleted
  assert main(["scaling", "--smoke", "--out", str(out)]) == 0  # a rerun resumes: nothing new
  assert _keys(out) == both
  assert main(["scaling", "--smoke", "--fresh", "--out", str(out)]) == 0  # only --fresh empties
  assert _keys(out) == first


def test_verify_ring_then_tree_into_one_file(tmp_path):
  out = tmp_path / "v.jsonl"
  argv = ["verify", "--devices", "2", "--ops", "sum", "--dtypes", "float32", "--kinds"]
  argv += ["verifiable", "--shapes", "3", "--out", str(out)]
  assert main([*argv, "--algorithms", "ring"]) == 0
  assert main([*argv, "--algorithms", "tree"]) == 0
  algorithms = [json.loads(line)["algorithm"] for line in out.read_text().splitlines()]
  assert algorithms == ["ring", "tree"]


def test_a_second_writer_is_locked_out_with_one_line(tmp_path):
  path = tmp_path / "b.jsonl"
  first = RowStore(path, "bench", context={})
  first.lock()
  try:
    with pytest.raises(RowsError, match="another allreduce-jax run is writing this file"):
      RowStore(path, "bench", context={}).lock()
    argv = ["bench", "--devices", "2", "--algorithms", "ring", "-b", "1KiB", "-e", "1KiB"]
    with pytest.raises(SystemExit, match=r"^--out: .*b\.jsonl: another allreduce-jax run"):
      main([*argv, "--out", str(path)])
  finally:
    first.unlock()
  assert not path.exists()  # the lock made the file; nothing written, so it is gone again
  second = RowStore(path, "bench", context={})
  second.lock()  # free again
  second.append({"n": 1}, second.key(n=1))
  release_locks()
  assert path.exists()


def test_a_full_disk_is_one_line_and_keeps_the_rows(tmp_path, monkeypatch):
  import errno
  import os

  store = RowStore(tmp_path / "r.jsonl", "bench", context={})
  store.append({"n": 1}, store.key(n=1))
  real_write = os.write

  def full(fd, data):
    real_write(fd, bytes(data)[:7])  # part of a row reaches the disk, then no space
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "write", full)
  with pytest.raises(RowsError, match="cannot be written \\(the disk is full\\); the rows"):
    store.append({"n": 2}, store.key(n=2))
  monkeypatch.undo()
  assert [r["n"] for r in store.rows()] == [1]  # no half row left
  assert store.path.read_text().endswith("\n")


# ----------------------------------------------- 2./3. subnormal max/min, identical NaN bits

ALGS = ("ring", "recursive_doubling", "tree", "double_binary_tree", "auto")


def _all_reduce(x, ops, algorithm, p):
  """``x``: host ``T[p, ...]``; each op's result on every participant, ``T[p, ...]``
  (one program for all ``ops``)."""
  import jax
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from allreduce_jax import all_reduce

  ops = (ops,) if isinstance(ops, str) else tuple(ops)
  mesh = jax.make_mesh((p,), ("i",), devices=jax.devices()[:p])
  xs = jax.device_put(x, NamedSharding(mesh, P("i")))  # bits as given: no XLA op on the host

  def body(b):  # b: T[1, ...]
    return tuple(all_reduce(b[0], "i", op=op, algorithm=algorithm)[None] for op in ops)

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
  out = [np.asarray(y) for y in f(xs)]
  return out[0] if len(out) == 1 else out


def _u(a):
  return a.view(f"u{a.dtype.itemsize}")


@pytest.mark.parametrize("algorithm", ALGS)
def test_max_min_of_subnormals_match_the_oracle(algorithm):
  import jax.numpy as jnp
  import numpy as np

  from allreduce_jax._ops import oracle

  for dtype in (np.float32, jnp.bfloat16, np.float16):
    tiny = float(jnp.finfo(dtype).smallest_subnormal)
    x = (np.array([[1, -3], [2, 0], [3, -2], [4, -1]], np.float64) * 7 * tiny).astype(dtype)
    for op, got in zip(("max", "min"), _all_reduce(x, ("max", "min"), algorithm, 4)):
      want = oracle(op, x)
      assert (_u(got) == _u(want)).all(), (jnp.dtype(dtype).name, op, got, want)


def test_max_min_compare_bits_for_float64_and_float8():
  import jax
  import jax.numpy as jnp
  import numpy as np

  from allreduce_jax._ops import get_op, oracle

  with jax.enable_x64(True):
    tiny = np.finfo(np.float64).smallest_subnormal
    a, b = np.float64(tiny), np.float64(2 * tiny)
    assert float(jax.jit(get_op("max", jnp.float64).combine)(a, b)) == 2 * tiny
    assert float(jax.jit(get_op("min", jnp.float64).combine)(-a, -b)) == -2 * tiny
  for dtype in (jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.float8_e4m3fnuz, jnp.float8_e8m0fnu):
    x = np.array([[0.5], [-2.0], [0.25], [1.0]]).astype(dtype)  # e8m0: |x| (no sign)
    for op, got in zip(("max", "min"), _all_reduce(x, ("max", "min"), "ring", 4)):
      want = oracle(op, x)  # all_reduce crashed in jnp.signbit
      assert (_u(got) == _u(want)).all(), (jnp.dtype(dtype).name, op, got, want)


def test_sums_of_subnormals_are_flushed_like_psum_on_purpose():
  # Kept on purpose (allreduce_jax/_ops.py, README): XLA:CPU adds with denormals as zero.
  import numpy as np

  x = (np.array([[1.0], [2.0], [3.0], [4.0]]) * 1e-40).astype(np.float32)
  for algorithm in ("ring", "recursive_doubling", "psum"):
    assert (_all_reduce(x, "sum", algorithm, 4) == 0).all()


def _nan(bits):
  import numpy as np

  return np.array([bits], np.uint32).view(np.float32)[0]


@pytest.mark.parametrize("algorithm", ALGS)
def test_nan_bits_are_identical_on_every_participant(algorithm):
  import numpy as np

  two = np.array([[np.nan], [-np.nan]], np.float32)
  four = np.array(
    [[np.inf, _nan(0xFFC00001)], [-np.inf, 1.0], [np.nan, _nan(0x7FC00123)], [0.0, -np.inf]],
    np.float32,
  )
  ops = ("sum", "mean", "max", "min")
  for x in (two, four):
    for op, got in zip(ops, _all_reduce(x, ops, algorithm, len(x))):
      got = _u(got)
      assert (got == got[0]).all(), (op, [hex(v) for v in got.reshape(-1)])
      assert (got == 0x7FC00000).all()  # the canonical quiet NaN


def test_verify_compares_nan_bits_across_participants():
  import numpy as np

  from allreduce_jax.tools import compare, verify

  a = np.array([np.nan], np.float32)
  assert compare.same_bits(a, -a) and not compare.identical(a, -a)
  rows = verify.run_case(
    "recursive_doubling", 4, ops=("sum", "max"), dtypes=("float32",),
    kinds=("special", "subnormal"), shapes=((5,),),
  )  # fmt: skip
  assert {r.kind for r in rows} == {"special", "subnormal"}
  assert all(r.passed and r.replicas_identical for r in rows), [r.detail for r in rows]


# ------------------------------------------------------------- 5. errors that name the problem


@pytest.mark.parametrize("axis", ["Data", "nope", 0, None])
def test_a_mistyped_axis_is_all_reduces_error_everywhere(axis):
  import jax
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P

  from allreduce_jax import all_reduce, all_reduce_gradients, all_reduce_tree

  mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
  tx = all_reduce_gradients(axis)
  calls = {
    "all_reduce": lambda g: all_reduce(g["w"], axis),
    "all_reduce_tree": lambda g: all_reduce_tree(g, axis),
    "update": lambda g: tx.update(g, tx.init(g))[0],
  }
  messages = {}
  g = jax.device_put({"w": jnp.ones(2)}, jax.NamedSharding(mesh, P("data")))
  for name, call in calls.items():
    f = jax.shard_map(call, mesh=mesh, in_specs=P("data"), out_specs=P("data"))
    with pytest.raises((ValueError, TypeError)) as e:
      jax.jit(f)(g)
    messages[name] = str(e.value)
  assert len(set(messages.values())) == 1, messages  # the same clear error, not an assert
  assert repr(axis) in messages["all_reduce"] and "axis" in messages["all_reduce"]


def _multisteps_train(tx, typed):
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  mesh = jax.make_mesh((4,), ("data",), devices=jax.devices()[:4])
  xs = jax.device_put(jnp.arange(24.0).reshape(8, 3), NamedSharding(mesh, P("data")))

  @jax.jit
  @jax.shard_map(mesh=mesh, in_specs=(P(), P(), P("data")), out_specs=(P(), P()), check_vma=typed)
  def step(p, s, xb):
    mine = jax.tree.map(lambda a: lax.pcast(a, "data", to="varying"), p) if typed else p
    g = jax.grad(lambda q: jnp.sum((q["w"] * xb) ** 2))(mine)  # per-device gradients
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  p = {"w": jnp.ones(3)}
  s = tx.init(p)
  with jax.numpy_dtype_promotion("standard"):  # MultiSteps mixes int and float
    for _ in range(4):
      p, s = step(p, s, xs)
  return np.asarray(p["w"])


def test_multisteps_under_typed_shard_map_names_its_branch_typing_and_the_fix():
  import numpy as np
  import optax

  from allreduce_jax import all_reduce_gradients
  from allreduce_jax.gradients import AlreadyReducedError

  def outer():
    return optax.MultiSteps(optax.chain(all_reduce_gradients("data"), optax.adam(0.1)), 2)

  with pytest.raises(AlreadyReducedError, match=r"inside optax\.MultiSteps under typed shard_map"):
    _multisteps_train(outer(), typed=True)
  want = _multisteps_train(outer(), typed=False)  # the documented order without typing
  inner = optax.chain(all_reduce_gradients("data"), optax.MultiSteps(optax.adam(0.1), 2))
  np.testing.assert_allclose(_multisteps_train(inner, typed=True), want, rtol=1e-6)  # the fix
  assert not np.allclose(want, 1.0)  # it trained


# ---------------------------------------------------------------------- 7. vmap like psum


@pytest.mark.parametrize("algorithm", ["ring", "tree", "double_binary_tree", "auto"])
def test_all_reduce_under_vmap_works_like_psum(algorithm):
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax import lax

  from allreduce_jax import all_reduce

  x = jnp.arange(15.0).reshape(5, 3)
  want = jax.vmap(lambda b: lax.psum(b, "i"), axis_name="i")(x)
  got = jax.vmap(lambda b: all_reduce(b, "i", algorithm=algorithm), axis_name="i")(x)
  np.testing.assert_array_equal(got, want)
  biggest = jax.vmap(lambda b: all_reduce(b, "i", op="max", algorithm=algorithm), axis_name="i")
  np.testing.assert_array_equal(biggest(x), np.broadcast_to(np.max(x, 0), x.shape))


# ------------------------------------- 6./7. one line, non-zero, never a traceback: the sweep


def _outcome(argv, capsys):
  """``(exit status, the error line, everything printed)`` of ``allreduce-jax ARGV``."""
  try:
    rc, message = main(argv), ""
  except SystemExit as e:
    rc = e.code if isinstance(e.code, int) else 1
    message = "" if isinstance(e.code, int) or e.code is None else str(e.code)
  out, err = capsys.readouterr()
  lines = [line for line in err.splitlines() if line.strip() and not line.startswith("#")]
  return rc, message or (lines[-1] if lines else ""), message + out + err


@pytest.fixture
def bad(tmp_path):
  """Files a user may point options at by mistake."""
  import os

  (tmp_path / "notes.txt").write_text("my notes\n")
  (tmp_path / "empty.json").write_text("{}")
  (tmp_path / "folder").mkdir()
  os.mkfifo(tmp_path / "fifo.json")
  return tmp_path


def _sweep_cases(d):
  b = ["bench", "--devices", "2", "--algorithms", "ring", "--smoke", "--out", f"{d}/b.jsonl"]
  s = ["scaling", "--smoke", "--out", f"{d}/s.jsonl"]
  v = ["verify", "--devices", "2", "--ops", "sum", "--dtypes", "float32"]
  f = ["fusion", "--devices", "2", "--smoke", "--out", f"{d}/f.jsonl"]
  return [
    (["verify", "--algorithms", "bogus"], "bogus"),
    ([*v, "--shapes", "100000x100000"], "--shapes 100000x100000"),
    ([*v, "--shapes", "0"], "--shapes"),
    ([*v, "--participants", "99"], "--participants"),
    ([*v, "--out", f"{d}/notes.txt"], "--out"),
    (["verify", "--devices", "9999"], "--devices 9999: at most 512"),
    (["bench", "-b", "64GiB", "-e", "64GiB", "--devices", "2", "--out", f"{d}/b.jsonl"], "GiB"),
    (["bench", "--devices", "3", "--algorithms", "hierarchical"], "no mesh at p=3"),
    ([*b, "--params", f"{d}/missing.json"], "no such file"),
    ([*b, "--params", f"{d}/folder"], "is a folder"),
    ([*b, "--params", f"{d}/fifo.json"], "not a regular file"),
    ([*b, "--params", f"{d}/empty.json"], "not a cost-parameter file"),
    ([*b, "--plot", f"{d}/notes.txt"], "not a figure file"),
    (["bench", "--devices", "9999", "--smoke"], "--devices 9999: at most 512"),
    (["bench", "--min-bytes", "3XB"], "--min-bytes"),
    (["bench", "--iters", "0"], "--iters"),
    ([*b, "--out", f"{d}/notes.txt"], "--out"),
    ([*f, "--plot", f"{d}/notes.txt"], "not a figure file"),
    ([*f, "--out", f"{d}/notes.txt"], "--out"),
    (["fusion", "--devices", "9999"], "--devices 9999"),
    (["audit", "--ps", "0"], "--ps"),
    (["audit", "--bytes", "3"], "--bytes 3"),
    (["audit", "--out", f"{d}/notes.txt"], "--out"),
    ([*s, "--topology", "fat_tree:8:nan"], "fat_tree:8:nan"),
    ([*s, "--topology", "switch", "--hop-latency-us=-1"], "--hop-latency-us"),
    ([*s, "--params", f"{d}/fifo.json"], "not a regular file"),
    ([*s, "--params", f"{d}/empty.json"], "not a cost-parameter file"),
    ([*s, "--plot", f"{d}/notes.txt"], "not a figure file"),
    ([*s, "--inner", "fast"], "--inner"),
    (["train", "sync", "--smoke", "--bucket-bytes", "-5", "--out", f"{d}/t"], "bucket_bytes=-5"),
    (["train", "sync", "--smoke", "--workers", "16", "--out", f"{d}/t"], "--workers 16"),
    (["train", "sync", "--steps", "x"], "--steps"),
    (["report", "--out", f"{d}/notes.txt"], "is a file"),
    (["report", "--out", f"{d}/notes.txt/sub"], "cannot create the folder"),
    (["report", "--only", "nope", "--out", f"{d}/r"], "--only"),
    (["launch", "-n", "0", "--", "verify"], "-n/--num-processes"),
    (["launch", "-n", "2"], "give the command to run"),
    (["cluster", "--hosts", "0", "--", "verify"], "--hosts must be at least 1"),
    (["cluster", "--hosts", "2"], "give the command to run"),
  ]


def test_bad_inputs_over_every_subcommand_are_one_line_without_a_traceback(bad, capsys):
  from allreduce_jax.tools import COMMANDS

  cases = _sweep_cases(bad)
  assert {argv[0] for argv, _ in cases} == set(COMMANDS)  # every subcommand is swept
  for argv, expected in cases:
    rc, line, printed = _outcome(argv, capsys)
    assert rc not in (0, None), (argv, printed)
    assert "Traceback" not in printed, (argv, printed)
    assert expected in line and "\n" not in line, (argv, line, printed)
  assert not (bad / "b.jsonl").exists() and not (bad / "s.jsonl").exists()  # nothing written


def test_bench_algorithms_are_deduplicated_and_smoke_lets_explicit_options_win(tmp_path):
  out = tmp_path / "b.jsonl"
  argv = ["bench", "--devices", "2", "--algorithms", "ring,ring", "--smoke", "--no-uneven"]
  assert main([*argv, "-e", "1KiB", "--iters", "2", "--out", str(out)]) == 0
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [(r["algorithm"], r["bytes"], r["iters"]) for r in rows] == [("ring", 1024, 2)]


def test_ctrl_c_in_every_subcommand_exits_130_with_one_line(monkeypatch, capsys):
  import importlib

  from allreduce_jax.tools import COMMANDS

  def interrupted(args):
    raise KeyboardInterrupt

  for name, (module, _) in COMMANDS.items():
    monkeypatch.setattr(importlib.import_module(module), "run", interrupted)
    argv = [
      name,
      *(["sync"] if name == "train" else []),
      *(["-n", "1"] if name == "launch" else []),
    ]
    rc, line, printed = _outcome(argv, capsys)
    assert rc == 130 and line == f"allreduce-jax {name}: interrupted (Ctrl-C).", printed
    assert "Traceback" not in printed


def test_a_full_disk_during_a_command_is_one_line(tmp_path, monkeypatch, capsys):
  import errno
  import os

  def full(fd):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "fsync", full)
  rc, line, printed = _outcome(["scaling", "--smoke", "--out", str(tmp_path / "s.jsonl")], capsys)
  assert rc == 1 and "Traceback" not in printed
  assert line.startswith("allreduce-jax scaling: ") and "the disk is full" in line, line


@pytest.mark.timeout(120)
def test_ctrl_c_while_bench_measures_exits_130_in_one_line(tmp_path):
  import signal
  import subprocess
  import sys
  import time
  from pathlib import Path

  out = tmp_path / "b.jsonl"
  cmd = [sys.executable, "-m", "allreduce_jax", "bench", "--devices", "2", "-b", "1KiB"]
  cmd += ["-e", "1GiB", "-f", "2", "--algorithms", "ring,psum", "--out", str(out)]
  root = Path(__file__).resolve().parents[1]
  proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  try:
    deadline = time.monotonic() + 90
    while not (out.exists() and out.read_text().count("\n") >= 2):  # mid-sweep
      assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
      time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()  # reap it, close its pipes: no ResourceWarning in a later test
  err = err.decode()
  assert proc.returncode == 130, err
  assert "Traceback" not in err and err.strip().splitlines()[-1] == (
    "allreduce-jax bench: interrupted (Ctrl-C)."
  )
  assert out.read_text().count("\n") >= 2  # the rows measured before stay


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_lost_in_a_gc_callback_stops_at_the_next_row(tmp_path):
  # Python ignores an exception raised in a garbage-collection callback (JAX has one); a
  # Ctrl-C that lands there must still stop the sweep: the next row written raises it.
  import gc

  from allreduce_jax import results

  store = results.RowStore(tmp_path / "rows.jsonl", "bench")
  store.append({"x": 1}, store.key(x=1))

  def callback(phase, info):
    results.on_sigint(2, None)  # what cli.main's SIGINT handler does, then lost

  gc.callbacks.append(callback)
  try:
    gc.collect()  # "Exception ignored in: <function callback ...>": the interrupt is lost
  finally:
    gc.callbacks.remove(callback)
  try:
    with pytest.raises(KeyboardInterrupt):
      store.append({"x": 2}, store.key(x=2))
  finally:
    results.clear_interrupt()
  assert [r["x"] for r in store.rows()] == [1]  # the row measured before stays
  store.append({"x": 3}, store.key(x=3))  # after the command, rows are written again
