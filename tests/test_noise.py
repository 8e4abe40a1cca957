"""fkjax.models.noise: the injected noise's standard normal draws."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

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
