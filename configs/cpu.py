"""A CPU-scale demo of the paper's protocol: minutes on 2 cores.

En2ResNet8 (noise 0.1) trained with PGD-3 on a balanced 2,000-image subset
of the real CIFAR-10 for 3 epochs, RGSM channel pruning, validation on 500
images. The numbers it reaches are a smoke test, not the paper's. Accepts the
same presets as ``configs/default.py`` (``configs/cpu.py:rvsm``).
"""
import ml_collections

from configs import default


def get_config(presets: str = "") -> ml_collections.ConfigDict:
  config = default.get_config()
  config.model.depth = 8
  config.dataset.subset_per_class = 200
  config.dataset.test_subset_per_class = 50
  config.training.num_epochs = 3
  config.training.batch_size = 64
  config.training.lr_boundaries = (2,)
  config.attack.num_steps = 3
  config.sparsity.method = "rgsm"
  config.sparsity.beta = 1.0
  config.validation.num_examples = 500
  config.validation.batch_size = 250
  config.validation.attack_steps = 5
  config.eval.batch_size = 250
  config.eval.num_examples = 500
  config.eval.attacks = "natural,fgsm,ifgsm20,cw,nattack"
  config.eval.nattack_iters = 20
  config.eval.nattack_population = 50
  config.eval.final_attacks = "natural,fgsm,ifgsm20"
  for preset in filter(None, (p.strip() for p in presets.split(","))):
    default.apply_preset(config, preset)
  return config
