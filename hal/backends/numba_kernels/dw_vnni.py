"""Depthwise convolution rows on AVX-512 VNNI: ``vpdpbusd`` over filter columns, input columns
shared by the output pixels that read them.

An output row of a depth-multiplier-1 DEPTHWISE_CONV_2D reads ``fh`` input rows. For 16 channels,
input column ``c`` of those rows becomes one 64-byte vector per group of 4 filter rows: byte
``4·i + r`` is row ``4·g + r`` of channel ``i`` (``vpermb`` of the rows' 16-byte loads), exactly
what ``vpdpbusd`` multiplies with 4 signed filter bytes per channel, the taps ``(4·g + r, fx)``
of filter column ``fx``. Pixel ``j`` of the row sums ``dot(column s·j + fx, weights fx)`` over
``fx``: a column is built once and used by every pixel whose window holds it (3 pixels of a
3×3 filter at stride 1), so a 3×3 pixel of 16 channels is 3 ``vpdpbusd``, one column build and
the requantization.

Activations are unsigned for ``vpdpbusd``: int8 bytes are XORed with 0x80 (value + 128), uint8
bytes taken as they are. A cell outside the image (a row above or below it, a column left or right
of it) loads as the input zero point's byte, and the bias holds bias − (that byte's unsigned
value)·Σw (depthwise.py), so such a tap adds nothing, as TFLite skips it: one call computes a
whole output row, borders included. Filter bytes are the filter minus its zero point, which
must fit int8 (checked at plan: true of int8 filters, and of uint8 filters whose values lie within
128 of their zero point); the unused rows of a group have zero weights.

``dw_plane64_3x3_*``: the same arithmetic for 64 channels of a 3x3 filter, every output row of an
image per call (the weights and per-channel arrays loaded once, not per row; a 5x5 filter's 4
carried columns of 8 vectors would not stay in registers). The rows' 64-byte loads become a column's
vectors by x86's byte then word unpacks, which stay within 128-bit lanes: lane 4L + j of vector v
is channel 16L + 4v + j, an order the weights and per-channel arrays are stored in and that the
saturating packs of the 4 requantized vectors (int32 -> int16 -> 8-bit) undo, so a pixel is one
64-byte store.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hal.backends.numba_kernels.simd import (
    LANES,
    _data,
    counted_loop,
    masked_load,
    masked_store,
    multiply_lanes,
    requantize_lanes,
    splat,
)


def _dw_row(fh: int, fw: int, stride: int):
    groups = (fh + 3) // 4

    @intrinsic
    def dw_row(typingctx, x, row0, row_bits, row_step, ix0, width, pix, zp, xor, w, w_step, bias, mult, left, right,
               ch, out_zp, lo, hi, out, o_off, count, npix, general):
        sig = types.void(x, row0, row_bits, row_step, ix0, width, pix, zp, xor, w, w_step, bias, mult, left, right,
                         ch, out_zp, lo, hi, out, o_off, count, npix, general)

        def codegen(context, builder, signature, args):
            (x_arr, row0_v, bits_v, row_step_v, ix0_v, width_v, pix_v, zp_v, xor_v, w_arr, w_step_v, bias_arr,
             mult_arr, left_arr, right_arr, ch_v, ozp_v, lo_v, hi_v, out_arr, o_off_v, count_v, npix_v,
             general_v) = args
            i1, i8, i32, i64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
            v32, v8, v64 = ir.VectorType(i32, LANES), ir.VectorType(i8, LANES), ir.VectorType(i8, 4 * LANES)
            vbit = ir.VectorType(i1, LANES)
            sa = signature.args
            x_ptr = _data(context, builder, sa[0], x_arr, i8)
            w_ptr = _data(context, builder, sa[9], w_arr, i8)
            o_ptr = _data(context, builder, sa[19], out_arr, i8)
            lanes = ir.Constant(v32, list(range(LANES)))
            keep = builder.icmp_signed("<", lanes, splat(builder, builder.trunc(count_v, i32), v32))
            zp16 = splat(builder, builder.trunc(zp_v, i8), v8)
            xor64 = splat(builder, builder.trunc(xor_v, i8), v64)
            zero16 = ir.Constant(v8, [0] * LANES)
            no_lanes = ir.Constant(vbit, [0] * LANES)
            row_keep = [builder.and_(keep, splat(builder, builder.trunc(builder.lshr(bits_v, ir.Constant(i64, fy)), i1),
                                                 vbit)) for fy in range(fh)]
            row_base = [builder.add(builder.add(row0_v, builder.mul(ir.Constant(i64, fy), row_step_v)), ch_v)
                        for fy in range(fh)]
            # byte 4i + r of a group's vector: row r's channel i (rows past fh: zero bytes)
            pair = ir.Constant(ir.VectorType(i32, 2 * LANES), list(range(2 * LANES)))
            spread = ir.Constant(ir.VectorType(i32, 4 * LANES), [(b % 4) * LANES + b // 4 for b in range(4 * LANES)])
            dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v32, [v32, v32, v32]),
                                                 "llvm.x86.avx512.vpdpbusd.512")

            def column(col):
                """The ``groups`` vectors of input column ix0 + col (an i64 value)."""
                ix = builder.add(ix0_v, col)
                inside = builder.icmp_unsigned("<", ix, width_v)  # 0 <= ix < width
                at = builder.mul(ix, pix_v)
                rows = [masked_load(builder, builder.gep(x_ptr, [builder.add(row_base[fy], at)]), v8,
                                    builder.select(inside, row_keep[fy], no_lanes), zp16) for fy in range(fh)]
                vecs = []
                for g in range(groups):
                    r = rows[4 * g:4 * g + 4] + [zero16] * (4 - len(rows[4 * g:4 * g + 4]))
                    lo2 = builder.shuffle_vector(r[0], r[1], pair)
                    hi2 = builder.shuffle_vector(r[2], r[3], pair)
                    v = builder.xor(builder.shuffle_vector(lo2, hi2, spread), xor64)
                    vecs.append(builder.bitcast(v, v32))
                return vecs

            def lane_vector(k, arr):
                base = _data(context, builder, sa[k], arr, i32)
                return builder.load(builder.bitcast(builder.gep(base, [ch_v]), v32.as_pointer()), align=4)
            bias = lane_vector(11, bias_arr)
            mult, left, right = lane_vector(12, mult_arr), lane_vector(13, left_arr), lane_vector(14, right_arr)
            ozp, lo, hi = (splat(builder, builder.trunc(v, i32), v32) for v in (ozp_v, lo_v, hi_v))
            # weights: filter column fx, group g at byte (fx·groups + g)·w_step + 4·ch
            ch4 = builder.mul(ch_v, ir.Constant(i64, 4))
            weights = [[builder.load(builder.bitcast(builder.gep(w_ptr, [builder.add(
                builder.mul(ir.Constant(i64, fx * groups + g), w_step_v), ch4)]), v32.as_pointer()), align=1)
                for g in range(groups)] for fx in range(fw)]

            carried = fw - stride  # columns a pixel shares with the next one

            def pixels(general: bool):
                """The loop over the pixels, with requantize_lanes(general=...)."""
                first = [column(ir.Constant(i64, k)) for k in range(carried)]
                j, phis, close = counted_loop(builder, "dwr", npix_v, [v for vs in first for v in vs])
                window = [phis[k * groups:(k + 1) * groups] for k in range(carried)]
                start = builder.mul(j, ir.Constant(i64, stride))
                full = window + [column(builder.add(start, ir.Constant(i64, carried + k))) for k in range(stride)]
                acc = bias
                for fx in range(fw):
                    for g in range(groups):
                        acc = builder.call(dot, [acc, full[fx][g], weights[fx][g]])
                q = requantize_lanes(builder, acc, mult, left, right, ozp, lo, hi, general)
                dst = builder.gep(o_ptr, [builder.add(o_off_v, builder.add(builder.mul(j, pix_v), ch_v))])
                masked_store(builder, builder.trunc(q, v8), dst, keep)
                close([v for vs in full[stride:] for v in vs])

            with builder.if_else(builder.icmp_signed("!=", general_v, ir.Constant(i64, 0))) as (then, otherwise):
                with then:
                    pixels(True)
                with otherwise:
                    pixels(False)
            return context.get_dummy_value()
        return sig, codegen
    return dw_row


#: A run of ``npix`` output pixels of a row of a depth-multiplier-1 DEPTHWISE_CONV_2D (dilation 1
#: across, any down) for channels ``ch .. ch + 15``: ``dw_row_3x3_s1(x, row0, row_bits, row_step, ix0,
#: width, pix, zp, xor, w, w_step, bias, mult, left, right, ch, out_zp, lo, hi, out, o_off, count, npix,
#: general)``. Input cell (fy, column ix0 + col) of channel ch + i is byte ``row0 + fy·row_step +
#: (ix0 + col)·pix + ch + i`` of ``x``, read only where bit fy of ``row_bits`` is set and
#: 0 <= ix0 + col < ``width`` (else it is the zero point's byte ``zp``: a cell outside the image),
#: then XORed with ``xor`` (0x80 or 0). Pixel j reads columns stride·j .. stride·j + fw − 1.
#: ``w``: int8 bytes, filter column fx's group g for channel ch + i at ``(fx·groups + g)·w_step +
#: 4·(ch + i)``; ``bias``, ``mult``, ``left``, ``right``: int32 per channel (padded to whole 16s).
#: The first ``count`` lanes (<= 16) of pixel j are stored at ``out[o_off + j·pix + ch]``.
#: ``general``: 0 where ``simd.floor_at_zero_point`` holds (its cheaper requantization), else 1.
dw_row_3x3_s1 = _dw_row(3, 3, 1)
dw_row_3x3_s2 = _dw_row(3, 3, 2)
dw_row_5x5_s1 = _dw_row(5, 5, 1)
dw_row_5x5_s2 = _dw_row(5, 5, 2)


def _unpack(builder, a, b, high: bool):
    """x86's unpack (lo or hi half) of vectors ``a``, ``b`` within each 128-bit lane."""
    count = a.type.count
    per = 128 // a.type.element.width  # elements per 128-bit lane
    half = per // 2 if high else 0
    order = [src + lane * per + half + k for lane in range(count // per) for k in range(per // 2)
             for src in (0, count)]
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), count), order))


