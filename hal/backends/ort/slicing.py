"""SLICE, STRIDED_SLICE, SPLIT and CONCATENATION as ONNX Slice / Split / Concat.

STRIDED_SLICE uses the spec's resolved axes (``ctx.params.axes``: start, count, stride after
TFLite's clamping and masks), so ONNX never re-resolves NNAPI's indices: each axis becomes
[start, last + sign(stride)) with the stop written as INT64_MIN when it lies before element 0
(ONNX would read -1 as "the last element"), then a Reshape drops the shrink axes. Values that
break NNAPI's shrink-axis rule are declined: the reference kernel refuses them at execution.
CONCATENATION of 4-D values of which one is in NCHW already concatenates there (the axis
permuted, constant parts permuted once), as MediaPipe's channel widening and skip joins do.
"""
from __future__ import annotations

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph, nchw_axis
from hal.backends.ort.shape import reshape_to, zero_sized
from hal.operations.common import F32, I32
from hal.operations.concatenation import ConcatParams, axis_input
from hal.operations.slicing import SliceParams, SplitParams
from hal.operations.strided_slice import StridedSliceParams
from hal.registry import OperationContext
from hal.types import OperationType

INT64_MIN = -(2 ** 63)


def _slice(g: OnnxGraph, x: str, starts, stops, axes, steps=None) -> str:
    inputs = [x, g.ints(starts), g.ints(stops), g.ints(axes)]
    if steps is not None:
        inputs.append(g.ints(steps))
    return g.node("Slice", inputs)


def lower_slice(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: SliceParams = ctx.params
    shape = ctx.input(0).shape
    axes = [k for k, (d, b, s) in enumerate(zip(shape, p.begin, p.size, strict=True)) if (b, s) != (0, d)]
    if not axes:
        return [g.node("Identity", [x[0]])]
    return [_slice(g, x[0], [p.begin[k] for k in axes], [p.begin[k] + p.size[k] for k in axes], axes)]


def _strided_supports(ctx: OperationContext) -> str | None:
    p: StridedSliceParams = ctx.params
    if p.invalid:
        return "values NNAPI forbids: the reference backend refuses them at execution"
    return zero_sized(ctx)


def lower_strided_slice(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: StridedSliceParams = ctx.params
    shape = ctx.input(0).shape
    starts, stops, axes, steps = [], [], [], []
    for k, (dim, a) in enumerate(zip(shape, p.axes, strict=True)):
        if a.stride == 1 and a.start == 0 and a.count == dim:
            continue  # the whole axis
        last = a.start + (a.count - 1) * a.stride
        stop = last + (1 if a.stride > 0 else -1)
        starts.append(a.start)
        stops.append(INT64_MIN if stop < 0 else stop)
        axes.append(k)
        steps.append(a.stride)
    y = _slice(g, x[0], starts, stops, axes, steps) if axes else x[0]
    out = ctx.output(0).shape
    sliced = tuple(1 if a.shrink else a.count for a in p.axes)
    if sliced != tuple(out):
        y = reshape_to(g, y, out)
    return [y if y != x[0] else g.node("Identity", [y])]


def lower_split(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: SplitParams = ctx.params
    n = ctx.num_outputs
    if n == 1:
        return [g.node("Identity", [x[0]])]
    return g.node("Split", [x[0], g.ints([p.count] * n)], outputs=n, axis=p.axis)


def lower_concatenation(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: ConcatParams = ctx.params
    count = axis_input(ctx)  # the parts, not the axis scalar: it would become an initializer
    if count == 1:
        return [g.node("Identity", [x[0]])]
    nchw = g.channels_first(ctx, x, range(count))  # 4-D parts, one of them in NCHW: stay there
    if nchw is not None:
        return [g.nhwc(g.node("Concat", nchw, axis=nchw_axis(p.axis)))]
    return [g.node("Concat", [x[i] for i in range(count)], axis=p.axis)]


def _concat_supports(ctx: OperationContext) -> str | None:
    return zero_sized(ctx, axis_input(ctx))


BACKEND.lowering(OperationType.STRIDED_SLICE, lower=lower_strided_slice, types=[F32], supports=_strided_supports)
BACKEND.lowering(OperationType.SPLIT, lower=lower_split, types=[F32, I32], supports=zero_sized)
BACKEND.lowering(OperationType.CONCATENATION, lower=lower_concatenation, types=[F32], supports=_concat_supports)
BACKEND.lowering(OperationType.SLICE, lower=lower_slice, types=[F32, I32], supports=zero_sized)
