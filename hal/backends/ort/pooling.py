"""AVERAGE_POOL_2D, MAX_POOL_2D and L2_POOL_2D as ONNX AveragePool / MaxPool (float32).

NNAPI's windows only count the cells inside the image, which is AveragePool's
count_include_pad=0. L2_POOL_2D is NNAPI's sqrt(mean of squares over those cells): ONNX LpPool
neither divides nor excludes the padding, so it is sqrt(AveragePool(x * x)). The tail padding
is what the windows reach (as for CONV_2D), which makes ONNX's output size NNAPI's and keeps
every pad below the kernel size as onnxruntime requires (prepare guarantees each window holds a
cell).
"""
from __future__ import annotations

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph
from hal.operations.common import F32
from hal.operations.pooling import AVG, INPUT, L2, MAX, PoolParams
from hal.registry import OperationContext


def lower_pool(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: PoolParams = ctx.params
    rows, cols = p.rows, p.cols
    data = x[INPUT] if p.nchw else g.nchw(x[INPUT])
    window = dict(kernel_shape=[rows.filter, cols.filter], strides=[rows.stride, cols.stride],
                  pads=[rows.pad_head, cols.pad_head, rows.reach, cols.reach])
    if p.kind == MAX:
        y = g.node("MaxPool", [data], **window)
    elif p.kind == AVG:
        y = g.node("AveragePool", [data], count_include_pad=0, **window)
    else:
        y = g.node("Sqrt", [g.node("AveragePool", [g.node("Mul", [data, data])], count_include_pad=0, **window)])
    y = g.activation(y, p.act)
    return [y if p.nchw else g.nhwc(y)]


def supports(ctx: OperationContext) -> str | None:
    if ctx.input(INPUT).shape[0] == 0:
        return "zero-sized batch"
    return None


BACKEND.lowering([AVG, MAX, L2], lower=lower_pool, types=[F32], supports=supports)
