"""Float32 DEPTHWISE_CONV_2D (NHWC, depth multiplier 1) on numba: the depthwise layers of the float
CNNs whose operations the numba backend runs wholly (f32_conv.py says why).

The kernel (``dwg``) is LLVM vector IR: numba's own loops over a few dozen channels neither keep a
pixel's sums in registers nor vectorise without checks. Pixels are taken in groups of ``GROUP``
along an output row; for each block of 16 channels the group's kh·kw weight vectors are loaded
once, and each pixel's sum is a chain of kh·kw fused multiply-adds (the group's chains independent,
so the core overlaps them); the block's 16 channels of every tap are one 64-byte load. A group
reads its input window once per block, in channel order, which stays in the L1 cache across the
blocks. Interior pixels (every tap in the image) run unmasked; an output row's edge pixels, and
the rows whose window leaves the image, read only their in-image taps through masked loads (NNAPI
pads with zeros: the others add nothing). Sums are float32 in tap order, the activation's clamp
after (NaN passing through as in the reference's clip).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np
from llvmlite import ir
from numba import errors, types
from numba.core import cgutils
from numba.extending import intrinsic

from hal import quant
from hal.backends.numba_kernels import BACKEND
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.simd import _data, counted_loop, splat
from hal.operations.conv import BIAS, FILTER, INPUT, ConvParams
from hal.registry import OperationContext
from hal.types import OperandType, OperationType

DW = OperationType.DEPTHWISE_CONV_2D
F32 = OperandType.TENSOR_FLOAT32
#: Output pixels per group (their sums' chains in flight together).
GROUP = 4
#: Filter sizes compiled (kh, kw).
SIZES = ((1, 1), (2, 2), (3, 3), (5, 5))

L = 16
f32, i32, i64, i1 = ir.FloatType(), ir.IntType(32), ir.IntType(64), ir.IntType(1)
vf, vm = ir.VectorType(f32, L), ir.VectorType(i1, L)
ONES = ir.Constant(vm, [1] * L)


def _load(builder, ptr, keep):
    """16 floats at ``ptr``: a plain load where ``keep`` is ONES, else lanes ``keep`` (others 0)."""
    if keep is ONES:
        return builder.load(builder.bitcast(ptr, vf.as_pointer()), align=4)
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vf, [vf.as_pointer(), i32, vm, vf]), "llvm.masked.load.v16f32.p0"
    )
    return builder.call(
        fn, [builder.bitcast(ptr, vf.as_pointer()), ir.Constant(i32, 4), keep, ir.Constant(vf, [0.0] * L)]
    )


def _store(builder, v, ptr, keep):
    if keep is ONES:
        builder.store(v, builder.bitcast(ptr, vf.as_pointer()), align=4)
        return
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [vf, vf.as_pointer(), i32, vm]), "llvm.masked.store.v16f32.p0"
    )
    builder.call(fn, [v, builder.bitcast(ptr, vf.as_pointer()), ir.Constant(i32, 4), keep])


def _c(n):
    return ir.Constant(i64, n)


@intrinsic
def dwg(typingctx, kh, kw, u, x, x_off, col_step, row_step, C, w, b, out, o_off, n, lo, hi, rmask, cmask):
    """``n`` groups of ``u`` output pixels (``col_step`` apart in the input; their outputs C apart
    from ``o_off``), every channel: 16-channel blocks, each block's kh·kw weights loaded once for
    the group's pixels. Tap (i, j) is read iff bit i of ``rmask`` and bit j of ``cmask`` are set
    (masked-off taps touch no memory: out-of-image taps of edge pixels); the last block masked."""
    for t in (kh, kw, u):
        if not isinstance(t, types.IntegerLiteral):
            raise errors.RequireLiteralValue("the filter size and group size must be compile-time constants")
    KH, KW, U = kh.literal_value, kw.literal_value, u.literal_value
    sig = types.void(kh, kw, u, x, x_off, col_step, row_step, C, w, b, out, o_off, n, lo, hi, rmask, cmask)

    def codegen(context, builder, signature, args):
        (_, _, _, xa, x_off, col_step, row_step, C, wa, ba, oa, o_off, n, lo, hi, rmask, cmask) = args
        sa = signature.args
        xp, wp, bp, op = (_data(context, builder, sa[k], a, f32) for k, a in ((3, xa), (8, wa), (9, ba), (10, oa)))
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf, vf]), "llvm.fma.v16f32")
        lanes = ir.Constant(ir.VectorType(i32, L), list(range(L)))
        los, his = splat(builder, lo, vf), splat(builder, hi, vf)
        valid = []
        for i in range(KH):
            for j in range(KW):
                valid.append(
                    builder.and_(
                        builder.icmp_unsigned("!=", builder.and_(rmask, _c(1 << i)), _c(0)),
                        builder.icmp_unsigned("!=", builder.and_(cmask, _c(1 << j)), _c(0)),
                    )
                )
        tap_off = [
            builder.add(builder.mul(_c(i), row_step), builder.mul(_c(j), C)) for i in range(KH) for j in range(KW)
        ]
        full_blocks = builder.sdiv(C, _c(L))
        tail = builder.sub(C, builder.mul(full_blocks, _c(L)))
        g, _, close_g = counted_loop(builder, "grp", n)
        p0 = builder.mul(g, _c(U))
        bases = [builder.add(x_off, builder.mul(builder.add(p0, _c(q)), col_step)) for q in range(U)]
        obases = [builder.add(o_off, builder.mul(builder.add(p0, _c(q)), C)) for q in range(U)]

        def block(c, keep, masked_taps):
            ks = (
                [builder.select(v, keep, ir.Constant(vm, [0] * L)) for v in valid]
                if masked_taps
                else [keep] * len(valid)
            )
            ws = [_load(builder, builder.gep(wp, [builder.add(builder.mul(_c(t), C), c)]), k) for t, k in enumerate(ks)]
            bias = _load(builder, builder.gep(bp, [c]), keep)
            accs = [bias] * U
            for t, (k, off) in enumerate(zip(ks, tap_off)):
                accs = [
                    builder.call(
                        fma,
                        [
                            _load(builder, builder.gep(xp, [builder.add(builder.add(bases[q], off), c)]), k),
                            ws[t],
                            accs[q],
                        ],
                    )
                    for q in range(U)
                ]
            for q in range(U):
                a = builder.select(builder.fcmp_ordered("<", accs[q], los), los, accs[q])
                a = builder.select(builder.fcmp_ordered(">", a, his), his, a)
                _store(builder, a, builder.gep(op, [builder.add(obases[q], c)]), keep)

        all_in = builder.and_(
            builder.icmp_unsigned("==", rmask, _c((1 << KH) - 1)), builder.icmp_unsigned("==", cmask, _c((1 << KW) - 1))
        )
        with builder.if_else(all_in) as (then, other):
            with then:
                cb, _, close_c = counted_loop(builder, "cb", full_blocks)
                block(builder.mul(cb, _c(L)), ONES, False)
                close_c()
                with builder.if_then(builder.icmp_signed(">", tail, _c(0))):
                    keep = builder.icmp_signed(
                        "<", lanes, splat(builder, builder.trunc(tail, i32), ir.VectorType(i32, L))
                    )
                    block(builder.mul(full_blocks, _c(L)), keep, False)
            with other:
                cb, _, close_c = counted_loop(builder, "cbm", builder.sdiv(builder.add(C, _c(L - 1)), _c(L)))
                c = builder.mul(cb, _c(L))
                left = builder.sub(C, c)
                keep = builder.icmp_signed("<", lanes, splat(builder, builder.trunc(left, i32), ir.VectorType(i32, L)))
                block(c, keep, True)
                close_c()
        close_g()
        return context.get_dummy_value()

    return sig, codegen


def _run_of(kh: int, kw: int):
    """The layer for a kh x kw filter (constants of the compiled code, as fc_float's chains)."""
    full_c = (1 << kw) - 1

    @numba.njit(
        [
            numba.void(
                ro(np.float32, 1),
                ro(np.int64, 1),
                ro(np.float32, 1),
                ro(np.float32, 1),
                ro(np.float32, 1),
                rw(np.float32, 1),
            )
        ],
        cache=True,
        nogil=True,
    )
    def run(x, g, w, b, clamps, out):
        """``g`` = batch, h, w, c, oh, ow, sh, sw, pt, pl (``GEOMETRY``)."""
        batch, h, wi, c, oh, ow, sh, sw, pt, pl = g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9]
        lo, hi = clamps[0], clamps[1]
        # interior columns: every tap inside the image
        ow_lo = min(max((pl + sw - 1) // sw, 0), ow)
        ow_hi = min(max((wi - kw + pl) // sw + 1, ow_lo), ow)
        groups = (ow_hi - ow_lo) // GROUP
        for bb in range(batch):
            x0, o0 = bb * h * wi * c, bb * oh * ow * c
            for oy in range(oh):
                iy0 = oy * sh - pt
                rm = 0
                for i in range(kh):
                    if 0 <= iy0 + i < h:
                        rm |= 1 << i
                o_row = o0 + oy * ow * c
                for ox in range(ow):
                    if ow_lo <= ox < ow_hi and (ox - ow_lo) < groups * GROUP:
                        continue  # the groups below
                    ix0 = ox * sw - pl
                    cm = 0
                    for j in range(kw):
                        if 0 <= ix0 + j < wi:
                            cm |= 1 << j
                    dwg(
                        kh,
                        kw,
                        1,
                        x,
                        x0 + (iy0 * wi + ix0) * c,
                        sw * c,
                        wi * c,
                        c,
                        w,
                        b,
                        out,
                        o_row + ox * c,
                        1,
                        lo,
                        hi,
                        rm,
                        cm,
                    )
                if groups:
                    ix0 = ow_lo * sw - pl
                    dwg(
                        kh,
                        kw,
                        GROUP,
                        x,
                        x0 + (iy0 * wi + ix0) * c,
                        sw * c,
                        wi * c,
                        c,
                        w,
                        b,
                        out,
                        o_row + ow_lo * c,
                        groups,
                        lo,
                        hi,
                        rm,
                        full_c,
                    )

    return run


RUNS = {size: _run_of(*size) for size in SIZES}
GEOMETRY = ("batch", "h", "w", "c", "oh", "ow", "sh", "sw", "pt", "pl")


@dataclass
class FloatDepthwise:
    """A float32 depthwise layer ready to run: weights [kh·kw, C], bias, geometry, clamp bounds."""

    weights: np.ndarray  # float32, flat
    bias: np.ndarray  # float32 [C]
    geometry: np.ndarray  # int64 [len(GEOMETRY)]
    clamps: np.ndarray  # float32 [2]
    kh: int
    kw: int

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        g = self.geometry
        return int(g[0]), int(g[4]), int(g[5]), int(g[3])


def supports(ctx: OperationContext) -> str | None:
    p: ConvParams = ctx.params
    if ctx.inputs[INPUT].type != F32:
        return "not float32"
    if p.nchw:
        return "NCHW layout (the float kernel computes NHWC)"
    if p.multiplier != 1:
        return f"depth multiplier {p.multiplier} (the float kernel takes 1)"
    if p.rows.dilation != 1 or p.cols.dilation != 1:
        return "dilation (the float kernel takes 1)"
    if (p.rows.filter, p.cols.filter) not in SIZES:
        return f"a {p.rows.filter}x{p.cols.filter} filter (the float kernel takes {SIZES})"
    if not (ctx.input(FILTER).is_constant and ctx.input(BIAS).is_constant):
        return "filter or bias is not a constant"
    return None


def plan(ctx: OperationContext) -> FloatDepthwise:
    p: ConvParams = ctx.params
    batch, h, w, c = ctx.inputs[INPUT].shape
    kh, kw = p.rows.filter, p.cols.filter
    weights = np.ascontiguousarray(np.asarray(ctx.input(FILTER).value, np.float32).reshape(kh * kw * c))
    g = (batch, h, w, c, p.rows.out, p.cols.out, p.rows.stride, p.cols.stride, p.rows.pad_head, p.cols.pad_head)
    return FloatDepthwise(
        weights,
        np.ascontiguousarray(ctx.input(BIAS).value, np.float32),
        np.array(g, np.int64),
        np.array(quant.activation_range_float(p.act), np.float32),
        kh,
        kw,
    )


def execute(ctx: OperationContext, inputs: list) -> list:
    d: FloatDepthwise = ctx.data
    out = np.empty(d.out_shape, np.float32)
    RUNS[d.kh, d.kw](
        np.ascontiguousarray(inputs[INPUT], np.float32).reshape(-1),
        d.geometry,
        d.weights,
        d.bias,
        d.clamps,
        out.reshape(-1),
    )
    return [out]


def bind(ctx: OperationContext, inputs: list, outputs: list):
    d: FloatDepthwise = ctx.data
    x, out = inputs[INPUT], outputs[0]
    if x is None or not x.flags.c_contiguous or not out.flags.c_contiguous:
        return None
    return functools.partial(RUNS[d.kh, d.kw], x.reshape(-1), d.geometry, d.weights, d.bias, d.clamps, out.reshape(-1))


BACKEND.register(
    DW, plan=plan, execute=execute, types=(F32,), supports=supports, prepacked_inputs=(FILTER, BIAS), bind=bind
)
