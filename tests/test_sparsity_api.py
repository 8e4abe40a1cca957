"""The Sparsifier registry, hyperparameter checks, selections that select
nothing, explicit layouts, and the one-schedule (learning_rate=None) chain."""
import re

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from fkjax import sparsity as sp
from tests.sparsity_params import LAYOUT, make_params

HPARAMS = {
    "none": {},
    "rvsm": dict(beta=0.5, lamb=2e-3),
    "rgsm": dict(beta=0.5, lamb1=6.25e-2, lamb2=1e-2),
    "admm": dict(rho=0.3, percent=50.0, structure="channel"),
}


# ------------------------------------------------------------- registry


def test_registry_names_and_classes():
  assert sorted(sp.METHODS) == ["admm", "none", "rgsm", "rvsm"]
  assert sp.METHODS["rgsm"] is sp.RGSM
  assert sp.RGSM.optimizer_only == {"lamb2"}
  assert sp.ADMM.optimizer_only == {"rho"}
  for name, hp in HPARAMS.items():
    s = sp.get_sparsifier(name, layout=LAYOUT, **hp)
    assert isinstance(s, sp.METHODS[name]) and s.name == name
    assert set(hp) <= set(s.hparams) == set(s.hparam_names)
    # hparams round-trips: it is what a log or a config holds.
    assert sp.get_sparsifier(name, layout=LAYOUT, **s.hparams) == s


def test_get_sparsifier_errors():
  with pytest.raises(ValueError, match="Unknown sparsification method 'l1'"):
    sp.get_sparsifier("l1")
  with pytest.raises(TypeError, match="unexpected hyperparameter.*lamb1"):
    sp.get_sparsifier("rvsm", beta=1.0, lamb=1e-3, lamb1=1.0)
  with pytest.raises(TypeError, match="lamb"):
    sp.get_sparsifier("rvsm", beta=1.0)
  with pytest.raises(TypeError, match="takes: none"):
    sp.get_sparsifier("none", beta=1.0)
  # The optimiser-only hyperparameters are needed by the optimiser only.
  s = sp.get_sparsifier("rgsm", beta=0.5, lamb1=0.1)
  s.project(make_params()["Conv_0"])  # fine without lamb2
  with pytest.raises(TypeError, match="lamb2"):
    s.optimizer(0.1)
  with pytest.raises(TypeError, match="rho"):
    sp.get_sparsifier("admm", percent=10.0).optimizer(0.1)
  with pytest.raises(ValueError, match="structure"):
    sp.get_sparsifier("admm", rho=1.0, percent=10.0, structure="filter")
  with pytest.raises(ValueError, match="channel group"):
    sp.get_sparsifier("rgsm", beta=1.0, lamb1=0.1, group="filters")


def test_from_config_reads_only_the_methods_keys():
  c = ml_collections.ConfigDict(dict(
      method="rgsm", beta=0.5, lamb=1e-6, lamb1=5e-2, lamb2=1e-5,
      group="output", rho=1e-2, percent=80.0, structure="element"))
  s = sp.from_config(c, layout=LAYOUT)
  assert s == sp.RGSM(beta=0.5, lamb1=5e-2, lamb2=1e-5, group="output",
                      layout=LAYOUT)
  c.method = "admm"
  assert sp.from_config(c).hparams == dict(rho=1e-2, percent=80.0,
                                           structure="element", group="output",
                                           variant="exact")
  # ADMM's variant has its own key in the shared section.
  c.admm_variant = "authors"
  assert sp.from_config(c).variant == "authors"
  c.method = "nope"
  with pytest.raises(ValueError, match="Unknown sparsification method"):
    sp.from_config(c)


def _old_chain(method, lr, hp):
  """The paper's chain built from the public pieces, in the documented
  order."""
  kw = dict(layout=LAYOUT)
  before, after = [], []
  if method == "rvsm":
    after = [sp.l0_split(hp["beta"], hp["lamb"], lr, **kw)]
  elif method == "rgsm":
    before = [sp.group_lasso(hp["lamb2"], **kw)]
    after = [sp.group_l0_split(hp["beta"], hp["lamb1"], lr, **kw)]
  elif method == "admm":
    after = [sp.admm_split(hp["rho"], hp["percent"], lr,
                           structure=hp["structure"], **kw)]
  return optax.chain(optax.add_decayed_weights(5e-4), *before,
                     optax.sgd(lr, momentum=0.9, nesterov=True), *after)


