"""RELU, RELU_N1_TO_1, RELU6, LOGISTIC, TANH, HARD_SWISH: TFLite -> NNAPI.

NNAPI is stricter than TFLite about quantization: the RELU family must keep the
input quantization, LOGISTIC/TANH have a fixed output quantization. Those rules
are hal's (its validate refuses other TFLite variants, with its message), as is
HARD_SWISH's arithmetic limit on the scales (a kernel's: "not supported").

One exception: a quantized RELU, RELU6 or RELU_N1_TO_1 whose output quantization differs from the
input's (or of rank over NNAPI's 4). TFLite requantizes there (activations.cc QuantizedReluX: a
fixed-point multiplier, then the clamp in the output's units), which no NNAPI op does, so it maps
to com.nnhal.tflite:RELU_REQUANTIZED (extensions/tflite_compat.py), TFLite's arithmetic. Equal
quantization keeps NNAPI's RELU* (the model then stays NNAPI-only).
"""
from __future__ import annotations

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import no_options
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import BuiltinOperator, TensorType
from hal.operations.activations import MAX_RANK
from hal.types import FusedActivationFunc, OperationType

_OPS = {
    BuiltinOperator.RELU: OperationType.RELU,
    BuiltinOperator.RELU_N1_TO_1: OperationType.RELU1,
    BuiltinOperator.RELU6: OperationType.RELU6,
    BuiltinOperator.LOGISTIC: OperationType.LOGISTIC,
    BuiltinOperator.TANH: OperationType.TANH,
    BuiltinOperator.HARD_SWISH: OperationType.HARD_SWISH,
}
#: The clamp of each RELU-family op, as RELU_REQUANTIZED's activation input.
_CLAMPS = {
    BuiltinOperator.RELU: FusedActivationFunc.RELU,
    BuiltinOperator.RELU_N1_TO_1: FusedActivationFunc.RELU1,
    BuiltinOperator.RELU6: FusedActivationFunc.RELU6,
}


@mapper(*_OPS, options=no_options())
def map_activation(ctx: MappingContext, node: TfLiteNode) -> None:
    if len(node.inputs) != 1 or len(node.outputs) != 1:
        raise MappingError(f"expected 1 input and 1 output, got {len(node.inputs)} and "
                           f"{len(node.outputs)}")
    x, y = ctx.tensor(node.inputs[0]), ctx.tensor(node.outputs[0])  # per-tensor, or MappingError
    if node.builtin_code in _CLAMPS and _requantizes(ctx.input_tensor(0), ctx.output_tensor(0)):
        from extensions import tflite_compat
        tflite_compat.ensure_registered()
        code = ctx.extension_code(tflite_compat.NAME, tflite_compat.RELU_REQUANTIZED)
        ctx.operation(code, [x, ctx.int32(_CLAMPS[node.builtin_code])], [y])
        return
    ctx.operation(_OPS[node.builtin_code], [x], [y])


def _requantizes(src, dst) -> bool:
    """8-bit, and NNAPI's RELU* cannot take it: other output quantization, or rank over 4."""
    if src.type not in (TensorType.UINT8, TensorType.INT8) or src.type != dst.type:
        return False  # float, or mismatched types: hal's validate says why
    same = (src.scales, src.zero_points) == (dst.scales, dst.zero_points)
    return not same or len(src.shape) > MAX_RANK
