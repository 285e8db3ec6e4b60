"""FULLY_CONNECTED as ONNX Gemm (float32).

NNAPI flattens the input to [batch, input_size] and multiplies by the [num_units, input_size]
weights transposed: Gemm with transB=1 takes the weights as they are (constant or not), with the
bias as C.
"""
from __future__ import annotations

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph
from hal.operations.common import F32
from hal.operations.fully_connected import BIAS, INPUT, WEIGHTS, FullyConnectedParams
from hal.registry import OperationContext
from hal.types import OperationType


def lower_fully_connected(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: FullyConnectedParams = ctx.params
    data = x[INPUT]
    if tuple(ctx.input(INPUT).shape) != (p.batch, p.input_size):
        data = g.node("Reshape", [data, g.ints([p.batch, p.input_size])])
    y = g.node("Gemm", [data, x[WEIGHTS], x[BIAS]], transB=1)
    return [g.activation(y, p.act)]


def supports(ctx: OperationContext) -> str | None:
    p: FullyConnectedParams = ctx.params
    if p.batch == 0:
        return "zero-sized batch"
    if ctx.input(BIAS).shape[0] != p.num_units:
        return "an empty bias"
    return None


BACKEND.lowering(OperationType.FULLY_CONNECTED, lower=lower_fully_connected, types=[F32], supports=supports)
