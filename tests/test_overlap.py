"""allreduce_jax.overlap: the overlapped gradient equals today's step bit for bit, refuses bad
input with one line, and dispatches each bucket's all-reduce before the backward below it."""

import contextlib
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from overlap_contract import cases, check, inputs, loss_fn, same_bits

from allreduce_jax import all_reduce_tree, overlap
from allreduce_jax.devices import submesh

MESH_1D = ((4,), ("data",)), "data"
MESH_2D = ((2, 2), ("outer", "inner")), ("outer", "inner")
#: Every (algorithm, wire) pair with ALLREDUCE_JAX_OVERLAP_ALL=1; by default every algorithm
#: over the exact wire and each lossy wire over one algorithm (a compile of six programs per
#: check: every pair is about 15 minutes of CPU).
EVERY = os.environ.get("ALLREDUCE_JAX_OVERLAP_ALL", "") not in ("", "0")
LOSSY = {("ring", "int8"), ("two_shot", "fp8"), ("hierarchical", "bf16")}
PAIRS = [c for c in cases() if EVERY or c[1] is None or c[:2] in LOSSY]


def _mesh(axes):
  (shape, names), axis = MESH_1D if axes == 1 else MESH_2D
  return submesh(shape, names), axis


def _typings(k: int, algorithm: str, wire) -> list[tuple[bool, str]]:
  """(check_vma, op) to check pair k with: the exact ring under both typings, the others one
  each, alternating (check_vma on with mean, off with sum)."""
  both = [(True, "mean"), (False, "sum")]
  return both if (algorithm, wire) == ("ring", None) or EVERY else [both[k % 2]]


@pytest.mark.parametrize("algorithm, wire, axes", PAIRS)
def test_streams_equal_the_non_overlapped_step_bit_for_bit(algorithm, wire, axes):
  mesh, axis = _mesh(axes)
  for check_vma, op in _typings(PAIRS.index((algorithm, wire, axes)), algorithm, wire):
    assert check(mesh, axis, algorithm, wire, op, check_vma, "streams"), (check_vma, op)


@pytest.mark.parametrize(
  "mechanism, check_vma",
  [("thread", True), ("one_program", False), ("in_body", True), ("in_body", False)],
)
def test_every_mechanism_gives_the_same_bits(mechanism, check_vma):
  mesh, axis = _mesh(1)
  assert check(mesh, axis, "ring", None, "mean", check_vma, mechanism)


def test_hierarchical_in_body_on_two_axes():
  mesh, axis = _mesh(2)
  assert check(mesh, axis, "hierarchical", None, "sum", True, "in_body")


def _stacked_params(p):
  """train sync's layout: one copy of the parameters per participant, T[p, ...] on P(axis)."""
  mesh = submesh((p,), ("data",))
  params, x, y = inputs(mesh, "data")
  shard = NamedSharding(mesh, P("data"))
  stacked = jax.tree.map(
    lambda a: jax.device_put(jnp.broadcast_to(a, (p, *a.shape)), shard), params
  )
  return mesh, params, stacked, x, y


def test_parameters_one_copy_per_participant():
  _, params, stacked, x, y = _stacked_params(4)
  fn = overlap.value_and_grad(
    lambda q, x, y: loss_fn(jax.tree.map(lambda a: a[0], q), x, y), "data", bucket_bytes=600
  )
  loss, grads = fn(stacked, x, y)
  _, want = overlap.value_and_grad(loss_fn, "data", bucket_bytes=600)(params, x, y)
  assert loss.shape == (4,)  # each participant's own loss
  for g, w, q in zip(jax.tree.leaves(grads), jax.tree.leaves(want), jax.tree.leaves(stacked)):
    assert g.sharding.is_equivalent_to(q.sharding, g.ndim) and g.shape == (4, *w.shape)
    for row in np.asarray(g):
      np.testing.assert_array_equal(row, np.asarray(w))


def test_nnx_state_as_parameters():
  mesh = submesh((4,), ("data",))
  model = nnx.Sequential(
    nnx.Linear(6, 8, rngs=nnx.Rngs(0)), nnx.relu, nnx.Linear(8, 3, rngs=nnx.Rngs(1))
  )
  graphdef, params = nnx.split(model, nnx.Param)
  params = jax.device_put(params, NamedSharding(mesh, P()))
  rng = np.random.default_rng(1)
  x = jax.device_put(rng.normal(size=(16, 6)).astype(np.float32), NamedSharding(mesh, P("data")))
  y = jax.device_put(rng.integers(0, 3, 16), NamedSharding(mesh, P("data")))

  def loss(params, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(nnx.merge(graphdef, params)(x), y).mean()

  fn = overlap.value_and_grad(loss, "data", bucket_bytes=100, reduce_loss=True)
  got_loss, got = fn(params, x, y)
  assert isinstance(got, nnx.State)

  def body(params, x, y):
    mine = jax.lax.pcast(params, "data", to="varying")
    value, g = jax.value_and_grad(loss)(mine, x, y)
    out = all_reduce_tree({"g": g, "loss": value}, "data", op="mean", bucket_bytes=100)
    return out["loss"], out["g"]

  specs = (P(), P("data"), P("data"))
  want = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=(P(), P())))(params, x, y)
  assert same_bits((got_loss, got), want)


