"""Tests of the RVSM / RGSM / ADMM optax transformations and ``project``."""
import os
import subprocess
import sys
import textwrap

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fkjax import sparsity as sp
from tests.sparsity_params import LAYOUT, make_params

BETA, LAMB = 0.5, 2e-3          # RVSM threshold sqrt(2 * 2e-3 / 0.5) ≈ 0.089
LAMB1, LAMB2 = 6.25e-2, 1e-2    # RGSM channel threshold sqrt(2 LAMB1/BETA) = .5
RHO, PERCENT = 0.3, 50.0


def is_conv(path):
  return path[-1] == "kernel" and path[0] != "Dense_0"


def tree_items(tree):
  """{('Conv_0', 'kernel'): leaf, ...} for a nested dict."""
  return {
      tuple(k.key for k in p): v
      for p, v in jax.tree_util.tree_leaves_with_path(tree)
  }


# ------------------------------------------- an independent NumPy reference


def np_input_channel_norms(w):
  """Norms of input channels by explicit loops (members on leading axes)."""
  lead = w.shape[:-4]
  out = np.zeros(lead + (w.shape[-2],))
  for idx in np.ndindex(*lead):
    for i in range(w.shape[-2]):
      group = w[idx][:, :, i, :].astype(np.float64)
      out[idx + (i,)] = np.sqrt(np.sum(group**2))
  return out


def np_hard(w, gamma):
  return w * (np.abs(w) > gamma)


def np_group_prox(w, lamb1, beta):
  keep = np_input_channel_norms(w) > np.sqrt(2 * lamb1 / beta)
  return w * keep[..., None, None, :, None]


def np_group_lasso(w, lamb2):
  n = np_input_channel_norms(w)
  return lamb2 * w / np.sqrt(n**2 + 1e-8)[..., None, None, :, None]


def np_admm_proj(w, percent):
  """Element projection per layer / per member, stable tie-break."""
  out = w.copy()
  for idx in np.ndindex(*w.shape[:-4]):
    flat = out[idx].reshape(-1)  # a view of this member's kernel
    n_drop = int(np.floor(percent * flat.size / 100))
    flat[np.argsort(np.abs(flat), kind="stable")[:n_drop]] = 0
  return out


def np_train(method, params, grads, lrs, momentum=0.9, wd=5e-4):
  """The paper's update rules, written out (PyTorch-style SGD + splitting)."""
  w = {k: v.astype(np.float64) for k, v in tree_items(params).items()}
  buf = {k: np.zeros_like(v) for k, v in w.items()}
  u_dual = {k: np.zeros_like(v) for k, v in w.items()}
  history = []
  for g_tree, lr in zip(grads, lrs):
    g = tree_items(g_tree)
    new_w = {}
    for k, wk in w.items():
      d = g[k] + wd * wk
      if method == "rgsm" and is_conv(k):
        d = d + np_group_lasso(wk, LAMB2)
      buf[k] = momentum * buf[k] + d
      nk = wk - lr * (d + momentum * buf[k])  # Nesterov
      if is_conv(k):
        if method == "rvsm":
          nk -= lr * BETA * (wk - np_hard(wk, np.sqrt(2 * LAMB / BETA)))
        elif method == "rgsm":
          nk -= lr * BETA * (wk - np_group_prox(wk, LAMB1, BETA))
        elif method == "admm":
          z = np_admm_proj(wk + u_dual[k], PERCENT)
          u_dual[k] = u_dual[k] + wk - z
          nk -= lr * RHO * (wk - z + u_dual[k])
      new_w[k] = nk
    w = new_w
    history.append(w)
  return history


METHOD_HPARAMS = {
    "none": dict(layout=LAYOUT),
    "rvsm": dict(beta=BETA, lamb=LAMB, layout=LAYOUT),
    "rgsm": dict(beta=BETA, lamb1=LAMB1, lamb2=LAMB2, layout=LAYOUT),
    "admm": dict(rho=RHO, percent=PERCENT, layout=LAYOUT),
}


