"""Bad input raises a clear error naming the argument and the valid choices."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import ALGORITHMS, OPS, all_reduce, all_reduce_gradients, all_reduce_tree
from allreduce_jax.devices import submesh


def _run(fn, dtype=jnp.float32, shape=(4, 3)):
  mesh = submesh((4,), ("i",))
  x = jax.device_put(jnp.zeros(shape, dtype), NamedSharding(mesh, P("i")))
  return jax.shard_map(fn, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x)


def test_unknown_op_lists_ops():
  with pytest.raises(ValueError, match=r"op='prod'.*\('sum', 'mean', 'max', 'min'\)"):
    _run(lambda b: all_reduce(b, "i", op="prod"))
  assert OPS == ("sum", "mean", "max", "min")


def test_unknown_algorithm_lists_algorithms():
  with pytest.raises(ValueError, match=r"algorithm='butterfly'.*'ring'"):
    _run(lambda b: all_reduce(b, "i", algorithm="butterfly"))


def test_non_numeric_dtype():
  with pytest.raises(TypeError, match="dtype bool"):
    _run(lambda b: all_reduce(b, "i"), dtype=jnp.bool_)


def test_integer_mean():
  with pytest.raises(TypeError, match=r"op=.mean.*integer"):
    _run(lambda b: all_reduce(b, "i", op="mean"), dtype=jnp.int32)


def test_unbound_axis_name_names_the_bound_ones():
  with pytest.raises(ValueError, match=r"axis_name 'j' is not bound.*\('i',\)"):
    _run(lambda b: all_reduce(b, "j"))


def test_axis_name_outside_shard_map():
  with pytest.raises(ValueError, match="not bound"):
    all_reduce(jnp.ones(3), "i")


def test_malformed_axis_name():
  with pytest.raises(TypeError, match="axis_name=3"):
    _run(lambda b: all_reduce(b, 3))


@pytest.mark.parametrize("axis_name", ["i", ("i",)])
def test_hierarchical_needs_two_axes(axis_name):
  with pytest.raises(ValueError, match=r"hierarchical.*tuple of at least 2 mesh axis names"):
    _run(lambda b: all_reduce(b, axis_name, algorithm="hierarchical"))


@pytest.mark.parametrize("bucket_bytes", [-1, 1.5, "4MiB", True])
def test_bad_bucket_bytes(bucket_bytes):
  with pytest.raises(ValueError, match="bucket_bytes"):
    _run(lambda b: all_reduce_tree({"a": b}, "i", bucket_bytes=bucket_bytes)["a"])


def test_registry_is_complete():
  expected = {
    "ring", "bidirectional_ring", "tree", "recursive_doubling", "halving_doubling",
    "naive", "hierarchical", "psum",
  }  # fmt: skip
  assert expected <= set(ALGORITHMS)


# ---- API edges: keyword-only options, explicit auto parameters ----


def test_positional_options_are_a_clear_type_error():
  with pytest.raises(TypeError, match=r"all_reduce\(\) takes op, algorithm and wire .*keyword"):
    _run(lambda b: all_reduce(b, "i", "sum"))
  with pytest.raises(
    TypeError, match=r"all_reduce_tree\(\) takes op, algorithm, bucket_bytes and wire"
  ):
    _run(lambda b: all_reduce_tree({"a": b}, "i", "mean", "ring")["a"])
  with pytest.raises(TypeError, match=r"all_reduce_gradients\(\) takes op"):
    all_reduce_gradients("i", "mean")


def test_signatures_show_keyword_only_options():
  import inspect

  for fn, names in [
    (all_reduce, ("op", "algorithm")),
    (all_reduce_tree, ("op", "algorithm", "bucket_bytes")),
    (all_reduce_gradients, ("op", "algorithm", "bucket_bytes")),
  ]:
    params = inspect.signature(fn).parameters
    for name in names:
      assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, (fn.__name__, name)
  assert inspect.signature(all_reduce).parameters["op"].default == "sum"
  assert inspect.signature(all_reduce_tree).parameters["op"].default == "sum"
  assert inspect.signature(all_reduce_gradients).parameters["op"].default == "mean"


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"op": "prod"}, "op='prod'"),
    ({"algorithm": "butterfly"}, "algorithm='butterfly'"),
    ({"bucket_bytes": -1}, "bucket_bytes"),
  ],
)
def test_all_reduce_gradients_checks_options_when_built(kwargs, match):
  with pytest.raises(ValueError, match=match):
    all_reduce_gradients("data", **kwargs)


def test_use_params_refuses_a_path():
  from allreduce_jax import cost_model

  with (
    pytest.raises(TypeError, match="load_params"),
    cost_model.use_params("results/cost_params.json"),
  ):
    pass


def test_auto_reads_no_file_and_no_environment(tmp_path, monkeypatch):
  """The same code picks the same algorithm wherever it is launched."""
  from allreduce_jax import cost_model

  latency_bound = cost_model.Params(500e-6, 1e-12, 0.0)
  path = tmp_path / "results" / "cost_params.json"
  cost_model.save_params(cost_model.FittedParams(latency_bound, {}, {}), path)
  monkeypatch.chdir(tmp_path)  # results/cost_params.json is right here
  monkeypatch.setenv(cost_model.FIT_ENV_VAR, str(path))
  assert cost_model.current_params() == cost_model.backend_params()
  with cost_model.use_params(latency_bound):
    assert cost_model.current_params() is latency_bound
  assert cost_model.current_params() == cost_model.backend_params()


def test_choose_never_picks_an_algorithm_the_fit_did_not_measure():
  """A fit on ring, recursive_doubling, halving_doubling, psum once chose
  bidirectional_ring (never measured) from 1 MiB on: auto picks only what was fitted."""
  from allreduce_jax import cost_model

  rows = [
    (a, 8, n, cost_model.predict_seconds(a, 8, n, cost_model.Params(20e-6, 1e-9, 0.0)))
    for a in ("ring", "recursive_doubling", "halving_doubling", "psum")
    for n in (1 << 10, 1 << 16, 1 << 22)
  ]
  fitted = cost_model.fit_all(rows)
  assert set(fitted.meta["algorithms"]) == {
    "ring",
    "recursive_doubling",
    "halving_doubling",
    "psum",
  }
  for n in (1 << 10, 1 << 20, 1 << 22, 1 << 24):
    assert cost_model.choose(8, n, fitted) in {"ring", "recursive_doubling", "halving_doubling"}
  with pytest.raises(ValueError, match="none of the candidates"):
    cost_model.choose(8, 1 << 20, fitted, candidates=("tree", "bidirectional_ring"))


def test_shipped_cpu_defaults_price_only_what_they_measured():
  from allreduce_jax import cost_model

  cpu = cost_model.backend_params("cpu")
  assert isinstance(cpu, cost_model.FittedParams)
  assert "ring" in cost_model.fitted_algorithms(cpu)
  assert "shipped CPU defaults" in cost_model.describe_params(cpu)
  for n in (1 << 10, 1 << 20, 1 << 26):
    assert cost_model.choose(8, n, cpu) in cost_model.fitted_algorithms(cpu)
  assert cost_model.backend_params("gpu") is cost_model.DEFAULT_PARAMS


def test_tree_and_gradients_outside_shard_map_name_the_unbound_axis():
  with pytest.raises(ValueError, match="not bound"):
    all_reduce_tree({"a": jnp.ones(3)}, "i")
  tx = all_reduce_gradients("i")
  with pytest.raises(ValueError, match="not bound"):
    tx.update({"a": jnp.ones(3)}, tx.init(None))
