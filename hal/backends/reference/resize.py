"""RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR on numpy.

Bit-exact with TFLite 2.14's reference kernels (reference/resize_bilinear.h,
resize_nearest_neighbor.h), which pick a different arithmetic per type:

* float32 and uint8: ``ResizeBilinear<T>`` in float32; uint8 adds 0.5 and truncates.
* int8: ``ResizeBilinearInteger``, 10-bit fixed-point positions and 20-bit
  products, rounded half away from zero.

All source positions and weights depend only on shapes, so plan computes
them; execute gathers rows/columns and blends.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal import quant
from hal.backends.reference import BACKEND
from hal.operations.common import QS8
from hal.operations.resize import BILINEAR, NEAREST, ResizeParams
from hal.registry import OperationContext
from hal.types import OperationType


@dataclass
class Axis:
    """Per output row (or column): the two source indexes and their weights."""

    lo: np.ndarray
    hi: np.ndarray
    w_lo: np.ndarray | None = None  # float32 (1 - frac) or int64 (1024 - frac_10)
    w_hi: np.ndarray | None = None


@dataclass
class ResizeData:
    kind: OperationType
    nchw: bool
    integer: bool  # int8 bilinear: ResizeBilinearInteger
    rows: Axis
    cols: Axis


def _float_scale(in_size: int, out_size: int, align: bool) -> np.float32:
    if align and out_size > 1:
        return np.float32(in_size - 1) / np.float32(out_size - 1)
    return np.float32(in_size) / np.float32(out_size)


def _nearest_axis(in_size: int, out_size: int, align: bool, half: bool) -> Axis:
    """reference_ops GetNearestNeighbor: float32 position, std::round when aligning corners."""
    scale = _float_scale(in_size, out_size, align)
    pos = (np.arange(out_size, dtype=np.float32) + np.float32(0.5 if half else 0.0)) * scale
    idx = quant.round_half_away(pos) if align else np.floor(pos)
    idx = np.minimum(idx.astype(np.int64), in_size - 1)
    if half:
        idx = np.maximum(idx, 0)
    return Axis(idx, idx)


def _bilinear_axis_float(in_size: int, out_size: int, align: bool, half: bool) -> Axis:
    """ComputeInterpolationValues (float32): weights 1 - (pos - lo) and (pos - lo)."""
    scale = _float_scale(in_size, out_size, align)
    v = np.arange(out_size, dtype=np.float32)
    pos = (v + np.float32(0.5)) * scale - np.float32(0.5) if half else v * scale
    lo = np.maximum(np.floor(pos).astype(np.int64), 0)
    hi = np.minimum(np.ceil(pos).astype(np.int64), in_size - 1)
    frac = (pos - lo.astype(np.float32)).astype(np.float32)
    return Axis(lo, hi, (np.float32(1) - frac).astype(np.float32), frac)


def _bilinear_axis_integer(in_size: int, out_size: int, align: bool, half: bool) -> Axis:
    """ComputeInterpolationValuesInteger: positions in 1/1024 units, C integer division."""
    if align and out_size > 1:
        scale_10 = ((1 << 10) * (in_size - 1) + (out_size - 1) // 2) // (out_size - 1)
    else:
        scale_10 = ((1 << 10) * in_size + out_size // 2) // out_size
    v = np.arange(out_size, dtype=np.int64)
    pos = v * scale_10 + scale_10 // 2 - (1 << 9) if half else v * scale_10
    # TFLite does not clamp lo to in_size - 1: for large upscales (e.g. 1 -> 55, 2 -> 65 with
    # neither flag set) its position rounds past the last pixel and it reads beyond the row.
    # We clamp, which yields the edge pixel (lo == hi, the weights still sum to 1024).
    lo = np.minimum(np.maximum(quant.trunc_div(pos, 1 << 10), 0), in_size - 1)
    hi = np.minimum(quant.trunc_div(pos + (1 << 10) - 1, 1 << 10), in_size - 1)
    frac = pos - (lo << 10)
    return Axis(lo, hi, (1 << 10) - frac, frac)


def plan(ctx: OperationContext) -> ResizeData:
    p: ResizeParams = ctx.params
    integer = p.kind == BILINEAR and ctx.input_type(0) == QS8
    if p.kind == NEAREST:
        axis = _nearest_axis
    else:
        axis = _bilinear_axis_integer if integer else _bilinear_axis_float
    rows = axis(p.in_h, p.out_h, p.align_corners, p.half_pixel_centers)
    cols = axis(p.in_w, p.out_w, p.align_corners, p.half_pixel_centers)
    return ResizeData(p.kind, p.nchw, integer, rows, cols)


def _bilinear_float(x: np.ndarray, r: Axis, c: Axis, integer_out: bool) -> np.ndarray:
    """v00*(1-dy)*(1-dx) + v10*dy*(1-dx) + v01*(1-dy)*dx + v11*dy*dx, left to right in float32."""
    xf = x.astype(np.float32, copy=False)
    top, bottom = xf[:, r.lo], xf[:, r.hi]
    wy0, wy1 = r.w_lo[None, :, None, None], r.w_hi[None, :, None, None]
    wx0, wx1 = c.w_lo[None, None, :, None], c.w_hi[None, None, :, None]
    acc = top[:, :, c.lo] * wy0 * wx0
    acc += bottom[:, :, c.lo] * wy1 * wx0
    acc += top[:, :, c.hi] * wy0 * wx1
    acc += bottom[:, :, c.hi] * wy1 * wx1
    if not integer_out:
        return acc
    acc += np.float32(0.5)  # rounding_offset, then static_cast<uint8_t> truncates
    return np.trunc(acc).astype(x.dtype)


def _bilinear_integer(x: np.ndarray, r: Axis, c: Axis) -> np.ndarray:
    """20-bit fixed-point blend; (acc ± 2^19) / 2^20 with C division, then static_cast<int8_t>."""
    xi = x.astype(np.int64)
    top, bottom = xi[:, r.lo], xi[:, r.hi]
    wy0, wy1 = r.w_lo[None, :, None, None], r.w_hi[None, :, None, None]
    wx0, wx1 = c.w_lo[None, None, :, None], c.w_hi[None, None, :, None]
    acc = (top[:, :, c.lo] * wy0 * wx0 + bottom[:, :, c.lo] * wy1 * wx0
           + top[:, :, c.hi] * wy0 * wx1 + bottom[:, :, c.hi] * wy1 * wx1)
    acc += np.where(acc > 0, 1 << 19, -(1 << 19))
    return quant.trunc_div(acc, 1 << 20).astype(x.dtype)


def execute(ctx: OperationContext, inputs: list) -> list:
    d: ResizeData = ctx.data
    x = inputs[0]
    if d.nchw:
        x = x.transpose(0, 2, 3, 1)
    if d.kind == NEAREST:
        out = x[:, d.rows.lo][:, :, d.cols.lo]
    elif d.integer:
        out = _bilinear_integer(x, d.rows, d.cols)
    else:
        out = _bilinear_float(x, d.rows, d.cols, integer_out=x.dtype != np.float32)
    if d.nchw:
        out = out.transpose(0, 3, 1, 2)
    return [np.ascontiguousarray(out)]


BACKEND.register([BILINEAR, NEAREST], plan=plan, execute=execute)
