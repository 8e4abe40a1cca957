"""Sweeps: many runs trained as one jitted program on a run axis.

Runs that differ only in values that change no shape (seeds, the
sparsifiers' hyperparameters, learning rate, weight decay, noise coefficient,
attack radius and step: :data:`SWEEPABLE_KEYS`) are stacked on a leading run
axis and stepped together by ``jax.vmap`` of the single run's own step
(its weight gradient taken outside the vmap:
:func:`fkjax.training.step.over_runs`;
:class:`fkjax.training.program.Runs`), in the single run's own loop
(:func:`fkjax.training.train.train_runs`). Each run keeps its own PRNG
streams, epoch-end projection, validation, best checkpoint, metrics, final
evaluation and workdir::

    from fkjax.training import sweep
    sweep.train_sweep(configs, workdirs)          # one workdir per run

or ``python train.py --config=configs/sweep.py:rgsm --workdir=W`` with a
``config.sweep`` section (``configs/sweep.py``). See ``docs/sweeps.md``.

What needs no JAX (the sweepable keys, ``config.sweep``, :func:`groups`) is
imported at once; the programs and the loop when first used.
"""
import importlib

from fkjax.training.sweep.spec import check_configs
from fkjax.training.sweep.spec import DATA_ORDERS
from fkjax.training.sweep.spec import expand
from fkjax.training.sweep.spec import groups
from fkjax.training.sweep.spec import SHARD_MODES
from fkjax.training.sweep.spec import SWEEPABLE_KEYS
from fkjax.training.sweep.spec import with_data_seed

# name -> submodule, imported on first use (they import JAX).
_LAZY = {"SWEEP_FILE": "fkjax.training.sweep.loop",
         "train_from_config": "fkjax.training.sweep.loop",
         "train_sweep": "fkjax.training.sweep.loop",
         "resume_step": "fkjax.training.program",
         "Runs": "fkjax.training.program"}

__all__ = [
    "DATA_ORDERS",
    "Runs",
    "SHARD_MODES",
    "SWEEPABLE_KEYS",
    "SWEEP_FILE",
    "check_configs",
    "expand",
    "groups",
    "resume_step",
    "train_from_config",
    "train_sweep",
    "with_data_seed",
]


def __getattr__(name):
  if name in _LAZY:
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'fkjax.training.sweep' has no attribute {name!r}")
