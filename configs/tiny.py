"""A seconds-scale smoke test on SYNTHETIC data (used by the tests).

ResNet8 with noise injection, PGD-2 training, RVSM with a large lambda so
that the per-epoch projection visibly prunes, 3 epochs of 4 steps.
"""
import ml_collections

from configs import default


# What differs from configs/default.py.
TINY = {
    "dataset.source": "synthetic",
    "dataset.synthetic_sizes": (96, 32),
    "dataset.val_size": 32,
    "model.depth": 8,
    "model.ensemble_size": 1,
    "model.noise_coef": 0.1,
    "training.num_epochs": 3,
    "training.batch_size": 16,
    "training.lr_boundaries": (2,),
    "attack.num_steps": 2,
    "sparsity.method": "rvsm",
    "sparsity.beta": 1.0,
    "sparsity.lamb": 2e-3,   # threshold sqrt(2 lamb / beta) ~ 0.063
    "validation.batch_size": 16,
    "validation.attack_steps": 2,
    "eval.batch_size": 16,
    "eval.attacks": "natural,fgsm",
    "eval.final_attacks": "natural,fgsm",
    "eval.plots": False,
    "progress": False,
}


def get_config(presets: str = "") -> ml_collections.ConfigDict:
  config = default.set_values(default.get_config(), TINY)
  return default.apply_presets(config, presets)
