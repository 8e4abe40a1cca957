"""fkjax's CPU kernels: what ``kernels.*="auto"`` picks on a CPU only.

XLA:CPU is where the stock programs run slowly, so this corner holds
everything fkjax adds for a CPU; GPUs and TPUs run the models' own
convolution and noise (:mod:`fkjax.kernels.selection`).

* :mod:`~fkjax.kernels.cpu.onednn_conv`: convolutions through oneDNN via
  XLA's FFI (``onednn_conv.cc``).
* :mod:`~fkjax.kernels.cpu.noise_cpu`: the noise injection fused into one
  CPU kernel forward and one backward (``noise_cpu.cc``).
* :mod:`~fkjax.kernels.cpu.build`: compiles and caches those two C++ files
  (the ``[cpu]`` extra installs oneDNN).
* :mod:`~fkjax.kernels.cpu.explicit_grad_conv`: XLA convolutions whose
  gradients stay fast inside XLA:CPU loops.
* :mod:`~fkjax.kernels.cpu.threefry`: the models' noise with its Threefry
  hash written out in jnp, bit for bit the models' draw.
* :mod:`~fkjax.kernels.cpu.xla_flags`: :func:`apply_xla_flags`, XLA flags
  for CPU, set by ``train.py``/``eval.py`` (importing fkjax sets nothing).
"""
