"""The convolutions of a training step as a GPU or TPU compiler gets them.

    python -m benchmarks.conv_forms                       # ResNet20, 8 runs
    python -m benchmarks.conv_forms --model en2resnet20 --runs 1 --platform tpu

Lowers the PGD training step (a single run, or a sweep of ``--runs`` runs
differing in their seed, as ``python -m reproduce --sweep`` trains them)
for ``--platform`` on this machine, with that platform's selections
(``FKJAX_KERNELS_PLATFORM``), no compile, and reads every
``stablehlo.convolution`` of its StableHLO: operand shapes, window (the
spatial size of its ``rhs``), ``feature_group_count`` and
``batch_group_count``. Prints, as JSON, how many are grouped and how many
of those are grouped by feature with a window larger than the model's
3x3 kernel: a weight gradient vmapped after it was taken, which XLA's GPU
compiler does not map to cuDNN's backward-filter convolution (the form a
weight gradient should take is grouped by batch: one group per run or
member, the cotangent as the window).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Any, Iterator, Sequence

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

KERNEL = 3   # the models' convolutions are 3x3 (and 1x1 shortcuts)


@dataclasses.dataclass(frozen=True)
class Conv:
  """One ``stablehlo.convolution``.

  Attributes:
    lhs, rhs, out: the operand and result shapes.
    window: the spatial sizes of ``rhs`` (its kernel, or for a weight
      gradient the cotangent).
    feature_group_count, batch_group_count: its groups.
    precision: its operands' ``precision_config`` (``"HIGHEST"``, ...).
    dtype: its result's element type (``"f32"``, ``"bf16"``).
  """
  lhs: tuple[int, ...]
  rhs: tuple[int, ...]
  out: tuple[int, ...]
  window: tuple[int, ...]
  feature_group_count: int
  batch_group_count: int
  precision: tuple[str, ...]
  dtype: str

  @property
  def grouped(self) -> bool:
    return self.feature_group_count > 1 or self.batch_group_count > 1

  def window_above(self, size: int) -> bool:
    return max(self.window) > size


def _walk(operation) -> Iterator[Any]:
  for region in operation.regions:
    for block in region.blocks:
      for op in block.operations:
        yield op.operation
        yield from _walk(op.operation)


def operations(lowered, name: str) -> Iterator[Any]:
  """The operations ``name`` (``"stablehlo.convolution"``, ...) of
  ``lowered`` (a ``jax.stages.Lowered``), in its module's context."""
  module = lowered.compiler_ir("stablehlo")
  with module.context:
    for op in _walk(module.operation):
      if op.name == name:
        yield op


def precision_of(op) -> tuple[str, ...]:
  """``op``'s ``precision_config`` (empty where it has none)."""
  if "precision_config" not in op.attributes:
    return ()
  return tuple(stablehlo.PrecisionAttr(p).value
               for p in ir.ArrayAttr(op.attributes["precision_config"]))


def result_dtype(op) -> str:
  """``op``'s (first) result's element type: ``"f32"``, ``"bf16"``, ..."""
  return str(ir.RankedTensorType(op.results[0].type).element_type)


def _shape(value) -> tuple[int, ...]:
  return tuple(ir.RankedTensorType(value.type).shape)


def convolutions(lowered) -> list[Conv]:
  """Every convolution of ``lowered`` (a ``jax.stages.Lowered``), read from
  its StableHLO module's operations and attributes (not its text)."""
  out = []
  for op in operations(lowered, "stablehlo.convolution"):
    attrs = op.attributes
    numbers = stablehlo.ConvDimensionNumbers(attrs["dimension_numbers"])
    lhs, rhs = (_shape(v) for v in op.operands)
    out.append(Conv(
        lhs=lhs, rhs=rhs, out=_shape(op.results[0]),
        window=tuple(rhs[d] for d in numbers.kernel_spatial_dimensions),
        feature_group_count=ir.IntegerAttr(attrs["feature_group_count"]).value,
        batch_group_count=ir.IntegerAttr(attrs["batch_group_count"]).value,
        precision=precision_of(op),
        dtype=result_dtype(op)))
  return out


def wide_feature_groups(convs: Sequence[Conv], kernel: int = KERNEL
                        ) -> list[Conv]:
  """The convolutions grouped by feature whose window is larger than
  ``kernel``: weight gradients in a form no backward-filter call takes."""
  return [c for c in convs if c.feature_group_count > 1
          and c.window_above(kernel)]


def summary(convs: Sequence[Conv], kernel: int = KERNEL) -> dict[str, Any]:
  """The counts this module prints, and one example of each kind."""
  grouped = [c for c in convs if c.grouped]
  wide = wide_feature_groups(convs, kernel)
  batch = [c for c in grouped if c.batch_group_count > 1]
  return {"convolutions": len(convs), "grouped": len(grouped),
          "grouped_window_above_kernel": len(
              [c for c in grouped if c.window_above(kernel)]),
          "feature_grouped_window_above_kernel": len(wide),
          "batch_grouped": len(batch),
          "example_wide_feature_grouped": (dataclasses.asdict(wide[0])
                                           if wide else None),
          "example_batch_grouped": (dataclasses.asdict(batch[0])
                                    if batch else None)}


def lowered_step(model: str, runs: int, batch_size: int, attack_steps: int,
                 platform: str):
  """The training step of ``runs`` runs of ``model`` lowered for
  ``platform`` (``cuda``, ``tpu``)."""
  import jax  # pylint: disable=import-outside-toplevel
  from benchmarks import gpu_bench_steps  # pylint: disable=import-outside-toplevel
  from fkjax.training import program  # pylint: disable=import-outside-toplevel
  spec = gpu_bench_steps.StepSpec(model, "float32", "auto", attack_steps,
                                  batch_size)
  sweep = program.Runs.build(gpu_bench_steps.sweep_configs(spec, runs))
  single = jax.eval_shape(sweep.exps[0].initial_state)
  state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      (runs, *x.shape) if runs > 1 else x.shape, x.dtype), single)
  batch = {"image": jax.ShapeDtypeStruct((batch_size, 32, 32, 3),
                                         jax.numpy.float32),
           "label": jax.ShapeDtypeStruct((batch_size,), jax.numpy.int32)}
  values = {k: jax.ShapeDtypeStruct(v.shape, v.dtype)
            for k, v in sweep.values.items()}
  return sweep.train_step.trace(state, batch, sweep.keys("train"), 0,
                                values).lower(lowering_platforms=(platform,))


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="resnet20")
  parser.add_argument("--runs", type=int, default=8)
  parser.add_argument("--batch-size", type=int, default=128)
  parser.add_argument("--attack-steps", type=int, default=10)
  parser.add_argument("--platform", default="cuda", choices=("cuda", "tpu"))
  args = parser.parse_args(argv)
  os.environ["FKJAX_KERNELS_PLATFORM"] = (
      "tpu" if args.platform == "tpu" else "gpu")
  lowered = lowered_step(args.model, args.runs, args.batch_size,
                         args.attack_steps, args.platform)
  print(json.dumps({**vars(args), **summary(convolutions(lowered))},
                   indent=1))


if __name__ == "__main__":
  main()
