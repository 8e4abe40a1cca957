"""The paper's protocol: PGD adversarial training of En2ResNet20 on CIFAR-10.

Presets pick the rows of the paper's tables; pass them after a colon:

    python train.py --config=configs/default.py:en5resnet20,rgsm --workdir=...

Model presets: ``resnet20`` ``resnet38`` ``en2resnet20`` ``en5resnet20``, any
``en{n}resnet{depth}`` / ``resnet{depth}``, and ``noskip``. Plain ResNets have
no noise; ``en{n}`` nets inject noise with ``noise_coef=0.1``.
Training presets: ``natural`` (no attack during training).
Protocol presets: ``authors`` (the authors' released code where it differs
from the paper's text: all 50K training images, checkpoint selected by PGD-10
test accuracy, eps 0.031 and step 0.007, and for ADMM their projection and
pull, ``sparsity.admm_variant="authors"``; see docs/protocol.md).
Sparsity presets: ``none`` ``rvsm`` ``rgsm`` ``admm`` with the paper's values
(RVSM beta=0.5, lambda=1e-6; RGSM beta=1, lambda1=5e-2, lambda2=1e-5).
Data presets: ``cifar100``.
Any value can then be overridden: ``--config.sparsity.lamb1=0.1``.
``config.kernels`` only changes speed (``--config.kernels.conv=xla``).
"""
import dataclasses
import re
from typing import Any, Mapping

import ml_collections

from fkjax.config import keys as config_keys


@dataclasses.dataclass(frozen=True)
class Nullable:
  """A value that may also be None (``config_dict.placeholder(type)``)."""
  type: type
  default: Any = None


RUN = {
    "seed": 0,
}

DATASET = {
    "dataset.name": "cifar10",             # or "cifar100"
    "dataset.source": "cifar_binary",      # or "tfds", "synthetic"
    # None: the FKJAX_DATA_DIR environment variable, else ~/.cache/fkjax/data.
    "dataset.data_dir": Nullable(str),
    # Download the official archive (md5-checked) when the data are missing.
    "dataset.download": True,
    "dataset.tfds_data_dir": Nullable(str),
    "dataset.val_size": 5000,
    "dataset.split_seed": 0,
    "dataset.subset_per_class": Nullable(int),
    "dataset.test_subset_per_class": Nullable(int),
    # (train pool, test) sizes of source="synthetic".
    "dataset.synthetic_sizes": (50000, 10000),
}

MODEL = {
    "model.depth": 20,
    "model.ensemble_size": 2,
    "model.width": 1,
    "model.skip": True,
    "model.noise_coef": 0.1,
    "model.noise_std_over": "batch",   # authors' torch.std(out); "example"
    # Per-channel mean/std normalisation inside the model. The paper is
    # silent; the authors' code feeds [0, 1] images unnormalised
    # (docs/protocol.md).
    "model.normalize": False,
}

# How fast the model runs, not what it computes (fkjax.kernels.resolve): any
# values may train, resume and evaluate the same run.
KERNELS = {
    # "auto": on GPUs/TPUs "xla", the stock convolution; on CPUs "onednn"
    # (oneDNN's kernels through XLA's FFI, ~2x XLA:CPU's,
    # fkjax/kernels/cpu/onednn_conv.py), else "explicit_grad" (XLA
    # convolutions whose gradients stay fast inside XLA:CPU loops,
    # fkjax/kernels/cpu/explicit_grad_conv.py). Those two run on CPUs only.
    "kernels.conv": "auto",
    # How the noise is injected: "auto" ("model" on GPUs/TPUs: the model's
    # own, JAX's Threefry; on CPUs "fused": one kernel forward and one
    # backward, fkjax/kernels/cpu/noise_cpu.cc, else "jnp": the model's with
    # its Threefry written out). The same values to float32 rounding.
    "kernels.noise": "auto",
    # How ensemble members run: "batched" (nn.vmap), "sequential" (nn.scan
    # loop), "unrolled" (the scan written out) or "auto" (batched on GPUs;
    # on CPUs unrolled up to 5 members, sequential beyond). The variables
    # are the same (fkjax.models.EnResNet).
    "kernels.member_execution": "auto",
}

