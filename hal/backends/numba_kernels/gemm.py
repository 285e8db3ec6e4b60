"""Quantized GEMM layers on the integer units: packed weights, VNNI tiles, fused requantization.

``C[m, n] = Σ_k (x[m, k] − zx) · (w[k, n] − zw[n])`` is what TFLite's CONV_2D / FULLY_CONNECTED
accumulate in int32 before adding the bias and requantizing. Here the tiles of ``vnni.py`` compute
``D = Σ_k A·W'`` with ``A = x XOR a_xor`` (unsigned; flipped before the tiles read it) and
``W' = w XOR w_xor`` (signed), i.e.
``x = A + ca`` and ``w = W' + cw`` with ``ca = −128`` for int8 activations (else 0) and ``cw = 128``
for uint8 weights (else 0). Expanding,
``C = D + (cw − zw)·ΣA + (ca − zx)·ΣW' + K·(ca − zx)·(cw − zw)``:
the last two terms are per column (folded into the bias at plan time), the second is per row and
only exists where ``zw ≠ cw`` (uint8 or per-tensor weights with another zero point). Sums wrap
modulo 2^32 like TFLite's int32 accumulator, so the whole identity holds in int32.

Each tile's int32 sums are requantized while still in cache (bias, row term,
MultiplyByQuantizedMultiplier, output zero point, activation clamp, one byte out), so no int32
or float matrix ever reaches memory. A 1×1 convolution with stride 1 (and a FULLY_CONNECTED) reads
its NHWC input in place when K is a multiple of 4; a convolution whose input channels are a
multiple of 4 reads each tap's channels in place through ``indirection``'s table
(``run_indirect``); other shapes gather their rows in bytes first.
"""
from __future__ import annotations

import concurrent.futures
import functools
import threading
from dataclasses import dataclass

import numba
import numpy as np

from hal import backends
from hal.backends.numba_kernels import amx, vnni
from hal.backends.numba_kernels.amx_blocks import rows_on_tiles
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.backends.numba_kernels.native_chain import InOrder
from hal.backends.numba_kernels.simd import copy_bytes, floor_at_zero_point, requant_table

if vnni.VBMI:
    from hal.backends.numba_kernels.vnni import lookup_run
VBMI = vnni.VBMI
PANEL, KSTEP = vnni.PANEL, vnni.KSTEP
XOR80 = 0x80808080


