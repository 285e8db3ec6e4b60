"""ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM, PRELU: TFLite -> NNAPI.

TFLite accepts more than NNAPI (rank 5-6 broadcasting, int16/int32/int64,
quantized DIV, any MUL output scale, MAXIMUM/MINIMUM on raw quantized values);
those variants are refused here with the reason.
"""
from __future__ import annotations

import numpy as np

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import OptionsReader, activation_only, no_options
from delegate.tfl.graph import TfLiteNode, TfLiteTensor
from delegate.tfl.schema import BuiltinOperator
from hal.types import OperandType, OperationType

_F32 = OperandType.TENSOR_FLOAT32
_QUANT8 = (OperandType.TENSOR_QUANT8_ASYMM, OperandType.TENSOR_QUANT8_ASYMM_SIGNED)
_ALL = (_F32, *_QUANT8)

_ARITH = {
    BuiltinOperator.ADD: OperationType.ADD,
    BuiltinOperator.SUB: OperationType.SUB,
    BuiltinOperator.MUL: OperationType.MUL,
    BuiltinOperator.DIV: OperationType.DIV,
}
_MIN_MAX = {BuiltinOperator.MAXIMUM: OperationType.MAXIMUM,
            BuiltinOperator.MINIMUM: OperationType.MINIMUM}


def _binary_io(ctx: MappingContext, node: TfLiteNode, op: OperationType, types: tuple,
               max_rank: int | None) -> tuple[TfLiteTensor, TfLiteTensor, TfLiteTensor, OperandType]:
    """The two inputs and the output, after the checks every binary op needs."""
    if len(node.inputs) != 2 or len(node.outputs) != 1:
        raise MappingError(f"expected 2 inputs and 1 output, got {len(node.inputs)} and "
                           f"{len(node.outputs)}")
    a, b, y = ctx.input_tensor(0), ctx.input_tensor(1), ctx.output_tensor(0)
    if not a.type == b.type == y.type:
        raise MappingError("inputs and output must have the same type")
    t = ctx.operand_type(a)
    if t not in types:
        raise MappingError(f"{op.name} on {t.name} is not supported by this driver")
    for x in (a, b, y):  # per-channel or missing quantization is refused here
        ctx.operand_type(x)
    if max_rank is not None and max(len(a.shape), len(b.shape)) > max_rank:
        raise MappingError(f"NNAPI {op.name} supports rank <= {max_rank}, got ranks "
                           f"{len(a.shape)} and {len(b.shape)}")
    return a, b, y, t


def _quant(t: TfLiteTensor) -> tuple[np.float32, int]:
    return np.float32(t.scales[0]), int(t.zero_points[0])


#: TfLiteAddParams, TfLiteSubParams, TfLiteMulParams, TfLiteDivParams all start with the activation.
_ARITH_OPTIONS = {BuiltinOperator.ADD: OptionsReader("AddOptions", activation_only),
                  BuiltinOperator.SUB: OptionsReader("SubOptions", activation_only),
                  BuiltinOperator.MUL: OptionsReader("MulOptions", activation_only),
                  BuiltinOperator.DIV: OptionsReader("DivOptions", activation_only)}


@mapper(*_ARITH, options=_ARITH_OPTIONS)
def map_arithmetic(ctx: MappingContext, node: TfLiteNode) -> None:
    op = _ARITH[node.builtin_code]
    a, b, y, t = _binary_io(ctx, node, op, (_F32,) if op == OperationType.DIV else _ALL, 4)
    if op == OperationType.MUL and t in _QUANT8:
        (sa, _), (sb, _), (sy, _) = _quant(a), _quant(b), _quant(y)
        if not sy > sa * sb:
            raise MappingError(f"NNAPI MUL requires output scale > input1 scale * input2 scale, "
                               f"got {float(sy)} <= {float(sa * sb)}")
    ins = [ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1]), ctx.fused_activation()]
    ctx.operation(op, ins, [ctx.tensor(node.outputs[0])])


@mapper(*_MIN_MAX, options=no_options("MaximumMinimumOptions"))
def map_min_max(ctx: MappingContext, node: TfLiteNode) -> None:
    op = _MIN_MAX[node.builtin_code]
    a, b, y, t = _binary_io(ctx, node, op, _ALL, None)
    if t in _QUANT8 and not _quant(a) == _quant(b) == _quant(y):
        # TFLite compares the raw quantized values; NNAPI requantizes to the output's scale.
        # They agree only when all three tensors share one quantization.
        raise MappingError(f"{op.name}: TFLite compares raw quantized values, so only equal "
                           f"input/output quantization maps to NNAPI")
    ins = [ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])]
    ctx.operation(op, ins, [ctx.tensor(node.outputs[0])])


@mapper(BuiltinOperator.PRELU, options=no_options())
def map_prelu(ctx: MappingContext, node: TfLiteNode) -> None:
    x, alpha, y, _ = _binary_io(ctx, node, OperationType.PRELU, _ALL, 4)
    if len(x.shape) < 1:
        raise MappingError("NNAPI PRELU needs an input of rank >= 1")
    try:
        out_shape = tuple(np.broadcast_shapes(x.shape, alpha.shape))
    except ValueError:
        out_shape = None
    if out_shape != tuple(x.shape):
        raise MappingError(f"alpha {list(alpha.shape)} must broadcast to the input shape "
                           f"{list(x.shape)}")
    ins = [ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])]
    ctx.operation(OperationType.PRELU, ins, [ctx.tensor(node.outputs[0])])
