"""fkjax: sparse and adversarially robust deep nets in JAX.

Reimplements "Sparsity Meets Robustness: Channel Pruning for the Feynman-Kac
Formalism Principled Robust Deep Neural Nets" (Dinh, Wang, Bertozzi, Osher, Xin).

Subpackages are imported explicitly (``from fkjax import sparsity``) so that a
project that only needs the optax sparsifiers does not pay for the rest.
Importing fkjax changes nothing global (no ``XLA_FLAGS``, no matplotlib
backend); ``fkjax.kernels.apply_xla_flags()`` sets fkjax's CPU flags.
"""

__version__ = "0.1.0"
