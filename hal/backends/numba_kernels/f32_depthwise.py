"""Float32 DEPTHWISE_CONV_2D (NHWC, depth multiplier 1, dilation 1, constant filter and bias).

A depthwise layer does few multiply-adds per byte it reads: its speed is how many of its loads the
vector units share. Here one call runs an image's output rows; each row is cut into groups of U
output pixels (8 for a 3x3 filter at stride 1, else 4) and each group runs every 16-channel block
of those pixels: the block's taps of weights loaded into registers once, then the group's input
columns loaded once each and used by every pixel of the group whose window holds them (a 3x3
stride-1 group of 8 reads 3 × 10 vectors for its 72 fused multiply-adds), the sums starting at the
bias, the activation's clamp, one store per pixel. Rows, then pixels, then channels: the input
streams through the cache in memory order. A group whose windows lie inside the image, on a whole
block, takes plain loads; one at an edge, or on a block of the last channels, takes masked loads
whose out-of-image lanes read nothing and add 0·w (the reference's zero padding, NaN for an
infinite weight included). 3x3 and 5x5 filters at strides 1 and 2 across are unrolled this way;
other filters and strides take ``_any``: one pixel at a time, a runtime loop over its taps.

A 64-byte vector that straddles two cache lines costs two accesses (numpy's buffers start 16 or 48
bytes past one): where the layer has 128 channels or more, a multiple of 16, and its output does
not start on a cache line, the blocks start at the first channel that does (``_head``; the channels
before it are one masked block), and the bound form re-packs the weights to match. The output's
lines, not the input's, where the two lie differently: split stores measured costlier. ``execute``
allocates its output as its input lies.

hal.fusion's ``conv_epilogue`` (``plan_epilogue``): the layer's activation (a hard-swish or swish
after it, f32_lanes' code: geometry's ``ACT``) is applied to each stored group's sums, and a zero
PAD before it is more padding (geometry's image and top/left padding are the PAD's input's). Each
group's store switches on ``ACT`` once (a branch the layer takes the same way every time).

Sums are float32 fused multiply-adds in the filter's (row, column) order after the bias; the
reference backend adds the bias last with separate roundings: results differ by float32 rounding,
far inside NNAPI's float32 tolerance (tests/backends/test_numba_f32_depthwise.py compares, with
CTS's criteria). NaN propagates through the clamp, as the reference's clip keeps it.
"""
from __future__ import annotations

import dataclasses
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
from hal.backends.numba_kernels.f32_activations import activation_of
from hal.backends.numba_kernels.f32_lanes import ACT_NONE, activate
from hal.backends.numba_kernels.f32_layout import PADS, image_of
from hal.backends.numba_kernels.f32_simd import store_first
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.backends.numba_kernels.simd import ACCUMULATORS, _data, counted_loop, splat
from hal.operations.conv import BIAS, DW, FILTER, INPUT, ConvParams
from hal.registry import OperationContext
from hal.types import OperandType

LANES = 16
#: Output pixels per group of the unrolled kernels, by (filter size, stride across). A group keeps
#: its taps' weights and its pixels' sums in registers: AVX2's 16 registers of 8 lanes hold half of
#: what AVX-512's 32 of 16 hold (simd's ``ACCUMULATORS``). Measured there (each length on the same
#: layers, interleaved): 3x3 groups of 4 at stride 1 and 2 at stride 2, 5x5 of 4 and 2.
UNROLL = ({(3, 1): 8, (3, 2): 4, (5, 1): 4, (5, 2): 4} if ACCUMULATORS >= 16 else
          {(3, 1): 4, (3, 2): 2, (5, 1): 4, (5, 2): 2})
#: Channels from which blocks start on the output's cache lines (``_head``); below, the extra
#: masked block costs more than the split loads it saves (measured).
ALIGN_FROM = 128
#: geometry's fields (int64), in order; ACT: the activation after the clamp (f32_lanes' ``ACT_*``)
N, H, W, C, OH, OW, SH, SW, PT, PL, HEAD, WSHIFT, KH, KW, ACT = range(15)