TRAINING = {
    "training.num_epochs": 200,
    "training.batch_size": 128,
    "training.learning_rate": 0.1,
    "training.lr_boundaries": (80, 120, 160),   # epochs
    "training.lr_decay": 0.1,
    "training.momentum": 0.9,
    "training.nesterov": True,
    "training.weight_decay": 5e-4,
    "training.adversarial": True,
    "training.augment": True,
    # The data order and augmentation come from this seed (None:
    # config.seed). A sweep over seeds that shares one batch stream records
    # it here (docs/sweeps.md).
    "training.data_seed": Nullable(int),
    # The paper is silent on these; the authors' code keeps the last,
    # smaller batch of an epoch and re-creates SGD every epoch, which resets
    # its momentum (docs/protocol.md).
    "training.drop_last": False,
    "training.reset_momentum": True,
    "training.track_clean_accuracy": True,
    "training.checkpoint_every_steps": 0,   # 0: at the end of each epoch
    # A loss above this (or non-finite) stops the run as diverged, before
    # the weights are saved (cross-entropy at chance is ln(classes) ~ 2.3 /
    # 4.6).
    "training.max_loss": 1e3,
    # How steps reach the device (docs/performance.md); neither changes what
    # a run computes. "host": NumPy batches copied each step; "device": the
    # split kept on the device, each batch built there from the host's plan;
    # "auto": device on GPUs/TPUs, host on CPUs.
    "training.data_pipeline": "auto",
    # Accepted so that older configs load; changes nothing (every training
    # step is its own dispatch: docs/training.md).
    "training.steps_per_dispatch": 0,
    # "auto": "tf32" on GPUs and TPUs (the convolutions PyTorch, the
    # authors' code, runs by default on a GPU), "float32" on CPUs; a run
    # records the one it took. "float32" (the paper's: matmuls and
    # convolutions at HIGHEST, true float32 on GPUs/TPUs too, without a
    # GPU's tensor cores), "tf32" (at HIGH: TF32 on GPUs that have it) or
    # "bfloat16": the training steps compute in bfloat16 with float32
    # weights, optimizer state, BatchNorm statistics and loss; validation
    # and evaluation stay float32 (docs/training.md).
    "precision": "auto",
}

# PGD used to make the training batches adversarial.
ATTACK = {
    "attack.epsilon": 8 / 255,
    "attack.step_size": 2 / 255,
    "attack.num_steps": 10,
    "attack.random_start": True,
    # BatchNorm of the model while the training attack runs: "update" (batch
    # statistics, and every attack step updates the running averages, as the
    # authors' code does with the model in train() mode: 11 updates a PGD-10
    # step), "train" (batch statistics, updates discarded) or "eval"
    # (running averages).
    "attack.bn_mode": "update",
    # Attack steps written out per lax.scan iteration: 1 compiles fastest
    # and, with kernels.conv="explicit_grad" or "onednn", runs as fast as a
    # written-out loop on XLA:CPU; num_steps writes the whole loop out
    # (docs/performance.md).
    "attack.unroll": 1,
}

SPARSITY = {
    "sparsity.method": "none",   # "rvsm", "rgsm", "admm"
    "sparsity.beta": 0.5,        # rvsm / rgsm
    "sparsity.lamb": 1e-6,       # rvsm
    "sparsity.lamb1": 5e-2,      # rgsm
    "sparsity.lamb2": 1e-5,      # rgsm
    "sparsity.group": "input",   # rgsm / admm channel groups
    "sparsity.rho": 1e-2,        # admm
    "sparsity.percent": 80.0,    # admm: % of weights (or channels) pruned
    "sparsity.structure": "element",   # admm: or "channel"
    # admm: "exact" (exactly `percent` % zeroed, the pull added once) or
    # "authors" (the authors' released code: signed-percentile / running-
    # percentile projection, the pull added once per layer for every layer;
    # docs/protocol.md).
    "sparsity.admm_variant": "exact",
}

