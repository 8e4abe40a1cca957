"""fkjax.kernels' noise injections: Threefry written out in jnp, fused CPU."""
import jax
import jax.extend.random as jex_random
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from fkjax import models
from fkjax.kernels.cpu import build
from fkjax.kernels.cpu import noise_cpu
from fkjax.kernels.cpu import threefry
from fkjax.models import create_model

needs_library = pytest.mark.skipif(
    jax.default_backend() != "cpu" or build.unavailable_reason() is not None,
    reason="fkjax's CPU library unavailable here")


# --------------------------------------------------------------------------
# The written-out Threefry: the models' draws, bit for bit.


def test_threefry_is_jaxs_threefry():
  rng = np.random.default_rng(0)
  k0, k1, x0, x1 = (jnp.asarray(rng.integers(0, 2**32, n, dtype=np.uint32))
                    for n in (1, 1, 1000, 1000))
  ours = jax.jit(threefry.threefry2x32)(k0[0], k1[0], x0, x1)
  theirs = jex_random.threefry2x32_p.bind(k0[0], k1[0], x0, x1)
  for a, b in zip(ours, theirs):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape", [(2, 3, 4), (6,), (7,), (2, 5)])
def test_written_out_hash_is_jaxs_hash_function(shape):
  # The hash the models' draw takes (jax.extend.random.threefry_2x32's
  # contract), odd counts included.
  keypair = jnp.asarray([0x13198A2E, 0x03707344], jnp.uint32)
  count = jnp.arange(np.prod(shape), dtype=jnp.uint32).reshape(shape) * 7919
  np.testing.assert_array_equal(
      jax.jit(threefry.threefry_2x32)(keypair, count),
      jex_random.threefry_2x32(keypair, count))


def test_one_draw_the_cpu_form_only_swaps_the_hash():
  # The jnp noise is the models' own function with the written-out hash:
  # the map from bits to normals exists once (fkjax.models.noise).
  text = open(threefry.__file__).read()
  assert "erf_inv" not in text and "bitcast_convert_type" not in text
  seen = []
  key = jax.random.key(3)
  spy = lambda k, c: seen.append(c.shape) or threefry.threefry_2x32(k, c)
  np.testing.assert_array_equal(
      models.standard_normal(key, (2, 3, 4), threefry=spy),
      threefry.standard_normal(key, (2, 3, 4)))
  assert seen == [(2, 2, 6)]


# Odd per-example sizes (the last pair's second word dropped), no batch axis.
@pytest.mark.parametrize("shape", [(3, 5), (4, 6, 6, 3), (2, 7, 7, 5), (7,),
                                   ()])
@pytest.mark.parametrize("jit", [False, True])
def test_written_out_draws_are_the_models_bits(shape, jit):
  key = jax.random.key(11)
  draw = lambda f: (jax.jit(f, static_argnums=1) if jit else f)(key, shape)
  want = np.asarray(draw(models.standard_normal))
  got = np.asarray(draw(threefry.standard_normal))
  assert got.shape == want.shape == shape
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("std_over", ["batch", "example"])
def test_written_out_injection_is_the_models(std_over):
  x = jax.random.normal(jax.random.key(1), (4, 5, 5, 3))
  key = jax.random.key(2)
  np.testing.assert_array_equal(
      threefry.inject_noise(x, 0.3, key, std_over),
      models.inject_noise(x, 0.3, key, std_over))
  with pytest.raises(ValueError, match="std_over"):
    threefry.inject_noise(x, 0.3, key, "channel")


# --------------------------------------------------------------------------
# The fused CPU kernel.


def _bits(key, rows, cols):
  """uint32[rows, cols]: JAX's Threefry of the counters (row, j), the bits
  fkjax.models.noise.standard_normal maps to normals."""
  half = (cols + 1) // 2
  row, col = np.indices((rows, half), dtype=np.uint32)
  words = jex_random.threefry_2x32(jax.random.key_data(key),
                                   jnp.asarray(np.stack([row, col])))
  return np.concatenate([words[0], words[1]], axis=1)[:, :cols]


def _both(x, coef, key, std_over):
  """(y, dx) of the fused and the models' injection, for one cotangent."""
  cotangent = jax.random.normal(jax.random.key(9), x.shape)
  out = []
  for inject in (noise_cpu.inject_noise, models.inject_noise):
    y, vjp = jax.vjp(lambda a, f=inject: f(a, coef, key, std_over), x)
    out.append((y, vjp(cotangent)[0]))
  return out


# Odd per-example sizes: the last pair's second word is dropped.
@needs_library
@pytest.mark.parametrize("shape", [(3, 5), (4, 6, 6, 3), (2, 7, 7, 5),
                                   (128, 8, 8, 16)])
