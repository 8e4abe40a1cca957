"""PyTorch eager reference of fkjax's models, PGD and train step (benchmark only).

The same computation as ``fkjax.models`` + ``fkjax.attacks.pgd`` +
``fkjax.training.step.make_train_step`` with ``sparsity.method="none"``, written the
way the paper's authors wrote theirs (eager PyTorch, ``torch.autograd.grad``
for the attack's input gradient), so that ``benchmarks/bench_train.py`` can
time both on the same machine. Needs ``torch`` (see
``benchmarks/requirements-bench.txt``); fkjax itself never imports this file.
Works on any torch device: ``create_model(..., device=...)`` puts the model
there, and every function follows the device of its model and tensors.

The model is the one ``config.model`` describes (``create_model_from_config``):
in particular it normalises its inputs with CIFAR-10's mean and std only
when ``config.model.normalize`` is True (the default config feeds [0, 1]
images unnormalised, as the authors' code does).

Differences from fkjax that do not change the cost: the attack in BatchNorm
"train" mode also updates the running averages here (as in the authors'
code), while fkjax discards that update.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
import torch.nn.functional as F

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def _conv(cin: int, cout: int, k: int, stride: int) -> nn.Conv2d:
  conv = nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)
  nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
  return conv


class PreActBlock(nn.Module):
  """BN-ReLU-conv3x3-BN-ReLU-conv3x3 + shortcut, then optional noise."""

  def __init__(self, cin: int, cout: int, stride: int, noise_coef: float):
    super().__init__()
    self.bn1 = nn.BatchNorm2d(cin)
    self.conv1 = _conv(cin, cout, 3, stride)
    self.bn2 = nn.BatchNorm2d(cout)
    self.conv2 = _conv(cout, cout, 3, 1)
    self.shortcut = (_conv(cin, cout, 1, stride)
                     if stride != 1 or cin != cout else None)
    self.noise_coef = noise_coef

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    pre = F.relu(self.bn1(x))
    out = self.conv2(F.relu(self.bn2(self.conv1(pre))))
    out = out + (self.shortcut(pre) if self.shortcut is not None else x)
    if self.noise_coef:
      # Population std (fkjax's jnp.std); the authors' torch.std differs only
      # by Bessel's factor, which costs the same.
      std = torch.std(out, correction=0)
      out = out + self.noise_coef * std * torch.randn_like(out)
    return out


class PreActResNet(nn.Module):
  """Pre-activation ResNet(6n+2) on [0, 1] images, normalising inside when
  ``normalize`` (fkjax's ``config.model.normalize``)."""

  def __init__(self, depth: int = 20, num_classes: int = 10,
               noise_coef: float = 0.0, normalize: bool = False,
               mean: Sequence[float] = CIFAR10_MEAN,
               std: Sequence[float] = CIFAR10_STD):
    super().__init__()
    if (depth - 2) % 6 or depth < 8:
      raise ValueError(f"depth must be 6n+2, got {depth}")
    n = (depth - 2) // 6
    self.normalize = normalize
    self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1))
    self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1))
    self.stem = _conv(3, 16, 3, 1)
    blocks, cin = [], 16
    for stage, cout in enumerate((16, 32, 64)):
      for b in range(n):
        stride = 2 if stage > 0 and b == 0 else 1
        blocks.append(PreActBlock(cin, cout, stride, noise_coef))
        cin = cout
    self.blocks = nn.Sequential(*blocks)
    self.bn_final = nn.BatchNorm2d(cin)
    self.head = nn.Linear(cin, num_classes)
    nn.init.zeros_(self.head.bias)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    if self.normalize:
      x = (x - self.mean) / self.std
    x = self.stem(x)
    x = F.relu(self.bn_final(self.blocks(x)))
    return self.head(x.mean(dim=(2, 3)))


class EnResNet(nn.Module):
  """Mean of the logits of ``num_members`` independent members."""

  def __init__(self, num_members: int, **member_kwargs):
    super().__init__()
    self.members = nn.ModuleList(
        PreActResNet(**member_kwargs) for _ in range(num_members))

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    return torch.stack([m(x) for m in self.members]).mean(0)


def create_model(depth: int = 20, ensemble_size: int = 1,
                 noise_coef: float = 0.0, num_classes: int = 10,
                 device: torch.device | str = "cpu",
                 normalize: bool = False) -> nn.Module:
  """ResNet{depth} (``ensemble_size=1``) or En{n}ResNet{depth} on ``device``.

  ``normalize``: normalise inputs with CIFAR-10's mean and std inside the
  model (False: [0, 1] images go in as they are, fkjax's default). The
  weights are drawn on the CPU and then moved, so that a seed gives the
  same initial model on every device.
  """
  kwargs = dict(depth=depth, num_classes=num_classes, noise_coef=noise_coef,
                normalize=normalize)
  if ensemble_size == 1:
    model = PreActResNet(**kwargs)
  else:
    model = EnResNet(ensemble_size, **kwargs)
  return model.to(device)  # parameters and buffers (mean, std, BN statistics)


def create_model_from_config(model_config, num_classes: int = 10,
                             device: torch.device | str = "cpu") -> nn.Module:
  """The model ``config.model`` describes (fkjax's ``configs/default.py``).

  Raises ValueError for settings this reference does not implement (a
  width other than 1, no skip connections, noise scaled per example)
  rather than timing or attacking another model.
  """
  m = model_config
  unsupported = {key: m[key] for key, ok in (
      ("width", 1), ("skip", True), ("noise_std_over", "batch"))
                 if key in m and m[key] != ok}
  if unsupported and m.get("noise_coef", 0.0) == 0.0:
    unsupported.pop("noise_std_over", None)  # no noise: nothing to scale
  if unsupported:
    raise ValueError(f"benchmarks/torch_reference.py does not implement "
                     f"config.model settings {unsupported}")
  return create_model(m.depth, m.ensemble_size, m.noise_coef, num_classes,
                      device=device, normalize=m.normalize)


