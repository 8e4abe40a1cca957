"""Forward, input-gradient and kernel-gradient times of ResNet20's conv shapes.

  python -m benchmarks.experiments.conv_layers [--winograd]

fkjax's explicit-gradient convolution at batch 128; with ``--winograd`` also
an F(2x2,3x3) Winograd convolution written in jnp for the stride-1 3x3
layers (checked against XLA's to float tolerance first).
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.experiments.common import median_ms
from fkjax import kernels
from fkjax.kernels.cpu import explicit_grad_conv

DN = ("NHWC", "HWIO", "NHWC")
SHAPES = [(32, 16, 16, 3, 1), (32, 16, 32, 3, 2), (32, 16, 32, 1, 2),
          (16, 32, 32, 3, 1), (16, 32, 64, 3, 2), (8, 64, 64, 3, 1)]


def winograd_conv(x: jax.Array, w: jax.Array) -> jax.Array:
  """3x3, stride 1, padding 1 NHWC/HWIO convolution via F(2x2, 3x3).

  Input tiles of 4x4 with stride 2 are transformed by B^T d B, multiplied
  with G g G^T by 16 batched matmuls, and mapped back by A^T m A.
  """
  b, h, w_, _ = x.shape
  xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
  d = [[xp[:, r:r + h:2, c:c + w_:2, :] for c in range(4)] for r in range(4)]

  def bt(v0, v1, v2, v3):  # rows of B^T applied to 4 values
    return [v0 - v2, v1 + v2, v2 - v1, v1 - v3]
  rows = [bt(*(d[r][c] for r in range(4))) for c in range(4)]  # [c][r]
  v = [x for r in range(4) for x in bt(*(rows[c][r] for c in range(4)))]
  v = jnp.stack(v).reshape(16, -1, x.shape[-1])
  g = jnp.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], x.dtype)
  u = jnp.einsum("ak,klco,bl->abco", g, w, g).reshape(16, w.shape[2], -1)
  m = jnp.einsum("pnc,pco->pno", v, u).reshape(4, 4, b, h // 2, w_ // 2, -1)
  s0, s1 = m[0] + m[1] + m[2], m[1] - m[2] - m[3]
  y = [[s[0] + s[1] + s[2], s[1] - s[2] - s[3]] for s in (s0, s1)]
  y = jnp.stack([jnp.stack(row, 3) for row in y], 2)
  return y.reshape(b, h, w_, -1)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--winograd", action="store_true")
  parser.add_argument("--batch", type=int, default=128)
  args = parser.parse_args()
  kernels.apply_xla_flags()  # before JAX starts its backend
  rng = np.random.default_rng(0)
  for size, cin, cout, k, s in SHAPES:
    x = jnp.asarray(rng.standard_normal((args.batch, size, size, cin),
                                        dtype=np.float32))
    w = jnp.asarray(rng.standard_normal((k, k, cin, cout), dtype=np.float32))
    pads = [(k // 2, k // 2)] * 2
    impls = {"xla": lambda x, w: explicit_grad_conv.conv_general_dilated(
        x, w, (s, s), pads, dimension_numbers=DN)}
    if args.winograd and k == 3 and s == 1:
      impls["winograd"] = winograd_conv
      ref, got = impls["xla"](x, w), winograd_conv(x, w)
      err = float(jnp.max(jnp.abs(ref - got)) / jnp.max(jnp.abs(ref)))
      assert err < 1e-5, err
    r = jnp.asarray(rng.standard_normal(impls["xla"](x, w).shape,
                                        dtype=np.float32))
    for name, conv in impls.items():
      loss = lambda x, w, conv=conv: jnp.sum(conv(x, w) * r)
      fwd = median_ms(jax.jit(conv), x, w)
      gx = median_ms(jax.jit(jax.grad(loss)), x, w)
      gw = median_ms(jax.jit(jax.grad(loss, 1)), x, w)
      print(f"{size}x{size}x{cin}->{cout} k{k} s{s} {name}: forward "
            f"{fwd:.2f} ms, input grad {gx:.2f} ms, kernel grad {gw:.2f} ms",
            flush=True)


if __name__ == "__main__":
  main()