# ---- one-line errors naming the argument ----


def _placed():
  mesh = submesh((4,), ("data",))
  return mesh, inputs(mesh, "data")


def _one_line(excinfo, *words):
  text = str(excinfo.value)
  assert "\n" not in text
  for word in words:
    assert word in text, text


@pytest.mark.parametrize("bucket_bytes", [0, -5, 1.5, True, None])
def test_bucket_bytes_must_be_positive(bucket_bytes):
  with pytest.raises(ValueError) as e:
    overlap.value_and_grad(loss_fn, "data", bucket_bytes=bucket_bytes)
  _one_line(e, "bucket_bytes")


@pytest.mark.parametrize(
  "option, value", [("op", "prod"), ("algorithm", "rng"), ("mechanism", "cuda"), ("wire", "int4")]
)
def test_unknown_options(option, value):
  with pytest.raises(ValueError) as e:
    overlap.value_and_grad(loss_fn, "data", **{option: value})
  _one_line(e, option)


def test_options_are_keyword_only():
  with pytest.raises(TypeError, match="keyword"):
    overlap.value_and_grad(loss_fn, "data", "mean")


def test_loss_must_be_a_scalar():
  _, (params, x, y) = _placed()
  fn = overlap.value_and_grad(lambda p, x, y: x @ p[0]["w"], "data", bucket_bytes=600)
  with pytest.raises(ValueError) as e:
    fn(params, x, y)
  _one_line(e, "loss_fn", "scalar")


def test_parameters_must_be_float_arrays():
  _, (params, x, y) = _placed()
  fn = overlap.value_and_grad(loss_fn, "data", bucket_bytes=600)
  bad = [dict(params[0], b=jnp.arange(16)), params[1]]
  with pytest.raises(TypeError) as e:
    fn(bad, x, y)
  _one_line(e, "params[0]['b']", "int32")
  with pytest.raises(TypeError) as e:
    fn([{"w": "weights"}], x, y)
  _one_line(e, "params[0]['w']", "str")


def test_axis_must_be_bound():
  mesh, (params, x, y) = _placed()
  fn = overlap.value_and_grad(loss_fn, "model", bucket_bytes=600)
  with pytest.raises(ValueError) as e:  # outside jit: an axis of the arrays' mesh
    fn(params, x, y)
  _one_line(e, "axis_name 'model'", "not bound")
  body = jax.shard_map(fn, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=(P(), P()))
  with pytest.raises(ValueError) as e:  # inside a shard_map body: an axis of the body
    jax.jit(body)(params, x, y)
  _one_line(e, "axis_name 'model'", "not bound")


def test_arrays_must_be_placed_on_a_mesh_outside_jit():
  _, (params, x, y) = _placed()
  fn = overlap.value_and_grad(loss_fn, "data", bucket_bytes=600)
  with pytest.raises(TypeError) as e:
    fn(params, np.asarray(x), y)
  _one_line(e, "['batch'][0]", "NamedSharding")


# ---- structure: bucket k's all-reduce is dispatched before the backward below it ----

WIDTHS = (5, 6, 7, 8, 9)  # 4 layers whose shapes name them, one bucket each at 200 bytes


def _mlp(weights, x, y):
  for w in weights[:-1]:
    x = jnp.tanh(x @ w)
  return jnp.mean((x @ weights[-1] - y) ** 2)


def _four_layers():
  mesh = submesh((2,), ("data",))
  rng = np.random.default_rng(2)
  params = [rng.normal(size=(a, b)).astype(np.float32) for a, b in itertools.pairwise(WIDTHS)]
  x = rng.normal(size=(8, WIDTHS[0])).astype(np.float32)
  y = rng.normal(size=(8, WIDTHS[-1])).astype(np.float32)
  rep, shard = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  return jax.device_put(params, rep), jax.device_put(x, shard), jax.device_put(y, shard)


def _layer_of(shapes) -> int:
  (shape,) = shapes
  return WIDTHS.index(shape[-2])  # stacked outputs: T[p, a, b]


