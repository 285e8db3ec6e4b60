"""Exact 8-bit GEMM on AVX-512 VNNI: int32 sums of u8 × s8 products with ``vpdpbusd``.

LLVM does not turn a numba loop into ``vpdpbusd`` (it finds ``vpdpwssd`` on int16 pairs at best,
at a few GMAC/s), so the micro-kernel is written in LLVM IR (a numba ``intrinsic``): an MR × NR·16
tile of int32 accumulators held in registers, each step broadcasting 4 activation bytes of a row
and multiplying them with a 64-byte block of packed weights (16 output columns × 4 reduction
steps). Every product and every sum is an integer in int32, wrapping as TFLite's int32 accumulator
does, so the result is exact whatever K.

``vpdpbusd`` multiplies an unsigned byte by a signed one. Activations become unsigned by an XOR with
0x80 (int8 → value + 128), by ``gemm`` before the tiles read them, or stay as they are
(uint8); weights are packed as signed bytes (uint8 weights XOR 0x80 → value − 128). The shifts and
both zero points fold into a per-column bias and, only for a weight zero point other than the shift, a
per-row term (``GemmPlan``).

Also here, as the other AVX-512-only kernel: ``lookup_run``, a 256-entry byte table applied to 64
bytes per step with VBMI's ``vpermi2b`` (lut.py's unary operations, and a table a convolution
applies to its own output: hal.fusion's ``table_after``).

Only compiled where the CPU has the features (``AVAILABLE``, ``VBMI``); numba's cache keys every
compiled kernel on the CPU name and features (its index's ``magic_tuple``), so another machine
compiles its own code and never loads this one, and the backend's version says which kind of
plan (VNNI-packed or not) a compilation cache entry holds.
"""
from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hal.backends.numba_kernels.simd import TABLE_INT64, byte_blocks, counted_loop, masked_load, masked_store
from hal.backends.numba_kernels.simd import cpu_features as _cpu_features
from hal.backends.numba_kernels.simd import multiply_lanes_planned as _multiply
from hal.backends.numba_kernels.simd import splat as _splat

_REQUIRED = ("avx512f", "avx512bw", "avx512vnni")

#: Whether the VNNI kernels exist on this machine (else the backend's float32 BLAS path runs).
AVAILABLE = (numba.config.CPU_NAME in (None, "host")) and all(f in _cpu_features() for f in _REQUIRED)

#: Whether the 64-byte table lookup (AVX-512 VBMI ``vpermi2b``) exists on this machine.
VBMI = AVAILABLE and "avx512vbmi" in _cpu_features()

#: Columns per packed panel (one 512-bit register of int32 accumulators) and reduction steps per
#: block (the 4 bytes ``vpdpbusd`` sums into each int32 lane).
PANEL = 16
KSTEP = 4
#: Tiles whose rows take the packed epilogue (saturating packs, one store per row); an 8 × 3 tile
#: runs out of registers with it.
PACKED_NR = (2, 4)


