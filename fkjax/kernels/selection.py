"""The one place that turns ``config.kernels`` into what a model runs.

On a CPU ``"auto"`` takes fkjax's CPU kernels (:mod:`fkjax.kernels.cpu`);
on GPUs and TPUs it takes what the models compute with themselves: the stock
``lax.conv_general_dilated`` and :func:`fkjax.models.noise.inject_noise`
(JAX's Threefry, straight-line ``stablehlo`` there). A choice for one
platform never changes another's.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping
import warnings

from jax import lax

from fkjax.kernels.cpu import build
from fkjax.kernels.cpu import explicit_grad_conv
from fkjax.kernels.cpu import noise_cpu
from fkjax.kernels.cpu import onednn_conv
from fkjax.kernels.cpu import threefry
from fkjax.kernels.platforms import platform as selection_platform
from fkjax.models import MEMBER_EXECUTIONS
from fkjax.models import inject_noise as model_inject_noise

CONVS: dict[str, Callable] = {
    "xla": lax.conv_general_dilated,
    "onednn": onednn_conv.conv_general_dilated,
    "explicit_grad": explicit_grad_conv.conv_general_dilated,
}
NOISES: dict[str, Callable] = {
    "model": model_inject_noise,
    "fused": noise_cpu.inject_noise,
    "jnp": threefry.inject_noise,
}
# The values of each key of config.kernels besides "auto".
CHOICES: dict[str, tuple[str, ...]] = {
    "conv": tuple(CONVS), "noise": tuple(NOISES),
    "member_execution": MEMBER_EXECUTIONS}
# The choices that run on CPUs only (fkjax.kernels.cpu), and those of them
# that need fkjax's CPU library (fkjax.kernels.cpu.build).
CPU_ONLY = {"conv": ("onednn", "explicit_grad"), "noise": ("fused", "jnp")}
_NEED_LIBRARY = {"conv": "onednn", "noise": "fused"}
# "auto" on GPUs and TPUs: the models' own computation.
ACCELERATOR_CHOICES = {"conv": "xla", "noise": "model",
                       "member_execution": "batched"}
_ACCELERATOR = ACCELERATOR_CHOICES

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
    platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``: whose selections these
      are.
    noise_any_coef: ``inject_noise``, or where that takes its coefficient
      as a constant (the fused CPU kernel) the same noise taking a traced
      one (a sweep's per-run coefficient).
  """
  conv: Callable
  inject_noise: Callable
  member_execution: str
  names: Mapping[str, str]
  description: str
  platform: str
  noise_any_coef: Callable

  @property
  def model_kwargs(self) -> dict[str, Any]:
    return {"conv": self.conv, "inject_noise": self.inject_noise,
            "member_execution": self.member_execution}


def resolve(kernel_config: Mapping[str, str] | None = None, *,
            ensemble_size: int = 1, noise: bool = True,
            backend: str | None = None) -> ModelKernels:
  """Resolves every ``"auto"`` of ``config.kernels`` for a platform.

  On GPUs and TPUs ``"auto"`` is the models' own computation: ``conv``
  ``"xla"`` (``lax.conv_general_dilated``), ``noise`` ``"model"``
  (:func:`fkjax.models.noise.inject_noise`) and ``member_execution``
  ``"batched"``. On a CPU:

  * ``conv``: ``"onednn"`` where fkjax's CPU library builds (one warning
    says why where it does not), else ``"explicit_grad"``.
  * ``noise``: ``"fused"`` (one CPU kernel forward and one backward, about
    2x the jnp form's speed) where the library builds, else ``"jnp"`` (the
    models' draw with its Threefry written out). All draw
    :func:`fkjax.models.noise.standard_normal`'s numbers.
  * ``member_execution``: ``"unrolled"`` up to :data:`MAX_UNROLLED_MEMBERS`
    members, the fastest (XLA:CPU runs the grouped convolutions of batched
    members slowly), and ``"sequential"`` beyond, whose compile time does
    not grow with the ensemble.

  Every choice computes the same function (to float32 rounding).

  Args:
    kernel_config: ``conv``, ``noise`` and ``member_execution`` (missing
      ones: ``"auto"``), e.g. ``config.kernels``.
    ensemble_size: the model's number of members.
    noise: whether the model injects noise (only for the description).
    backend: the platform whose selections to take (``"cpu"``, ``"gpu"``,
      ``"cuda"``, ``"tpu"``, ...); default
      :func:`fkjax.kernels.platform` (``$FKJAX_KERNELS_PLATFORM``, else
      JAX's backend).

  Raises:
    ValueError: an unknown choice, or a CPU kernel
      (:data:`CPU_ONLY`) for another platform than the CPU.
    fkjax.kernels.OneDnnUnavailable: ``"onednn"`` or ``"fused"`` asked for
      where fkjax's CPU library cannot be built.
  """
  names, platform = _checked_choices(kernel_config, backend)
  if platform == "cpu":
    library = any(names[key] == "auto" for key in _NEED_LIBRARY) and (
        _library_reason() is None)
    auto = {"conv": "onednn" if library else "explicit_grad",
            "noise": "fused" if library else "jnp",
            "member_execution": ("unrolled"
                                 if ensemble_size <= MAX_UNROLLED_MEMBERS
                                 else "sequential")}
  else:
    auto = _ACCELERATOR
  names = {key: auto[key] if value == "auto" else value
           for key, value in names.items()}
  parts = [f"conv {names['conv']}"]
  if noise:
    parts.append(f"noise {names['noise']}")
  if ensemble_size > 1:
    parts.append(f"members {names['member_execution']}")
  inject = NOISES[names["noise"]]
  return ModelKernels(
      conv=CONVS[names["conv"]], inject_noise=inject,
      member_execution=names["member_execution"],
      names=names, description=", ".join(parts), platform=platform,
      noise_any_coef=NOISES["jnp"] if names["noise"] == "fused" else inject)


def _checked_choices(kernel_config: Mapping[str, str] | None,
                     backend: str | None) -> tuple[dict[str, str], str]:
  """:func:`resolve`'s checks: the choices (``"auto"`` where missing) and
  the selection platform, or the error :func:`resolve` documents."""
  kernel_config = dict(kernel_config or {})
  unknown = sorted(set(kernel_config) - set(CHOICES))
  if unknown:
    raise ValueError(f"unknown config.kernels keys {unknown}")
  names = {key: kernel_config.get(key, "auto") for key in CHOICES}
  for key, allowed in CHOICES.items():
    if names[key] != "auto" and names[key] not in allowed:
      raise ValueError(f"config.kernels.{key} must be 'auto' or one of "
                       f"{sorted(allowed)}, got {names[key]!r}")
  platform = selection_platform(backend)
  for key, cpu_only in CPU_ONLY.items():
    if names[key] in cpu_only and platform != "cpu":
      raise ValueError(f"config.kernels.{key}={names[key]!r} runs on CPUs "
                       f"only, not on {platform!r} (its 'auto' is "
                       f"{_ACCELERATOR[key]!r})")
  for key, needs in _NEED_LIBRARY.items():
    if names[key] == needs:
      build.load()  # raises OneDnnUnavailable with the reason
  return names, platform


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
