"""CONV_2D, DEPTHWISE_CONV_2D and GROUPED_CONV_2D as ONNX Conv (float32).

NNAPI filters are OHWI (CONV_2D, GROUPED_CONV_2D: [out_c, h, w, in_c / groups]) or [1, h, w, out_c]
(DEPTHWISE_CONV_2D, out channel o reads input channel o // multiplier: ONNX's grouping with
group = in_c); ONNX wants OIHW, so constant filters are transposed once here. The tail padding is
what the windows reach, which gives ONNX's output size NNAPI's exactly. A stem (an NHWC image
of up to 3 channels) is read in place as one channel of w * c columns (``_pixels_as_columns``).
"""
from __future__ import annotations

import numpy as np

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph
from hal.backends.ort.shape import zero_sized
from hal.operations.common import F32
from hal.operations.conv import BIAS, CONV, DW, FILTER, GROUPED, INPUT, ConvParams
from hal.registry import OperationContext


def _filter(g: OnnxGraph, ctx: OperationContext, x, depthwise: bool) -> str:
    perm = (3, 0, 1, 2) if depthwise else (0, 3, 1, 2)
    w = ctx.input(FILTER)
    if w.value is not None:
        return g.const(np.transpose(np.asarray(w.value, np.float32), perm), "filter")
    return g.node("Transpose", [x[FILTER]], perm=list(perm))


#: The most input channels a convolution reads from NHWC as one channel (``_pixels_as_columns``):
#: an image (RGB, grey).
_FLAT_MAX_CHANNELS = 3


def _pixels_as_columns(g: OnnxGraph, ctx: OperationContext, x) -> list[str] | None:
    """A network's stem (an NHWC input of a few channels, nothing in NCHW yet) as a convolution of
    one channel: [n, h, w, c] is [n, 1, h, w * c] without a copy, and a window of kw pixels and c
    channels is kw * c consecutive columns, stepping stride * c; the OHWI filter is already
    [out_c, 1, kh, kw * c]. The same products and sums as NCHW, without the Transpose of the
    input (a copy of the whole image, element by element)."""
    p: ConvParams = ctx.params
    rows, cols, w, shape = p.rows, p.cols, ctx.input(FILTER), ctx.input(INPUT).shape
    if p.nchw or p.depthwise or p.groups != 1 or p.in_c > _FLAT_MAX_CHANNELS or cols.dilation != 1 \
            or w.value is None or g.in_nchw(x[INPUT]) or len(shape) != 4 or any(d <= 0 for d in shape):
        return None
    n, h, width, c = shape
    flat = g.node("Reshape", [x[INPUT], g.ints([n, 1, h, width * c])])
    filt = g.const(np.asarray(w.value, np.float32).reshape(p.out_c, 1, rows.filter, cols.filter * c), "filter")
    y = g.node("Conv", [flat, filt, x[BIAS]], kernel_shape=[rows.filter, cols.filter * c],
               strides=[rows.stride, cols.stride * c], dilations=[rows.dilation, 1],
               pads=[rows.pad_head, cols.pad_head * c, rows.reach, cols.reach * c])
    return [g.nhwc(g.activation(y, p.act))]


def lower_conv(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: ConvParams = ctx.params
    flat = _pixels_as_columns(g, ctx, x)
    if flat is not None:
        return flat
    rows, cols = p.rows, p.cols
    group = p.in_c if p.depthwise else p.groups
    data = x[INPUT] if p.nchw else g.nchw(x[INPUT])
    y = g.node("Conv", [data, _filter(g, ctx, x, p.depthwise), x[BIAS]], group=group,
               kernel_shape=[rows.filter, cols.filter], strides=[rows.stride, cols.stride],
               dilations=[rows.dilation, cols.dilation],
               pads=[rows.pad_head, cols.pad_head, rows.reach, cols.reach])
    y = g.activation(y, p.act)
    return [y if p.nchw else g.nhwc(y)]


BACKEND.lowering([CONV, DW, GROUPED], lower=lower_conv, types=[F32], supports=zero_sized)
