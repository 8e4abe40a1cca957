"""ADMM's two variants: fkjax's exact projection and the authors' rules.

``variant="authors"`` (config ``sparsity.admm_variant``) follows the authors'
released code: the element threshold is the percentile of the *signed*
weights, the channel threshold a percentile recomputed over an array being
filled in (and zeroed) channel by channel, and the pull is added L times per
step. The references here are NumPy loops written from that description.
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


def np_running_percentile_pruned(norms, percent):
  """The authors' channel rule, one channel at a time, in index order."""
  a = np.zeros(len(norms))
  pruned = np.zeros(len(norms), bool)
  for i, s in enumerate(norms):
    a[i] = s
    if s < np.percentile(a, percent):
      pruned[i] = True
      a[i] = 0.0
  return pruned


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
  # Descending norms 5 4 3 2 1 at 80 %: thresholds 1.0, 4.2, 3.4, 2.6, 1.8
  # over [5 0 0 0 0], [5 4 0 0 0], [5 0 3 0 0], ...: channels 1-4 pruned.
  down = sp.admm_projection(kernel_with_channel_norms([5, 4, 3, 2, 1]), 80.0,
                            structure="channel", variant="authors")
  np.testing.assert_array_equal(pruned_channels(down),
                                [False, True, True, True, True])
  # Ascending: every channel is the largest so far, none is pruned.
  up = sp.admm_projection(kernel_with_channel_norms([1, 2, 3, 4, 5]), 80.0,
                          structure="channel", variant="authors")
  assert not pruned_channels(up).any()


def test_channel_rule_matches_the_loop_and_prunes_less_than_the_target():
  rng = np.random.default_rng(2)
  shares = []
  for n in (16, 32, 64):
    norms = rng.permutation(np.arange(1, n + 1)).astype(np.float64)
    w = kernel_with_channel_norms(norms)
    expected = np_running_percentile_pruned(norms, 80.0)
    out = jax.jit(lambda w: sp.admm_projection(
        w, 80.0, structure="channel", layout="HWIO", variant="authors"))(w)
    np.testing.assert_array_equal(pruned_channels(out), expected)
    shares.append(expected.mean())
    # the exact projection prunes exactly the 80 %
    exact = sp.admm_projection(w, 80.0, structure="channel")
    assert pruned_channels(exact).sum() == int(0.8 * n)
  assert all(0.3 < s < 0.6 for s in shares), shares


def test_channel_rule_is_per_member_and_vmaps():
  norms = np.arange(1.0, 11.0)
  stacked = np.stack([kernel_with_channel_norms(norms[::-1]),
                      kernel_with_channel_norms(norms)])
  out = sp.admm_projection(stacked, 80.0, structure="channel", layout="MHWIO",
                           variant="authors")
  np.testing.assert_array_equal(
      pruned_channels(out),
      [np_running_percentile_pruned(norms[::-1], 80.0),
       np_running_percentile_pruned(norms, 80.0)])
  vmapped = jax.vmap(lambda w: sp.admm_projection(
      w, 80.0, structure="channel", variant="authors"))(stacked)
  np.testing.assert_array_equal(vmapped, out)


def test_unknown_variant_is_an_error():
  with pytest.raises(ValueError, match="Unknown ADMM variant 'paper'"):
    sp.admm_projection(np.ones((1, 1, 2, 2)), 50.0, variant="paper")
  with pytest.raises(ValueError, match="variant"):
    sp.admm(RHO, 50.0, LR, variant="paper")
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
    tx = sp.admm(RHO, 80.0, learning_rate, structure=structure, layout=LAYOUT,
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
