"""RVSM, RGSM and ADMM pruning as optax transformations, with sparsity metrics.

A self-contained building block (pure JAX + optax, knows no model)::

    from fkjax import sparsity

    tx = sparsity.sparse_sgd("rvsm", schedule, beta=5e-2, lamb=1e-6)
    ...                                    # train with tx; at each epoch's end:
    params = sparsity.project(params, "rvsm", beta=5e-2, lamb=1e-6)
    print(sparsity.sparsity_report(params).format_table())

See ``docs/sparsity.md``.
"""
from fkjax.sparsity.admm_pruning import ADMMSpec
from fkjax.sparsity.admm_pruning import ADMMState
from fkjax.sparsity.admm_pruning import admm
from fkjax.sparsity.admm_pruning import admm_reset
from fkjax.sparsity.chain import sparse_sgd
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
from fkjax.sparsity.transforms import group_l0_split
from fkjax.sparsity.transforms import group_lasso
from fkjax.sparsity.transforms import GroupL0SplitState
from fkjax.sparsity.transforms import rgsm
from fkjax.sparsity.transforms import rvsm
from fkjax.sparsity.transforms import RVSMState

__all__ = [
    "ADMMSpec",
    "ADMMState",
    "CHANNEL_ZERO_TOL",
    "CONV_KERNELS",
    "Group",
    "GroupL0SplitState",
    "LayerSparsity",
    "Mask",
    "RVSMState",
    "SparsityReport",
    "admm",
    "admm_projection",
    "admm_reset",
    "conv_kernel_mask",
    "group_axes",
    "group_l0_prox",
    "group_l0_split",
    "group_lasso",
    "group_lasso_grad",
    "group_norms",
    "hard_threshold",
    "l0_threshold",
    "project",
    "rgsm",
    "rvsm",
    "sparse_sgd",
    "sparsity_report",
]
