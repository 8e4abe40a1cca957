"""Tests of fkjax.slim: pruned ResNets as smaller dense networks."""
from __future__ import annotations

import functools
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from benchmarks import bench_train
from fkjax import attacks
from fkjax import slim as slim_lib
from fkjax import sparsity
from fkjax.models import EnResNet, PreActResNet, create_model
from fkjax.slim import core as slim_core

KEYS = {"params": jax.random.key(0), "noise": jax.random.key(1)}
W1, W2, W3 = 16, 32, 64  # stage widths at width 1


def _cifar_test_images(n: int) -> np.ndarray | None:
  """The first ``n`` CIFAR-10 test images in [0, 1], if the data is here."""
  root = os.environ.get("FKJAX_DATA_DIR") or str(
      pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data")
  path = pathlib.Path(root) / "cifar-10-batches-bin" / "test_batch.bin"
  if not path.exists():
    return None
  # A record: 1 label byte, then the R, G, B planes of 32x32 bytes.
  raw = np.fromfile(path, np.uint8, count=n * 3073).reshape(n, 3073)
  images = raw[:, 1:].reshape(n, 3, 32, 32).transpose(0, 2, 3, 1)
  return images.astype(np.float32) / 255.0


@pytest.fixture(scope="module")
def images():
  """Real CIFAR-10 images (cropped to 16x16 for speed) where available."""
  real = _cifar_test_images(6)
  if real is not None:
    return jnp.asarray(real[:, 8:24, 8:24])
  return jax.random.uniform(jax.random.key(7), (6, 16, 16, 3))


def make(members=1, skip=True, coef=0.0, execution="batched", depth=14):
  return create_model(depth=depth, ensemble_size=members, skip=skip,
                      noise_coef=coef, member_execution=execution)


def random_variables(model, x, seed=0):
  """Variables of ``model`` drawn at random, BatchNorm included.

  Drawn on the host from the parameter shapes (no compiled init): conv
  kernels He-normal, non-trivial BatchNorm parameters and statistics.
  """
  shapes = jax.eval_shape(model.init, KEYS, x[:1])
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = str(getattr(path[-1], "key", path[-1]))
    if name == "kernel":
      fan = np.prod(leaf.shape[-4:-2]) * leaf.shape[-1] if len(
          leaf.shape) >= 4 else leaf.shape[-2]
      return rng.normal(0, np.sqrt(2 / fan), leaf.shape).astype(np.float32)
    low, high = {"scale": (0.5, 1.5), "var": (0.5, 2.0)}.get(name,
                                                            (-0.3, 0.3))
    return rng.uniform(low, high, leaf.shape).astype(np.float32)

  return jax.tree_util.tree_map_with_path(draw, shapes)


def node(tree, path, member):
  for k in path.split("/"):
    if k not in tree:
      return None
    tree = tree[k]
  return tree if member is None else tree[member]  # a view: writable


def prune_a(v, member=None):
  """Zeroes chosen channels of a depth-14 network (see the comments)."""
  p = v["params"] if member is None else v["params"]["members"]
  s = v["batch_stats"] if member is None else v["batch_stats"]["members"]
  missing = np.zeros(64)  # for a layer a shallower network does not have
  k = lambda path: _or(node(p, path + "/kernel", member),
                       np.zeros((1, 1, 64, 64)))
  # Image channel 1 unused by the stem.
  k("stem")[:, :, 1, :] = 0
  # A block's inner channel 3 unused by conv2: conv1 and bn2 lose it.
  k("stage1_block2/conv2")[:, :, 3, :] = 0
  # Inner channel 5 never computed (conv1's filter zero): relu(bn2(0)) = 0.7
  # is a constant conv2 reads through its zero padding.
  k("stage2_block1/conv1")[..., 5] = 0
  _or(node(p, "stage2_block1/bn2/bias", member), missing)[5] = 0.7
  _or(node(s, "stage2_block1/bn2/mean", member), missing)[5] = 0.0
  # Stage 1's stream channel 2 read by no block: its producers lose it.
  for path in ("stage1_block1/conv1", "stage1_block2/conv1",
               "stage2_block1/conv1", "stage2_block1/shortcut"):
    k(path)[:, :, 2, :] = 0
  # Stage 3's stream channel 7 written by no producer: exactly zero, a
  # constant after bn1 (folded into conv1) and bn_final (into the bias).
  for path in ("stage3_block1/shortcut", "stage3_block1/conv2",
               "stage3_block2/conv2"):
    k(path)[..., 7] = 0
  _or(node(p, "stage3_block2/bn1/bias", member), missing)[7] = 0.5
  _or(node(s, "stage3_block2/bn1/mean", member), missing)[7] = 0.0
  node(p, "bn_final/bias", member)[7] = 0.6
  # A zero BatchNorm scale: channel 4 is the constant relu(0.4) for conv1.
  _or(node(p, "stage2_block2/bn1/scale", member), missing)[4] = 0.0
  _or(node(p, "stage2_block2/bn1/bias", member), missing)[4] = 0.4
  return v


def _or(a, default):
  return default.copy() if a is None else a


def prune_b(v, member):
  """Another pattern, for another ensemble member: other widths."""
  p = v["params"]["members"]
  node(p, "stage1_block1/conv2/kernel", member)[:, :, :4, :] = 0
  node(p, "stage3_block1/conv1/kernel", member)[:, :, 10:13, :] = 0
  node(p, "stage2_block1/conv2/kernel", member)[:, :, 0, :] = 0
  return v


_JIT = {}


def logits(model, variables, x, key=None, add_noise=True):
  if repr(model) not in _JIT:
    _JIT[repr(model)] = jax.jit(functools.partial(model.apply, train=False),
                                static_argnames="add_noise")
  rngs = {} if key is None else {"noise": key}
  return _JIT[repr(model)](variables, x, rngs=rngs, add_noise=add_noise)


def assert_same_function(model, variables, x):
  """The slim models give the original's logits, with and without noise."""
  key = jax.random.key(11)
  noisy = bool((getattr(model, "member_kwargs", None) or {}).get(
      "noise_coef", getattr(model, "noise_coef", 0.0)))
  small, small_vars = slim_lib.slim(model, variables)
  np.testing.assert_allclose(logits(small, small_vars, x, key),
                             logits(model, variables, x, key),
                             rtol=1e-5, atol=1e-5)
  if not noisy:
    return small, small_vars, small, small_vars
  det, det_vars = slim_lib.slim(model, variables, noise=False)
  np.testing.assert_allclose(logits(det, det_vars, x),
                             logits(model, variables, x, add_noise=False),
                             rtol=1e-5, atol=1e-5)
  # The noise is on, and the key matters: a weak test would pass anyway.
  assert not np.allclose(logits(small, small_vars, x, key),
                         logits(det, det_vars, x), atol=1e-4)
  return small, small_vars, det, det_vars


def param_count(tree) -> int:
  return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(tree))


