"""RVSM, RGSM and ADMM pruning as optax transformations, with sparsity metrics.

A self-contained building block (pure JAX + optax, knows no model; works on
the parameter trees of Flax linen and NNX, Equinox, and plain dicts)::

    from fkjax import sparsity

    sp = sparsity.get_sparsifier("rvsm", beta=5e-2, lamb=1e-6)
    tx = sp.optimizer(schedule)            # SGD + weight decay + RVSM
    ...                                    # train with tx; at each epoch's end:
    params, opt_state = sp.end_of_epoch(params, opt_state)
    print(sp.report(sp.evaluated_params(params)).format_table())

The functions (``rvsm``, ``rgsm``, ``admm``, ``sparse_sgd``, ``project``) are
the same pieces one at a time.

See ``docs/sparsity.md``.
"""
from fkjax.sparsity.admm_pruning import ADMMSpec
from fkjax.sparsity.admm_pruning import ADMMState
from fkjax.sparsity.admm_pruning import admm
from fkjax.sparsity.admm_pruning import admm_reset
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
from fkjax.sparsity.transforms import rgsm
from fkjax.sparsity.transforms import rvsm
from fkjax.sparsity.transforms import RVSMState

__all__ = [
    "ADMM",
    "ADMMSpec",
    "ADMMState",
    "CHANNEL_ZERO_TOL",
    "CONV_KERNELS",
    "DEFAULT_LAYOUTS",
    "Group",
    "GroupL0SplitState",
    "LayerSparsity",
    "Layout",
    "METHODS",
    "Mask",
    "NoSparsity",
    "RGSM",
    "RVSM",
    "RVSMState",
    "Sparsifier",
    "SkippedLeaf",
    "SparsityReport",
    "admm",
    "admm_projection",
    "admm_reset",
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
    "l0_threshold",
    "project",
    "register",
    "rgsm",
    "rvsm",
    "sparse_sgd",
    "sparsity_report",
]
