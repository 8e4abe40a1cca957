"""The reports take any state a user holds: ``nnx.state(model)`` with its RNG
streams, counters and BatchNorm statistics, a linen variables dict, an
Equinox module with its functions, flags and keys, lists and tuples. Leaves
that are not weights are left out of every count and named; the counts are
those of the weights alone (NumPy reference)."""
import equinox as eqx
from flax import nnx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fkjax import sparsity as sp


def _zero_channel(w, axis, index):
  w = np.array(w)
  np.moveaxis(w, axis, 0)[index] = 0
  return w


def _expected(weights, kernels, in_axis):
  """(total % zeros over ``weights``, channels, pruned over ``kernels``)."""
  zeros = sum(np.count_nonzero(np.asarray(w) == 0) for w in weights)
  size = sum(np.size(w) for w in weights)
  norms = [np.sqrt(np.sum(np.square(np.asarray(k, np.float64)),
                          axis=tuple(a for a in range(4) if a != in_axis)))
           for k in kernels]
  return (100 * zeros / size, sum(n.size for n in norms),
          sum(int(np.count_nonzero(n == 0)) for n in norms))


def _skipped(report):
  return {leaf.name: leaf.kind for leaf in report.skipped}


class _NnxNet(nnx.Module):

  def __init__(self, rngs):
    self.convs = nnx.List([nnx.Conv(3, 8, (3, 3), rngs=rngs),
                           nnx.Conv(8, 8, (3, 3), rngs=rngs)])
    self.bn = nnx.BatchNorm(8, rngs=rngs)
    self.drop = nnx.Dropout(0.1, rngs=rngs)
    self.steps = nnx.Variable(jnp.array(7))
    self.rngs = rngs


def test_nnx_state_with_rngs_counters_and_batch_stats():
  model = _NnxNet(nnx.Rngs(0, dropout=1))
  kernel = model.convs[1].kernel
  kernel[...] = jnp.asarray(_zero_channel(kernel[...], 2, 5))
  report = sp.sparsity_report(nnx.state(model))

  assert [l.name for l in report.layers] == ["convs/0/kernel",
                                             "convs/1/kernel"]
  weights = jax.tree.leaves(nnx.state(model, nnx.Param))
  total, channels, pruned = _expected(
      weights, [model.convs[0].kernel[...], model.convs[1].kernel[...]], 2)
  assert report.total_weight_sparsity == pytest.approx(total)
  assert (sum(l.num_channels for l in report.layers),
          sum(l.channels_pruned for l in report.layers)) == (channels, pruned)
  skipped = _skipped(report)
  assert skipped["bn/mean"] == skipped["bn/var"] == "nnx.BatchStat"
  assert skipped["steps"] == "nnx.Variable"
  assert skipped["rngs/dropout/key"] == "nnx.RngKey"
  assert skipped["rngs/default/count"] == "nnx.RngCount"
  assert skipped["drop/rngs/key"] == "nnx.RngKey"
  assert "bn/scale" not in skipped and "convs/0/bias" not in skipped
  table = report.format_table()
  assert "not weights, left out (nnx.BatchStat): bn/mean, bn/var" in table
  # The sparsifier's report is the same function.
  rgsm = sp.get_sparsifier("rgsm", beta=1.0, lamb1=0.1)
  assert _skipped(rgsm.report(nnx.state(model))) == skipped


def test_linen_variables_dict_counts_only_params():
  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.Conv(4, (3, 3))(x)
      return nn.BatchNorm(use_running_average=False)(x)

  variables = Net().init(jax.random.key(0), jnp.ones((1, 5, 5, 3)))
  report = sp.sparsity_report(variables)
  assert _skipped(report) == {
      "batch_stats/BatchNorm_0/mean": "Flax collection 'batch_stats'",
      "batch_stats/BatchNorm_0/var": "Flax collection 'batch_stats'"}
  total, _, _ = _expected(jax.tree.leaves(variables["params"]), [], 2)
  assert report.total_weight_sparsity == pytest.approx(total)
  assert report.total_weight_sparsity == pytest.approx(
      sp.sparsity_report(variables["params"]).total_weight_sparsity)


class _EqxNet(eqx.Module):
  convs: list
  bn: eqx.nn.BatchNorm
  drop: eqx.nn.Dropout
  act: eqx.nn.Lambda
  key: jax.Array
  step: int

  def __init__(self, key):
    k1, k2 = jax.random.split(key)
    self.convs = [eqx.nn.Conv2d(3, 8, 3, key=k1),
                  eqx.nn.Conv2d(8, 8, 3, key=k2)]
    self.bn = eqx.nn.BatchNorm(8, "batch", mode="ema")
    self.drop = eqx.nn.Dropout(0.1)
    self.act = eqx.nn.Lambda(jax.nn.relu)
    self.key = key
    self.step = 3


def test_equinox_module_with_functions_keys_and_state():
  model = _EqxNet(jax.random.key(0))
  w = _zero_channel(model.convs[0].weight, 1, 2)    # OIHW: input 2
  model = eqx.tree_at(lambda m: m.convs[0].weight, model, jnp.asarray(w))
  report = sp.sparsity_report(model)

  assert [l.name for l in report.layers] == ["convs/0/weight",
                                             "convs/1/weight"]
  weights = [model.convs[0].weight, model.convs[0].bias,
             model.convs[1].weight, model.convs[1].bias,
             model.bn.weight, model.bn.bias]
  total, channels, pruned = _expected(
      weights, [model.convs[0].weight, model.convs[1].weight], 1)
  assert report.total_weight_sparsity == pytest.approx(total)
  assert report.layers[0].channels_pruned == pruned == 1
  assert sum(l.num_channels for l in report.layers) == channels
  skipped = _skipped(report)
  assert skipped["act/fn"] == "function"
  assert skipped["key"] == "PRNG key"
  assert skipped["step"] == "int"
  assert skipped["drop/p"] == "float"
  assert skipped["bn/inference"] == "bool"
  assert skipped["bn/ema_state_index/init/0"] == "eqx.nn.StateIndex"
  assert "bn/weight" not in skipped


def test_lists_tuples_and_non_float_arrays():
  rng = np.random.default_rng(0)
  k = lambda *s: rng.standard_normal(s).astype(np.float32)
  tree = [
      {"kernel": _zero_channel(k(3, 3, 4, 2), 2, 0), "bias": k(2)},
      ({"kernel": k(1, 1, 2, 3)}, {"count": np.array(3, np.int32)}),
      {"kernel": jax.random.key(1), "mask": np.ones((3,), bool)},
  ]
  report = sp.sparsity_report(tree)
  assert [l.name for l in report.layers] == ["0/kernel", "1/0/kernel"]
  assert _skipped(report) == {"1/1/count": "int32 array",
                              "2/kernel": "PRNG key", "2/mask": "bool array"}
  total, channels, pruned = _expected(
      [tree[0]["kernel"], tree[0]["bias"], tree[1][0]["kernel"]],
      [tree[0]["kernel"], tree[1][0]["kernel"]], 2)
  assert report.total_weight_sparsity == pytest.approx(total)
  assert report.channel_sparsity == pytest.approx(100 * pruned / channels)
  # A selection of no weight is still the one-line "nothing to sparsify".
  with pytest.raises(ValueError, match="nothing to sparsify"):
    sp.sparsity_report([{"kernel": jax.random.key(1)}])
