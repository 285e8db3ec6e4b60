"""Quantized (uint8 / int8) RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR, NHWC: one native pass.

The plan is the reference backend's own (hal.backends.reference.resize): per output row and column
the two source indexes and their weights, computed from the shapes and the align_corners /
half_pixel_centers flags exactly as TFLite 2.14's reference kernels do. Execution repeats the
reference's per-element arithmetic, the channels (contiguous in NHWC) as the vectorised inner loop:

* uint8 bilinear: float32 ``v00·wy0·wx0 + v10·wy1·wx0 + v01·wy0·wx1 + v11·wy1·wx1`` evaluated left
  to right, each product as ``(v·wy)·wx`` (no fused multiply-adds, no reassociation: numba does
  neither without fastmath), plus 0.5, truncated.
* int8 bilinear: the same blend in 10-bit fixed point (weights summing to 1024 per axis), int64,
  rounded half away from zero by 2^20 with C division.
* nearest neighbour: a copy of the chosen source pixel's channels.
NCHW declines (the reference backend transposes around its kernel).
"""
from __future__ import annotations

import numba
import numpy as np

from hal.backends.numba_kernels import BACKEND
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.backends.reference import resize as reference
from hal.operations.common import QUANT8
from hal.operations.resize import BILINEAR, NEAREST, ResizeParams
from hal.registry import OperationContext


def supports(ctx: OperationContext) -> str | None:
    p: ResizeParams = ctx.params
    if p.nchw:
        return "NCHW layout (the reference backend transposes around its kernel)"
    if ctx.output(0).type not in QUANT8:
        return "output is not 8-bit quantized"
    d = reference.plan(ctx)
    for axis, size in ((d.rows, p.in_h), (d.cols, p.in_w)):  # the kernels do not check bounds
        if not all(0 <= int(v.min()) and int(v.max()) < size for v in (axis.lo, axis.hi) if v.size):
            return "a source index outside the input"
    return None


def plan(ctx: OperationContext) -> reference.ResizeData:
    d = reference.plan(ctx)
    for axis in (d.rows, d.cols):  # contiguous int64 / float32 arrays, as the kernels' signatures say
        for k in ("lo", "hi", "w_lo", "w_hi"):
            v = getattr(axis, k)
            if v is not None:
                setattr(axis, k, np.ascontiguousarray(v, dtype=np.float32 if v.dtype == np.float32 else np.int64))
    return d


# ---- native kernels ---------------------------------------------------------------------------

I1, F1 = ro(np.int64, 1), ro(np.float32, 1)


@njit([numba.void(ro(np.uint8, 4), I1, I1, F1, F1, I1, I1, F1, F1, rw(np.uint8, 4))], cache=True, nogil=True)
def _bilinear_float(x, ylo, yhi, wy0s, wy1s, xlo, xhi, wx0s, wx1s, out):
    n_b, _, _, c = x.shape
    out_h, out_w = out.shape[1], out.shape[2]
    half = np.float32(0.5)
    for n in range(n_b):
        for oy in range(out_h):
            y0, y1, wy0, wy1 = ylo[oy], yhi[oy], wy0s[oy], wy1s[oy]
            for ox in range(out_w):
                x0, x1, wx0, wx1 = xlo[ox], xhi[ox], wx0s[ox], wx1s[ox]
                for ch in range(c):
                    acc = np.float32(x[n, y0, x0, ch]) * wy0 * wx0
                    acc += np.float32(x[n, y1, x0, ch]) * wy1 * wx0
                    acc += np.float32(x[n, y0, x1, ch]) * wy0 * wx1
                    acc += np.float32(x[n, y1, x1, ch]) * wy1 * wx1
                    out[n, oy, ox, ch] = np.uint8(np.int32(acc + half))  # static_cast truncates


@njit([numba.void(ro(np.int8, 4), I1, I1, I1, I1, I1, I1, I1, I1, rw(np.int8, 4))], cache=True, nogil=True)
def _bilinear_integer(x, ylo, yhi, wy0s, wy1s, xlo, xhi, wx0s, wx1s, out):
    n_b, _, _, c = x.shape
    out_h, out_w = out.shape[1], out.shape[2]
    for n in range(n_b):
        for oy in range(out_h):
            y0, y1, wy0, wy1 = ylo[oy], yhi[oy], wy0s[oy], wy1s[oy]
            for ox in range(out_w):
                x0, x1, wx0, wx1 = xlo[ox], xhi[ox], wx0s[ox], wx1s[ox]
                w00, w10, w01, w11 = wy0 * wx0, wy1 * wx0, wy0 * wx1, wy1 * wx1
                for ch in range(c):
                    acc = (np.int64(x[n, y0, x0, ch]) * w00 + np.int64(x[n, y1, x0, ch]) * w10
                           + np.int64(x[n, y0, x1, ch]) * w01 + np.int64(x[n, y1, x1, ch]) * w11)
                    acc += np.int64(1 << 19) if acc > 0 else np.int64(-(1 << 19))
                    q = acc >> 20 if acc >= 0 else -((-acc) >> 20)  # C division by 2^20
                    out[n, oy, ox, ch] = np.int8(q)


@njit([numba.void(ro(t, 4), I1, I1, rw(t, 4)) for t in (np.int8, np.uint8)], cache=True, nogil=True)
def _nearest(x, ys, xs, out):
    n_b, _, _, c = x.shape
    out_h, out_w = out.shape[1], out.shape[2]
    for n in range(n_b):
        for oy in range(out_h):
            iy = ys[oy]
            for ox in range(out_w):
                ix = xs[ox]
                for ch in range(c):
                    out[n, oy, ox, ch] = x[n, iy, ix, ch]


def execute(ctx: OperationContext, inputs: list) -> list:
    d: reference.ResizeData = ctx.data
    x = np.ascontiguousarray(inputs[0])
    r, c = d.rows, d.cols
    out = np.empty((x.shape[0], len(r.lo), len(c.lo), x.shape[3]), dtype=x.dtype)
    if d.kind == NEAREST:
        _nearest(x, r.lo, c.lo, out)
    elif d.integer:
        _bilinear_integer(x, r.lo, r.hi, r.w_lo, r.w_hi, c.lo, c.hi, c.w_lo, c.w_hi, out)
    else:
        _bilinear_float(x, r.lo, r.hi, r.w_lo, r.w_hi, c.lo, c.hi, c.w_lo, c.w_hi, out)
    return [out]


BACKEND.register([BILINEAR, NEAREST], plan=plan, execute=execute, types=QUANT8, supports=supports)