def _tile_intrinsic(mr: int, nr: int, indirect: bool = False, sums: bool = False):
    """The MR × NR·16 micro-kernel with its requantization, as an intrinsic with the signature
    ``tile(a, a_off, lda, rows, w, w_off, panel_stride, kq, corr, corr_off, bias, mult, left,
    table, col0, zp, lo, hi, out, o_off, ldo, rv, nc, general)``:

    - ``a``: 1-byte array; row r starts at byte ``a_off + min(r, rows - 1) · lda`` (rows past
      ``rows`` repeat the last one: a partial tile computes, and does not store, those rows);
      each row supplies ``4 · kq`` unsigned bytes (int8 activations come XORed with 0x80: ``gemm``
      flips a block of rows into L1, or a convolution's input, so the loop over k is loads and
      ``vpdpbusd`` only);
    - ``w``: packed signed weights; panel p's block q is the 64 bytes at
      ``w_off + p · panel_stride + 64 · q`` (16 columns × 4 consecutive k, k fastest);
    - then per row ``corr[corr_off + r]`` and per column ``bias``, ``mult``, ``left`` (int32 arrays
      read from ``col0``, padded to whole panels) and ``table`` (``simd.requant_table`` of the
      multipliers and right shifts: int64, its group ``col0 / 16`` on) requantize the sums;
    - the bytes go to ``out[o_off + r · ldo + c]`` for rows r < ``rv`` and columns c < ``nc``;
    - ``general`` bit 0 clear: no row term (``corr`` unread) and simd.floor_at_zero_point holds, so
      the requantization takes its cheaper form (``requantize_lanes(general=False)``); bit 1: the
      output is int8 (else uint8), which the NR = 4 and 2 tiles' packed epilogue needs to know; bit 2
      with bit 0: the general requantization without its row term and left shift (no row term,
      every left shift 0: a layer with no RELU-type clamp, the int8 projections).

    ``indirect``: two more arguments, ``ind`` (int32) and ``zeros`` (bytes), and each row made of
    ``lda`` segments of ``4 · kq`` bytes: segment s of row r is at byte ``ind[(a_off + min(r, rows
    − 1)) · lda + s]`` of ``a``, or where that entry e is negative at byte −1 − e of ``zeros`` (a
    convolution's taps read in place, the padding's from a block of zero-point bytes, a segment
    cut by the image's edge from its gathered copy: no im2col copy); its weight blocks are
    ``s · kq`` on.

    ``sums``: the tile's int32 sums are computed already (amx.sums): ``a`` is an int32 array and
    row r's 16·NR sums are its elements from ``a_off + min(r, rows − 1) · lda`` on; ``w``,
    ``w_off``, ``panel_stride`` and ``kq`` are not read. The epilogue is the same.
    """
    def codegen(context, builder, signature, args):
        (a_arr, a_off_v, lda_v, rows_v, w_arr, w_off_v, pstride_v, kq_v, corr_arr, corr_off_v, bias_arr,
         mult_arr, left_arr, table_arr, col0_v, zp_v, lo_v, hi_v, out_arr, o_off_v, ldo_v, rv_v, nc_v,
         general_v) = args[:24]
        i1, i8, i32, i64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
        i8p = i8.as_pointer()
        v16 = ir.VectorType(i32, PANEL)

        def data(k, arr, ptr_type):
            return builder.bitcast(context.make_array(signature.args[k])(context, builder, arr).data, ptr_type)

        a_ptr, w_ptr, o_ptr = data(0, a_arr, i8p), data(4, w_arr, i8p), data(18, out_arr, i8p)
        corr_ptr = data(8, corr_arr, i32.as_pointer())
        last = builder.sub(rows_v, ir.Constant(i64, 1))
        clamped_rows = [builder.select(builder.icmp_signed("<", ir.Constant(i64, r), rows_v), ir.Constant(i64, r),
                                       last) for r in range(mr)]
        panel_ptrs = [builder.gep(w_ptr, [builder.add(w_off_v, builder.mul(ir.Constant(i64, p), pstride_v))])
                      for p in range(nr)]
        dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v16, v16, v16]),
                                             "llvm.x86.avx512.vpdpbusd.512")

        def column_vector(k, arr, p):  # 16 int32 per-column values of panel p
            base = data(k, arr, i32.as_pointer())
            col = builder.add(col0_v, ir.Constant(i64, p * PANEL))
            return builder.load(builder.bitcast(builder.gep(base, [col]), v16.as_pointer()), align=4)
        biases = [column_vector(10, bias_arr, p) for p in range(nr)]  # the sums start from the bias
        table_ptr = data(13, table_arr, i64.as_pointer())

        def table(p):  # panel p's group of simd.requant_table
            group = builder.add(builder.lshr(col0_v, ir.Constant(i64, 4)), ir.Constant(i64, p))
            return builder.gep(table_ptr, [builder.mul(group, ir.Constant(i64, TABLE_INT64))])

        def k_loop(row_ptrs, block0, count, init):
            """``count`` blocks of 4 k from the rows at ``row_ptrs`` and weight block ``block0``
            on: the accumulators from ``init``, left at the loop's exit (the builder too)."""
            q, flat, close = counted_loop(builder, "vnni", count, [v for row in init for v in row])
            accs = [flat[r * nr:(r + 1) * nr] for r in range(mr)]
            koff = builder.mul(q, ir.Constant(i64, KSTEP))
            woff = builder.mul(builder.add(block0, q), ir.Constant(i64, PANEL * KSTEP))
            wv = [builder.load(builder.bitcast(builder.gep(panel_ptrs[p], [woff]), v16.as_pointer()), align=1)
                  for p in range(nr)]
            new = []
            for r in range(mr):
                word = builder.load(builder.bitcast(builder.gep(row_ptrs[r], [koff]), i32.as_pointer()), align=1)
                bc = _splat(builder, word, v16)  # a broadcast load: no vector ALU work
                new.extend(builder.call(dot, [accs[r][p], bc, wv[p]]) for p in range(nr))
            close(new)
            return accs

        biases = [[column_vector(10, bias_arr, p) for p in range(nr)]] * mr  # the sums start from the bias
        if sums:
            s_ptr = data(0, a_arr, i32.as_pointer())
            accs = []
            for r, c in enumerate(clamped_rows):
                row = builder.gep(s_ptr, [builder.add(a_off_v, builder.mul(c, lda_v))])
                accs.append([builder.add(biases[r][p], builder.load(builder.bitcast(builder.gep(
                    row, [ir.Constant(i64, p * PANEL)]), v16.as_pointer()), align=4)) for p in range(nr)])
        elif not indirect:
            row_ptrs = [builder.gep(a_ptr, [builder.add(a_off_v, builder.mul(c, lda_v))]) for c in clamped_rows]
            accs = k_loop(row_ptrs, ir.Constant(i64, 0), kq_v, biases)
        else:  # a_off: the tile's first row; lda: segments per row; kq: blocks per segment
            ind_ptr = data(24, args[24], i32.as_pointer())
            zeros_ptr = data(25, args[25], i8p)
            seg, flat, close = counted_loop(builder, "ind", lda_v, [v for row in biases for v in row])
            outer = [flat[r * nr:(r + 1) * nr] for r in range(mr)]
            row_ptrs = []
            for c in clamped_rows:
                at = builder.add(builder.mul(builder.add(a_off_v, c), lda_v), seg)
                off = builder.sext(builder.load(builder.gep(ind_ptr, [at])), i64)
                outside = builder.gep(zeros_ptr, [builder.sub(ir.Constant(i64, -1), off)])  # −1 − off
                row_ptrs.append(builder.select(builder.icmp_signed("<", off, ir.Constant(i64, 0)), outside,
                                               builder.gep(a_ptr, [off])))
            inner = k_loop(row_ptrs, builder.mul(seg, kq_v), kq_v, outer)
            close([v for row in inner for v in row])
            accs = outer

        zp, lo, hi = (_splat(builder, builder.trunc(v, i32), v16) for v in (zp_v, lo_v, hi_v))
        lanes = ir.Constant(v16, list(range(PANEL)))
        v16i8, v16i1 = ir.VectorType(i8, PANEL), ir.VectorType(i1, PANEL)
        store = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [v16i8, v16i8.as_pointer(), i32, v16i1]),
            "llvm.masked.store.v16i8.p0")
        nc32 = builder.trunc(nc_v, i32)

        def packed_epilogue(general: bool, lean: bool):
            """nr = 4 (or 2): a row's 64 (32) columns requantized together, narrowed with saturating
            packs (int32 -> int16, + zero point, -> uint8), clamped and stored as one vector.
            Bytes are computed in the unsigned domain (an int8 output offset by 128, flipped
            back by the XOR with 0x80); saturation is monotone and the clamp lies within
            every saturated range, so the result is the 32-bit lane's clamp."""
            i16 = ir.IntType(16)
            v32i16, v64i8 = ir.VectorType(i16, 2 * PANEL), ir.VectorType(i8, 4 * PANEL)
            signed = builder.and_(builder.lshr(general_v, ir.Constant(i64, 1)), ir.Constant(i64, 1))
            offset = builder.mul(signed, ir.Constant(i64, 128))
            zp16 = _splat(builder, builder.trunc(builder.add(zp_v, offset), i16), v32i16)
            lo8, hi8, flip = (_splat(builder, builder.trunc(v, i8), v64i8) for v in
                              (builder.add(lo_v, offset), builder.add(hi_v, offset), offset))
            pack_dw = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v32i16, [v16, v16]),
                                                     "llvm.x86.avx512.packssdw.512")
            pack_wb = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v64i8, [v32i16, v32i16]),
                                                     "llvm.x86.avx512.packuswb.512")
            add_sat = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v32i16, [v32i16, v32i16]),
                                                     "llvm.sadd.sat.v32i16")
            lanes64 = ir.Constant(v64i8, list(range(4 * PANEL)))
            width = ir.Constant(i64, nr * PANEL)
            ncap = builder.select(builder.icmp_signed("<", nc_v, width), nc_v, width)
            in_row = builder.icmp_unsigned("<", lanes64, _splat(builder, builder.trunc(ncap, i8), v64i8))
            # the packs interleave 128-bit lanes: dword 4L + j holds panel j's columns 4L .. 4L + 3
            order = ir.Constant(v16, [4 * (k % 4) + k // 4 for k in range(PANEL)])
            consts = [(column_vector(11, mult_arr, p), column_vector(12, left_arr, p), table(p)) for p in range(nr)]
            v64i1 = ir.VectorType(i1, 4 * PANEL)
            for r in range(mr):
                rr = ir.Constant(i64, r)
                qs = []
                for p in range(nr):
                    acc = accs[r][p]
                    if general and not lean:
                        row_corr = builder.load(builder.gep(corr_ptr, [builder.add(corr_off_v, rr)]))
                        acc = builder.add(acc, _splat(builder, row_corr, v16))  # int32 wrap-around
                    qs.append(_multiply(builder, acc, *consts[p], general, general and not lean))
                qs += qs[-1:] * (4 - nr)  # panels past nr: the last one again, never stored
                ab = builder.call(add_sat, [builder.call(pack_dw, [qs[0], qs[1]]), zp16])
                cd = ab if nr <= 2 else builder.call(add_sat, [builder.call(pack_dw, [qs[2], qs[3]]), zp16])
                b = builder.call(pack_wb, [ab, cd])
                b = builder.select(builder.icmp_unsigned("<", b, lo8), lo8, b)
                b = builder.xor(builder.select(builder.icmp_unsigned(">", b, hi8), hi8, b), flip)
                b = builder.bitcast(builder.shuffle_vector(builder.bitcast(b, v16), ir.Constant(v16, ir.Undefined),
                                                           order), v64i8)
                keep = builder.and_(in_row, _splat(builder, builder.icmp_signed("<", rr, rv_v), v64i1))
                dst = builder.gep(o_ptr, [builder.add(builder.add(o_off_v, builder.mul(rr, ldo_v)), col0_v)])
                masked_store(builder, b, dst, keep)

        def epilogue(general: bool, lean: bool = False):
            if nr in PACKED_NR:
                packed_epilogue(general, lean)
                return
            for p in range(nr):
                col = builder.add(col0_v, ir.Constant(i64, p * PANEL))
                mult, left = column_vector(11, mult_arr, p), column_vector(12, left_arr, p)
                left_in_panel = builder.sub(nc32, ir.Constant(i32, p * PANEL))
                in_panel = builder.icmp_signed("<", lanes, _splat(builder, left_in_panel, v16))
                for r in range(mr):
                    rr = ir.Constant(i64, r)
                    acc = accs[r][p]
                    if general and not lean:
                        row_corr = builder.load(builder.gep(corr_ptr, [builder.add(corr_off_v, rr)]))
                        acc = builder.add(acc, _splat(builder, row_corr, v16))  # int32 wrap-around
                    qv = builder.add(_multiply(builder, acc, mult, left, table(p), general, general and not lean), zp)
                    qv = builder.select(builder.icmp_signed("<", qv, lo), lo, qv)
                    qv = builder.trunc(builder.select(builder.icmp_signed(">", qv, hi), hi, qv), v16i8)
                    keep = builder.and_(in_panel, _splat(builder, builder.icmp_signed("<", rr, rv_v), v16i1))
                    dst = builder.gep(o_ptr, [builder.add(builder.add(o_off_v, builder.mul(rr, ldo_v)), col)])
                    builder.call(store, [qv, builder.bitcast(dst, v16i8.as_pointer()),
                                         ir.Constant(i32, 1), keep])
        mode = builder.and_(general_v, ir.Constant(i64, 5))  # bit 0: general, bit 2: lean (below)
        with builder.if_else(builder.icmp_signed("==", mode, ir.Constant(i64, 0))) as (cheap, other):
            with cheap:
                epilogue(False)
            with other:
                with builder.if_else(builder.icmp_signed("==", mode, ir.Constant(i64, 5))) as (lean, full):
                    with lean:
                        epilogue(True, lean=True)
                    with full:
                        epilogue(True)
        return context.get_dummy_value()

    if indirect:
        @intrinsic
        def tile(typingctx, a, a_off, lda, rows, w, w_off, panel_stride, kq, corr, corr_off, bias, mult, left,
                 table, col0, zp, lo, hi, out, o_off, ldo, rv, nc, general, ind, zeros):
            return types.void(a, a_off, lda, rows, w, w_off, panel_stride, kq, corr, corr_off, bias, mult, left,
                              table, col0, zp, lo, hi, out, o_off, ldo, rv, nc, general, ind, zeros), codegen
        return tile

    @intrinsic
    def tile(typingctx, a, a_off, lda, rows, w, w_off, panel_stride, kq, corr, corr_off, bias, mult, left,
             table, col0, zp, lo, hi, out, o_off, ldo, rv, nc, general):
        return types.void(a, a_off, lda, rows, w, w_off, panel_stride, kq, corr, corr_off, bias, mult, left,
                          table, col0, zp, lo, hi, out, o_off, ldo, rv, nc, general), codegen
    return tile


if AVAILABLE:
    #: (MR, NR) tiles: at most 24 accumulator registers of the 32, plus the weights and a broadcast.
    tile_6x4 = _tile_intrinsic(6, 4)
    tile_8x3 = _tile_intrinsic(8, 3)
    tile_8x2 = _tile_intrinsic(8, 2)
    tile_8x1 = _tile_intrinsic(8, 1)
    tile_1x4 = _tile_intrinsic(1, 4)
    tile_1x3 = _tile_intrinsic(1, 3)
    tile_1x2 = _tile_intrinsic(1, 2)
    tile_1x1 = _tile_intrinsic(1, 1)
    #: The same tiles reading their rows through an indirection table (``indirect``'s arguments).
    ind_6x4, ind_8x3, ind_8x2, ind_8x1 = (_tile_intrinsic(m, n, True) for m, n in ((6, 4), (8, 3), (8, 2), (8, 1)))
    ind_1x4, ind_1x3, ind_1x2, ind_1x1 = (_tile_intrinsic(1, n, True) for n in (4, 3, 2, 1))
    #: The epilogue alone, over int32 sums computed already (``sums``'s arguments): amx.sums' blocks.
    sums_8x4, sums_8x3, sums_8x2, sums_8x1 = (_tile_intrinsic(8, n, sums=True) for n in (4, 3, 2, 1))


@intrinsic
def row_sums(typingctx, a, a_off, xor, w, kq, panels, out):
    """The exact int32 sums of one row against every column: ``out[c] = Σ_k (a[a_off + k] XOR xor)
    · W[k, c]`` for the 16·``panels`` columns of the packed signed weights ``w`` (``GemmPlan``'s
    layout: panel p's block q the 64 bytes at ``(p·kq + q)·64``), ``4·kq`` bytes of ``a``. Four
    panels at a time, each with its own accumulator (their ``vpdpbusd`` chains interleave);
    a GEMV, where no requantization follows (FULLY_CONNECTED_DOUBLE_REQUANT's sums)."""
    sig = types.void(a, a_off, xor, w, kq, panels, out)

    def codegen(context, builder, signature, args):
        a_arr, a_off_v, xor_v, w_arr, kq_v, panels_v, out_arr = args
        i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
        v16 = ir.VectorType(i32, PANEL)
        sa = signature.args

        def data(k, arr, ptr_type):
            return builder.bitcast(context.make_array(sa[k])(context, builder, arr).data, ptr_type)
        a_ptr, w_ptr = data(0, a_arr, i8.as_pointer()), data(3, w_arr, i8.as_pointer())
        o_ptr = data(6, out_arr, i32.as_pointer())
        xor32 = builder.trunc(xor_v, i32)
        dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v16, v16, v16]),
                                             "llvm.x86.avx512.vpdpbusd.512")
        stride = builder.mul(kq_v, ir.Constant(i64, PANEL * KSTEP))
        zero = ir.Constant(v16, [0] * PANEL)
        with cgutils.for_range_slice(builder, ir.Constant(i64, 0), panels_v, ir.Constant(i64, 4)) as (p0, _):
            group = builder.sub(panels_v, p0)  # panels p0 .. p0 + 3 that exist: masked as a whole below
            bases = [builder.gep(w_ptr, [builder.mul(builder.add(p0, ir.Constant(i64, k)), stride)])
                     for k in range(4)]
            live = [builder.icmp_signed(">", group, ir.Constant(i64, k)) for k in range(4)]
            q, accs, close = counted_loop(builder, "gemv", kq_v, [zero] * 4)
            word = builder.load(builder.bitcast(builder.gep(a_ptr, [builder.add(a_off_v, builder.mul(
                q, ir.Constant(i64, KSTEP)))]), i32.as_pointer()), align=1)
            bc = _splat(builder, builder.xor(word, xor32), v16)
            woff = builder.mul(q, ir.Constant(i64, PANEL * KSTEP))
            new = []
            for k in range(4):
                # a panel past the last one reads panel p0's block again (in bounds) and is not stored
                ptr = builder.select(live[k], builder.gep(bases[k], [woff]), builder.gep(bases[0], [woff]))
                wv = builder.load(builder.bitcast(ptr, v16.as_pointer()), align=1)
                new.append(builder.call(dot, [accs[k], bc, wv]))
            close(new)
            for k in range(4):
                with builder.if_then(live[k]):
                    col = builder.mul(builder.add(p0, ir.Constant(i64, k)), ir.Constant(i64, PANEL))
                    builder.store(accs[k], builder.bitcast(builder.gep(o_ptr, [col]), v16.as_pointer()), align=4)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def lookup_run(typingctx, x, x_off, table, out, o_off, count):
    """``out[o_off + i] = table[x[x_off + i]]`` for i < ``count`` (any length; ``out`` may be ``x``):
    the 256-byte table held in four registers, loaded once before the loop (loaded per 64 bytes,
    as a call per step would, it costs as much again: the compiler cannot tell that ``out`` does
    not overlap it); per 64 bytes two ``vpermi2b`` (each a lookup in 128 entries by the low 7
    bits) and a select on the high bit. Bytes past ``count`` are neither read nor written."""
    sig = types.void(x, x_off, table, out, o_off, count)

    def codegen(context, builder, signature, args):
        x_arr, x_off_v, t_arr, out_arr, o_off_v, count_v = args
        i8, i64 = ir.IntType(8), ir.IntType(64)
        v8 = ir.VectorType(i8, 64)
        sa = signature.args

        def data(k, arr):
            return builder.bitcast(context.make_array(sa[k])(context, builder, arr).data, i8.as_pointer())
        x_ptr, t_ptr, o_ptr = data(0, x_arr), data(2, t_arr), data(3, out_arr)
        quarters = [builder.load(builder.bitcast(builder.gep(t_ptr, [ir.Constant(i64, 64 * q)]), v8.as_pointer()),
                                 align=1) for q in range(4)]
        perm = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v8, v8, v8]),
                                              "llvm.x86.avx512.vpermi2var.qi.512")
        zero = ir.Constant(v8, [0] * 64)

        def step(j, keep):
            idx = masked_load(builder, builder.gep(x_ptr, [builder.add(x_off_v, j)]), v8, keep, zero)
            low = builder.call(perm, [quarters[0], idx, quarters[1]])
            high = builder.call(perm, [quarters[2], idx, quarters[3]])
            upper = builder.icmp_signed("<", idx, zero)  # index >= 128
            masked_store(builder, builder.select(upper, high, low), builder.gep(o_ptr, [builder.add(o_off_v, j)]),
                         keep)
        byte_blocks(builder, count_v, "lut", step)
        return context.get_dummy_value()
    return sig, codegen
