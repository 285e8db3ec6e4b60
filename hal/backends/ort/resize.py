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

Even where the positions agree (onnxruntime 1.32, probed by Resize of the identity: every
power-of-two scale with asymmetric or half_pixel, 2 -> 3, ...; align_corners rarely), linear
Resize sums w11 * x11 + w12 * x12 + ... with the weights' products rounded first, not the
reference's rows-then-columns order: up to ~3 ulp of the largest neighbour, outside CTS's
1e-5 + 5 ulp(result) where neighbours of opposite sign near +-255 meet (measured 2.3e-5 against a
1.4e-5 tolerance on a 6x5 -> 8x12 upscale). The CTS's own bilinear cases (2 -> 3) pass either way.

Both layouts are computed in place (H, W are axes 1, 2 in NHWC, 2, 3 in NCHW: with the NCHW flag,
or when the input is already in NCHW in the partition); in NCHW the columns are gathered as rows
of the transposed value (``_columns``). Between NCHWc convolutions the whole resize then runs on
the blocked tensors (blocked.py): row Gathers as they are, the transposes moving nothing, column
Gathers of whole blocks.
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


def _weight(g: OnnxGraph, w: np.ndarray, axis: int, last: int = 1) -> str:
    """``w`` (float32, one per output row or column) shaped to broadcast along ``axis`` of a 4-D
    value, repeated ``last`` times along the last axis when ``axis`` is not it (onnxruntime's Mul
    broadcasts a [1, 1, ow, c] operand as whole rows, a [1, 1, ow, 1] one element by element or
    in spans of the last axis, several times slower: 10x for NHWC columns, measured)."""
    shape = [1, 1, 1, 1]
    shape[axis] = w.size
    w = np.asarray(w, np.float32).reshape(shape)
    if last > 1 and w.size * last <= _MAX_TILED_WEIGHT:
        w = np.repeat(w, last, axis=3)
    return g.const(np.ascontiguousarray(w), "w")


#: Swaps a 4-D value's last two axes.
_SWAP_HW = [0, 1, 3, 2]


def _bilinear(g: OnnxGraph, x: str, rows: Axis, cols: Axis, h: int, w: int, shape) -> str:
    """``shape``: the input's (NHWC when h == 1, else NCHW)."""
    in_w, channels = (shape[2], shape[3]) if h == 1 else (shape[3], shape[1])
    last = 1 if h == 1 else in_w  # NHWC rows are [in_w, c] blocks already
    top = g.node("Mul", [_gather(g, x, rows.lo, h), _weight(g, rows.w_lo, h, last)])
    bottom = g.node("Mul", [_gather(g, x, rows.hi, h), _weight(g, rows.w_hi, h, last)])
    swap = w == 3
    last = channels
    if swap:  # columns as rows: see _columns
        top, bottom, w = g.node("Transpose", [top], perm=_SWAP_HW), g.node("Transpose", [bottom], perm=_SWAP_HW), 2
        last = rows.lo.size  # the output's rows are the last axis now
    wx0, wx1 = _weight(g, cols.w_lo, w, last), _weight(g, cols.w_hi, w, last)
    acc = g.node("Mul", [_gather(g, top, cols.lo, w), wx0])
    acc = g.node("Add", [acc, g.node("Mul", [_gather(g, bottom, cols.lo, w), wx0])])
    acc = g.node("Add", [acc, g.node("Mul", [_gather(g, top, cols.hi, w), wx1])])
    acc = g.node("Add", [acc, g.node("Mul", [_gather(g, bottom, cols.hi, w), wx1])])
    return g.node("Transpose", [acc], perm=_SWAP_HW) if swap else acc


def _columns(g: OnnxGraph, x: str, index: np.ndarray) -> str:
    """Gather along the last axis of an NCHW value, as a Gather of rows between two transposes:
    onnxruntime's Gather copies one element per index on the innermost axis (the 8 -> 16 -> 32
    upsamplings of the pose-style network took 2 ms that way, 0.1 ms as rows)."""
    y = _gather(g, g.node("Transpose", [x], perm=_SWAP_HW), index, 2)
    return g.node("Transpose", [y], perm=_SWAP_HW)


def lower_resize(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: ResizeParams = ctx.params
    if not p.nchw and g.in_nchw(x[0]):  # stay in the layout the input is already in
        return [g.nhwc(_resize(g, ctx, g.nchw(x[0]), nchw=True))]
    return [_resize(g, ctx, x[0], p.nchw)]


def _resize(g: OnnxGraph, ctx: OperationContext, data: str, nchw: bool) -> str:
    p: ResizeParams = ctx.params
    h, w = (2, 3) if nchw else (1, 2)
    if p.kind == NEAREST:
        rows = _nearest_axis(p.in_h, p.out_h, p.align_corners, p.half_pixel_centers)
        cols = _nearest_axis(p.in_w, p.out_w, p.align_corners, p.half_pixel_centers)
        y = data
        if not np.array_equal(rows.lo, np.arange(p.in_h)):
            y = _gather(g, y, rows.lo, h)
        if not np.array_equal(cols.lo, np.arange(p.in_w)):
            y = _columns(g, y, cols.lo) if nchw else _gather(g, y, cols.lo, w)
        return y if y != data else g.node("Identity", [y])
    rows = _bilinear_axis_float(p.in_h, p.out_h, p.align_corners, p.half_pixel_centers)
    cols = _bilinear_axis_float(p.in_w, p.out_w, p.align_corners, p.half_pixel_centers)
    shape = ctx.input(0).shape
    if nchw and not p.nchw:
        shape = [shape[k] for k in (0, 3, 1, 2)]
    return _bilinear(g, data, rows, cols, h, w, shape)


BACKEND.lowering([BILINEAR, NEAREST], lower=lower_resize, types=[F32], supports=supports_resize)
