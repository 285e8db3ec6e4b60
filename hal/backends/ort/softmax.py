"""SOFTMAX and LOG_SOFTMAX as ONNX Softmax / LogSoftmax (float32).

Since opset 13 both normalise along one axis, as NNAPI does. NNAPI's beta scales the input
after the row maximum is taken off, (x - max) * beta, which is what the graph computes before the
ONNX operator (scaling x itself first could overflow to inf where NNAPI's form stays finite).
"""
from __future__ import annotations

import numpy as np

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph
from hal.operations.common import F32
from hal.operations.softmax import INPUT, LOG_SOFTMAX, SOFTMAX, SoftmaxParams
from hal.registry import OperationContext


def _lower(op_type: str):
    def lower(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
        p: SoftmaxParams = ctx.params
        data = x[INPUT]
        if np.float32(p.beta) != np.float32(1.0):
            top = g.node("ReduceMax", [data], axes=[p.axis], keepdims=1)
            data = g.node("Mul", [g.node("Sub", [data, top]), g.const(np.float32(p.beta))])
        return [g.node(op_type, [data], axis=p.axis)]
    return lower


def supports(ctx: OperationContext) -> str | None:
    if 0 in ctx.input(INPUT).shape:
        return "zero-sized input"
    return None


BACKEND.lowering(SOFTMAX, lower=_lower("Softmax"), types=[F32], supports=supports)
BACKEND.lowering(LOG_SOFTMAX, lower=_lower("LogSoftmax"), types=[F32], supports=supports)
