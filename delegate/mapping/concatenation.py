"""CONCATENATION: TFLite -> NNAPI.

NNAPI has no fused activation here, and its axis must be non-negative (AOSP
checks 0 <= axis < rank), so TFLite's negative axis is normalised. Quantized
inputs keep their own scale/zero point: NNAPI requantizes them to the output's,
as TFLite's uint8 kernel does (TFLite's int8 kernel requires them equal).
NNAPI's own rules (types, ranks) are hal's validate's to check.
"""
from __future__ import annotations

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import OptionsReader, ints
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import ActivationFunctionType, BuiltinOperator
from hal.types import OperationType


def _read_concat(a: int) -> dict:
    axis, act = ints(a, 2)  # TfLiteConcatenationParams
    return {"axis": axis, "fused_activation_function": act}


@mapper(BuiltinOperator.CONCATENATION, options=OptionsReader("ConcatenationOptions", _read_concat))
def map_concatenation(ctx: MappingContext, node: TfLiteNode) -> None:
    if not node.inputs or len(node.outputs) != 1:
        raise MappingError(f"expected at least 1 input and 1 output, got {len(node.inputs)} and "
                           f"{len(node.outputs)}")
    act = ctx.option("fused_activation_function", ActivationFunctionType.NONE)
    if act != ActivationFunctionType.NONE:
        raise MappingError(f"NNAPI CONCATENATION has no fused activation (got {act})")
    y = ctx.output_tensor(0)
    rank = len(y.shape)
    if rank == 0:  # a TFLite scalar has no NNAPI form (no dimensions means an unknown rank there)
        raise MappingError("CONCATENATION of rank-0 tensors has no NNAPI form")
    axis = int(ctx.option("axis", 0))
    if not -rank <= axis < rank:
        raise MappingError(f"axis {axis} out of range for rank {rank}")
    ins = [ctx.tensor(t_) for t_ in node.inputs] + [ctx.int32(axis % rank)]
    ctx.operation(OperationType.CONCATENATION, ins, [ctx.tensor(node.outputs[0])])