def test_each_bucket_is_sent_before_the_backward_of_the_layers_below(monkeypatch):
  """A layer per bucket: the dispatch order is forward, stage 0, reduce 0, stage 1, ...;
  stage k computes layer 3-k's gradients and no other's, with no collective; reduce k is
  dispatched on execution stream 1 with stage k's outputs, before stage k+1."""
  params, x, y = _four_layers()
  fn = overlap.value_and_grad(_mlp, "data", bucket_bytes=200, mechanism="streams")
  programs = fn.programs(params, x, y)
  assert len(programs.stages) == 4
  streams = []

  @contextlib.contextmanager
  def stream(i):
    streams.append(i)
    yield

  monkeypatch.setattr(overlap.xla_client, "execution_stream_id", stream)
  order = []
  programs.run(params, x, y, on_dispatch=lambda kind, i, outs: order.append((kind, i, outs)))
  kinds = [(kind, i) for kind, i, _ in order]
  assert kinds == [("forward", 0)] + [(k, s) for s in range(4) for k in ("stage", "reduce")]
  assert streams == [1, 1, 1, 1]
  for s in range(4):
    outs = order[1 + 2 * s][2]
    assert _layer_of([o.shape for o in outs]) == 3 - s  # the last layer first
    args = [jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for v in outs]
    hlo = programs.stages[s].lower(*_stage_args(programs, s, params, x, y)).compile().as_text()
    assert not re.search(r"all-reduce|collective-permute", hlo)
    # its layer's dW (f32[a, b]; the dX dots are f32[4, .], 4 rows a participant), no other
    dots = re.findall(r"= f32\[(\d+),(\d+)\]\{[^}]*\} dot\(", hlo)
    assert {(int(a), int(b)) for a, b in dots if a != "4"} == {(WIDTHS[3 - s], WIDTHS[4 - s])}
    reduce_hlo = programs.reduces[s].lower(args).compile().as_text()
    assert "collective-permute" in reduce_hlo and " dot(" not in reduce_hlo


def _stage_args(programs, s, params, x, y):
  """Stage ``s``'s arguments, from running the programs before it."""
  _, values = programs.forward(params, x, y)
  env = dict(zip(programs.forward_vars, values))
  for stage, program in zip(programs.backward.stages[:s], programs.stages[:s]):
    exports, _ = program(*[env[v] for v in stage.inputs])
    env.update(zip(stage.exports, exports))
  return [env[v] for v in programs.backward.stages[s].inputs]


def test_one_program_issues_each_bucket_after_its_stage():
  """The one-program form (GPU/TPU's) as handed to XLA: bucket k's permutes come before
  the next stage's dots, so the latency-hiding scheduler starts from the overlapped order."""
  params, x, y = _four_layers()
  fn = overlap.value_and_grad(_mlp, "data", bucket_bytes=200, mechanism="one_program")
  text = fn.programs(params, x, y).whole.lower(params, x, y).as_text()
  events = [m.group(0) for m in re.finditer(r"collective_permute|dot_general", text)]
  starts = [
    i for i, e in enumerate(events) if e == "collective_permute" and (i == 0 or events[i - 1] != e)
  ]
  assert len(starts) == 4  # four buckets, each a run of permutes ...
  assert all("dot_general" in events[i:] for i in starts[:-1])  # ... with backward after them


# ---- across processes ----


def test_contract_across_two_processes(tmp_path):
  """2 processes x 2 devices over gloo (p = 4, the hierarchical algorithm on processes x
  devices): tests/overlap_contract.py's plan (its ``--all`` checks every pair)."""
  script = Path(__file__).with_name("overlap_contract.py")
  launch = [sys.executable, "-m", "allreduce_jax", "launch", "-n", "2", "--local-devices", "2"]
  res = subprocess.run(
    [*launch, "--timeout", "500", "--output", "all", "--", sys.executable, str(script)],
    capture_output=True, text=True, timeout=560, cwd=tmp_path,
  )  # fmt: skip
  assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
  assert res.stdout.count(", 0 failed") == 2, res.stdout[-3000:]


# ---- train sync --overlap ----


def test_train_sync_overlap_same_sha256_and_resume(tmp_path, capsys):
  """`train sync --overlap` prints the parameters sha256 of the same run without it, also
  when it saves checkpoints and when it resumes from one."""
  import shutil

  from allreduce_jax.cli import main as cli_main

  sync = ["train", "sync", "--smoke", "--workers", "4", "--steps", "12", "--eval-every", "6"]
  sync += ["--bucket-bytes", "4096"]
  ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "4"]
  assert cli_main([*sync, "--out", str(tmp_path / "a")]) == 0
  assert cli_main([*sync, "--overlap", *ckpt, "--out", str(tmp_path / "b")]) == 0
  shutil.rmtree(tmp_path / "ckpt" / "seed-0" / "12")  # as if killed after step 8's save
  assert cli_main([*sync, "--overlap", *ckpt, "--out", str(tmp_path / "c")]) == 0
  out = capsys.readouterr().out
  assert "resumed from step [8]" in out
  digests = re.findall(r"parameters sha256 (\w+)", out)
  assert len(digests) == 3 and len(set(digests)) == 1, out
  assert cli_main([*sync[:-2], "--overlap", "--out", str(tmp_path / "d")]) == 2
  _one_line_text(capsys.readouterr().err, "--overlap", "--bucket-bytes")


def _one_line_text(text, *words):
  assert text.count("\n") == 1, text
  for word in words:
    assert word in text, text
