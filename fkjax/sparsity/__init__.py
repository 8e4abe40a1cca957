"""RVSM, RGSM and ADMM pruning as optax transformations, with sparsity metrics.

A self-contained building block (pure JAX + optax, knows no model; works on
the parameter trees of Flax linen and NNX, Equinox, and plain dicts)::

    from fkjax import sparsity

    sgd = optax.inject_hyperparams(optax.sgd)(
        learning_rate=schedule, momentum=0.9, nesterov=True)
    tx = sparsity.rvsm(sgd, beta=5e-2, lamb=1e-6)  # reads sgd's lr
    ...                                    # train with tx; at each epoch's end:
    params = sparsity.project(params, "rvsm", beta=5e-2, lamb=1e-6,
                              opt_state=opt_state)

``rvsm``, ``rgsm`` and ``admm`` wrap the optimiser they sparsify, so their
pieces (``l0_split``, ``group_lasso``, ``group_l0_split``, ``admm_split``,
public for experts) cannot be put in the wrong order. A :class:`Sparsifier`
(``get_sparsifier``) holds a method with its hyperparameters and does what a
training loop needs (``wrap``, ``end_of_epoch``, ``evaluated_params``,
``report``).

See ``docs/sparsity.md``.
"""
from fkjax.sparsity.admm_pruning import ADMMSpec
from fkjax.sparsity.admm_pruning import ADMMState
from fkjax.sparsity.admm_pruning import admm_reset
from fkjax.sparsity.admm_pruning import admm_split
from fkjax.sparsity.chain import sparse_sgd
from fkjax.sparsity.layouts import DEFAULT_LAYOUTS
from fkjax.sparsity.layouts import Layout
from fkjax.sparsity.leaves import SkippedLeaf
from fkjax.sparsity.masks import CONV_KERNELS
from fkjax.sparsity.masks import conv_kernel_mask
from fkjax.sparsity.masks import Mask
from fkjax.sparsity.metrics import CHANNEL_ZERO_TOL
from fkjax.sparsity.metrics import LayerSparsity
from fkjax.sparsity.metrics import sparsity_report
from fkjax.sparsity.metrics import SparsityReport
from fkjax.sparsity.operators import admm_projection
from fkjax.sparsity.operators import Group
from fkjax.sparsity.operators import group_axes
from fkjax.sparsity.operators import group_l0_prox
from fkjax.sparsity.operators import group_lasso_grad
from fkjax.sparsity.operators import group_norms
from fkjax.sparsity.operators import hard_threshold
from fkjax.sparsity.operators import l0_threshold
from fkjax.sparsity.projection import project
from fkjax.sparsity.sparsifiers import ADMM
from fkjax.sparsity.sparsifiers import from_config
from fkjax.sparsity.sparsifiers import get_sparsifier
from fkjax.sparsity.sparsifiers import METHODS
from fkjax.sparsity.sparsifiers import NoSparsity
from fkjax.sparsity.sparsifiers import register
from fkjax.sparsity.sparsifiers import RGSM
from fkjax.sparsity.sparsifiers import RVSM
from fkjax.sparsity.sparsifiers import Sparsifier
from fkjax.sparsity.transforms import group_l0_split
from fkjax.sparsity.transforms import group_lasso
from fkjax.sparsity.transforms import GroupL0SplitState
from fkjax.sparsity.transforms import GroupLassoState
from fkjax.sparsity.transforms import l0_split
from fkjax.sparsity.transforms import L0SplitState
from fkjax.sparsity.wrappers import admm
from fkjax.sparsity.wrappers import rgsm
from fkjax.sparsity.wrappers import rvsm
from fkjax.sparsity.wrappers import SparsifiedState

__all__ = [
    "ADMM",
    "ADMMSpec",
    "ADMMState",
    "CHANNEL_ZERO_TOL",
    "CONV_KERNELS",
    "DEFAULT_LAYOUTS",
    "Group",
    "GroupL0SplitState",
    "GroupLassoState",
    "L0SplitState",
    "LayerSparsity",
    "Layout",
    "METHODS",
    "Mask",
    "NoSparsity",
    "RGSM",
    "RVSM",
    "Sparsifier",
    "SkippedLeaf",
    "SparsifiedState",
    "SparsityReport",
    "admm",
    "admm_projection",
    "admm_reset",
    "admm_split",
    "conv_kernel_mask",
    "from_config",
    "get_sparsifier",
    "group_axes",
    "group_l0_prox",
    "group_l0_split",
    "group_lasso",
    "group_lasso_grad",
    "group_norms",
    "hard_threshold",
    "l0_split",
    "l0_threshold",
    "project",
    "register",
    "rgsm",
    "rvsm",
    "sparse_sgd",
    "sparsity_report",
]