def num_params(model: nn.Module) -> int:
  """Trainable parameters (BatchNorm scale/bias included, statistics not)."""
  return sum(p.numel() for p in model.parameters())


def pgd(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, *,
        epsilon: float = 8 / 255, step_size: float = 2 / 255,
        num_steps: int = 10, random_start: bool = True) -> torch.Tensor:
  """l_inf PGD / IFGSM^M on the summed cross-entropy, in the model's mode."""
  x = images.detach()
  if random_start:
    x = x + torch.empty_like(x).uniform_(-epsilon, epsilon)
    x = torch.clamp(torch.min(torch.max(x, images - epsilon),
                              images + epsilon), 0, 1)
  for _ in range(num_steps):
    x.requires_grad_(True)
    with torch.enable_grad():
      loss = F.cross_entropy(model(x), labels, reduction="sum")
    grad, = torch.autograd.grad(loss, [x])
    x = x.detach() + step_size * torch.sign(grad)
    x = torch.clamp(torch.min(torch.max(x, images - epsilon),
                              images + epsilon), 0, 1)
  return x.detach()


def make_optimizer(model: nn.Module, lr: float = 0.1, momentum: float = 0.9,
                   weight_decay: float = 5e-4) -> torch.optim.Optimizer:
  """SGD with Nesterov momentum and L2 on every parameter (fkjax's chain)."""
  return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                         nesterov=True, weight_decay=weight_decay)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer,
               images: torch.Tensor, labels: torch.Tensor, *,
               adversarial: bool = True, num_steps: int = 10,
               bn_mode: str = "train", track_clean: bool = True
               ) -> dict[str, float]:
  """One step of fkjax's train step: PGD, loss+grads on x_adv, SGD update.

  ``track_clean`` adds the clean-accuracy forward pass fkjax's default
  config computes (``training.track_clean_accuracy``).
  """
  if adversarial:
    model.train(bn_mode == "train")
    x_train = pgd(model, images, labels, num_steps=num_steps)
  else:
    x_train = images
  model.train()
  logits = model(x_train)
  loss = F.cross_entropy(logits, labels)
  optimizer.zero_grad(set_to_none=True)
  loss.backward()
  optimizer.step()
  metrics = {"loss": loss.detach()}
  if track_clean and adversarial:
    with torch.no_grad():
      metrics["clean_correct"] = (model(images).argmax(-1) == labels).sum()
  return {k: float(v) for k, v in metrics.items()}


def eval_ifgsm(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
               num_steps: int = 20) -> int:
  """Correct predictions under IFGSM^M from x (BatchNorm in eval mode)."""
  model.eval()
  x_adv = pgd(model, images, labels, num_steps=num_steps, random_start=False)
  with torch.no_grad():
    return int((model(x_adv).argmax(-1) == labels).sum())


def load_flax_variables(model: nn.Module, params, batch_stats) -> None:
  """Copies fkjax (Flax) variables into ``model`` in place.

  ``params``/``batch_stats`` are the trees of ``fkjax.models`` (NumPy or JAX
  arrays); an ensemble's trees carry the member axis first. Each value is
  copied onto the device of the tensor it replaces. Lets a test check that
  both implementations compute the same function.
  """
  import numpy as np  # pylint: disable=import-outside-toplevel

  members = getattr(model, "members", None)
  if members is not None:
    for i, member in enumerate(members):
      load_flax_variables(member, take_i(params["members"], i),
                          take_i(batch_stats["members"], i))
    return

  def copy(dst: torch.Tensor, x):
    # Put on dst's device (a no-op on the CPU) before the in-place copy.
    src = torch.from_numpy(np.array(x, dtype=np.float32))
    dst.copy_(src.to(dst.device))

  def conv(dst: nn.Conv2d, p):
    kernel = np.asarray(p["kernel"]).transpose(3, 2, 0, 1)  # HWIO -> OIHW
    copy(dst.weight.data, kernel)

  def bn(dst: nn.BatchNorm2d, p, s):
    copy(dst.weight.data, p["scale"])
    copy(dst.bias.data, p["bias"])
    copy(dst.running_mean, s["mean"])
    copy(dst.running_var, s["var"])

  conv(model.stem, params["stem"])
  n = len(model.blocks) // 3
  for index, block in enumerate(model.blocks):
    name = f"stage{index // n + 1}_block{index % n + 1}"
    p, s = params[name], batch_stats[name]
    bn(block.bn1, p["bn1"], s["bn1"])
    conv(block.conv1, p["conv1"])
    bn(block.bn2, p["bn2"], s["bn2"])
    conv(block.conv2, p["conv2"])
    if block.shortcut is not None:
      conv(block.shortcut, p["shortcut"])
  bn(model.bn_final, params["bn_final"], batch_stats["bn_final"])
  copy(model.head.weight.data, np.asarray(params["head"]["kernel"]).T)
  copy(model.head.bias.data, params["head"]["bias"])


def take_i(tree, i: int):
  """Member ``i`` of a tree whose leaves carry the member axis first."""
  if isinstance(tree, dict):
    return {k: take_i(v, i) for k, v in tree.items()}
  return tree[i]
