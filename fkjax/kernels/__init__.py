"""What fkjax adds for speed, below the models.

The models (:mod:`fkjax.models`) compute the paper's networks with
``lax.conv_general_dilated`` and a jnp noise injection; nothing here changes
what they compute, only how fast. :func:`resolve` turns ``config.kernels``
into the callables a model takes::

  kernels = fkjax.kernels.resolve(config.kernels, ensemble_size=2)
  model = fkjax.models.create_model(depth=20, ensemble_size=2,
                                    noise_coef=0.1, **kernels.model_kwargs)

* :mod:`~fkjax.kernels.onednn_conv`: convolutions through oneDNN via XLA's
  FFI (CPU; ``onednn_conv.cc``).
* :mod:`~fkjax.kernels.noise_cpu`: the noise injection fused into one CPU
  kernel forward and one backward (``noise_cpu.cc``).
* :mod:`~fkjax.kernels.build`: compiles and caches those two C++ files (the
  ``[cpu]`` extra installs oneDNN).
* :mod:`~fkjax.kernels.explicit_grad_conv`: XLA convolutions whose gradients
  stay fast inside XLA:CPU loops.
* :mod:`~fkjax.kernels.noise_jnp`: the noise with its Threefry hash written
  out in jnp, bit for bit the models' draw.
* :mod:`~fkjax.kernels.xla_flags`: :func:`apply_xla_flags`, XLA flags for
  CPU, set by ``train.py``/``eval.py`` (importing fkjax sets nothing).
"""
from __future__ import annotations

from fkjax.kernels.build import OneDnnUnavailable, unavailable_reason
from fkjax.kernels.selection import (MAX_UNROLLED_MEMBERS, ModelKernels,
                                     resolve)
from fkjax.kernels.xla_flags import apply_xla_flags

__all__ = ["MAX_UNROLLED_MEMBERS", "ModelKernels", "OneDnnUnavailable",
           "apply_xla_flags", "resolve", "unavailable_reason"]
