"""MEAN, REDUCE_SUM, REDUCE_PROD, REDUCE_MAX, REDUCE_MIN as ONNX Reduce* (float32).

The spec resolves the axes (non-negative, deduplicated, sorted). An empty axis list reduces
nothing in NNAPI but everything in ONNX, so it becomes an Identity. The result is reshaped to
NNAPI's output shape (every axis reduced without keep_dims is [1] in NNAPI, a scalar in ONNX).

REDUCE_SUM and REDUCE_PROD are bit-exact with the reference's sequential float32 accumulation:
the input is laid out as [count, outputs] (reduced axes first, a Transpose only when that moves
data) and reduced over axis 0, which onnxruntime's "RK" fast path does row after row (checked on
onnxruntime 1.32; its reduce-all, "KR" and "KRK" sum paths are blocked/pairwise instead, so a
Transpose the optimiser pushed into the reduction would break this: see ``_sequential``).
MEAN keeps ONNX's float32 ReduceMean (the reference averages in float64: within CTS tolerance).
MAX and MIN are exact as they are.

MEAN over the rows and columns of a 4-D value that already exists in NCHW (a squeeze-excite
block's pooling after a convolution) is GlobalAveragePool there: onnxruntime runs that in its
NCHWc layout, where ReduceMean made it reorder the block's input out of NCHWc and the mean back in.
"""
from __future__ import annotations

import math

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph
from hal.operations.common import F32
from hal.operations.reduce import MEAN, REDUCE_MAX, REDUCE_MIN, REDUCE_PROD, REDUCE_SUM, ReduceParams
from hal.registry import OperationContext

_ONNX = {MEAN: "ReduceMean", REDUCE_SUM: "ReduceSum", REDUCE_PROD: "ReduceProd",
         REDUCE_MAX: "ReduceMax", REDUCE_MIN: "ReduceMin"}


def supports_reduce(ctx: OperationContext) -> str | None:
    if 0 in ctx.input(0).shape:
        return "zero-sized inputs (MEAN of nothing is NaN) are left to the reference backend"
    return None


def _sequential(g: OnnxGraph, ctx: OperationContext, x: str, p: ReduceParams) -> str:
    """Sum / product over ``p.axes`` reduced row after row in the reference's element order."""
    shape = ctx.input(0).shape
    kept = [i for i in range(len(shape)) if i not in p.axes]
    perm = list(p.axes) + kept
    moved = [i for i in perm if shape[i] != 1]
    if moved != sorted(moved):  # dimensions of length 1 go anywhere without moving data
        x = g.node("Transpose", [x], perm=perm)
    count = math.prod(shape[i] for i in p.axes)
    # A Reshape that changes the rank is never dropped as a no-op, so it keeps the optimiser
    # from pushing a Transpose into the reduction (which would leave the RK path).
    rows = [count, math.prod(shape[i] for i in kept)] + ([1] if len(shape) == 2 else [])
    rows = g.node("Reshape", [x, g.ints(rows)])
    if ctx.op_type == REDUCE_SUM:
        return g.node("ReduceSum", [rows, g.ints([0])], keepdims=0)
    return g.node("ReduceProd", [rows], axes=[0], keepdims=0)


def _global_average(g: OnnxGraph, ctx: OperationContext, x: str) -> str:
    """MEAN over axes (1, 2) of an NHWC value with an NCHW twin, as GlobalAveragePool on the twin."""
    y = g.node("GlobalAveragePool", [g.nchw(x)])
    if ctx.params.keep_dims:
        return g.nhwc(y)
    return g.node("Reshape", [y, g.ints(ctx.output(0).shape)])  # [N, C, 1, 1] -> [N, C]


def lower_reduce(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: ReduceParams = ctx.params
    if not p.axes:
        return [g.node("Identity", [x[0]])]
    if ctx.op_type == MEAN and p.axes == (1, 2) and len(ctx.input(0).shape) == 4 and g.in_nchw(x[0]):
        return [_global_average(g, ctx, x[0])]
    if ctx.op_type in (REDUCE_SUM, REDUCE_PROD):
        y = _sequential(g, ctx, x[0], p)
    else:
        y = g.node(_ONNX[ctx.op_type], [x[0]], axes=list(p.axes), keepdims=1)
    if ctx.op_type in (REDUCE_SUM, REDUCE_PROD) or not p.keep_dims:
        y = g.node("Reshape", [y, g.ints(ctx.output(0).shape)])
    return [y]


BACKEND.lowering(list(_ONNX), lower=lower_reduce, types=[F32], supports=supports_reduce)
