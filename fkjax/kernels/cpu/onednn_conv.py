"""2-D convolutions through oneDNN on CPU (``config.kernels.conv="onednn"``).

XLA:CPU's convolutions run at about half the rate of oneDNN's at the 16-64
channels of CIFAR ResNets; jaxlib's own oneDNN rewriter is compiled out of the
released wheels. :func:`conv_general_dilated` calls oneDNN's forward,
backward-data and backward-weights primitives (``onednn_conv.cc``) through
XLA's FFI, with the same values as ``lax.conv_general_dilated`` to float32
rounding (``tests/test_kernels_onednn.py``), and falls back to
:func:`fkjax.kernels.cpu.explicit_grad_conv.conv_general_dilated` for what it
does not handle (other layouts, dtypes, dilation, groups). CPU only: on
other backends ``kernels.conv="auto"`` is the stock ``"xla"``.

fkjax's CPU library, which also holds the fused noise injection
(:mod:`fkjax.kernels.cpu.noise_cpu`), is built on first use
(:mod:`fkjax.kernels.cpu.build`).
"""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fkjax.kernels.cpu import explicit_grad_conv
from fkjax.kernels.cpu.build import load, unavailable_reason


def available() -> bool:
  """Whether oneDNN convolutions can run here (builds them if needed)."""
  return jax.default_backend() == "cpu" and unavailable_reason() is None


def _call(target, out_shape, a, b, strides, padding):
  (pt, pb), (pl, pr) = padding
  return jax.ffi.ffi_call(
      target, jax.ShapeDtypeStruct(out_shape, jnp.float32),
      # An ensemble's members under nn.vmap: one call per member.
      vmap_method="sequential")(
          a, b, stride_h=np.int64(strides[0]), stride_w=np.int64(strides[1]),
          pad_top=np.int64(pt), pad_bottom=np.int64(pb),
          pad_left=np.int64(pl), pad_right=np.int64(pr))


def _output_shape(lhs_shape, rhs_shape, strides, padding):
  n, h, w, _ = lhs_shape
  kh, kw, _, o = rhs_shape
  (pt, pb), (pl, pr) = padding
  return (n, (h + pt + pb - kh) // strides[0] + 1,
          (w + pl + pr - kw) // strides[1] + 1, o)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _conv(lhs, rhs, strides, padding):
  out_shape = _output_shape(lhs.shape, rhs.shape, strides, padding)
  return _call("fkjax_onednn_conv_fwd", out_shape, lhs, rhs, strides, padding)


def _conv_fwd(lhs, rhs, strides, padding):
  return _conv(lhs, rhs, strides, padding), (lhs, rhs)


def _conv_bwd(strides, padding, res, g):
  lhs, rhs = res
  # Each gradient is its own call, so XLA drops the kernel gradient where
  # only the input's is used (the attacks).
  dlhs = _call("fkjax_onednn_conv_bwd_data", lhs.shape, g, rhs, strides,
               padding)
  drhs = _call("fkjax_onednn_conv_bwd_weights", rhs.shape, lhs, g, strides,
               padding)
  return dlhs, drhs


_conv.defvjp(_conv_fwd, _conv_bwd)


def conv_general_dilated(lhs, rhs, window_strides: Sequence[int], padding,
                         lhs_dilation=None, rhs_dilation=None,
                         dimension_numbers=None, feature_group_count: int = 1,
                         precision=None, **kwargs):
  """``lax.conv_general_dilated`` with oneDNN's kernels on CPU.

  Handles float32 2-D NHWC/HWIO convolutions with explicit, non-negative
  padding, no dilation and no feature groups (what fkjax's ResNets use);
  anything else goes to
  :func:`fkjax.kernels.cpu.explicit_grad_conv.conv_general_dilated`.

  Raises:
    OneDnnUnavailable: oneDNN cannot be built or loaded here.
  """
  simple = (explicit_grad_conv.is_plain_nhwc_conv(
      lhs, padding, lhs_dilation, rhs_dilation, dimension_numbers,
      feature_group_count, precision, kwargs)
      and lhs.dtype == jnp.float32 and rhs.dtype == jnp.float32
      and all(p >= 0 for pair in padding for p in pair))
  if not simple:
    return explicit_grad_conv.conv_general_dilated(
        lhs, rhs, window_strides, padding, lhs_dilation=lhs_dilation,
        rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers,
        feature_group_count=feature_group_count, precision=precision,
        **kwargs)
  load()
  return _conv(lhs, rhs, tuple(window_strides),
               tuple(tuple(int(p) for p in pair) for pair in padding))
