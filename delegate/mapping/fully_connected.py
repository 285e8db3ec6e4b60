"""FULLY_CONNECTED: TFLite -> NNAPI.

NNAPI's FULLY_CONNECTED always has a bias and a 2-D output, and no hybrid,
shuffled or per-channel variants; those TFLite variants are not delegated (NNAPI's own
rules are checked by hal's spec).
"""
from __future__ import annotations

import numpy as np

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import OptionsReader, bools, ints
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import BuiltinOperator, TensorType
from hal.types import OperandType, OperationType

_WEIGHTS_FORMAT_DEFAULT = 0


def _read_fully_connected(a: int) -> dict:
    act, fmt = ints(a, 2)  # TfLiteFullyConnectedParams
    keep, asym = bools(a + 8, 2)
    return {"fused_activation_function": act, "weights_format": fmt, "keep_num_dims": keep,
            "asymmetric_quantize_inputs": asym}


@mapper(BuiltinOperator.FULLY_CONNECTED, options=OptionsReader("FullyConnectedOptions", _read_fully_connected))
def map_fully_connected(ctx: MappingContext, node: TfLiteNode) -> None:
    x, w = ctx.input_tensor(0), ctx.input_tensor(1)
    if ctx.option("weights_format", _WEIGHTS_FORMAT_DEFAULT) != _WEIGHTS_FORMAT_DEFAULT:
        raise MappingError("shuffled FULLY_CONNECTED weights have no NNAPI equivalent")
    if w.type != x.type:
        raise MappingError(f"weights type {w.type} differs from input type {x.type} "
                           f"(hybrid FULLY_CONNECTED is not supported)")
    if ctx.option("keep_num_dims", False) and (len(x.shape) > 2 or (
            len(x.shape) == 2 and len(w.shape) == 2 and x.shape[-1] != w.shape[1])):
        raise MappingError("keep_num_dims with an input of rank > 2 or whose last dimension is "
                           "not input_size (NNAPI output is [batch, num_units])")
    if len(node.outputs) != 1:
        raise MappingError(f"expected 1 output, got {len(node.outputs)}")

    act = ctx.fused_activation()
    x_op = ctx.tensor(node.inputs[0])
    w_op = ctx.tensor(node.inputs[1])  # per-channel weights raise MappingError here
    quantized = x.type in (TensorType.UINT8, TensorType.INT8)
    bias_scale = x.scales[0] * w.scales[0] if quantized else None
    if len(node.inputs) > 2 and node.inputs[2] >= 0:
        b_op = ctx.tensor(node.inputs[2], scale=bias_scale)
    else:
        units = w.shape[0] if w.shape else 0
        if quantized:
            b_op = ctx.constant(OperandType.TENSOR_INT32, np.zeros(units, np.int32),
                                scale=bias_scale)
        else:
            b_op = ctx.constant(OperandType.TENSOR_FLOAT32, np.zeros(units, np.float32))
    ctx.operation(OperationType.FULLY_CONNECTED, [x_op, w_op, b_op, act],
                  [ctx.tensor(node.outputs[0])])
