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

# What differs from configs/default.py.
CPU = {
    "model.depth": 8,
    "dataset.subset_per_class": 100,
    "dataset.test_subset_per_class": 25,
    "training.num_epochs": 3,
    "training.batch_size": 64,
    "training.lr_boundaries": (2,),
    "attack.num_steps": 3,
    "sparsity.method": "rgsm",
    "sparsity.beta": 1.0,
    "sparsity.lamb1": 0.8,
    "validation.num_examples": 250,
    "validation.batch_size": 250,
    "validation.attack_steps": 3,
    # Batches of 50: a killed eval.py keeps (and resumes after) every
    # finished batch, and its time-left estimate settles after the first
    # fifth.
    "eval.batch_size": 50,
    "eval.num_examples": 250,
    "eval.nattack_iters": 20,
    "eval.nattack_population": 50,
    "eval.final_attacks": "natural,fgsm,ifgsm20",
}


def get_config(presets: str = "") -> ml_collections.ConfigDict:
  config = default.set_values(default.get_config(), CPU)
  return default.apply_presets(config, presets)