@pytest.mark.parametrize("method", ["none", "rvsm", "rgsm", "admm"])
def test_sparse_sgd_matches_numpy_rederivation(method):
  params = make_params()
  rng = np.random.default_rng(1)
  grads = [
      jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32),
                   params)
      for _ in range(6)
  ]
  # The lr drops after step 3: the splitting step must follow SGD's schedule.
  schedule = optax.piecewise_constant_schedule(0.2, {3: 0.25})
  lrs = [float(schedule(t)) for t in range(6)]
  tx = sp.sparse_sgd(method, schedule, **METHOD_HPARAMS[method])

  @jax.jit
  def step(p, s, g):
    updates, s = tx.update(g, s, p)
    return optax.apply_updates(p, updates), s

  p, s = params, tx.init(params)
  expected = np_train(method, params, grads, lrs)
  for t in range(6):
    p, s = step(p, s, grads[t])
    for k, v in tree_items(p).items():
      np.testing.assert_allclose(v, expected[t][k], rtol=2e-5, atol=2e-6,
                                 err_msg=f"{method} step {t} {k}")


def test_hyperparameters_make_the_proxes_nontrivial():
  # Guards the tests above: u = prox(w) must differ from w and from 0.
  for k, w in tree_items(make_params()).items():
    if is_conv(k):
      for u in [np_hard(w, np.sqrt(2 * LAMB / BETA)),
                np_group_prox(w, LAMB1, BETA), np_admm_proj(w, PERCENT)]:
        assert 0.05 < np.mean(u == 0) < 0.95, k


def test_masking_leaves_batchnorm_and_dense_untouched():
  params = make_params()
  grads = jax.tree.map(lambda x: 0.01 * jnp.ones_like(x), params)
  base_u, _ = sp.sparse_sgd("none", 0.1).update(
      grads, sp.sparse_sgd("none", 0.1).init(params), params)
  for method in ["rvsm", "rgsm", "admm"]:
    tx = sp.sparse_sgd(method, 0.1, **METHOD_HPARAMS[method])
    u, _ = tx.update(grads, tx.init(params), params)
    base, got = tree_items(base_u), tree_items(u)
    for k in got:
      if is_conv(k):
        assert not np.allclose(got[k], base[k]), (method, k)
      else:
        np.testing.assert_array_equal(got[k], base[k], err_msg=str((method, k)))


# ---------------------------------------- single transformations, chex.variants


class TransformsTest(chex.TestCase):

  def setUp(self):
    super().setUp()
    self.params = make_params()
    self.updates = jax.tree.map(lambda x: 0.01 * jnp.ones_like(x), self.params)

  def _check(self, tx, expected_fn, steps=2):
    """Runs ``steps`` updates with fixed params; compares conv leaves."""
    update = self.variant(tx.update)
    state = tx.init(self.params)
    for t in range(steps):
      out, state = update(self.updates, state, self.params)
      for k, v in tree_items(out).items():
        w, g = tree_items(self.params)[k], tree_items(self.updates)[k]
        want = expected_fn(w, g, t) if is_conv(k) else g
        np.testing.assert_allclose(v, want, rtol=1e-5, atol=1e-7)
    return state

  @chex.variants(with_jit=True, without_jit=True)
  def test_rvsm(self):
    lr = lambda t: 0.1 / (1.0 + t)  # a schedule, evaluated at the step count
    gamma = np.sqrt(2 * LAMB / BETA)
    state = self._check(
        sp.l0_split(BETA, LAMB, lr, layout=LAYOUT),
        lambda w, g, t: g - lr(t) * BETA * (w - np_hard(w, gamma)))
    assert optax.tree_utils.tree_get(state, "L0SplitState").count == 2

  @chex.variants(with_jit=True, without_jit=True)
  def test_group_lasso(self):
    self._check(sp.group_lasso(LAMB2, layout=LAYOUT),
                lambda w, g, t: g + np_group_lasso(w, LAMB2))

  @chex.variants(with_jit=True, without_jit=True)
  def test_group_l0_split(self):
    self._check(
        sp.group_l0_split(BETA, LAMB1, 0.1, layout=LAYOUT),
        lambda w, g, t: g - 0.1 * BETA * (w - np_group_prox(w, LAMB1, BETA)))

  @chex.variants(with_jit=True, without_jit=True)
  def test_admm_first_step(self):
    # From (z, u) = (Proj(w), 0): z' = Proj(w), u' = w - z', step uses both.
    def expected(w, g, t):
      z = np_admm_proj(w, PERCENT)
      return g - 0.1 * RHO * 2 * (w - z)
    self._check(sp.admm_split(RHO, PERCENT, 0.1, layout=LAYOUT), expected,
                steps=1)

  @chex.variants(with_jit=True, without_jit=True)
  def test_missing_params_is_a_clear_error(self):
    for tx in [sp.l0_split(BETA, LAMB, 0.1, layout=LAYOUT),
               sp.group_lasso(LAMB2, layout=LAYOUT),
               sp.group_l0_split(BETA, LAMB1, 0.1, layout=LAYOUT),
               sp.admm_split(RHO, PERCENT, 0.1, layout=LAYOUT)]:
      with self.assertRaisesRegex(ValueError, "parameters"):
        self.variant(tx.update)(self.updates, tx.init(self.params))


