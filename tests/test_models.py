"""Tests of the PreActResNet / EnResNet models."""
import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default
from fkjax.models import (CIFAR10_MEAN, CIFAR10_STD, EnResNet, PreActResNet,
                          create_model)

KEYS = {"params": jax.random.key(0), "noise": jax.random.key(1)}


def param_count(tree) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def expected_param_count(depth, num_classes=10, width=1, members=1,
                         skip=True) -> int:
  """Closed-form count of the architecture, derived independently of Flax."""
  n = (depth - 2) // 6
  w = [16 * width, 32 * width, 64 * width]
  total = 3 * 3 * 3 * w[0]                      # stem
  cin = w[0]
  for cout in w:
    for b in range(n):
      total += 2 * cin + 9 * cin * cout          # bn1 + conv1
      total += 2 * cout + 9 * cout * cout        # bn2 + conv2
      if skip and cin != cout:
        total += cin * cout                      # 1x1 shortcut
      cin = cout
  total += 2 * w[2] + w[2] * num_classes + num_classes  # bn_final + head
  return members * total


_JITTED = {}


def jit_apply(model):
  """``model.apply`` compiled once per model (eager Flax is slow on CPU)."""
  if repr(model) not in _JITTED:
    _JITTED[repr(model)] = jax.jit(
        model.apply, static_argnames=("train", "add_noise", "mutable"))
  return _JITTED[repr(model)]


_INITS = {}


def init_variables(model, x):
  """Variables of ``model``, initialised once per parameter structure.

  Noise settings do not change the parameters, so models that differ only
  in them share one (slow to compile) initialisation.
  """
  kw = model.member_kwargs if isinstance(model, EnResNet) else {
      "depth": model.depth, "num_classes": model.num_classes,
      "width": model.width, "skip": model.skip}
  structure = (getattr(model, "num_members", 0), kw.get("depth"),
               kw.get("num_classes", 10), kw.get("width", 1),
               kw.get("skip", True), x.shape[1:])
  if structure not in _INITS:
    _INITS[structure] = jax.jit(model.init)(KEYS, x)
  return _INITS[structure]


def init_shapes(model, x_shape=(1, 32, 32, 3)):
  return jax.eval_shape(
      functools.partial(model.init, train=False), KEYS,
      jnp.zeros(x_shape))


@pytest.mark.parametrize("depth,members,classes,expected", [
    (20, 1, 10, 272_282),   # ResNet20 ~0.27M
    (20, 2, 10, 544_564),   # En2ResNet20 ~0.54M
    (38, 1, 10, 563_930),   # ResNet38 ~0.56M
    (20, 5, 10, 1_361_410),
    (20, 1, 100, 278_132),
])
def test_exact_parameter_counts(depth, members, classes, expected):
  model = create_model(depth=depth, ensemble_size=members,
                       num_classes=classes, noise_coef=0.1)
  count = param_count(init_shapes(model)["params"])
  assert count == expected
  assert count == expected_param_count(depth, classes, members=members)


def test_width_and_no_skip_counts():
  for width, skip in [(2, True), (1, False)]:
    model = create_model(depth=20, width=width, skip=skip)
    count = param_count(init_shapes(model)["params"])
    assert count == expected_param_count(20, width=width, skip=skip)


@pytest.mark.parametrize("classes,members", [(10, 1), (100, 2)])
def test_output_shapes(classes, members):
  model = create_model(depth=8, num_classes=classes, ensemble_size=members,
                       noise_coef=0.1)
  x = jnp.ones((3, 8, 8, 3)) * 0.5
  variables = init_variables(model, x)
  logits, new_state = jit_apply(model)(variables, x, train=True, rngs=KEYS,
                                  mutable="batch_stats")
  assert logits.shape == (3, classes)
  assert logits.dtype == jnp.float32
  assert set(new_state) == {"batch_stats"}


@pytest.fixture(scope="module")
def small_batch():
  return jax.random.uniform(jax.random.key(7), (4, 8, 8, 3))


@pytest.mark.slow
def test_noise_keys(small_batch):
  for members, coef, execution in ((1, 0.0, "batched"), (2, 0.2, "batched"),
                                   (2, 0.2, "sequential"),
                                   (2, 0.2, "unrolled")):
    model = create_model(depth=8, ensemble_size=members, noise_coef=coef,
                         member_execution=execution)
    variables = init_variables(model, small_batch)
    run = lambda k: jit_apply(model)(variables, small_batch, rngs={"noise": k})
    a, b, c = run(jax.random.key(3)), run(jax.random.key(3)), run(
        jax.random.key(4))
    np.testing.assert_array_equal(a, b)
    if coef == 0.0:
      np.testing.assert_array_equal(a, c)
    else:
      assert not np.allclose(a, c)
      # the switch turns noise off: deterministic without any noise key
      off = jit_apply(model)(variables, small_batch, add_noise=False)
      np.testing.assert_array_equal(
          off, jit_apply(model)(variables, small_batch, add_noise=False))
      assert not np.allclose(off, a)


