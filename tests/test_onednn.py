"""fkjax.onednn: oneDNN convolutions through XLA's FFI, on CPU."""
import importlib.metadata

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fkjax import onednn
from fkjax.models import create_model, resnet
from fkjax.onednn import build

DN = ("NHWC", "HWIO", "NHWC")


def _pip_installed() -> bool:
  try:
    importlib.metadata.version("onednn-devel-cpu-gomp")
  except importlib.metadata.PackageNotFoundError:
    return False
  return True


def test_available_where_requirements_install_it():
  if not _pip_installed():
    pytest.skip("onednn-devel-cpu-gomp is not installed (not Linux x86-64)")
  # Where requirements.txt installs oneDNN, the library must build: else
  # every CPU run silently loses its fast convolutions.
  assert onednn.unavailable_reason() is None
  assert onednn.available()


needs_onednn = pytest.mark.skipif(
    jax.default_backend() != "cpu" or onednn.unavailable_reason() is not None,
    reason="oneDNN convolutions unavailable here")


@needs_onednn
@pytest.mark.parametrize("kernel,stride,pads,size,cin,cout", [
    (3, 1, ((1, 1), (1, 1)), 8, 3, 4),
    (3, 2, ((1, 1), (1, 1)), 8, 4, 8),
    (3, 2, ((0, 1), (0, 1)), 8, 4, 8),     # SAME of a stride-2 conv
    (1, 2, ((0, 0), (0, 0)), 8, 4, 8),
    (3, 2, ((1, 1), (1, 1)), 7, 3, 5),
    (5, 1, ((2, 1), (0, 2)), 9, 2, 3),     # asymmetric padding
    (3, 3, ((1, 1), (1, 1)), 9, 3, 4),
    (3, 1, ((0, 0), (0, 0)), 6, 16, 16),
])
def test_values_and_gradients_match_lax(kernel, stride, pads, size, cin, cout):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((3, size, size + 1, cin),
                                      dtype=np.float32))
  w = jnp.asarray(rng.standard_normal((kernel, kernel, cin, cout),
                                      dtype=np.float32))
  conv = lambda impl: lambda x, w: impl(x, w, (stride, stride), pads,
                                        dimension_numbers=DN)
  want = conv(jax.lax.conv_general_dilated)(x, w)
  got = jax.jit(conv(onednn.conv_general_dilated))(x, w)
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  loss = lambda impl: lambda x, w: jnp.sum(jnp.sin(conv(impl)(x, w)))
  want = jax.grad(loss(jax.lax.conv_general_dilated), (0, 1))(x, w)
  got = jax.jit(jax.grad(loss(onednn.conv_general_dilated), (0, 1)))(x, w)
  for g, h in zip(got, want):
    np.testing.assert_allclose(g, h, rtol=1e-4, atol=1e-4)


@needs_onednn
def test_vmap_over_members_equals_each_member():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((2, 4, 6, 6, 3), dtype=np.float32))
  w = jnp.asarray(rng.standard_normal((2, 3, 3, 3, 5), dtype=np.float32))
  conv = lambda x, w: onednn.conv_general_dilated(
      x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=DN)
  batched = jax.jit(jax.vmap(conv))(x, w)
  for m in range(2):
    np.testing.assert_allclose(
        batched[m], jax.lax.conv_general_dilated(
            x[m], w[m], (1, 1), ((1, 1), (1, 1)), dimension_numbers=DN),
        rtol=1e-5, atol=1e-5)


@needs_onednn
def test_unsupported_cases_fall_back_to_xla():
  # float64 needs x64; bfloat16 is not float32: both go to XLA, same values.
  x = jnp.ones((1, 5, 5, 2), jnp.bfloat16)
  w = jnp.ones((3, 3, 2, 2), jnp.bfloat16)
  got = onednn.conv_general_dilated(x, w, (1, 1), "SAME",
                                    dimension_numbers=DN)
  want = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                      dimension_numbers=DN)
  np.testing.assert_array_equal(got, want)
  hlo = jax.jit(lambda x, w: onednn.conv_general_dilated(
      x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=DN)).lower(
          x, w).as_text()
  assert "fkjax_onednn" not in hlo
  hlo = jax.jit(lambda x, w: onednn.conv_general_dilated(
      x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=DN)).lower(
          x.astype(jnp.float32), w.astype(jnp.float32)).as_text()
  assert "fkjax_onednn_conv_fwd" in hlo


@needs_onednn
@pytest.mark.parametrize("execution", ["batched", "unrolled"])
def test_model_with_onednn_equals_xla_model(execution):
  small_batch = jax.random.uniform(jax.random.key(7), (4, 8, 8, 3))
  a, b = (create_model(depth=8, ensemble_size=2, noise_coef=0.0, conv=impl,
                       member_execution=execution)
          for impl in ("onednn", "xla"))
  variables = a.init(jax.random.key(0), small_batch)
  labels = jnp.arange(4) % 10

  def loss(model, params, x):
    logits, _ = model.apply({**variables, "params": params}, x, train=True,
                            mutable=["batch_stats"])
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(4), labels])

  got = jax.jit(jax.grad(lambda p, x: loss(a, p, x), (0, 1)))(
      variables["params"], small_batch)
  want = jax.jit(jax.grad(lambda p, x: loss(b, p, x), (0, 1)))(
      variables["params"], small_batch)
  for g, h in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, h, rtol=1e-3, atol=1e-5)


def test_auto_resolves_by_backend_and_availability():
  want = ("onednn" if jax.default_backend() == "cpu"
          and onednn.unavailable_reason() is None else "explicit_grad")
  assert resnet.resolve_conv("auto") == want
  assert resnet.resolve_conv("xla") == "xla"
  with pytest.raises(ValueError, match="conv must be"):
    resnet.resolve_conv("fft")


def test_missing_onednn_is_a_clear_error(tmp_path, monkeypatch):
  monkeypatch.setenv("FKJAX_ONEDNN_ROOT", str(tmp_path))
  with pytest.raises(build.OneDnnUnavailable, match="no oneDNN under"):
    build.build()


def test_failed_compile_is_a_clear_error(tmp_path, monkeypatch):
  if not _pip_installed():
    pytest.skip("needs oneDNN's headers")
  monkeypatch.setenv("FKJAX_ONEDNN_CACHE", str(tmp_path))
  monkeypatch.setattr(build, "SOURCES", (tmp_path / "broken.cc",))
  (tmp_path / "broken.cc").write_text("this is not C++\n")
  with pytest.raises(build.OneDnnUnavailable, match="compiling .* failed"):
    build.build()
  # Nothing half-written is left to be loaded later.
  assert not list(tmp_path.glob("*.so"))


def test_unwritable_cache_is_a_clear_error(tmp_path, monkeypatch):
  if not _pip_installed():
    pytest.skip("needs oneDNN's headers")
  blocker = tmp_path / "file"
  blocker.write_text("")
  monkeypatch.setenv("FKJAX_ONEDNN_CACHE", str(blocker / "cache"))
  monkeypatch.setattr(build, "SOURCES", (tmp_path / "other.cc",))
  (tmp_path / "other.cc").write_text("// a source not built yet\n")
  with pytest.raises(build.OneDnnUnavailable, match="cannot write"):
    build.build()
