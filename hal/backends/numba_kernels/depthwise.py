"""Quantized DEPTHWISE_CONV_2D (NHWC, constant filter and bias), bit-exact with the reference.

Depth multiplier 1 with a 3x3 or 5x5 filter (MobileNet's, EfficientNet's), where the CPU has
AVX-512 VNNI, stride 1 or 2 and dilation 1 across, and the filter minus its zero point fits int8
(int8 filters; uint8 ones within 128 of their zero point): for a 3x3 filter ``dw_vnni.dw_plane64_*``,
a whole image's output for 64 channels per call, then ``dw_vnni.dw_row_*`` for the rest (every
channel of a 5x5 filter), 16 of a row per call (borders included); both gather each input column's
rows once into ``vpdpbusd`` operands shared by the pixels that read it. Other depth-multiplier-1
3x3 / 5x5 layers: ``simd.dw_run_*`` (16 channels of a run of pixels per call, the taps unrolled in
vector registers, int32 sums: int16 tap pairs and ``vpdpwssd`` with VNNI). TFLite's requantization
in all of them. Other forms: one scalar native pass
(``_depthwise``). All skip out-of-image taps as TFLite does.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np

from hal.backends.numba_kernels import vnni
from hal.backends.numba_kernels.fixedpoint import clamp, multiply_by_quantized_multiplier, ro, rw
from hal.backends.numba_kernels.gemm import lookup_in_place
from hal.backends.numba_kernels.lazy import njit
from hal.backends.numba_kernels.simd import dw_run_3x3, dw_run_5x5, floor_at_zero_point
from hal.operations.common import QPC
from hal.operations.conv import BIAS, FILTER, INPUT, ConvParams
from hal.registry import OperationContext

I64 = numba.int64
Q8 = (np.int8, np.uint8)
_NO_TABLE = np.zeros(0, dtype=np.uint8)
_NO_ROWS64 = (np.zeros(0, dtype=np.int8), *[np.zeros(0, dtype=np.int32)] * 4)


@dataclass
class DepthwiseData:
    weights: np.ndarray  # [fh, fw, out_c] int32: filter minus its zero point
    bias: np.ndarray  # [out_c] int32
    input_zp: int
    multiplier: int  # depth multiplier
    multipliers: np.ndarray
    shifts: np.ndarray
    output_zp: int
    act_min: int
    act_max: int
    stride_h: int
    stride_w: int
    dilation_h: int
    dilation_w: int
    pad_top: int
    pad_left: int
    out_h: int
    out_w: int
    #: For simd.dw_pixel_* (depth multiplier 1, 3x3 or 5x5 filter), padded to a multiple of 16
    #: channels: weights [fh·fw·cp], bias, multiplier, left shift, right shift (int32). Else None.
    lanes: tuple | None = None
    #: For dw_vnni.dw_row_* (AVX-512 VNNI; depth multiplier 1, 3x3 or 5x5, dilation 1 across,
    #: stride 1 or 2 across, filter minus zero point within int8), padded to whole 16 channels:
    #: weights (int8 [fw, groups, cp, 4]) and bias; the rest as ``lanes``'. Else None.
    rows: tuple | None = None
    #: For dw_vnni.dw_plane64_* (where ``rows`` is set, for a 3x3 filter and 64 channels or more: a
    #: 5x5 one's carried columns outnumber the registers, and dw_row is faster there): the
    #: whole 64s of channels of ``rows`` and ``lanes``' weights, bias, multiplier, left and right
    #: shift, in its channel order (``_rows64``). Else None.
    rows64: tuple | None = None
    #: 0 where simd.floor_at_zero_point holds (dw_row's cheaper requantization), else 1
    general: int = 1


def _lanes(w: np.ndarray, bias: np.ndarray, input_zp: int, mult: np.ndarray, shift: np.ndarray) -> tuple:
    """simd.dw_run's arrays. Its out-of-image taps read the input zero point, so the bias holds
    bias − zp·Σw over every tap (mod 2^32, as the int32 accumulator) and each tap adds x·w. The
    weights (filter minus its zero point: within ±255) are int16 tap pairs where the CPU has
    AVX-512 VNNI, else int32 per tap."""
    fh, fw, c = w.shape
    cp = -(-c // 16) * 16
    mult = np.asarray(mult, dtype=np.int64)
    assert ((mult >= 0) & (mult < 1 << 31)).all(), "QuantizeMultiplier's range (simd.requantize_lanes relies on it)"
    folded = bias.astype(np.int64) - input_zp * w.reshape(-1, c).astype(np.int64).sum(axis=0)
    bias = ((folded + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)

    def pad(v):
        out = np.zeros(v.shape[:-1] + (cp,), dtype=np.int32)
        out[..., :c] = v
        return out
    shift = np.asarray(shift, dtype=np.int64)
    taps = pad(w).reshape(fh * fw, cp)
    if vnni.AVAILABLE:  # pairs of taps interleaved per channel: [pair, channel, 2] int16
        pairs = np.zeros(((fh * fw + 1) // 2, cp, 2), dtype=np.int16)
        pairs[:, :, 0] = taps[0::2]
        pairs[:fh * fw // 2, :, 1] = taps[1::2]
        packed = pairs.reshape(-1)
    else:
        packed = taps.reshape(-1)
    return (packed, pad(bias), pad(mult), pad(np.maximum(shift, 0)),
            pad(np.maximum(-shift, 0)))


def _rows(w: np.ndarray, bias: np.ndarray, input_zp: int, signed: bool) -> tuple | None:
    """dw_vnni.dw_row's arrays, or None where a filter byte minus its zero point leaves int8. Its
    out-of-image cells read the zero point's byte, which ``vpdpbusd`` sees unsigned (+ 128 for
    int8): the bias holds bias − that value·Σw (mod 2^32, as the int32 accumulator)."""
    if w.size and (w.min() < -128 or w.max() > 127):
        return None
    fh, fw, c = w.shape
    cp = -(-c // 16) * 16
    groups = -(-fh // 4)
    packed = np.zeros((fw, groups, cp, 4), dtype=np.int8)
    for fy in range(fh):
        packed[:, fy // 4, :c, fy % 4] = w[fy].astype(np.int8)
    unsigned_zp = input_zp + 128 if signed else input_zp
    folded = bias.astype(np.int64) - unsigned_zp * w.reshape(-1, c).astype(np.int64).sum(axis=0)
    folded = ((folded + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)
    padded = np.zeros(cp, dtype=np.int32)
    padded[:c] = folded
    return packed.reshape(-1), padded


def _rows64(c: int, w: np.ndarray, bias: np.ndarray, mult: np.ndarray, left: np.ndarray, right: np.ndarray) \
        -> tuple | None:
    """dw_plane64's arrays from dw_row's (``w`` [fw, groups, cp, 4], the rest [cp]): the whole 64s of
    the ``c`` channels, where position 64b + 16v + 4L + j holds channel 64b + 16L + 4v + j (lane 4L + j
    of vector v: the order x86's unpacks put a block's 64 input channels in). None under 64 channels."""
    c64 = c // 64 * 64
    if c64 == 0:
        return None
    b, v, lane, j = np.unravel_index(np.arange(c64), (c64 // 64, 4, 4, 4))
    order = 64 * b + 16 * lane + 4 * v + j
    return (np.ascontiguousarray(w[:, :, order]).reshape(-1),
            *(np.ascontiguousarray(a[order]) for a in (bias, mult, left, right)))


def plan(ctx: OperationContext, mult: np.ndarray, shift: np.ndarray, ozp: int, lo: int, hi: int,
         geometry: dict) -> DepthwiseData:
    p: ConvParams = ctx.params
    w = ctx.input(FILTER).value  # [1, fh, fw, out_c]
    wzp = 0 if ctx.input(FILTER).type == QPC else ctx.input(FILTER).zero_point
    weights = np.ascontiguousarray((w.astype(np.int32) - wzp).reshape(w.shape[1], w.shape[2], -1))
    bias = ctx.input(BIAS).value.astype(np.int32)
    x_zp = ctx.input(INPUT).zero_point
    vector = p.multiplier == 1 and w.shape[1] == w.shape[2] and w.shape[1] in (3, 5)
    signed = ctx.input(INPUT).dtype == np.int8
    by_rows = vector and vnni.AVAILABLE and geometry["dilation_w"] == 1 and geometry["stride_w"] in (1, 2)
    lanes = _lanes(weights, bias, x_zp, mult, shift) if vector else None
    rows = _rows(weights, bias, x_zp, signed) if by_rows else None
    rows64 = None
    if rows is not None and weights.shape[0] == 3 and weights.shape[2] >= 64:
        rows64 = _rows64(weights.shape[2], rows[0].reshape(w.shape[2], -1, lanes[1].shape[0], 4), rows[1], *lanes[2:])
    return DepthwiseData(weights, bias, x_zp, p.multiplier, mult, shift, ozp, lo, hi, **geometry,
                         lanes=lanes, rows=rows, rows64=rows64,
                         general=0 if floor_at_zero_point(np.maximum(shift, 0), ozp, lo) else 1)


def execute(d: DepthwiseData, x: np.ndarray, table: np.ndarray = _NO_TABLE) -> np.ndarray:
    """``x``: contiguous NHWC; ``table``: 256 bytes looked up on the output (or empty)."""
    n = x.shape[0]
    out = np.empty((n, d.out_h, d.out_w, d.weights.shape[2]), dtype=x.dtype)
    if d.rows is not None:
        fh = d.weights.shape[0]
        _depthwise_rows(x.reshape(-1), *d.rows, *d.lanes[2:], *(d.rows64 or _NO_ROWS64), n, x.shape[1], x.shape[2],
                        x.shape[3], fh, d.input_zp, 0x80 if x.dtype == np.int8 else 0, d.output_zp, d.act_min,
                        d.act_max, d.stride_h, d.stride_w, d.dilation_h, d.pad_top, d.pad_left, d.out_h, d.out_w,
                        d.general, out.reshape(-1), table)
    elif d.lanes is not None:
        fh, fw, _ = d.weights.shape
        _depthwise_pixels(x.reshape(-1), *d.lanes, n, x.shape[1], x.shape[2], x.shape[3], fh, fw, d.input_zp,
                          d.output_zp, d.act_min, d.act_max, d.stride_h, d.stride_w, d.dilation_h, d.dilation_w,
                          d.pad_top, d.pad_left, d.out_h, d.out_w, out.reshape(-1), table)
    else:
        _depthwise(x, d.weights, d.bias, d.input_zp, d.multiplier, d.multipliers, d.shifts, d.output_zp,
                   d.act_min, d.act_max, d.stride_h, d.stride_w, d.dilation_h, d.dilation_w, d.pad_top,
                   d.pad_left, out)
        if table.size:
            lookup_in_place(out.reshape(-1).view(np.uint8), 0, out.size, table)
    return out


def bind(d: DepthwiseData, x: np.ndarray, out: np.ndarray, table: np.ndarray = _NO_TABLE):
    """``execute`` of the fixed contiguous ``x`` into the fixed ``out`` as a zero-argument runner."""
    n = x.shape[0]
    if d.rows is not None:
        fh = d.weights.shape[0]
        return functools.partial(
            _depthwise_rows, x.reshape(-1), *d.rows, *d.lanes[2:], *(d.rows64 or _NO_ROWS64), n, x.shape[1],
            x.shape[2], x.shape[3], fh, d.input_zp, 0x80 if x.dtype == np.int8 else 0, d.output_zp, d.act_min,
            d.act_max, d.stride_h, d.stride_w, d.dilation_h, d.pad_top, d.pad_left, d.out_h, d.out_w, d.general,
            out.reshape(-1), table)
    if d.lanes is not None:
        fh, fw, _ = d.weights.shape
        return functools.partial(
            _depthwise_pixels, x.reshape(-1), *d.lanes, n, x.shape[1], x.shape[2], x.shape[3], fh, fw, d.input_zp,
            d.output_zp, d.act_min, d.act_max, d.stride_h, d.stride_w, d.dilation_h, d.dilation_w, d.pad_top,
            d.pad_left, d.out_h, d.out_w, out.reshape(-1), table)
    if table.size:
        return None
    return functools.partial(_depthwise, x, d.weights, d.bias, d.input_zp, d.multiplier, d.multipliers, d.shifts,
                             d.output_zp, d.act_min, d.act_max, d.stride_h, d.stride_w, d.dilation_h, d.dilation_w,
                             d.pad_top, d.pad_left, out)


_SIGS_DW = [numba.void(ro(t, 4), ro(np.int32, 3), ro(np.int32, 1), I64, I64, ro(np.int64, 1), ro(np.int64, 1),
                       *[I64] * 9, rw(t, 4)) for t in Q8]


@njit(_SIGS_DW, cache=True, nogil=True)
def _depthwise(x, w, bias, input_zp, depth_mult, mult, shift, out_zp, lo, hi, sh, sw, dh, dw, top, left, out):
    n_b, h, width, c = x.shape
    fh, fw, out_c = w.shape
    out_h, out_w = out.shape[1], out.shape[2]
    acc = np.empty(out_c, dtype=np.int32)
    for n in range(n_b):
        for oy in range(out_h):
            for ox in range(out_w):
                acc[:] = bias
                for fy in range(fh):
                    iy = oy * sh - top + fy * dh
                    if iy < 0 or iy >= h:
                        continue
                    for fx in range(fw):
                        ix = ox * sw - left + fx * dw
                        if ix < 0 or ix >= width:
                            continue
                        if depth_mult == 1:
                            for ch in range(c):
                                acc[ch] += (np.int32(x[n, iy, ix, ch]) - np.int32(input_zp)) * w[fy, fx, ch]
                        else:
                            for ch in range(c):
                                xv = np.int32(x[n, iy, ix, ch]) - np.int32(input_zp)
                                for m in range(depth_mult):
                                    acc[ch * depth_mult + m] += xv * w[fy, fx, ch * depth_mult + m]
                for oc in range(out_c):
                    v = multiply_by_quantized_multiplier(np.int64(acc[oc]), mult[oc], shift[oc]) + out_zp
                    out[n, oy, ox, oc] = clamp(v, lo, hi)


#: int32 weights: one multiply per tap; int16 weights (VNNI, the only kind _lanes packs there): taps
#: in pairs, one vpdpwssd each.
_SIGS_DW_PIXELS = [numba.void(ro(t, 1), ro(np.int16 if vnni.AVAILABLE else np.int32, 1), ro(np.int32, 1),
                              ro(np.int32, 1), ro(np.int32, 1), ro(np.int32, 1), *[I64] * 18, rw(t, 1),
                              ro(np.uint8, 1)) for t in Q8]


@njit(_SIGS_DW_PIXELS, cache=True, nogil=True)
def _depthwise_pixels(x, w, bias, mult, left, right, n_b, h, width, c, fh, fw, input_zp, out_zp, lo, hi, sh, sw, dh,
                      dw, top, left_pad, out_h, out_w, out, table):
    """DEPTHWISE_CONV_2D with depth multiplier 1 and a 3x3 or 5x5 filter (flat NHWC ``x`` and
    ``out``; ``_lanes``' padded weights and per-channel arrays): per output row, the columns whose
    taps are all inside the image in one ``simd.dw_run_*`` call per 16 channels, the border
    columns one by one with their tap masks (the row's bits and the column's). ``table`` (256
    bytes, or empty): looked up on each output row once it is complete."""
    cp = bias.shape[0]
    col_bits = np.zeros(out_w, dtype=np.int64)
    all_cols = np.int64(0)
    for fx in range(fw):
        for fy in range(fh):
            all_cols |= np.int64(1) << (fy * fw + fx)
    inner_lo, inner_hi = out_w, out_w
    for ox in range(out_w):
        for fx in range(fw):
            ix = ox * sw - left_pad + fx * dw
            if 0 <= ix < width:
                for fy in range(fh):
                    col_bits[ox] |= np.int64(1) << (fy * fw + fx)
        if col_bits[ox] == all_cols:
            if inner_lo == out_w:
                inner_lo = ox
            inner_hi = ox + 1
    row_step, col_step, x_step = dh * width * c, dw * c, sw * c
    for n in range(n_b):
        for oy in range(out_h):
            row_bits = np.int64(0)
            for fy in range(fh):
                iy = oy * sh - top + fy * dh
                if 0 <= iy < h:
                    for fx in range(fw):
                        row_bits |= np.int64(1) << (fy * fw + fx)
            base = (n * h + oy * sh - top) * width
            o_row = (n * out_h + oy) * out_w
            ox = 0
            while ox < out_w:
                npix = inner_hi - ox if ox == inner_lo else 1
                valid = row_bits & col_bits[ox]
                x_off = (base + ox * sw - left_pad) * c
                o_off = (o_row + ox) * c
                if fh == 3:
                    for ch in range(0, c, 16):
                        dw_run_3x3(x, x_off, x_step, row_step, col_step, valid, input_zp, w, cp, bias, mult, left,
                                   right, ch, out_zp, lo, hi, out, o_off, c, c - ch, npix)
                else:
                    for ch in range(0, c, 16):
                        dw_run_5x5(x, x_off, x_step, row_step, col_step, valid, input_zp, w, cp, bias, mult, left,
                                   right, ch, out_zp, lo, hi, out, o_off, c, c - ch, npix)
                ox += npix
            if table.shape[0] == 256:
                lookup_in_place(out.view(np.uint8), o_row * c, out_w * c, table)


_ROW_ARRAYS = (ro(np.int8, 1), ro(np.int32, 1), ro(np.int32, 1), ro(np.int32, 1), ro(np.int32, 1))
_SIGS_DW_ROWS = [numba.void(ro(t, 1), *_ROW_ARRAYS, *_ROW_ARRAYS, *[I64] * 18, rw(t, 1), ro(np.uint8, 1))
                 for t in Q8]


if vnni.AVAILABLE:
    from hal.backends.numba_kernels.dw_vnni import (
        dw_plane64_3x3_s1,
        dw_plane64_3x3_s2,
        dw_row_3x3_s1,
        dw_row_3x3_s2,
        dw_row_5x5_s1,
        dw_row_5x5_s2,
    )

    @njit(_SIGS_DW_ROWS, cache=True, nogil=True)
    def _depthwise_rows(x, w, bias, mult, left, right, w64, bias64, mult64, left64, right64, n_b, h, width, c, fh,
                        input_zp, xor, out_zp, lo, hi, sh, sw, dh, top, left_pad, out_h, out_w, general, out, table):
        """DEPTHWISE_CONV_2D with depth multiplier 1, a 3x3 or 5x5 filter, dilation 1 across and
        stride 1 or 2 across (flat NHWC ``x`` and ``out``; ``_rows``' and ``_rows64``' arrays): per
        image, one ``dw_vnni.dw_plane64_3x3_*`` call per whole 64 channels of ``bias64`` (empty for
        5x5 filters), then per output row one ``dw_row_*`` call per 16 of the rest, borders included.
        ``table`` (256 bytes, or empty): looked up on each image's output once it is complete."""
        cp, c64 = bias.shape[0], bias64.shape[0]
        w_step, w64_step = cp * 4, c64 * 4
        row_step = dh * width * c
        zp = input_zp & 0xFF
        for n in range(n_b):
            x_img, o_img = n * h * width * c, n * out_h * out_w * c
            for ch in range(0, c64, 64):
                if sw == 1:
                    dw_plane64_3x3_s1(x, x_img, h, width, c, sh, dh, top, -left_pad, zp, w64, w64_step, bias64, mult64,
                                      left64, right64, ch, out_zp, lo, hi, out, o_img, out_h, out_w, 64, general)
                else:
                    dw_plane64_3x3_s2(x, x_img, h, width, c, sh, dh, top, -left_pad, zp, w64, w64_step, bias64, mult64,
                                      left64, right64, ch, out_zp, lo, hi, out, o_img, out_h, out_w, 64, general)
            for oy in range(out_h if c64 < c else 0):
                iy0 = oy * sh - top
                row_bits = np.int64(0)
                for fy in range(fh):
                    if 0 <= iy0 + fy * dh < h:
                        row_bits |= np.int64(1) << fy
                row0 = x_img + iy0 * width * c
                o_off = o_img + oy * out_w * c
                for ch in range(c64, c, 16):
                    if fh == 3 and sw == 1:
                        dw_row_3x3_s1(x, row0, row_bits, row_step, -left_pad, width, c, zp, xor, w, w_step, bias,
                                      mult, left, right, ch, out_zp, lo, hi, out, o_off, c - ch, out_w, general)
                    elif fh == 3:
                        dw_row_3x3_s2(x, row0, row_bits, row_step, -left_pad, width, c, zp, xor, w, w_step, bias,
                                      mult, left, right, ch, out_zp, lo, hi, out, o_off, c - ch, out_w, general)
                    elif sw == 1:
                        dw_row_5x5_s1(x, row0, row_bits, row_step, -left_pad, width, c, zp, xor, w, w_step, bias,
                                      mult, left, right, ch, out_zp, lo, hi, out, o_off, c - ch, out_w, general)
                    else:
                        dw_row_5x5_s2(x, row0, row_bits, row_step, -left_pad, width, c, zp, xor, w, w_step, bias,
                                      mult, left, right, ch, out_zp, lo, hi, out, o_off, c - ch, out_w, general)
            if table.shape[0] == 256:
                lookup_in_place(out.view(np.uint8), o_img, out_h * out_w * c, table)
