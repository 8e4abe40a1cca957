"""Convolutions with an explicit input gradient, fast inside XLA:CPU loops.

JAX differentiates ``conv_general_dilated`` with respect to its input into a
convolution whose kernel has input and output features swapped
(``dim_labels=..._01oi->...``). When that happens inside a while loop,
XLA:CPU runs it ~8x slower than the same convolution with an ``01io``
kernel (outside loops it materialises the transposed kernel and is fast).
``conv_general_dilated`` below has the same forward pass and gradients, but
builds its input gradient from an explicitly flipped and transposed HWIO
kernel, so the slow form never appears. Its kernel gradient is likewise an
ordinary NHWC convolution (JAX's has permuted dimension labels, as slow in
loops), and the input gradient of a strided convolution is split into the
input's stride phases instead of convolving a stride-dilated cotangent,
which XLA:CPU runs ~3x slower than the forward pass.

On a CPU where oneDNN's convolutions do not run, ``kernels.conv="auto"``
picks it (``"explicit_grad"``; ``"xla"`` is the stock convolution), so
attacks can run as ``lax.scan`` loops: they compile in a fraction of the time
and memory of a written-out loop and run as fast (``docs/performance.md``).
CPU only: GPUs and TPUs take the stock convolution, which their compilers
map to their own backward kernels.
"""
from __future__ import annotations

import functools
from typing import Sequence

import jax
from jax import lax
import jax.numpy as jnp

_DN = ("NHWC", "HWIO", "NHWC")
_xla_conv = lax.conv_general_dilated


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _conv(lhs, rhs, strides, padding):
  return _xla_conv(lhs, rhs, strides, padding, dimension_numbers=_DN)


def _conv_fwd(lhs, rhs, strides, padding):
  return _conv(lhs, rhs, strides, padding), (lhs, rhs)


def _conv_bwd(strides, padding, res, g):
  lhs, rhs = res
  kernel = rhs.shape[:2]
  # Phase-split only where every phase has kernel taps (k >= s): a strided
  # 1x1 convolution's gradient is mostly zeros, cheaper the usual way.
  if any(st > 1 for st in strides) and all(
      n % st == 0 and k >= st
      for n, k, st in zip(lhs.shape[1:3], kernel, strides)):
    dlhs = _strided_input_grad(lhs.shape, rhs, g, strides, padding)
  else:
    # Padding of the stride-1 convolution of the dilated cotangent that
    # gives back the input's spatial size.
    pads = []
    for n, o, k, s, (lo, _) in zip(lhs.shape[1:3], g.shape[1:3], kernel,
                                   strides, padding):
      before = k - 1 - lo
      pads.append((before, n + k - 1 - ((o - 1) * s + 1) - before))
    flipped = jnp.swapaxes(jnp.flip(rhs, (0, 1)), 2, 3)  # HWIO of transpose
    dlhs = _xla_conv(g, flipped, (1, 1), pads, lhs_dilation=strides,
                     dimension_numbers=_DN)
  return dlhs, _kernel_grad(lhs, g, kernel, strides, padding)


