"""CONCATENATION: TFLite -> NNAPI.

NNAPI has no fused activation here, and its axis must be non-negative (AOSP
checks 0 <= axis < rank), so TFLite's negative axis is normalised. Quantized
inputs keep their own scale/zero point: NNAPI requantizes them to the output's,
as TFLite's uint8 kernel does (TFLite's int8 kernel requires them equal).
"""
from __future__ import annotations

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import OptionsReader, ints
from delegate.mapping.shape import MAX_RANK, SHAPE_TYPES
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
    xs = [ctx.input_tensor(k) for k in range(len(node.inputs))]
    if any(x.type != y.type for x in xs):
        raise MappingError("inputs and output must have the same type")
    t = ctx.operand_type(y)
    if t not in SHAPE_TYPES:
        raise MappingError(f"CONCATENATION on {t.name} is not supported by this driver")
    for x in xs:
        ctx.operand_type(x)  # refuses per-channel / unquantized 8-bit tensors
    rank = len(y.shape)
    if not 1 <= rank <= MAX_RANK or any(len(x.shape) != rank for x in xs):
        raise MappingError(f"NNAPI CONCATENATION needs inputs and output of one rank in 1 to "
                           f"{MAX_RANK}, got {[len(x.shape) for x in xs]} -> {rank}")
    axis = int(ctx.option("axis", 0))
    if not -rank <= axis < rank:
        raise MappingError(f"axis {axis} out of range for rank {rank}")
    ins = [ctx.tensor(t_) for t_ in node.inputs] + [ctx.int32(axis % rank)]
    ctx.operation(OperationType.CONCATENATION, ins, [ctx.tensor(node.outputs[0])])