_F32, _I32, _I64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
_VF, _VM = ir.VectorType(_F32, LANES), ir.VectorType(ir.IntType(1), LANES)


def _i(n: int):
    return ir.Constant(_I64, n)


class _Code:
    """The LLVM building blocks both intrinsics share, for one codegen: the arrays' float
    pointers, masked loads and stores, the clamp, and the layer's channel blocks."""

    def __init__(self, context, builder, sig_args, args, names, lo, hi, c, head, act):
        self.b = b = builder
        self.act = act
        self.ptr = {n: _data(context, b, t, a, _F32) for n, t, a in zip(names, sig_args, args)}
        mod = b.module
        self.fma = cgutils.get_or_insert_function(mod, ir.FunctionType(_VF, [_VF] * 3), "llvm.fma.v16f32")
        self.mload = cgutils.get_or_insert_function(
            mod, ir.FunctionType(_VF, [_VF.as_pointer(), _I32, _VM, _VF]), "llvm.masked.load.v16f32.p0")
        self.none, self.all = ir.Constant(_VM, [0] * LANES), ir.Constant(_VM, [1] * LANES)
        self.lo, self.hi = splat(b, lo, _VF), splat(b, hi, _VF)
        # blocks: [0, head) (masked; head 0: none), then whole ones from head, then the rest (masked)
        self.head = head
        self.whole = b.sdiv(b.sub(c, head), _i(LANES))
        self.tail_at = b.add(head, b.mul(self.whole, _i(LANES)))
        self.tail = b.sub(c, self.tail_at)
        self.head_keep, self.tail_keep = self.lanes_below(head), self.lanes_below(self.tail)

    def lanes_below(self, n):
        lanes = ir.Constant(ir.VectorType(_I32, LANES), list(range(LANES)))
        return self.b.icmp_signed("<", lanes, splat(self.b, self.b.trunc(n, _I32), lanes.type))

    def vec(self, name, at):
        return self.b.bitcast(self.b.gep(self.ptr[name], [at]), _VF.as_pointer())

    def load(self, name, at, keep=None):
        if keep is None:
            return self.b.load(self.vec(name, at), align=4)
        zero = ir.Constant(_VF, [0.0] * LANES)
        return self.b.call(self.mload, [self.vec(name, at), ir.Constant(_I32, 4), keep, zero])

    def store(self, ys, ats, keep=None):
        """Clamp each of ``ys`` (ordered compares: NaN stays NaN), apply the activation, and store
        them at ``ats`` (lanes ``keep``)."""
        b = self.b
        ys = [b.select(b.fcmp_ordered("<", y, self.lo), self.lo, y) for y in ys]
        ys = activate(b, self.act, [b.select(b.fcmp_ordered(">", y, self.hi), self.hi, y) for y in ys])
        for y, at in zip(ys, ats):
            if keep is None:
                b.store(y, self.vec("out", at), align=4)
            else:  # the head's or the tail's block (``blocks``)
                store_first(b, y, b.gep(self.ptr["out"], [at]), self.tail if keep is self.tail_keep else self.head)

    def inside(self, v, n):
        return self.b.and_(self.b.icmp_signed(">=", v, _i(0)), self.b.icmp_signed("<", v, n))

    def blocks(self, emit):
        """``emit(c, keep)`` for every block of channels from c: ``keep`` its lanes, None for a
        whole block."""
        b = self.b
        with b.if_then(b.icmp_signed(">", self.head, _i(0))):
            emit(_i(0), self.head_keep)
        k, _, close = counted_loop(b, "dw.blocks", self.whole)
        emit(b.add(self.head, b.mul(k, _i(LANES))), None)
        close()
        with b.if_then(b.icmp_signed(">", self.tail, _i(0))):
            emit(self.tail_at, self.tail_keep)


def _literal(*ts):
    for t in ts:
        if not isinstance(t, types.IntegerLiteral):
            raise errors.RequireLiteralValue(f"a compile-time constant, not {t}")
    return [t.literal_value for t in ts]