@pytest.mark.parametrize("skip,coef", [(True, 0.0), (True, 0.2),
                                       (False, 0.0), (False, 0.2)])
def test_hand_pruned_resnet_same_logits(images, skip, coef):
  model = make(skip=skip, coef=coef)
  v = prune_a(random_variables(model, images))
  small, _, det, _ = assert_same_function(model, v, images)
  full = sum(c.params_before for c in slim_lib.cost_report([small.spec]))
  assert param_count(v["params"]) == full
  # Something was removed, and more without noise (the streams shrink).
  after = lambda m: slim_lib.totals(slim_lib.cost_report(
      slim_lib.specs_of(m)))["macs_after"]
  before = slim_lib.totals(slim_lib.cost_report([small.spec]))["macs_before"]
  assert after(small) < before
  assert after(det) < after(small) if coef and skip else after(det) <= after(
      small)


def test_hand_pruned_parameter_count():
  """The surviving channels of prune_a, counted by hand (skip, no noise)."""
  model = make(skip=True, coef=0.0)
  x = jnp.zeros((1, 16, 16, 3))
  v = prune_a(random_variables(model, x))
  small, small_vars = slim_lib.slim(model, v)
  bn, conv = lambda c: 2 * c, lambda i, o, k=3: k * k * i * o
  expected = (
      conv(2, W1 - 1)                                       # stem: RGB->15
      + bn(W1 - 1) + conv(W1 - 1, W1) + bn(W1) + conv(W1, W1 - 1)  # s1b1
      + bn(W1 - 1) + conv(W1 - 1, W1 - 1) + bn(W1 - 1)             # s1b2
      + conv(W1 - 1, W1 - 1)
      + bn(W1 - 1) + conv(W1 - 1, W2 - 1) + bn(W2 - 1)             # s2b1
      + conv(W2 - 1, W2) + 9 * W2 + conv(W1 - 1, W2, k=1)
      + bn(W2 - 1) + conv(W2 - 1, W2) + 9 * W2 + bn(W2)            # s2b2
      + conv(W2, W2)
      + bn(W2) + conv(W2, W3) + bn(W3) + conv(W3, W3 - 1)          # s3b1
      + conv(W2, W3 - 1, k=1)
      + bn(W3 - 1) + conv(W3 - 1, W3) + 9 * W3 + bn(W3)            # s3b2
      + conv(W3, W3 - 1)
      + bn(W3 - 1) + (W3 - 1) * 10 + 10)                         # head
  assert param_count(small_vars["params"]) == expected
  assert sum(c.params_after for c in slim_lib.cost_report(
      [small.spec])) == expected
  s = small.spec
  assert s.stem.in_channels == (0, 2)
  assert 2 not in s.stem.out_channels and len(s.stem.out_channels) == W1 - 1
  assert [b.shortcut if isinstance(b.shortcut, str) else "conv"
          for b in s.blocks] == ["identity", "identity", "conv", "identity",
                                 "conv", "identity"]
  const = [(b.name, c) for b in s.blocks
           for c in ("conv1", "conv2") if getattr(b, c).has_const]
  assert const == [("stage2_block1", "conv2"), ("stage2_block2", "conv1"),
                   ("stage3_block2", "conv1")]


