"""ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM, PRELU and POW as ONNX's broadcasting binary operators.

ONNX broadcasts both inputs numpy-style, as NNAPI does, so the operators map one to one:

* ADD, SUB, MUL (float32; int32, which wraps in onnxruntime as in the reference) and DIV (float32:
  x / 0 is inf or nan in both) with the fused activation as Relu / Clip. int32 DIV is NNAPI's
  floor division where onnxruntime truncates and traps on x / 0: declined (reference).
* MAXIMUM / MINIMUM as Where(Greater/Less(a, b), a, b): the reference's (TFLite's) ``a > b ? a : b``,
  which picks b when a is NaN; onnxruntime's Max / Min propagate any NaN.
* PRELU as PRelu when alpha broadcasts into the input's shape (ONNX broadcasts the slope one way
  only), else Where(x >= 0, x, x * alpha) with both broadcast.
* POW as Pow (float32; within CTS's tolerance of powf).
"""
from __future__ import annotations

import numpy as np

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph
from hal.operations.common import F32, I32
from hal.operations.elementwise import ADD, ALPHA, DIV, INPUT, LHS, MAXIMUM, MINIMUM, MUL, PRELU, RHS, SUB, BinaryParams
from hal.operations.unary import BASE, EXPONENT, POW
from hal.registry import OperationContext

_ARITHMETIC = {ADD: "Add", SUB: "Sub", MUL: "Mul", DIV: "Div"}


def lower_arithmetic(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: BinaryParams = ctx.params
    y = g.node(_ARITHMETIC[ctx.op_type], [x[LHS], x[RHS]])
    return [g.activation(y, p.act)]


def lower_min_max(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    a, b = x[LHS], x[RHS]
    pick_a = g.node("Greater" if ctx.op_type == MAXIMUM else "Less", [a, b])
    return [g.node("Where", [pick_a, a, b])]


def lower_prelu(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    data, alpha = x[INPUT], x[ALPHA]
    if tuple(ctx.input(INPUT).shape) == tuple(ctx.output(0).shape):
        return [g.node("PRelu", [data, alpha])]
    # The alpha broadcasts the input up: PRelu cannot, so the reference's formula as it stands.
    positive = g.node("GreaterOrEqual", [data, g.const(np.float32(0))])
    return [g.node("Where", [positive, data, g.node("Mul", [data, alpha])])]


def lower_pow(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    return [g.node("Pow", [x[BASE], x[EXPONENT]])]


BACKEND.lowering([ADD, SUB, MUL], lower=lower_arithmetic, types=[F32, I32])
BACKEND.lowering(DIV, lower=lower_arithmetic, types=[F32])
BACKEND.lowering([MAXIMUM, MINIMUM], lower=lower_min_max, types=[F32, I32])
BACKEND.lowering(PRELU, lower=lower_prelu, types=[F32])
BACKEND.lowering(POW, lower=lower_pow, types=[F32])