@intrinsic
def _rows(typingctx, kh, kw, s, u, x, x_off, w, b, geom, out, o_off, lo, hi):
    """Every output row of one image (input at ``x[x_off:]``, output at ``out[o_off:]``) of a
    ``kh`` × ``kw`` filter at stride ``s`` across (all literals), groups of ``u`` pixels."""
    fh, fw, stride, unroll = _literal(kh, kw, s, u)
    sig = types.void(kh, kw, s, u, x, x_off, w, b, geom, out, o_off, lo, hi)

    def codegen(context, builder, signature, args):
        bl = builder
        xa, x_off_v, wa, ba, ga, oa, o_off_v, lo_v, hi_v = args[4:]
        gp = bl.bitcast(context.make_array(signature.args[8])(context, bl, ga).data, _I64.as_pointer())
        g = [bl.load(bl.gep(gp, [_i(k)])) for k in range(ACT + 1)]
        code = _Code(context, bl, [signature.args[k] for k in (4, 6, 7, 9)], [xa, wa, ba, oa], ("x", "w", "b", "out"),
                     lo_v, hi_v, g[C], g[HEAD], g[ACT])
        h, wd, ch, sh, sw, pt, pl, ow = g[H], g[W], g[C], g[SH], g[SW], g[PT], g[PL], g[OW]
        wrow = bl.add(bl.mul(bl.sdiv(bl.add(ch, _i(LANES - 1)), _i(LANES)), _i(LANES)), _i(LANES))
        row_c = bl.mul(wd, ch)
        groups = bl.sdiv(ow, _i(unroll))
        rest = bl.sub(ow, bl.mul(groups, _i(unroll)))

        oh, _, close_rows = counted_loop(bl, "dw.rows", g[OH])
        ih0 = bl.sub(bl.mul(oh, sh), pt)
        row_ok = [code.inside(bl.add(ih0, _i(r)), h) for r in range(fh)]
        rows_in = functools.reduce(bl.and_, row_ok)
        x_row = bl.add(x_off_v, bl.mul(ih0, row_c))
        o_row = bl.add(o_off_v, bl.mul(bl.mul(oh, ow), ch))

        def group(n, ow0, c, masks, keep):
            """``n`` pixels from ``ow0``, channels ``c`` on; ``masks[r][k]``: tap row r, column k's
            lanes (None: plain loads); ``keep``: the stores' lanes (None: all)."""
            ws = [code.load("w", bl.add(bl.mul(_i(t), wrow), bl.add(c, g[WSHIFT]))) for t in range(fh * fw)]
            acc = [code.load("b", bl.add(c, g[WSHIFT]))] * n
            at = bl.add(bl.add(x_row, c), bl.mul(bl.sub(bl.mul(ow0, sw), pl), ch))
            for r in range(fh):
                # offsets as a chain of adds (LLVM keeps it so; taps' invariant offsets would spill)
                tap = bl.add(at, bl.mul(_i(r), row_c))
                for k in range((n - 1) * stride + fw):
                    tap = tap if k == 0 else bl.add(tap, ch)
                    users = [(q, k - q * stride) for q in range(n) if 0 <= k - q * stride < fw]
                    if users:  # (a stride wider than the filter skips columns)
                        v = code.load("x", tap, None if masks is None else masks[r][k])
                        for q, j in users:
                            acc[q] = bl.call(code.fma, [v, ws[r * fw + j], acc[q]])
            code.store(acc, [bl.add(bl.add(o_row, c), bl.mul(bl.add(ow0, _i(q)), ch)) for q in range(n)], keep)

        def pixels(n, ow0):
            iw0 = bl.sub(bl.mul(ow0, sw), pl)
            cols = (n - 1) * stride + fw
            cols_in = bl.and_(bl.icmp_signed(">=", iw0, _i(0)), bl.icmp_signed("<=", bl.add(iw0, _i(cols)), wd))
            with bl.if_else(bl.and_(cols_in, rows_in)) as (inner, edge):
                with inner:
                    code.blocks(lambda c, keep: group(n, ow0, c, None if keep is None else [[keep] * cols] * fh, keep))
                with edge:
                    col_ok = [code.inside(bl.add(iw0, _i(k)), wd) for k in range(cols)]
                    ok = [[bl.and_(ro_, co) for co in col_ok] for ro_ in row_ok]

                    def masked(c, keep):
                        lanes = code.all if keep is None else keep
                        group(n, ow0, c, [[bl.select(o, lanes, code.none) for o in rr] for rr in ok], keep)
                    code.blocks(masked)

        k, _, close = counted_loop(bl, "dw.groups", groups)
        pixels(unroll, bl.mul(k, _i(unroll)))
        close()
        at, size = bl.mul(groups, _i(unroll)), unroll // 2
        while size:  # the row's last ow mod u pixels: groups of u/2, u/4, ..., 1
            with bl.if_then(bl.icmp_unsigned("!=", bl.and_(rest, _i(size)), _i(0))):
                pixels(size, at)
            at, size = bl.add(at, bl.and_(rest, _i(size))), size // 2
        close_rows()
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _any(typingctx, x, x_off, w, b, geom, out, o_off, lo, hi):
    """``_rows`` for any filter size and stride: one pixel at a time, its taps a runtime loop
    (masked loads, the sum carried in registers)."""
    sig = types.void(x, x_off, w, b, geom, out, o_off, lo, hi)

    def codegen(context, builder, signature, args):
        bl = builder
        xa, x_off_v, wa, ba, ga, oa, o_off_v, lo_v, hi_v = args
        gp = bl.bitcast(context.make_array(signature.args[4])(context, bl, ga).data, _I64.as_pointer())
        g = [bl.load(bl.gep(gp, [_i(k)])) for k in range(ACT + 1)]
        code = _Code(context, bl, [signature.args[k] for k in (0, 2, 3, 5)], [xa, wa, ba, oa], ("x", "w", "b", "out"),
                     lo_v, hi_v, g[C], g[HEAD], g[ACT])
        ch, wd = g[C], g[W]
        wrow = bl.add(bl.mul(bl.sdiv(bl.add(ch, _i(LANES - 1)), _i(LANES)), _i(LANES)), _i(LANES))
        oh, _, close_rows = counted_loop(bl, "any.rows", g[OH])
        ow, _, close_cols = counted_loop(bl, "any.cols", g[OW])
        ih0, iw0 = bl.sub(bl.mul(oh, g[SH]), g[PT]), bl.sub(bl.mul(ow, g[SW]), g[PL])
        at0 = bl.add(x_off_v, bl.mul(bl.add(bl.mul(ih0, wd), iw0), ch))
        o_at = bl.add(o_off_v, bl.mul(bl.add(bl.mul(oh, g[OW]), ow), ch))

        def pixel(c, keep):
            lanes_in = code.all if keep is None else keep
            wc = bl.add(c, g[WSHIFT])
            r, (acc,), close_r = counted_loop(bl, "any.fy", g[KH], [code.load("b", wc)])
            row_keep = bl.select(code.inside(bl.add(ih0, r), g[H]), lanes_in, code.none)
            j, (acc_j,), close_j = counted_loop(bl, "any.fx", g[KW], [acc])
            lanes = bl.select(code.inside(bl.add(iw0, j), wd), row_keep, code.none)
            v = code.load("x", bl.add(bl.add(at0, c), bl.mul(bl.add(bl.mul(r, wd), j), ch)), lanes)
            wv = code.load("w", bl.add(bl.mul(bl.add(bl.mul(r, g[KW]), j), wrow), wc))
            summed = bl.call(code.fma, [v, wv, acc_j])
            close_j([summed])
            close_r([acc_j])
            code.store([acc], [bl.add(o_at, c)], keep)
        code.blocks(pixel)
        close_cols()
        close_rows()
        return context.get_dummy_value()
    return sig, codegen


