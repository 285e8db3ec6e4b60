"""SOFTMAX: TFLite -> NNAPI (TFLite normalises over the last axis, NNAPI's default).

NNAPI's rules (rank 1 to 4, beta > 0, the fixed output quantization) are hal's: its validate
refuses other TFLite variants, with its message.
"""
from __future__ import annotations

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import OptionsReader, c_float
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import BuiltinOperator
from hal.types import OperationType


def _read_softmax(a: int) -> dict:
    return {"beta": c_float(a)}  # TfLiteSoftmaxParams


@mapper(BuiltinOperator.SOFTMAX, options=OptionsReader("SoftmaxOptions", _read_softmax))
def map_softmax(ctx: MappingContext, node: TfLiteNode) -> None:
    x, y = ctx.input_tensor(0), ctx.output_tensor(0)
    if x.type != y.type:
        raise MappingError("input and output types differ (int16 output is not supported)")
    beta = float(ctx.option("beta", 0.0))  # TFLite: no options -> beta 0
    ctx.operation(OperationType.SOFTMAX, [ctx.tensor(node.inputs[0]), ctx.float32(beta)],
                  [ctx.tensor(node.outputs[0])])