@dataclass
class GemmPlan:
    """One quantized GEMM (a CONV_2D or a group of a GROUPED_CONV_2D, or a FULLY_CONNECTED)."""

    packed: np.ndarray  # int8 [panels · kq · 64]: panel p, block q = 16 columns × 4 k (k fastest)
    bias: np.ndarray  # int32 per column: bias + (ca − zx)·ΣW' + K·(ca − zx)·(cw − zw), wrapped
    row_coef: int  # cw − zw: multiplies each row's ΣA (0: no row term)
    a_xor: int  # 0x80808080 for int8 activations, 0 for uint8
    pad_byte: int  # the input zero point's byte: padded cells contribute nothing
    k: int
    n: int
    multipliers: np.ndarray  # int32 per column (the QuantizeMultiplier M0)
    left: np.ndarray  # int32 per column: max(shift, 0)
    right: np.ndarray  # int32 per column: max(-shift, 0)
    output_zp: int
    act_min: int
    act_max: int
    #: 0 where the row term is 0 and simd.floor_at_zero_point holds (the tiles' cheaper
    #: epilogue), else 1
    general: int = 1
    #: 1 where the output is int8 (the activations' type), 0 for uint8
    signed_output: int = 0

    @functools.cached_property
    def flags(self) -> int:
        """The tiles' ``general`` argument: ``general`` in bit 0, ``signed_output`` in bit 1, bit 2
        where the general requantization needs neither the row term nor a left shift."""
        lean = self.general and self.row_coef == 0 and not self.left.any()
        return self.general | self.signed_output << 1 | int(lean) << 2

    @property
    def kq(self) -> int:
        return -(-self.k // KSTEP)

    @functools.cached_property
    def kernel_args(self) -> tuple:
        """``_gemm_rows``' arguments from the plan, in order (formed once: a layer runs them often)."""
        return (self.a_xor, self.packed, self.kq, self.n, self.bias, self.row_coef, self.multipliers, self.left,
                self.requant, self.output_zp, self.act_min, self.act_max, *self.amx_args)

    @functools.cached_property
    def amx_args(self) -> tuple[np.ndarray, int]:
        """(amx.pack's weights, tiles per panel) where the AMX tiles run (and pay: amx.worth_it),
        else (empty, 0): the VNNI tiles compute every row."""
        if not (amx.AVAILABLE and amx.worth_it(KSTEP * self.kq)):
            return _NO_AMX, 0
        return amx.pack(self.packed, self.kq, self.panels)

    @functools.cached_property
    def requant(self) -> np.ndarray:
        """The epilogue's per-lane constants (``simd.requant_table``), derived from the plan's fields."""
        return requant_table(self.multipliers, self.right)

    @property
    def panels(self) -> int:
        return -(-self.n // PANEL)


_NO_AMX = np.zeros(0, dtype=np.int8)


def _wrap32(v: np.ndarray) -> np.ndarray:
    return ((v.astype(np.int64) + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)


def make_plan(w2d: np.ndarray, w_zp: int, bias: np.ndarray, x_dtype: np.dtype, x_zp: int,
              multipliers: np.ndarray, shifts: np.ndarray, output_zp: int, lo: int, hi: int,
              k_real: int | None = None) -> GemmPlan:
    """``w2d``: [K, N] stored filter values (int8 or uint8); ``w_zp``: its zero point (0 for
    per-channel filters, which NNAPI makes symmetric). ``k_real``: the reduction's own length
    where ``w2d`` has rows of padding (weights that pack to 0: 0, or 128 for uint8) between its
    terms (row_segments), default K."""
    k, n = w2d.shape
    w_unsigned = w2d.dtype == np.uint8
    signed = (w2d.view(np.uint8) ^ 0x80).view(np.int8) if w_unsigned else w2d.view(np.int8)
    ca = -128 if np.dtype(x_dtype) == np.int8 else 0
    cw = 128 if w_unsigned else 0
    zw0 = int(w_zp)
    kq, panels = -(-k // KSTEP), -(-n // PANEL)
    wpad = np.zeros((kq * KSTEP, panels * PANEL), dtype=np.int8)
    wpad[:k, :n] = signed
    packed = wpad.reshape(kq, KSTEP, panels, PANEL).transpose(2, 0, 3, 1)  # [panel, q, column, k]
    colsum = signed.astype(np.int64).sum(axis=0)
    k_terms = k if k_real is None else k_real
    folded = bias.astype(np.int64) + (ca - x_zp) * colsum + k_terms * (ca - x_zp) * (cw - zw0)
    shifts = np.asarray(shifts, dtype=np.int64)
    multipliers = np.asarray(multipliers, dtype=np.int64)
    assert ((multipliers >= 0) & (multipliers < 1 << 31)).all(), "QuantizeMultiplier's range (simd relies on it)"

    def per_column(v):  # padded to whole panels: the tiles load 16 columns at a time
        out = np.zeros(panels * PANEL, dtype=np.int32)
        out[:n] = v
        return out
    general = 0 if cw == zw0 and floor_at_zero_point(np.maximum(shifts, 0), output_zp, lo) else 1
    return GemmPlan(np.ascontiguousarray(packed).reshape(-1), per_column(_wrap32(folded)), cw - zw0,
                    XOR80 if ca else 0, x_zp & 0xFF, k, n, per_column(multipliers),
                    per_column(np.maximum(shifts, 0)), per_column(np.maximum(-shifts, 0)), output_zp, lo, hi, general,
                    int(ca != 0))


# ---- native kernels ---------------------------------------------------------------------------

I64 = numba.int64
_SIG_GEMM = numba.void(ro(np.uint8, 1), I64, I64, I64, I64, ro(np.int8, 1), I64, I64, ro(np.int32, 1), I64,
                       ro(np.int32, 1), ro(np.int32, 1), ro(np.int64, 1), I64, I64, I64, ro(np.int8, 1), I64,
                       rw(np.uint8, 1), I64, I64, I64, I64, ro(np.uint8, 1), I64)
_SIG_GEMM_IND = numba.void(ro(np.uint8, 1), ro(np.int32, 1), ro(np.uint8, 1), I64, I64, I64, ro(np.int8, 1), I64,
                           I64, ro(np.int32, 1), I64, ro(np.int32, 1), ro(np.int32, 1), ro(np.int64, 1), I64, I64, I64,
                           ro(np.int8, 1), I64, rw(np.uint8, 1), I64, I64, I64, I64, ro(np.uint8, 1), I64)
#: Rows per block when a table follows the GEMM: each block's output is looked up while in cache.
TABLE_ROWS = 48  # whole 6- and 8-row tiles
#: Output bytes per block at most when a table follows (the block looked up while in L1).
TABLE_BYTES = 16384
#: Bytes of the left operand per row block when the columns take several tile groups (a part of L1).
BLOCK_BYTES = 16384
#: The same for rows on the AMX tiles, in whole blocks of both tiles (amx.BLOCK_ROWS) and tables
#: (TABLE_ROWS): a block's fixed costs (its buffers, the arrays handed down) over more rows.
AMX_ROWS = 96
AMX_BLOCK_BYTES = 32768


_SIG_LOOKUP = numba.void(rw(np.uint8, 1), I64, I64, ro(np.uint8, 1))
if VBMI:
    @njit(_SIG_LOOKUP, cache=True, nogil=True)
    def lookup_in_place(buf, start, count, table):
        """``buf[start:start + count] = table[buf[start:start + count]]`` (a 256-byte table)."""
        lookup_run(buf, start, table, buf, start, count)
else:
    @njit(_SIG_LOOKUP, cache=True, nogil=True)
    def lookup_in_place(buf, start, count, table):
        """``buf[start:start + count] = table[buf[start:start + count]]`` (a 256-byte table)."""
        for i in range(start, start + count):
            buf[i] = table[buf[i]]


@njit(numba.void(ro(np.uint8, 1), rw(np.uint8, 1)), cache=True, nogil=True)
def flip_into(src, dst):
    """``dst = src XOR 0x80``: int8 activations as the tiles' unsigned operand (value + 128), in one
    vectorised pass (a block of rows, ``_gemm_rows``; a convolution's input whose taps the tiles
    read in place, ``run_indirect``) instead of a vector XOR per row and 4-byte step inside every
    tile."""
    for i in range(np.uint64(src.shape[0])):
        dst[i] = src[i] ^ np.uint8(0x80)


if vnni.AVAILABLE:
    from hal.backends.numba_kernels.vnni import (
        ind_1x1,
        ind_1x2,
        ind_1x3,
        ind_1x4,
        ind_6x4,
        ind_8x1,
        ind_8x2,
        ind_8x3,
        tile_1x1,
        tile_1x2,
        tile_1x3,
        tile_1x4,
        tile_6x4,
        tile_8x1,
        tile_8x2,
        tile_8x3,
    )

    @numba.njit(inline="always")
    def _gemm_block(a, a_off, lda, rows, w, kq, n, bias, mult, left, rq, out_zp, lo, hi, out, o_off, ldo,
                    r0, b0, r1, corr, panels, pstride, general, ind, zeros, amx_w, chunks, sums, gbuf):
        """Rows [b0, r1) of ``_gemm_rows``' rows [r0, ..) (``corr`` is indexed from r0). With an
        indirection table ``ind`` (non-empty: ``lda`` segments of ``kq`` blocks per row, vnni's
        ``indirect`` tiles) rows are read through it, else ``lda`` bytes apart from ``a_off``.
        Where the plan has AMX weights (``chunks`` > 0), whole blocks of 16 rows or more run on
        the AMX tiles (amx_blocks.rows_on_tiles) and the VNNI tiles take the rows left."""
        b0 = rows_on_tiles(a, a_off, lda, w, kq, n, bias, mult, left, rq, out_zp, lo, hi, out, o_off, ldo, r0, b0, r1,
                       corr, panels, general, ind, zeros, amx_w, chunks, sums, gbuf)
        indirect = ind.shape[0] > 0
        for p0 in range(0, panels, 4):
            nr = min(4, panels - p0)
            mr = 6 if nr == 4 else 8
            c0 = p0 * 16
            nc = n - c0
            w_off = p0 * pstride
            i = b0
            while i < r1:
                left_rows = r1 - i
                one = left_rows <= mr // 2  # a short tail: single rows waste nothing
                rv = 1 if one else min(mr, left_rows)
                off = i if indirect else a_off + i * lda
                last = rows - i
                co = i - r0
                oo = o_off + i * ldo
                if indirect:
                    if one:
                        if nr == 4:
                            ind_1x4(a, off, lda, last, w, w_off, pstride, kq, corr, co, bias, mult, left, rq,
                                    c0, out_zp, lo, hi, out, oo, ldo, rv, nc, general, ind, zeros)
                        elif nr == 3:
                            ind_1x3(a, off, lda, last, w, w_off, pstride, kq, corr, co, bias, mult, left, rq,
                                    c0, out_zp, lo, hi, out, oo, ldo, rv, nc, general, ind, zeros)
                        elif nr == 2:
                            ind_1x2(a, off, lda, last, w, w_off, pstride, kq, corr, co, bias, mult, left, rq,
                                    c0, out_zp, lo, hi, out, oo, ldo, rv, nc, general, ind, zeros)
                        else:
                            ind_1x1(a, off, lda, last, w, w_off, pstride, kq, corr, co, bias, mult, left, rq,
                                    c0, out_zp, lo, hi, out, oo, ldo, rv, nc, general, ind, zeros)
                    elif nr == 4:
                        ind_6x4(a, off, lda, last, w, w_off, pstride, kq, corr, co, bias, mult, left, rq,
                                c0, out_zp, lo, hi, out, oo, ldo, rv, nc, general, ind, zeros)
                    elif nr == 3:
                        ind_8x3(a, off, lda, last, w, w_off, pstride, kq, corr, co, bias, mult, left, rq,
                                c0, out_zp, lo, hi, out, oo, ldo, rv, nc, general, ind, zeros)
                    elif nr == 2:
                        ind_8x2(a, off, lda, last, w, w_off, pstride, kq, corr, co, bias, mult, left, rq,
                                c0, out_zp, lo, hi, out, oo, ldo, rv, nc, general, ind, zeros)
                    else:
                        ind_8x1(a, off, lda, last, w, w_off, pstride, kq, corr, co, bias, mult, left, rq,
                                c0, out_zp, lo, hi, out, oo, ldo, rv, nc, general, ind, zeros)
                elif one:
                    if nr == 4:
                        tile_1x4(a, off, lda, last, w, w_off, pstride, kq, corr, co, bias, mult, left, rq,
                                 c0, out_zp, lo, hi, out, oo, ldo, rv, nc, general)
                    elif nr == 3:
                        tile_1x3(a, off, lda, last, w, w_off, pstride, kq, corr, co, bias, mult, left, rq,
                                 c0, out_zp, lo, hi, out, oo, ldo, rv, nc, general)
                    elif nr == 2:
                        tile_1x2(a, off, lda, last, w, w_off, pstride, kq, corr, co, bias, mult, left, rq,
                                 c0, out_zp, lo, hi, out, oo, ldo, rv, nc, general)
                    else:
                        tile_1x1(a, off, lda, last, w, w_off, pstride, kq, corr, co, bias, mult, left, rq,
                                 c0, out_zp, lo, hi, out, oo, ldo, rv, nc, general)
                elif nr == 4:
                    tile_6x4(a, off, lda, last, w, w_off, pstride, kq, corr, co, bias, mult, left, rq,
                             c0, out_zp, lo, hi, out, oo, ldo, rv, nc, general)
                elif nr == 3:
                    tile_8x3(a, off, lda, last, w, w_off, pstride, kq, corr, co, bias, mult, left, rq,
                             c0, out_zp, lo, hi, out, oo, ldo, rv, nc, general)
                elif nr == 2:
                    tile_8x2(a, off, lda, last, w, w_off, pstride, kq, corr, co, bias, mult, left, rq,
                             c0, out_zp, lo, hi, out, oo, ldo, rv, nc, general)
                else:
                    tile_8x1(a, off, lda, last, w, w_off, pstride, kq, corr, co, bias, mult, left, rq,
                             c0, out_zp, lo, hi, out, oo, ldo, rv, nc, general)
                i += rv

    @numba.njit(inline="always")
    def _blocks(a, a_off, lda, rows, w, kq, n, bias, mult, left, rq, out_zp, lo, hi, out, o_off, ldo,
                r0, r1, table, general, corr, pstride, ind, zeros, amx_w, chunks, gbuf):
        """Rows [r0, r1) in blocks of whole TABLE_ROWS of at most TABLE_BYTES of output where a table
        follows (looked up while in cache); where the columns take more than one group of tiles,
        in blocks of about BLOCK_BYTES of ``a``: each group of 4 panels sweeps the block while its
        rows are in cache, and the block's output rows are written whole before the next (a sweep
        of every row per group would write each output line once per group, the lines evicted in
        between on a large layer)."""
        panels = (n + 15) // 16
        if panels > 4:
            block = max(TABLE_ROWS, BLOCK_BYTES // max(pstride // 16, 1) // TABLE_ROWS * TABLE_ROWS)
        else:
            block = max(r1 - r0, 1)
        if table.shape[0] == 256:
            block = max(TABLE_ROWS, min(block, TABLE_BYTES // max(n, 1) // TABLE_ROWS * TABLE_ROWS))
        sums = amx.aligned_empty(amx.BLOCK_ROWS * 2 * PANEL * ((panels + 1) // 2) if chunks else 0, np.int32)
        for b0 in range(r0, r1, block):
            b1 = min(r1, b0 + block)
            _gemm_block(a, a_off, lda, rows, w, kq, n, bias, mult, left, rq, out_zp, lo, hi, out, o_off,
                        ldo, r0, b0, b1, corr, panels, pstride, general, ind, zeros, amx_w, chunks, sums, gbuf)
            if table.shape[0] == 256:
                if ldo == n:
                    lookup_in_place(out, o_off + b0 * ldo, (b1 - b0) * n, table)
                else:
                    for m in range(b0, b1):
                        lookup_in_place(out, o_off + m * ldo, n, table)

    @numba.njit(inline="always")
    def _unsigned_rows(a, a_off, lda, rows, w, kq, n, bias, row_coef, mult, left, rq, out_zp, lo, hi, amx_w,
                       chunks, out, o_off, ldo, r0, r1, table, general):
        """``_gemm_rows`` of rows that are the tiles' unsigned bytes already."""
        corr = np.zeros(r1 - r0 + 8, dtype=np.int32)  # + 8: the rows a partial tile computes and drops
        if row_coef != 0:
            for m in range(r0, r1):
                s = np.int32(0)
                base = a_off + m * lda
                for kk in range(4 * kq):
                    s += np.int32(a[base + kk])
                corr[m - r0] = np.int32(np.int64(s) * row_coef)  # int32 wrap, as the accumulator
        _blocks(a, a_off, lda, rows, w, kq, n, bias, mult, left, rq, out_zp, lo, hi, out, o_off, ldo,
                r0, r1, table, general, corr, kq * 64, np.empty(0, np.int32), np.empty(0, np.uint8), amx_w, chunks,
                np.empty(0, np.uint8))

    @njit(_SIG_GEMM, cache=True, nogil=True)
    def _gemm_rows(a, a_off, lda, rows, a_xor, w, kq, n, bias, row_coef, mult, left, rq, out_zp, lo, hi, amx_w,
                   chunks, out, o_off, ldo, r0, r1, table, general):
        """Rows [r0, r1) of the requantized product: the n bytes at ``out[o_off + m·ldo]`` from row m of
        ``a`` (``4·kq`` bytes at ``a_off + m·lda``). ``a_xor`` (int8 activations): the rows are flipped
        (XOR 0x80, the tiles' unsigned operand) a block of about BLOCK_BYTES at a time into a buffer
        that stays in L1, right before the block's tiles read it. ``rows``: the matrix's row count
        (a partial tile repeats its last row, never reads past it). ``table`` (256 bytes, or empty):
        looked up on the output, TABLE_ROWS rows at a time right after they are computed.
        ``general``: the plan's ``flags`` (bit 0 clear where ``row_coef`` is 0 and
        simd.floor_at_zero_point holds: the tiles' cheaper epilogue; bit 1: an int8 output; bit 2:
        no row term nor left shift). ``amx_w``, ``chunks``: ``GemmPlan.amx_args``."""
        if a_xor == 0:
            _unsigned_rows(a, a_off, lda, rows, w, kq, n, bias, row_coef, mult, left, rq, out_zp, lo, hi, amx_w,
                           chunks, out, o_off, ldo, r0, r1, table, general)
            return
        width = 4 * kq
        unit = AMX_ROWS if chunks else TABLE_ROWS
        step = max(unit, (AMX_BLOCK_BYTES if chunks else BLOCK_BYTES) // width // unit * unit)
        buf = amx.aligned_empty((step + 8) * width + amx.TILE_K, np.uint8)  # + a tile row's read past the last
        for b0 in range(r0, r1, step):
            b1 = min(r1, b0 + step)
            end = min(rows, b1 + 8)  # + 8: the rows a partial tile reads
            if lda == width:  # rows back to back (a 1x1 layer's NHWC input): one run of bytes
                src = a_off + b0 * width
                flip_into(a[src:src + (end - b0) * width], buf[:(end - b0) * width])
            else:
                for m in range(b0, end):
                    src, dst = a_off + m * lda, (m - b0) * width
                    flip_into(a[src:src + width], buf[dst:dst + width])
            _unsigned_rows(buf, -b0 * width, width, rows, w, kq, n, bias, row_coef, mult, left, rq, out_zp, lo,
                           hi, amx_w, chunks, out, o_off, ldo, b0, b1, table, general)

    @njit(_SIG_GEMM_IND, cache=True, nogil=True)
    def _gemm_rows_indirect(a, ind, zeros, segs, seg_valid, rows, w, kq, n, bias, row_coef, mult, left, rq,
                            out_zp, lo, hi, amx_w, chunks, out, o_off, ldo, r0, r1, table, general):
        """``_gemm_rows`` with row m made of the ``segs`` segments of ``4·kq`` bytes at
        ``ind[m·segs + s]`` in ``a`` (or, for a negative entry e, at −1 − e in ``zeros``): a
        convolution's taps in place. The row term sums the first ``seg_valid`` bytes of each
        segment (the rest multiply zero weights: row_segments' bytes past a filter row)."""
        corr = np.zeros(r1 - r0 + 8, dtype=np.int32)
        if row_coef != 0:
            for m in range(r0, r1):
                s = np.int32(0)
                for g in range(segs):
                    base = ind[m * segs + g]
                    for kk in range(seg_valid):
                        s += np.int32(a[base + kk] if base >= 0 else zeros[-1 - base + kk])
                corr[m - r0] = np.int32(np.int64(s) * row_coef)
        gbuf = amx.aligned_empty(amx.BLOCK_ROWS * segs * KSTEP * kq + amx.TILE_K if chunks else 0, np.uint8)
        _blocks(a, 0, segs, rows, w, kq, n, bias, mult, left, rq, out_zp, lo, hi, out, o_off, ldo,
                r0, r1, table, general, corr, segs * kq * 64, ind, zeros, amx_w, chunks, gbuf)


_SIG_GATHER = numba.void(ro(np.uint8, 1), *[I64] * 16, rw(np.uint8, 1))


@numba.njit(inline="always")
def _fill(dst, at, value, count):
    """dst[at:at + count] = value, indexed unsigned: numba guards signed indexes against negative
    wrap-around, which costs more than the fill of a few bytes."""
    a = np.uint64(at)
    j = np.uint64(0)
    while j < count:
        dst[a + j] = value
        j += np.uint64(1)


@njit(_SIG_GATHER, cache=True, nogil=True)
def _gather_rows(x, n_b, h, w, c, pad_byte, k_pad_byte, fh, fw, sh, sw, dh, dw, top, left, out_h, out_w, cols):
    """The im2col rows (flat, ``lda`` = len(cols) / rows bytes each): row (n, oy, ox), column
    (fy, fx, c) = x[n, iy, ix, c] (flat NHWC bytes), the zero point's byte outside the image, and
    ``k_pad_byte`` (A = 0) in the columns past K. With dilation 1 the fw taps of a filter row
    inside the image are one contiguous run of the input."""
    k = fh * fw * c
    rows = n_b * out_h * out_w
    lda = cols.shape[0] // max(rows, 1)
    run = fw * c
    pad = np.uint8(pad_byte)
    row = 0
    for n in range(n_b):
        for oy in range(out_h):
            for ox in range(out_w):
                dst = row * lda
                ix0 = ox * sw - left
                inside = dw == 1 and ix0 >= 0 and ix0 + fw <= w
                for fy in range(fh):
                    iy = oy * sh - top + fy * dh
                    col = dst + fy * run
                    if iy < 0 or iy >= h:
                        _fill(cols, col, pad, run)
                    elif inside:
                        copy_bytes(cols, col, x, ((n * h + iy) * w + ix0) * c, run)
                    else:
                        for fx in range(fw):
                            ix = ix0 + fx * dw
                            if 0 <= ix < w:
                                copy_bytes(cols, col + fx * c, x, ((n * h + iy) * w + ix) * c, c)
                            else:
                                _fill(cols, col + fx * c, pad, c)
                _fill(cols, dst + k, np.uint8(k_pad_byte), lda - k)
                row += 1


# ---- execution --------------------------------------------------------------------------------

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
#: Below this many multiply-accumulates a layer runs on the calling thread: a hand-off costs more.
PARALLEL_MACS = 2_000_000


def _workers(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers < threads:  # noqa: SLF001 - its size, read only
            _pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="nnhal-numba")
        return _pool


_NO_TABLE = np.zeros(0, dtype=np.uint8)


def _flipped(p: GemmPlan, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """The arrays as the tiles read them: flipped copies for int8 activations, else themselves."""
    if not p.a_xor:
        return arrays
    copies = tuple(np.empty_like(a) for a in arrays)
    for a, c in zip(arrays, copies):
        flip_into(a, c)
    return copies


def _flipping(p: GemmPlan, runner, arrays: tuple[np.ndarray, ...], copies: tuple[np.ndarray, ...]):
    """``runner`` (over ``copies``) preceded by the flip of ``arrays``' current contents into them."""
    if not p.a_xor:
        return runner
    return in_order(*(functools.partial(flip_into, a, c) for a, c in zip(arrays, copies)), runner)


def run(p: GemmPlan, a: np.ndarray, a_off: int, lda: int, rows: int, out: np.ndarray, o_off: int = 0,
        ldo: int | None = None, table: np.ndarray = _NO_TABLE) -> None:
    """Row m of the result (n bytes at ``out[o_off + m·ldo]``, ``out`` a flat uint8 view of the
    int8/uint8 output) from row m of ``a`` (``lda`` apart from ``a_off`` in a flat uint8 view).
    The rows are split over ``hal.backends.compute_threads()`` threads (the kernels release the
    GIL); 1 thread unless ``--threads`` says otherwise."""
    _split(_gemm_rows, (a, a_off, lda, rows, *p.kernel_args, out, o_off, p.n if ldo is None else ldo), p, rows,
           table)


def run_indirect(p: GemmPlan, a: np.ndarray, ind: np.ndarray, zeros: np.ndarray, segs: int, rows: int,
                 out: np.ndarray, table: np.ndarray = _NO_TABLE, seg_valid: int | None = None) -> None:
    """``run`` with row m made of the ``segs`` segments ``ind[m·segs:(m + 1)·segs]`` locate in
    ``a`` (``indirection``'s table; a negative entry e: byte −1 − e of ``zeros``), ``out`` rows n
    bytes apart; ``seg_valid``: the bytes of a segment its row term sums (default: all)."""
    a, zeros = _flipped(p, a, zeros)
    _split(_gemm_rows_indirect, _indirect_args(p, a, ind, zeros, segs, rows, out, seg_valid), p, rows, table)


def _indirect_args(p: GemmPlan, a, ind, zeros, segs: int, rows: int, out, seg_valid: int | None) -> tuple:
    _, packed, _, *rest = p.kernel_args  # a flipped a: no a_xor
    kq = p.kq // segs
    return (a, ind, zeros, segs, 4 * kq if seg_valid is None else seg_valid, rows, packed, kq, *rest, out, 0, p.n)


def bound(p: GemmPlan, a: np.ndarray, a_off: int, lda: int, rows: int, out: np.ndarray, o_off: int = 0,
          ldo: int | None = None, table: np.ndarray = _NO_TABLE):
    """``run`` on fixed arrays as a zero-argument runner (its arguments put together once)."""
    return _bound_split(_gemm_rows, (a, a_off, lda, rows, *p.kernel_args, out, o_off, p.n if ldo is None else ldo),
                        p, rows, table)


def bound_indirect(p: GemmPlan, a: np.ndarray, ind: np.ndarray, zeros: np.ndarray, segs: int, rows: int,
                   out: np.ndarray, table: np.ndarray = _NO_TABLE, seg_valid: int | None = None):
    """``run_indirect`` on fixed arrays as a zero-argument runner (``zeros`` flipped at each run
    too: a caller may refill it between runs)."""
    copies = (np.empty_like(a), np.empty_like(zeros)) if p.a_xor else (a, zeros)
    runner = _bound_split(_gemm_rows_indirect, _indirect_args(p, copies[0], ind, copies[1], segs, rows, out,
                                                              seg_valid), p, rows, table)
    return _flipping(p, runner, (a, zeros), copies)


def run_repacked(p: GemmPlan, packed: np.ndarray, bias: np.ndarray, a: np.ndarray, a_off: int, lda: int, rows: int,
                 out: np.ndarray, o_off: int, ldo: int) -> None:
    """``run`` with ``packed`` and ``bias`` in place of the plan's: weights known only at execution,
    packed as ``packed`` lays them out and their folded bias, the plan giving the shapes and the
    requantization; on the VNNI tiles (the AMX layout is not repacked)."""
    a_xor, _, kq, n, _, row_coef, mult, left, rq, out_zp, lo, hi, *_ = p.kernel_args
    _split(_gemm_rows, (a, a_off, lda, rows, a_xor, packed, kq, n, bias, row_coef, mult, left, rq, out_zp, lo, hi,
                        _NO_AMX, 0, out, o_off, ldo), p, rows, _NO_TABLE)


def _bound_split(kernel, args: tuple, p: GemmPlan, rows: int, table: np.ndarray):
    """``_split`` as a zero-argument runner: the kernel itself where the GEMM is too small to split
    or one thread computes (the compute threads as at binding)."""
    if threads_for(rows, p.k, p.n) == 1:
        return functools.partial(kernel, *args, 0, rows, table, p.flags)
    return functools.partial(_split, kernel, args, p, rows, table)


def bound_gather(p: GemmPlan, x: np.ndarray, fh: int, fw: int, sh: int, sw: int, dh: int, dw: int, top: int,
                 left: int, out_h: int, out_w: int):
    """``gather`` into a buffer allocated once: (the buffer, a zero-argument runner filling it)."""
    n_b, h, w, c = x.shape
    cols = np.empty((n_b * out_h * out_w, p.kq * KSTEP), dtype=np.uint8)
    fill = functools.partial(_gather_rows, x.reshape(-1).view(np.uint8), n_b, h, w, c, p.pad_byte, p.a_xor & 0xFF,
                             fh, fw, sh, sw, dh, dw, top, left, out_h, out_w, cols.reshape(-1))
    return cols, fill


def in_order(*calls):
    """One zero-argument runner making ``calls`` in order (the only call where there is one)."""
    return calls[0] if len(calls) == 1 else InOrder(calls)


def threads_for(rows: int, k: int, n: int) -> int:
    """The threads a rows × k × n GEMM is split over: the compute threads, or 1 below PARALLEL_MACS."""
    return (backends.compute_threads() or 1) if rows * k * n >= PARALLEL_MACS else 1


def _split(kernel, args: tuple, p: GemmPlan, rows: int, table: np.ndarray) -> None:
    """``kernel(*args, r0, r1, table, flags)`` over the rows, split over the compute threads."""
    threads = threads_for(rows, p.k, p.n)
    if threads == 1:
        kernel(*args, 0, rows, table, p.flags)
        return
    per_thread = -(-rows // threads)
    step = -(-per_thread // 8) * 8  # a multiple of 8 rows: whole tiles per thread
    parts = [(r, min(rows, r + step)) for r in range(0, rows, step)]
    futures = [_workers(threads).submit(kernel, *args, r0, r1, table, p.flags) for r0, r1 in parts[1:]]
    kernel(*args, *parts[0], table, p.flags)
    for f in futures:
        f.result()


def indirection(n_b: int, h: int, w: int, c: int, fh: int, fw: int, sh: int, sw: int, dh: int, dw: int, top: int,
                left: int, out_h: int, out_w: int) -> np.ndarray | None:
    """int32 [rows · fh·fw]: for output pixel (n, oy, ox) and tap (fy, fx), the byte offset of its
    ``c`` input channels in the flat NHWC input, or −1 outside the image (``run_indirect``'s
    table, in the im2col column order); None where an offset would not fit in int32."""
    if n_b * h * w * c >= 1 << 31:
        return None
    n = np.arange(n_b)[:, None, None, None, None]
    iy = (np.arange(out_h) * sh - top)[None, :, None, None, None] + (np.arange(fh) * dh)[None, None, None, :, None]
    ix = (np.arange(out_w) * sw - left)[None, None, :, None, None] + (np.arange(fw) * dw)[None, None, None, None, :]
    inside = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
    return np.ascontiguousarray(np.where(inside, ((n * h + iy) * w + ix) * c, -1).astype(np.int32).reshape(-1))


def gather(p: GemmPlan, x: np.ndarray, fh: int, fw: int, sh: int, sw: int, dh: int, dw: int, top: int, left: int,
           out_h: int, out_w: int) -> np.ndarray:
    """The im2col rows of ``x`` in bytes, each ``4·kq`` long (a 2-D uint8 array)."""
    n_b, h, w, c = x.shape
    cols = np.empty((n_b * out_h * out_w, p.kq * KSTEP), dtype=np.uint8)
    _gather_rows(x.reshape(-1).view(np.uint8), n_b, h, w, c, p.pad_byte, p.a_xor & 0xFF, fh, fw, sh, sw, dh, dw,
                 top, left, out_h, out_w, cols.reshape(-1))
    return cols
