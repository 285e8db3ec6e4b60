"""Float32 MEAN and NHWC RESIZE_BILINEAR: one native pass each, for the float CNNs that run wholly on
this backend (squeeze-excite and global-pooling means, a decoder's 2x upsamplings).

MEAN, as the reference computes it (numpy's mean in float64, rounded to float32 once): every sum
in float64, divided by the count in float64, then rounded. Only the order of the float64 additions
differs from numpy's, far below float32's precision (a difference shows only where the float64
mean lies within float64 rounding of a float32 tie). Two loops:

* ``_mean_run``: the reduced axes one contiguous run (the spatial mean of NHWC, axes [1, 2]): the
  input is ``[outer, count, inner]`` and the ``count`` rows of ``inner`` floats are added into
  ``inner`` float64 sums four rows at a time (a contiguous loop LLVM vectorises; each pass over
  the sums waits on the last one's stores); a run at the end (``inner`` = 1)
  is read as rows of ``LANES`` partial sums, added up at the end.
* ``_mean_any``: any other axis set (separated axes, none): each input element added into its
  output's sum, the output index made from per-axis strides (0 along a reduced axis).
An empty reduction (a zero-sized reduced axis) gives NaN, as the reference.

RESIZE_BILINEAR: the plan is the reference backend's own (hal.backends.reference.resize), its
float32 source indexes and weights per output row and column computed from the shapes and the
align_corners / half_pixel_centers flags by the same numpy expressions. Per output pixel the
reference's expression ``v00·wy0·wx0 + v10·wy1·wx0 + v01·wy0·wx1 + v11·wy1·wx1``, left to right,
each product ``(v·wy)·wx``, each step one float32 operation (no fused multiply-adds, no
reassociation: numba does neither without fastmath), over the pixel's channels as the contiguous
inner loop: the reference's bytes. NCHW, and a plan whose indexes leave the input, decline.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numba
import numpy as np

from hal.backends.numba_kernels import BACKEND
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.backends.reference import resize as reference_resize
from hal.operations.reduce import MEAN, ReduceParams
from hal.operations.resize import BILINEAR, ResizeParams
from hal.registry import OperationContext
from hal.types import OperandType

F32_TYPES = (OperandType.TENSOR_FLOAT32,)
I64 = numba.int64
#: Partial sums per row when the reduced run ends the shape (a mean along the last axes).
LANES = 16


# ---- MEAN --------------------------------------------------------------------------------------

@njit(numba.void(ro(np.float32, 3), rw(np.float32, 2)), cache=True, nogil=True, error_model="numpy")
def _mean_run(x, out):
    """x [outer, count, inner] -> out [outer, inner]: float64 sums over axis 1 (count > 0)."""
    outer, count, inner = x.shape
    flat = x.reshape(-1)
    dst = out.reshape(-1)
    if inner == 1:  # rows of LANES partial sums, then the few left over, then the partials
        whole = count - count % LANES
        acc = np.empty(LANES, np.float64)
        for o in range(outer):
            row = flat[o * count:(o + 1) * count]
            for j in range(LANES):
                acc[j] = 0.0
            for r in range(0, whole, LANES):
                part = row[r:r + LANES]
                for j in range(LANES):
                    acc[j] += part[j]
            s = 0.0
            for r in range(whole, count):
                s += row[r]
            for j in range(LANES):
                s += acc[j]
            dst[o] = np.float32(s / count)
        return
    acc = np.empty(inner, np.float64)
    for o in range(outer):
        for i in range(inner):
            acc[i] = 0.0
        base = o * count * inner
        r = 0
        while r + 4 <= count:  # four rows per pass over the sums (each sum's add waits on its last)
            rows = flat[base + r * inner:base + (r + 4) * inner]
            for i in range(inner):
                acc[i] += (np.float64(rows[i]) + np.float64(rows[inner + i])) \
                    + (np.float64(rows[2 * inner + i]) + np.float64(rows[3 * inner + i]))
            r += 4
        for last in range(r, count):
            row = flat[base + last * inner:base + (last + 1) * inner]
            for i in range(inner):
                acc[i] += row[i]
        res = dst[o * inner:(o + 1) * inner]
        for i in range(inner):
            res[i] = np.float32(acc[i] / count)


@njit(numba.void(ro(np.float32, 4), ro(np.int64, 1), I64, rw(np.float64, 1), rw(np.float32, 1)),
            cache=True, nogil=True, error_model="numpy")
def _mean_any(x, strides, count, acc, out):
    """x (as rank 4) -> out (flat): x[i] added into acc[Σ i_k · strides[k]] (strides[k] 0 along a
    reduced axis), then each sum over ``count`` (> 0)."""
    d0, d1, d2, d3 = x.shape
    s0, s1, s2, s3 = strides[0], strides[1], strides[2], strides[3]
    for k in range(acc.shape[0]):
        acc[k] = 0.0
    for a in range(d0):
        for b in range(d1):
            for c in range(d2):
                o = a * s0 + b * s1 + c * s2
                for d in range(d3):
                    acc[o + d * s3] += x[a, b, c, d]
    for k in range(out.shape[0]):
        out[k] = np.float32(acc[k] / count)


@dataclass
class FloatMean:
    shape: tuple[int, ...]  # the input's, as rank 4 (leading 1s) for _mean_any
    out_shape: tuple[int, ...]
    count: int  # reduced elements per output
    run: tuple[int, int, int] | None  # (outer, count, inner) when the axes are one contiguous run
    strides: np.ndarray  # _mean_any's output strides per (rank-4) axis


def plan_mean(ctx: OperationContext) -> FloatMean:
    p: ReduceParams = ctx.params
    shape = tuple(int(d) for d in ctx.input(0).shape)
    axes = tuple(p.axes)
    count = math.prod(shape[a] for a in axes)
    run = None
    if axes and list(axes) == list(range(axes[0], axes[-1] + 1)):
        a, b = axes[0], axes[-1] + 1
        run = (math.prod(shape[:a]), math.prod(shape[a:b]), math.prod(shape[b:]))
    lead = 4 - len(shape)
    strides, step = [0] * 4, 1
    for k in reversed(range(len(shape))):
        if k not in axes:
            strides[lead + k], step = step, step * shape[k]
    return FloatMean((1,) * lead + shape, tuple(p.out_shape), count, run, np.array(strides, np.int64))


def _mean_call(d: FloatMean, x: np.ndarray, out: np.ndarray):
    if d.run is not None:
        return functools.partial(_mean_run, x.reshape(d.run), out.reshape(d.run[0], d.run[2]))
    acc = np.empty(out.size, np.float64)  # the binding's, allocated once
    return functools.partial(_mean_any, x.reshape(d.shape), d.strides, d.count, acc, out.reshape(-1))


def execute_mean(ctx: OperationContext, inputs: list) -> list:
    d: FloatMean = ctx.data
    out = np.empty(d.out_shape, np.float32)
    if out.size == 0:
        return [out]
    if d.count == 0:  # an empty reduction: NaN, as the reference (TFLite's fill)
        out[...] = np.nan
        return [out]
    _mean_call(d, np.ascontiguousarray(inputs[0], np.float32), out)()
    return [out]


def bind_mean(ctx: OperationContext, inputs: list, outputs: list):
    """``execute`` of the fixed contiguous input into the fixed ``outputs[0]``: a zero-argument runner."""
    d: FloatMean = ctx.data
    x, out = inputs[0], outputs[0]
    if x is None or not x.flags.c_contiguous or out.size == 0 or d.count == 0:
        return None
    return _mean_call(d, x, out)


# ---- RESIZE_BILINEAR ---------------------------------------------------------------------------

I1, F1 = ro(np.int64, 1), ro(np.float32, 1)


@njit(numba.void(ro(np.float32, 4), I1, I1, F1, F1, I1, I1, F1, F1, rw(np.float32, 4)),
            cache=True, nogil=True, error_model="numpy")
def _bilinear(x, ylo, yhi, wy0s, wy1s, xlo, xhi, wx0s, wx1s, out):
    n_b, in_h, in_w, c = x.shape
    out_h, out_w = out.shape[1], out.shape[2]
    src, dst = x.reshape(-1), out.reshape(-1)
    for n in range(n_b):
        for oy in range(out_h):
            top, bottom = (n * in_h + ylo[oy]) * in_w, (n * in_h + yhi[oy]) * in_w
            wy0, wy1 = wy0s[oy], wy1s[oy]
            for ox in range(out_w):
                x0, x1, wx0, wx1 = xlo[ox], xhi[ox], wx0s[ox], wx1s[ox]
                v00 = src[(top + x0) * c:(top + x0 + 1) * c]
                v10 = src[(bottom + x0) * c:(bottom + x0 + 1) * c]
                v01 = src[(top + x1) * c:(top + x1 + 1) * c]
                v11 = src[(bottom + x1) * c:(bottom + x1 + 1) * c]
                o = ((n * out_h + oy) * out_w + ox) * c
                res = dst[o:o + c]
                for ch in range(c):
                    res[ch] = (v00[ch] * wy0 * wx0 + v10[ch] * wy1 * wx0) + v01[ch] * wy0 * wx1 + v11[ch] * wy1 * wx1


def supports_resize(ctx: OperationContext) -> str | None:
    p: ResizeParams = ctx.params
    if p.nchw:
        return "NCHW layout (the reference backend transposes around its kernel)"
    d = reference_resize.plan(ctx)
    for axis, size in ((d.rows, p.in_h), (d.cols, p.in_w)):  # the kernel does not check bounds
        if not all(0 <= int(v.min()) and int(v.max()) < size for v in (axis.lo, axis.hi) if v.size):
            return "a source index outside the input"
    return None


def plan_resize(ctx: OperationContext) -> reference_resize.ResizeData:
    d = reference_resize.plan(ctx)
    for axis in (d.rows, d.cols):  # contiguous int64 / float32 arrays, as the kernel's signature says
        axis.lo, axis.hi = (np.ascontiguousarray(v, np.int64) for v in (axis.lo, axis.hi))
        axis.w_lo, axis.w_hi = (np.ascontiguousarray(v, np.float32) for v in (axis.w_lo, axis.w_hi))
    return d


def _resize_call(d: reference_resize.ResizeData, x: np.ndarray, out: np.ndarray):
    r, c = d.rows, d.cols
    return functools.partial(_bilinear, x, r.lo, r.hi, r.w_lo, r.w_hi, c.lo, c.hi, c.w_lo, c.w_hi, out)


def execute_resize(ctx: OperationContext, inputs: list) -> list:
    d: reference_resize.ResizeData = ctx.data
    x = np.ascontiguousarray(inputs[0], np.float32)
    out = np.empty((x.shape[0], len(d.rows.lo), len(d.cols.lo), x.shape[3]), np.float32)
    if out.size:
        _resize_call(d, x, out)()
    return [out]


def bind_resize(ctx: OperationContext, inputs: list, outputs: list):
    """``execute`` of the fixed contiguous input into the fixed ``outputs[0]``: a zero-argument runner."""
    x, out = inputs[0], outputs[0]
    if x is None or not x.flags.c_contiguous or out.size == 0:
        return None
    return _resize_call(ctx.data, x, out)


BACKEND.register(MEAN, plan=plan_mean, execute=execute_mean, types=F32_TYPES, bind=bind_mean)
BACKEND.register(BILINEAR, plan=plan_resize, execute=execute_resize, types=F32_TYPES, supports=supports_resize,
                 bind=bind_resize)
