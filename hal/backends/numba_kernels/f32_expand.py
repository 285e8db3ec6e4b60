"""hal.fusion's ``expand_depthwise`` on float32: an inverted residual block's 1x1 expansion (and its
activation) computed a few rows at a time, as the depthwise layer after it reaches them.

Why: the expansion multiplies a block's channels (MobileNetV2's first block writes 112x112x96
floats, 4.8 MB, for a depthwise layer to read back): run as two layers, that tensor goes to the
L3 cache and returns, and the 1x1 layer with few input channels waits on those stores. Here the
expansion's rows live in a buffer of a few rows (``RING_BYTES``, at least 2·kh rows; kh: the
depthwise filter's height) that stays in L2: before each depthwise output row, the expansion rows
its window needs that are not yet computed are (f32_conv's tiles, the activation in their
epilogue), each stored after the last; when the window would pass the buffer's end, the rows it
still needs (kh - stride of them) move to the buffer's start first, so that its rows always lie
consecutively, and a row is moved once per few output rows, not stored twice. Then
f32_depthwise's kernel computes that output row from them as from an image of those rows (its
padding rows and columns, and a PAD fused before it, read as zeros as always).

The arithmetic is the two kernels' own, each on the same values: results are the unfused steps'
bytes (tests/backends/test_numba_f32_expand.py compares with those and with the reference).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np

from hal.backends.numba_kernels import BACKEND
from hal.backends.numba_kernels import f32_depthwise as dw
from hal.backends.numba_kernels.f32_conv import (
    ACT_SHIFT,
    ALPHA,
    IN_PLACE,
    RESIDUAL,
    ConvEpilogue,
    FloatConv,
    _clamps,
    _gemm,
    _gemm_windows,
)
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.backends.numba_kernels.simd import copy_bytes, l2_bytes

#: The expansions fused: at least this many bytes per image (a smaller one stays in L2 between the
#: two layers anyway: fused, MobileNetV2's 28x28x192 and 14x14 blocks ran slower) and rows of at
#: least ``MIN_WIDTH`` pixels (each of the 1x1 layer's passes over its weights computes one row).
MIN_BYTES = 1 << 20
MIN_WIDTH = 32
#: The expansion rows' buffer: about this many bytes, at least 2·kh rows: half the core's L2 (an L2 of
#: unknown size counts as 1 MB), at most 512 KB. The ring is to stay in L2 beside the 1x1 layer's
#: weights and input rows.
RING_BYTES = min(512 * 1024, (l2_bytes() or 1 << 20) // 2)
#: Whether blocks are fused on this machine: where the L2 holds a ring of at least 256 KB. With a
#: 512 KB L2 (AMD Zen 3) and a 256 KB ring, MobileNetV2 whole ran 4-7% faster fused than apart,
#: paired with LiteRT in one process (1.09-1.16x LiteRT apart, 1.05-1.09x fused); a 512 KB ring
#: there was 2% slower than 256 KB, and before the ring's rows moved by memmove (simd.copy_bytes)
#: every fused form there was slower than apart.
FUSES = RING_BYTES >= 256 * 1024

_RO, _RW, _GEOMETRY = ro(np.float32, 1), rw(np.float32, 1), ro(np.int64, 1)
_SIG = [numba.void(_RO, _RO, _RO, _GEOMETRY, _RO, numba.int64, _RO, _RO, _GEOMETRY, _RO, rw(np.int64, 1), _RW,
                   _RW)]


def _driver_of(kernel: int):
    """``run`` for f32_depthwise's kernel ``kernel``: its unrolled rows (filter size, stride and
    group as closure ints, literals to the intrinsic) or its general one. The closure holds ints
    only: numba's cache keys a closure on its cells' pickle, and a compiled function's differs per
    process, which would compile the drivers again at every start."""
    general = kernel == len(dw.UNROLL)
    size, stride = (3, 1) if general else list(dw.UNROLL)[kernel]
    unroll = dw.UNROLL[(size, stride)]

    @njit(_SIG, cache=True, nogil=True)
    def run(x, cw, cbias, cg, clamps, flags, dw_w, dw_b, dg, dw_clamp, window, ring, out):
        """x [N, H, W, Cin] flat through the 1x1 layer (``cg``, packed ``cw``, ``cbias``, clamps,
        epilogue ``flags``: its activation) into ``ring`` (whole rows of W·E, at least 2·kh), and
        the depthwise layer (``dg``) from it into ``out`` [N, OH, OW, E]; ``window``: a copy of
        ``dg`` set per output row to the rows it reads."""
        batch, h, w, cin, e, group = cg[0], cg[1], cg[2], cg[3], cg[14], cg[16]
        lo, hi, lo2, hi2 = clamps[0], clamps[1], clamps[2], clamps[3]
        kh, sh, pt, oh, ow = dg[dw.KH], dg[dw.SH], dg[dw.PT], dg[dw.OH], dg[dw.OW]
        row = w * e
        rows = ring.shape[0] // row
        for n in range(batch):
            done = 0  # the expansion's rows computed for this image
            base = 0  # the expansion row at the ring's start
            for oy in range(oh):
                top = oy * sh - pt
                first, last = max(top, 0), min(top + kh, h)
                if last - base > rows:  # past the end: the rows still needed to the start
                    done = max(done, first)  # (a stride wider than the filter skips rows)
                    if done > first:
                        copy_bytes(ring, 0, ring, 4 * (first - base) * row, 4 * (done - first) * row)
                    base = first
                while done < last:
                    slot = (done - base) * row
                    at = (n * h + done) * w * cin
                    if flags:
                        _gemm_windows(x, at, w, cin, cw, cbias, e, lo, hi, ring, slot, group, cin, cin, 0, x, x,
                                      flags, lo2, hi2)
                    else:
                        _gemm(x, at, w, cin, cw, cbias, e, lo, hi, ring, slot, group)
                    done += 1
                window[dw.H] = max(last - first, 0)
                window[dw.PT] = first - top
                start, o = (first - base) * row, ((n * oh + oy) * ow) * e
                if general:
                    dw._any(ring, start, dw_w, dw_b, window, out, o, dw_clamp[0], dw_clamp[1])
                else:
                    dw._rows(size, size, stride, unroll, ring, start, dw_w, dw_b, window, out, o, dw_clamp[0],
                             dw_clamp[1])
    return run


#: One driver per f32_depthwise kernel.
DRIVERS = tuple(_driver_of(k) for k in range(len(dw.KERNELS)))


@dataclass
class ExpandDepthwise:
    """The fused step's plan: the 1x1 layer, its clamps (conv lo, hi, epilogue lo, hi) and epilogue
    flags (an activation only), and the depthwise layer."""

    conv: FloatConv
    clamps: np.ndarray
    flags: int
    depthwise: dw.FloatDepthwise


def plan(ctx) -> ExpandDepthwise | None:
    """The members' plans: f32_conv's (a 1x1 layer read in place, maybe with its activation's
    epilogue) and f32_depthwise's (maybe with a PAD before it and its activation)."""
    if not FUSES:
        return None
    a, b = ctx.members
    conv, flags, clamps = a.ctx.data, 0, None
    if isinstance(conv, ConvEpilogue):
        if conv.flags & (RESIDUAL | ALPHA):
            return None
        conv, flags, clamps = conv.conv, conv.flags, _clamps(conv.conv, conv.lo, conv.hi)
    d = b.ctx.data
    if not isinstance(conv, FloatConv) or not isinstance(d, dw.FloatDepthwise) or conv.geometry[15] != IN_PLACE:
        return None
    batch, h, w, e = conv.out_shape
    if (int(d.geometry[dw.H]), int(d.geometry[dw.W]), int(d.geometry[dw.C])) != (h, w, e) \
            or h * w * e * 4 < MIN_BYTES or w < MIN_WIDTH or w * e < 16:  # (rows move in 64-byte steps)
        return None
    return ExpandDepthwise(conv, _clamps(conv) if clamps is None else clamps, flags >> ACT_SHIFT << ACT_SHIFT, d)