@pytest.mark.parametrize("skip,execution", [(True, "batched"),
                                            (False, "sequential")])
def test_hand_pruned_ensemble_same_logits(images, skip, execution):
  model = make(members=2, skip=skip, coef=0.2, execution=execution, depth=8)
  v = prune_b(prune_a(random_variables(model, images, seed=1), member=0),
              member=1)
  small, small_vars, det, _ = assert_same_function(model, v, images)
  w0, w1 = (s.widths for s in small.specs)
  assert w0 != w1  # members slimmed separately
  assert set(small_vars["params"]) == {"member_0", "member_1"}
  if skip:
    # Noise keeps the streams whole (their std scales it)...
    for spec in small.specs:
      for b in spec.blocks:
        assert len(b.conv2.out_channels) == b.conv2.out_full
    # ...and the deterministic slim model drops stage 1's channel 2.
    assert 2 not in det.specs[0].stem.out_channels


def _all_but_stem(params):
  # RGSM may prune all three image channels of a tiny stem, which leaves a
  # network of constants: slimmed correctly, but not the case tested here.
  mask = sparsity.conv_kernel_mask(params)
  (mask["members"] if "members" in mask else mask)["stem"]["kernel"] = False
  return mask


def _train_rgsm(model, x, steps=3, lamb1=1.0):
  """A few natural-training steps with RGSM.

  Returns the trained variables and ``project(lamb)``, the sparse ``u`` the
  paper evaluates, for a given lambda1.
  """
  v = random_variables(model, x)
  hparams = dict(beta=1.0, lamb2=1e-3, mask=_all_but_stem)
  tx = sparsity.sparse_sgd("rgsm", 0.05, lamb1=lamb1, **hparams)
  params, stats = v["params"], v["batch_stats"]
  opt_state = tx.init(params)
  labels = jnp.arange(x.shape[0]) % 10

  @jax.jit
  def step(params, stats, opt_state):
    def loss(p):
      out, new = model.apply({"params": p, "batch_stats": stats}, x,
                             train=True, mutable=["batch_stats"])
      return optax.softmax_cross_entropy_with_integer_labels(
          out, labels).mean(), new["batch_stats"]
    grads, stats = jax.grad(loss, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), stats, opt_state

  for _ in range(steps):
    params, stats, opt_state = step(params, stats, opt_state)
  return lambda lamb: {
      "params": sparsity.project(params, "rgsm", lamb1=lamb, **hparams),
      "batch_stats": stats}


