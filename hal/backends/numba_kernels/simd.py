"""16-lane integer kernels written as LLVM vector IR (numba intrinsics), for loops that numba's
code does not vectorise on its own: the ones over a few dozen channels, where LLVM's vectoriser
leaves the whole row to its scalar remainder, and the ones whose indexes numba guards against
negative wrap-around.

Generic LLVM vector operations and masked loads/stores, valid on every CPU (LLVM splits the lanes
into whatever registers the machine has); the one target instruction, ``vpdpwssd`` for int16
depthwise weights, is only compiled where the CPU has AVX-512 VNNI (depthwise.py's signatures).

- ``requantize_lanes``: TFLite's MultiplyByQuantizedMultiplier, output zero point and clamp on 16
  int32 lanes (shared with the VNNI GEMM's epilogue).
- ``dw_run_3x3`` / ``dw_run_5x5``: a run of DEPTHWISE_CONV_2D output pixels for 16 channels:
  weights in registers, every tap unrolled and branch-free (masked loads), the requantization,
  one masked store per pixel (without ``BYTE_MASKS``, plain moves for a run inside the image).
- ``copy_bytes``: short byte runs (im2col rows) as 64-byte masked moves (AVX-512BW; else the C
  library's memmove); ``fill_copy``: a run then pad bytes (PAD's rows).
- ``add_run`` / ``mul_run``: 8-bit ADD/SUB and MUL computed as TFLite computes them (lut.py checks
  them against the reference's table over every input pair before using them).
"""
from __future__ import annotations

import pathlib

import llvmlite.binding as llvm
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LANES = 16


def cpu_features() -> set[str]:
    """The features numba compiles for: $NUMBA_CPU_FEATURES if set, else the host's."""
    text = numba.config.CPU_FEATURES or llvm.get_host_cpu_features().flatten()
    return {f[1:] for f in text.split(",") if f.startswith("+")}


def cache_size_bytes(text: str) -> int:
    """A cache size as Linux's sysfs writes it ("512K", "2048K", "32M") in bytes."""
    t = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1], 1)
    return int(t.rstrip("KMG")) * scale


