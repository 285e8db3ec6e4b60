"""RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR (float32) as Gathers with constant indices and weights.

ONNX Resize is not used: onnxruntime computes source positions as x / (out / in) (and
x * (in - 1) / (out - 1)) while TFLite multiplies by in / out, and the two round differently.
For nearest that picks another pixel (e.g. 14 -> 2 rows: TFLite reads row 7, onnxruntime
asymmetric/floor row 6; every align_corners / half_pixel mapping to coordinate_transformation_mode
and nearest_mode mismatches some sizes); for bilinear one ulp of position times the step between
neighbours is far outside CTS's float tolerance on image data (255 * 7.6e-6 at x ~ 100).

Positions and weights depend only on shapes, so they come from the reference kernel's own
``_nearest_axis`` / ``_bilinear_axis_float`` (same TFLite rounding, align_corners and
half_pixel_centers handling) and become initializers. Nearest is a row Gather and a column Gather
(exact). Bilinear repeats the reference's float32 arithmetic step for step, so it is bit-exact:
rows lo/hi gathered and scaled by (1 - dy) / dy, columns lo/hi gathered from those and scaled by
(1 - dx) / dx, summed in the reference's order ((t0 + b0) + t1) + b1. The price: ~11 passes over the output
where Resize makes one (65x65x21 -> 513x513: ~8x Resize's time, still below the reference's);
nearest as Gathers is faster than Resize.

Both layouts are computed in place (H, W are axes 1, 2 in NHWC, 2, 3 with the NCHW flag).
"""
from __future__ import annotations

import numpy as np

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph
from hal.backends.reference.resize import Axis, _bilinear_axis_float, _nearest_axis
from hal.operations.common import F32
from hal.operations.resize import BILINEAR, NEAREST, ResizeParams
from hal.registry import OperationContext


def supports_resize(ctx: OperationContext) -> str | None:
    if 0 in ctx.input(0).shape:
        return "zero-sized tensors are left to the reference backend"
    return None


def _gather(g: OnnxGraph, x: str, index: np.ndarray, axis: int) -> str:
    return g.node("Gather", [x, g.const(np.asarray(index, np.int64), "idx")], axis=axis)


#: Largest column-weight initializer repeated over the channels (elements).
_MAX_TILED_WEIGHT = 1 << 20


def _weight(g: OnnxGraph, w: np.ndarray, axis: int, channels: int = 1) -> str:
    """``w`` (float32, one per output row or column) shaped to broadcast along ``axis`` of a 4-D
    value; ``channels`` > 1 repeats it along the last axis (NHWC columns: onnxruntime's Mul
    broadcasts a [1, 1, ow, c] operand as whole rows, a [1, 1, ow, 1] one element by element,
    about 10x slower)."""
    shape = [1, 1, 1, 1]
    shape[axis] = w.size
    w = np.asarray(w, np.float32).reshape(shape)
    if channels > 1 and w.size * channels <= _MAX_TILED_WEIGHT:
        w = np.repeat(w, channels, axis=3)
    return g.const(np.ascontiguousarray(w), "w")


def _bilinear(g: OnnxGraph, x: str, rows: Axis, cols: Axis, h: int, w: int, channels: int) -> str:
    top = g.node("Mul", [_gather(g, x, rows.lo, h), _weight(g, rows.w_lo, h)])
    bottom = g.node("Mul", [_gather(g, x, rows.hi, h), _weight(g, rows.w_hi, h)])
    wx0, wx1 = _weight(g, cols.w_lo, w, channels), _weight(g, cols.w_hi, w, channels)
    acc = g.node("Mul", [_gather(g, top, cols.lo, w), wx0])
    acc = g.node("Add", [acc, g.node("Mul", [_gather(g, bottom, cols.lo, w), wx0])])
    acc = g.node("Add", [acc, g.node("Mul", [_gather(g, top, cols.hi, w), wx1])])
    return g.node("Add", [acc, g.node("Mul", [_gather(g, bottom, cols.hi, w), wx1])])


def lower_resize(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: ResizeParams = ctx.params
    h, w = (2, 3) if p.nchw else (1, 2)
    if p.kind == NEAREST:
        rows = _nearest_axis(p.in_h, p.out_h, p.align_corners, p.half_pixel_centers)
        cols = _nearest_axis(p.in_w, p.out_w, p.align_corners, p.half_pixel_centers)
        y = x[0]
        if not np.array_equal(rows.lo, np.arange(p.in_h)):
            y = _gather(g, y, rows.lo, h)
        if not np.array_equal(cols.lo, np.arange(p.in_w)):
            y = _gather(g, y, cols.lo, w)
        return [y if y != x[0] else g.node("Identity", [y])]
    rows = _bilinear_axis_float(p.in_h, p.out_h, p.align_corners, p.half_pixel_centers)
    cols = _bilinear_axis_float(p.in_w, p.out_w, p.align_corners, p.half_pixel_centers)
    channels = 1 if p.nchw else ctx.input(0).shape[3]
    return [_bilinear(g, x[0], rows, cols, h, w, channels)]


BACKEND.lowering([BILINEAR, NEAREST], lower=lower_resize, types=[F32], supports=supports_resize)