def _nonzero_input_groups(kernel) -> int:
  return int(np.sum(np.any(np.asarray(kernel) != 0, axis=(0, 1, 3))))


_TRAINED = {}


@pytest.mark.parametrize("members,skip", [(1, True), (2, True), (1, False),
                                          (2, False)])
def test_rgsm_trained_same_logits_and_surviving_groups(images, members, skip):
  if skip not in _TRAINED:
    _TRAINED[skip] = _train_rgsm(make(skip=skip, depth=8), images)
  project = _TRAINED[skip]
  if members == 1:
    v = project(1.0)
  else:
    # Two members pruned at two thresholds: different widths.
    v = jax.tree.map(lambda *a: jnp.stack(a), project(1.0), project(1.1))
    v = {k: {"members": t} for k, t in v.items()}
  model = make(members=members, skip=skip, coef=0.1 if members > 1 else 0.0,
               depth=8, execution="batched" if skip else "sequential")
  report = sparsity.sparsity_report(
      v["params"], layout="MHWIO" if members > 1 else "HWIO")
  assert 10 < report.channel_sparsity < 90  # real channel sparsity
  small, small_vars, _, _ = assert_same_function(model, v, images)
  # Every block: conv1 keeps its non-zero input groups, and as outputs the
  # non-zero input groups of conv2 (RGSM prunes whole input groups).
  for m, spec in enumerate(slim_lib.specs_of(small)):
    p = v["params"]["members"] if members > 1 else v["params"]
    member = (lambda a: a[m]) if members > 1 else (lambda a: a)
    for b in spec.blocks:
      k1 = member(p[b.name]["conv1"]["kernel"])
      k2 = member(p[b.name]["conv2"]["kernel"])
      assert len(b.conv1.in_channels) == _nonzero_input_groups(k1)
      assert len(b.conv1.out_channels) == _nonzero_input_groups(k2)
      assert not b.conv1.has_const and not b.conv2.has_const
    name = f"member_{m}" if members > 1 else None
    tree = small_vars["params"][name] if name else small_vars["params"]
    assert param_count(tree) == sum(
        c.params_after for c in slim_lib.layer_costs(spec))


@pytest.mark.parametrize("members", [1, 2])
def test_no_zero_channel_slims_to_itself(images, members):
  model = make(members=members, coef=0.1, depth=8)
  v = random_variables(model, images)
  small, small_vars = slim_lib.slim(model, v, noise=False)
  for m, spec in enumerate(slim_lib.specs_of(small)):
    costs = slim_lib.layer_costs(spec, (32, 32))
    assert all(c.shape_before == c.shape_after for c in costs)
    # the multiply-adds the training benchmark counts for ResNet8
    assert slim_lib.totals(costs)["macs_after"] == bench_train.forward_macs(8)
    assert spec.stem.index is None and not spec.stem.has_const
    original = jax.tree.map(lambda a: a[m], {
        "params": v["params"]["members"],
        "batch_stats": v["batch_stats"]["members"]}) if members > 1 else v
    mine = {k: t[f"member_{m}"] for k, t in small_vars.items()} if (
        members > 1) else small_vars
    jax.tree.map(np.testing.assert_array_equal, mine, original)