def _phase_taps(n, o, k, s, lo):
  """Per input phase of one spatial axis (k >= s): (kernel taps, padding).

  Input position i = s*m + phase receives g[m + d] * w[a] for the taps a with
  s*(m + d) + a - lo = i; the d are consecutive, so each phase is a stride-1
  correlation of g with those taps.
  """
  plans = []
  for phase in range(s):
    taps = [(a, (phase + lo - a) // s) for a in range(k)
            if (phase + lo - a) % s == 0]
    taps.sort(key=lambda t: t[1])
    first = taps[0][1]
    count = len(range(phase, n, s))
    before = -first
    after = count - o - before + len(taps) - 1
    plans.append(([a for a, _ in taps], (before, after)))
  return plans


def _strided_input_grad(shape, rhs, g, strides, padding):
  """Input gradient of a strided convolution as ``s*s`` stride-1 ones.

  XLA:CPU runs the usual form (a convolution of the stride-dilated
  cotangent) ~3x slower than the forward pass; splitting the input into its
  stride phases avoids the dilation (docs/performance.md).
  """
  (n_h, n_w), (o_h, o_w) = shape[1:3], g.shape[1:3]
  (k_h, k_w), (s_h, s_w) = rhs.shape[:2], strides
  rows = _phase_taps(n_h, o_h, k_h, s_h, padding[0][0])
  cols = _phase_taps(n_w, o_w, k_w, s_w, padding[1][0])
  phases = []
  for row in rows:
    for col in cols:
      sub = rhs[jnp.asarray(row[0])][:, jnp.asarray(col[0])]
      phases.append(_xla_conv(g, jnp.swapaxes(sub, 2, 3), (1, 1),
                              [row[1], col[1]], dimension_numbers=_DN))
  # (phase_h, phase_w, N, m, l, C) -> (N, m, phase_h, l, phase_w, C)
  out = jnp.stack(phases).reshape(s_h, s_w, *phases[0].shape)
  out = jnp.transpose(out, (2, 3, 0, 4, 1, 5))
  return out.reshape(shape)


def _kernel_grad(lhs, g, kernel, strides, padding):
  """d(conv)/d(kernel) as an ordinary NHWC/HWIO convolution.

  dW[a, b, i, o] = sum_{n,p,q} x_pad[n, s*p + a, s*q + b, i] g[n, p, q, o]:
  a convolution of x (images' channels as its batch, the batch as its
  features) with g (dilated by the stride) as kernel.
  """
  pads = []
  for n, o, k, s, (lo, _) in zip(lhs.shape[1:3], g.shape[1:3], kernel,
                                 strides, padding):
    pads.append((lo, k + (o - 1) * s - n - lo))
  x_t = jnp.transpose(lhs, (3, 1, 2, 0))  # (I, H, W, N)
  g_t = jnp.transpose(g, (1, 2, 0, 3))  # (Ho, Wo, N, O)
  out = _xla_conv(x_t, g_t, (1, 1), pads, rhs_dilation=strides,
                  dimension_numbers=_DN)  # (I, kh, kw, O)
  return jnp.transpose(out, (1, 2, 0, 3))


_conv.defvjp(_conv_fwd, _conv_bwd)


def conv_general_dilated(lhs, rhs, window_strides: Sequence[int], padding,
                         lhs_dilation=None, rhs_dilation=None,
                         dimension_numbers=None, feature_group_count: int = 1,
                         precision=None, **kwargs):
  """``lax.conv_general_dilated`` with an explicit input gradient.

  Handles 2-D NHWC/HWIO convolutions with explicit padding, no dilation and
  no feature groups (what fkjax's ResNets use); anything else goes to
  ``lax.conv_general_dilated`` unchanged.
  """
  if not is_plain_nhwc_conv(lhs, padding, lhs_dilation, rhs_dilation,
                            dimension_numbers, feature_group_count, precision,
                            kwargs):
    return _xla_conv(lhs, rhs, window_strides, padding,
                     lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
                     dimension_numbers=dimension_numbers,
                     feature_group_count=feature_group_count,
                     precision=precision, **kwargs)
  return _conv(lhs, rhs, tuple(window_strides),
               tuple(tuple(p) for p in padding))


def is_plain_nhwc_conv(lhs, padding, lhs_dilation, rhs_dilation,
                       dimension_numbers, feature_group_count, precision,
                       kwargs) -> bool:
  """A 2-D NHWC/HWIO convolution with explicit padding and nothing else."""
  return (lhs.ndim == 4 and not isinstance(padding, str)
          and all(d in (None, 1) for d in (lhs_dilation or (1,)))
          and all(d in (None, 1) for d in (rhs_dilation or (1,)))
          and feature_group_count == 1 and precision is None and not kwargs
          and _dims(dimension_numbers) == _DN)


def _dims(dimension_numbers):
  if dimension_numbers is None or isinstance(dimension_numbers, tuple) and all(
      isinstance(d, str) for d in dimension_numbers):
    return dimension_numbers
  # ConvDimensionNumbers of NHWC/HWIO/NHWC, as flax passes them.
  want = lax.conv_dimension_numbers((1, 1, 1, 1), (1, 1, 1, 1), _DN)
  return _DN if dimension_numbers == want else None