def _dw_plane64(fh: int, fw: int, stride: int):
    block = 64
    groups = (fh + 3) // 4

    @intrinsic
    def dw_plane(typingctx, x, x_off, h, width, pix, sh, dh, top, ix0, zp, w, w_step, bias, mult, left, right, ch,
                   out_zp, lo, hi, out, o_off, out_h, npix, count, general):
        sig = types.void(x, x_off, h, width, pix, sh, dh, top, ix0, zp, w, w_step, bias, mult, left, right, ch,
                         out_zp, lo, hi, out, o_off, out_h, npix, count, general)

        def codegen(context, builder, signature, args):
            (x_arr, x_off_v, h_v, width_v, pix_v, sh_v, dh_v, top_v, ix0_v, zp_v, w_arr, w_step_v, bias_arr,
             mult_arr, left_arr, right_arr, ch_v, ozp_v, lo_v, hi_v, out_arr, o_off_v, out_h_v, npix_v, count_v,
             general_v) = args
            i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
            v32, v64, v32i16 = ir.VectorType(i32, block // 4), ir.VectorType(i8, block), ir.VectorType(i16, block // 2)
            vbit = ir.VectorType(ir.IntType(1), block)
            sa = signature.args
            signed_in, signed_out = sa[0].dtype == types.int8, sa[20].dtype == types.int8
            x_ptr = _data(context, builder, sa[0], x_arr, i8)
            w_ptr = _data(context, builder, sa[10], w_arr, i8)
            o_ptr = _data(context, builder, sa[20], out_arr, i8)
            lanes = ir.Constant(v64, list(range(block)))
            cap = builder.select(builder.icmp_signed("<", count_v, ir.Constant(i64, block)), count_v,
                                 ir.Constant(i64, block))
            keep = builder.icmp_unsigned("<", lanes, splat(builder, builder.trunc(cap, i8), v64))
            no_lanes = ir.Constant(vbit, [0] * block)
            zp64 = splat(builder, builder.trunc(zp_v, i8), v64)
            flip = ir.Constant(v64, [0x80] * block)
            zero64 = ir.Constant(v64, [0] * block)
            dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v32, [v32, v32, v32]),
                                                 "llvm.x86.avx512.vpdpbusd.512")
            line = builder.mul(width_v, pix_v)

            def column(col, row_base, row_keep):
                """The 4·``groups`` vectors of input column ix0 + col (an i64 value): group g's vector v,
                lane 4L + j, byte r is row 4g + r of channel ch + 16L + 4v + j (x86's byte then word
                unpacks of the rows' 64-byte loads, which stay within 128-bit lanes)."""
                ix = builder.add(ix0_v, col)
                inside = builder.icmp_unsigned("<", ix, width_v)  # 0 <= ix < width
                at = builder.mul(ix, pix_v)
                rows = []
                for fy in range(fh):
                    r = masked_load(builder, builder.gep(x_ptr, [builder.add(row_base[fy], at)]), v64,
                                    builder.select(inside, row_keep[fy], no_lanes), zp64)
                    rows.append(builder.xor(r, flip) if signed_in else r)
                vecs = []
                for g in range(groups):
                    r = rows[4 * g:4 * g + 4] + [zero64] * (4 - len(rows[4 * g:4 * g + 4]))
                    t = [_unpack(builder, r[a], r[a + 1], high) for a in (0, 2) for high in (False, True)]
                    t = [builder.bitcast(v, v32i16) for v in t]
                    vecs.append([builder.bitcast(_unpack(builder, t[a], t[a + 2], high), v32)
                                 for a in (0, 1) for high in (False, True)])
                return vecs

            def lane_vectors(k, arr):
                base = _data(context, builder, sa[k], arr, i32)
                at = [builder.add(ch_v, ir.Constant(i64, block // 4 * v)) for v in range(4)]
                return [builder.load(builder.bitcast(builder.gep(base, [a]), v32.as_pointer()), align=4) for a in at]
            bias = lane_vectors(12, bias_arr)
            consts = list(zip(*(lane_vectors(k, arr) for k, arr in ((13, mult_arr), (14, left_arr), (15, right_arr)))))
            # the packs saturate int32 -> int16 -> uint8 (int8 output offset by 128, flipped back after the
            # clamp): saturation is monotone and the clamp lies within its range, so the bytes are the clamp's
            offset = 128 if signed_out else 0
            zp16 = splat(builder, builder.trunc(builder.add(ozp_v, ir.Constant(i64, offset)), i16), v32i16)
            lo8, hi8 = (splat(builder, builder.trunc(builder.add(v, ir.Constant(i64, offset)), i8), v64)
                        for v in (lo_v, hi_v))
            pack_dw = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v32i16, [v32, v32]),
                                                     "llvm.x86.avx512.packssdw.512")
            pack_wb = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v64, [v32i16, v32i16]),
                                                     "llvm.x86.avx512.packuswb.512")
            add_sat = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v32i16, [v32i16, v32i16]),
                                                     f"llvm.sadd.sat.v{block // 2}i16")
            # weights: filter column fx, group g, vector v at byte (fx·groups + g)·w_step + 4·ch + block·v
            ch4 = builder.mul(ch_v, ir.Constant(i64, 4))
            weights = [[[builder.load(builder.bitcast(builder.gep(w_ptr, [builder.add(builder.add(
                builder.mul(ir.Constant(i64, fx * groups + g), w_step_v), ch4), ir.Constant(i64, block * v))]),
                v32.as_pointer()), align=1) for v in range(4)] for g in range(groups)] for fx in range(fw)]

            carried = fw - stride  # columns a pixel shares with the next one

            def pixels(general: bool, row_base, row_keep, o_row):
                """One output row's loop over its pixels, with multiply_lanes(general=...)."""
                first = [column(ir.Constant(i64, k), row_base, row_keep) for k in range(carried)]
                j, phis, close = counted_loop(builder, "dwp", npix_v, [v for col in first for g in col for v in g])
                # column k's group g, vector v: phi (k·groups + g)·4 + v
                window = [[phis[4 * (k * groups + g):4 * (k * groups + g) + 4] for g in range(groups)]
                          for k in range(carried)]
                start = builder.mul(j, ir.Constant(i64, stride))
                full = window + [column(builder.add(start, ir.Constant(i64, carried + k)), row_base, row_keep)
                                 for k in range(stride)]
                qs = []
                for v in range(4):
                    acc = bias[v]
                    for fx in range(fw):
                        for g in range(groups):
                            acc = builder.call(dot, [acc, full[fx][g][v], weights[fx][g][v]])
                    qs.append(multiply_lanes(builder, acc, *consts[v], general))
                ab = builder.call(add_sat, [builder.call(pack_dw, [qs[0], qs[1]]), zp16])
                cd = builder.call(add_sat, [builder.call(pack_dw, [qs[2], qs[3]]), zp16])
                b = builder.call(pack_wb, [ab, cd])
                b = builder.select(builder.icmp_unsigned("<", b, lo8), lo8, b)
                b = builder.select(builder.icmp_unsigned(">", b, hi8), hi8, b)
                if signed_out:
                    b = builder.xor(b, flip)
                masked_store(builder, b, builder.gep(o_ptr, [builder.add(o_row, builder.mul(j, pix_v))]), keep)
                close([v for col in full[stride:] for g in col for v in g])

            def rows(general: bool):
                """The loop over the output rows: each row's input rows (those outside the image read as
                the zero point's byte) and output offset."""
                with cgutils.for_range(builder, out_h_v) as loop:
                    iy0 = builder.sub(builder.mul(loop.index, sh_v), top_v)
                    iys = [builder.add(iy0, builder.mul(ir.Constant(i64, fy), dh_v)) for fy in range(fh)]
                    row_keep = [builder.select(builder.icmp_unsigned("<", iy, h_v), keep, no_lanes) for iy in iys]
                    row_base = [builder.add(builder.add(x_off_v, builder.mul(iy, line)), ch_v) for iy in iys]
                    o_row = builder.add(builder.add(o_off_v, builder.mul(loop.index, builder.mul(npix_v, pix_v))), ch_v)
                    pixels(general, row_base, row_keep, o_row)

            with builder.if_else(builder.icmp_signed("!=", general_v, ir.Constant(i64, 0))) as (then, otherwise):
                with then:
                    rows(True)
                with otherwise:
                    rows(False)
            return context.get_dummy_value()
        return sig, codegen
    return dw_plane


