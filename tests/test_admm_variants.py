"""ADMM's two variants: fkjax's exact projection and the authors' rules.

``variant="authors"`` (config ``sparsity.admm_variant``) follows the authors'
released code: the element threshold is the percentile of the *signed*
weights, the channel threshold a percentile recomputed over the array of channel
norms as it is overwritten, channel by channel, with the decisions (1.0 kept,
0.0 pruned), and the pull is added L times per step. The references here are
NumPy loops that follow the authors' ``projection(..., 'channel')`` step by
step (written here, not copied).
"""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import default
from fkjax.training import sparsify
from fkjax.config import record as run_config
from fkjax import sparsity as sp

RHO, LR = 0.3, 0.1
NONZERO = np.concatenate([np.arange(-50, 0), np.arange(1, 51)])
LAYOUT = ("HWIO", "MHWIO")


def np_signed_percentile_zeros(w, percent):
  """The authors' element rule: |w| below the signed percentile is zeroed."""
  return np.abs(w) < np.percentile(w.astype(np.float64), percent)


def np_authors_channel_pruned(w, percent):
  """The authors' channel loop on an HWIO kernel, step by step: the input
  channels' norms (``sqrt(sum of squares + 1e-8)`` over every other axis, in
  float32, as their PyTorch tensor); then for each channel i in index order
  the threshold is ``np.percentile`` of the whole array as it is now, and
  ``a[i]`` becomes the decision ``a[i] > threshold`` (1.0 kept, 0.0 pruned).
  Returns the pruned channels."""
  a = np.sqrt(np.sum(np.asarray(w, np.float32) ** 2, axis=(0, 1, 3))
              + np.float32(1e-8)).astype(np.float32)
  for i in range(len(a)):
    threshold = np.percentile(a, percent)
    a[i] = a[i] > threshold
  return a == 0


def he_kernel(rng, shape):
  """An HWIO kernel drawn as PyTorch's ``kaiming_normal_`` (fan in)."""
  fan_in = shape[0] * shape[1] * shape[2]
  return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(
      np.float32)


# fkjax's ResNet20 conv kernels (HWIO), the 21 layers ADMM prunes: 675 input
# channels in all.
RESNET20_KERNELS = ([(3, 3, 3, 16)] + [(3, 3, 16, 16)] * 6
                    + [(3, 3, 16, 32), (1, 1, 16, 32)] + [(3, 3, 32, 32)] * 5
                    + [(3, 3, 32, 64), (1, 1, 32, 64)] + [(3, 3, 64, 64)] * 5)


def kernel_with_channel_norms(norms, hw=2, out=3):
  """An HWIO kernel whose input channel i has norm ``norms[i]``."""
  n = len(norms)
  w = np.ones((hw, hw, n, out), np.float32) / np.sqrt(hw * hw * out)
  signs = np.where(np.arange(hw * hw * n * out) % 2, 1.0, -1.0)
  w = w * signs.reshape(w.shape)
  return (w * np.asarray(norms, np.float32)[None, None, :, None]).astype(
      np.float32)


def zero_share(out):
  return float(np.mean(np.asarray(out) == 0))


def pruned_channels(out):
  return np.abs(np.asarray(out)).sum(axis=(-4, -3, -1)) == 0


# ------------------------------------------------------------- projections


def test_element_rule_is_the_signed_percentile():
  rng = np.random.default_rng(0)
  # Non-zero integers -50..50: no |w| lies near an interpolated threshold.
  w = rng.permutation(NONZERO).astype(np.float32).reshape(2, 1, 5, 10)
  for percent in (80.0, 50.0, 95.0):
    zeros = np_signed_percentile_zeros(w, percent)
    out = np.asarray(sp.admm_projection(w, percent, variant="authors"))
    np.testing.assert_array_equal(out == 0, zeros)
    np.testing.assert_array_equal(out[~zeros], w[~zeros])
  # At "80 %" the threshold is 30.2: |w| <= 30 goes, 60 of 100 entries.
  out = sp.admm_projection(w, 80.0, variant="authors")
  assert zero_share(out) == np.mean(np_signed_percentile_zeros(w, 80.0)) < 0.8
  assert zero_share(sp.admm_projection(w, 80.0)) == 0.8
  # Symmetric about 0: the p-th signed percentile zeroes 2p - 100 %.
  v = (np.arange(-500, 500) + 0.5).astype(np.float32).reshape(1, 1, 10, 100)
  assert zero_share(sp.admm_projection(v, 80.0, variant="authors")) == \
      np.mean(np_signed_percentile_zeros(v, 80.0))
  assert np.mean(np_signed_percentile_zeros(v, 80.0)) == pytest.approx(0.6)


