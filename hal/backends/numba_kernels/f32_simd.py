"""16-lane float32 kernels written as LLVM vector IR (numba intrinsics) for f32_layout.py's pools and
moves: loops over a few dozen channels, which numba's own loops leave to LLVM's scalar remainder
(a 32-float vector loop never starts on 24 channels), and running maxima and sums that are to stay
in registers across a window's taps. Generic LLVM vector operations and masked loads and stores,
valid on every CPU (LLVM splits the 16 lanes into whatever registers the machine has); a row's
last vector is masked, so any length takes whole vectors and nothing outside a row is touched.

- ``move_rows``: rows of a source copied into rows of a destination, each followed by a fill
  value (PAD's rows, CONCATENATION's slabs, RESHAPE's copy).
- ``max_windows`` / ``avg_windows`` / ``scaled_windows``: a run of pooling windows, 16, 32 or 64
  channels at a time in registers over the window's taps.
"""
from __future__ import annotations

import math

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hal.backends.numba_kernels.simd import ACCUMULATORS, _data, counted_loop, splat

LANES = 16
_F, _I32, _I64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
_VF = ir.VectorType(_F, LANES)
_MASK = ir.VectorType(ir.IntType(1), LANES)


def _lanes_below(builder, left):
    """The mask of lanes k < ``left`` (an i64, any sign)."""
    sixteen = ir.Constant(_I64, LANES)
    left = builder.select(builder.icmp_signed("<", left, sixteen), left, sixteen)
    left = builder.trunc(builder.select(builder.icmp_signed(">", left, ir.Constant(_I64, 0)), left,
                                        ir.Constant(_I64, 0)), _I32)
    vi = ir.VectorType(_I32, LANES)
    return builder.icmp_signed("<", ir.Constant(vi, list(range(LANES))), splat(builder, left, vi))


#: Whether a masked store is one instruction (AVX-512's mask registers); elsewhere (AVX2's
#: ``vmaskmovps``) it is microcoded on some cores, dozens of cycles, so ``store_first`` stores whole
#: halves plainly and masks only the half a row ends in.
MASKED_STORE_IS_CHEAP = ACCUMULATORS >= 16


def store_first(builder, value, ptr, n) -> None:
    """Store lanes k < ``n`` (an i64: none where n <= 0, every lane from 16) of the 16-lane float
    ``value`` at ``ptr``, nothing past them."""
    i64 = ir.IntType(64)
    if MASKED_STORE_IS_CHEAP:
        with builder.if_else(builder.icmp_signed(">=", n, ir.Constant(i64, LANES))) as (whole, part):
            with whole:
                _store(builder, value, ptr)
            with part:
                _store(builder, value, ptr, _lanes_below(builder, n))
        return
    half = LANES // 2
    vh = ir.VectorType(_F, half)
    halves = [builder.shuffle_vector(value, value, ir.Constant(ir.VectorType(_I32, half), list(range(h, h + half))))
              for h in (0, half)]
    ptrs = [builder.bitcast(builder.gep(ptr, [ir.Constant(i64, h)]), vh.as_pointer()) for h in (0, half)]
    masked = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [vh, vh.as_pointer(), _I32, ir.VectorType(ir.IntType(1), half)]),
        "llvm.masked.store.v8f32.p0")

    def first(m):
        lanes = ir.Constant(ir.VectorType(_I32, half), list(range(half)))
        return builder.icmp_signed("<", lanes, splat(builder, builder.trunc(m, _I32), ir.VectorType(_I32, half)))
    with builder.if_else(builder.icmp_signed(">=", n, ir.Constant(i64, LANES))) as (whole, part):
        with whole:
            _store(builder, value, ptr)
        with part:
            with builder.if_else(builder.icmp_signed(">=", n, ir.Constant(i64, half))) as (high, low):
                with high:
                    builder.store(halves[0], ptrs[0], align=4)
                    rest = builder.sub(n, ir.Constant(i64, half))
                    with builder.if_then(builder.icmp_signed(">", rest, ir.Constant(i64, 0))):
                        builder.call(masked, [halves[1], ptrs[1], ir.Constant(_I32, 4), first(rest)])
                with low:
                    with builder.if_then(builder.icmp_signed(">", n, ir.Constant(i64, 0))):
                        builder.call(masked, [halves[0], ptrs[0], ir.Constant(_I32, 4), first(n)])


