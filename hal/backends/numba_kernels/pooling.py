"""Quantized (uint8 / int8) AVERAGE_POOL_2D and MAX_POOL_2D, NHWC: one native pass per output pixel.

A window only counts the input cells it covers (TFLite's filter_start / filter_end clamp), so padded
cells never enter a sum or a maximum: the kernels simply iterate over the clamped window, with
the channels (contiguous in NHWC) as the vectorised inner loop.

* AVERAGE_POOL_2D: int32 sums (exact: a window covers at most 2^23 cells, checked by ``supports``),
  then the reference backend's rounding, half away from zero, ``sign(s) · ((|s| + n/2) // n)``,
  with ``n`` the window's cell count. The quotient is computed as a float64 division truncated:
  exact for operands below 2^52, and it vectorises where an integer division does not.
* MAX_POOL_2D: the maximum of the covered cells (the stored values: input and output share one
  quantization): the window's rows first, over whole input rows; then each window's columns, 64
  channels per step (``_window_max``).
Both clamp to the fused activation's range. NCHW declines (the reference backend transposes).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hal import quant
from hal.backends.numba_kernels import BACKEND
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.backends.numba_kernels.simd import masked_load, masked_store, splat
from hal.operations.common import QUANT8
from hal.operations.pooling import AVG, MAX, PoolParams
from hal.registry import OperationContext

MAX_CELLS = 1 << 23  # 2^23 · 256 < 2^31: a window's int32 sum cannot overflow


@dataclass
class PoolData:
    is_max: bool
    filter_h: int
    filter_w: int
    stride_h: int
    stride_w: int
    pad_top: int
    pad_left: int
    out_h: int
    out_w: int
    act_min: int
    act_max: int


def supports(ctx: OperationContext) -> str | None:
    p: PoolParams = ctx.params
    if p.nchw:
        return "NCHW layout (the reference backend transposes around its kernel)"
    if ctx.output(0).type not in QUANT8:
        return "output is not 8-bit quantized"
    if min(p.rows.filter, p.rows.size) * min(p.cols.filter, p.cols.size) > MAX_CELLS:
        return f"windows of more than {MAX_CELLS} cells (int32 sums could overflow)"
    return None


def plan(ctx: OperationContext) -> PoolData:
    p: PoolParams = ctx.params
    out = ctx.output(0)
    lo, hi = quant.activation_range_quantized(p.act, out.type, out.scale, out.zero_point)
    return PoolData(p.kind == MAX, p.rows.filter, p.cols.filter, p.rows.stride, p.cols.stride,
                    p.rows.pad_head, p.cols.pad_head, p.rows.out, p.cols.out, lo, hi)


# ---- native kernels ---------------------------------------------------------------------------

I64 = numba.int64
Q8 = (np.int8, np.uint8)
_SIGS = [numba.void(ro(t, 4), *[I64] * 8, rw(t, 4)) for t in Q8]


@intrinsic
def _window_max(typingctx, row, first, count, c, lo, hi, out, o):
    """``out[o + ch] = clamp(max_k row[first + k·c + ch], lo, hi)`` for ch < ``c``, k < ``count``
    (>= 1): a window's columns, 64 channels per step (the last step's lanes past ``c`` masked),
    where a loop over a few dozen channels would stay scalar."""
    sig = types.void(row, first, count, c, lo, hi, out, o)
    signed = row.dtype == types.int8

    def codegen(context, builder, signature, args):
        row_arr, first_v, count_v, c_v, lo_v, hi_v, out_arr, o_v = args
        i8, i64 = ir.IntType(8), ir.IntType(64)
        v8 = ir.VectorType(i8, 64)
        sa = signature.args
        r_ptr = builder.bitcast(context.make_array(sa[0])(context, builder, row_arr).data, i8.as_pointer())
        o_ptr = builder.bitcast(context.make_array(sa[6])(context, builder, out_arr).data, i8.as_pointer())
        lanes = ir.Constant(v8, list(range(64)))
        zero = ir.Constant(v8, [0] * 64)
        lo8, hi8 = (splat(builder, builder.trunc(v, i8), v8) for v in (lo_v, hi_v))

        def above(a, b):
            return builder.icmp_signed(">", a, b) if signed else builder.icmp_unsigned(">", a, b)
        with cgutils.for_range_slice(builder, ir.Constant(i64, 0), c_v, ir.Constant(i64, 64)) as (ch, _):
            left = builder.sub(c_v, ch)
            left = builder.select(builder.icmp_signed("<", left, ir.Constant(i64, 64)), left, ir.Constant(i64, 64))
            keep = builder.icmp_unsigned("<", lanes, splat(builder, builder.trunc(left, i8), v8))
            at = builder.add(first_v, ch)
            best = cgutils.alloca_once_value(builder, masked_load(builder, builder.gep(r_ptr, [at]), v8, keep, zero))
            with cgutils.for_range(builder, builder.sub(count_v, ir.Constant(i64, 1))) as loop:
                k = builder.add(loop.index, ir.Constant(i64, 1))
                v = masked_load(builder, builder.gep(r_ptr, [builder.add(at, builder.mul(k, c_v))]), v8, keep, zero)
                b = builder.load(best)
                builder.store(builder.select(above(v, b), v, b), best)
            b = builder.load(best)
            b = builder.select(above(lo8, b), lo8, b)
            b = builder.select(above(b, hi8), hi8, b)
            masked_store(builder, b, builder.gep(o_ptr, [builder.add(o_v, ch)]), keep)
        return context.get_dummy_value()
    return sig, codegen


_SIGS_MAX = [numba.void(ro(t, 1), *[I64] * 14, rw(t, 1)) for t in Q8]


@njit(_SIGS_MAX, cache=True, nogil=True)
def _max_pool_rows(x, n_b, h, w, c, fh, fw, sh, sw, top, left, out_h, out_w, lo, hi, out):
    """Flat NHWC bytes. Per output row: the maximum over the window's input rows, over whole rows
    (contiguous, vectorised), then over each window's columns (``_window_max``). Indexes are
    unsigned: numba's guard against a negative index would keep the loops scalar."""
    u = np.uint64
    wc = u(w * c)
    row = np.empty(w * c, dtype=x.dtype)
    for n in range(n_b):
        for oy in range(out_h):
            y0 = oy * sh - top
            y1 = min(y0 + fh, h)
            y0 = max(y0, 0)
            base = u((n * h + y0) * w * c)
            j = u(0)
            while j < wc:
                row[j] = x[base + j]
                j += u(1)
            for iy in range(y0 + 1, y1):
                base = u((n * h + iy) * w * c)
                j = u(0)
                while j < wc:
                    a, v = row[j], x[base + j]
                    row[j] = v if v > a else a
                    j += u(1)
            o = (n * out_h + oy) * out_w * c
            for ox in range(out_w):
                x0 = ox * sw - left
                x1 = min(x0 + fw, w)
                x0 = max(x0, 0)
                _window_max(row, x0 * c, x1 - x0, c, lo, hi, out, o)
                o += c


