"""SOFTMAX: TFLite -> NNAPI (TFLite normalises over the last axis, NNAPI's default)."""
from __future__ import annotations

import numpy as np

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import OptionsReader, c_float
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import BuiltinOperator
from hal.operations.softmax import SOFTMAX_OUTPUT_QUANT
from hal.types import OperationType


def _read_softmax(a: int) -> dict:
    return {"beta": c_float(a)}  # TfLiteSoftmaxParams


@mapper(BuiltinOperator.SOFTMAX, options=OptionsReader("SoftmaxOptions", _read_softmax))
def map_softmax(ctx: MappingContext, node: TfLiteNode) -> None:
    x, y = ctx.input_tensor(0), ctx.output_tensor(0)
    if not 1 <= len(x.shape) <= 4:
        raise MappingError(f"NNAPI SOFTMAX supports rank 1 to 4, input has rank {len(x.shape)}")
    if x.type != y.type:
        raise MappingError("input and output types differ (int16 output is not supported)")
    beta = float(ctx.option("beta", 0.0))  # TFLite: no options -> beta 0
    if not beta > 0:
        raise MappingError(f"NNAPI requires beta > 0, got {beta}")
    t = ctx.operand_type(x)
    if t in SOFTMAX_OUTPUT_QUANT:
        scale, zp = SOFTMAX_OUTPUT_QUANT[t]
        if not y.is_quantized:
            raise MappingError("the output is not quantized")
        if (np.float32(y.scales[0]), int(y.zero_points[0])) != (np.float32(scale), zp):
            raise MappingError(f"NNAPI requires output scale {scale} and zero point {zp}, got "
                               f"{y.scales[0]} and {y.zero_points[0]}")
    ctx.operation(OperationType.SOFTMAX, [ctx.tensor(node.inputs[0]), ctx.float32(beta)],
                  [ctx.tensor(node.outputs[0])])
