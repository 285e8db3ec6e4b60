"""RELU, RELU_N1_TO_1, RELU6, LOGISTIC, TANH, HARD_SWISH: TFLite -> NNAPI.

NNAPI is stricter than TFLite about quantization: the RELU family must keep the
input quantization, LOGISTIC/TANH have a fixed output quantization. Those rules
are hal's (its validate refuses other TFLite variants, with its message), as is
HARD_SWISH's arithmetic limit on the scales (a kernel's: "not supported").
"""
from __future__ import annotations

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import no_options
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import BuiltinOperator
from hal.types import OperationType

_OPS = {
    BuiltinOperator.RELU: OperationType.RELU,
    BuiltinOperator.RELU_N1_TO_1: OperationType.RELU1,
    BuiltinOperator.RELU6: OperationType.RELU6,
    BuiltinOperator.LOGISTIC: OperationType.LOGISTIC,
    BuiltinOperator.TANH: OperationType.TANH,
    BuiltinOperator.HARD_SWISH: OperationType.HARD_SWISH,
}


@mapper(*_OPS, options=no_options())
def map_activation(ctx: MappingContext, node: TfLiteNode) -> None:
    if len(node.inputs) != 1 or len(node.outputs) != 1:
        raise MappingError(f"expected 1 input and 1 output, got {len(node.inputs)} and "
                           f"{len(node.outputs)}")
    ctx.operation(_OPS[node.builtin_code], [ctx.tensor(node.inputs[0])], [ctx.tensor(node.outputs[0])])