def _ring(p: ExpandDepthwise) -> np.ndarray:
    g = p.depthwise.geometry
    row = int(g[dw.W]) * int(g[dw.C])
    return dw._aligned(max(2 * int(g[dw.KH]), RING_BYTES // (4 * row)) * row)


def _call(p: ExpandDepthwise, x: np.ndarray, out: np.ndarray):
    """The driver's call on contiguous ``x`` and ``out`` (new ring and window: a call of its own)."""
    d = p.depthwise
    head = dw._head(out, int(d.geometry[dw.C]))
    aligned = d.weights.ctypes.data % 64 == d.bias.ctypes.data % 64 == 0
    w, b, shift = d._shifted(head) if head or not aligned else (d.weights, d.bias, 0)
    window = d._geometry(x[:1], head, shift)
    window[dw.OH] = 1
    c = p.conv
    return functools.partial(DRIVERS[d.kernel], x.reshape(-1), c.weights, c.bias, c.geometry, p.clamps, p.flags,
                             w, b, d.geometry, d.clamp, window, _ring(p), out.reshape(-1))


def execute(ctx, inputs: list) -> list:
    p: ExpandDepthwise = ctx.data
    g = p.depthwise.geometry
    x = np.ascontiguousarray(inputs[0], np.float32)
    out = dw._aligned(x.shape[0] * int(g[dw.OH] * g[dw.OW] * g[dw.C]), x.ctypes.data % 64)
    out = out.reshape(x.shape[0], int(g[dw.OH]), int(g[dw.OW]), int(g[dw.C]))
    _call(p, x, out)()
    return [out]


def bind(ctx, inputs: list, outputs: list):
    x, out = inputs[0], outputs[0]
    if x is None or not all(a.dtype == np.float32 and a.flags.c_contiguous and a.flags.aligned for a in (x, out)):
        return None
    return _call(ctx.data, x, out)


BACKEND.register_fusion("expand_depthwise", plan=plan, execute=execute, bind=bind)
