"""Small models for the attack and evaluation tests, trained in seconds."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fkjax import attacks


def relu_mlp(params, images, key):
  """A deterministic one-hidden-layer ReLU MLP; the key is ignored."""
  del key
  h = jax.nn.relu(images.reshape(images.shape[0], -1) @ params["w1"] +
                  params["b1"])
  return h @ params["w2"] + params["b2"]


def noisy_relu_mlp(params, images, key):
  """:func:`relu_mlp` with N(0, 0.5^2) noise on its logits: a stochastic
  model for the evaluation's tests."""
  logits = relu_mlp(params, images, None)
  return logits + 0.5 * jax.random.normal(key, logits.shape)


@functools.lru_cache(maxsize=None)
def trained_mlp(num_classes: int = 10, num_test: int = 128):
  """A ReLU MLP fitted to a random ReLU teacher on 4x4x3 images.

  Returns ``(params, test images, test labels)``; about 80% clean accuracy
  and about 40% under PGD at eps = 8/255 for 10 classes.
  """
  rng = np.random.default_rng(0)
  teacher = {"w1": rng.normal(size=(48, 64)),
             "b1": 2.0 * rng.normal(size=64),
             "w2": rng.normal(size=(64, num_classes)),
             "b2": np.zeros(num_classes)}
  teacher = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), teacher)

  def sample(n, seed):
    x = np.random.default_rng(seed).uniform(0, 1, (n, 4, 4, 3))
    x = jnp.asarray(x.astype(np.float32))
    return x, jnp.argmax(relu_mlp(teacher, x - 0.5, None), -1).astype(
        jnp.int32)

  x_train, y_train = sample(4096, 1)
  x_test, y_test = sample(num_test, 2)
  params = {"w1": rng.normal(size=(48, 128)) / 7, "b1": np.zeros(128),
            "w2": rng.normal(size=(128, num_classes)) / 11,
            "b2": np.zeros(num_classes)}
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
  optimizer = optax.adam(3e-3)

  @jax.jit
  def fit(params):
    def step(carry, _):
      params, state = carry
      grads = jax.grad(lambda p: jnp.mean(attacks.cross_entropy(
          relu_mlp(p, x_train, None), y_train)))(params)
      updates, state = optimizer.update(grads, state, params)
      return (optax.apply_updates(params, updates), state), None

    (params, _), _ = jax.lax.scan(step, (params, optimizer.init(params)),
                                  None, length=400)
    return params

  return fit(params), x_test, y_test
