"""Tests of the steps of fkjax.slim.analysis.slim_member, on numpy variables.

No model is compiled: each test prunes a ResNet8's variables by hand and
checks what one step decides (tests/test_slim.py checks that the slim
networks compute the original's logits).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fkjax.models import create_model
from fkjax.slim import analysis, graph, liveness


@pytest.fixture(scope="module")
def shapes():
  """ResNet8's variable shapes (traced, not compiled), with and without skip."""
  x = jnp.zeros((1, 8, 8, 3))
  return {skip: jax.eval_shape(create_model(depth=8, skip=skip).init,
                               jax.random.key(0), x)
          for skip in (True, False)}


def variables(shapes, skip=True, seed=0):
  """``(params, batch_stats)`` drawn at random as numpy arrays (writable)."""
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = str(path[-1].key)
    if name == "kernel":
      return rng.normal(0, 0.3, leaf.shape).astype(np.float32)
    low, high = {"scale": (0.5, 1.5), "var": (0.5, 2.0)}.get(name,
                                                            (-0.3, 0.3))
    return rng.uniform(low, high, leaf.shape).astype(np.float32)

  v = jax.tree_util.tree_map_with_path(draw, shapes[skip])
  return v["params"], v["batch_stats"]


def slim(params, stats, skip=True, noise_coef=0.0, multiple=1):
  config = {"depth": 8, "skip": skip, "noise_coef": noise_coef}
  return analysis.slim_member(config, params, stats, multiple=multiple)


def relu_bn_of_zero(params, stats, path):
  """What flax's BatchNorm (as fkjax.models configures it) gives for 0."""
  p, s = params, stats
  for k in path.split("/"):
    p, s = p[k], s[k]
  bn = nn.BatchNorm(use_running_average=True, epsilon=1e-5)
  out = bn.apply({"params": p, "batch_stats": s},
                 jnp.zeros((1, len(p["scale"]))))
  return np.maximum(np.asarray(out[0], np.float64), 0)


def test_bn_constant_is_what_batchnorm_gives_for_zero(shapes):
  params, stats = variables(shapes)
  bn = graph.bn_variables(params, stats, "stage1_block1/bn2")
  bn["scale"][0] = 0.0  # a constant channel: relu(bias)
  value = liveness.bn_constant(bn)
  expected = relu_bn_of_zero(params, stats, "stage1_block1/bn2")
  assert value.dtype == np.float32
  assert np.any(value > 0) and np.any(value == 0)  # both sides of the relu
  np.testing.assert_allclose(value, expected, rtol=1e-6, atol=0)
  assert value[0] == max(bn["bias"][0], 0)


def test_round_up_adds_the_first_channels_of_the_pool_it_lacks():
  mask = np.zeros(16, bool)
  mask[[5, 9]] = True
  assert list(np.flatnonzero(liveness.round_up(
      mask, np.ones(16, bool), 4))) == [0, 1, 5, 9]
  pool = np.ones(16, bool)
  pool[[0, 2]] = False
  assert list(np.flatnonzero(liveness.round_up(mask, pool, 4))) == [1, 3, 5,
                                                                    9]
  assert not np.any(mask[[0, 1]])  # the input is not changed


@pytest.mark.parametrize("count,pool_size,multiple,expected", [
    (10, 16, 4, 12),   # 4 left out: a multiple, kept out
    (9, 15, 4, 15),    # 12 would leave 3 out: the whole pool instead
    (0, 3, 4, 3),      # a pool smaller than a multiple is kept whole
    (0, 8, 4, 0),      # nothing to round
    (8, 8, 3, 8),      # a mask of the whole pool stays so
])
def test_round_up_keeps_the_pool_whole_when_less_than_a_multiple_would_go(
    count, pool_size, multiple, expected):
  mask = np.zeros(pool_size, bool)
  mask[:count] = True
  out = liveness.round_up(mask, np.ones(pool_size, bool), multiple)
  assert out.sum() == expected and np.all(out[:count])


def test_zero_channel_behind_batchnorm_is_folded_into_a_const_kernel(shapes):
  params, stats = variables(shapes)
  b = "stage2_block1"
  params[b]["conv1"]["kernel"][..., 5] = 0     # inner channel 5 is zero
  params[b]["bn2"]["bias"][5] = 0.7            # ...and relu(bn2(0)) > 0
  spec, v = slim(params, stats)
  block = spec.blocks[[x.name for x in spec.blocks].index(b)]
  assert 5 not in block.conv1.out_channels and 5 not in block.bn2.channels
  assert 5 not in block.conv2.in_channels and block.conv2.has_const
  k = relu_bn_of_zero(params, stats, f"{b}/bn2")[5]
  w = params[b]["conv2"]["kernel"][:, :, 5, :].astype(np.float64)
  np.testing.assert_allclose(v["params"][b]["conv2"]["const_kernel"],
                             (k * w)[:, :, None, :], rtol=1e-6)
  # The other convolutions read no constant.
  assert [c for c in ("conv1", "shortcut") if getattr(
      block, c).has_const] == []


def test_a_constant_of_zero_adds_no_const_kernel(shapes):
  params, stats = variables(shapes)
  b = "stage2_block1"
  params[b]["conv1"]["kernel"][..., 5] = 0
  params[b]["bn2"]["bias"][5] = -0.7           # relu(bn2(0)) = 0
  stats[b]["bn2"]["mean"][5] = 0.0
  spec, v = slim(params, stats)
  block = spec.blocks[[x.name for x in spec.blocks].index(b)]
  assert 5 not in block.conv2.in_channels
  assert not block.conv2.has_const
  assert "const_kernel" not in v["params"][b]["conv2"]


