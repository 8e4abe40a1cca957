"""The parameter tree the sparsifier tests prune."""
import numpy as np

# make_params holds plain HWIO kernels and member-stacked ones (axis 0).
LAYOUT = ("HWIO", "MHWIO")


def make_params(seed=0):
  """A conv kernel, a member-stacked conv kernel, BatchNorm, a dense layer."""
  rng = np.random.default_rng(seed)
  f = lambda *s: (0.1 * rng.standard_normal(s)).astype(np.float32)
  # Input channels of growing scale, so that the RGSM prox (threshold 0.5 at
  # the tests' beta and lamb1) zeroes some channels and keeps others.
  scale = lambda n: np.linspace(0.3, 1.5, n, dtype=np.float32)[:, None]
  return {
      "Conv_0": {"kernel": f(3, 3, 4, 6) * scale(4)},
      "Ens": {"Conv_0": {"kernel": f(2, 3, 3, 6, 4) * scale(6)}},
      "BatchNorm_0": {"scale": 1 + f(6), "bias": f(6)},
      "Dense_0": {"kernel": f(6, 3), "bias": f(3)},
  }