_SIG = [numba.void(ro(np.float32, 1), ro(np.float32, 1), ro(np.float32, 1), ro(np.int64, 1), ro(np.float32, 1),
                   rw(np.float32, 1))]


def _unrolled(size: int, stride: int):
    """``run`` for a ``size`` × ``size`` filter at ``stride`` across (closure ints: literals to
    ``_rows``; numba's cache keys a closure on its cells, which hold those ints only)."""
    unroll = UNROLL[(size, stride)]

    @njit(_SIG, cache=True, nogil=True)
    def run(x, w, b, geom, clamp, out):
        """The layer on ``geom[N]`` images: x [N, H, W, C] and out [N, OH, OW, C], flat."""
        per_x, per_o = geom[H] * geom[W] * geom[C], geom[OH] * geom[OW] * geom[C]
        for n in range(geom[N]):
            _rows(size, size, stride, unroll, x, n * per_x, w, b, geom, out, n * per_o, clamp[0], clamp[1])
    return run


@njit(_SIG, cache=True, nogil=True)
def _run_any(x, w, b, geom, clamp, out):
    """``run`` for other filters and strides."""
    per_x, per_o = geom[H] * geom[W] * geom[C], geom[OH] * geom[OW] * geom[C]
    for n in range(geom[N]):
        _any(x, n * per_x, w, b, geom, out, n * per_o, clamp[0], clamp[1])


