"""Property tests: Theorem 1 of the paper, and RVSM/RGSM versus ADMM."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fkjax import sparsity as sp

# --------------------------------------------------------------- Theorem 1

DIM, STEPS, NUM_PROBLEMS = 24, 150, 8
LIPSCHITZ = 4.0


def quadratic_problem(key):
  """f(w) = ½ wᵀAw − bᵀw with eigenvalues of A in [0.05, L], λ_max(A) = L."""
  k1, k2, k3, k4 = jax.random.split(key, 4)
  q, _ = jnp.linalg.qr(jax.random.normal(k1, (DIM, DIM)))
  eig = jax.random.uniform(k2, (DIM,), minval=0.05, maxval=LIPSCHITZ)
  eig = eig.at[0].set(LIPSCHITZ)
  a = (q * eig) @ q.T
  b = jax.random.normal(k3, (DIM,))
  w0 = jax.random.normal(k4, (DIM,))
  return a, b, w0


@jax.jit
def rvsm_lagrangian_trajectory(keys, beta, lamb, eta_factor):
  """L_β(w_t, u_t) along plain-gradient RVSM, for a batch of problems.

  ``eta = eta_factor * 2 / (beta + L)``: Theorem 1 covers ``eta_factor < 1``.
  """
  eta = eta_factor * 2.0 / (beta + LIPSCHITZ)
  gamma = jnp.sqrt(2.0 * lamb / beta)
  # Plain gradient descent (no momentum, no weight decay) + the splitting step.
  tx = sp.rvsm(optax.sgd(eta), beta=beta, lamb=lamb, learning_rate=eta,
               mask=None)

  def one_problem(key):
    a, b, w0 = quadratic_problem(key)
    f = lambda w: 0.5 * w @ a @ w - b @ w

    def lagrangian(w):
      u = sp.hard_threshold(w, gamma)
      return (f(w) + lamb * jnp.count_nonzero(u)
              + 0.5 * beta * jnp.sum((w - u) ** 2))

    def step(carry, _):
      w, state = carry
      updates, state = tx.update(jax.grad(f)(w), state, w)
      w = optax.apply_updates(w, updates)
      u_zeros = jnp.mean(sp.hard_threshold(w, gamma) == 0)
      return (w, state), (lagrangian(w), u_zeros)

    _, (values, u_sparsity) = jax.lax.scan(
        step, (w0, tx.init(w0)), None, length=STEPS)
    return jnp.concatenate([lagrangian(w0)[None], values]), u_sparsity[-1]

  return jax.vmap(one_problem)(keys)


def test_theorem1_rvsm_decreases_the_relaxed_lagrangian_monotonically():
  keys = jax.random.split(jax.random.key(0), NUM_PROBLEMS)
  # β and λ chosen so the threshold sqrt(2λ/β) = 0.5 sits among the |w|'s.
  values, u_sparsity = rvsm_lagrangian_trajectory(keys, 1.0, 0.125, 0.95)
  values = np.asarray(values, np.float64)
  increments = np.diff(values, axis=1)
  tol = 1e-5 * (1.0 + np.abs(values[:, :-1]))  # float32 rounding
  assert np.all(increments <= tol), increments.max()
  assert np.all(values[:, -1] < values[:, 0] - 1.0)  # and it really moves
  # The ℓ0 term is active: u is sparse but not empty.
  assert np.all((u_sparsity > 0.05) & (u_sparsity < 0.95)), u_sparsity


def test_theorem1_check_detects_a_too_large_step():
  # Control for the test above: η = 2.2/L > 2/(β + L) makes the top
  # eigen-direction of A diverge, and the Lagrangian goes up.
  keys = jax.random.split(jax.random.key(0), NUM_PROBLEMS)
  factor = 2.2 / LIPSCHITZ * (1.0 + LIPSCHITZ) / 2.0
  values, _ = rvsm_lagrangian_trajectory(keys, 1.0, 0.125, factor)
  assert np.all(np.max(np.diff(np.asarray(values), axis=1), axis=1) > 0)


# ------------------------------------------------- RVSM / RGSM versus ADMM


def sparse_regression():
  """Least squares with a conv-kernel-shaped weight that is truly sparse.

  Half the input channels are unused, and 30 % of the other weights are 0.
  """
  rng = np.random.default_rng(0)
  n, cin, cout = 512, 8, 4
  w_true = rng.standard_normal((3, 3, cin, cout)).astype(np.float32) * 0.5
  w_true[:, :, cin // 2:, :] = 0.0
  w_true *= rng.random(w_true.shape) > 0.3
  x = rng.standard_normal((n, 9 * cin)).astype(np.float32)
  noise = 0.05 * rng.standard_normal((n, cout)).astype(np.float32)
  y = x @ w_true.reshape(-1, cout) + noise

  def loss(p):
    pred = x @ p["conv"]["kernel"].reshape(-1, cout)
    return 0.5 * jnp.mean(jnp.sum((pred - y) ** 2, axis=-1))

  w0 = (0.1 * rng.standard_normal(w_true.shape)).astype(np.float32)
  return loss, {"conv": {"kernel": w0}}


def train(method, hparams, loss, params, epochs=15, steps=20, lr=0.05):
  """The paper's protocol at toy scale.

  Full-batch SGD (momentum 0.9, Nesterov, weight decay 5e-4) with the method's
  sparsifier; RVSM / RGSM replace w by u = project(w) at every epoch's end;
  ADMM re-initialises z, u at every epoch's start and its w is what it learned.
  """
  tx = sp.sparse_sgd(method, lr, **hparams)

  @jax.jit
  def epoch(p, s):
    def step(carry, _):
      p, s = carry
      updates, s = tx.update(jax.grad(loss)(p), s, p)
      return (optax.apply_updates(p, updates), s), None
    return jax.lax.scan(step, (p, s), None, length=steps)[0]

  state = tx.init(params)
  for _ in range(epochs):
    if method == "admm":
      state = sp.admm_reset(state, params)
    params, state = epoch(params, state)
    if method in ("rvsm", "rgsm"):
      params = sp.project(params, method, **hparams)
  return float(loss(params)), sp.sparsity_report(params)


def test_rvsm_and_rgsm_sparser_than_admm_at_similar_loss():
  loss, params = sparse_regression()
  dense_loss, _ = train("none", {}, loss, params)
  rvsm_loss, rvsm = train("rvsm", dict(beta=1.0, lamb=1e-3), loss, params)
  rgsm_loss, rgsm = train(
      "rgsm", dict(beta=1.0, lamb1=0.1, lamb2=1e-3), loss, params)
  # ADMM gets the true sparsity levels as its targets: its best case.
  admm_loss, admm = train("admm", dict(rho=1.0, percent=65.0), loss, params)
  admm_ch_loss, admm_ch = train(
      "admm", dict(rho=1.0, percent=50.0, structure="channel"), loss, params)

  # Similar loss: everyone fits the data (dense_loss is the noise floor).
  for name, value in [("rvsm", rvsm_loss), ("rgsm", rgsm_loss),
                      ("admm", admm_loss), ("admm_ch", admm_ch_loss)]:
    assert value < 2.0 * dense_loss, (name, value, dense_loss)
  # Clearly sparser: RVSM prunes weights, RGSM prunes channels; ADMM leaves
  # small but non-zero weights (the paper's Fig. 3).
  assert rvsm.weight_sparsity > admm.weight_sparsity + 40.0
  assert rgsm.channel_sparsity > admm_ch.channel_sparsity + 40.0
  assert rvsm.weight_sparsity > 50.0 and rgsm.channel_sparsity >= 50.0
  small = admm_ch.channel_norms()[admm_ch.channel_norms() < 0.1]
  assert small.size > 0 and np.all(small > sp.CHANNEL_ZERO_TOL)
