"""PAD: TFLite -> NNAPI. Both pad with the logical zero (the zero point when quantized).

PADV2 (explicit pad value) is not mapped here. The paddings must be a constant
(TFLite may store them as int64: re-emitted as TENSOR_INT32); their shape and
values are NNAPI's rules, checked by hal.
"""
from __future__ import annotations

from delegate.mapping.core import MappingContext, mapper
from delegate.mapping.options import no_options
from delegate.mapping.shape import constant_ints, same_io
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import BuiltinOperator
from hal.types import OperandType, OperationType


@mapper(BuiltinOperator.PAD, options=no_options("PadOptions"))
def map_pad(ctx: MappingContext, node: TfLiteNode) -> None:
    same_io(ctx, node, OperationType.PAD, (2,))
    pads = constant_ints(ctx, 1, "paddings")
    paddings = ctx.constant(OperandType.TENSOR_INT32, pads.astype("int32"))
    ctx.operation(OperationType.PAD, [ctx.tensor(node.inputs[0]), paddings],
                  [ctx.tensor(node.outputs[0])])
