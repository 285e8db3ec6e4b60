"""The float32 BLAS path's requantization (conv.py, where the CPU has no AVX-512 VNNI) on 16-lane
vectors: rows of exact integer sums (float32) to 8-bit outputs.

Why: conv.py's scalar loop (``_requantize_right``) spends most of an 8-bit 1x1 layer's time there
on an AVX2 core (MobileNetV2's 112x112 16->96 expansion: 2.1 ms of requantization beside 0.4 ms
of GEMM): its 64-bit products and arithmetic shifts are not vectorised without AVX-512. Here each
16 channels of a row are converted to int32, the bias added (int32 wrap-around, TFLite's
accumulator), then requantized by simd.requantize_lanes (the depthwise kernels' multiply, the
same integer steps as fixedpoint's) with the output zero point and clamp, and stored as bytes:
the scalar loop's bytes, for layers whose shifts are all right shifts and whose multipliers are
QuantizeMultiplier's (``right_only``). A row's last block of fewer than 16 channels is stored
through a 16-byte scratch and memcpy (a masked byte store is a byte at a time there).
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hal.backends.numba_kernels.f32_simd import _lanes_below, _load
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.backends.numba_kernels.simd import LANES, _data, counted_loop, requantize_lanes, splat

_I64 = numba.int64


def lanes(bias: np.ndarray, multipliers: np.ndarray, shifts: np.ndarray) -> tuple[np.ndarray, ...]:
    """The per-channel int32 arrays ``requantize`` reads, padded to whole 16s: the bias wrapped to
    int32 (the accumulator's wrap-around), the multiplier and the right shift (-shift)."""
    n = bias.shape[0]
    cp = -(-n // LANES) * LANES
    out = [np.zeros(cp, np.int32) for _ in range(3)]
    out[0][:n] = ((bias.astype(np.int64) + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)
    out[1][:n] = multipliers
    out[2][:n] = -np.asarray(shifts, np.int64)
    return tuple(out)


@intrinsic
def _row(typingctx, acc, a_off, bias, mult, right, zp, lo, hi, out, o_off, n):
    sig = types.void(acc, a_off, bias, mult, right, zp, lo, hi, out, o_off, n)

    def codegen(context, builder, signature, args):
        acc_arr, a_off_v, bias_arr, mult_arr, right_arr, zp_v, lo_v, hi_v, out_arr, o_off_v, n_v = args
        f32, i8, i32, i64 = ir.FloatType(), ir.IntType(8), ir.IntType(32), ir.IntType(64)
        vf, v32, v8 = ir.VectorType(f32, LANES), ir.VectorType(i32, LANES), ir.VectorType(i8, LANES)
        sa = signature.args
        ap, op = _data(context, builder, sa[0], acc_arr, f32), _data(context, builder, sa[8], out_arr, i8)
        bp, mp, rp = (_data(context, builder, sa[k], arr, i32) for k, arr in ((2, bias_arr), (3, mult_arr),
                                                                               (4, right_arr)))
        zp, lo, hi = (splat(builder, builder.trunc(v, i32), v32) for v in (zp_v, lo_v, hi_v))
        zero = ir.Constant(v32, [0] * LANES)
        scratch = cgutils.alloca_once(builder, v8)

        def vec(ptr, at, vtype):
            return builder.load(builder.bitcast(builder.gep(ptr, [at]), vtype.as_pointer()), align=4)
        c, _, close = counted_loop(builder, "ch", n_v, step=LANES)
        left = builder.sub(n_v, c)
        whole = builder.icmp_signed(">=", left, ir.Constant(i64, LANES))
        sums = _load(builder, builder.gep(ap, [builder.add(a_off_v, c)]), _lanes_below(builder, left),
                     ir.Constant(vf, [0.0] * LANES))
        v = builder.add(builder.fptosi(sums, v32), vec(bp, c, v32))
        q = builder.trunc(requantize_lanes(builder, v, vec(mp, c, v32), zero, vec(rp, c, v32), zp, lo, hi,
                                           shifts_left=False), v8)
        dst = builder.gep(op, [builder.add(o_off_v, c)])
        with builder.if_else(whole) as (full, part):
            with full:
                builder.store(q, builder.bitcast(dst, v8.as_pointer()), align=1)
            with part:
                builder.store(q, scratch, align=1)
                cgutils.raw_memcpy(builder, dst, builder.bitcast(scratch, i8.as_pointer()), left, 1)
        close()
        return context.get_dummy_value()
    return sig, codegen


_SIGS = [numba.void(ro(np.float32, 1), _I64, _I64, ro(np.int32, 1), ro(np.int32, 1), ro(np.int32, 1), _I64, _I64,
                    _I64, rw(t, 1)) for t in (np.int8, np.uint8)]


@njit(_SIGS, cache=True, nogil=True)
def requantize(acc, rows, n, bias, mult, right, out_zp, lo, hi, out):
    """out[r·n + c] = clamp(MultiplyByQuantizedMultiplier(int32(acc[r·n + c]) + bias[c]) + out_zp)
    for ``rows`` rows of ``n`` channels (``lanes``' arrays)."""
    for r in range(rows):
        _row(acc, r * n, bias, mult, right, out_zp, lo, hi, out, r * n, n)
