"""A k×k convolution on the AMX tiles with its taps read in place, no im2col rows.

With dilation 1 along x, filter row fy of output pixel (n, oy, ox) is one run of ``fw · c``
input bytes, and the same run of the next output pixel starts ``stride_w · c`` bytes later. So
for 16 output pixels of one output row and one filter row, an AMX A tile is a strided load
straight from the input (row stride ``stride_w · c``), 64 bytes of the run at a time; the filter
rows are the runs of ``amx.sums``. Each run is read in whole 64-byte steps: the filter's weights
are padded with zeros to whole tiles per filter row (``plan``), and the bytes read past a run
(the next pixels') multiply those zeros.

The input is copied once per execution into a padded buffer (its borders the input zero point),
flipped to the tiles' unsigned bytes as it goes for int8 (the copy the VNNI tiles' indirect path
makes to flip it), so no tile row ever crosses the image's edge. An output row's pixels are
taken 32 (or 16) at a time; the last block of a row starts at ``out_w − 16`` or ``− 32`` and
recomputes a few pixels rather than leaving a partial tile. Rows narrower than 16 pixels, a
row term (a uint8 filter whose zero point is not 128) and dilation along x keep gemm's paths.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np

from hal.backends.numba_kernels import amx, gemm
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit

I64 = numba.int64


@dataclass
class AmxConv:
    """A single-group CONV_2D planned for ``_conv_rows``."""

    plan: gemm.GemmPlan  # the filter with each filter row's run padded to run_chunks · 64 bytes
    run_chunks: int  # 64-byte tile steps per filter row
    filter_h: int
    stride_h: int
    stride_w: int
    dilation_h: int
    pad_top: int
    pad_left: int
    padded_h: int  # the input rows the taps reach, from −pad_top
    padded_w: int  # the input columns the taps reach, from −pad_left
    out_h: int
    out_w: int
    in_c: int


def plan(values: np.ndarray, w_zp: int, bias: np.ndarray, x_dtype: np.dtype, x_zp: int, mult: np.ndarray,
         shift: np.ndarray, ozp: int, lo: int, hi: int, fh: int, fw: int, sh: int, sw: int, dh: int, dw: int,
         top: int, left: int, out_h: int, out_w: int) -> AmxConv | None:
    """``values``: [out_c, fh·fw·c] filter values; None where the AMX tiles do not run this layer."""
    no_row_term = w_zp == (128 if values.dtype == np.uint8 else 0)  # each row's own byte sum: gemm's paths
    if not (amx.AVAILABLE and no_row_term and dw == 1 and out_w >= amx.TILE_ROWS):
        return None
    out_c, k = values.shape
    c = k // (fh * fw)
    run = fw * c
    chunks = -(-run // amx.TILE_K)
    fill = 128 if values.dtype == np.uint8 else 0  # packs to 0 (gemm packs uint8 weights XOR 0x80)
    w = np.full((out_c, fh, chunks * amx.TILE_K), fill, dtype=values.dtype)
    w[:, :, :run] = values.reshape(out_c, fh, run)
    p = gemm.make_plan(np.ascontiguousarray(w.reshape(out_c, -1).T), w_zp, bias, x_dtype, x_zp, mult, shift, ozp,
                       lo, hi, k_real=k)
    return AmxConv(p, chunks, fh, sh, sw, dh, top, left, (out_h - 1) * sh + (fh - 1) * dh + 1, (out_w - 1) * sw + fw,
                   out_h, out_w, c)


_SIG_PAD = numba.void(ro(np.uint8, 1), *[I64] * 10, rw(np.uint8, 1))


@njit(_SIG_PAD, cache=True, nogil=True)
def _pad_rows(x, n_b, h, w, c, top, left, hp, wp, pad_byte, xor, xp):
    """xp[n, yp, xq, :] = x[n, yp − top, xq − left, :] XOR ``xor`` inside the image, else
    ``pad_byte`` XOR ``xor`` (the flat NHWC bytes of both; xp's last bytes are left as they are)."""
    flip = np.uint8(xor)
    pad = np.uint8(pad_byte) ^ flip
    row = np.uint64(wp * c)
    head = np.uint64(min(left, wp) * c)
    inside = np.uint64(max(0, min(left + w, wp) - left) * c)
    for nb in range(n_b):
        for yp in range(hp):
            dst = np.uint64((nb * hp + yp) * wp * c)
            iy = yp - top
            if iy < 0 or iy >= h:
                for j in range(row):
                    xp[dst + j] = pad
                continue
            for j in range(head):
                xp[dst + j] = pad
            src = np.uint64((nb * h + iy) * w * c)
            for j in range(inside):
                xp[dst + head + j] = x[src + j] ^ flip
            for j in range(head + inside, row):
                xp[dst + j] = pad


_SIG_CONV = numba.void(ro(np.uint8, 1), *[I64] * 10, ro(np.int8, 1), I64, ro(np.int32, 1), ro(np.int32, 1),
                       ro(np.int32, 1), ro(np.int64, 1), I64, I64, I64, ro(np.int8, 1), rw(np.uint8, 1), I64, I64,
                       ro(np.uint8, 1), I64)

if amx.COMPILED:
    from hal.backends.numba_kernels.amx_blocks import requantize_sums

    @njit(_SIG_CONV, cache=True, nogil=True)
    def _conv_rows(xp, hp, wp, c, fh, sh, sw, dh, run_chunks, out_h, out_w, w, n, bias, mult, left, rq,
                   out_zp, lo, hi, amx_w, out, r0, r1, table, general):
        """Output rows [r0, r1) (row = n · out_h + oy, ``out_w · n`` bytes each) from the padded
        input ``xp``: per block of 32 (or 16) output pixels, amx.sums over the ``fh`` filter
        rows' runs, then the VNNI tiles' epilogue; ``table`` (256 bytes, or empty) looked up on
        each output row after it."""
        panels = (n + gemm.PANEL - 1) // gemm.PANEL
        pairs = (panels + 1) // 2
        ldsum = 2 * gemm.PANEL * pairs
        sums = amx.aligned_empty(amx.BLOCK_ROWS * ldsum, np.int32)
        corr = np.zeros(amx.BLOCK_ROWS, dtype=np.int32)  # no row term (plan)
        step, run_stride = sw * c, dh * wp * c
        amx.configure()
        for row in range(r0, r1):
            nb, oy = row // out_h, row % out_h
            base = (nb * hp + oy * sh) * wp * c
            ox = 0
            while ox < out_w:
                g = amx.BLOCK_ROWS if out_w - ox >= amx.BLOCK_ROWS else amx.TILE_ROWS
                ox = min(ox, out_w - g)  # the row's last block: back over pixels done, not a partial tile
                amx.sums(xp, base + ox * step, step, fh, run_stride, run_chunks, amx_w, pairs, g // amx.TILE_ROWS,
                         sums, ldsum)
                requantize_sums(sums, ldsum, g, panels, n, w, corr, 0, bias, mult, left, rq, out_zp, lo, hi, out,
                                (row * out_w + ox) * n, n, general)
                ox += g
            if table.shape[0] == 256:
                gemm.lookup_in_place(out, row * out_w * n, out_w * n, table)
        amx.release()


def padded_input(d: AmxConv, n_b: int) -> np.ndarray:
    """The buffer ``_pad_rows`` fills: the padded input and a tile row's reach past its end."""
    return amx.aligned_zeros(n_b * d.padded_h * d.padded_w * d.in_c + amx.TILE_K)


def bound(d: AmxConv, x: np.ndarray, out: np.ndarray, table: np.ndarray = gemm._NO_TABLE):
    """The convolution of the fixed contiguous NHWC ``x`` into the fixed ``out`` as a zero-argument
    runner: the padded copy, then the tiles over the output rows (split over the compute threads)."""
    n_b, h, w, c = x.shape
    p = d.plan
    xp = padded_input(d, n_b)
    pad = functools.partial(_pad_rows, x.reshape(-1).view(np.uint8), n_b, h, w, c, d.pad_top, d.pad_left, d.padded_h,
                            d.padded_w, p.pad_byte, p.a_xor & 0xFF, xp)
    args = (xp, d.padded_h, d.padded_w, c, d.filter_h, d.stride_h, d.stride_w, d.dilation_h, d.run_chunks, d.out_h,
            d.out_w, p.packed, p.n, p.bias, p.multipliers, p.left, p.requant, p.output_zp, p.act_min, p.act_max,
            p.amx_args[0], out.reshape(-1).view(np.uint8))
    return gemm.in_order(pad, gemm._bound_split(_conv_rows, args, p, n_b * d.out_h, table))


def run(d: AmxConv, x: np.ndarray, out: np.ndarray, table: np.ndarray = gemm._NO_TABLE) -> None:
    bound(d, x, out, table)()
