"""Flax models: pre-activation ResNets and the noise-injected EnResNet.

They import nothing else from fkjax; faster convolutions and noise
injections for them come from :func:`fkjax.kernels.resolve`.
"""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
from jax import lax

from fkjax.models.ensemble import MEMBER_EXECUTIONS, EnResNet
from fkjax.models.noise import inject_noise, standard_normal
from fkjax.models.resnet import (CIFAR10_MEAN, CIFAR10_STD, PreActBlock,
                                 PreActResNet)


def create_model(*, depth: int = 20, num_classes: int = 10,
                 ensemble_size: int = 1, width: int = 1, skip: bool = True,
                 noise_coef: float = 0.0, noise_std_over: str = "batch",
                 normalize: bool = False,
                 conv: Callable = lax.conv_general_dilated,
                 inject_noise: Callable = inject_noise,  # pylint: disable=redefined-outer-name
                 member_execution: str = "batched") -> nn.Module:
  """Builds ResNet{depth} (``ensemble_size=1``) or En{n}ResNet{depth}.

  ``ensemble_size=1`` gives a plain :class:`PreActResNet` (no member axis).
  ``normalize`` standardises the inputs with CIFAR-10's per-channel mean and
  std inside the model; off by default, as ``config.model.normalize`` and
  the authors' code.
  ``conv``, ``inject_noise`` (see :class:`PreActResNet`) and
  ``member_execution`` (how an ensemble's members run, see
  :class:`EnResNet`) change speed, not the variables.
  """
  kwargs = dict(depth=depth, num_classes=num_classes, width=width, skip=skip,
                noise_coef=noise_coef, noise_std_over=noise_std_over,
                conv=conv, inject_noise=inject_noise)
  if normalize:
    kwargs.update(mean=CIFAR10_MEAN, std=CIFAR10_STD)
  if ensemble_size < 1:
    raise ValueError(f"ensemble_size must be >= 1, got {ensemble_size}")
  if ensemble_size == 1:
    return PreActResNet(**kwargs)
  return EnResNet(num_members=ensemble_size, member_kwargs=kwargs,
                  member_execution=member_execution)


__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "EnResNet", "MEMBER_EXECUTIONS",
           "PreActBlock", "PreActResNet", "create_model", "inject_noise",
           "standard_normal"]
