"""A convolution whose input channels are not a multiple of 4 (an image's first layer, 3 channels)
read in place, one segment per filter row, instead of through an im2col copy.

With dilation 1 along x, filter row fy of output pixel (n, oy, ox) is one contiguous run of
``fw·c`` input bytes. The GEMM reads it as a segment of ``4·kq`` bytes (the run rounded up to whole
``vpdpbusd`` steps), whose weights past the run are 0: the bytes read past the run (the next
pixel's) multiply zeros, and a per-row term (a filter zero point other than the activations'
shift) sums only the run's bytes. A segment the image's edge cuts (or that would read past
the input's end) is gathered per execution into a small buffer after a block of zero-point bytes
(``edge_segments``); a filter row wholly outside the image reads that block.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np

from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.gemm import KSTEP, GemmPlan
from hal.backends.numba_kernels.lazy import njit


@dataclass
class RowSegments:
    ind: np.ndarray  # int32 [rows · fh]: gemm.run_indirect's table (negative: −1 − byte in the buffer)
    edges: np.ndarray  # int64 [E, 2]: a cut segment's first input pixel (n·h + iy)·w and its ix0
    seg_bytes: int  # 4·kq per segment
    plan: GemmPlan | None = None  # the GEMM of padded_filter's weights


def segment_bytes(fw: int, c: int) -> int:
    return -(-fw * c // KSTEP) * KSTEP


def padded_filter(values: np.ndarray, fh: int, fw: int, c: int) -> np.ndarray:
    """[out_c, fh·fw·c] filter values -> [fh · seg_bytes, out_c]: each filter row's weights, then
    weights that pack to 0 (gemm packs a uint8 weight as value XOR 0x80: 128 there)."""
    seg = segment_bytes(fw, c)
    fill = 128 if values.dtype == np.uint8 else 0
    w = np.full((values.shape[0], fh, seg), fill, dtype=values.dtype)
    w[:, :, :fw * c] = values.reshape(values.shape[0], fh, fw * c)
    return np.ascontiguousarray(w.reshape(values.shape[0], -1).T)


def plan(n_b: int, h: int, w: int, c: int, fh: int, fw: int, sh: int, sw: int, dh: int, top: int, left: int,
         out_h: int, out_w: int) -> RowSegments | None:
    """The table for a convolution with dilation 1 along x; None where offsets would not fit int32."""
    seg = segment_bytes(fw, c)
    size = n_b * h * w * c
    if size + seg >= 1 << 31:
        return None
    n = np.arange(n_b)[:, None, None, None]
    iy = (np.arange(out_h) * sh - top)[None, :, None, None] + (np.arange(fh) * dh)[None, None, None, :]
    ix0 = (np.arange(out_w) * sw - left)[None, None, :, None] + np.zeros((1, 1, 1, fh), dtype=np.int64)
    n, iy, ix0 = np.broadcast_arrays(n, iy, ix0)
    row_in = (iy >= 0) & (iy < h)
    start = ((n * h + iy) * w + ix0) * c
    whole = row_in & (ix0 >= 0) & (ix0 + fw <= w) & (start + seg <= size)
    cut = row_in & ~whole
    edges = np.stack([((n * h + iy) * w)[cut], ix0[cut]], axis=1).astype(np.int64).reshape(-1, 2)
    ind = np.full(n.shape, -1, dtype=np.int64)  # the zero-point block at byte 0
    ind[whole] = start[whole]
    ind[cut] = -1 - seg * (1 + np.arange(len(edges)))
    return RowSegments(np.ascontiguousarray(ind.astype(np.int32).reshape(-1)), edges, seg)


_SIG = numba.void(ro(np.uint8, 1), ro(np.int64, 2), numba.int64, numba.int64, numba.int64, numba.int64, numba.int64,
                  rw(np.uint8, 1))


@njit(_SIG, cache=True, nogil=True)
def _fill(x, edges, w, c, fw, pad, seg, buf):
    """buf: ``seg`` zero-point bytes, then each cut segment's taps (zero point outside the image)."""
    p = np.uint8(pad)
    for j in range(seg):
        buf[j] = p
    for e in range(edges.shape[0]):
        base = seg * (1 + e)
        pix, ix0 = edges[e, 0], edges[e, 1]
        for fx in range(fw):
            ix = ix0 + fx
            if 0 <= ix < w:
                src = (pix + ix) * c
                for ch in range(c):
                    buf[base + fx * c + ch] = x[src + ch]
            else:
                for ch in range(c):
                    buf[base + fx * c + ch] = p
        for j in range(fw * c, seg):
            buf[base + j] = p


def edge_segments(r: RowSegments, x: np.ndarray, w: int, c: int, fw: int, pad_byte: int) -> np.ndarray:
    """The execution's buffer of zero-point and cut segments for the flat uint8 input ``x``."""
    buf = np.empty(r.seg_bytes * (1 + len(r.edges)), dtype=np.uint8)
    _fill(x, r.edges, w, c, fw, pad_byte, r.seg_bytes, buf)
    return buf


def bound_edge_segments(r: RowSegments, x: np.ndarray, w: int, c: int, fw: int, pad_byte: int):
    """``edge_segments`` into a buffer allocated once: (the buffer, a zero-argument runner filling
    it from ``x``'s current contents)."""
    buf = np.empty(r.seg_bytes * (1 + len(r.edges)), dtype=np.uint8)
    return buf, functools.partial(_fill, x, r.edges, w, c, fw, pad_byte, r.seg_bytes, buf)