def test_save_load_same_logits(images, tmp_path):
  model = make(members=2, coef=0.2, execution="sequential", depth=8)
  v = prune_b(prune_a(random_variables(model, images), member=0), member=1)
  small, small_vars = slim_lib.slim(model, v)
  path = slim_lib.save_slim(str(tmp_path / "slim"), small, small_vars,
                            source="test")
  apply_fn, loaded = slim_lib.load_slim(path)
  jax.tree.map(np.testing.assert_array_equal, loaded, small_vars)
  key = jax.random.key(2)
  np.testing.assert_allclose(jax.jit(apply_fn)(loaded, images, key),
                             logits(small, small_vars, images, key),
                             rtol=1e-6, atol=1e-6)
  model2, _, extra = slim_lib.load_slim_model(path)
  assert model2.specs == small.specs
  assert extra == {"member_execution": "sequential", "source": "test"}
  # a single network too
  single = make(coef=0.0, depth=8)
  sv = prune_a(random_variables(single, images))
  small, small_vars = slim_lib.slim(single, sv)
  model2, loaded, _ = slim_lib.load_slim_model(
      slim_lib.save_slim(str(tmp_path / "single"), small, small_vars))
  assert model2 == small
  jax.tree.map(np.testing.assert_array_equal, loaded, small_vars)


@pytest.mark.slow
def test_same_robust_accuracy_under_the_same_attack(images):
  model = make(coef=0.2, depth=8)
  v = prune_a(random_variables(model, images))
  small, small_vars = slim_lib.slim(model, v)
  labels = jnp.argmax(logits(model, v, images, jax.random.key(0)), -1)
  pgd = functools.partial(attacks.pgd, num_steps=3, unroll=1)

  def attack(m, variables):
    apply_fn = lambda var, x, key: m.apply(var, x, rngs={"noise": key})
    adv = jax.jit(functools.partial(pgd, apply_fn))(
        variables, images, labels, jax.random.key(9))
    correct = jnp.argmax(apply_fn(variables, adv, jax.random.key(1)),
                         -1) == labels
    return adv, correct

  adv_a, correct_a = attack(model, v)
  adv_b, correct_b = attack(small, small_vars)
  np.testing.assert_array_equal(correct_a, correct_b)
  # The same steps: sign(grad) agrees but where a gradient entry is ~0.
  assert np.mean(np.isclose(adv_a, adv_b, atol=1e-6)) > 0.99


def test_train_mode_is_refused(images):
  model = make(depth=8)
  small, small_vars = slim_lib.slim(model, random_variables(model, images))
  with pytest.raises(ValueError, match="inference"):
    small.apply(small_vars, images, train=True)


def test_rounded_widths_same_logits(images):
  """``multiple`` keeps channels through zero weights: widths round up."""
  model = make(coef=0.2, depth=8)
  v = prune_a(random_variables(model, images))
  small, small_vars = slim_lib.slim(model, v, multiple=4)
  key = jax.random.key(11)
  np.testing.assert_allclose(logits(small, small_vars, images, key),
                             logits(model, v, images, key),
                             rtol=1e-5, atol=1e-5)
  exact, _ = slim_lib.slim(model, v)
  for c_round, c_exact in zip(slim_lib.layer_costs(small.spec),
                              slim_lib.layer_costs(exact.spec)):
    for rounded, minimal, full in zip(c_round.shape_after,
                                      c_exact.shape_after,
                                      c_round.shape_before):
      assert rounded >= minimal
      assert rounded == full or rounded % 4 == 0


def test_member_kwargs_left_out_are_the_members_defaults():
  # An EnResNet's member_kwargs may leave fields out; slim must read the
  # same values its members then take from PreActResNet.
  ensemble = EnResNet(num_members=2, member_kwargs={"depth": 8})
  assert slim_core._member_config(ensemble) == slim_core._member_config(
      PreActResNet(depth=8))
