"""A sweep: runs differing in seeds or hyperparameters, trained as one program.

    python train.py --config=configs/sweep.py:en2resnet20,rgsm --workdir=W
    python train.py --config=configs/sweep.py:resnet20,rvsm \
        --config.sweep.product="sparsity.lamb=1e-6,1e-5; seed=0,1,2" \
        --workdir=W

Each run trains in ``W/<run name>/`` exactly as ``train.py`` trains a single
run there (``eval.py --workdir=W/<run name>`` evaluates it); ``W/sweep.json``
lists the runs. Rerunning the command resumes every run.

Presets: those of ``configs/default.py``; a first preset ``tiny`` or ``cpu``
starts from ``configs/tiny.py`` / ``configs/cpu.py`` instead.

``config.sweep``:
  product: ``"KEY=V1,V2,...; KEY2=..."``: every combination of the values.
  zip: the same form, keys of equal length varying together (run i takes
    each key's i-th value); combined with ``product`` as a product.
  shard: ``"batch"`` (each batch split over the devices) or ``"runs"`` (the
    runs split over the devices: a multiple of the device count).
  data_order: ``"shared"`` (one batch stream, the first run's; runs with
    another seed record it as ``training.data_seed``) or ``"per_run"`` (each
    run its own seed's batches, as it would alone).
Keys: ``seed``, ``training.data_seed``, ``training.learning_rate``,
``training.weight_decay``, ``model.noise_coef``, ``attack.epsilon``,
``attack.step_size``, ``sparsity.{beta,lamb,lamb1,lamb2,rho,percent}``
(docs/sweeps.md). The default sweeps 5 seeds, and for RGSM the paper's two
lambda1 values (Fig. 4 style).
"""
import ml_collections

from configs import cpu
from configs import default
from configs import tiny

_BASES = {"tiny": tiny, "cpu": cpu}


def get_config(presets: str = "") -> ml_collections.ConfigDict:
  names = [p.strip() for p in presets.split(",") if p.strip()]
  base = _BASES[names.pop(0)] if names and names[0] in _BASES else default
  config = base.get_config(",".join(names))
  product = "seed=0,1,2,3,4"
  if config.sparsity.method == "rgsm":
    product = "sparsity.lamb1=0.05,0.1; " + product
  return default.set_values(config, {
      "sweep.product": product, "sweep.zip": "", "sweep.shard": "batch",
      "sweep.data_order": "shared"}, must_exist=False)
