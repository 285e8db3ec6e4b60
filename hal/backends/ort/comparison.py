"""EQUAL, NOT_EQUAL, GREATER, GREATER_EQUAL, LESS, LESS_EQUAL, SELECT and LOGICAL_AND / OR / NOT as
ONNX's comparison, Where and logical operators (float32, int32 and bool; quantized ones need the
reference's rescaling and are not lowered).

NNAPI's TENSOR_BOOL8 is true for any nonzero byte, but onnxruntime's bool kernels assume 0 or 1
(Not of 2 gives 3, Where takes 2 as false). A bool not computed by a comparison or logical node
of this graph (a partition input, a constant, a reshaped one) is made 0/1 first as
Greater(Cast(x, uint8), 0). Not Cast to uint8 and back: onnxruntime drops that pair even with
optimisations off, and the bytes pass through unchanged.
"""
from __future__ import annotations

import numpy as np

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph, TensorProto
from hal.operations.common import F32, I32
from hal.operations.comparison import (
    BOOL8,
    COMPARISONS,
    CONDITION,
    EQUAL,
    FALSE_INPUT,
    GREATER,
    GREATER_EQUAL,
    LESS,
    LESS_EQUAL,
    LHS,
    NOT_EQUAL,
    RHS,
    SELECT,
    TRUE_INPUT,
)
from hal.operations.logical import LOGICAL_AND, LOGICAL_NOT, LOGICAL_OR
from hal.registry import OperationContext

_ONNX = {EQUAL: "Equal", NOT_EQUAL: "Equal", GREATER: "Greater", GREATER_EQUAL: "GreaterOrEqual",
         LESS: "Less", LESS_EQUAL: "LessOrEqual"}


#: ONNX operators whose bool outputs are 0/1.
_CANONICAL = {"Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Not", "And", "Or", "Xor", "IsNaN",
              "IsInf"}


def canonical_bool(g: OnnxGraph, name: str) -> str:
    """``name`` as 0/1 bytes: unchanged when a comparison or logical node of this graph computed it."""
    if any(name in n.output and n.op_type in _CANONICAL for n in g.nodes):
        return name
    as_bytes = g.node("Cast", [name], to=TensorProto.UINT8)
    return g.node("Greater", [as_bytes, g.const(np.uint8(0))])


def lower_comparison(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    a, b = x[LHS], x[RHS]
    if ctx.input(LHS).type == BOOL8:
        a, b = canonical_bool(g, a), canonical_bool(g, b)
        if ctx.op_type not in (EQUAL, NOT_EQUAL):  # ONNX orders no bools: compare them as 0 / 1
            a, b = (g.node("Cast", [v], to=TensorProto.INT32) for v in (a, b))
    y = g.node(_ONNX[ctx.op_type], [a, b])
    return [g.node("Not", [y]) if ctx.op_type == NOT_EQUAL else y]


def supports_select(ctx: OperationContext) -> str | None:
    if ctx.input(TRUE_INPUT).type not in (F32, I32):
        return "only float32 and int32 SELECT is lowered (quantized inputs are requantized)"
    return None


def lower_select(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    cond = canonical_bool(g, x[CONDITION])
    return [g.node("Where", [cond, x[TRUE_INPUT], x[FALSE_INPUT]])]


def lower_logical(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    if ctx.op_type == LOGICAL_NOT:
        return [g.node("Not", [canonical_bool(g, x[0])])]
    op = "And" if ctx.op_type == LOGICAL_AND else "Or"
    return [g.node(op, [canonical_bool(g, x[0]), canonical_bool(g, x[1])])]


BACKEND.lowering(COMPARISONS, lower=lower_comparison, types=[F32, I32, BOOL8])
BACKEND.lowering(SELECT, lower=lower_select, types=[BOOL8], supports=supports_select)
BACKEND.lowering([LOGICAL_AND, LOGICAL_OR, LOGICAL_NOT], lower=lower_logical, types=[BOOL8])