def test_rgsm_puts_its_pieces_around_the_optimiser():
  # An "optimiser" that doubles its input tells the order apart: the group
  # lasso goes through it, the splitting step is added after it.
  params = make_params()
  tx = sp.rgsm(optax.scale(2.0), beta=BETA, lamb1=LAMB1, lamb2=LAMB2,
               learning_rate=0.1, layout=LAYOUT)
  g = jax.tree.map(jnp.zeros_like, params)
  u, state = tx.update(g, tx.init(params), params)
  w = params["Conv_0"]["kernel"]
  np.testing.assert_allclose(
      u["Conv_0"]["kernel"],
      2 * np_group_lasso(w, LAMB2)
      - 0.1 * BETA * (w - np_group_prox(w, LAMB1, BETA)), rtol=1e-5,
      atol=1e-8)
  assert isinstance(state, sp.SparsifiedState)


def test_inject_hyperparams_with_beta_and_lambda_schedules():
  params = make_params()
  g = jax.tree.map(lambda x: 0.01 * jnp.ones_like(x), params)
  beta_s = lambda t: 0.2 + 0.1 * t
  lamb_s = lambda t: 1e-3 * (1.0 + t)
  tx = optax.inject_hyperparams(sp.l0_split)(beta=beta_s, lamb=lamb_s,
                                             learning_rate=0.1, layout=LAYOUT)
  state = tx.init(params)
  update = jax.jit(tx.update)
  for t in range(3):
    out, state = update(g, state, params)
    ref_tx = sp.l0_split(beta_s(t), lamb_s(t), 0.1, layout=LAYOUT)
    ref, _ = ref_tx.update(g, ref_tx.init(params), params)
    chex.assert_trees_all_close(out, ref, rtol=1e-5)
  # ADMM's percent as a schedule too; the state records the last one used.
  tx = optax.inject_hyperparams(sp.admm_split)(
      rho=RHO, percent=lambda t: 10.0 * t, learning_rate=0.1, layout=LAYOUT)
  state = tx.init(params)
  for t in range(3):
    _, state = jax.jit(tx.update)(g, state, params)
  admm_state = optax.tree_utils.tree_get(state, "ADMMState")
  assert float(admm_state.percent) == 20.0
  z = admm_state.z["Conv_0"]["kernel"]
  assert int(jnp.sum(z == 0)) == int(0.2 * z.size)


def test_admm_reset_inside_chain_mask_and_inject():
  params = make_params()
  g = jax.tree.map(lambda x: 0.01 * jnp.ones_like(x), params)
  tx = optax.chain(
      optax.sgd(0.1, momentum=0.9),
      # `structure` is a string: inject_hyperparams passes it through as is.
      optax.inject_hyperparams(sp.admm_split)(
          rho=RHO, percent=PERCENT, learning_rate=0.1, structure="channel",
          layout=LAYOUT),
  )
  state = tx.init(params)
  p = params
  for _ in range(3):
    u, state = tx.update(g, state, p)
    p = optax.apply_updates(p, u)
  before = optax.tree_utils.tree_get(state, "ADMMState")
  assert float(jnp.abs(before.u["Conv_0"]["kernel"]).sum()) > 0
  new_state = jax.jit(sp.admm_reset)(state, p)
  after = optax.tree_utils.tree_get(new_state, "ADMMState")
  for k, z in tree_items(after.z).items():
    w = tree_items(p)[k]
    np.testing.assert_array_equal(
        z, sp.admm_projection(w, PERCENT, structure="channel",
                              layout="MHWIO" if w.ndim == 5 else "HWIO"))
    np.testing.assert_array_equal(tree_items(after.u)[k], 0.0)
  # BatchNorm / dense are masked out of the ADMM state altogether.
  assert isinstance(after.z["BatchNorm_0"]["scale"], optax.MaskedNode)
  assert after.count == before.count  # only z and u are re-initialised
  chex.assert_trees_all_equal(new_state[0], state[0])  # SGD state untouched
  with pytest.raises(ValueError, match="no ADMMState"):
    sp.admm_reset(optax.sgd(0.1).init(params), params)


