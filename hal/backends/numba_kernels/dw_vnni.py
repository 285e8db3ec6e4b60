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
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hal.backends.numba_kernels.simd import LANES, _data, masked_load, masked_store, requantize_lanes, splat


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
                entry = builder.block
                head = builder.append_basic_block("dwr.head")
                body = builder.append_basic_block("dwr.body")
                done = builder.append_basic_block("dwr.done")
                builder.branch(head)
                builder.position_at_end(head)
                j = builder.phi(i64)
                j.add_incoming(ir.Constant(i64, 0), entry)
                window = []
                for k in range(carried):
                    vs = [builder.phi(v32) for _ in range(groups)]
                    for v, init in zip(vs, first[k]):
                        v.add_incoming(init, entry)
                    window.append(vs)
                phis = [v for vs in window for v in vs]
                builder.cbranch(builder.icmp_signed("<", j, npix_v), body, done)

                builder.position_at_end(body)
                start = builder.mul(j, ir.Constant(i64, stride))
                full = window + [column(builder.add(start, ir.Constant(i64, carried + k))) for k in range(stride)]
                acc = bias
                for fx in range(fw):
                    for g in range(groups):
                        acc = builder.call(dot, [acc, full[fx][g], weights[fx][g]])
                q = requantize_lanes(builder, acc, mult, left, right, ozp, lo, hi, general)
                dst = builder.gep(o_ptr, [builder.add(o_off_v, builder.add(builder.mul(j, pix_v), ch_v))])
                masked_store(builder, builder.trunc(q, v8), dst, keep)
                j_next = builder.add(j, ir.Constant(i64, 1))
                body_end = builder.block
                builder.branch(head)
                j.add_incoming(j_next, body_end)
                nxt = [v for vs in full[stride:] for v in vs]
                for phi, v in zip(phis, nxt):
                    phi.add_incoming(v, body_end)
                builder.position_at_end(done)

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
