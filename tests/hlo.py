"""What a program contains, read from its structure, not from its text.

A module's text also holds names that are no part of the program: source
locations, function names and, in a program loaded from JAX's persistent
compilation cache, the metadata of whichever test compiled it first. The
tests ask about operations, custom-call targets and primitives instead.
"""
import collections
import re

from jax import stages
from jax.extend import core as jex_core

# JAX's host callbacks (jax.pure_callback, io_callback, jax.debug.callback,
# buffer callbacks): xla_python_cpu_callback, xla_ffi_python_gpu_callback,
# xla_ffi_partitioned_python_cpu_callback, xla_buffer_python_cpu_callback...
_HOST_CALLBACK = re.compile(r"xla_\w*python_\w+_callback")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')


def _mlir_ops(module):
  """Every operation of an MLIR module, nested regions included."""
  def walk(op):
    for region in op.regions:
      for block in region.blocks:
        for child in block.operations:
          yield child.operation
          yield from walk(child.operation)
  yield from walk(module.operation)


def _hlo_instructions(compiled):
  for module in compiled.runtime_executable().hlo_modules():
    for computation in module.computations():
      yield from computation.instructions()


def _opcode(instruction) -> str:
  """``HloOpcode.kCustomCall`` -> ``custom-call``, as HLO text spells it."""
  name = instruction.opcode.name[1:]
  return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()


def operations(program) -> collections.Counter:
  """How many of each operation ``program`` holds: StableHLO names
  (``stablehlo.convolution``) for a ``Lowered`` program or an MLIR module,
  HLO opcodes (``custom-call``) for a ``Compiled`` one."""
  if isinstance(program, stages.Compiled):
    return collections.Counter(map(_opcode, _hlo_instructions(program)))
  if isinstance(program, stages.Lowered):
    program = program.compiler_ir("stablehlo")
  return collections.Counter(op.name for op in _mlir_ops(program))


def stablehlo_ops(program, name: str) -> list:
  """The ``stablehlo.<name>`` operations of a ``Lowered`` program (or MLIR
  module), to read their attributes and types."""
  if isinstance(program, stages.Lowered):
    program = program.compiler_ir("stablehlo")
  return [op for op in _mlir_ops(program) if op.name == f"stablehlo.{name}"]


def custom_call_targets(program) -> set[str]:
  """The targets of ``program``'s custom calls (Lowered, MLIR module or
  Compiled)."""
  if isinstance(program, stages.Compiled):
    return {_TARGET.search(i.to_string()).group(1)
            for i in _hlo_instructions(program) if _opcode(i) == "custom-call"}
  return {str(op.attributes["call_target_name"]).strip('"')
          for op in stablehlo_ops(program, "custom_call")}


def host_callbacks(program) -> set[str]:
  """The custom calls of ``program`` that call back into Python."""
  return {t for t in custom_call_targets(program)
          if _HOST_CALLBACK.fullmatch(t)}


def element_types(program) -> set[str]:
  """The element types (``f32``, ``bf16``) of every value ``program``'s
  StableHLO operations make."""
  if isinstance(program, stages.Lowered):
    program = program.compiler_ir("stablehlo")
  out = set()
  for op in _mlir_ops(program):
    for result in op.results:
      element = getattr(result.type, "element_type", None)
      if element is not None:
        out.add(str(element))
  return out


def equations(jaxpr):
  """Every equation of ``jaxpr`` (a Jaxpr or ClosedJaxpr), inside every
  nested jaxpr (jit, scan, cond, custom_vjp...) too."""
  if isinstance(jaxpr, jex_core.ClosedJaxpr):
    jaxpr = jaxpr.jaxpr
  for eqn in jaxpr.eqns:
    yield eqn
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(sub, (jex_core.Jaxpr, jex_core.ClosedJaxpr)):
          yield from equations(sub)


def primitives(jaxpr) -> collections.Counter:
  """How many of each primitive ``jaxpr`` applies, nested jaxprs included."""
  return collections.Counter(eqn.primitive.name for eqn in equations(jaxpr))