def test_project_each_method_and_mask():
  params = make_params()
  w = params["Conv_0"]["kernel"]
  e = params["Ens"]["Conv_0"]["kernel"]
  got = sp.project(params, "rvsm", beta=BETA, lamb=LAMB, layout=LAYOUT)
  np.testing.assert_array_equal(got["Conv_0"]["kernel"],
                                np_hard(w, np.sqrt(2 * LAMB / BETA)))
  got = sp.project(params, "rgsm", beta=BETA, lamb1=LAMB1, lamb2=LAMB2,
                   layout=LAYOUT)
  np.testing.assert_array_equal(got["Ens"]["Conv_0"]["kernel"],
                                np_group_prox(e, LAMB1, BETA))
  got = jax.jit(lambda p: sp.project(p, "admm", percent=30.0, rho=RHO,
                                    layout=LAYOUT))(params)
  np.testing.assert_array_equal(got["Ens"]["Conv_0"]["kernel"],
                                np_admm_proj(e, 30.0))
  for k, v in tree_items(got).items():
    if not is_conv(k):
      np.testing.assert_array_equal(v, tree_items(params)[k])
  assert sp.project(params, "none") is params
  # A prefix mask: only the ensemble subtree.
  got = sp.project(params, "rvsm", beta=BETA, lamb=1.0,
                   mask={"Conv_0": False, "Ens": True, "BatchNorm_0": False,
                         "Dense_0": False})
  np.testing.assert_array_equal(got["Conv_0"]["kernel"], w)
  np.testing.assert_array_equal(got["Ens"]["Conv_0"]["kernel"], 0.0 * e)
  with pytest.raises(ValueError, match="Unknown sparsification"):
    sp.project(params, "l1")
  with pytest.raises(TypeError):
    sp.project(params, "rvsm", beta=BETA, lamb=LAMB, lamb1=LAMB1,
               layout=LAYOUT)
  with pytest.raises(TypeError):
    sp.sparse_sgd("rvsm", 0.1, beta=BETA, layout=LAYOUT)


_SHARDED_SCRIPT = textwrap.dedent("""
    import os
    # the test process's XLA flags (tests/conftest.py's fast compiles), and
    # 4 host devices
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [
        os.environ.get("XLA_FLAGS"),
        "--xla_force_host_platform_device_count=4"]))
    import fkjax, jax, jax.numpy as jnp, numpy as np, optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from fkjax import sparsity as sp
    assert jax.device_count() == 4
    mesh = Mesh(np.array(jax.devices()), ("model",))
    rng = np.random.default_rng(0)
    params = {
        "conv": {"kernel": rng.standard_normal((3, 3, 8, 8), np.float32) * .1},
        "ens": {"kernel": rng.standard_normal((4, 3, 3, 8, 4), np.float32)},
        "bn": {"scale": np.ones(8, np.float32)},
    }
    specs = {"conv": {"kernel": P(None, None, None, "model")},
             "ens": {"kernel": P("model")}, "bn": {"scale": P()}}
    shard = lambda t: jax.tree.map(
        lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), t, specs)
    grads = jax.tree.map(lambda x: np.full_like(x, 0.01), params)
    lay = ("HWIO", "MHWIO")
    for method, hp in [("rvsm", dict(beta=.5, lamb=2e-3, layout=lay)),
                       ("rgsm", dict(beta=.5, lamb1=2e-2, lamb2=1e-2,
                                     layout=lay)),
                       ("admm", dict(rho=.3, percent=50., structure="channel",
                                     layout=lay)),
                       ]:
      tx = sp.sparse_sgd(method, 0.1, **hp)
      def run(p, g):
        s = tx.init(p)
        for _ in range(2):
          u, s = tx.update(g, s, p)
          p = optax.apply_updates(p, u)
        if method == "admm":
          s = sp.admm_reset(s, p)
        return sp.project(p, method, **hp), s
      ref, _ = jax.jit(run)(params, grads)
      out, _ = jax.jit(run)(shard(params), shard(grads))
      assert len(out["ens"]["kernel"].sharding.device_set) == 4
      for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(out)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5,
                                   atol=1e-7)
    print("SHARDED_OK")
""")


def test_works_with_params_sharded_over_a_mesh():
  # A fresh process: the 4 host devices must be requested before JAX starts.
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(
      [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
       env.get("PYTHONPATH", "")])
  env["JAX_PLATFORMS"] = "cpu"
  res = subprocess.run([sys.executable, "-c", _SHARDED_SCRIPT], env=env,
                       capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  assert "SHARDED_OK" in res.stdout
