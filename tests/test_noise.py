"""fkjax.models.noise: the injected noise's standard normal draws."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fkjax.kernels.cpu import threefry
from fkjax.models import noise


def test_draws_are_standard_normal():
  x = np.asarray(noise.standard_normal(jax.random.key(0), (64, 8, 8, 16)))
  assert x.shape == (64, 8, 8, 16) and x.dtype == np.float32
  assert np.all(np.isfinite(x))
  # 65,536 draws: a wrong scale, shift or shape of the distribution (a
  # uniform, say) fails this by orders of magnitude.
  assert stats.kstest(x.ravel(), "norm").pvalue > 1e-3
  assert abs(x.mean()) < 0.02 and abs(x.std() - 1) < 0.02
  # Neighbours (the two words of one hash, adjacent channels) uncorrelated.
  flat = x.reshape(64, -1)
  half = flat.shape[1] // 2
  assert abs(np.corrcoef(flat[:, :half].ravel(),
                         flat[:, half:].ravel())[0, 1]) < 0.02
  assert abs(np.corrcoef(x[..., :-1].ravel(), x[..., 1:].ravel())[0, 1]) < 0.02


def test_same_key_same_draws_other_key_other_draws():
  a = noise.standard_normal(jax.random.key(1), (4, 5, 3))
  np.testing.assert_array_equal(
      a, jax.jit(noise.standard_normal, static_argnums=1)(
          jax.random.key(1), (4, 5, 3)))
  b = noise.standard_normal(jax.random.key(2), (4, 5, 3))
  assert not np.any(np.asarray(a) == np.asarray(b))


def test_an_example_draws_the_same_in_any_batch():
  # Odd per-example sizes too (the last word of a pair is dropped).
  big = noise.standard_normal(jax.random.key(3), (6, 7, 3))
  small = noise.standard_normal(jax.random.key(3), (2, 7, 3))
  np.testing.assert_array_equal(big[:2], small)
  assert len(np.unique(np.asarray(big))) == big.size


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_lower_precision_dtypes(dtype):
  x = noise.standard_normal(jax.random.key(4), (8, 100), dtype)
  assert x.dtype == dtype
  assert abs(float(jnp.std(x.astype(jnp.float32))) - 1) < 0.1


def test_other_prng_impls_keep_their_own_normal():
  key = jax.random.key(5, impl="rbg")
  np.testing.assert_array_equal(noise.standard_normal(key, (3, 4)),
                                jax.random.normal(key, (3, 4)))


@pytest.mark.parametrize("inject", [noise.inject_noise,
                                    threefry.inject_noise],
                         ids=["models", "kernels_jnp"])
@pytest.mark.parametrize("std_over", ["batch", "example"])
def test_a_constant_group_gets_no_noise_and_a_finite_gradient(inject,
                                                              std_over):
  # A residual branch pruned to all zeros: jnp.std's gradient is NaN there.
  x = jnp.zeros((3, 4, 4, 2)).at[1].set(
      jax.random.normal(jax.random.key(1), (4, 4, 2)))
  if std_over == "batch":
    x = jnp.zeros_like(x)
  key = jax.random.key(0)
  y, vjp = jax.vjp(lambda a: inject(a, 0.5, key, std_over), x)
  (dx,) = vjp(jnp.ones_like(x))
  assert np.isfinite(np.asarray(dx)).all()
  np.testing.assert_array_equal(y[0], x[0])
  np.testing.assert_array_equal(dx[0], jnp.ones_like(x[0]))


@pytest.mark.parametrize("std_over", ["batch", "example"])
def test_values_and_gradients_are_jnp_stds_where_it_is_positive(std_over):
  x = jax.random.normal(jax.random.key(3), (3, 4, 4, 2))
  key, ct = jax.random.key(0), jax.random.normal(jax.random.key(4), x.shape)
  axis = None if std_over == "batch" else (1, 2, 3)

  def reference(a):
    std = jnp.std(a, axis=axis, keepdims=axis is not None)
    return a + 0.5 * std * noise.standard_normal(key, a.shape)

  want, vjp_want = jax.vjp(reference, x)
  got, vjp_got = jax.vjp(lambda a: noise.inject_noise(a, 0.5, key, std_over),
                         x)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_allclose(vjp_got(ct)[0], vjp_want(ct)[0], rtol=1e-6,
                             atol=1e-7)
