"""TRANSPOSE_CONV_2D as ONNX ConvTranspose (float32), both signatures, NHWC or NCHW.

The NNAPI filter [out_c, h, w, in_c] becomes ONNX's [in_c, out_c, h, w]. Both sizes follow
``(in - 1) * stride + filter - pad_head - pad_tail``, so the spec's resolved paddings go to ONNX
as they are, except a negative tail (NNAPI allows one; onnxruntime rejects negative pads): it
grows the output with cells no input reaches, which is ONNX's output_padding while it stays
below the stride (onnxruntime's limit), and a zero Pad beyond that, with the bias then added
after the Pad so those cells hold the bias as in the reference.
"""
from __future__ import annotations

import numpy as np

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph
from hal.operations.common import F32
from hal.operations.transpose_conv import BIAS, FILTER, INPUT, TRANSPOSE_CONV, TransposeConvParams
from hal.registry import OperationContext

_PERM = (3, 0, 1, 2)  # [out_c, h, w, in_c] -> [in_c, out_c, h, w]


def _filter(g: OnnxGraph, ctx: OperationContext, x) -> str:
    w = ctx.input(FILTER)
    if w.value is not None:
        return g.const(np.transpose(np.asarray(w.value, np.float32), _PERM), "filter")
    return g.node("Transpose", [x[FILTER]], perm=list(_PERM))


def _tail(size: int, stride: int, filter_size: int, head: int, out: int) -> tuple[int, int, int]:
    """(ONNX tail pad, output_padding, zero cells padded after) for one axis."""
    tail = (size - 1) * stride + filter_size - head - out
    if tail >= 0:
        return tail, 0, 0
    grow = min(-tail, stride - 1)
    return 0, grow, -tail - grow


def _tails(ctx: OperationContext) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    p: TransposeConvParams = ctx.params
    shape = ctx.input(INPUT).shape
    h, w = (shape[2], shape[3]) if p.nchw else (shape[1], shape[2])
    _, fh, fw, _ = ctx.input(FILTER).shape
    return (_tail(h, p.stride_h, fh, p.pad_top, p.out_h), _tail(w, p.stride_w, fw, p.pad_left, p.out_w))


def lower_transpose_conv(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: TransposeConvParams = ctx.params
    _, fh, fw, _ = ctx.input(FILTER).shape
    (bottom, grow_h, extra_h), (right, grow_w, extra_w) = _tails(ctx)
    extra = extra_h or extra_w
    data = x[INPUT] if p.nchw else g.nchw(x[INPUT])
    y = g.node("ConvTranspose", [data, _filter(g, ctx, x), None if extra else x[BIAS]],
               kernel_shape=[fh, fw], strides=[p.stride_h, p.stride_w],
               pads=[p.pad_top, p.pad_left, bottom, right], output_padding=[grow_h, grow_w])
    if extra:
        y = g.node("Pad", [y, g.ints([0, 0, 0, 0, 0, 0, extra_h, extra_w])])
        y = g.node("Add", [y, g.node("Reshape", [x[BIAS], g.ints([1, p.out_c, 1, 1])])])
    y = g.activation(y, p.act)
    return [y if p.nchw else g.nhwc(y)]


def supports(ctx: OperationContext) -> str | None:
    if ctx.input(INPUT).shape[0] == 0:
        return "zero-sized batch"
    p: TransposeConvParams = ctx.params
    if any(out - extra <= 0 for out, (_, _, extra) in zip((p.out_h, p.out_w), _tails(ctx))):
        # The head padding crops every cell an input reaches: onnxruntime refuses an empty
        # ConvTranspose output (the NNAPI output is the bias alone).
        return "the paddings crop away every cell an input reaches"
    return None


BACKEND.lowering(TRANSPOSE_CONV, lower=lower_transpose_conv, types=[F32], supports=supports)