@pytest.mark.parametrize("method", sorted(HPARAMS))
def test_sparsifier_equals_the_function_based_path(method):
  hp = HPARAMS[method]
  s = sp.get_sparsifier(method, layout=LAYOUT, **hp)
  schedule = optax.piecewise_constant_schedule(0.2, {2: 0.5})
  new_tx, old_tx = s.optimizer(schedule), _old_chain(method, schedule, hp)
  params = make_params()
  rng = np.random.default_rng(1)
  grads = [jax.tree.map(lambda x: 0.05 * rng.standard_normal(x.shape).astype(
      np.float32), params) for _ in range(3)]

  def run(tx, epoch_end, evaluate):
    p, st = params, tx.init(params)
    for _ in range(2):  # two epochs of 3 steps
      for g in grads:
        u, st = jax.jit(tx.update)(g, st, p)
        p = optax.apply_updates(p, u)
      p, st = epoch_end(p, st)
    return p, st, evaluate(p)

  def old_epoch_end(p, st):
    if method in ("rvsm", "rgsm"):
      return sp.project(p, method, layout=LAYOUT, **hp), st
    if method == "admm":
      return p, sp.admm_reset(st, p)
    return p, st

  new = run(new_tx, jax.jit(s.end_of_epoch), s.evaluated_params)
  old = run(old_tx, old_epoch_end,
            lambda p: sp.project(p, method, layout=LAYOUT, **hp))
  # The same params and evaluated u, bit for bit (the states differ in form:
  # the wrapper holds SGD's).
  chex.assert_trees_all_equal((new[0], new[2]), (old[0], old[2]))
  if method != "none":  # the evaluated u is sparse, the trained w not all
    assert sp.sparsity_report(new[2], layout=LAYOUT).weight_sparsity > 5.0
  assert s.report(new[2]).weight_sparsity == sp.sparsity_report(
      new[2], layout=LAYOUT).weight_sparsity


def test_sparse_sgd_and_project_are_the_sparsifier():
  params = make_params()
  g = jax.tree.map(lambda x: 0.01 * jnp.ones_like(x), params)
  hp = HPARAMS["rgsm"]
  a = sp.sparse_sgd("rgsm", 0.1, layout=LAYOUT, **hp)
  b = sp.RGSM(layout=LAYOUT, **hp).optimizer(0.1)
  chex.assert_trees_all_equal(a.update(g, a.init(params), params)[0],
                              b.update(g, b.init(params), params)[0])
  chex.assert_trees_all_equal(
      sp.project(params, "rgsm", layout=LAYOUT, **hp),
      sp.RGSM(layout=LAYOUT, **hp).project(params))


# ----------------------------------------------------- hyperparameter checks


@pytest.mark.parametrize("method,name,value,valid", [
    ("rvsm", "beta", 0.0, "(0, inf)"),
    ("rvsm", "beta", -1.0, "(0, inf)"),
    ("rvsm", "beta", float("nan"), "(0, inf)"),
    ("rvsm", "lamb", -1e-6, "[0, inf)"),
    ("rgsm", "beta", 0.0, "(0, inf)"),
    ("rgsm", "lamb1", -0.1, "[0, inf)"),
    ("rgsm", "lamb2", -0.1, "[0, inf)"),
    ("admm", "rho", 0.0, "(0, inf)"),
    ("admm", "percent", -1.0, "[0, 100]"),
    ("admm", "percent", 100.5, "[0, 100]"),
])
def test_invalid_hyperparameters_one_clear_error(method, name, value, valid):
  hp = dict({k: v for k, v in HPARAMS[method].items()}, **{name: value})
  pattern = (rf"{method}: {name}={value!r} is out of range; valid range "
             rf"{name} in {re.escape(valid)}")
  with pytest.raises(ValueError, match=pattern) as e:
    sp.get_sparsifier(method, **hp)
  assert "\n" not in str(e.value)
  # The same check in the function API and by name.
  with pytest.raises(ValueError, match=rf"{name}={value!r}"):
    sp.sparse_sgd(method, 0.1, **hp)
  fn = {"rvsm": lambda: sp.rvsm(optax.sgd(0.1), beta=hp["beta"],
                                lamb=hp["lamb"], learning_rate=0.1),
        "rgsm": lambda: sp.rgsm(optax.sgd(0.1), beta=hp["beta"],
                                lamb1=hp["lamb1"], lamb2=hp["lamb2"],
                                learning_rate=0.1),
        "admm": lambda: sp.admm(optax.sgd(0.1), rho=hp["rho"],
                                percent=hp["percent"], learning_rate=0.1),
        }[method]
  with pytest.raises(ValueError, match=rf"{name}={value!r}"):
    fn()