def _load(builder, ptr, keep=None, passthru=None):
    """16 floats at ``ptr`` (``keep``: only those lanes, the others ``passthru``'s)."""
    ptr = builder.bitcast(ptr, _VF.as_pointer())
    if keep is None:
        return builder.load(ptr, align=4)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF.as_pointer(), _I32, _MASK, _VF]),
                                        "llvm.masked.load.v16f32.p0")
    return builder.call(fn, [ptr, ir.Constant(_I32, 4), keep, passthru])


def _store(builder, value, ptr, keep=None):
    ptr = builder.bitcast(ptr, _VF.as_pointer())
    if keep is None:
        builder.store(value, ptr, align=4)
        return
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [_VF, _VF.as_pointer(), _I32, _MASK]),
        "llvm.masked.store.v16f32.p0")
    builder.call(fn, [value, ptr, ir.Constant(_I32, 4), keep])


@intrinsic
def move_rows(typingctx, dst, dst_off, dst_step, src, src_off, src_step, n_src, n, value, count):
    """For each of ``count`` rows r: ``dst[dst_off + r·dst_step:][:n]`` = ``src[src_off +
    r·src_step:][:n_src]`` then ``value`` (0 <= ``n_src`` <= ``n``; float32 arrays): the source's
    whole vectors, the vector where it ends (masked), the fill's whole vectors, a masked last
    one. Nothing outside the rows is touched; the masks are made once for all rows."""
    sig = types.void(dst, dst_off, dst_step, src, src_off, src_step, n_src, n, value, count)

    def codegen(context, builder, signature, args):
        d_arr, d_off, d_step, s_arr, s_off, s_step, n_src_v, n_v, value_v, count_v = args
        sa = signature.args
        dp, sp = _data(context, builder, sa[0], d_arr, _F), _data(context, builder, sa[3], s_arr, _F)
        fill = splat(builder, value_v, _VF)
        mask16, sixteen = ir.Constant(_I64, -LANES), ir.Constant(_I64, LANES)
        whole = builder.and_(n_src_v, mask16)  # the source's whole vectors
        rest = builder.icmp_signed(">", n_src_v, whole)
        have, keep = (_lanes_below(builder, builder.sub(v, whole)) for v in (n_src_v, n_v))
        start = builder.select(rest, builder.add(whole, sixteen), whole)  # the fill's first whole vector
        start = builder.select(builder.icmp_signed("<", start, n_v), start, n_v)
        left = builder.sub(n_v, start)
        full = builder.and_(left, mask16)
        tail = builder.icmp_signed(">", left, full)
        last = _lanes_below(builder, builder.sub(left, full))
        r, _, close_r = counted_loop(builder, "row", count_v)
        d = builder.add(d_off, builder.mul(r, d_step))
        s = builder.add(s_off, builder.mul(r, s_step))
        j, _, close = counted_loop(builder, "copy", whole, step=LANES)
        _store(builder, _load(builder, builder.gep(sp, [builder.add(s, j)])), builder.gep(dp, [builder.add(d, j)]))
        close()
        with builder.if_then(rest):
            v = _load(builder, builder.gep(sp, [builder.add(s, whole)]), have, fill)
            _store(builder, v, builder.gep(dp, [builder.add(d, whole)]), keep)
        d_fill = builder.add(d, start)
        j, _, close = counted_loop(builder, "fill", full, step=LANES)
        _store(builder, fill, builder.gep(dp, [builder.add(d_fill, j)]))
        close()
        with builder.if_then(tail):
            _store(builder, fill, builder.gep(dp, [builder.add(d_fill, full)]), last)
        close_r()
        return context.get_dummy_value()
    return sig, codegen


