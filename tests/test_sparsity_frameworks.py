"""fkjax.sparsity on Flax linen, Flax NNX, Equinox and plain-dict trees.

* The four trees of the same weights give identical projections, reports and
  optimiser updates.
* The per-framework examples of docs/sparsity.md run (so they cannot rot).

Equinox is a test-only dependency (requirements-test.txt).
"""
import contextlib
import io
import pathlib
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from fkjax import sparsity as sp

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "sparsity.md"

# ------------------------------------------------ the same weights, 4 trees

C_IN, C1, C2, N_OUT = 3, 6, 8, 4


def hwio_weights(seed=0):
  """Conv kernels (HWIO) whose input channels have spread-out norms."""
  rng = np.random.default_rng(seed)
  scale = lambda n: np.linspace(0.2, 1.6, n, dtype=np.float32)[:, None]
  k1 = rng.standard_normal((3, 3, C_IN, C1)).astype(np.float32) * scale(C_IN)
  k2 = rng.standard_normal((3, 3, C1, C2)).astype(np.float32) * scale(C1)
  return {
      "conv1": {"kernel": 0.3 * k1,
                "bias": rng.standard_normal(C1, np.float32)},
      "conv2": {"kernel": 0.2 * k2,
                "bias": rng.standard_normal(C2, np.float32)},
      "head": {"kernel": rng.standard_normal((C2, N_OUT), np.float32),
               "bias": np.zeros(N_OUT, np.float32)},
  }


class LinenCNN(nn.Module):

  @nn.compact
  def __call__(self, x):
    x = nn.Conv(C1, (3, 3), name="conv1")(x)
    x = nn.Conv(C2, (3, 3), name="conv2")(x)
    return nn.Dense(N_OUT, name="head")(x.mean(axis=(1, 2)))


class NNXCNN(nnx.Module):

  def __init__(self, rngs):
    self.conv1 = nnx.Conv(C_IN, C1, (3, 3), rngs=rngs)
    self.conv2 = nnx.Conv(C1, C2, (3, 3), rngs=rngs)
    self.head = nnx.Linear(C2, N_OUT, rngs=rngs)


# The frameworks' own trees, built abstractly (no initialiser is compiled),
# with every leaf replaced by the weights of hwio_weights().


def linen_tree(w):
  params = jax.eval_shape(LinenCNN().init, jax.random.key(0),
                          jnp.zeros((1, 5, 5, C_IN)))["params"]
  return jax.tree.map(lambda _, x: jnp.asarray(x), params, w)


def nnx_state(w):
  graphdef, state = nnx.split(nnx.eval_shape(lambda: NNXCNN(nnx.Rngs(0))))
  def fill(path, _):
    layer, name = sp.layouts.path_key(path)
    return jnp.asarray(w[layer][name])
  state = jax.tree_util.tree_map_with_path(fill, state)
  model = nnx.merge(graphdef, state)
  return model, nnx.state(model, nnx.Param)


def to_oihw(k):
  return np.transpose(k, (3, 2, 0, 1))


def equinox_tree(w):
  import equinox as eqx  # test-only dependency: requirements-test.txt

  class EqxCNN(eqx.Module):
    conv1: eqx.nn.Conv2d
    conv2: eqx.nn.Conv2d
    head: eqx.nn.Linear

    def __init__(self, key):
      k1, k2, k3 = jax.random.split(key, 3)
      self.conv1 = eqx.nn.Conv2d(C_IN, C1, 3, key=k1)
      self.conv2 = eqx.nn.Conv2d(C1, C2, 3, key=k2)
      self.head = eqx.nn.Linear(C2, N_OUT, key=k3)

  model = eqx.filter_eval_shape(EqxCNN, jax.random.key(0))
  model = eqx.tree_at(
      lambda m: (m.conv1.weight, m.conv1.bias, m.conv2.weight, m.conv2.bias,
                 m.head.weight, m.head.bias),
      model,
      (jnp.asarray(to_oihw(w["conv1"]["kernel"])),
       jnp.asarray(w["conv1"]["bias"]).reshape(C1, 1, 1),
       jnp.asarray(to_oihw(w["conv2"]["kernel"])),
       jnp.asarray(w["conv2"]["bias"]).reshape(C2, 1, 1),
       jnp.asarray(w["head"]["kernel"].T), jnp.asarray(w["head"]["bias"])))
  return eqx.filter(model, eqx.is_array)


