"""A seconds-scale smoke test on SYNTHETIC data (used by the tests).

ResNet8 with noise injection, PGD-2 training, RVSM with a large lambda so
that the per-epoch projection visibly prunes, 3 epochs of 4 steps.
"""
import ml_collections

from configs import default


def get_config(presets: str = "") -> ml_collections.ConfigDict:
  config = default.get_config()
  config.dataset.source = "synthetic"
  config.dataset.synthetic_sizes = (96, 32)
  config.dataset.val_size = 32
  config.model.depth = 8
  config.model.ensemble_size = 1
  config.model.noise_coef = 0.1
  config.training.num_epochs = 3
  config.training.batch_size = 16
  config.training.lr_boundaries = (2,)
  config.attack.num_steps = 2
  config.sparsity.method = "rvsm"
  config.sparsity.beta = 1.0
  config.sparsity.lamb = 2e-3   # threshold sqrt(2 lamb / beta) ~ 0.063
  config.validation.batch_size = 16
  config.validation.attack_steps = 2
  config.eval.batch_size = 16
  config.eval.attacks = "natural,fgsm"
  config.eval.final_attacks = "natural,fgsm"
  config.eval.plots = False
  config.progress = False
  return default.apply_presets(config, presets)