def test_valid_edges_and_unknown_values_are_accepted():
  sp.get_sparsifier("rvsm", beta=1e-9, lamb=0.0)
  sp.get_sparsifier("admm", rho=1.0, percent=0.0)
  sp.get_sparsifier("admm", rho=1.0, percent=100.0)
  sp.l0_split(np.float32(0.5), jnp.asarray(1e-3), 0.1)  # concrete arrays
  # Traced values are not known when built: not checked, and
  # inject_hyperparams under jit works.
  params = make_params()
  tx = optax.inject_hyperparams(sp.l0_split)(
      beta=lambda t: 0.5, lamb=1e-3, learning_rate=0.1, layout=LAYOUT)
  g = jax.tree.map(jnp.zeros_like, params)
  jax.jit(tx.update)(g, tx.init(params), params)
  with pytest.raises(TypeError, match="real number"):
    sp.l0_split("big", 1e-3, 0.1)


# ------------------------------------------------ selections selecting nothing


def dense_only():
  return {"Dense_0": {"kernel": jnp.ones((4, 3)), "bias": jnp.zeros(3)}}


NOTHING = "nothing to sparsify"


@pytest.mark.parametrize("make_tx", [
    lambda kw: sp.l0_split(0.5, 1e-3, 0.1, **kw),
    lambda kw: sp.group_lasso(1e-3, **kw),
    lambda kw: sp.group_l0_split(0.5, 1e-3, 0.1, **kw),
    lambda kw: sp.admm_split(0.5, 50.0, 0.1, **kw),
    lambda kw: sp.rvsm(optax.sgd(0.1), beta=0.5, lamb=1e-3,
                       learning_rate=0.1, **kw),
    lambda kw: sp.rgsm(optax.sgd(0.1), beta=0.5, lamb1=1e-3, lamb2=1e-3,
                       learning_rate=0.1, **kw),
    lambda kw: sp.admm(optax.sgd(0.1), rho=0.5, percent=50.0,
                       learning_rate=0.1, **kw),
    lambda kw: sp.sparse_sgd("rvsm", 0.1, beta=0.5, lamb=1e-3, **kw),
    lambda kw: sp.RGSM(beta=0.5, lamb1=1e-3, lamb2=1e-3, **kw).optimizer(0.1),
])
def test_transformations_selecting_nothing_raise_at_init(make_tx):
  # Default mask on a tree without conv kernels: says what it looked for.
  with pytest.raises(ValueError, match=rf"{NOTHING}.*'kernel' as HWIO"):
    make_tx({}).init(dense_only())
  # An explicit all-False mask, a callable one, and an empty tree.
  params = make_params()
  with pytest.raises(ValueError, match=rf"{NOTHING}.*mask pytree"):
    make_tx(dict(mask=jax.tree.map(lambda _: False, params))).init(params)
  with pytest.raises(ValueError, match=rf"{NOTHING}.*mask function"):
    make_tx(dict(mask=lambda p: jax.tree.map(lambda _: False, p))).init(
        params)
  with pytest.raises(ValueError, match=rf"{NOTHING}.*every leaf"):
    make_tx(dict(mask=None)).init({})


@pytest.mark.parametrize("method", ["rvsm", "rgsm", "admm"])
def test_projection_report_and_sparsifier_selecting_nothing_raise(method):
  hp = HPARAMS[method]
  s = sp.get_sparsifier(method, **hp)
  tree = dense_only()
  for call in [lambda: sp.project(tree, method, **hp),
               lambda: s.project(tree),
               lambda: s.evaluated_params(tree),
               lambda: s.report(tree)]:
    with pytest.raises(ValueError, match=NOTHING):
      call()
  if method != "admm":  # admm's end of epoch acts on its state (below)
    with pytest.raises(ValueError, match=NOTHING):
      s.end_of_epoch(tree, None)
  with pytest.raises(ValueError, match=NOTHING):
    sp.sparsity_report(tree)
  with pytest.raises(ValueError, match=NOTHING):
    sp.sparsity_report(make_params(), mask=lambda p: jax.tree.map(
        lambda _: False, p))
  with pytest.raises(ValueError, match="no ADMMState"):
    sp.admm_reset(optax.sgd(0.1).init(tree), tree)


