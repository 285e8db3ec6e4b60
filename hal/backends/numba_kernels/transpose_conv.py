"""Quantized TRANSPOSE_CONV_2D (uint8 / int8 input, per-tensor or per-channel filter; NHWC,
constant filter and bias), bit-exact with the reference backend.

The reference kernel's scatter, made exact in float32 and gathered per output row:

1. ``taps = A @ W`` in float32 BLAS: A the input pixels minus the input zero point [pixels, C_in],
   W the filter minus its zero point [C_in, fh*fw*C_out]. Each entry is one input pixel's
   contribution through one filter tap: a sum of C_in integer products, exact while
   C_in * max|product| < 2^24 (C_in is split into chunks beyond that, summed in int64).
2. One native pass over the output rows: the taps reaching each output pixel (those whose input
   row and column exist) summed as integers in int32, the bias added, TFLite's
   MultiplyByQuantizedMultiplier, the output zero point and the activation clamp. The reference
   sums the same integers in float64 (exact) and wraps the (shifted) sum to int32 when it
   requantizes, which int32 accumulators reproduce: the results are identical.

The output rows go in bands, each band's taps computed from the input rows reaching it into one
buffer reused from band to band (rows shared with the previous band are kept, not recomputed):
no large fresh array to fault in at every execution, and the taps stay in cache for step 2.
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from hal import quant
from hal.backends.numba_kernels import BACKEND
from hal.backends.numba_kernels.fixedpoint import clamp, multiply_by_quantized_multiplier, multiply_right_shift, ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.operations.common import QPC, QU8, QUANT8
from hal.operations.transpose_conv import BIAS, FILTER, INPUT, TRANSPOSE_CONV, TransposeConvParams
from hal.registry import OperationContext


@dataclass
class TransposeConvData:
    weights: np.ndarray  # [C_in, fh * fw * C_out] float32: filter minus its zero point, columns (fy, fx, oc)
    bias: np.ndarray  # [C_out] int32
    chunks: np.ndarray  # C_in split points: each chunk's sums are exact in float32
    input_zp: int
    multipliers: np.ndarray  # [C_out] int64
    shifts: np.ndarray  # [C_out] int64
    right_only: bool  # every shift <= 0 and multiplier >= 0: the int32 fast requantization applies
    output_zp: int
    act_min: int
    act_max: int
    filter_h: int
    filter_w: int
    stride_h: int
    stride_w: int
    pad_top: int
    pad_left: int
    out_h: int
    out_w: int
    out_c: int


def supports(ctx: OperationContext) -> str | None:
    if ctx.params.nchw:
        return "NCHW layout (the reference backend transposes around its kernel)"
    if not (ctx.input(FILTER).is_constant and ctx.input(BIAS).is_constant):
        return "filter or bias is not a constant"
    return None


def plan(ctx: OperationContext) -> TransposeConvData:
    p: TransposeConvParams = ctx.params
    x, w, out = ctx.input(INPUT), ctx.input(FILTER), ctx.output(0)
    out_c, fh, fw, c_in = w.shape
    wzp = 0 if w.type == QPC else w.zero_point
    wq = w.value.astype(np.int64) - wzp
    packed = np.ascontiguousarray(wq.transpose(3, 1, 2, 0).reshape(c_in, fh * fw * out_c).astype(np.float32))
    qmin, qmax = quant.quant_range(x.type)
    max_product = max(1, max(x.zero_point - qmin, qmax - x.zero_point) * max(1, int(np.abs(wq).max())))
    chunks = np.array(quant.exact_float32_chunks(c_in, max_product), dtype=np.int64)
    scales = w.channel_scales if w.type == QPC else [w.scale] * out_c
    mult, shift = quant.conv_multipliers(x.scale, scales, out.scale, x.type == QU8 and w.type == QU8)
    lo, hi = quant.activation_range_quantized(p.act, out.type, out.scale, out.zero_point)
    right_only = bool((shift <= 0).all() and (mult >= 0).all())
    return TransposeConvData(packed, ctx.input(BIAS).value.astype(np.int32).reshape(-1), chunks, int(x.zero_point),
                             mult, shift, right_only, int(out.zero_point), int(lo), int(hi), fh, fw, p.stride_h,
                             p.stride_w, p.pad_top, p.pad_left, p.out_h, p.out_w, out_c)


# ---- native kernels ---------------------------------------------------------------------------

I64, F32 = numba.int64, numba.float32
Q8 = (np.int8, np.uint8)
_SIGS_CAST = [numba.void(ro(t, 2), I64, rw(np.float32, 2)) for t in Q8]


@njit(_SIGS_CAST, cache=True, nogil=True)
def _to_float(x, zp, out):
    """out = x - zp (exact in float32)."""
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = np.float32(np.int64(x[i, j]) - zp)


_SIGS_GATHER = [numba.void(ro(acc, 2), I64, I64, ro(np.int32, 1), ro(np.int64, 1), ro(np.int64, 1),
                           numba.boolean, *[I64] * 11, rw(t, 3))
                for acc in (np.float32, np.int32) for t in Q8]


@njit(_SIGS_GATHER, cache=True, nogil=True)
def _gather(taps, h, w, bias, mult, shift, right_only, out_zp, lo, hi, fh, fw, sh, sw, top, left, oy0, i0, out):
    """out[n, oy, (ox, oc)] = requantize(bias[oc] + sum of the taps reaching output (oy0 + oy, ox)).

    ``taps[(n, i - i0, j), (fy, fx, oc)]``: input pixel (i, j)'s contribution to canvas cell
    (i * sh + fy, j * sw + fx), for the input rows from i0 that reach the output rows ``out``
    holds; output (oy, ox) is canvas cell (oy + top, ox + left). One output
    row at a time: each input pixel of the rows reaching it adds its filter row's taps, a
    contiguous run over (fx, oc), into int32 accumulators (wrapping as TFLite's int32 accumulator
    does: the reference wraps the same sums when it requantizes), then the whole row is
    requantized in one flat loop."""
    out_c = bias.shape[0]
    n_b, out_h, row_len = out.shape
    out_w = row_len // out_c
    acc = np.empty(row_len, dtype=np.int32)
    bias_row = np.empty(row_len, dtype=np.int32)
    mult_row = np.empty(row_len, dtype=np.int32)
    exp_row = np.empty(row_len, dtype=np.int64)
    for k in range(row_len):
        bias_row[k] = bias[k % out_c]
        mult_row[k] = np.int32(mult[k % out_c])
        exp_row[k] = -shift[k % out_c]
    for n in range(n_b):
        for oy in range(out_h):
            acc[:] = bias_row
            r = oy0 + oy + top
            for fy in range(r % sh, fh, sh):
                i = (r - fy) // sh
                if i < 0:
                    break
                if i >= h:
                    continue
                base = (n * h + i - i0) * w
                for j in range(w):
                    ox0 = j * sw - left
                    a = max(0, ox0)
                    b = min(out_w, ox0 + fw)
                    if a >= b:
                        continue
                    dst = acc[a * out_c:]  # views: loop indices from 0 let the loop vectorise
                    src = taps[base + j, (fy * fw + a - ox0) * out_c:]
                    for k in range((b - a) * out_c):
                        dst[k] += np.int32(src[k])
            if right_only:
                for k in range(row_len):
                    q = multiply_right_shift(np.int64(acc[k]), np.int64(mult_row[k]), exp_row[k]) + out_zp
                    out[n, oy, k] = clamp(q, lo, hi)
            else:
                for k in range(row_len):
                    q = multiply_by_quantized_multiplier(np.int64(acc[k]), mult[k % out_c], shift[k % out_c])
                    out[n, oy, k] = clamp(q + out_zp, lo, hi)


# ---- execute ----------------------------------------------------------------------------------

def _taps(d: TransposeConvData, a: np.ndarray) -> np.ndarray:
    if len(d.chunks) == 2:
        return a @ d.weights  # one exact float32 GEMM
    acc = np.zeros((a.shape[0], d.weights.shape[1]), dtype=np.int64)
    for k0, k1 in zip(d.chunks[:-1], d.chunks[1:]):
        acc += (a[:, k0:k1] @ d.weights[k0:k1]).astype(np.int64)  # exact integers
    return acc.astype(np.int32)  # wrapped as the int32 accumulators wrap


#: Taps per band (float32 elements): a band of output rows takes the GEMM of the input rows that
#: reach it, into one buffer reused from band to band (no large fresh allocation to fault in).
BAND_TAPS = 1 << 17


def execute(ctx: OperationContext, inputs: list) -> list:
    d: TransposeConvData = ctx.data
    x = np.ascontiguousarray(inputs[INPUT])
    n, h, w, c = x.shape
    x2 = x.reshape(n * h * w, c)
    out = np.empty((n, d.out_h, d.out_w, d.out_c), dtype=x.dtype)  # the output has the input's type
    rows = out.reshape(n, d.out_h, d.out_w * d.out_c)
    args = (h, w, d.bias, d.multipliers, d.shifts, d.right_only, d.output_zp, d.act_min, d.act_max, d.filter_h,
            d.filter_w, d.stride_h, d.stride_w, d.pad_top, d.pad_left)
    if len(d.chunks) > 2:  # long reductions: all taps at once, summed exactly over the chunks
        a = np.empty((n * h * w, c), dtype=np.float32)
        _to_float(x2, d.input_zp, a)
        _gather(_taps(d, a), *args, 0, 0, rows)
        return [out]
    sh, fh, top = d.stride_h, d.filter_h, d.pad_top
    cols = d.weights.shape[1]
    band = max(1, BAND_TAPS // max(1, w * cols)) * sh  # output rows per band
    cap = ((min(band, d.out_h) + fh - 2) // sh + 2) * w  # input pixels a band can need
    a = np.empty((cap, c), dtype=np.float32)
    taps = np.empty((cap, cols), dtype=np.float32)
    for b in range(n):
        start = done = 0  # taps holds the input rows [start, done) of batch b
        for oy0 in range(0, d.out_h, band):
            oy1 = min(d.out_h, oy0 + band)
            i0 = max(0, -((fh - 1 - oy0 - top) // sh))  # the input rows reaching output rows [oy0, oy1)
            i1 = max(i0, min(h, (oy1 - 1 + top) // sh + 1))
            keep = max(0, done - i0)  # computed for the previous band (bands overlap by < fh / sh rows)
            if keep:
                taps[:keep * w] = taps[(i0 - start) * w:(done - start) * w]
            new = (i1 - i0 - keep) * w
            first = (b * h + i0 + keep) * w
            _to_float(x2[first:first + new], d.input_zp, a[:new])
            np.matmul(a[:new], d.weights, out=taps[keep * w:(i1 - i0) * w])
            _gather(taps[:(i1 - i0) * w], *args, oy0, i0, rows[b:b + 1, oy0:oy1])
            start, done = i0, i1
    return [out]


BACKEND.register(TRANSPOSE_CONV, plan=plan, execute=execute, types=QUANT8, supports=supports,
                 prepacked_inputs=(FILTER, BIAS))