def conv_kernels_hwio(tree):
  """{'conv1': HWIO array, 'conv2': ...} from any of the four trees."""
  out = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    name = sp.masks.path_name(path)
    for layer in ("conv1", "conv2"):
      if name == f"{layer}/kernel":
        out[layer] = np.asarray(leaf)
      elif name == f"{layer}/weight":
        out[layer] = np.transpose(np.asarray(leaf), (2, 3, 1, 0))
  return out


def all_trees(w):
  return {
      "dict": jax.tree.map(jnp.asarray, w),
      "linen": linen_tree(w),
      "nnx": nnx_state(w)[1],
      "equinox": equinox_tree(w),
  }


SPARSIFIERS = {
    "rvsm": dict(beta=1.0, lamb=0.02),
    "rgsm": dict(beta=1.0, lamb1=0.5, lamb2=1e-2),
    "rgsm_out": dict(beta=1.0, lamb1=1.0, lamb2=1e-2, group="output"),
    "admm": dict(rho=0.5, percent=40.0),
    "admm_ch": dict(rho=0.5, percent=40.0, structure="channel"),
}


def make(name):
  return sp.get_sparsifier(name.split("_")[0], **SPARSIFIERS[name])


@pytest.mark.parametrize("name", sorted(SPARSIFIERS))
def test_four_frameworks_same_projection_and_report(name):
  w = hwio_weights()
  s = make(name)
  expected = conv_kernels_hwio(s.project(jax.tree.map(jnp.asarray, w)))
  ref_report = s.report(s.project(jax.tree.map(jnp.asarray, w)))
  # The projection is not trivial: it zeroes some but not all entries.
  frac = np.mean(np.concatenate([k.ravel() for k in expected.values()]) == 0)
  assert 0.05 < frac < 0.95, frac
  for framework, tree in all_trees(w).items():
    projected = s.project(tree)
    assert jax.tree.structure(projected) == jax.tree.structure(tree)
    got = conv_kernels_hwio(projected)
    assert sorted(got) == ["conv1", "conv2"], framework
    for layer in got:
      np.testing.assert_array_equal(got[layer], expected[layer],
                                    err_msg=f"{framework} {layer}")
    # Biases and the dense head are untouched.
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(projected),
                            jax.tree.leaves(tree)):
      if "bias" in sp.masks.path_name(path) or "head" in sp.masks.path_name(
          path):
        np.testing.assert_array_equal(a, b)
    report = s.report(projected)
    assert [l.name.split("/")[0] for l in report.layers] == ["conv1", "conv2"]
    for a, b in zip(report.layers, ref_report.layers):
      assert (a.zeros, a.size, a.num_channels, a.channels_pruned) == (
          b.zeros, b.size, b.num_channels, b.channels_pruned), framework
      np.testing.assert_allclose(a.channel_norms, b.channel_norms, rtol=1e-6)
    for field in ("weight_sparsity", "channel_sparsity",
                  "total_weight_sparsity"):
      assert getattr(report, field) == getattr(ref_report, field), (
          framework, field)


