"""Float32 CONV_2D (NHWC) on fc_float's register tiles, and the ``conv_epilogue`` fusion: a
convolution's residual ADD and its PRELU applied to its sums in registers, before they are stored.

Why: a float CNN's 1x1 convolutions are matrix products of the NHWC activations (rows: pixels;
columns: channels) by the filter, which fc_float's tiles compute at the core's fused multiply-add
rate (8 rows × 32 output channels of sums in registers, each weight vector loaded once for the 8
rows; on AVX2 in parts of at most 6 × 16, fc_float's ``tile_passes``). Run here rather than in
onnxruntime, the layer's output never changes layout, and what follows it in a landmark network
(the residual ADD, then a per-channel PRELU) is applied to the sums still in registers
(fc_float's fused tiles; pixels gathered at an image's edge: to the rows just computed, in one
pass) instead of as two more passes over memory.

How the rows are found (the geometry's ``mode``, ``FIELDS``):
- ``IN_PLACE``: a 1x1, stride-1, unpadded convolution: the input is already the rows, K = C.
- ``WHOLE_ROWS``: a convolution as wide as its input, unpadded, one output column (a landmark
  head: a kernel the size of the feature map): each output row reads kh whole input rows, which
  are contiguous in NHWC: the row is read in place, K = kh·W·C.
- ``GATHERED``: any other geometry (a stem's 3x3 stride 2, dilation), K = kh·kw·C, one output
  row at a time. Where the row's windows lie inside the image (dilation 1), each is read in
  place as kh runs of kw·C floats (fc_float's window tiles); the others (an edge's padding,
  dilation) are gathered into a scratch row each (zeros outside the image: NNAPI pads with
  zeros), then multiplied. A 3-channel stem's window is three runs of 9 floats: gathering them
  cost as much as the multiplication.
The filter [out, kh, kw, C] is that K-major matrix; it is packed at plan time as fc_float packs
a FULLY_CONNECTED layer's. Column tiles are taken in groups whose weights fit the L1 cache
(``GROUP_BYTES``), every block of rows passing a group before the next group starts, so a
layer with megabytes of weights streams them once per 64 rows (``CHUNK``), not once per 8.

Sums are float32 in K order (TFLite's float kernels and onnxruntime's accumulate in float32 too);
the reference backend sums in float64: within NNAPI's float32 tolerance
(tests/backends/test_numba_f32_conv.py compares).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numba
import numpy as np

from hal import quant
from hal.backends.numba_kernels import BACKEND, fc_float
from hal.backends.numba_kernels.f32_activations import _hard_swish_run, _swish_run, activation_of, output_of
from hal.backends.numba_kernels.f32_elementwise import F32Binary
from hal.backends.numba_kernels.f32_lanes import ACT_HARD_SWISH, ACT_SWISH
from hal.backends.numba_kernels.f32_layout import PADS, image_of
from hal.backends.numba_kernels.fc_float import (
    LANES,
    TILE,
    _fused_narrow,
    _fused_tile,
    _narrow,
    _tile,
    _window_narrow,
    _window_tile,
)
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.backends.numba_kernels.simd import copy_bytes, fill_copy
from hal.operations.conv import BIAS, FILTER, INPUT, ConvParams
from hal.registry import OperationContext
from hal.types import OperandType, OperationType

CONV = OperationType.CONV_2D
F32 = OperandType.TENSOR_FLOAT32
IN_PLACE, WHOLE_ROWS, GATHERED = 0, 1, 2
#: Weights of one group of column tiles: at most this many bytes (an L1 cache's share).
GROUP_BYTES = 32 * 1024
#: Rows of a 1x1 layer computed per pass of a column group (its weights stay in L1 meanwhile).
CHUNK = 64
#: The row counts a block of rows is compiled for (``_row_split``).
ROW_BLOCKS = (8, 7, 6, 5, 4, 2, 1)
#: ``Geometry`` as the kernels read it: int64 fields in this order.
FIELDS = ("batch", "h", "w", "c", "kh", "kw", "sh", "sw", "dh", "dw", "pt", "pl", "oh", "ow", "out_c", "mode",
          "group")
#: Epilogue flags; bits 2-3: the activation (f32_lanes' ``ACT_*``, ``ACT_SHIFT``).
RESIDUAL, ALPHA = 1, 2
ACT_SHIFT = 2


_I64 = numba.int64
_F32 = numba.float32
_RO, _RW, _GEOMETRY = ro(np.float32, 1), rw(np.float32, 1), ro(np.int64, 1)
_GEMM_SIG = [numba.void(_RO, _I64, _I64, _I64, _RO, _RO, _I64, _F32, _F32, _RW, _I64, _I64)]
_BLOCK_SIG = [numba.void(_RO, _I64, _I64, _RO, _RO, _I64, _F32, _F32, _RW, _I64, _I64, _I64)]
_WINDOW_BLOCK_SIG = [numba.void(_RO, _I64, _I64, _RO, _RO, _I64, _F32, _F32, _RW, _I64, _I64, _I64, _I64, _I64,
                                _I64)]
_WINDOWS_SIG = [numba.void(_RO, _I64, _I64, _I64, _RO, _RO, _I64, _F32, _F32, _RW, _I64, _I64, _I64, _I64, _I64, _RO,
                           _RO, _I64, _F32, _F32)]
_FUSED_BLOCK_SIG = [numba.void(_RO, _I64, _I64, _RO, _RO, _I64, _F32, _F32, _RW, _I64, _I64, _I64, _I64, _I64, _I64,
                               _RO, _RO, _I64, _F32, _F32)]


def _block_of(rows: int):
    """Column tiles t0..t1 of ``rows`` rows (a constant of the compiled code, as fc_float's chains)."""

    @njit(_BLOCK_SIG, cache=True, nogil=True)
    def block(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1):
        for t in range(t0, t1):
            count = min(TILE, n - t * TILE)
            if count <= LANES:  # the last tile, packed LANES wide
                _narrow(rows, w, t * k * TILE, a, a_off, k, bias, t * TILE, lo, hi, out, o_off + t * TILE, n, count, 0)
            else:
                _tile(rows, w, t * k * TILE, a, a_off, k, bias, t * TILE, lo, hi, out, o_off + t * TILE, n, count, 0)
    return block


_B8, _B7, _B6, _B5, _B4, _B2, _B1 = (_block_of(r) for r in ROW_BLOCKS)
#: fc_float's one-row layer (its whole tiles as several weight streams).
_FC_ROW = fc_float.CHAINS[0]


@njit([numba.types.UniTuple(_I64, 3)(_I64)], cache=True, nogil=True)
def _row_split(rows: int) -> tuple[int, int, int]:
    """``rows`` as (whole 8-row blocks, then a block of ``a`` rows, then one of ``b``; 0: none),
    each tail block at least 4 rows where ``rows`` allows: a block of r rows keeps 2·r chains of
    sums, and fewer than 8 chains leave the fused multiply-adds waiting on each other's latency
    (a 1-row block takes half an 8-row block's time). 49 rows (a 7x7 map): 5 blocks of 8, then 4
    and 5, not 6 of 8 and a lone row."""
    full, rem = rows // 8, rows % 8
    if 0 < rem < 4 and full > 0:
        full, rem = full - 1, rem + 8
    if rem > 8:
        return full, rem // 2, rem - rem // 2
    if rem == 3:
        return full, 2, 1
    return full, rem, 0


@njit([numba.void(*_BLOCK_SIG[0].args, _I64)], cache=True, nogil=True)
def _block(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, rows):
    """``_block_of(rows)``'s block (``rows`` in ROW_BLOCKS)."""
    if rows == 8:
        _B8(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1)
    elif rows == 7:
        _B7(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1)
    elif rows == 6:
        _B6(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1)
    elif rows == 5:
        _B5(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1)
    elif rows == 4:
        _B4(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1)
    elif rows == 2:
        _B2(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1)
    elif rows == 1:
        _B1(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1)


@njit(_GEMM_SIG, cache=True, nogil=True)
def _gemm(a, a_off, rows, k, w, bias, n, lo, hi, out, o_off, group):
    """out[o_off + r·n:][:n] = clamp(a[a_off + r·k:][:k] @ W + bias, lo, hi) for r < rows."""
    tiles = (n + TILE - 1) // TILE
    full, ra, rb = _row_split(rows)
    for t0 in range(0, tiles, group):
        t1 = min(tiles, t0 + group)
        r = 0
        for _ in range(full):
            _B8(a, a_off + r * k, k, w, bias, n, lo, hi, out, o_off + r * n, t0, t1)
            r += 8
        for m in (ra, rb):
            if m:
                _block(a, a_off + r * k, k, w, bias, n, lo, hi, out, o_off + r * n, t0, t1, m)
                r += m


@njit([numba.void(_RW, _I64, _I64, _I64, _RO, _F32, _F32, _RO, _I64)], cache=True, nogil=True)
def _epilogue(out, o_off, pixels, n, res, lo, hi, alpha, flags):
    """The fused ADD (of ``res``, the same positions), its clamp, then PRELU (``alpha`` per
    channel), on ``pixels`` rows of ``n`` channels from ``o_off``, in one pass; then the
    activation, in a second (the rows are in cache). NaN stays NaN
    (the comparisons are false), as the reference's where/clip keep it. Both sides of each choice
    are computed: selects, not branches the signs would mispredict. One loop per combination of
    flags, over the flat rows (a pass per operation, or 2-D views, measured twice as slow on
    16-channel rows)."""
    o = out[o_off:o_off + pixels * n]
    if flags & RESIDUAL:
        r = res[o_off:o_off + pixels * n]
        if flags & ALPHA:
            for p in range(pixels):
                for c in range(n):
                    i = p * n + c
                    v = o[i] + r[i]
                    v = lo if v < lo else v
                    v = hi if v > hi else v
                    scaled = v * alpha[c]
                    o[i] = v if v >= 0 else scaled
        else:
            for p in range(pixels):
                for c in range(n):
                    i = p * n + c
                    v = o[i] + r[i]
                    v = lo if v < lo else v
                    o[i] = hi if v > hi else v
    elif flags & ALPHA:
        for p in range(pixels):
            for c in range(n):
                i = p * n + c
                v = o[i]
                scaled = v * alpha[c]
                o[i] = v if v >= 0 else scaled
    act = (flags >> ACT_SHIFT) & 3
    if act == ACT_HARD_SWISH:
        _hard_swish_run(o, o, pixels * n)
    elif act == ACT_SWISH:
        _swish_run(o, o, pixels * n)


@njit([numba.void(_RO, _GEOMETRY, _I64, _I64, _I64, _I64, _RW)], cache=True, nogil=True)
def _gather(x, g, b, oy, ox0, ox1, scratch):
    """Pixels ox0 .. ox1 - 1 of output row ``oy`` of batch ``b``: each pixel's window as one
    scratch row (zeros outside). A window row wholly inside the image (no dilation) is one
    contiguous run of kw·C floats, moved as bytes in 64-byte masked moves (simd.copy_bytes:
    numba's own element loops guard every index against negative wrap-around, which costs more
    than the move)."""
    h, w, c, kh, kw = g[1], g[2], g[3], g[4], g[5]
    sh, sw, dh, dw, pt, pl = g[6], g[7], g[8], g[9], g[10], g[11]
    k = kh * kw * c
    run = kw * c
    for ox in range(ox0, ox1):
        ix0 = ox * sw - pl
        inside = dw == 1 and ix0 >= 0 and ix0 + kw <= w
        for i in range(kh):
            iy = oy * sh - pt + i * dh
            d = (ox - ox0) * k + i * run
            if iy < 0 or iy >= h:
                fill_copy(scratch, 4 * d, x, 0, 0, 4 * run, 0)
            elif inside:
                copy_bytes(scratch, 4 * d, x, 4 * (((b * h + iy) * w + ix0) * c), 4 * run)
            else:
                for j in range(kw):
                    ix = ix0 + j * dw
                    if 0 <= ix < w:
                        copy_bytes(scratch, 4 * (d + j * c), x, 4 * (((b * h + iy) * w + ix) * c), 4 * c)
                    else:
                        fill_copy(scratch, 4 * (d + j * c), x, 0, 0, 4 * c, 0)


def _window_block_of(rows: int):
    """``_block_of`` for rows that are windows read in place (fc_float's window tiles)."""

    @njit(_WINDOW_BLOCK_SIG, cache=True, nogil=True)
    def block(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap):
        for t in range(t0, t1):
            count = min(TILE, n - t * TILE)
            if count <= LANES:
                _window_narrow(rows, w, t * k * TILE, a, a_off, k, bias, t * TILE, lo, hi, out, o_off + t * TILE, n,
                               count, 0, a_stride, run, gap)
            else:
                _window_tile(rows, w, t * k * TILE, a, a_off, k, bias, t * TILE, lo, hi, out, o_off + t * TILE, n,
                             count, 0, a_stride, run, gap)
    return block


_W8, _W7, _W6, _W5, _W4, _W2, _W1 = (_window_block_of(r) for r in ROW_BLOCKS)


@njit([numba.void(*_WINDOW_BLOCK_SIG[0].args, _I64)], cache=True, nogil=True)
def _window_block(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap, rows):
    """``_window_block_of(rows)``'s block (``rows`` in ROW_BLOCKS)."""
    if rows == 8:
        _W8(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap)
    elif rows == 7:
        _W7(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap)
    elif rows == 6:
        _W6(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap)
    elif rows == 5:
        _W5(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap)
    elif rows == 4:
        _W4(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap)
    elif rows == 2:
        _W2(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap)
    elif rows == 1:
        _W1(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap)


def _fused_block_of(rows: int):
    """``_window_block_of`` with the epilogue applied in registers (fc_float's fused tiles)."""

    @njit(_FUSED_BLOCK_SIG, cache=True, nogil=True)
    def block(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap, res, alpha, flags, lo2, hi2):
        for t in range(t0, t1):
            count = min(TILE, n - t * TILE)
            if count <= LANES:
                _fused_narrow(rows, w, t * k * TILE, a, a_off, k, bias, t * TILE, lo, hi, out, o_off + t * TILE, n,
                              count, 0, a_stride, run, gap, res, alpha, flags, lo2, hi2)
            else:
                _fused_tile(rows, w, t * k * TILE, a, a_off, k, bias, t * TILE, lo, hi, out, o_off + t * TILE, n,
                            count, 0, a_stride, run, gap, res, alpha, flags, lo2, hi2)
    return block


_F8, _F7, _F6, _F5, _F4, _F2, _F1 = (_fused_block_of(r) for r in ROW_BLOCKS)


@njit([numba.void(*_FUSED_BLOCK_SIG[0].args, _I64)], cache=True, nogil=True)
def _fused_block(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap, res, alpha, flags, lo2, hi2,
                 rows):
    """``_fused_block_of(rows)``'s block (``rows`` in ROW_BLOCKS)."""
    if rows == 8:
        _F8(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap, res, alpha, flags, lo2, hi2)
    elif rows == 7:
        _F7(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap, res, alpha, flags, lo2, hi2)
    elif rows == 6:
        _F6(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap, res, alpha, flags, lo2, hi2)
    elif rows == 5:
        _F5(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap, res, alpha, flags, lo2, hi2)
    elif rows == 4:
        _F4(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap, res, alpha, flags, lo2, hi2)
    elif rows == 2:
        _F2(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap, res, alpha, flags, lo2, hi2)
    elif rows == 1:
        _F1(a, a_off, k, w, bias, n, lo, hi, out, o_off, t0, t1, a_stride, run, gap, res, alpha, flags, lo2, hi2)


@njit(_WINDOWS_SIG, cache=True, nogil=True)
def _gemm_windows(x, x_off, rows, k, w, bias, n, lo, hi, out, o_off, group, x_stride, run, gap, res, alpha, flags,
                  lo2, hi2):
    """``_gemm`` whose row r is the window at x[x_off + r·x_stride:], read in place: K floats in
    runs of ``run``, each next run ``gap`` floats after the last one's end; with ``flags``, the
    epilogue (``res``, ``alpha``, ``lo2``, ``hi2``) applied in registers before the store."""
    tiles = (n + TILE - 1) // TILE
    full, ra, rb = _row_split(rows)
    for t0 in range(0, tiles, group):
        t1 = min(tiles, t0 + group)
        r = 0
        if flags:
            for _ in range(full):
                _F8(x, x_off + r * x_stride, k, w, bias, n, lo, hi, out, o_off + r * n, t0, t1, x_stride, run, gap,
                    res, alpha, flags, lo2, hi2)
                r += 8
            for m in (ra, rb):
                if m:
                    _fused_block(x, x_off + r * x_stride, k, w, bias, n, lo, hi, out, o_off + r * n, t0, t1,
                                 x_stride, run, gap, res, alpha, flags, lo2, hi2, m)
                    r += m
            continue
        for _ in range(full):
            _W8(x, x_off + r * x_stride, k, w, bias, n, lo, hi, out, o_off + r * n, t0, t1, x_stride, run, gap)
            r += 8
        for m in (ra, rb):
            if m:
                _window_block(x, x_off + r * x_stride, k, w, bias, n, lo, hi, out, o_off + r * n, t0, t1, x_stride,
                              run, gap, m)
                r += m


@njit([numba.void(_RO, _RO, _RO, _GEOMETRY, _I64, _I64, _F32, _F32, _RW, _I64, _RW, _RO, _RO, _I64, _F32,
                        _F32)], cache=True, nogil=True)
def _windows_row(x, w, bias, g, b, oy, lo, hi, out, o_off, scratch, res, alpha, flags, lo2, hi2):
    """Output row ``oy`` of batch ``b`` (GATHERED), then its epilogue (``flags``): where its
    windows lie inside the image (dilation 1), its pixels are read in place (the epilogue applied
    in registers), the others gathered into ``scratch``."""
    h, w_in, c, kh, kw = g[1], g[2], g[3], g[4], g[5]
    sh, sw, dh, dw, pt, pl, ow, n, group = g[6], g[7], g[8], g[9], g[10], g[11], g[13], g[14], g[16]
    k = kh * kw * c
    iy0 = oy * sh - pt
    x_lo, x_hi = 0, 0  # the pixels whose windows are inside: [x_lo, x_hi)
    if dh == 1 and dw == 1 and iy0 >= 0 and iy0 + kh <= h and w_in - kw + pl >= 0:
        x_lo = (pl + sw - 1) // sw
        x_hi = max(x_lo, min(ow, (w_in - kw + pl) // sw + 1))
    if x_hi == x_lo:
        _gather(x, g, b, oy, 0, ow, scratch)
        _gemm(scratch, 0, ow, k, w, bias, n, lo, hi, out, o_off, group)
        if flags:
            _epilogue(out, o_off, ow, n, res, lo2, hi2, alpha, flags)
        return
    if x_lo > 0:
        _gather(x, g, b, oy, 0, x_lo, scratch)
        _gemm(scratch, 0, x_lo, k, w, bias, n, lo, hi, out, o_off, group)
        if flags:
            _epilogue(out, o_off, x_lo, n, res, lo2, hi2, alpha, flags)
    _gemm_windows(x, ((b * h + iy0) * w_in + x_lo * sw - pl) * c, x_hi - x_lo, k, w, bias, n, lo, hi, out,
                  o_off + x_lo * n, group, sw * c, kw * c, (w_in - kw) * c, res, alpha, flags, lo2, hi2)
    if x_hi < ow:
        _gather(x, g, b, oy, x_hi, ow, scratch)
        _gemm(scratch, 0, ow - x_hi, k, w, bias, n, lo, hi, out, o_off + x_hi * n, group)
        if flags:
            _epilogue(out, o_off + x_hi * n, ow - x_hi, n, res, lo2, hi2, alpha, flags)


_LAYER = numba.types.Array(_I64, 2, "C")
_BOUNDS = numba.types.Array(_F32, 2, "C")


@njit([numba.types.Tuple((_LAYER, _BOUNDS))(_I64, _I64, _F32, _F32)], cache=True, nogil=True)
def _row_layer(k, n, lo, hi):
    """fc_float's description of a K -> N layer clamped to [lo, hi], for ``_one_row``."""
    layer = np.zeros((1, 4), np.int64)
    layer[0, 0], layer[0, 1] = k, n
    bounds = np.empty((1, 2), np.float32)
    bounds[0, 0], bounds[0, 1] = lo, hi
    return layer, bounds


@njit([numba.void(_RO, _I64, _RO, _RO, _LAYER, _BOUNDS, _RW, _I64, _RO, _RO, _I64, _F32, _F32)], cache=True,
            nogil=True)
def _one_row(x, x_off, w, bias, layer, bounds, out, o_off, res, alpha, flags, lo2, hi2):
    """out[o_off:][:N] = clamp(x[x_off:][:K] @ W + bias) (``_row_layer``'s K, N and clamp), then its
    epilogue: one row, whose time is the weights' stream, read by fc_float's one-row layer as 2-4
    streams at once (a column group of 1-row tiles reads one)."""
    k, n = layer[0, 0], layer[0, 1]
    _FC_ROW(x[x_off:x_off + k], w, bias, layer, bounds, 0, out[o_off:o_off + n])
    if flags:
        _epilogue(out, o_off, 1, n, res, lo2, hi2, alpha, flags)


@njit([numba.void(_RO, _RO, _RO, _GEOMETRY, _RO, _RO, _RO, _I64, _RW)], cache=True, nogil=True)
def conv_rows(x, w, bias, g, clamps, res, alpha, flags, out):
    """The convolution of ``x`` (NHWC, flat) into ``out``: geometry ``g`` (``FIELDS``), packed
    weights ``w``, padded ``bias``, clamps = (conv lo, hi, epilogue lo, hi); then the epilogue
    (``flags``: RESIDUAL reads ``res``, ALPHA applies ``alpha``)."""
    batch, h, w_in, c, kh = g[0], g[1], g[2], g[3], g[4]
    oh, ow, n, mode, group = g[12], g[13], g[14], g[15], g[16]
    lo, hi, lo2, hi2 = clamps[0], clamps[1], clamps[2], clamps[3]
    if mode == IN_PLACE:
        rows, k = batch * h * w_in, c
        if rows == 1:  # a 1x1 map (a squeeze-excite's or a classifier head's convolution)
            layer, bounds = _row_layer(k, n, lo, hi)
            _one_row(x, 0, w, bias, layer, bounds, out, 0, res, alpha, flags, lo2, hi2)
            return
        for r0 in range(0, rows, CHUNK):
            m = min(CHUNK, rows - r0)
            if flags:  # the rows as windows of one run each: the epilogue in registers
                _gemm_windows(x, r0 * k, m, k, w, bias, n, lo, hi, out, r0 * n, group, k, k, 0, res, alpha, flags,
                              lo2, hi2)
            else:
                _gemm(x, r0 * k, m, k, w, bias, n, lo, hi, out, r0 * n, group)
        return
    if mode == WHOLE_ROWS:
        k, sh = kh * w_in * c, g[6]
        layer, bounds = _row_layer(k, n, lo, hi)
        for b in range(batch):
            for oy in range(oh):
                _one_row(x, ((b * h + oy * sh) * w_in) * c, w, bias, layer, bounds, out, (b * oh + oy) * n, res,
                         alpha, flags, lo2, hi2)
        return
    k = kh * g[5] * c
    scratch = np.empty(ow * k, np.float32)
    for b in range(batch):
        for oy in range(oh):
            _windows_row(x, w, bias, g, b, oy, lo, hi, out, (b * oh + oy) * ow * n, scratch, res, alpha, flags, lo2,
                         hi2)


@dataclass
class FloatConv:
    """A float32 convolution ready to run: packed weights, padded bias, geometry (``FIELDS``) and
    the convolution's clamp bounds."""

    weights: np.ndarray  # float32, flat (fc_float.pack of [out_c, K])
    bias: np.ndarray  # float32, padded to whole tiles
    geometry: np.ndarray  # int64 [len(FIELDS)]
    lo: float
    hi: float

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        g = self.geometry
        return int(g[0]), int(g[12]), int(g[13]), int(g[14])


_NO_ARRAY = np.zeros(1, np.float32)


def supports(ctx: OperationContext) -> str | None:
    p: ConvParams = ctx.params
    if p.nchw:
        return "NCHW layout (the float kernel computes NHWC)"
    if p.depthwise or p.groups != 1:
        return "not a plain convolution"
    if not (ctx.input(FILTER).is_constant and ctx.input(BIAS).is_constant):
        return "filter or bias is not a constant"
    if ctx.inputs[INPUT].type != F32:
        return "not float32"
    return None


def _mode(p: ConvParams, h: int, w: int) -> int:
    r, c = p.rows, p.cols
    unpadded = r.pad_head == 0 and c.pad_head == 0 and r.reach == 0 and c.reach == 0
    if r.filter == c.filter == 1 and r.stride == c.stride == 1 and unpadded:
        return IN_PLACE
    if c.filter == w and c.out == 1 and c.dilation == 1 and r.dilation == 1 and unpadded:
        return WHOLE_ROWS
    return GATHERED


def plan(ctx: OperationContext) -> FloatConv:
    p: ConvParams = ctx.params
    batch, h, w, c = ctx.inputs[INPUT].shape
    filt = np.asarray(ctx.input(FILTER).value, np.float32)
    k = filt[0].size
    packed = fc_float.pack(filt.reshape(p.out_c, k))
    tiles = -(-p.out_c // TILE)
    bias = np.zeros(tiles * TILE, np.float32)
    bias[:p.out_c] = ctx.input(BIAS).value
    group = max(1, GROUP_BYTES // (k * TILE * 4))
    g = (batch, h, w, c, p.rows.filter, p.cols.filter, p.rows.stride, p.cols.stride, p.rows.dilation,
         p.cols.dilation, p.rows.pad_head, p.cols.pad_head, p.rows.out, p.cols.out, p.out_c, _mode(p, h, w), group)
    lo, hi = quant.activation_range_float(p.act)
    return FloatConv(fc_float._on_a_line([packed]), bias, np.array(g, np.int64), lo, hi)


def _clamps(d: FloatConv, lo2: float = -np.inf, hi2: float = np.inf) -> np.ndarray:
    return np.array([d.lo, d.hi, lo2, hi2], np.float32)


def execute(ctx: OperationContext, inputs: list) -> list:
    d: FloatConv = ctx.data
    x = np.ascontiguousarray(inputs[INPUT], np.float32).reshape(-1)
    out = np.empty(d.out_shape, np.float32)
    conv_rows(x, d.weights, d.bias, d.geometry, _clamps(d), _NO_ARRAY, _NO_ARRAY, 0, out.reshape(-1))
    return [out]


def bind(ctx: OperationContext, inputs: list, outputs: list):
    d: FloatConv = ctx.data
    x, out = inputs[INPUT], outputs[0]
    if x is None or not x.flags.c_contiguous or not out.flags.c_contiguous:
        return None
    return functools.partial(conv_rows, x.reshape(-1), d.weights, d.bias, d.geometry, _clamps(d), _NO_ARRAY,
                             _NO_ARRAY, 0, out.reshape(-1))


@dataclass
class ConvEpilogue:
    """A ``conv_epilogue`` step: the convolution, then (``flags``) the residual ADD's clamp bounds;
    ``residual`` and ``alpha``: where the fused step's inputs hold the ADD's other operand and
    the PRELU's slopes (one per channel)."""

    conv: FloatConv
    flags: int
    lo: float
    hi: float
    residual: int = -1
    alpha: int = -1


def plan_epilogue(ctx) -> ConvEpilogue | None:
    """Reads the members' plans and operand shapes only (a plan from the compilation cache has no
    parameters): the ADD's clamp (f32_elementwise's plan); the PRELU's alpha is an input; the
    activation (f32_activations' plan) is applied last."""
    pad = ctx.members[0] if ctx.members[0].ctx.op_type in PADS else None
    conv, *rest = ctx.members[pad is not None:]
    d = conv.ctx.data
    if not isinstance(d, FloatConv):
        return None
    if pad is not None:
        d = padded(d, pad)
        if d is None:
            return None
    shape = d.out_shape
    flags, lo, hi = 0, -np.inf, np.inf
    at, residual, alpha = len(conv.inputs), -1, -1
    for m in rest:
        act = activation_of(m)
        if act is not None:
            if tuple(output_of(m).shape) != shape:
                return None
            flags |= act << ACT_SHIFT
            at += len(m.inputs) - 1
            continue
        if m.spec is None:
            return None  # another backend's fused step
        if any(i is None or i.type != F32 or tuple(i.shape) != shape for i in (*m.ctx.inputs[:1], *m.ctx.outputs)):
            return None
        if m.ctx.op_type == OperationType.ADD:
            add = m.ctx.data
            if not isinstance(add, F32Binary) or any(tuple(i.shape) != shape for i in m.ctx.inputs[:2]):
                return None
            flags |= RESIDUAL
            lo, hi, residual = add.lo, add.hi, at
        else:
            a = m.ctx.inputs[1]
            if a is None or a.type != F32 or math.prod(a.shape) != shape[3] \
                    or (len(a.shape) > 1 and a.shape[-1] != shape[3]):
                return None  # not one slope per channel
            flags |= ALPHA
            alpha = at
        at += len(m.inputs) - 1
    return ConvEpilogue(d, flags, lo, hi, residual, alpha)


def padded(d: FloatConv, pad) -> FloatConv | None:
    """``d`` reading the input of ``pad`` (a PAD step this backend planned, whose output only the
    convolution reads), the pad's border taken as more of its own zero padding; None where the
    pad is not a zero border of the image (f32_layout's ``image_of``)."""
    image = image_of(pad)
    if image is None:
        return None
    g = d.geometry.copy()
    g[1], g[2], top, left = image
    g[10] += top
    g[11] += left
    if g[15] != GATHERED and ((top, left) != (0, 0) or tuple(g[1:3]) != tuple(d.geometry[1:3])):
        g[15] = GATHERED  # padded: only the gathering form reads zeros outside the image
    return dataclasses.replace(d, geometry=g)


def _epilogue_arrays(ctx, inputs: list):
    """The fused step's input, residual and slopes (its inputs: the convolution's, then the ADD's
    other operand and activation, then the PRELU's alpha, then the activation's) and clamps."""
    e: ConvEpilogue = ctx.data
    res = inputs[e.residual] if e.flags & RESIDUAL else _NO_ARRAY
    alpha = inputs[e.alpha] if e.flags & ALPHA else _NO_ARRAY
    return e, inputs[INPUT], res, alpha, _clamps(e.conv, e.lo, e.hi)


def execute_epilogue(ctx, inputs: list) -> list:
    e, x, res, alpha, clamps = _epilogue_arrays(ctx, inputs)
    out = np.empty(e.conv.out_shape, np.float32)
    d = e.conv
    flat = [np.ascontiguousarray(a, np.float32).reshape(-1) for a in (x, res, alpha)]
    conv_rows(flat[0], d.weights, d.bias, d.geometry, clamps, flat[1], flat[2], e.flags, out.reshape(-1))
    return [out]


def bind_epilogue(ctx, inputs: list, outputs: list):
    e, x, res, alpha, clamps = _epilogue_arrays(ctx, inputs)
    arrays = (x, res, alpha, outputs[0])
    if any(a is None or not a.flags.c_contiguous for a in arrays):
        return None
    d = e.conv
    return functools.partial(conv_rows, x.reshape(-1), d.weights, d.bias, d.geometry, clamps, res.reshape(-1),
                             alpha.reshape(-1), e.flags, outputs[0].reshape(-1))


BACKEND.register_fusion("conv_epilogue", plan=plan_epilogue, execute=execute_epilogue, bind=bind_epilogue)
BACKEND.register(CONV, plan=plan, execute=execute, types=(F32,), supports=supports, prepacked_inputs=(FILTER, BIAS),
                 bind=bind)