def test_noise_std_over_example_is_batch_independent(small_batch):
  # Same key and shape -> same N(0, 1) draws; only the std scaling differs.
  # Changing example 0 must leave the other examples' noisy logits alone
  # when the std is per example, and move them when it is over the batch.
  x2 = small_batch.at[0].multiply(0.1)
  for std_over in ("example", "batch"):
    model = create_model(depth=8, noise_coef=0.3, noise_std_over=std_over)
    variables = init_variables(model, small_batch)
    apply = lambda x: jit_apply(model)(variables, x,
                                       rngs={"noise": jax.random.key(9)})
    same = np.allclose(apply(small_batch)[1:], apply(x2)[1:], rtol=1e-5,
                       atol=1e-6)
    assert same == (std_over == "example")


def test_ensemble_equals_mean_of_members(small_batch):
  ens = create_model(depth=8, ensemble_size=3)
  variables = init_variables(ens, small_batch)
  stacked = variables["params"]["members"]
  leaves = jax.tree.leaves(stacked)
  assert all(leaf.shape[0] == 3 for leaf in leaves)
  # independently initialised members
  stem = stacked["stem"]["kernel"]
  assert not np.allclose(stem[0], stem[1])
  single = PreActResNet(depth=8)
  member_out = []
  for i in range(3):
    member_vars = jax.tree.map(lambda a: a[i], {
        "params": stacked, "batch_stats": variables["batch_stats"]["members"]})
    member_out.append(jit_apply(single)(member_vars, small_batch))
  np.testing.assert_allclose(jit_apply(ens)(variables, small_batch),
                             np.mean(member_out, axis=0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("other", [
    pytest.param("sequential", marks=pytest.mark.slow), "unrolled"])
@pytest.mark.slow
def test_member_executions_compute_the_same_function(small_batch, other):
  batched, sequential = (
      create_model(depth=8, ensemble_size=3, member_execution=m)
      for m in ("batched", other))
  variables = init_variables(batched, small_batch)
  # Same variables: a checkpoint of one restores into the other.
  assert (jax.tree.map(jnp.shape, init_shapes(sequential, small_batch.shape))
          == jax.tree.map(jnp.shape, variables))
  for train in (False, True):
    (a, stats_a), (b, stats_b) = (
        jit_apply(m)(variables, small_batch, train=train,
                     mutable="batch_stats") for m in (batched, sequential))
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5,
                                   atol=1e-6), stats_a, stats_b)
  labels = jnp.arange(4) % 10

  def grads(model):
    def loss(params, x):
      logits, _ = model.apply({**variables, "params": params}, x, train=True,
                              mutable="batch_stats")
      return jnp.sum(jax.nn.log_softmax(logits)[jnp.arange(4), labels])
    return jax.jit(jax.grad(loss, (0, 1)))(variables["params"], small_batch)

  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-4,
                                 atol=1e-6), grads(batched), grads(sequential))
  with pytest.raises(ValueError, match="member_execution"):
    init_shapes(create_model(depth=8, ensemble_size=2,
                             member_execution="parallel"))


@pytest.mark.parametrize("other", [
    "batched", pytest.param("sequential", marks=pytest.mark.slow)])
def test_every_member_execution_draws_the_unrolled_keys(small_batch, other):
  """One seed, one run: the accelerators' batched members and the CPU's
  unrolled ones draw the same initial weights and the same noise in a
  training step (the unrolled draws are the committed CPU runs')."""
  unrolled, form = (create_model(depth=8, ensemble_size=2, noise_coef=0.2,
                                 member_execution=m)
                    for m in ("unrolled", other))
  init = lambda m: jax.jit(functools.partial(m.init, train=False))(
      KEYS, small_batch[:1])
  expected, variables = init(unrolled), init(form)
  jax.tree.map(np.testing.assert_array_equal, variables, expected)

  def step_noise(model, key):
    """The training step's forward pass: noise on, batch statistics."""
    return jit_apply(model)(expected, small_batch, train=True,
                            rngs={"noise": key}, mutable="batch_stats")

  a, b = (step_noise(m, jax.random.key(5)) for m in (unrolled, form))
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5,
                                 atol=1e-6), a, b)
  # The noise is there to be compared: another key moves the logits.
  other_key = step_noise(form, jax.random.key(6))[0]
  assert np.max(np.abs(np.asarray(other_key) - np.asarray(b[0]))) > 1e-3


