"""l_inf adversarial attacks on any ``apply_fn(variables, images, key)`` model.

* ``fgsm``: one signed-gradient step (paper's A2).
* ``pgd``: IFGSM^M / PGD, CE or C&W loss (A3 with ``num_steps=20``).
* ``cw_linf``: PGD on the C&W margin (A4).
* ``nattack``: gradient-free NES attack (A5).
* ``input_gradient``: the EOT-averaged input gradient the gradient attacks use.

This package imports nothing else from fkjax.
"""
from fkjax.attacks.common import ApplyFn
from fkjax.attacks.common import cross_entropy
from fkjax.attacks.common import cw_margin
from fkjax.attacks.common import project
from fkjax.attacks.eot import input_gradient
from fkjax.attacks.gradient import cw_linf
from fkjax.attacks.gradient import fgsm
from fkjax.attacks.gradient import pgd
from fkjax.attacks.nattack import nattack

__all__ = [
    "ApplyFn",
    "cross_entropy",
    "cw_linf",
    "cw_margin",
    "fgsm",
    "input_gradient",
    "nattack",
    "pgd",
    "project",
]
