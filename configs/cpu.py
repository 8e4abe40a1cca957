"""A CPU-scale demo of the paper's protocol: a few minutes on 2 cores.

En2ResNet8 (noise 0.1) trained with PGD-3 on a balanced 1,000-image subset of
the real CIFAR-10 for 3 epochs with RGSM channel pruning, validated on 250
images, then tested on 250 images (natural, FGSM, IFGSM^20). The accuracies it
reaches are a smoke test, not the paper's.

RGSM's lambda1 is 0.8 here, not the paper's 5e-2: in 3 epochs the channel
norms stay near their initial ~1.4 (He init gives every input-channel group
a norm of about sqrt(2)), so only a threshold sqrt(2 lambda1 / beta) ~ 1.26
prunes anything. Accepts the same presets as ``configs/default.py``
(``configs/cpu.py:rvsm``).
"""
import ml_collections

from configs import default


def get_config(presets: str = "") -> ml_collections.ConfigDict:
  config = default.get_config()
  config.model.depth = 8
  config.dataset.subset_per_class = 100
  config.dataset.test_subset_per_class = 25
  config.training.num_epochs = 3
  config.training.batch_size = 64
  config.training.lr_boundaries = (2,)
  config.attack.num_steps = 3
  config.sparsity.method = "rgsm"
  config.sparsity.beta = 1.0
  config.sparsity.lamb1 = 0.8
  config.validation.num_examples = 250
  config.validation.batch_size = 250
  config.validation.attack_steps = 3
  # Batches of 50: a killed eval.py keeps (and resumes after) every finished
  # batch, and its time-left estimate settles after the first fifth.
  config.eval.batch_size = 50
  config.eval.num_examples = 250
  config.eval.nattack_iters = 20
  config.eval.nattack_population = 50
  config.eval.final_attacks = "natural,fgsm,ifgsm20"
  return default.apply_presets(config, presets)