@pytest.mark.parametrize("std_over", ["batch", "example"])
def test_values_and_gradient_equal_jnp(shape, std_over):
  x = 3.0 * jax.random.normal(jax.random.key(1), shape) + 1.0
  (y, dx), (want_y, want_dx) = _both(x, 0.3, jax.random.key(2), std_over)
  # The jnp draw is off by up to ~2e-5 in the tails (XLA's log1p of -x*x as
  # |x| -> 1); noise here is 0.9 z.
  np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=5e-5)
  np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-6)


@needs_library
def test_draws_are_standard_normals_draws():
  x = jax.random.normal(jax.random.key(3), (64, 9, 9, 7))
  key = jax.random.key(4)
  _, z, _ = noise_cpu._forward(  # pylint: disable=protected-access
      x, jax.random.key_data(key), 1.0, False, keep_z=True)
  # standard_normal's bits, mapped in float64: sqrt(2) erfinv(2u - 1).
  bits = _bits(key, 64, 9 * 9 * 7)
  u = ((bits >> 9) | 0x3F800000).view(np.float32).astype(np.float64) - 1
  lo = np.nextafter(np.float32(-1), np.float32(1))
  want = np.sqrt(2) * special.erfinv(np.maximum(lo, 2 * u - 1))
  assert np.abs(want).max() > 4  # tails included
  np.testing.assert_allclose(np.asarray(z).reshape(64, -1), want, rtol=1e-6,
                             atol=2e-6)
  np.testing.assert_allclose(models.standard_normal(key, x.shape), z,
                             atol=5e-5)


@needs_library
def test_primal_equals_the_differentiated_forward():
  x = jax.random.normal(jax.random.key(5), (8, 4, 4, 3))
  key = jax.random.key(6)
  primal = jax.jit(noise_cpu.fused, static_argnums=1)(x, 0.2, key)
  y, _ = jax.vjp(lambda a: noise_cpu.fused(a, 0.2, key), x)
  np.testing.assert_array_equal(primal, y)


@needs_library
def test_vmap_over_members_equals_each_member():
  x = jax.random.normal(jax.random.key(7), (2, 4, 5, 5, 3))
  keys = jax.random.split(jax.random.key(8), 2)
  f = lambda a, k: noise_cpu.fused(a, 0.1, k)
  batched = jax.vmap(f)(x, keys)
  for m in range(2):
    np.testing.assert_array_equal(batched[m], f(x[m], keys[m]))


@needs_library
def test_constant_input_has_no_noise_and_a_finite_gradient():
  x = jnp.full((4, 3, 3, 2), 2.5)
  y, vjp = jax.vjp(lambda a: noise_cpu.fused(a, 0.5,
                                                       jax.random.key(0)), x)
  np.testing.assert_array_equal(y, x)
  np.testing.assert_array_equal(vjp(jnp.ones_like(x))[0], jnp.ones_like(x))


@needs_library
def test_unsupported_inputs():
  key = jax.random.key(0)
  x16 = jnp.ones((2, 3), jnp.bfloat16)
  with pytest.raises(ValueError, match="float32"):
    noise_cpu.fused(x16, 0.1, key)
  # Through the models' signature they fall back to the jnp form.
  y = noise_cpu.inject_noise(x16, 0.1, key)
  assert y.dtype == jnp.bfloat16
  np.testing.assert_array_equal(y, models.inject_noise(x16, 0.1, key))
  rbg = jax.random.key(0, impl="rbg")
  x = jnp.arange(6.0).reshape(2, 3)
  np.testing.assert_array_equal(noise_cpu.inject_noise(x, 0.1, rbg),
                                models.inject_noise(x, 0.1, rbg))


@needs_library
@pytest.mark.slow
@pytest.mark.parametrize("execution", ["batched", "unrolled"])
def test_en2_model_gradients_equal_jnp_model(execution):
  images = jax.random.uniform(jax.random.key(7), (4, 8, 8, 3))
  labels = jnp.arange(4) % 10
  fused, ref = (create_model(depth=8, ensemble_size=2, noise_coef=0.1,
                             inject_noise=inject, member_execution=execution)
                for inject in (noise_cpu.inject_noise, threefry.inject_noise))
  variables = fused.init(jax.random.key(0), images)

  def loss(model, params, x):
    logits, _ = model.apply({**variables, "params": params}, x, train=True,
                            mutable=["batch_stats"],
                            rngs={"noise": jax.random.key(3)})
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(4), labels])

  got, want = (jax.jit(jax.grad(lambda p, x, m=m: loss(m, p, x), (0, 1)))(
      variables["params"], images) for m in (fused, ref))
  for g, h in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, h, rtol=1e-3, atol=1e-5)