VALIDATION = {
    "validation.batch_size": 500,
    "validation.num_examples": 0,     # 0: the whole validation split
    "validation.attack_steps": 20,    # IFGSM^20 on validation; 0 disables
    "validation.select_by": "natural",   # best checkpoint: or "pgd"
    # "val": the held-out split (the paper's 45K/5K); "test": the test set,
    # as the authors' code selects its checkpoint (with dataset.val_size =
    # 0).
    "validation.split": "val",
}

# eval.py (and the final test evaluation of train.py).
EVAL = {
    # "paper": the paper's A1..A5 (eval_paper.json); "strong": APGD-CE,
    # APGD-DLR and APGD-T with EOT for noisy models, per-image worst case
    # over seeds, and sanity checks (eval_strong.json; docs/attacks.md). Any
    # other name (not within a typo of these two: "Strong" is refused) runs
    # the paper's protocol into eval_<name>.json, so that a further
    # evaluation (e.g. NAttack alone on fewer images) keeps its own file.
    "eval.protocol": "paper",
    "eval.checkpoint": "best",   # or "latest"
    "eval.attacks": "natural,fgsm,ifgsm20,cw,nattack",
    "eval.batch_size": 500,
    "eval.num_examples": 0,       # 0: the whole test split
    "eval.eot_samples": 1,
    "eval.num_noise_draws": 1,
    "eval.nattack_iters": 500,
    "eval.nattack_population": 300,
    # NAttack's memory: population members evaluated at once, and images
    # attacked at once (None: all). Members 0: as many as a quarter of the
    # device's free memory holds (fkjax/attacks/population_chunk.py
    # auto_chunk), 10 on a CPU; the result is the same whatever the chunk.
    # 10 and 100 keep En5ResNet20's NAttack at batch 500 at a 2.8 GiB XLA
    # estimate (all at once: 199 GiB); see docs/attacks.md.
    "eval.nattack_chunk": Nullable(int, 0),
    "eval.nattack_image_chunk": Nullable(int, 100),
    # Count an image as broken if any IFGSM / C&W iterate fooled the model
    # (False: only the final iterate, as the paper's script counts).
    "eval.best_so_far": True,
    # NAttack: "paper" (the NAttack paper's start and success on the mean)
    # or "attackbox" (the code the paper names; for reproducing A5 exactly);
    # noise draws an image must fool before it counts as broken.
    "eval.nattack_variant": "paper",
    "eval.nattack_success_draws": 3,
    # The strong protocol (config.eval.protocol="strong").
    # draws per gradient of a noisy model (0: 20); a deterministic one
    # takes 1
    "eval.strong.eot_samples": 0,
    "eval.strong.num_iters": 100,
    "eval.strong.n_restarts": 1,
    # APGD-T (top-9 targets, 9 runs): AutoAttack's standard version has it;
    # False leaves it out (eval_strong_untargeted.json).
    "eval.strong.targeted": True,
    "eval.strong.num_targets": 9,
    "eval.strong.num_seeds": 3,        # mean and std over seeds
    "eval.strong.sanity_examples": 500,   # 0 skips the sanity checks
    "eval.plots": True,
    "eval.final_attacks": "natural,ifgsm20",   # run by train.py at the end
}

ENVIRONMENT = {
    "num_devices": 0,   # 0: all visible devices
    "progress": True,
    # train.py and eval.py keep compiled steps here (JAX's persistent
    # compilation cache), so resumed runs and evaluations skip most of the
    # compile time. "" disables it; JAX_COMPILATION_CACHE_DIR takes
    # precedence.
    "compilation_cache_dir": "~/.cache/fkjax/jax_compilation_cache",
}