def l2_bytes() -> int | None:
    """The first core's L2 cache (data or unified), from sysfs; None where that cannot be read."""
    try:
        for index in sorted(pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
            if (index / "level").read_text().strip() == "2" and \
                    (index / "type").read_text().strip() in ("Unified", "Data"):
                return cache_size_bytes((index / "size").read_text())
    except (OSError, ValueError, IndexError):
        return None
    return None


#: How many 16-lane vectors of sums a register tile may keep (fc_float's ``_tile_codegen`` splits
#: a larger tile into passes that each keep at most this many). AVX-512's 32 registers hold one
#: such vector each: 16 leave room for the weights and the broadcast inputs. AVX2's 16 registers
#: hold 8 lanes, two per vector: 6 vectors (12 registers) leave a weight vector and a broadcast
#: its registers too; a tile that keeps more spills its sums to the stack at every step.
ACCUMULATORS = 16 if "avx512f" in cpu_features() else 6
#: Whether the CPU masks byte lanes (AVX-512BW). Without it LLVM makes a masked move of bytes one
#: conditional move per byte: there ``copy_bytes`` and ``fill_copy`` call the C library's memmove
#: and memset (an AVX2 core moved a 36-byte run in 75 ns masked, 4 ns so; 4 KB in 4.9 us and
#: 66 ns), and a depthwise run whose taps all lie inside the image, on 16 channels, takes plain
#: moves.
BYTE_MASKS = "avx512bw" in cpu_features()


def splat(builder, value, vec_type):
    undef = ir.Constant(vec_type, ir.Undefined)
    mask = ir.Constant(ir.VectorType(ir.IntType(32), vec_type.count), [0] * vec_type.count)
    return builder.shuffle_vector(builder.insert_element(undef, value, ir.Constant(ir.IntType(32), 0)), undef, mask)


def requantize_lanes(builder, acc, mult, left, right, zp, lo, hi, general: bool = True,
                     shifts_left: bool | None = None):
    """TFLite's MultiplyByQuantizedMultiplier on 16 int32 lanes (per-lane multiplier, left and
    right shift), then the output zero point and the activation clamp: the same integer steps as
    fixedpoint.multiply_by_quantized_multiplier, as vector instructions.

    ``general=False``: for a layer whose left shifts are all 0 and whose clamp's lower bound is at
    or above the output zero point (a RELU-type activation; ``floor_at_zero_point``). Its negative
    values round half up instead of away from zero: they differ only on negative results, which
    such a clamp maps to its lower bound either way. ``shifts_left``: as ``multiply_lanes``'."""
    v = builder.add(multiply_lanes(builder, acc, mult, left, right, general, shifts_left), zp)
    v = builder.select(builder.icmp_signed("<", v, lo), lo, v)
    return builder.select(builder.icmp_signed(">", v, hi), hi, v)


_HALF = ir.VectorType(ir.IntType(64), LANES // 2)


def _c_half(k: int):
    return ir.Constant(_HALF, [k] * (LANES // 2))


def _low32(builder, v):
    """Each 64-bit lane's low half, sign-extended (what ``pmuldq`` multiplies)."""
    return builder.ashr(builder.shl(v, _c_half(32)), _c_half(32))


def _rounded_halves(builder, x, even_mult, odd_mult, rounding, general: bool):
    """The one rounding of ``multiply_lanes``: the 16 int32 lanes ``x`` as two 8 × 64-bit products
    (even lanes by ``even_mult``, odd by ``odd_mult``: 64-bit lanes holding sign-extended
    multipliers), each ``(p + offset − [p < −2^30]·below) >> shift`` (the term only where
    ``general``), merged back into 16 int32 lanes. ``rounding(k)``: (offset, shift, below) of the
    even (k = 0) or odd (k = 1) lanes."""
    v32 = ir.VectorType(ir.IntType(32), LANES)
    xq = builder.bitcast(x, _HALF)
    products = (builder.mul(_low32(builder, xq), even_mult), builder.mul(builder.ashr(xq, _c_half(32)), odd_mult))
    halves = []
    for k, p in enumerate(products):
        offset, shift, below = rounding(k)
        t = builder.add(p, offset)
        if general:
            t = builder.sub(t, builder.select(builder.icmp_signed("<", p, _c_half(-(1 << 30))), below(), _c_half(0)))
        halves.append(builder.bitcast(builder.ashr(t, shift), v32))
    # each result is the low half of its 64-bit lane: even lanes from the first, odd from the second
    return builder.shuffle_vector(halves[0], halves[1], ir.Constant(v32, [k + (LANES - 1) * (k % 2)
                                                                          for k in range(LANES)]))


def multiply_lanes(builder, acc, mult, left, right, general: bool = True, shifts_left: bool | None = None):
    """``requantize_lanes`` before the zero point and the clamp: MultiplyByQuantizedMultiplier
    alone (``general=False`` valid only where a clamp at or above the zero point follows).
    ``shifts_left=False``: every lane's left shift is 0 (default: ``general``)."""
    if shifts_left is None:
        shifts_left = general
    x = builder.shl(acc, left) if shifts_left else acc  # int32 wrap-around, as TFLite's shift of an int32
    # SaturatingRoundingDoublingHighMul then RoundingDivideByPOT by e = right, as one rounding of
    # the 64-bit product p = x·m. The first is h = floor((p + 2^30) / 2^31) for every product (the
    # truncating division of a negative product with its nudge 1 − 2^30 is the same); its one
    # saturating case, x = m = INT32_MIN, cannot occur: QuantizeMultiplier's multipliers are in
    # [0, 2^31) (checked at plan). The second rounds h / 2^e half away from zero:
    # floor((h + c) / 2^e) with c = 2^(e−1) for h >= 0 and 2^(e−1) − 1 for h < 0 (c = 0 for e = 0).
    # As floor((floor(y) + c) / 2^e) = floor((y + c) / 2^e) for an integer c, the result is
    # (p + 2^30 + c·2^31) >> (31 + e), and h < 0 exactly when p < −2^30; |p| < 2^62 and the
    # offsets < 2^62, so nothing overflows. Even and odd lanes as two 8 × 64-bit products of
    # sign-extended halves (one pmuldq each); the per-lane offsets and shift counts depend on e
    # only (loop-invariant: hoisted out of a kernel's loop).
    mq, eq = builder.bitcast(mult, _HALF), builder.bitcast(right, _HALF)
    es = (builder.and_(eq, _c_half(0xFFFFFFFF)), builder.lshr(eq, _c_half(32)))

    def rounding(k):
        e = es[k]
        shifting = builder.icmp_signed(">", e, _c_half(0))
        offset = builder.add(_c_half(1 << 30), builder.select(
            shifting, builder.shl(_c_half(1), builder.add(e, _c_half(30))), _c_half(0)))
        # c·2^31 is 2^31 less for h < 0
        return offset, builder.add(e, _c_half(31)), lambda: builder.select(shifting, _c_half(1 << 31), _c_half(0))
    return _rounded_halves(builder, x, _low32(builder, mq), builder.ashr(mq, _c_half(32)), rounding, general)


#: int64 values per 16 columns in ``requant_table``: 7 blocks of 8 lanes.
TABLE_INT64 = 7 * LANES // 2


def requant_table(mult: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``multiply_lanes``' per-lane constants, computed once at plan time for
    ``multiply_lanes_planned`` (a tile's epilogue then derives none of them: it takes each from
    memory as an operand). Per 16 columns (``mult``, ``right``: int32 per column, whole groups of
    16), 7 blocks of 8 int64, block b's lane j for column 2j (even) or 2j + 1 (odd): 0 the odd
    columns' multipliers; 1, 2 the even and odd columns' rounding offsets 2^30 + 2^(30 + e) (2^30
    for e = 0); 3, 4 their shift counts 31 + e; 5, 6 what a negative product's rounding takes off
    (2^31 where e > 0, else 0)."""
    m = np.asarray(mult, np.int64).reshape(-1, LANES)
    e = np.asarray(right, np.int64).reshape(-1, LANES)
    offset = (1 << 30) + np.where(e > 0, np.left_shift(1, np.minimum(e, 32) + 30), 0)
    below = np.where(e > 0, 1 << 31, 0)
    blocks = [m[:, 1::2], offset[:, 0::2], offset[:, 1::2], e[:, 0::2] + 31, e[:, 1::2] + 31, below[:, 0::2],
              below[:, 1::2]]
    return np.ascontiguousarray(np.stack(blocks, axis=1), dtype=np.int64).reshape(-1)


def multiply_lanes_planned(builder, acc, mult, left, table, general: bool, shifts_left: bool):
    """``multiply_lanes`` with its per-lane constants read from ``table`` (an i64 pointer to one
    group of 16 columns of ``requant_table``; ``mult`` the 16 multipliers, ``left`` the left
    shifts, read only where ``shifts_left``): the same integer steps, fewer instructions."""
    i64 = ir.IntType(64)

    def block(b):
        ptr = builder.bitcast(builder.gep(table, [ir.Constant(i64, b * LANES // 2)]), _HALF.as_pointer())
        return builder.load(ptr, align=8)
    x = builder.shl(acc, left) if shifts_left else acc
    return _rounded_halves(builder, x, _low32(builder, builder.bitcast(mult, _HALF)), _low32(builder, block(0)),
                           lambda k: (block(1 + k), block(3 + k), lambda: block(5 + k)), general)


def floor_at_zero_point(left, output_zp: int, act_min: int) -> bool:
    """Whether ``requantize_lanes(general=False)`` is exact for a layer: no left shift, and a clamp
    whose lower bound is at or above the output zero point."""
    return bool((np.asarray(left) == 0).all()) and act_min >= output_zp


def masked_load(builder, ptr, vec_type, keep, passthru):
    """Lanes ``keep`` of the vector at ``ptr`` (the others ``passthru``'s), touching no memory of
    the lanes not kept (a masked-off load never faults)."""
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vec_type, [vec_type.as_pointer(), ir.IntType(32), keep.type, vec_type]),
        f"llvm.masked.load.v{vec_type.count}i{vec_type.element.width}.p0")
    return builder.call(fn, [builder.bitcast(ptr, vec_type.as_pointer()), ir.Constant(ir.IntType(32), 1), keep,
                             passthru])


def masked_store(builder, value, ptr, keep):
    vec_type = value.type
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [vec_type, vec_type.as_pointer(), ir.IntType(32), keep.type]),
        f"llvm.masked.store.v{vec_type.count}i{vec_type.element.width}.p0")
    builder.call(fn, [value, builder.bitcast(ptr, vec_type.as_pointer()), ir.Constant(ir.IntType(32), 1), keep])


def counted_loop(builder, name: str, n, carried=(), step: int = 1):
    """Open ``for i in range(0, n, step)`` (``n`` an i64 value) with ``carried`` values held in
    phis, not memory (cgutils' loops carry only their counter; a kernel's vector accumulators and
    input columns are to stay in registers across the iterations): blocks ``{name}.head``, ``.body``
    and ``.done``, the builder left in the body. Returns ``(i, phis, close)``: the body ends with
    ``close(next_values)``, one value per phi, which steps the counter, branches back to the head
    and gives the phis their values from the block the body ended in (it may have added blocks),
    then leaves the builder after the loop."""
    i64 = ir.IntType(64)
    entry = builder.block
    head = builder.append_basic_block(f"{name}.head")
    body = builder.append_basic_block(f"{name}.body")
    done = builder.append_basic_block(f"{name}.done")
    builder.branch(head)
    builder.position_at_end(head)
    i = builder.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    phis = []
    for value in carried:
        phis.append(builder.phi(value.type))
        phis[-1].add_incoming(value, entry)
    builder.cbranch(builder.icmp_signed("<", i, n), body, done)
    builder.position_at_end(body)

    def close(next_values=()):
        i_next = builder.add(i, ir.Constant(i64, step))
        end = builder.block
        builder.branch(head)
        i.add_incoming(i_next, end)
        for phi, value in zip(phis, next_values, strict=True):
            phi.add_incoming(value, end)
        builder.position_at_end(done)
    return i, phis, close


def byte_blocks(builder, n, name: str, step) -> None:
    """Emit ``for j in range(0, n, 64): step(j, keep)``, ``keep`` the <64 x i1> mask of the bytes
    j .. min(j + 64, n) - 1 (every lane but in the last block; the count is compared as bytes).
    The builder is left after the loop."""
    i8, i64 = ir.IntType(8), ir.IntType(64)
    v8 = ir.VectorType(i8, 64)
    lanes = ir.Constant(v8, list(range(64)))
    j, _, close = counted_loop(builder, name, n, step=64)
    left = builder.sub(n, j)
    left = builder.trunc(builder.select(builder.icmp_signed("<", left, ir.Constant(i64, 64)), left,
                                        ir.Constant(i64, 64)), i8)
    step(j, builder.icmp_unsigned("<", lanes, splat(builder, left, v8)))
    close()


def _data(context, builder, array_type, value, element):
    return builder.bitcast(context.make_array(array_type)(context, builder, value).data, element.as_pointer())


def _dw_run(fh: int, fw: int):
    """The ``fh`` × ``fw`` depthwise intrinsic (taps unrolled, no branch): see ``dw_run_3x3``."""
    @intrinsic
    def dw_run(typingctx, x, x_off, x_step, row_step, col_step, valid, zp, w, tap_step, bias, mult, left, right, ch,
               out_zp, lo, hi, out, o_off, o_step, count, npix):
        sig = types.void(x, x_off, x_step, row_step, col_step, valid, zp, w, tap_step, bias, mult, left, right, ch,
                         out_zp, lo, hi, out, o_off, o_step, count, npix)
        signed = x.dtype == types.int8
        paired = w.dtype == types.int16  # taps in pairs, one vpdpwssd each (AVX-512 VNNI only)

        def codegen(context, builder, signature, args):
            (x_arr, x_off_v, x_step_v, row_v, col_v, valid_v, zp_v, w_arr, tap_v, bias_arr, mult_arr, left_arr,
             right_arr, ch_v, ozp_v, lo_v, hi_v, out_arr, o_off_v, o_step_v, count_v, npix_v) = args
            i1, i8, i32, i64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
            v32, v8, vbit = ir.VectorType(i32, LANES), ir.VectorType(i8, LANES), ir.VectorType(i1, LANES)
            sa = signature.args
            x_ptr = _data(context, builder, sa[0], x_arr, i8)
            w_ptr = _data(context, builder, sa[7], w_arr, i32)
            o_ptr = _data(context, builder, sa[17], out_arr, i8)
            lanes = ir.Constant(v32, list(range(LANES)))
            keep = builder.icmp_signed("<", lanes, splat(builder, builder.trunc(count_v, i32), v32))

            def column_vector(k, arr):
                base = _data(context, builder, sa[k], arr, i32)
                return builder.load(builder.bitcast(builder.gep(base, [ch_v]), v32.as_pointer()), align=4)
            bias = column_vector(9, bias_arr)
            mult, left, right = column_vector(10, mult_arr), column_vector(11, left_arr), column_vector(12, right_arr)
            ozp, lo, hi = (splat(builder, builder.trunc(v, i32), v32) for v in (ozp_v, lo_v, hi_v))
            zp8 = splat(builder, builder.trunc(zp_v, i8), v8)  # masked-off lanes read as the zero point
            x_base = builder.add(x_off_v, ch_v)
            taps = []
            for fy in range(fh):
                for fx in range(fw):
                    t = fy * fw + fx
                    on = builder.trunc(builder.lshr(valid_v, ir.Constant(i64, t)), i1)
                    off = builder.add(builder.mul(ir.Constant(i64, fy), row_v),
                                      builder.mul(ir.Constant(i64, fx), col_v))
                    taps.append((builder.and_(keep, splat(builder, on, vbit)), off))
            if paired:  # int16 weights, pair p = taps 2p and 2p + 1 interleaved per channel
                w16 = builder.bitcast(w_ptr, ir.IntType(16).as_pointer())
                weights = [builder.load(builder.bitcast(builder.gep(w16, [builder.mul(
                    builder.add(ch_v, builder.mul(ir.Constant(i64, q), tap_v)), ir.Constant(i64, 2))]),
                    v32.as_pointer()), align=2) for q in range((len(taps) + 1) // 2)]
                dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v32, [v32, v32, v32]),
                                                     "llvm.x86.avx512.vpdpwssd.512")
            else:
                weights = [builder.load(builder.bitcast(
                    builder.gep(w_ptr, [builder.add(ch_v, builder.mul(ir.Constant(i64, t), tap_v))]),
                    v32.as_pointer()), align=4) for t in range(len(taps))]

            def pixels(plain: bool) -> None:
                """The run's loop: every load and store masked, or (``plain``: every tap inside the
                image, 16 channels) plain moves."""
                j, _, close = counted_loop(builder, "dw_plain" if plain else "dw", npix_v)
                pixel = builder.add(x_base, builder.mul(j, x_step_v))
                if plain:
                    loaded = [builder.load(builder.bitcast(builder.gep(x_ptr, [builder.add(pixel, off)]),
                                                           v8.as_pointer()), align=1) for _, off in taps]
                else:
                    loaded = [masked_load(builder, builder.gep(x_ptr, [builder.add(pixel, off)]), v8, lanes_on,
                                          zp8) for lanes_on, off in taps]
                q = requantized(loaded)
                dst = builder.gep(o_ptr, [builder.add(builder.add(o_off_v, ch_v), builder.mul(j, o_step_v))])
                if plain:
                    builder.store(builder.trunc(q, v8), builder.bitcast(dst, v8.as_pointer()), align=1)
                else:
                    masked_store(builder, builder.trunc(q, v8), dst, keep)
                close()

            def requantized(loaded):
                acc = bias
                if paired:
                    v16i16 = ir.VectorType(ir.IntType(16), 2 * LANES)
                    interleave = ir.Constant(ir.VectorType(i32, 2 * LANES),
                                             [k // 2 + LANES * (k % 2) for k in range(2 * LANES)])
                    for p, wv in enumerate(weights):
                        xa = loaded[2 * p]
                        xb = loaded[2 * p + 1] if 2 * p + 1 < len(loaded) else xa  # its weight is 0
                        pair = builder.shuffle_vector(xa, xb, interleave)
                        pair = builder.sext(pair, v16i16) if signed else builder.zext(pair, v16i16)
                        acc = builder.call(dot, [acc, builder.bitcast(pair, v32), wv])
                else:
                    for xv, wv in zip(loaded, weights):
                        acc = builder.add(acc, builder.mul(builder.sext(xv, v32) if signed else builder.zext(xv, v32),
                                                           wv))
                return requantize_lanes(builder, acc, mult, left, right, ozp, lo, hi)

            if BYTE_MASKS:  # masked moves are as fast as plain ones
                pixels(False)
            else:  # masked byte moves are byte by byte: a run wholly inside the image takes plain ones
                every_tap = ir.Constant(i64, (1 << len(taps)) - 1)
                inside = builder.and_(builder.icmp_signed(">=", count_v, ir.Constant(count_v.type, LANES)),
                                      builder.icmp_unsigned("==", builder.and_(valid_v, every_tap), every_tap))
                with builder.if_else(inside) as (whole, partial):
                    with whole:
                        pixels(True)
                    with partial:
                        pixels(False)
            return context.get_dummy_value()
        return sig, codegen
    return dw_run


#: ``npix`` output pixels of a depth-multiplier-1 DEPTHWISE_CONV_2D, ``x_step`` input bytes and
#: ``o_step`` output bytes apart, for channels ``ch .. ch + 15``: ``dw_run_3x3(x, x_off, x_step,
#: row_step, col_step, valid, zp, w, tap_step, bias, mult, left, right, ch, out_zp, lo, hi, out,
#: o_off, o_step, count, npix)``. Tap (fy, fx), t = fy·fw + fx, of pixel j reads ``x`` (int8 or
#: uint8, flat) at ``x_off + j·x_step + fy·row_step + fx·col_step + ch`` and the int32 weights at
#: ``t·tap_step + ch``, held in registers across the pixels. A tap whose bit t of ``valid`` is
#: clear (outside the image) reads nothing: its lanes load as the zero point ``zp``, so with the
#: bias holding bias − zp·Σw (``conv._lanes``) it adds (zp − zp)·w = 0, TFLite's skipped tap. The
#: int32 sum is requantized with the int32 per-channel ``mult``, ``left``, ``right`` (those arrays
#: and the weights padded to whole 16s), and the first ``count`` lanes (<= 16) stored at
#: ``out[o_off + j·o_step + ch]``; input bytes past ``count`` are never read.
dw_run_3x3 = _dw_run(3, 3)
dw_run_5x5 = _dw_run(5, 5)


def _shifted_input(builder, left, mult, right):
    """ADD's scaling of an input, ``MultiplyByQuantizedMultiplierSmallerThanOneExp(x << left, mult,
    -right)`` for x = input + offset (|x| <= 255), in 32-bit lanes: with s = 31 − left and
    mult = mh·2^s + ml (0 <= ml < 2^s), SaturatingRoundingDoublingHighMul's floor((x·2^left·mult +
    2^30) / 2^31) is x·mh + floor((x·ml + 2^(s−1)) / 2^s), both products within int32 for
    TFLite's left shift of 20 (|x·mh| < 2^29, |x·ml| < 2^20); then RoundingDivideByPOT as
    floor((h + 2^(right−1) − [h < 0]) / 2^right) (h itself for right 0). The loop-invariant parts
    are formed here, once; returns the per-lane step. lut.py admits the kernel only if it gives the
    reference's result on every input pair, so another left shift (products past int32) would
    leave the operation to the table, never give another result."""
    i32 = ir.IntType(32)
    v32 = ir.VectorType(i32, LANES)
    c = lambda k: ir.Constant(v32, [k] * LANES)  # noqa: E731
    s = builder.sub(c(31), left)
    mh, ml = builder.ashr(mult, s), builder.and_(mult, builder.sub(builder.shl(c(1), s), c(1)))
    half = builder.shl(c(1), builder.sub(s, c(1)))
    shifting = builder.icmp_signed(">", right, c(0))
    round_up = builder.select(shifting, builder.shl(c(1), builder.sub(right, c(1))), c(0))
    negative_down = builder.select(shifting, c(-1), c(0))

    def step(x):
        h = builder.add(builder.mul(x, mh), builder.ashr(builder.add(builder.mul(x, ml), half), s))
        t = builder.add(builder.add(h, round_up), builder.and_(builder.ashr(h, c(31)), negative_down))
        return builder.ashr(t, right)
    return step


def _binary(is_mul: bool):
    """ADD/SUB (``is_mul`` False) or MUL over a run of 8-bit inputs: see ``add_run``."""
    @intrinsic
    def binary(typingctx, a, a_off, b, b_off, params, out, o_off, n, period):
        sig = types.void(a, a_off, b, b_off, params, out, o_off, n, period)
        signed = a.dtype == types.int8

        def codegen(context, builder, signature, args):
            a_arr, a_off_v, b_arr, b_off_v, p_arr, out_arr, o_off_v, n_v, period_v = args
            i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
            v32, v8 = ir.VectorType(i32, LANES), ir.VectorType(i8, LANES)
            sa = signature.args
            a_ptr, b_ptr = _data(context, builder, sa[0], a_arr, i8), _data(context, builder, sa[2], b_arr, i8)
            o_ptr = _data(context, builder, sa[5], out_arr, i8)
            p_ptr = _data(context, builder, sa[4], p_arr, i32)
            prm = [splat(builder, builder.load(builder.gep(p_ptr, [ir.Constant(i64, k)])), v32) for k in range(12)]
            lanes = ir.Constant(v32, list(range(LANES)))
            zero8 = ir.Constant(v8, [0] * LANES)
            zero, lo32, hi32 = (ir.Constant(v32, [k] * LANES) for k in (0, -(1 << 31), (1 << 31) - 1))

            if not is_mul:
                scale_x = _shifted_input(builder, prm[2], prm[3], prm[4])
                scale_y = _shifted_input(builder, prm[2], prm[5], prm[6])

            def rows(general: bool, shifts_left: bool):
                """The loop over the rows, with requantize_lanes(general=...) (see below)."""
                # rows of ``period`` elements (the last one cut at n); b restarts at b_off in each
                with cgutils.for_range_slice(builder, ir.Constant(i64, 0), n_v, period_v) as (r, _):
                    left = builder.sub(n_v, r)
                    width = builder.select(builder.icmp_signed("<", left, period_v), left, period_v)

                    def lanes_at(j, keep):
                        """Elements r + j .. r + j + 15 (``keep``: the lanes that exist; None: all)."""
                        def operand(ptr, at, offset):
                            ptr = builder.bitcast(builder.gep(ptr, [at]), v8.as_pointer())
                            v = builder.load(ptr, align=1) if keep is None else masked_load(builder, ptr, v8, keep,
                                                                                               zero8)
                            return builder.add(builder.sext(v, v32) if signed else builder.zext(v, v32), offset)
                        rj = builder.add(r, j)
                        x = operand(a_ptr, builder.add(a_off_v, rj), prm[0])
                        y = operand(b_ptr, builder.add(b_off_v, j), prm[1])
                        if is_mul:
                            q = requantize_lanes(builder, builder.mul(x, y), prm[2], prm[3], prm[4], prm[9], prm[10],
                                                 prm[11], general, shifts_left)
                        else:
                            sx, sy = scale_x(x), scale_y(y)
                            q = requantize_lanes(builder, builder.add(sx, sy), prm[7], zero, prm[8], prm[9],
                                                 prm[10], prm[11], general, False)
                        dst = builder.bitcast(builder.gep(o_ptr, [builder.add(o_off_v, rj)]), v8.as_pointer())
                        if keep is None:
                            builder.store(builder.trunc(q, v8), dst, align=1)
                        else:
                            masked_store(builder, builder.trunc(q, v8), dst, keep)

                    # whole 16-lane steps with plain loads and stores, then one masked step for the rest
                    entry = builder.block
                    head = builder.append_basic_block("bin.head")
                    body = builder.append_basic_block("bin.body")
                    tail = builder.append_basic_block("bin.tail")
                    last = builder.append_basic_block("bin.last")
                    done = builder.append_basic_block("bin.done")
                    builder.branch(head)
                    builder.position_at_end(head)
                    j = builder.phi(i64)
                    j.add_incoming(ir.Constant(i64, 0), entry)
                    step = ir.Constant(i64, LANES)
                    builder.cbranch(builder.icmp_signed("<=", builder.add(j, step), width), body, tail)
                    builder.position_at_end(body)
                    lanes_at(j, None)
                    j.add_incoming(builder.add(j, step), builder.block)
                    builder.branch(head)
                    builder.position_at_end(tail)
                    builder.cbranch(builder.icmp_signed("<", j, width), last, done)
                    builder.position_at_end(last)
                    left_j = builder.trunc(builder.sub(width, j), i32)
                    lanes_at(j, builder.icmp_signed("<", lanes, splat(builder, left_j, v32)))
                    builder.branch(done)
                    builder.position_at_end(done)

            # the cheaper requantization where simd.floor_at_zero_point holds (a RELU-type clamp and,
            # for MUL, no left shift), else the general one (without MUL's left shift where it is 0)
            scalar = [builder.load(builder.gep(p_ptr, [ir.Constant(i64, k)])) for k in (3, 9, 10)]
            no_left = builder.icmp_signed("==", scalar[0], ir.Constant(i32, 0)) if is_mul \
                else ir.Constant(ir.IntType(1), 1)
            cheap = builder.and_(no_left, builder.icmp_signed(">=", scalar[2], scalar[1]))
            with builder.if_else(cheap) as (then, otherwise):
                with then:
                    rows(False, False)
                with otherwise:
                    if is_mul:
                        with builder.if_else(no_left) as (lean, full):
                            with lean:
                                rows(True, False)
                            with full:
                                rows(True, True)
                    else:
                        rows(True, False)
            return context.get_dummy_value()
        return sig, codegen
    return binary


#: 8-bit ADD (SUB: input 2's multiplier negated, as sub.cc) over ``n`` elements, 16 lanes at a
#: time, the parameters held in registers: ``add_run(a, a_off, b, b_off, params, out, o_off, n,
#: period)`` stores TFLite's AddElementwise of ``a[a_off + i]`` and ``b[b_off + i % period]`` at
#: ``out[o_off + i]`` for i < n (no byte past them read or written): ``b`` repeats every ``period``
#: elements (a per-channel operand: ``period`` = n where it does not). ``params`` (int32): input offsets (−zero
#: points), left shift, input 1 multiplier and right shift, input 2 multiplier and right shift,
#: output multiplier and right shift, output zero point, activation min and max.
add_run = _binary(False)
#: 8-bit MUL, as ``add_run``; ``params``: input offsets, output multiplier, left and right shift,
#: (4 unused), output zero point, activation min and max.
mul_run = _binary(True)




def _copy_bytes_of(masked: bool):
    """``copy_bytes`` in 64-byte masked moves (``masked``) or as one memmove."""

    @intrinsic
    def copy_bytes(typingctx, dst, dst_off, src, src_off, n):
        sig = types.void(dst, dst_off, src, src_off, n)

        def codegen(context, builder, signature, args):
            d_arr, d_off, s_arr, s_off, n_v = args
            i8 = ir.IntType(8)
            v8 = ir.VectorType(i8, 64)
            sa = signature.args
            d_ptr, s_ptr = _data(context, builder, sa[0], d_arr, i8), _data(context, builder, sa[2], s_arr, i8)
            if not masked:
                cgutils.raw_memmove(builder, builder.gep(d_ptr, [d_off]), builder.gep(s_ptr, [s_off]), n_v, 1)
                return context.get_dummy_value()
            zero = ir.Constant(v8, [0] * 64)

            def step(j, keep):
                v = masked_load(builder, builder.gep(s_ptr, [builder.add(s_off, j)]), v8, keep, zero)
                masked_store(builder, v, builder.gep(d_ptr, [builder.add(d_off, j)]), keep)
            byte_blocks(builder, n_v, "copy", step)
            return context.get_dummy_value()
        return sig, codegen
    return copy_bytes


def _fill_copy_of(masked: bool):
    """``fill_copy`` in 64-byte masked moves (``masked``) or as a memmove and a memset."""

    @intrinsic
    def fill_copy(typingctx, dst, dst_off, src, src_off, n_src, n, value):
        sig = types.void(dst, dst_off, src, src_off, n_src, n, value)

        def codegen(context, builder, signature, args):
            d_arr, d_off, s_arr, s_off, n_src_v, n_v, value_v = args
            i8, i32 = ir.IntType(8), ir.IntType(32)
            v8 = ir.VectorType(i8, 64)
            sa = signature.args
            d_ptr, s_ptr = _data(context, builder, sa[0], d_arr, i8), _data(context, builder, sa[2], s_arr, i8)
            if not masked:
                start = builder.gep(d_ptr, [d_off])
                cgutils.raw_memmove(builder, start, builder.gep(s_ptr, [s_off]), n_src_v, 1)
                cgutils.memset(builder, builder.gep(start, [n_src_v]), builder.sub(n_v, n_src_v),
                               builder.trunc(value_v, i8))
                return context.get_dummy_value()
            fill = splat(builder, builder.trunc(value_v, i8), v8)
            lanes = ir.Constant(ir.VectorType(i32, 64), list(range(64)))

            def step(j, keep):
                left = builder.sub(n_src_v, j)  # source bytes from j on (may be <= 0)
                left = builder.select(builder.icmp_signed("<", left, ir.Constant(left.type, 0)),
                                      ir.Constant(left.type, 0), left)
                left = builder.select(builder.icmp_signed(">", left, ir.Constant(left.type, 64)),
                                      ir.Constant(left.type, 64), left)
                have = builder.icmp_unsigned("<", lanes, splat(builder, builder.trunc(left, i32), lanes.type))
                v = masked_load(builder, builder.gep(s_ptr, [builder.add(s_off, j)]), v8, have, fill)
                masked_store(builder, v, builder.gep(d_ptr, [builder.add(d_off, j)]), keep)
            byte_blocks(builder, n_v, "fillcopy", step)
            return context.get_dummy_value()
        return sig, codegen
    return fill_copy


#: ``copy_bytes(dst, dst_off, src, src_off, n)``: ``dst[dst_off:dst_off + n] = src[src_off:src_off
#: + n]`` (1-byte arrays; where the two runs overlap, dst before src), in 64-byte masked moves
#: where ``BYTE_MASKS``, else memmove: a short run (an im2col row of a 3-channel image is 9 bytes)
#: is one load and one store instead of a loop, and no byte outside either range is touched.
copy_bytes = _copy_bytes_of(BYTE_MASKS)
#: ``fill_copy(dst, dst_off, src, src_off, n_src, n, value)``: ``dst[dst_off:dst_off + n]`` =
#: ``src[src_off:src_off + n_src]`` followed by ``value`` bytes (``n_src`` <= ``n``; 1-byte
#: arrays), in 64-byte masked moves where ``BYTE_MASKS`` (a padded row is one load and one store
#: per 64 bytes), else a memmove and a memset. No byte outside either range is touched.
fill_copy = _fill_copy_of(BYTE_MASKS)
