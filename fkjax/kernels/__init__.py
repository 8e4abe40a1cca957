"""What fkjax adds for speed, below the models.

The models (:mod:`fkjax.models`) compute the paper's networks with
``lax.conv_general_dilated`` and a jnp noise injection; nothing here changes
what they compute, only how fast. :func:`resolve` turns ``config.kernels``
into the callables a model takes::

  kernels = fkjax.kernels.resolve(config.kernels, ensemble_size=2)
  model = fkjax.models.create_model(depth=20, ensemble_size=2,
                                    noise_coef=0.1, **kernels.model_kwargs)

On GPUs and TPUs ``"auto"`` is the models' own convolution and noise; on a
CPU it takes :mod:`fkjax.kernels.cpu` (oneDNN convolutions, the fused noise
kernel, convolutions with explicit gradients, the Threefry written out, XLA
flags). :func:`platform` says whose selections apply
(``FKJAX_KERNELS_PLATFORM=gpu`` makes a CPU take a GPU's).
"""
from __future__ import annotations

from fkjax.kernels.cpu.build import OneDnnUnavailable, unavailable_reason
from fkjax.kernels.cpu.xla_flags import apply_xla_flags
from fkjax.kernels.platforms import PLATFORM_ENV, PLATFORMS, platform
from fkjax.kernels.selection import (MAX_UNROLLED_MEMBERS, ModelKernels,
                                     resolve)

__all__ = ["MAX_UNROLLED_MEMBERS", "ModelKernels", "OneDnnUnavailable",
           "PLATFORMS", "PLATFORM_ENV", "apply_xla_flags", "platform",
           "resolve", "unavailable_reason"]