def _window_run(kind: str):
    """The intrinsic ``run(x, first, rows, row_step, cols, c, step, npix, count, lo, hi, out, o)``:
    for ``npix`` output pixels (window p's top-left cell at x[first + p·step], its rows
    ``row_step`` apart, its ``cols`` columns ``c`` apart; rows, cols >= 1), out[o + p·c:][:c] =
    clamp(the window's maximum (``kind`` "max"), its sum / ``count`` ("avg"), or its sum ·
    ``count`` ("scaled": the reciprocal of a power of two cell count, the same quotient), lo, hi).
    The first tap is loaded, the others combined in (row, column) order; 1, 2 or 4 vectors of
    channels at a time (as ``c`` needs: a 24-channel window takes 2 vectors, not 4)."""
    is_max = kind == "max"
    per = 2 if is_max else 1  # state per vector: the maximum and a mask of the NaNs met, or the sum

    @intrinsic
    def run(typingctx, x, first, rows, row_step, cols, c, step, npix, count, lo, hi, out, o):
        sig = types.void(x, first, rows, row_step, cols, c, step, npix, count, lo, hi, out, o)

        def codegen(context, builder, signature, args):
            x_arr, first_v, rows_v, rstep_v, cols_v, c_v, step_v, npix_v, count_v, lo_v, hi_v, o_arr, o_v = args
            xp, op = _data(context, builder, signature.args[0], x_arr, _F), \
                _data(context, builder, signature.args[11], o_arr, _F)
            zero, one = ir.Constant(_VF, [0.0] * LANES), ir.Constant(_I64, 1)
            lo_s, hi_s, count_s = (splat(builder, v, _VF) for v in (lo_v, hi_v, count_v))

            def combine(state, v):
                if not is_max:
                    return [builder.fadd(state[0], v)]
                acc, nan = state  # acc > v ? acc : v is vmaxps, which drops a NaN: remembered apart
                return [builder.select(builder.fcmp_ordered(">", acc, v), acc, v),
                        builder.or_(nan, builder.fcmp_unordered("uno", v, v))]

            def windows(group):
                def load(at, g):
                    return _load(builder, builder.gep(xp, [builder.add(at, ir.Constant(_I64, g * LANES))]), keeps[g],
                                 zero)

                def taps(state, at):
                    return [s for g in range(group) for s in combine(state[g * per:(g + 1) * per], load(at, g))]

                ch, _, close_c = counted_loop(builder, "ch", c_v, step=LANES * group)
                left = [builder.sub(c_v, builder.add(ch, ir.Constant(_I64, g * LANES))) for g in range(group)]
                keeps = [_lanes_below(builder, n) for n in left]
                p, _, close_p = counted_loop(builder, "pixel", npix_v)
                base = builder.add(builder.add(first_v, ch), builder.mul(p, step_v))
                state = []
                for g in range(group):
                    v = load(base, g)
                    state += [v, builder.fcmp_unordered("uno", v, v)] if is_max else [v]
                k, st, close_k = counted_loop(builder, "tap0", builder.sub(cols_v, one), state)  # row 0: column 1..
                close_k(taps(st, builder.add(base, builder.mul(builder.add(k, one), c_v))))
                r, st_r, close_r = counted_loop(builder, "row", builder.sub(rows_v, one), st)  # rows 1..
                row = builder.add(base, builder.mul(builder.add(r, one), rstep_v))
                k, st_k, close_k = counted_loop(builder, "tap", cols_v, st_r)
                close_k(taps(st_k, builder.add(row, builder.mul(k, c_v))))
                close_r(st_k)
                at = builder.add(builder.add(o_v, ch), builder.mul(p, c_v))
                for g in range(group):
                    y = st_r[g * per]
                    if is_max:
                        y = builder.select(st_r[g * per + 1], ir.Constant(_VF, [math.nan] * LANES), y)
                    else:
                        y = builder.fdiv(y, count_s) if kind == "avg" else builder.fmul(y, count_s)
                    y = builder.select(builder.fcmp_ordered("<", y, lo_s), lo_s, y)  # NaN passes
                    y = builder.select(builder.fcmp_ordered(">", y, hi_s), hi_s, y)
                    store_first(builder, y, builder.gep(op, [builder.add(at, ir.Constant(_I64, g * LANES))]), left[g])
                close_p()
                close_c()

            with builder.if_else(builder.icmp_signed("<=", c_v, ir.Constant(_I64, LANES))) as (one_vector, more):
                with one_vector:
                    windows(1)
                with more:
                    with builder.if_else(builder.icmp_signed("<=", c_v, ir.Constant(_I64, 2 * LANES))) as (two, four):
                        with two:
                            windows(2)
                        with four:
                            windows(4)
            return context.get_dummy_value()
        return sig, codegen
    return run


#: ``(x, first, rows, row_step, cols, c, step, npix, count, lo, hi, out, o)``: see ``_window_run``.
max_windows, avg_windows, scaled_windows = (_window_run(k) for k in ("max", "avg", "scaled"))
