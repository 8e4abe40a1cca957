"""l_inf adversarial attacks on any ``apply_fn(variables, images, key)`` model.

* ``fgsm``: one signed-gradient step (paper's A2).
* ``pgd``: IFGSM^M / PGD, CE or C&W loss (A3 with ``num_steps=20``).
* ``cw_linf``: PGD on the C&W margin (A4).
* ``cw_authors``: the authors' script's C&W (the paper's A4 as published).
* ``nattack``: gradient-free NES attack (A5).
* ``apgd`` (``apgd_ce``, ``apgd_dlr``, ``apgd_t``): Auto-PGD, the strong
  protocol's attacks.
* ``input_gradient``, ``loss_and_gradient``: the EOT-averaged input gradient
  (and loss) the gradient attacks use.

This package imports nothing else from fkjax.
"""
from fkjax.attacks.auto_pgd import apgd
from fkjax.attacks.auto_pgd import apgd_ce
from fkjax.attacks.auto_pgd import apgd_dlr
from fkjax.attacks.auto_pgd import apgd_t
from fkjax.attacks.authors import cw_authors
from fkjax.attacks.common import ApplyFn
from fkjax.attacks.common import cross_entropy
from fkjax.attacks.common import cw_margin
from fkjax.attacks.common import dlr
from fkjax.attacks.common import dlr_targeted
from fkjax.attacks.common import per_example_loss
from fkjax.attacks.common import project
from fkjax.attacks.eot import input_gradient
from fkjax.attacks.eot import loss_and_gradient
from fkjax.attacks.gradient import cw_linf
from fkjax.attacks.gradient import fgsm
from fkjax.attacks.gradient import pgd
from fkjax.attacks.gradient import sweep_step_size
from fkjax.attacks.nattack import nattack
from fkjax.attacks.population_chunk import auto_chunk as nattack_auto_chunk

__all__ = [
    "ApplyFn",
    "apgd",
    "apgd_ce",
    "apgd_dlr",
    "apgd_t",
    "cross_entropy",
    "cw_authors",
    "cw_linf",
    "cw_margin",
    "dlr",
    "dlr_targeted",
    "fgsm",
    "input_gradient",
    "loss_and_gradient",
    "nattack",
    "nattack_auto_chunk",
    "per_example_loss",
    "pgd",
    "project",
    "sweep_step_size",
]
