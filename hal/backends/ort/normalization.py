"""INSTANCE_NORMALIZATION, L2_NORMALIZATION and LOCAL_RESPONSE_NORMALIZATION (float32).

* INSTANCE_NORMALIZATION is ONNX InstanceNormalization (NCHW) with NNAPI's scalar gamma and
  beta broadcast to per-channel constants.
* L2_NORMALIZATION floors the norm at 1e-6 (TFLite, AOSP) where ONNX LpNormalization would
  divide by zero, so it is composed: x / max(sqrt(ReduceSumSquare(x)), 1e-6).
* LOCAL_RESPONSE_NORMALIZATION is ONNX LRN with size = 2 * radius + 1 and alpha scaled by size
  (ONNX divides alpha by size); ONNX LRN normalises over axis 1 of a 4-D tensor, so the input is
  reshaped (not transposed: the layout does not move) to [outer, depth, inner, 1].
  onnxruntime's LRN insists on alpha > 0 and beta > 0 (NNAPI does not): other parameters are
  composed, the window sums as a [depth, depth] band matrix times the squares.
"""
from __future__ import annotations

import math

import numpy as np

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph
from hal.operations.common import F32
from hal.operations.normalization import (
    INSTANCE_NORMALIZATION,
    L2_EPSILON,
    L2_NORMALIZATION,
    LOCAL_RESPONSE_NORMALIZATION,
    InstanceNormParams,
    L2NormParams,
    LrnParams,
)
from hal.registry import OperationContext

_L2_EPSILON = np.float32(L2_EPSILON)


def lower_instance_norm(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: InstanceNormParams = ctx.params
    shape = ctx.input(0).shape
    c = shape[1] if p.nchw else shape[3]
    data = x[0] if p.nchw else g.nchw(x[0])
    y = g.node("InstanceNormalization", [data, g.const(np.full(c, p.gamma, np.float32)),
                                         g.const(np.full(c, p.beta, np.float32))],
               epsilon=float(np.float32(p.epsilon)))
    return [y if p.nchw else g.nhwc(y)]


def lower_l2_norm(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: L2NormParams = ctx.params
    norm = g.node("Sqrt", [g.node("ReduceSumSquare", [x[0]], axes=[p.axis], keepdims=1)])
    return [g.node("Div", [x[0], g.node("Max", [norm, g.const(_L2_EPSILON)])])]


def lower_lrn(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: LrnParams = ctx.params
    shape = tuple(ctx.input(0).shape)
    depth = shape[p.axis]
    outer, inner = math.prod(shape[:p.axis]), math.prod(shape[p.axis + 1:])
    size = 2 * min(p.radius, depth - 1) + 1  # offsets beyond the axis add nothing
    alpha, beta, bias = np.float32(p.alpha), np.float32(p.beta), np.float32(p.bias)
    if alpha > 0 and beta > 0:
        data = g.node("Reshape", [x[0], g.ints([outer, depth, inner, 1])])
        y = g.node("LRN", [data], size=size, alpha=float(alpha) * size, beta=float(beta), bias=float(bias))
    else:
        data = g.node("Reshape", [x[0], g.ints([outer, depth, inner])])
        offsets = np.arange(depth)
        band = (np.abs(offsets[:, None] - offsets[None, :]) <= size // 2).astype(np.float32)
        total = g.node("MatMul", [g.const(band), g.node("Mul", [data, data])])
        scale = g.node("Add", [g.const(bias), g.node("Mul", [g.const(alpha), total])])
        y = g.node("Mul", [data, g.node("Pow", [scale, g.const(np.float32(-beta))])])
    return [g.node("Reshape", [y, g.ints(shape)])]


def _no_empty(ctx: OperationContext) -> str | None:
    return "zero-sized input" if 0 in ctx.input(0).shape else None


BACKEND.lowering(INSTANCE_NORMALIZATION, lower=lower_instance_norm, types=[F32], supports=_no_empty)
BACKEND.lowering(L2_NORMALIZATION, lower=lower_l2_norm, types=[F32], supports=_no_empty)
BACKEND.lowering(LOCAL_RESPONSE_NORMALIZATION, lower=lower_lrn, types=[F32], supports=_no_empty)
