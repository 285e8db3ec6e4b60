"""PAD: TFLite -> NNAPI. Both pad with the logical zero (the zero point when quantized).

PADV2 (explicit pad value) is not mapped here. The paddings must be a constant
(re-emitted as TENSOR_INT32 [rank, 2]) with non-negative entries.
"""
from __future__ import annotations

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import no_options
from delegate.mapping.shape import constant_ints, same_io
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import BuiltinOperator
from hal.types import OperandType, OperationType


@mapper(BuiltinOperator.PAD, options=no_options("PadOptions"))
def map_pad(ctx: MappingContext, node: TfLiteNode) -> None:
    x, _, _ = same_io(ctx, node, OperationType.PAD, (2,))
    pads = constant_ints(ctx, 1, "paddings")
    rank = len(x.shape)
    if pads.shape != (rank, 2):
        raise MappingError(f"paddings must have shape [{rank}, 2], got {list(pads.shape)}")
    if (pads < 0).any():
        raise MappingError(f"paddings must be non-negative, got {pads.tolist()}")
    paddings = ctx.constant(OperandType.TENSOR_INT32, pads.astype("int32"))
    ctx.operation(OperationType.PAD, [ctx.tensor(node.inputs[0]), paddings],
                  [ctx.tensor(node.outputs[0])])
