"""Channel-pruned networks as smaller dense ones (``docs/slim.md``).

::

    from fkjax import slim
    small, small_vars = slim.slim(model, variables)     # same logits
    print(slim.format_costs(slim.cost_report(slim.specs_of(small))))
    slim.save_slim("out/slim", small, small_vars)
    apply_fn, variables = slim.load_slim("out/slim")  # fkjax.attacks' form
"""
from fkjax.slim.core import slim, specs_of
from fkjax.slim.cost import LayerCost, cost_report, format_costs, layer_costs
from fkjax.slim.cost import totals
from fkjax.slim.io import load_slim, load_slim_model, save_slim
from fkjax.slim.model import SlimEnResNet, SlimResNet, member_noise_keys
from fkjax.slim.spec import BlockSpec, ConvSpec, DenseSpec, NetSpec, NormSpec

__all__ = ["BlockSpec", "ConvSpec", "DenseSpec", "LayerCost", "NetSpec",
           "NormSpec", "SlimEnResNet", "SlimResNet", "cost_report",
           "format_costs", "layer_costs", "load_slim", "load_slim_model",
           "member_noise_keys", "save_slim", "slim", "specs_of", "totals"]