def test_en1_without_noise_equals_plain_net(small_batch):
  plain = create_model(depth=8)
  variables = init_variables(plain, small_batch)
  en1 = EnResNet(num_members=1, member_kwargs=dict(depth=8))
  en1_vars = {k: {"members": jax.tree.map(lambda a: a[None], v)}
              for k, v in variables.items()}
  for train in (False, True):
    a = jit_apply(plain)(variables, small_batch, train=train,
                    mutable="batch_stats")[0]
    b = jit_apply(en1)(en1_vars, small_batch, train=train,
                  mutable="batch_stats")[0]
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _zero_block_kernels(params):
  def zero(path, leaf):
    names = [getattr(p, "key", "") for p in path]
    branch = any(n in ("conv1", "conv2") for n in names)
    return jnp.zeros_like(leaf) if branch else leaf
  return jax.tree_util.tree_map_with_path(zero, params)


def test_skip_false_removes_skip_path(small_batch):
  for skip in (True, False):
    model = create_model(depth=8, skip=skip)
    variables = init_variables(model, small_batch)
    names = str(jax.tree_util.tree_structure(variables["params"]))
    assert ("shortcut" in names) == skip
    # With every residual-branch kernel zero, only the skip path carries the
    # input to the head: without it the logits cannot depend on the image.
    variables = {**variables, "params": _zero_block_kernels(variables["params"])}
    a = jit_apply(model)(variables, small_batch)
    b = jit_apply(model)(variables, 1.0 - small_batch)
    assert np.allclose(a, b) != skip


@pytest.mark.slow
def test_jit_matches_eager(small_batch):
  model = create_model(depth=8, noise_coef=0.1)
  variables = init_variables(model, small_batch)
  fn = lambda v, x, k: model.apply(v, x, train=True, rngs={"noise": k},
                                   mutable=["batch_stats"])
  eager = fn(variables, small_batch, jax.random.key(5))
  jitted = jax.jit(fn)(variables, small_batch, jax.random.key(5))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4,
                                                       atol=1e-5),
               eager, jitted)


def test_normalisation_is_off_by_default_as_in_the_config(small_batch):
  assert (inspect.signature(create_model).parameters["normalize"].default
          is default.get_config().model.normalize is False)
  plain = create_model(depth=8)
  assert plain == create_model(depth=8, normalize=False) == PreActResNet(
      depth=8)
  normalised = create_model(depth=8, normalize=True)
  variables = init_variables(plain, small_batch)
  standardised = ((small_batch - jnp.asarray(CIFAR10_MEAN))
                  / jnp.asarray(CIFAR10_STD))
  np.testing.assert_allclose(jit_apply(normalised)(variables, small_batch),
                             jit_apply(plain)(variables, standardised),
                             rtol=1e-5, atol=1e-5)
  ensemble = create_model(depth=8, ensemble_size=2, normalize=True)
  assert ensemble.member_kwargs["mean"] == CIFAR10_MEAN


def test_batchnorm_train_updates_stats_eval_uses_them(small_batch):
  model = create_model(depth=8)
  variables = init_variables(model, small_batch)
  _, state = jit_apply(model)(variables, small_batch, train=True,
                         mutable="batch_stats")
  before = jax.tree.leaves(variables["batch_stats"])
  after = jax.tree.leaves(state["batch_stats"])
  assert any(not np.allclose(a, b) for a, b in zip(before, after))
  # eval mode: each example's logits are independent of the batch
  full = jit_apply(model)(variables, small_batch)
  alone = jit_apply(model)(variables, small_batch[:1])
  np.testing.assert_allclose(full[:1], alone, rtol=1e-5, atol=1e-6)


def test_bad_depth_raises():
  with pytest.raises(ValueError, match="6n\\+2"):
    init_shapes(create_model(depth=21))


def test_conv_and_noise_are_the_callables_given(small_batch):
  calls = []

  def conv(*args, **kwargs):
    calls.append(args[1].shape)
    return jax.lax.conv_general_dilated(*args, **kwargs)

  skip_noise = lambda out, coef, key, std_over: out
  for members in (1, 2):
    plain = create_model(depth=8, ensemble_size=members, noise_coef=0.3,
                         member_execution="unrolled")
    custom = create_model(depth=8, ensemble_size=members, noise_coef=0.3,
                          member_execution="unrolled", conv=conv,
                          inject_noise=skip_noise)
    variables = init_variables(plain, small_batch)
    calls.clear()
    got = custom.apply(variables, small_batch,
                       rngs={"noise": jax.random.key(0)})
    assert (3, 3, 3, 16) in calls   # the stem went through ``conv``
    # Noise that adds nothing: the model without noise.
    np.testing.assert_allclose(
        got, jit_apply(plain)(variables, small_batch, add_noise=False),
        rtol=1e-5, atol=1e-6)
