"""gemm's rows on the AMX tiles: blocks of 32 (or 16) rows through amx.sums, then the VNNI tiles'
requantizing epilogue over the int32 sums (vnni's ``sums_*`` tiles), which amx_conv shares.

Compiled where numba targets a CPU with AMX-INT8 (``amx.COMPILED``); elsewhere ``rows_on_tiles``
computes nothing and hands every row back to the VNNI tiles, and ``requantize_sums`` does not
exist (nor does amx_conv's kernel).
"""
from __future__ import annotations

import numba
import numpy as np

from hal.backends.numba_kernels import amx, vnni
from hal.backends.numba_kernels.simd import copy_bytes

PANEL, KSTEP = vnni.PANEL, vnni.KSTEP

if amx.COMPILED:
    from hal.backends.numba_kernels.vnni import sums_8x1, sums_8x2, sums_8x3, sums_8x4

    @numba.njit(inline="always")
    def requantize_sums(sums, ldsum, g, panels, n, w, corr, co, bias, mult, left, rq, out_zp, lo, hi, out, o_off,
                        ldo, general):
        """The ``g`` rows of int32 sums (``ldsum`` apart; amx.sums') requantized by the VNNI
        tiles' epilogue into the rows ``ldo`` apart from ``out[o_off]`` (row terms from
        ``corr[co]``)."""
        for p0 in range(0, panels, 4):
            nr = min(4, panels - p0)
            c0 = p0 * PANEL
            nc = n - c0
            for r in range(0, g, 8):
                so, cr, oo = r * ldsum + c0, co + r, o_off + r * ldo
                if nr == 4:
                    sums_8x4(sums, so, ldsum, 8, w, 0, 0, 0, corr, cr, bias, mult, left, rq, c0, out_zp, lo, hi,
                             out, oo, ldo, 8, nc, general)
                elif nr == 3:
                    sums_8x3(sums, so, ldsum, 8, w, 0, 0, 0, corr, cr, bias, mult, left, rq, c0, out_zp, lo, hi,
                             out, oo, ldo, 8, nc, general)
                elif nr == 2:
                    sums_8x2(sums, so, ldsum, 8, w, 0, 0, 0, corr, cr, bias, mult, left, rq, c0, out_zp, lo, hi,
                             out, oo, ldo, 8, nc, general)
                else:
                    sums_8x1(sums, so, ldsum, 8, w, 0, 0, 0, corr, cr, bias, mult, left, rq, c0, out_zp, lo, hi,
                             out, oo, ldo, 8, nc, general)

    @numba.njit(inline="always")
    def rows_on_tiles(a, a_off, lda, w, kq, n, bias, mult, left, rq, out_zp, lo, hi, out, o_off, ldo, r0, b0, r1,
                      corr, panels, general, ind, zeros, amx_w, chunks, sums, gbuf):
        """Whole blocks of 32 (or 16) rows of [b0, r1) on the AMX tiles (amx.sums into ``sums``,
        then the VNNI tiles' epilogue from there); returns the first row left to the VNNI
        tiles. Indirect rows are gathered a block at a time into ``gbuf`` first (the tiles
        load rows a constant stride apart); rows read in place stop where a tile row's
        64-byte steps would read past ``a``."""
        if chunks == 0 or r1 - b0 < amx.TILE_ROWS:
            return b0
        indirect = ind.shape[0] > 0
        pairs = (panels + 1) // 2
        ldsum = 2 * PANEL * pairs
        seg = KSTEP * kq
        width = lda * seg  # indirect: lda segments of kq blocks
        i = b0
        amx.configure()
        while r1 - i >= amx.TILE_ROWS:
            g = amx.BLOCK_ROWS if r1 - i >= amx.BLOCK_ROWS else amx.TILE_ROWS
            if indirect:
                for m in range(g):
                    for s in range(lda):
                        e = np.int64(ind[(i + m) * lda + s])
                        if e >= 0:
                            copy_bytes(gbuf, m * width + s * seg, a, e, seg)
                        else:
                            copy_bytes(gbuf, m * width + s * seg, zeros, -1 - e, seg)
                amx.sums(gbuf, 0, width, 1, 0, chunks, amx_w, pairs, g // amx.TILE_ROWS, sums, ldsum)
            else:
                off = a_off + i * lda
                if off + (g - 1) * lda + amx.TILE_K * chunks > a.shape[0]:
                    break
                amx.sums(a, off, lda, 1, 0, chunks, amx_w, pairs, g // amx.TILE_ROWS, sums, ldsum)
            requantize_sums(sums, ldsum, g, panels, n, w, corr, i - r0, bias, mult, left, rq, out_zp, lo, hi, out,
                            o_off + i * ldo, ldo, general)
            i += g
        amx.release()
        return i
else:
    @numba.njit(inline="always")
    def rows_on_tiles(a, a_off, lda, w, kq, n, bias, mult, left, rq, out_zp, lo, hi, out, o_off, ldo, r0, b0, r1,
                      corr, panels, general, ind, zeros, amx_w, chunks, sums, gbuf):
        return b0