def test_element_rule_is_per_member():
  rng = np.random.default_rng(1)
  m0 = rng.permutation(NONZERO).astype(np.float32)
  # Member 1 is all positive: its signed percentile is its magnitudes'.
  stacked = np.stack([m0, m0 + 100.0]).reshape(2, 1, 2, 5, 10)
  out = np.asarray(sp.admm_projection(stacked, 80.0, layout="MHWIO",
                                      variant="authors"))
  for m in range(2):
    np.testing.assert_array_equal(
        out[m] == 0, np_signed_percentile_zeros(stacked[m], 80.0))
  # Pooled, the members would share one threshold: member 0 would lose less.
  assert [zero_share(out[m]) for m in range(2)] == [0.6, 0.8]


def test_channel_rule_by_hand_depends_on_the_order():
  """Four channels at "50 %": the threshold is the midpoint of the 2nd and 3rd
  smallest entries of the array as it is when channel i is visited."""
  # Ascending norms 2 3 4 5: [2 3 4 5] -> 3.5, 2 pruned; [0 3 4 5] -> 3.5,
  # 3 pruned; [0 0 4 5] -> 2.0, 4 kept; [0 0 1 5] -> 0.5, 5 kept.
  up = sp.admm_projection(kernel_with_channel_norms([2, 3, 4, 5]), 50.0,
                          structure="channel", variant="authors")
  np.testing.assert_array_equal(pruned_channels(up),
                                [True, True, False, False])
  # Descending 5 4 3 2: [5 4 3 2] -> 3.5, kept; [1 4 3 2] -> 2.5, kept;
  # [1 1 3 2] -> 1.5, kept; [1 1 1 2] -> 1.0, kept: none pruned.
  down = sp.admm_projection(kernel_with_channel_norms([5, 4, 3, 2]), 50.0,
                            structure="channel", variant="authors")
  assert not pruned_channels(down).any()
  # The rule fkjax had (an array of zeros filled with the kept norms, pruned
  # iff below) gives the opposite: none pruned ascending ([2 0 0 0] -> 0,
  # [2 3 0 0] -> 1, [2 3 4 0] -> 2.5, [2 3 4 5] -> 3.5), channels 2 and 3
  # descending ([5 4 3 0] -> 3.5, [5 4 0 2] -> 3).
  for w in (kernel_with_channel_norms([2, 3, 4, 5]),
            kernel_with_channel_norms([5, 4, 3, 2])):
    np.testing.assert_array_equal(
        pruned_channels(sp.admm_projection(w, 50.0, structure="channel",
                                           variant="authors")),
        np_authors_channel_pruned(w, 50.0))


def test_channel_rule_matches_the_authors_loop_on_he_initialised_kernels():
  """Every decision on the 21 kernels of a He-initialised ResNet20 (675
  channels) and on a few other shapes, at three percentages."""
  rng = np.random.default_rng(2)
  shapes = RESNET20_KERNELS + [(3, 3, 8, 4), (5, 5, 24, 8), (3, 3, 128, 16)]
  project = jax.jit(lambda w, p: sp.admm_projection(
      w, p, structure="channel", layout="HWIO", variant="authors"))
  for percent in (80.0, 50.0, 95.0):
    pruned, total = 0, 0
    for shape in shapes:
      w = he_kernel(rng, shape)
      expected = np_authors_channel_pruned(w, percent)
      got = pruned_channels(project(w, percent))
      np.testing.assert_array_equal(got, expected, err_msg=f"{shape} at "
                                    f"{percent} %")
      if shape in RESNET20_KERNELS:
        pruned, total = pruned + expected.sum(), total + expected.size
    assert total == 675
    if percent == 80.0:
      # Fewer than the exact projection's 80 %.
      assert 0.3 < pruned / total < 0.6, pruned / total
  # The exact projection prunes exactly the 80 %.
  w = he_kernel(rng, (3, 3, 64, 64))
  exact = sp.admm_projection(w, 80.0, structure="channel")
  assert pruned_channels(exact).sum() == int(0.8 * 64)


def test_channel_rule_is_per_member_and_vmaps():
  norms = np.arange(1.0, 11.0) + 0.5
  members = [kernel_with_channel_norms(norms[::-1]),
             kernel_with_channel_norms(norms)]
  stacked = np.stack(members)
  out = sp.admm_projection(stacked, 80.0, structure="channel", layout="MHWIO",
                           variant="authors")
  expected = [np_authors_channel_pruned(m, 80.0) for m in members]
  np.testing.assert_array_equal(pruned_channels(out), expected)
  # The two orders prune differently: each member is its own layer.
  assert expected[0].tolist() != expected[1].tolist()
  vmapped = jax.vmap(lambda w: sp.admm_projection(
      w, 80.0, structure="channel", variant="authors"))(stacked)
  np.testing.assert_array_equal(vmapped, out)


