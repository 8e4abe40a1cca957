"""fkjax.kernels' convolutions: oneDNN through XLA's FFI, explicit gradients."""
import ctypes
import hashlib
import importlib.metadata

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fkjax.kernels.cpu import build
from fkjax.kernels.cpu import explicit_grad_conv
from fkjax.kernels.cpu import onednn_conv as onednn
from fkjax.models import create_model
from tests import hlo

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
  assert build.unavailable_reason() is None
  assert onednn.available()


needs_onednn = pytest.mark.skipif(
    jax.default_backend() != "cpu" or build.unavailable_reason() is not None,
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
  conv = jax.jit(lambda x, w: onednn.conv_general_dilated(
      x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=DN))
  assert not hlo.custom_call_targets(conv.lower(x, w))
  assert "fkjax_onednn_conv_fwd" in hlo.custom_call_targets(conv.lower(
      x.astype(jnp.float32), w.astype(jnp.float32)))


@needs_onednn
@pytest.mark.slow
@pytest.mark.parametrize("execution", ["batched", "unrolled"])
def test_model_with_onednn_equals_xla_model(execution):
  small_batch = jax.random.uniform(jax.random.key(7), (4, 8, 8, 3))
  a, b = (create_model(depth=8, ensemble_size=2, noise_coef=0.0, conv=impl,
                       member_execution=execution)
          for impl in (onednn.conv_general_dilated,
                       jax.lax.conv_general_dilated))
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


_TINY_SOURCE = 'extern "C" int fkjax_test_answer() { return 42; }\n'


def _tiny_library(tmp_path, monkeypatch):
  """A cache in ``tmp_path`` and a one-function source to build into it."""
  if not _pip_installed():
    pytest.skip("needs oneDNN's headers")
  monkeypatch.setenv("FKJAX_ONEDNN_CACHE", str(tmp_path / "cache"))
  source = tmp_path / "tiny.cc"
  source.write_text(_TINY_SOURCE)
  monkeypatch.setattr(build, "SOURCES", (source,))


def _answer(path) -> int:
  # dlopen caches by path: each test loads its own path once.
  return ctypes.CDLL(str(path)).fkjax_test_answer()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "no_digest"])
def test_a_damaged_cached_library_is_rebuilt(tmp_path, monkeypatch, damage):
  _tiny_library(tmp_path, monkeypatch)
  path = build.build()
  good = path.read_bytes()
  digest = path.with_name(path.name + ".sha256")
  assert digest.read_text().strip() == hashlib.sha256(good).hexdigest()
  if damage == "truncate":   # e.g. a full disk during an earlier build
    with open(path, "r+b") as f:
      f.truncate(len(good) // 3)
  elif damage == "garbage":
    path.write_bytes(b"\x7fELF" + bytes(range(256)) * 64)
  else:   # the build died between the rename and the digest
    digest.unlink()
  before = path.stat().st_ino
  assert build.build() == path
  # Rebuilt (a new file renamed into place), whole, with its digest...
  assert path.stat().st_ino != before
  assert hashlib.sha256(path.read_bytes()).hexdigest() == (
      digest.read_text().strip())
  # ...and it loads and runs.
  assert _answer(path) == 42
  # No temporary files are left behind.
  assert sorted(p.name for p in path.parent.iterdir()) == sorted(
      [path.name, digest.name])


def test_an_intact_cached_library_is_not_rebuilt(tmp_path, monkeypatch):
  _tiny_library(tmp_path, monkeypatch)
  path = build.build()
  inode = path.stat().st_ino
  def no_compiler(*args, **kwargs):
    raise AssertionError(f"compiled again: {args}")
  monkeypatch.setattr(build.subprocess, "run", no_compiler)
  assert build.build() == path and path.stat().st_ino == inode


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


@pytest.mark.parametrize("kernel,stride,pad,size", [
    (3, 1, 1, 8), (3, 2, 1, 8), (1, 2, 0, 8), (3, 2, 1, 7), (3, 2, 0, 8),
    (5, 2, 2, 8), (3, 3, 1, 9)])
def test_explicit_grad_conv_has_the_gradients_of_lax_conv(kernel, stride, pad,
                                                          size):
  # Even sizes of strided convs take the phase-split input gradient, odd
  # ones the dilated form.
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((2, size, size, 3), dtype=np.float32))
  w = jnp.asarray(rng.standard_normal((kernel, kernel, 3, 4),
                                      dtype=np.float32))
  dn = ("NHWC", "HWIO", "NHWC")
  pads = [(pad, pad)] * 2
  loss = lambda conv: lambda x, w: jnp.sum(jnp.sin(conv(
      x, w, (stride, stride), pads, dimension_numbers=dn)))
  want = jax.grad(loss(jax.lax.conv_general_dilated), (0, 1))(x, w)
  got = jax.grad(loss(explicit_grad_conv.conv_general_dilated), (0, 1))(x, w)
  for g, h in zip(got, want):
    np.testing.assert_allclose(g, h, rtol=1e-5, atol=1e-5)
  # The forward pass is lax's own.
  np.testing.assert_array_equal(
      explicit_grad_conv.conv_general_dilated(x, w, (stride, stride), pads,
                                              dimension_numbers=dn),
      jax.lax.conv_general_dilated(x, w, (stride, stride), pads,
                                   dimension_numbers=dn))


def test_explicit_grad_conv_agrees_with_lax_on_a_model():
  small_batch = jax.random.uniform(jax.random.key(7), (4, 8, 8, 3))
  a, b = (create_model(depth=8, conv=impl)
          for impl in (explicit_grad_conv.conv_general_dilated,
                       jax.lax.conv_general_dilated))
  variables = jax.jit(a.init)(jax.random.key(0), small_batch)
  labels = jnp.arange(4) % 10

  def input_grad(model):
    loss = lambda x: jnp.sum(jax.nn.log_softmax(
        model.apply(variables, x))[jnp.arange(4), labels])
    return jax.jit(jax.grad(loss))(small_batch)

  np.testing.assert_allclose(input_grad(a), input_grad(b), rtol=1e-4,
                             atol=1e-7)