def test_zero_batchnorm_scale_makes_a_constant_for_every_reader(shapes):
  params, stats = variables(shapes)
  b = "stage2_block1"  # bn1 feeds conv1 and the projection shortcut
  params[b]["bn1"]["scale"][4] = 0.0
  params[b]["bn1"]["bias"][4] = 0.4
  spec, v = slim(params, stats)
  block = spec.blocks[[x.name for x in spec.blocks].index(b)]
  for conv in ("conv1", "shortcut"):
    layer = getattr(block, conv)
    assert 4 not in layer.in_channels and layer.has_const
    w = params[b][conv]["kernel"][:, :, 4, :].astype(np.float64)
    np.testing.assert_allclose(v["params"][b][conv]["const_kernel"][:, :, 0],
                               0.4 * w, rtol=1e-6)
  assert 4 not in block.bn1.channels
  assert 4 in spec.stem.out_channels  # the stream itself is not constant


def test_constant_features_are_folded_into_the_head_bias(shapes):
  params, stats = variables(shapes)
  # Stage 3's stream channel 7: written by no producer, so exactly zero.
  for conv in ("shortcut", "conv2"):
    params["stage3_block1"][conv]["kernel"][..., 7] = 0
  params["bn_final"]["bias"][7] = 0.6
  spec, v = slim(params, stats)
  assert 7 not in spec.head.in_channels and 7 not in spec.bn_final.channels
  k = relu_bn_of_zero(params, stats, "bn_final")[7]
  w, bias = params["head"]["kernel"], params["head"]["bias"]
  np.testing.assert_allclose(v["params"]["head"]["bias"],
                             bias + k * w[7], rtol=1e-6)
  assert not np.allclose(k * w[7], 0)


def test_a_block_whose_inner_channels_are_all_zero_reads_only_constants(
    shapes):
  params, stats = variables(shapes)
  b = "stage2_block1"
  params[b]["conv1"]["kernel"][:] = 0
  spec, v = slim(params, stats)
  block = spec.blocks[[x.name for x in spec.blocks].index(b)]
  assert block.conv1.out_channels == () and block.bn2.channels == ()
  assert block.conv2.in_channels == () and block.conv2.has_const
  assert v["params"][b]["conv2"]["kernel"].shape[2] == 0
  k = relu_bn_of_zero(params, stats, f"{b}/bn2")
  w = params[b]["conv2"]["kernel"].astype(np.float64)
  np.testing.assert_allclose(v["params"][b]["conv2"]["const_kernel"][:, :, 0],
                             np.einsum("hwco,c->hwo", w, k), rtol=1e-5,
                             atol=1e-6)


def test_liveness_repeats_until_no_more_channel_goes(shapes):
  """conv2 ignores inner channel 3, so conv1 drops output 3; the stem's
  channel 0 fed only that output, so the stem drops it too (a second pass)."""
  params, stats = variables(shapes, skip=False)
  b = params["stage1_block1"]
  b["conv2"]["kernel"][:, :, 3, :] = 0
  b["conv1"]["kernel"][:, :, 0, :] = 0
  b["conv1"]["kernel"][:, :, 0, 3] = 0.5
  spec, _ = slim(params, stats, skip=False)
  block = spec.blocks[0]
  assert 3 not in block.conv1.out_channels
  assert 0 not in block.conv1.in_channels
  assert 0 not in spec.stem.out_channels


def test_rounded_widths_read_the_extra_channels_through_zero_weights(shapes):
  params, stats = variables(shapes)
  b = "stage1_block1"
  params[b]["conv1"]["kernel"][..., 0] = 0       # inner channel 0: constant
  params[b]["bn2"]["bias"][0] = 0.7
  params[b]["conv2"]["kernel"][:, :, 1:7, :] = 0  # conv2 uses 7..15
  spec, v = slim(params, stats, multiple=4)
  block = spec.blocks[0]
  # 9 channels round up to 12: the first ones it lacks, 0 (the constant,
  # folded), 1 and 2, are computed and read through zero weights.
  rounded = (0, 1, 2) + tuple(range(7, 16))
  assert block.conv1.out_channels == rounded == block.conv2.in_channels
  assert block.conv2.has_const
  kernel = v["params"][b]["conv2"]["kernel"]
  assert not np.any(kernel[:, :, :3]) and np.all(kernel[:, :, 3:] != 0)
  exact, _ = slim(params, stats)
  assert exact.blocks[0].conv2.in_channels == tuple(range(7, 16))


def test_graph_of_a_skip_network_shares_the_stream(shapes):
  params, stats = variables(shapes)
  blocks = graph.block_layout(8, 1, skip=True)
  assert [b.projection for b in blocks] == [False, True, True]
  g = graph.build_graph(params, stats, blocks, skip=True, noised=True)
  # The identity block writes the stem's space; noise goes into every
  # block's output, so every stream is noised, inner tensors are not.
  assert g.spaces["stream0"].producers == ["stem", "stage1_block1/conv2"]
  assert g.spaces["stage2_block1/stream"].producers == [
      "stage2_block1/conv2", "stage2_block1/shortcut"]
  assert [n for n, s in g.spaces.items() if s.noised] == [
      "stream0", "stage2_block1/stream", "stage3_block1/stream"]
  assert g.layers["head"].inp == "stage3_block1/stream"


def test_block_layout_refuses_a_depth_not_6n_plus_2():
  with pytest.raises(ValueError, match="6n\\+2"):
    graph.block_layout(10, 1, skip=True)
  wide = graph.block_layout(14, 2, skip=False)
  assert [(b.cin, b.cout, b.strides, b.projection) for b in wide[1:3]] == [
      (32, 32, 1, False), (32, 64, 2, False)]
