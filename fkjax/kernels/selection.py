"""The one place that turns ``config.kernels`` into what a model runs."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping
import warnings

import jax
from jax import lax

from fkjax.kernels import build
from fkjax.kernels import explicit_grad_conv
from fkjax.kernels import noise_cpu
from fkjax.kernels import noise_jnp
from fkjax.kernels import onednn_conv
from fkjax.models import MEMBER_EXECUTIONS

CONVS: dict[str, Callable] = {
    "onednn": onednn_conv.conv_general_dilated,
    "explicit_grad": explicit_grad_conv.conv_general_dilated,
    "xla": lax.conv_general_dilated,
}
NOISES: dict[str, Callable] = {
    "fused": noise_cpu.inject_noise,
    "jnp": noise_jnp.inject_noise,
}
# The values of each key of config.kernels besides "auto".
CHOICES: dict[str, tuple[str, ...]] = {
    "conv": tuple(CONVS), "noise": tuple(NOISES),
    "member_execution": MEMBER_EXECUTIONS}
# The choices that need fkjax's CPU library (fkjax.kernels.build).
_NEED_LIBRARY = {"conv": "onednn", "noise": "fused"}

# On 2 CPU cores En5ResNet20's PGD-10 step written out compiles in 17-18 s
# (9.5 s as a loop) and runs 22% faster (10.9 vs 13.9 s per step, 1.4 vs
# 2.1 GB); compile time grows about linearly with the members.
MAX_UNROLLED_MEMBERS = 5


@dataclasses.dataclass(frozen=True)
class ModelKernels:
  """What a model runs, for ``fkjax.models.create_model(**kernels.model_kwargs)``.

  Attributes:
    conv: the convolution (``lax.conv_general_dilated``'s signature).
    inject_noise: ``(out, coef, key, std_over) -> out + coef * std * z``.
    member_execution: ``"batched"``, ``"sequential"`` or ``"unrolled"``.
    names: the resolved choice of each of ``conv``, ``noise`` and
      ``member_execution``.
    description: e.g. ``"conv onednn, noise fused, members unrolled"``.
  """
  conv: Callable
  inject_noise: Callable
  member_execution: str
  names: Mapping[str, str]
  description: str

  @property
  def model_kwargs(self) -> dict[str, Any]:
    return {"conv": self.conv, "inject_noise": self.inject_noise,
            "member_execution": self.member_execution}


def resolve(kernel_config: Mapping[str, str] | None = None, *,
            ensemble_size: int = 1, noise: bool = True,
            backend: str | None = None) -> ModelKernels:
  """Resolves every ``"auto"`` of ``config.kernels``.

  * ``conv``: ``"auto"`` is ``"onednn"`` on a CPU backend where fkjax's CPU
    library builds (one warning says why where it does not), else
    ``"explicit_grad"``; ``"xla"`` is the stock convolution.
  * ``noise``: ``"auto"`` is ``"fused"`` (one CPU kernel forward and one
    backward, about 2x the jnp form's speed) where the library builds, else
    ``"jnp"``. Both draw :func:`fkjax.models.noise.standard_normal`'s noise.
  * ``member_execution``: ``"auto"`` is ``"batched"`` on accelerators; on a
    CPU (where XLA runs the grouped convolutions of batched members slowly)
    ``"unrolled"`` up to :data:`MAX_UNROLLED_MEMBERS` members, the fastest,
    and ``"sequential"`` beyond, whose compile time does not grow with the
    ensemble.

  Every choice computes the same function (to float32 rounding).

  Args:
    kernel_config: ``conv``, ``noise`` and ``member_execution`` (missing
      ones: ``"auto"``), e.g. ``config.kernels``.
    ensemble_size: the model's number of members.
    noise: whether the model injects noise (only for the description).
    backend: JAX's backend; default ``jax.default_backend()``.

  Raises:
    ValueError: an unknown choice, or ``"onednn"``/``"fused"`` on another
      backend than the CPU.
    fkjax.kernels.OneDnnUnavailable: ``"onednn"`` or ``"fused"`` asked for
      where fkjax's CPU library cannot be built.
  """
  kernel_config = dict(kernel_config or {})
  unknown = sorted(set(kernel_config) - set(CHOICES))
  if unknown:
    raise ValueError(f"unknown config.kernels keys {unknown}")
  names = {key: kernel_config.get(key, "auto") for key in CHOICES}
  for key, allowed in CHOICES.items():
    if names[key] != "auto" and names[key] not in allowed:
      raise ValueError(f"config.kernels.{key} must be 'auto' or one of "
                       f"{sorted(allowed)}, got {names[key]!r}")
  backend = backend or jax.default_backend()
  on_cpu = backend == "cpu"
  for key, needs in _NEED_LIBRARY.items():
    if names[key] == needs:
      if not on_cpu:
        raise ValueError(f"config.kernels.{key}={needs!r} runs on CPUs only, "
                         f"not on {backend!r}")
      build.load()  # raises OneDnnUnavailable with the reason
  library = on_cpu and _library_reason() is None
  if names["conv"] == "auto":
    names["conv"] = "onednn" if library else "explicit_grad"
  if names["noise"] == "auto":
    names["noise"] = "fused" if library else "jnp"
  if names["member_execution"] == "auto":
    names["member_execution"] = (
        "batched" if not on_cpu else
        "unrolled" if ensemble_size <= MAX_UNROLLED_MEMBERS else "sequential")
  parts = [f"conv {names['conv']}"]
  if noise:
    parts.append(f"noise {names['noise']}")
  if ensemble_size > 1:
    parts.append(f"members {names['member_execution']}")
  return ModelKernels(conv=CONVS[names["conv"]],
                      inject_noise=NOISES[names["noise"]],
                      member_execution=names["member_execution"],
                      names=names, description=", ".join(parts))


def _library_reason() -> str | None:
  reason = build.unavailable_reason()
  if reason is not None:
    _warn_fallback(reason)
  return reason


@functools.cache
def _warn_fallback(reason: str) -> None:
  warnings.warn("config.kernels \"auto\" falls back to XLA's convolutions and "
                f"the jnp noise (about 2x slower on CPU): {reason}",
                RuntimeWarning, stacklevel=4)
