"""Gradients through all_reduce honour lax.psum's contract.

Every pattern is compared with the same program using ``lax.psum``/``lax.pmean``:
gradient inside the shard_map body and outside it, per-participant and replicated
(``in_specs=P()``) inputs, the reduced value used identically on every participant
("replicated" downstream) or mixed with per-participant data, ``check_vma`` True and
False, ``op`` sum and mean.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from allreduce_jax import all_reduce, all_reduce_gradients, all_reduce_tree, hlo, names
from allreduce_jax.devices import submesh
from allreduce_jax.fusion import InvariantLeafWarning
from allreduce_jax.gradients import AlreadyReducedError

NP = 4
REFERENCE = {"sum": lax.psum, "mean": lax.pmean}
HAND_WRITTEN = names(axes=1, hand_written=True)


def _mesh_and_inputs():
  mesh = submesh((NP,), ("i",))
  v = jnp.arange(1.0, 2 * NP + 1.0, dtype=jnp.float32) * jnp.float32(0.37)  # f32[2p]
  shard = jax.device_put(v, NamedSharding(mesh, P("i")))
  repl = jax.device_put(v, NamedSharding(mesh, P()))
  return mesh, shard, repl


def _reducer(name, op):
  if name == "lax":
    return lambda t: REFERENCE[op](t, "i")
  return lambda t: all_reduce(t, "i", op=op, algorithm=name)


def _inside(red, downstream):
  """jax.grad taken inside the body, of a loss built on the reduced value."""

  def loss(t, local):
    y = red(t * t + jnp.sin(t))
    if downstream == "replicated":
      return jnp.sum(y * y)
    return jnp.sum(y * local)  # mixed with per-participant data

  return lambda b: jax.grad(loss)(b, b)


CASES = [
  (op, input_kind, downstream)
  for op in ("sum", "mean")
  for input_kind in ("per_participant", "replicated")
  for downstream in ("replicated", "per_participant")
]


def _grads_inside(names, vma, cases=CASES):
  """One compiled program: every (reducer, case) gradient taken inside the body.

  Gradients of a replicated input are returned from every participant ([None] and
  out_specs P("i")) so all copies are compared. Few programs keep the test fast."""
  mesh, shard, repl = _mesh_and_inputs()

  def body(b, r):
    out = {}
    for name in names:
      for op, input_kind, downstream in cases:
        g = _inside(_reducer(name, op), downstream)
        key = f"{name}/{op}/{input_kind}/{downstream}"
        out[key] = g(b) if input_kind == "per_participant" else g(r)[None]
    return out

  f = jax.shard_map(body, mesh=mesh, in_specs=(P("i"), P()), out_specs=P("i"), check_vma=vma)
  return {k: np.asarray(v) for k, v in jax.jit(f)(shard, repl).items()}


@pytest.mark.parametrize("vma", [True, False], ids=["check_vma", "no_check_vma"])
def test_grad_inside_body_equals_psum(vma):
  """sum and mean; per-participant and replicated input; replicated and
  per-participant downstream use: 8 cases, each against lax.psum/lax.pmean."""
  got = _grads_inside(("lax", "ring"), vma)
  for op, input_kind, downstream in CASES:
    case = f"{op}/{input_kind}/{downstream}"
    np.testing.assert_allclose(
      got[f"ring/{case}"], got[f"lax/{case}"], rtol=1e-6, atol=1e-6, err_msg=case
    )


def test_every_algorithm_grad_inside_body_equals_psum():
  cases = [("sum", "per_participant", "replicated"), ("mean", "replicated", "per_participant")]
  got = _grads_inside(("lax", *HAND_WRITTEN), True, cases)
  for algorithm in HAND_WRITTEN:
    for op, input_kind, downstream in cases:
      case = f"{op}/{input_kind}/{downstream}"
      np.testing.assert_allclose(
        got[f"{algorithm}/{case}"],
        got[f"lax/{case}"],
        rtol=1e-6,
        atol=1e-6,
        err_msg=f"{algorithm} {case}",
      )


def test_issue_reproduction_values():
  mesh = submesh((NP,), ("i",))
  x = jax.device_put(jnp.arange(1.0, 9.0), NamedSharding(mesh, P("i")))
  for red in (lambda t: lax.psum(t, "i"), lambda t: all_reduce(t, "i", op="sum")):
    f = jax.shard_map(
      lambda b, red=red: jax.grad(lambda t: jnp.sum(red(t * t)))(b),
      mesh=mesh,
      in_specs=P("i"),
      out_specs=P("i"),
    )
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(x)), 2 * np.arange(1.0, 9.0))


@pytest.mark.parametrize("vma", [True, False], ids=["check_vma", "no_check_vma"])
def test_grad_outside_shard_map_equals_psum(vma):
  mesh, shard, _ = _mesh_and_inputs()
  outs = [P("i"), P()] if vma else [P("i")]
  for out_spec in outs:

    def loss(t, name, out_spec=out_spec):
      total = 0.0
      for op in ("sum", "mean"):
        g = jax.shard_map(
          lambda b, op=op: _reducer(name, op)(b * b),
          mesh=mesh,
          in_specs=P("i"),
          out_specs=out_spec,
          check_vma=vma,
        )
        total = total + jnp.sum(jnp.cos(g(t))) * (2.0 if op == "mean" else 1.0)
      return total

    with jax.set_mesh(mesh):
      got = {
        n: np.asarray(jax.jit(jax.grad(loss), static_argnums=1)(shard, n)) for n in ("lax", "ring")
      }
    np.testing.assert_allclose(got["ring"], got["lax"], rtol=1e-6, atol=1e-6)


def test_forward_bits_do_not_depend_on_check_vma():
  mesh = submesh((NP,), ("i",))
  x = jax.random.normal(jax.random.key(0), (NP, 37), jnp.float32)
  x = jax.device_put(x, NamedSharding(mesh, P("i")))
  outs = [
    jax.jit(
      jax.shard_map(
        lambda b: {a: all_reduce(b, "i", op="sum", algorithm=a) for a in HAND_WRITTEN},
        mesh=mesh,
        in_specs=P("i"),
        out_specs=P("i"),
        check_vma=vma,
      )
    )(x)
    for vma in (True, False)
  ]
  for a in HAND_WRITTEN:
    np.testing.assert_array_equal(np.asarray(outs[0][a]), np.asarray(outs[1][a]), err_msg=a)


def test_result_is_typed_like_psum():
  mesh, shard, _ = _mesh_and_inputs()
  types = {}

  def body(b):
    types["ring"] = jax.typeof(all_reduce(b, "i", op="sum")).mat.varying
    types["psum"] = jax.typeof(lax.psum(b, "i")).mat.varying
    return all_reduce(b, "i", op="sum")

  out = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P()))(shard)
  assert types["ring"] == types["psum"] == frozenset()
  np.testing.assert_allclose(np.asarray(out), np.asarray(shard).reshape(NP, 2).sum(0))


def test_backward_pass_communicates_with_ppermute_only():
  mesh, shard, _ = _mesh_and_inputs()
  f = jax.jit(
    jax.shard_map(
      _inside(_reducer("ring", "sum"), "replicated"),
      mesh=mesh,
      in_specs=P("i"),
      out_specs=P("i"),
    )
  )
  audit = hlo.audit(hlo.compiled_text(f, shard))
  assert audit.counts["all-reduce"] == 0
  assert audit.permutes == 2 * 2 * (NP - 1)  # the ring forward, and the ring in reverse


@pytest.mark.parametrize("vma", [True, False], ids=["check_vma", "no_check_vma"])
def test_jvp_and_hessian_vector_product_equal_psum(vma):
  mesh, shard, _ = _mesh_and_inputs()

  def derivatives(t, v, name):
    g = jax.shard_map(
      lambda b: _reducer(name, "sum")(b * b * b),
      mesh=mesh,
      in_specs=P("i"),
      out_specs=P("i"),
      check_vma=vma,
    )
    jvp = jax.jvp(g, (t,), (v,))[1]
    hvp = jax.jvp(jax.grad(lambda q: jnp.sum(g(q) ** 2)), (t,), (v,))[1]  # second order
    return jvp, hvp

  with jax.set_mesh(mesh):
    v = jnp.cos(shard)
    f = jax.jit(derivatives, static_argnums=2)
    res = {name: [np.asarray(a) for a in f(shard, v, name)] for name in ("lax", "ring")}
  for a, b in zip(res["ring"], res["lax"]):
    np.testing.assert_allclose(a, b, rtol=1e-5)


def test_vmap_inside_the_body():
  mesh = submesh((NP,), ("i",))
  x = jax.device_put(jnp.arange(NP * 6.0).reshape(NP * 2, 3), NamedSharding(mesh, P("i")))

  def body(b, red):  # b: f32[2, 3]; vmap over the 3 columns
    return jax.grad(lambda t: jnp.sum(jax.vmap(red, in_axes=1, out_axes=1)(t * t)))(b)

  got, want = (
    np.asarray(
      jax.jit(
        jax.shard_map(lambda b, red=red: body(b, red), mesh=mesh, in_specs=P("i"), out_specs=P("i"))
      )(x)
    )
    for red in (_reducer("ring", "sum"), _reducer("lax", "sum"))
  )
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_hierarchical_two_axes_grad_inside_equals_psum():
  mesh = submesh((2, 2), ("outer", "inner"))
  x = jax.device_put(jnp.arange(1.0, 9.0).reshape(4, 2), NamedSharding(mesh, P(("outer", "inner"))))
  axes = ("outer", "inner")
  reds = {
    "lax": lambda t: lax.psum(t, axes),
    "hier": lambda t: all_reduce(t, axes, op="sum", algorithm="hierarchical"),
  }
  got = {
    k: np.asarray(
      jax.jit(
        jax.shard_map(
          lambda b, red=red: jax.grad(lambda t: jnp.sum(red(t * t) ** 2))(b),
          mesh=mesh,
          in_specs=P(axes),
          out_specs=P(axes),
        )
      )(x)
    )
    for k, red in reds.items()
  }
  np.testing.assert_allclose(got["hier"], got["lax"], rtol=1e-6)


@pytest.mark.slow
def test_python_if_on_a_reduced_value_in_eager_shard_map():
  mesh, shard, _ = _mesh_and_inputs()

  def body(b, red):
    s = red(b)
    if s[0] > 0:  # needs a concrete value: only an invariant one has it
      return s
    return -s

  for red in (_reducer("lax", "sum"), _reducer("ring", "sum"), _reducer("tree", "mean")):
    out = jax.shard_map(lambda b, red=red: body(b, red), mesh=mesh, in_specs=P("i"), out_specs=P())(
      shard
    )
    assert np.all(np.asarray(out) > 0)


@pytest.mark.slow
def test_python_if_under_check_vma_false_fails_for_psum_too():
  """Documented limit: untyped, nothing is known to be equal across participants."""
  mesh, shard, _ = _mesh_and_inputs()
  for red in (_reducer("lax", "sum"), _reducer("ring", "sum")):

    def body(b, red=red):
      return red(b) if red(b)[0] > 0 else -red(b)

    with pytest.raises(jax.errors.TracerBoolConversionError):
      jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False)(shard)


@pytest.mark.parametrize("vma", [True, False], ids=["check_vma", "no_check_vma"])
def test_max_gradient_goes_to_the_selected_participant(vma):
  """lax.pmax has no differentiation rule; ours differentiates through the selections:
  once under check_vma=True (invariant result), once per participant under False."""
  mesh = submesh((NP,), ("i",))
  x = jax.device_put(
    jnp.array([1.0, 5.0, 2.0, 3.0, 4.0, 0.0, 7.0, 6.0]), NamedSharding(mesh, P("i"))
  )
  with pytest.raises(NotImplementedError, match="pmax"):
    jax.shard_map(
      lambda b: jax.grad(lambda t: jnp.sum(lax.pmax(t, "i")))(b),
      mesh=mesh,
      in_specs=P("i"),
      out_specs=P("i"),
      check_vma=vma,
    )(x)
  algorithms = ("ring", "tree", "recursive_doubling")

  def body(b):
    return [
      jax.grad(lambda t, a=a: jnp.sum(all_reduce(t, "i", op="max", algorithm=a)))(b)
      for a in algorithms
    ]

  grads = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=vma))(
    x
  )
  for g in grads:
    # column 0 holds [1, 2, 4, 7] -> 7 at index 6; column 1 holds [5, 3, 0, 6] -> 6 at 7
    want = np.zeros(8)
    want[6] = want[7] = 1.0 if vma else NP
    np.testing.assert_array_equal(np.asarray(g), want)


# ---- all_reduce_gradients and already-reduced (invariant) gradients ----


def _invariant_grads(check_vma, per_device, transform):
  """loss = sum(w * x_block); w = ones(3) replicated; x = arange(24).reshape(8, 3) sharded."""
  mesh = submesh((8,), ("data",))
  w = jax.device_put(jnp.ones(3), NamedSharding(mesh, P()))
  x = jax.device_put(jnp.arange(24.0).reshape(8, 3), NamedSharding(mesh, P("data")))

  def body(w, xb):
    if per_device:
      w = lax.pcast(w, "data", to="varying")
    g = jax.grad(lambda q: jnp.sum(q * xb))(w)
    return transform.update(g, transform.init(w))[0]

  f = jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data")), out_specs=P(), check_vma=check_vma)
  return np.asarray(jax.jit(f)(w, x))


@pytest.mark.parametrize("algorithm", ["ring", "psum"])
def test_invariant_gradients_raise_the_clear_error(algorithm):
  tx = all_reduce_gradients("data", algorithm=algorithm)
  with pytest.raises(
    AlreadyReducedError, match=r"already invariant.*SUMMED.*pcast.*check_vma=False"
  ):
    _invariant_grads(True, False, tx)


@pytest.mark.parametrize("check_vma, per_device", [(True, True), (False, False)])
def test_invariant_gradient_fixes_give_the_true_mean(check_vma, per_device):
  got = _invariant_grads(check_vma, per_device, all_reduce_gradients("data", algorithm="ring"))
  np.testing.assert_array_equal(got, [10.5, 11.5, 12.5])


def test_all_reduce_tree_warns_and_names_invariant_leaves():
  mesh = submesh((8,), ("data",))
  w = jax.device_put(jnp.ones(3), NamedSharding(mesh, P()))
  x = jax.device_put(jnp.arange(24.0).reshape(8, 3), NamedSharding(mesh, P("data")))

  def body(w, xb):
    g = jax.grad(lambda q: jnp.sum(q["w"] * xb))({"w": w})
    return all_reduce_tree(g, "data", op="mean")["w"]

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data")), out_specs=P()))
  with pytest.warns(InvariantLeafWarning, match=r"\['w'\] is already invariant over 'data'"):
    got = np.asarray(f(w, x))
  np.testing.assert_array_equal(got, [84.0, 92.0, 100.0])  # lax.pmean's answer too
  ref = jax.shard_map(
    lambda w, xb: lax.pmean(jax.grad(lambda q: jnp.sum(q * xb))(w), "data"),
    mesh=mesh,
    in_specs=(P(), P("data")),
    out_specs=P(),
  )
  np.testing.assert_array_equal(np.asarray(ref(w, x)), got)


def test_transform_is_stateless_and_takes_dicts_and_nnx_state():
  from flax import nnx

  mesh = submesh((NP,), ("data",))
  model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
  _, state = nnx.split(model, nnx.Param)
  tx = all_reduce_gradients("data", algorithm="tree")
  assert isinstance(tx.init(state), optax.EmptyState)
  grads = {"a": jnp.arange(NP * 2.0), "n": {"b": jnp.ones((NP, 2), jnp.bfloat16)}}
  grads = jax.device_put(grads, NamedSharding(mesh, P("data")))

  def body(g, s):
    out, _ = tx.update(g, tx.init(g))
    s_out, _ = tx.update(jax.tree.map(lambda a: a * 0 + 1, s), tx.init(s))
    return out, s_out

  st = jax.device_put(state, NamedSharding(mesh, P()))
  out, s_out = jax.jit(
    jax.shard_map(body, mesh=mesh, in_specs=(P("data"), P()), out_specs=(P(), P()), check_vma=False)
  )(grads, st)
  np.testing.assert_array_equal(np.asarray(out["a"]), [3.0, 4.0])
  assert out["n"]["b"].dtype == jnp.bfloat16
  assert type(s_out) is type(state)
  for leaf in jax.tree.leaves(s_out):
    np.testing.assert_array_equal(np.asarray(leaf), 1.0)


def test_transform_inside_optax_multisteps_matches_pmean():
  mesh = submesh((NP,), ("data",))
  params = {"w": jnp.zeros(3)}
  xs = jax.device_put(jnp.arange(NP * 2 * 3.0).reshape(NP * 2, 3), NamedSharding(mesh, P("data")))

  def train(first):
    tx = optax.MultiSteps(optax.chain(first, optax.sgd(0.1)), every_k_schedule=2)

    @jax.jit
    @jax.shard_map(mesh=mesh, in_specs=(P(), P(), P("data")), out_specs=(P(), P()), check_vma=False)
    def step(p, s, xb):
      g = jax.grad(lambda q: jnp.sum((q["w"] * xb) ** 2))(p)
      u, s = tx.update(g, s, p)
      return optax.apply_updates(p, u), s

    p, s = params, tx.init(params)
    with jax.numpy_dtype_promotion("standard"):  # MultiSteps mixes int and float
      for _ in range(4):
        p, s = step(p, s, xs)
    return np.asarray(p["w"])

  pmean = optax.GradientTransformation(
    lambda p: optax.EmptyState(), lambda u, s, p=None: (lax.pmean(u, "data"), s)
  )
  np.testing.assert_allclose(
    train(all_reduce_gradients("data", algorithm="halving_doubling")), train(pmean), rtol=1e-6
  )