# Named presets: the values each sets (the model presets are a pattern,
# see model_preset).
PRESETS: dict[str, dict[str, Any]] = {
    "noskip": {"model.skip": False},
    "natural": {"training.adversarial": False},
    "none": {"sparsity.method": "none"},
    "rvsm": {"sparsity.method": "rvsm"},
    "rgsm": {"sparsity.method": "rgsm", "sparsity.beta": 1.0},
    "admm": {"sparsity.method": "admm"},
    # The authors' released code where it differs from the paper's text
    # (docs/protocol.md): all 50K images for training, the checkpoint with
    # the best PGD-10 test accuracy, eps 0.031 / step 0.007, and ADMM's
    # projection and pull. Only ADMM reads `admm_variant`, so setting it
    # here whatever the method keeps "authors,admm" and "admm,authors" the
    # same.
    "authors": {
        "sparsity.admm_variant": "authors",
        "dataset.val_size": 0,
        "validation.split": "test",
        "validation.select_by": "pgd",
        "validation.attack_steps": 10,
        "attack.epsilon": 0.031,
        "attack.step_size": 0.007,
    },
    "cifar10": {"dataset.name": "cifar10"},
    "cifar100": {"dataset.name": "cifar100"},
}


def merged(*parts: Mapping[str, Any]) -> dict[str, Any]:
  """The union of dicts of dotted keys; a key in two of them is an error
  (every value is set in one place)."""
  out: dict[str, Any] = {}
  for part in parts:
    twice = sorted(set(out) & set(part))
    if twice:
      raise ValueError(f"config keys set twice: {', '.join(twice)}")
    out.update(part)
  return out


DEFAULTS = merged(RUN, DATASET, MODEL, KERNELS, TRAINING, ATTACK, SPARSITY,
                  VALIDATION, EVAL, ENVIRONMENT)


def build(values: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """A new config holding ``values`` (dotted keys, in their order)."""
  config = ml_collections.ConfigDict()
  set_values(config, values, must_exist=False)
  return config


def set_values(config: ml_collections.ConfigDict, values: Mapping[str, Any],
               *, must_exist: bool = True) -> ml_collections.ConfigDict:
  """Sets ``values`` (dotted keys) in ``config``; with ``must_exist`` a key
  the config lacks is an error (a misspelt override)."""
  for key, value in values.items():
    if isinstance(value, Nullable):
      # A reference of its own in each config: no two configs share it.
      value = ml_collections.FieldReference(value.default,
                                            field_type=value.type)
    config_keys.set_value(config, key, value, must_exist=must_exist)
  return config


def get_config(presets: str = "") -> ml_collections.ConfigDict:
  return apply_presets(build(DEFAULTS), presets)


def apply_presets(config: ml_collections.ConfigDict,
                  presets: str) -> ml_collections.ConfigDict:
  """Applies comma-separated presets in order (see the module docstring)."""
  for preset in filter(None, (p.strip() for p in presets.split(","))):
    apply_preset(config, preset)
  return config


def apply_preset(config: ml_collections.ConfigDict, preset: str) -> None:
  """Applies one named preset (see the module docstring) in place."""
  values = PRESETS.get(preset) or model_preset(preset)
  if values is None:
    raise ValueError(f"unknown config preset {preset!r}; see configs/default.py")
  set_values(config, values)


def model_preset(preset: str) -> dict[str, Any] | None:
  """``en{n}resnet{depth}`` / ``resnet{depth}``: the model's values, or None
  for another name. Plain ResNets have no noise."""
  model = re.fullmatch(r"(?:en(\d+))?resnet(\d+)", preset)
  if not model:
    return None
  members, depth = model.groups()
  return {"model.depth": int(depth), "model.ensemble_size": int(members or 1),
          "model.noise_coef": 0.1 if members else 0.0}