def test_nothing_selected_names_the_near_misses():
  # An ensemble whose kernels are all member-stacked: the default mask names
  # them and says how to pass their layout.
  tree = {"members": {"Conv_0": {"kernel": jnp.ones((2, 3, 3, 3, 4))}},
          "head": {"kernel": jnp.ones((2, 4, 3))}}
  with pytest.raises(ValueError, match=r"rank-5 'kernel'.*MHWIO"):
    sp.project(tree, "rvsm", beta=1.0, lamb=1e-3)
  out = sp.project(tree, "rvsm", beta=1.0, lamb=0.5, layout="MHWIO")
  np.testing.assert_array_equal(out["members"]["Conv_0"]["kernel"], 0.0)
  np.testing.assert_array_equal(out["head"]["kernel"], 1.0)  # 3-D: not a conv
  # Named 'kernel' but of no layout's rank, and nothing else: listed.
  with pytest.raises(ValueError, match=r"head/kernel' \(2, 4, 3\).*layout="):
    sp.sparsity_report({"head": {"kernel": jnp.ones((2, 4, 3))}})


# --------------------------------------------------------------- layouts


def test_layout_validation():
  for bad in ["HWI", "HWIOO", "hwio", "HWIIO", "HHIO", "", 4]:
    with pytest.raises(ValueError):
      sp.Layout(bad)
  lay = sp.Layout("MOIHW")
  assert (lay.ndim, lay.in_axis, lay.out_axis, lay.stack_axes) == (
      5, 2, 1, (0,))
  assert lay.group_axes("input") == (1, 3, 4)
  with pytest.raises(ValueError, match="distinct ranks"):
    sp.conv_kernel_mask(make_params(), layout=("HWIO", "OIHW"))


def test_five_d_kernel_is_never_taken_for_a_stack_unless_said():
  rng = np.random.default_rng(0)
  k = rng.standard_normal((2, 3, 3, 4, 5)).astype(np.float32)
  tree = {"conv3d": {"kernel": k}}
  with pytest.raises(ValueError, match="3-D convolution or a stack"):
    sp.sparsity_report(tree)
  stacked = sp.sparsity_report(tree, layout="MHWIO").layers[0]
  conv3d = sp.sparsity_report(tree, layout="DHWIO").layers[0]
  assert stacked.channel_norms.shape == (2, 4)   # per member, I = axis 3
  assert conv3d.channel_norms.shape == (4,)      # one layer, I = axis 3
  np.testing.assert_allclose(
      conv3d.channel_norms,
      np.sqrt((stacked.channel_norms.astype(np.float64) ** 2).sum(0)),
      rtol=1e-6)
  # ADMM element projection: per member with M, over the whole array without.
  p_stack = np.asarray(sp.project(tree, "admm", percent=50.0, layout="MHWIO")
                       ["conv3d"]["kernel"])
  p_3d = np.asarray(sp.project(tree, "admm", percent=50.0, layout="DHWIO")
                    ["conv3d"]["kernel"])
  per_member = k[0].size // 2
  assert [int((p_stack[m] == 0).sum()) for m in range(2)] == [per_member] * 2
  assert int((p_3d == 0).sum()) == k.size // 2
  for m in range(2):
    np.testing.assert_array_equal(
        p_stack[m], sp.admm_projection(k[m], 50.0, layout="HWIO"))


def test_mapping_layouts_and_other_names():
  rng = np.random.default_rng(0)
  w = rng.standard_normal((3, 3, 4, 5)).astype(np.float32)
  tree = {"layer": {"w": w, "b": np.zeros(5, np.float32)}}
  with pytest.raises(ValueError, match=NOTHING):
    sp.project(tree, "rgsm", beta=1.0, lamb1=2.0)
  out = sp.project(tree, "rgsm", beta=1.0, lamb1=2.0, layout={"w": "HWIO"})
  np.testing.assert_array_equal(out["layer"]["w"],
                                sp.group_l0_prox(w, 2.0, 1.0))
  # An explicit mask picks a leaf that has no layout: element-wise methods
  # work, named channel groups say what is missing.
  mask = {"layer": {"w": True, "b": False}}
  sp.project(tree, "rvsm", beta=1.0, lamb=0.1, mask=mask)
  with pytest.raises(ValueError, match=r"'layer/w'.*no layout describes"):
    sp.project(tree, "rgsm", beta=1.0, lamb1=2.0, mask=mask)
  # ... unless the group is given as explicit axes.
  out = sp.project(tree, "rgsm", beta=1.0, lamb1=2.0, mask=mask,
                   group=(0, 1, 3))
  np.testing.assert_array_equal(out["layer"]["w"],
                                sp.group_l0_prox(w, 2.0, 1.0))


