"""Layouts say what every axis is: a stacked axis (scanned layers, ensemble
members, vmapped models) stays apart, wherever it sits, and a letter that
says nothing known is refused.

The reference is NumPy, one layer at a time: a stacked kernel gives each
layer the channel norms, the pruned channels, the prox and ADMM's projection
that the layer alone gives.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fkjax import sparsity as sp

# Input-channel norms of three layers (HWIO kernels 3x3x4x5): zeroed
# channels and small ones differ from layer to layer, so pooling the layers
# (one group per channel across the stack) prunes nothing and keeps others.
NORMS = np.array([[0.0, 1.0, 2.0, 3.0],
                  [3.0, 0.0, 0.0, 2.0],
                  [1.5, 2.5, 0.0, 0.2]])
BETA, LAMB1 = 1.0, 0.72   # the prox keeps channels with norm > 1.2
PERCENT = 50.0            # ADMM: the 2 smallest of each layer's 4 channels


def _layers(norms=NORMS, seed=0):
  """One HWIO kernel per row of ``norms``, input channel i of norm
  norms[row, i]."""
  rng = np.random.default_rng(seed)
  out = []
  for row in norms:
    w = rng.standard_normal((3, 3, len(row), 5))
    w /= np.sqrt(np.sum(w * w, axis=(0, 1, 3), keepdims=True))
    out.append((w * row[None, None, :, None]).astype(np.float32))
  return out


def _np_norms(w):   # HWIO, float64
  return np.sqrt(np.sum(np.square(w.astype(np.float64)), axis=(0, 1, 3)))


def _np_prox(w):
  return np.where((_np_norms(w) ** 2 > 2 * LAMB1 / BETA)[None, None, :, None],
                  w, 0)


def _np_admm_elements(w):
  flat = np.abs(w).ravel()
  drop = np.argsort(flat, kind="stable")[:int(PERCENT * flat.size // 100)]
  keep = np.ones(flat.size, bool)
  keep[drop] = False
  return np.where(keep.reshape(w.shape), w, 0)


def _np_admm_channels(w):
  norms = _np_norms(w)
  drop = np.argsort(norms, kind="stable")[:int(PERCENT * len(norms) // 100)]
  keep = np.ones(len(norms), bool)
  keep[drop] = False
  return np.where(keep[None, None, :, None], w, 0)


# (layout, how a stack of HWIO layers becomes that layout's array, how one
# layer of it goes back to HWIO).
STACKS = {
    "LHWIO": (lambda ls: np.stack(ls), lambda w: w),       # nn.scan
    "MHWIO": (lambda ls: np.stack(ls), lambda w: w),       # nn.vmap
    "SHWIO": (lambda ls: np.stack(ls), lambda w: w),
    "HWLIO": (lambda ls: np.stack(ls, axis=2), lambda w: w),
    # Equinox's OIHW, scanned (eqx.filter_vmap'd or lax.scan'd layers).
    "LOIHW": (lambda ls: np.stack([l.transpose(3, 2, 0, 1) for l in ls]),
              lambda w: w.transpose(2, 3, 1, 0)),
}


def _unstack(x, layout):
  """The layers of ``x`` (stacked axis of ``layout``) in HWIO."""
  axis = sp.Layout(layout).stack_axes[0]
  to_hwio = STACKS[layout][1]
  return [to_hwio(np.take(x, i, axis=axis)) for i in range(x.shape[axis])]


@pytest.mark.parametrize("layout", sorted(STACKS))
def test_a_stacked_kernel_is_its_layers_one_by_one(layout):
  layers = _layers()
  stacked = STACKS[layout][0](layers)
  name = "weight" if layout.endswith("OIHW") else "kernel"
  tree = {"block": {name: stacked}}

  report = sp.sparsity_report(tree, layout=layout)
  (layer,) = report.layers
  np.testing.assert_allclose(layer.channel_norms,
                             np.stack([_np_norms(l) for l in layers]),
                             rtol=1e-6, atol=1e-7)
  assert layer.num_channels == NORMS.size
  assert layer.channels_pruned == np.count_nonzero(NORMS == 0) == 4

  prox = sp.project(tree, "rgsm", beta=BETA, lamb1=LAMB1, layout=layout)
  admm = sp.project(tree, "admm", percent=PERCENT, structure="channel",
                    layout=layout)
  elements = sp.project(tree, "admm", percent=PERCENT, layout=layout)
  for got, ref in ((prox, _np_prox), (admm, _np_admm_channels),
                   (elements, _np_admm_elements)):
    (out,) = jax.tree.leaves(got)
    for mine, one in zip(_unstack(np.asarray(out), layout), layers):
      np.testing.assert_array_equal(mine, ref(one))

  # ADMM (the authors' variant adds its pull once per layer) counts them.
  spec = sp.ADMMSpec("channel", "input", sp.layouts.normalize(layout))
  assert spec.num_layers(tree) == len(layers)


def test_an_ensemble_of_scanned_stacks_keeps_every_layer_apart():
  # (members, layers, H, W, I, O): each (member, layer) is a layer.
  norms = np.concatenate([NORMS, NORMS[::-1] * 2])
  layers = _layers(norms)
  stacked = np.stack(layers).reshape(2, 3, *layers[0].shape)
  tree = {"kernel": stacked}
  (layer,) = sp.sparsity_report(tree, layout="MLHWIO").layers
  assert layer.channel_norms.shape == (2, 3, 4)
  np.testing.assert_allclose(layer.channel_norms.reshape(6, 4),
                             [_np_norms(l) for l in layers], rtol=1e-6,
                             atol=1e-7)
  out = np.asarray(sp.admm_projection(stacked, PERCENT, "channel",
                                      layout="MLHWIO"))
  for mine, one in zip(out.reshape(6, *layers[0].shape), layers):
    np.testing.assert_array_equal(mine, _np_admm_channels(one))


class _Block(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    return nn.relu(nn.Conv(4, (3, 3), use_bias=False)(x)), None


class _Net(nn.Module):
  """A conv scanned over 3 layers, then an ensemble of 2 convs (nn.vmap)."""

  @nn.compact
  def __call__(self, x):
    x, _ = nn.scan(_Block, variable_axes={"params": 0},
                   split_rngs={"params": True}, length=3)(name="scan")(x, None)
    ens = nn.vmap(nn.Conv, variable_axes={"params": 0},
                  split_rngs={"params": True}, in_axes=None,
                  axis_size=2)(4, (3, 3), name="ensemble")
    return ens(x)


def test_flax_scan_and_vmap_give_the_layers_taken_one_by_one():
  # Where Flax puts the stacked axis (shapes only: nothing to compile).
  shapes = jax.eval_shape(_Net().init, jax.random.key(0),
                          jnp.ones((1, 6, 6, 4)))["params"]
  scan_shape = shapes["scan"]["Conv_0"]["kernel"].shape
  ens_shape = shapes["ensemble"]["kernel"].shape
  assert scan_shape == (3, 3, 3, 4, 4) and ens_shape == (2, 3, 3, 4, 4)
  rng = np.random.default_rng(1)
  scanned = rng.standard_normal(scan_shape).astype(np.float32)
  members = rng.standard_normal(ens_shape).astype(np.float32)
  # Prune two channels of the second scanned layer and one of member 0.
  scanned[1, :, :, [0, 2]] = 0
  members[0, :, :, 3] = 0

  scan = sp.sparsity_report({"scan": {"kernel": scanned}}, layout="LHWIO")
  ens = sp.sparsity_report({"ensemble": {"kernel": members}}, layout="MHWIO")
  one_by_one = {
      l.name: l for l in sp.sparsity_report(
          {f"{name}{i}": {"kernel": k[i]}
           for name, k in (("scan", scanned), ("ensemble", members))
           for i in range(k.shape[0])}).layers}
  for report, name in ((scan, "scan"), (ens, "ensemble")):
    (layer,) = report.layers
    for i, row in enumerate(layer.channel_norms):
      np.testing.assert_allclose(
          row, one_by_one[f"{name}{i}/kernel"].channel_norms, rtol=1e-12)
  assert (scan.layers[0].channels_pruned, ens.layers[0].channels_pruned) == (
      2, 1)
  assert scan.channel_sparsity == pytest.approx(100 * 2 / 12)

  # What is pruned: ADMM's channel projection of the whole tree, layer by
  # layer.
  out = sp.project({"scan": {"kernel": scanned}}, "admm", percent=PERCENT,
                   structure="channel", layout="LHWIO")["scan"]["kernel"]
  for i in range(3):
    np.testing.assert_array_equal(out[i], _np_admm_channels(scanned[i]))


@pytest.mark.parametrize("bad", ["XHWIO", "THWIO", "KIO", "NHWIO", "hwio"])
def test_an_unknown_letter_is_refused_in_one_line(bad):
  with pytest.raises(ValueError, match="unknown axis letter") as e:
    sp.Layout(bad)
  assert "\n" not in str(e.value)
  # Every public door takes the same check.
  tree = {"kernel": np.ones((2, 3, 3, 4, 5), np.float32)[..., :len(bad)]}
  with pytest.raises(ValueError, match="unknown axis letter"):
    sp.sparsity_report(tree, layout=bad)
  with pytest.raises(ValueError, match="unknown axis letter"):
    sp.project(tree, "rvsm", beta=1.0, lamb=0.1, layout=bad)
  with pytest.raises(ValueError, match="unknown axis letter"):
    sp.group_l0_prox(np.ones((2, 3, 3, 4, 5)), 0.1, 1.0, layout=bad)


def test_the_letters():
  lay = sp.Layout("MLHWIO")
  assert lay.stack_axes == (0, 1) and lay.spatial_axes == (2, 3)
  assert str(lay.layer) == "HWIO"
  assert lay.group_axes("input") == (2, 3, 5)
  assert lay.group_axes("output") == (2, 3, 4)
  for bad in ["MMHWIO", "HHWIO", "HWIIO", "HWI", ""]:
    with pytest.raises(ValueError):
      sp.Layout(bad)
  x = np.arange(2 * 3 * 4 * 5 * 6).reshape(3, 4, 2, 5, 6)
  lay = sp.Layout("HWLIO")
  assert lay.layers_first(x).shape == (2, 3, 4, 5, 6)
  np.testing.assert_array_equal(lay.layers_back(lay.layers_first(x)), x)