@njit(_SIGS, cache=True, nogil=True)
def _avg_pool(x, fh, fw, sh, sw, top, left, lo, hi, out):
    """One output row at a time: int32 window sums ``acc[ox, :]``, then the rounded division."""
    n_b, h, w, c = x.shape
    out_h, out_w = out.shape[1], out.shape[2]
    acc = np.empty((out_w, c), dtype=np.int32)
    for n in range(n_b):
        for oy in range(out_h):
            y0 = oy * sh - top
            y1 = min(y0 + fh, h)
            y0 = max(y0, 0)
            acc[:] = 0
            for iy in range(y0, y1):
                for ox in range(out_w):
                    x0 = ox * sw - left
                    x1 = min(x0 + fw, w)
                    x0 = max(x0, 0)
                    for ix in range(x0, x1):
                        for ch in range(c):
                            acc[ox, ch] += np.int32(x[n, iy, ix, ch])
            for ox in range(out_w):
                x0 = ox * sw - left
                x1 = min(x0 + fw, w)
                x0 = max(x0, 0)
                count = (y1 - y0) * (x1 - x0)
                half = np.float64(count // 2)
                fcount = np.float64(count)
                for ch in range(c):
                    s = acc[ox, ch]
                    mag = np.int32((np.float64(abs(s)) + half) / fcount)  # exact: operands below 2^31
                    v = -mag if s < 0 else mag
                    out[n, oy, ox, ch] = lo if v < lo else (hi if v > hi else v)


def execute(ctx: OperationContext, inputs: list) -> list:
    d: PoolData = ctx.data
    x = np.ascontiguousarray(inputs[0])
    out = np.empty((x.shape[0], d.out_h, d.out_w, x.shape[3]), dtype=x.dtype)
    if d.is_max:
        n, h, w, c = x.shape
        _max_pool_rows(x.reshape(-1), n, h, w, c, d.filter_h, d.filter_w, d.stride_h, d.stride_w, d.pad_top,
                       d.pad_left, d.out_h, d.out_w, d.act_min, d.act_max, out.reshape(-1))
    else:
        _avg_pool(x, d.filter_h, d.filter_w, d.stride_h, d.stride_w, d.pad_top, d.pad_left, d.act_min, d.act_max,
                  out)
    return [out]


def bind(ctx: OperationContext, inputs: list, outputs: list):
    """``execute`` of the fixed contiguous input into the fixed ``outputs[0]``: a zero-argument runner."""
    d: PoolData = ctx.data
    x, out = inputs[0], outputs[0]
    if x is None or not x.flags.c_contiguous:
        return None
    if d.is_max:
        n, h, w, c = x.shape
        return functools.partial(_max_pool_rows, x.reshape(-1), n, h, w, c, d.filter_h, d.filter_w, d.stride_h,
                                 d.stride_w, d.pad_top, d.pad_left, d.out_h, d.out_w, d.act_min, d.act_max,
                                 out.reshape(-1))
    return functools.partial(_avg_pool, x, d.filter_h, d.filter_w, d.stride_h, d.stride_w, d.pad_top, d.pad_left,
                             d.act_min, d.act_max, out)


BACKEND.register([AVG, MAX], plan=plan, execute=execute, types=QUANT8, supports=supports, bind=bind)