def test_path_names_skip_nnx_value_but_not_dict_keys():
  from flax import nnx

  class M(nnx.Module):

    def __init__(self):
      self.conv = nnx.Conv(2, 3, (3, 3), rngs=nnx.Rngs(0))

  state = nnx.state(M(), nnx.Param)
  names = [sp.masks.path_name(p)
           for p, _ in jax.tree_util.tree_leaves_with_path(state)]
  assert names == ["conv/bias", "conv/kernel"]
  # A dict key that happens to be "value" is a name like any other.
  tree = {"value": {"kernel": np.ones((1, 1, 2, 2), np.float32)}}
  assert sp.sparsity_report(tree).layers[0].name == "value/kernel"


# --------------------------------------- one schedule: learning_rate=None


@pytest.mark.parametrize("method", ["rvsm", "rgsm", "admm"])
def test_learning_rate_none_before_the_lr_scaling_is_the_same_update(method):
  hp = HPARAMS[method]
  s = sp.get_sparsifier(method, layout=LAYOUT, **hp)
  schedule = optax.piecewise_constant_schedule(0.2, {2: 0.25})
  reference = s.optimizer(schedule)
  one_schedule = optax.chain(
      optax.add_decayed_weights(5e-4), *s.before_sgd(),
      optax.trace(decay=0.9, nesterov=True), *s.after_sgd(None),
      optax.scale_by_learning_rate(schedule))
  params = make_params()
  rng = np.random.default_rng(2)
  p_a, st_a = params, reference.init(params)
  p_b, st_b = params, one_schedule.init(params)
  for _ in range(4):
    g = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(
        np.float32), params)
    u_a, st_a = reference.update(g, st_a, p_a)
    u_b, st_b = one_schedule.update(g, st_b, p_b)
    p_a, p_b = optax.apply_updates(p_a, u_a), optax.apply_updates(p_b, u_b)
  chex.assert_trees_all_close(p_a, p_b, rtol=1e-5, atol=1e-6)
  # ... and the splitting step did something: not the plain SGD result.
  plain = sp.get_sparsifier("none").optimizer(schedule)
  p_c, st_c = params, plain.init(params)
  rng = np.random.default_rng(2)
  for _ in range(4):
    g = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(
        np.float32), params)
    u_c, st_c = plain.update(g, st_c, p_c)
    p_c = optax.apply_updates(p_c, u_c)
  assert not np.allclose(p_a["Conv_0"]["kernel"], p_c["Conv_0"]["kernel"])



@pytest.mark.parametrize("ensemble_size", [1, 2])
def test_fkjax_models_layouts(ensemble_size):
  # What fkjax's own training passes: "MHWIO" for an EnResNet (members on
  # axis 0, any member execution), "HWIO" for a plain PreActResNet.
  from fkjax import models
  model = models.create_model(depth=8, ensemble_size=ensemble_size)
  shapes = jax.eval_shape(
      lambda k: model.init({"params": k, "noise": k},
                           jnp.zeros((1, 32, 32, 3)), train=False),
      jax.random.key(0))["params"]
  layout = "MHWIO" if ensemble_size > 1 else "HWIO"
  mask = sp.conv_kernel_mask(shapes, layout=layout)
  selected = {sp.masks.path_name(p): x.shape for (p, x), m in zip(
      jax.tree_util.tree_leaves_with_path(shapes), jax.tree.leaves(mask)) if m}
  # stem + 3 stages x 1 block x 2 convs + 2 shortcut convs; no dense head.
  assert len(selected) == 9
  assert all(n.endswith("/kernel") and "Dense" not in n for n in selected)
  assert all(len(s) == 4 + (ensemble_size > 1) for s in selected.values())
  if ensemble_size > 1:
    assert all(s[0] == 2 for s in selected.values())
    with pytest.raises(ValueError, match="MHWIO"):
      sp.conv_kernel_mask(shapes)