#: The compiled forms, ``FloatDepthwise.kernel`` indexing them: unrolled ones per UNROLL, then _run_any.
KERNELS = (*(_unrolled(size, stride) for size, stride in UNROLL), _run_any)


def _head(out: np.ndarray, c: int) -> int:
    """Channels before the first block that starts on one of ``out``'s cache lines (0: no shift)."""
    if c < ALIGN_FROM or c % LANES or out.ctypes.data % 4:
        return 0
    return (-out.ctypes.data % 64) // 4


def _aligned(n: int, like: int = 0) -> np.ndarray:
    """A new float32 array of ``n`` whose address is ``like`` bytes past a cache line."""
    raw = np.empty(n + 32, np.float32)
    skip = ((like - raw.ctypes.data) % 64) // 4
    return raw[skip:skip + n]


@dataclass
class FloatDepthwise:
    """A float32 depthwise layer ready to run: its filter as rows of taps, each tap's weights for
    every channel then zeros (C rounded up to 16, plus 16: room to shift, ``_shifted``), the
    bias padded alike, the geometry (``geometry[N]``, ``[HEAD]`` and ``[WSHIFT]`` set per run)
    and the clamp bounds."""

    weights: np.ndarray  # float32 [KH·KW·row]
    bias: np.ndarray  # float32 [row]
    geometry: np.ndarray  # int64, fields N .. KW
    clamp: np.ndarray  # float32 [2]
    kernel: int  # index into KERNELS

    def _geometry(self, x: np.ndarray, head: int, shift: int) -> np.ndarray:
        g = self.geometry.copy()
        g[N], g[HEAD], g[WSHIFT] = x.shape[0], head, shift
        return g

    def _shifted(self, head: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Weights and bias in new arrays (on cache lines) whose block from channel ``head`` starts
        on a line."""
        shift = (LANES - head) % LANES
        row = self.bias.size
        w = _aligned(self.weights.size)
        w[:] = 0
        w.reshape(-1, row)[:, shift:] = self.weights.reshape(-1, row)[:, :row - shift]
        b = _aligned(row)
        b[:] = 0
        b[shift:] = self.bias[:row - shift]
        return w, b, shift

    def run(self, x: np.ndarray) -> np.ndarray:
        """The layer on the contiguous NHWC ``x``, into a new array (lying on the cache lines as ``x``)."""
        g = self.geometry
        out = _aligned(x.shape[0] * int(g[OH] * g[OW] * g[C]), x.ctypes.data % 64)
        KERNELS[self.kernel](x.reshape(-1), self.weights, self.bias, self._geometry(x, _head(out, int(g[C])), 0),
                             self.clamp, out)
        return out.reshape(x.shape[0], int(g[OH]), int(g[OW]), int(g[C]))

    def bound(self, x: np.ndarray, out: np.ndarray):
        """``run`` of the fixed contiguous ``x`` into the fixed ``out``: a partial of the compiled
        kernel (native_chain calls it without Python), or None."""
        if not all(a.dtype == np.float32 and a.flags.c_contiguous and a.flags.aligned for a in (x, out)):
            return None
        head = _head(out, int(self.geometry[C]))
        aligned = self.weights.ctypes.data % 64 == self.bias.ctypes.data % 64 == 0  # (a cached plan's may not be)
        w, b, shift = self._shifted(head) if head or not aligned else (self.weights, self.bias, 0)
        return functools.partial(KERNELS[self.kernel], x.reshape(-1), w, b, self._geometry(x, head, shift),
                                 self.clamp, out.reshape(-1))


def supports(ctx: OperationContext) -> str | None:
    p: ConvParams = ctx.params
    if p.nchw:
        return "NCHW layout (the float kernel takes NHWC)"
    if p.multiplier != 1:
        return f"depth multiplier {p.multiplier} (the float kernel takes 1)"
    if p.rows.dilation != 1 or p.cols.dilation != 1:
        return f"dilation {p.rows.dilation}x{p.cols.dilation} (the float kernel takes 1)"
    if not (ctx.input(FILTER).is_constant and ctx.input(BIAS).is_constant):
        return "filter or bias is not a constant"
    return None


def plan(ctx: OperationContext) -> FloatDepthwise:
    p: ConvParams = ctx.params
    fh, fw, c = p.rows.filter, p.cols.filter, p.out_c
    row = -(-c // LANES) * LANES + LANES
    weights = _aligned(fh * fw * row)
    weights[:] = 0
    weights.reshape(fh * fw, row)[:, :c] = np.asarray(ctx.input(FILTER).value, np.float32).reshape(fh * fw, c)
    bias = _aligned(row)
    bias[:] = 0
    if ctx.input(BIAS).value.size:
        bias[:c] = ctx.input(BIAS).value
    x_shape = ctx.input(INPUT).shape
    geometry = np.array([0, x_shape[1], x_shape[2], c, p.rows.out, p.cols.out, p.rows.stride, p.cols.stride,
                         p.rows.pad_head, p.cols.pad_head, 0, 0, fh, fw, ACT_NONE], np.int64)
    unrolled = list(UNROLL)
    kernel = unrolled.index((fh, p.cols.stride)) if fh == fw and (fh, p.cols.stride) in UNROLL else len(unrolled)
    return FloatDepthwise(weights, bias, geometry, np.array(quant.activation_range_float(p.act), np.float32), kernel)


def execute(ctx: OperationContext, inputs: list) -> list:
    x = inputs[INPUT]
    return [ctx.data.run(x if x.flags.c_contiguous and x.flags.aligned else np.array(x, np.float32, order="C"))]


def bind(ctx: OperationContext, inputs: list, outputs: list):
    x = inputs[INPUT]
    return None if x is None else ctx.data.bound(x, outputs[0])


def plan_epilogue(ctx) -> FloatDepthwise | None:
    """hal.fusion's ``conv_epilogue`` of a depthwise layer and an activation (HARD_SWISH, a fused
    swish: MobileNetV3's and EfficientNet's), applied to the sums before each store; with a PAD
    before it, the pad's zero border is more of the layer's padding (read as the image's edges
    are: masked loads). Reads the members' plans and shapes only (a plan from the compilation
    cache has no parameters)."""
    members = list(ctx.members)
    pad = members.pop(0) if members[0].ctx.op_type in PADS else None
    d = members[0].ctx.data
    if not isinstance(d, FloatDepthwise) or len(members) > 2:
        return None
    geometry = d.geometry.copy()
    if len(members) == 2:
        act = activation_of(members[1])
        if act is None:
            return None
        geometry[ACT] = act
    if pad is not None:
        image = image_of(pad)
        if image is None:
            return None
        geometry[H], geometry[W], top, left = image
        geometry[PT] += top
        geometry[PL] += left
    return dataclasses.replace(d, geometry=geometry)


BACKEND.register_fusion("conv_epilogue", plan=plan_epilogue, execute=execute, bind=bind)
BACKEND.register(DW, plan=plan, execute=execute, types=(OperandType.TENSOR_FLOAT32,), supports=supports,
                 prepacked_inputs=(FILTER, BIAS), bind=bind)