def test_unknown_variant_is_an_error():
  with pytest.raises(ValueError, match="Unknown ADMM variant 'paper'"):
    sp.admm_projection(np.ones((1, 1, 2, 2)), 50.0, variant="paper")
  with pytest.raises(ValueError, match="variant"):
    sp.admm_split(RHO, 50.0, LR, variant="paper")
  with pytest.raises(ValueError, match="variant"):
    sp.get_sparsifier("admm", rho=RHO, percent=50.0, variant="paper")


# --------------------------------------------------------------- the pull


def make_params(seed=0):
  """One plain conv kernel (1 layer), a 2-member stacked one (2 layers), a
  dense layer the default mask leaves out."""
  rng = np.random.default_rng(seed)
  f = lambda *s: rng.standard_normal(s).astype(np.float32)
  return {"Conv_0": {"kernel": f(3, 3, 4, 6)},
          "Ens": {"Conv_0": {"kernel": f(2, 3, 3, 6, 4)}},
          "Dense_0": {"kernel": f(6, 3), "bias": f(3)}}


@pytest.mark.parametrize("structure,learning_rate", [("element", None),
                                                    ("channel", LR)])
def test_authors_pull_is_added_once_per_layer(structure, learning_rate):
  params = make_params()
  num_layers = 1 + 2   # Conv_0, and each member of Ens/Conv_0
  zero = jax.tree.map(jnp.zeros_like, params)
  got = {}
  for variant in ("exact", "authors"):
    tx = sp.admm_split(RHO, 80.0, learning_rate, structure=structure, layout=LAYOUT,
                 variant=variant)
    got[variant], state = jax.jit(tx.update)(zero, tx.init(params), params)
  chex.assert_trees_all_close(
      got["authors"]["Dense_0"], zero["Dense_0"])  # not pruned, no pull
  for key in ("Conv_0", "Ens"):
    w = params[key]["Conv_0"]["kernel"] if key == "Ens" else \
        params[key]["kernel"]
    layout = "MHWIO" if w.ndim == 5 else "HWIO"
    # From (z, u) = (Proj(w), 0): z' = Proj(w), u' = w - z', pull 2 (w - z').
    pulls = {}
    for variant in ("exact", "authors"):
      z = np.asarray(sp.admm_projection(w, 80.0, structure, "input", layout,
                                        variant))
      pulls[variant] = 2.0 * (w - z) * (LR if learning_rate else -1.0)
    leaf = lambda t: t[key]["Conv_0"]["kernel"] if key == "Ens" else \
        t[key]["kernel"]
    np.testing.assert_allclose(leaf(got["exact"]), -RHO * pulls["exact"],
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(leaf(got["authors"]),
                               -num_layers * RHO * pulls["authors"],
                               rtol=1e-5, atol=1e-7)
  spec = optax.tree_utils.tree_get(state, "ADMMState").spec
  assert spec.variant == "authors"


def test_reset_and_sparsifier_use_the_variant():
  params = make_params()
  s = sp.get_sparsifier("admm", rho=RHO, percent=80.0, structure="channel",
                        layout=LAYOUT, variant="authors")
  tx = s.optimizer(LR)
  state = tx.init(params)
  g = jax.tree.map(lambda x: 0.1 * jnp.ones_like(x), params)
  updates, state = tx.update(g, state, params)
  p = optax.apply_updates(params, updates)
  _, state = jax.jit(s.end_of_epoch)(p, state)
  z = optax.tree_utils.tree_get(state, "ADMMState").z
  w = p["Ens"]["Conv_0"]["kernel"]
  expected = sp.admm_projection(w, 80.0, "channel", layout="MHWIO",
                                variant="authors")
  np.testing.assert_array_equal(z["Ens"]["Conv_0"]["kernel"], expected)
  np.testing.assert_array_equal(
      s.project(p)["Ens"]["Conv_0"]["kernel"], expected)
  assert s.hparams["variant"] == "authors"


# ---------------------------------------------------------------- configs


@pytest.mark.parametrize("presets", ["resnet20,admm,authors",
                                     "resnet20,authors,admm"])
def test_authors_preset_selects_the_authors_admm(presets):
  config = default.get_config(presets)
  run_config.validate(config)
  assert sparsify.sparsifier(config).variant == "authors"
  assert sparsify.sparsifier(default.get_config("admm")).variant == "exact"


@pytest.mark.parametrize("method", ["admm", "rvsm"])
def test_unknown_admm_variant_is_one_config_error(method):
  config = default.get_config(method)
  config.sparsity.admm_variant = "paper"
  with pytest.raises(run_config.ConfigError,
                     match=r"^config.sparsity.admm_variant='paper' is invalid"
                     ) as e:
    run_config.validate(config)
  assert "\n" not in str(e.value)