#: One image's DEPTHWISE_CONV_2D (depth multiplier 1, dilation 1 across), every output row, for the 64
#: channels from ``ch``, the first ``count`` of them stored: ``dw_plane64_3x3_s1(x, x_off, h, width, pix,
#: sh, dh, top, ix0, zp, w, w_step, bias, mult, left, right, ch, out_zp, lo, hi, out, o_off, out_h, npix,
#: count, general)``. Input cell (iy, ix) of channel ch + i is byte ``x_off + (iy·width + ix)·pix + ch + i``
#: of ``x``; output row oy reads input rows oy·sh − top + fy·dh, its pixel j columns ix0 + stride·j ..
#: + fw − 1, and cells outside the image are the zero point's byte ``zp`` (int8 ``x``: XORed with 0x80).
#: Pixel j of row oy goes to ``out[o_off + (oy·npix + j)·pix + ch ..]``. Lane 4L + j of a vector v is
#: channel ch + 16L + 4v + j (the unpacks' order, which the packs of the requantized vectors undo):
#: ``w``, ``bias``, ``mult``, ``left`` and ``right`` hold that channel at index ch + 16v + 4L + j
#: (``depthwise._rows64``' order), the weights 4 bytes each, filter column fx's group g from byte
#: ``(fx·groups + g)·w_step``. ``general``: as ``dw_row``'s.
dw_plane64_3x3_s1 = _dw_plane64(3, 3, 1)
dw_plane64_3x3_s2 = _dw_plane64(3, 3, 2)