def test_four_frameworks_same_optimizer_updates():
  # A few RGSM and ADMM steps (group lasso, split, ADMM dual) with the same
  # gradients: the kernels move alike, whatever the tree and the layout.
  w = hwio_weights()
  rng = np.random.default_rng(3)
  grads_hwio = [jax.tree.map(
      lambda x: rng.standard_normal(x.shape).astype(np.float32), w)
      for _ in range(3)]
  for name in ("rgsm", "admm_ch"):
    s = make(name)
    results = {}
    for framework, tree in all_trees(w).items():
      tx = s.optimizer(0.05)
      state = tx.init(tree)
      params = tree
      for g in grads_hwio:
        # The same gradient, laid out like this framework's params.
        grads = jax.tree.map(lambda x: x, params)
        leaves = []
        for path, leaf in jax.tree_util.tree_leaves_with_path(params):
          n = sp.masks.path_name(path)
          layer, attr = n.split("/")
          src = g[layer]["kernel" if attr in ("kernel", "weight") else attr]
          if attr == "weight" and leaf.ndim == 4:
            src = to_oihw(src)
          elif attr == "weight":
            src = src.T
          leaves.append(jnp.asarray(src).reshape(leaf.shape))
        grads = jax.tree.unflatten(jax.tree.structure(params), leaves)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
      params, state = s.end_of_epoch(params, state)
      results[framework] = conv_kernels_hwio(s.evaluated_params(params))
    for framework, got in results.items():
      for layer in got:
        np.testing.assert_allclose(got[layer], results["dict"][layer],
                                   rtol=1e-5, atol=1e-6,
                                   err_msg=f"{name} {framework} {layer}")


def test_nnx_optimizer_with_admm_end_of_epoch():
  # nnx.Optimizer wraps its state in OptVariables; admm_reset still finds z
  # and u, matches them to the params by path, and training goes on.
  model, _ = nnx_state(hwio_weights())
  s = sp.get_sparsifier("admm", rho=0.5, percent=40.0)
  optimizer = nnx.Optimizer(model, s.optimizer(0.05), wrt=nnx.Param)
  x = jnp.ones((2, 5, 5, C_IN))

  def loss(m):
    y = m.conv2(m.conv1(x))
    return jnp.sum(m.head(y.mean(axis=(1, 2))) ** 2)

  for _ in range(2):
    optimizer.update(model, nnx.grad(loss)(model))
  admm_state = optax.tree_utils.tree_get(optimizer.opt_state, "ADMMState")
  assert float(jnp.abs(admm_state.u["conv1"]["kernel"][...]).sum()) > 0
  params, optimizer.opt_state = s.end_of_epoch(nnx.state(model, nnx.Param),
                                               optimizer.opt_state)
  admm_state = optax.tree_utils.tree_get(optimizer.opt_state, "ADMMState")
  np.testing.assert_array_equal(admm_state.u["conv1"]["kernel"][...], 0.0)
  np.testing.assert_array_equal(
      admm_state.z["conv2"]["kernel"][...],
      sp.admm_projection(model.conv2.kernel[...], 40.0, layout="HWIO"))
  optimizer.update(model, nnx.grad(loss)(model))  # the state still works


# ------------------------------------------------------- the docs' examples


def doc_examples():
  text = DOCS.read_text()
  return dict(re.findall(
      r"<!-- example: (\w+) -->\n```python\n(.*?)\n```", text, re.DOTALL))


def test_docs_have_one_example_per_framework():
  assert sorted(doc_examples()) == ["equinox", "jax", "linen", "nnx"]


@pytest.mark.parametrize("framework", ["linen", "nnx", "equinox", "jax"])
def test_docs_example_runs(framework):
  code = doc_examples()[framework]
  namespace = {"__name__": f"docs_example_{framework}"}
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(code, f"docs/sparsity.md:{framework}", "exec"), namespace)
  lines = out.getvalue().splitlines()
  kernel = "weight" if framework == "equinox" else "kernel"
  assert [l.split(":")[0] for l in lines] == [f"conv1/{kernel}",
                                             f"conv2/{kernel}"]
  report = namespace["report"]
  assert [l.num_channels for l in report.layers] == [3, 8]
  # The example trained: 10 steps went through the RGSM splitting step...
  opt_state = (namespace["optimizer"].opt_state if framework == "nnx"
               else namespace["opt_state"])
  split = optax.tree_utils.tree_get(opt_state, "GroupL0SplitState")
  assert int(np.asarray(jax.tree.leaves(split.count)[0])) == 10
  # ... and the epoch-end projection left every channel either pruned or
  # above the RGSM threshold.
  s = namespace["sp"]
  threshold = np.sqrt(2 * s.lamb1 / s.beta)
  for layer in report.layers:
    norms = layer.channel_norms
    assert np.all((norms < sp.CHANNEL_ZERO_TOL) | (norms > threshold))
