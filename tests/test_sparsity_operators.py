"""Closed-form tests of fkjax.sparsity's operators, masks and metrics."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fkjax import sparsity as sp


def hand_kernel():
  """A (2, 1, 3, 2) HWIO kernel whose input channels have norms 5, 0 and 1.

  Channel 0 spreads over both H rows and both filters (3 at h=0,o=0 and 4 at
  h=1,o=1), so its norm is 5 only if H and O are reduced together.
  Filters (output channels) have norms 3 and sqrt(4² + 1²) = sqrt(17).
  """
  w = np.zeros((2, 1, 3, 2), np.float32)
  w[0, 0, 0, 0] = 3.0
  w[1, 0, 0, 1] = -4.0
  w[0, 0, 2, 1] = 1.0
  return w


# ---------------------------------------------------------------- operators


def test_hard_threshold_keeps_strictly_above_and_zeroes_ties():
  w = jnp.array([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0])
  gamma = sp.l0_threshold(lamb=0.5, beta=1.0)  # sqrt(2 * 0.5 / 1) = 1.
  np.testing.assert_allclose(gamma, 1.0)
  out = sp.hard_threshold(w, gamma)
  np.testing.assert_array_equal(out, [-2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0])
  assert out.dtype == w.dtype


def test_group_axes_named_and_explicit():
  assert sp.group_axes("input", 4) == (0, 1, 3)  # HWIO: all but I
  assert sp.group_axes("output", 4) == (0, 1, 2)
  assert sp.group_axes("input", 4, "OIHW") == (0, 2, 3)
  assert sp.group_axes("output", 4, "OIHW") == (1, 2, 3)
  # Member axes are never reduced: a group per member and channel.
  assert sp.group_axes("output", 5, "MHWIO") == (1, 2, 3)
  assert sp.group_axes("input", 5, "DHWIO") == (0, 1, 2, 4)
  assert sp.group_axes((0,), 2) == (0,)
  assert sp.group_axes((-1,), 3) == (2,)
  # A rank-5 kernel is not taken for a stacked HWIO one without being told.
  with pytest.raises(ValueError, match="rank-4 kernel, got a rank-5"):
    sp.group_axes("output", 5)
  with pytest.raises(ValueError, match="rank-4 kernel"):
    sp.group_axes("input", 2)
  with pytest.raises(ValueError, match="Unknown channel group"):
    sp.group_axes("filters", 4)
  with pytest.raises(ValueError, match="out of range"):
    sp.group_axes((3,), 2)


def test_group_norms_input_and_output_channels_of_hwio_kernel():
  w = hand_kernel()
  np.testing.assert_allclose(
      sp.group_norms(w, sp.group_axes("input", 4)), [5.0, 0.0, 1.0]
  )
  np.testing.assert_allclose(
      sp.group_norms(w, sp.group_axes("output", 4)), [3.0, np.sqrt(17.0)],
      rtol=1e-6,
  )
  assert sp.group_norms(w, (-4, -3, -1), keepdims=True).shape == (1, 1, 3, 1)


def test_group_l0_prox_closed_form_with_tie_and_zero_group():
  w = hand_kernel()
  # sqrt(2 * 0.5 / 1) = 1: channel 2 (norm 1) is a tie and is zeroed,
  # channel 0 (norm 5) is kept, the all-zero channel 1 stays zero.
  out = np.asarray(sp.group_l0_prox(w, lamb1=0.5, beta=1.0))
  expected = w.copy()
  expected[:, :, 2, :] = 0.0
  np.testing.assert_array_equal(out, expected)
  # Just below the tie, channel 2 survives.
  np.testing.assert_array_equal(sp.group_l0_prox(w, 0.49, 1.0), w)
  # Threshold exactly at channel 0's norm 5 (2 * 12.5 / 1 = 25): all zero.
  np.testing.assert_array_equal(sp.group_l0_prox(w, 12.5, 1.0), 0.0 * w)
  # Output groups: filter 0 (norm 3) dies at threshold 3.5, filter 1 lives.
  out = np.asarray(sp.group_l0_prox(w, 3.5**2 / 2, 1.0, group="output"))
  expected = w.copy()
  expected[..., 0] = 0.0
  np.testing.assert_array_equal(out, expected)


def test_group_lasso_grad_closed_form_and_zero_group_is_finite():
  w = hand_kernel()
  out = np.asarray(sp.group_lasso_grad(w, lamb2=0.1))
  norms = np.array([5.0, 0.0, 1.0])
  expected = 0.1 * w / np.sqrt(norms**2 + 1e-8)[None, None, :, None]
  np.testing.assert_allclose(out, expected, rtol=1e-6)
  assert np.all(out[:, :, 1, :] == 0.0)  # all-zero group: zero, not NaN
  out_o = np.asarray(sp.group_lasso_grad(w, 0.1, group="output"))
  np.testing.assert_allclose(
      out_o, 0.1 * w / np.sqrt(np.array([9.0, 17.0]) + 1e-8), rtol=1e-6
  )


def test_member_stacked_kernels_are_grouped_per_member():
  w = hand_kernel()
  stacked = np.stack([w, 10.0 * w])  # (2, 2, 1, 3, 2): member 1 is 10x.
  norms = sp.group_norms(stacked, sp.group_axes("input", 5, "MHWIO"))
  np.testing.assert_allclose(norms, [[5.0, 0.0, 1.0], [50.0, 0.0, 10.0]])
  # Threshold 6: member 0 loses every channel, member 1 keeps channels 0, 2.
  out = np.asarray(sp.group_l0_prox(stacked, 18.0, 1.0, layout="MHWIO"))
  np.testing.assert_array_equal(out[0], 0.0 * w)
  np.testing.assert_array_equal(out[1], 10.0 * w)
  # Same as treating each member on its own.
  for m in range(2):
    np.testing.assert_array_equal(out[m], sp.group_l0_prox(stacked[m], 18., 1.))
    np.testing.assert_allclose(
        sp.group_lasso_grad(stacked, 0.1, layout="MHWIO")[m],
        sp.group_lasso_grad(stacked[m], 0.1),
    )


def test_admm_projection_element_is_exact_even_with_ties():
  # Every magnitude equal: a threshold rule could not choose, the projection
  # still zeroes exactly floor(p * n / 100) entries.
  w = jnp.ones((2, 2, 3, 4)) * jnp.array([1.0, -1.0, 1.0, -1.0])
  for percent, n_zero in [(0.0, 0), (25.0, 12), (50.0, 24), (99.0, 47),
                          (100.0, 48)]:
    out = sp.admm_projection(w, percent)
    assert int(jnp.sum(out == 0)) == n_zero
    np.testing.assert_array_equal(jnp.where(out != 0, w, 0.0), out)
  # Distinct magnitudes: the smallest ones go.
  v = jnp.arange(1.0, 17.0).reshape(1, 1, 4, 4) * jnp.array([1, -1, 1, -1])
  out = np.asarray(sp.admm_projection(v, 25.0))
  np.testing.assert_array_equal(
      np.abs(out).ravel(), np.where(np.arange(1, 17) > 4, np.arange(1, 17), 0)
  )


def test_admm_projection_zeroes_floor_p_n_over_100_with_a_traced_percent():
  # A traced percent (a sweep's, inject_hyperparams') once lost one: under
  # jit XLA divides by 100 as a product by its rounded reciprocal, and
  # 50 * 216 / 100 floored to 107.
  w = jnp.asarray(np.random.default_rng(0).standard_normal(216), jnp.float32)
  percents = np.arange(0.0, 100.5, 2.5, dtype=np.float32)
  zeros = jax.jit(jax.vmap(
      lambda p: jnp.sum(sp.admm_projection(w, p) == 0)))(percents)
  np.testing.assert_array_equal(
      zeros, np.floor(percents.astype(np.float64) * 216 / 100))


def test_admm_projection_channels_and_members():
  w = hand_kernel()  # input-channel norms 5, 0, 1
  out = np.asarray(sp.admm_projection(w, 50.0, structure="channel"))
  # floor(0.5 * 3) = 1 channel pruned: the zero one; channels 0 and 2 kept.
  np.testing.assert_array_equal(out, w)
  out = np.asarray(sp.admm_projection(w, 67.0, structure="channel"))
  expected = w.copy()
  expected[:, :, 2, :] = 0.0
  np.testing.assert_array_equal(out, expected)
  # Per member: member 1 (whose channel 0 is tiny) prunes its own channel 0,
  # member 0 prunes channel 2 (norm 1) - a global ranking would do otherwise.
  w1 = w.copy()
  w1[:, :, 0, :] *= 1e-3
  stacked = np.stack([w, w1])
  out = np.asarray(sp.admm_projection(stacked, 67.0, structure="channel",
                                      layout="MHWIO"))
  kept = np.linalg.norm(out.reshape(2, 2, 3, 2).transpose(0, 2, 1, 3)
                        .reshape(2, 3, -1), axis=-1) > 0
  np.testing.assert_array_equal(kept, [[True, False, False],
                                       [False, False, True]])
  with pytest.raises(ValueError, match="structure"):
    sp.admm_projection(w, 50.0, structure="filter")


# -------------------------------------------------------------------- masks


class Block(nn.Module):

  @nn.compact
  def __call__(self, x):
    x = nn.Conv(4, (3, 3))(x)
    x = nn.BatchNorm(use_running_average=True)(x)
    return nn.Dense(3)(x.mean(axis=(1, 2)))


class Net(nn.Module):
  """One plain block and a 2-member nn.vmap ensemble of the same block."""

  @nn.compact
  def __call__(self, x):
    ens = nn.vmap(
        Block,
        variable_axes={"params": 0, "batch_stats": 0},
        split_rngs={"params": True},
        in_axes=None,
        axis_size=2,
    )
    return Block()(x) + ens()(x).sum(0)


@pytest.fixture(scope="module")
def flax_params():
  variables = Net().init(jax.random.key(0), jnp.ones((1, 5, 5, 2)))
  return variables["params"]


STACKED = ("HWIO", "MHWIO")  # Net holds plain and member-stacked kernels


def test_conv_kernel_mask_on_flax_params(flax_params):
  # The default layouts refuse to guess what the 5-D nn.vmap kernel is.
  with pytest.raises(ValueError, match="VmapBlock_0/Conv_0/kernel.*MHWIO"):
    sp.conv_kernel_mask(flax_params)
  mask = sp.conv_kernel_mask(flax_params, layout=STACKED)
  flat = {
      "/".join(str(getattr(k, "key", k)) for k in path): m
      for path, m in jax.tree_util.tree_leaves_with_path(mask)
  }
  shapes = {
      "/".join(str(getattr(k, "key", k)) for k in path): x.shape
      for path, x in jax.tree_util.tree_leaves_with_path(flax_params)
  }
  selected = {k for k, m in flat.items() if m}
  assert selected == {"Block_0/Conv_0/kernel", "VmapBlock_0/Conv_0/kernel"}
  assert shapes["VmapBlock_0/Conv_0/kernel"] == (2, 3, 3, 2, 4)
  assert shapes["VmapBlock_0/Dense_0/kernel"] == (2, 4, 3)  # 3-D: not selected
  assert not flat["Block_0/BatchNorm_0/scale"]


def test_sparsity_report_counts_per_member_channels(flax_params):
  params = jax.tree.map(np.asarray, flax_params)
  k = params["VmapBlock_0"]["Conv_0"]["kernel"].copy()  # (2, 3, 3, 2, 4)
  k[0, :, :, 1, :] = 0.0  # member 0, input channel 1
  k[1, 0, 0, 0, 0] = 0.0  # one stray zero, not a whole channel
  params["VmapBlock_0"]["Conv_0"]["kernel"] = k
  c = params["Block_0"]["Conv_0"]["kernel"].copy()  # (3, 3, 2, 4)
  c[..., 0, :] = 0.0
  params["Block_0"]["Conv_0"]["kernel"] = c
  report = sp.sparsity_report(params, layout=STACKED)

  assert [l.name for l in report.layers] == [
      "Block_0/Conv_0/kernel", "VmapBlock_0/Conv_0/kernel"]
  plain, ens = report.layers
  assert (plain.zeros, plain.num_channels, plain.channels_pruned) == (36, 2, 1)
  assert (ens.zeros, ens.num_channels, ens.channels_pruned) == (37, 4, 1)
  assert ens.channel_norms.shape == (2, 2)
  np.testing.assert_allclose(report.weight_sparsity, 100 * 73 / (72 + 144))
  np.testing.assert_allclose(report.channel_sparsity, 100 * 2 / 6)
  # All parameters: the BN biases and dense biases are zero-initialised.
  n_all = sum(x.size for x in jax.tree.leaves(params))
  n_zero = sum(int((x == 0).sum()) for x in jax.tree.leaves(params))
  np.testing.assert_allclose(report.total_weight_sparsity, 100 * n_zero / n_all)
  assert report.channel_norms().shape == (6,)
  assert np.sum(report.channel_norms() < 1e-15) == 2
  table = report.format_table()
  assert "VmapBlock_0/Conv_0/kernel" in table and "2x3x3x2x4" in table
  assert "BatchNorm" not in table
  # Output-channel groups: 4 filters per member.
  out_report = sp.sparsity_report(params, group="output", layout=STACKED)
  assert [l.num_channels for l in out_report.layers] == [4, 8]


def test_metrics_paper_channel_tolerance():
  w = np.ones((1, 1, 3, 2), np.float32)
  w[:, :, 0] = 1e-20  # norm < 1e-15: pruned by the paper's definition
  w[:, :, 1] = 1e-10  # small but not pruned
  report = sp.sparsity_report({"c": {"kernel": w}})
  assert report.layers[0].channels_pruned == 1
  assert report.weight_sparsity == 0.0  # no exact zeros
