"""Quantized CONV_2D, GROUPED_CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED (NHWC, constant
filter and bias). GROUPED_CONV_2D is one GEMM layer per group over its slice of the channels.

CONV_2D / FULLY_CONNECTED where the CPU has AVX-512 VNNI: exact int32 GEMM tiles with the
requantization fused (gemm.py, ``IntGemm``). Elsewhere: ``A @ W`` in float32 BLAS with A the
(im2col'd) input values, shifted to [-128, 127] for uint8, and W the filter minus its zero point.
Every product is an integer below 2^15 and a chunk of K terms sums exactly in float32 while
K·max|product| < 2^24; the constant part (zero points × filter sums) is folded into an int64 bias
at plan time, then one fused requantization pass. DEPTHWISE_CONV_2D: depthwise.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from hal import quant
from hal.backends.numba_kernels import (
    BACKEND,
    amx,
    amx_conv,
    depthwise,
    fc_float,
    gemm,
    lut,
    requant_rows,
    row_segments,
    vnni,
)
from hal.backends.numba_kernels.fixedpoint import clamp, multiply_by_quantized_multiplier, multiply_right_shift, ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.operations.common import F32 as FLOAT32
from hal.operations.common import QPC, QS8, QU8, QUANT8
from hal.operations.conv import BIAS, CONV, DW, FILTER, GROUPED, INPUT, ConvParams
from hal.operations.fully_connected import FullyConnectedParams
from hal.registry import OperationContext
from hal.types import OperationType

FC = OperationType.FULLY_CONNECTED


@dataclass
class GemmData:
    """A quantized GEMM-based layer (CONV_2D or FULLY_CONNECTED), ready to run."""

    weights: np.ndarray  # [K, out_c] float32: filter minus its zero point, rows in (fy, fx, c) order
    bias: np.ndarray  # [out_c] int64: bias + (shift0 - input zp) · column sums
    chunks: np.ndarray  # K split points: each chunk's sums are exact in float32
    shift0: int  # subtracted from input values: 128 for uint8 (into [-128, 127]), 0 for int8
    pad_value: float  # the input zero point, shifted: padded cells contribute nothing
    multipliers: np.ndarray  # [out_c] int64
    shifts: np.ndarray  # [out_c] int64
    output_zp: int
    act_min: int
    act_max: int
    # geometry (CONV_2D; FULLY_CONNECTED is a 1x1 convolution over [batch, 1, 1, K])
    filter_h: int = 1
    filter_w: int = 1
    stride_h: int = 1
    stride_w: int = 1
    dilation_h: int = 1
    dilation_w: int = 1
    pad_top: int = 0
    pad_left: int = 0
    out_h: int = 1
    out_w: int = 1
    #: every shift <= 0 and multiplier >= 0: the requantization's cheaper right-shift-only form
    right_only: bool = False
    #: where ``right_only``: requant_rows' per-channel arrays (its 16-lane requantization)
    lanes: tuple | None = None


def supports(ctx: OperationContext) -> str | None:
    p = ctx.params
    if getattr(p, "nchw", False):
        return "NCHW layout (the reference backend transposes around its kernel)"
    if not (ctx.input(FILTER).is_constant and ctx.input(BIAS).is_constant):
        return "filter or bias is not a constant"
    return None


def _requant(ctx: OperationContext, out_c: int) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    x, w, out = ctx.input(INPUT), ctx.input(FILTER), ctx.output(0)
    scales = w.channel_scales if w.type == QPC else [w.scale] * out_c
    # The scales' product in float32 where TFLite forms it with GetQuantizedConvolutionMultipler:
    # FULLY_CONNECTED (per-tensor weights, every type) and uint8 per-tensor convolutions.
    float_product = ctx.op_type == FC or (x.type == QU8 and w.type == QU8)
    mult, shift = quant.conv_multipliers(x.scale, scales, out.scale, float_product)
    act = ctx.params.act
    lo, hi = quant.activation_range_quantized(act, out.type, out.scale, out.zero_point)
    return mult, shift, out.zero_point, lo, hi


def _gemm_data(ctx: OperationContext, w2d: np.ndarray, out_c: int, bias: np.ndarray | None = None) -> GemmData:
    """``w2d``: [K, out_c] filter values (stored integers); ``bias``: its int32 bias (default: input 2)."""
    x, w = ctx.input(INPUT), ctx.input(FILTER)
    wzp = 0 if w.type == QPC else w.zero_point
    wq = w2d.astype(np.int64) - wzp
    shift0 = 128 if x.type == QU8 else 0
    colsum = wq.sum(axis=0)
    bias = (ctx.input(BIAS).value if bias is None else bias).astype(np.int64) + (shift0 - x.zero_point) * colsum
    max_product = 128 * max(1, int(np.abs(wq).max()) if wq.size else 1)
    chunks = np.array(quant.exact_float32_chunks(wq.shape[0], max_product), dtype=np.int64)
    mult, shift, ozp, lo, hi = _requant(ctx, out_c)
    return _with_lanes(GemmData(np.ascontiguousarray(wq.astype(np.float32)), bias, chunks, shift0,
                                float(x.zero_point - shift0), mult, shift, ozp, lo, hi))


def _with_lanes(d: GemmData) -> GemmData:
    """``d`` with ``right_only`` and ``lanes`` made from its bias, multipliers and shifts (a group
    of a GROUPED_CONV_2D: once it has its own part of them, ``plan_grouped``)."""
    d.right_only = _right_only(d.multipliers, d.shifts)
    own = np.shape(d.multipliers) == np.shape(d.shifts) == d.bias.shape
    d.lanes = requant_rows.lanes(d.bias, d.multipliers, d.shifts) if d.right_only and own else None
    return d


def _right_only(multipliers: np.ndarray, shifts: np.ndarray) -> bool:
    return bool((shifts <= 0).all() and (multipliers >= 0).all())


@dataclass
class IntGemm:
    """CONV_2D, GROUPED_CONV_2D or FULLY_CONNECTED on the VNNI GEMM: one plan per group, each over
    its slice of the input channels and writing its slice of the output channels."""

    groups: list  # gemm.GemmPlan per group
    in_c: int
    out_c: int
    #: rows read in place from the NHWC input: a 1x1 stride-1 unpadded convolution (or a
    #: FULLY_CONNECTED) whose per-group channel count is a multiple of 4
    direct: bool
    batch: int = 1  # FULLY_CONNECTED: rows of the [batch, input_size] input
    filter_h: int = 1
    filter_w: int = 1
    stride_h: int = 1
    stride_w: int = 1
    dilation_h: int = 1
    dilation_w: int = 1
    pad_top: int = 0
    pad_left: int = 0
    out_h: int = 1
    out_w: int = 1
    #: gemm.indirection's table (a single-group convolution whose input channels are a multiple of
    #: 4): each row's taps read in place, with ``zeros`` (the input zero point's bytes) for padding
    ind: np.ndarray | None = None
    zeros: np.ndarray | None = None
    #: row_segments' table and GEMM (a single-group convolution whose input channels are not a
    #: multiple of 4, dilation 1 along x): each filter row's run read in place
    rows: row_segments.RowSegments | None = None
    #: the same convolution on the AMX tiles, taps read in place from a padded copy (amx_conv),
    #: where the CPU has them: a single group, dilation 1 along x, output rows of 16 pixels or more
    amx: amx_conv.AmxConv | None = None


def _int_gemm(ctx: OperationContext, out_c: int, groups: int, geometry: dict | None, batch: int = 1) -> IntGemm:
    x, w = ctx.input(INPUT), ctx.input(FILTER)
    mult, shift, ozp, lo, hi = _requant(ctx, out_c)
    bias = ctx.input(BIAS).value
    wzp = 0 if w.type == QPC else w.zero_point
    oc_g = out_c // groups
    values = w.value.reshape(out_c, -1)  # [out_c, (fh, fw, in_c / groups)]: the im2col column order
    plans = [gemm.make_plan(values[part].T, wzp, bias[part], x.dtype, x.zero_point, mult[part], shift[part], ozp,
                            lo, hi)
             for part in (slice(g * oc_g, (g + 1) * oc_g) for g in range(groups))]
    in_c = values.shape[1] * groups if geometry is None else ctx.params.in_c
    in_g = in_c // groups
    if geometry is None:
        return IntGemm(plans, in_c, out_c, in_g % gemm.KSTEP == 0, batch=batch)
    p: ConvParams = ctx.params
    one = p.rows.filter == p.cols.filter == p.rows.stride == p.cols.stride == 1
    direct = one and p.rows.pad_head == p.cols.pad_head == 0 and (p.rows.out, p.cols.out) == tuple(x.shape[1:3]) \
        and in_g % gemm.KSTEP == 0
    d = IntGemm(plans, in_c, out_c, direct, filter_h=p.rows.filter, filter_w=p.cols.filter, **geometry)
    if direct or groups != 1 or len(x.shape) != 4 or not all(x.shape):
        return d
    d.amx = amx_conv.plan(values, wzp, bias, x.dtype, x.zero_point, mult, shift, ozp, lo, hi, d.filter_h, d.filter_w,
                          d.stride_h, d.stride_w, d.dilation_h, d.dilation_w, d.pad_top, d.pad_left, d.out_h, d.out_w)
    if in_c % gemm.KSTEP == 0:
        d.ind = gemm.indirection(*x.shape, d.filter_h, d.filter_w, d.stride_h, d.stride_w, d.dilation_h, d.dilation_w,
                                 d.pad_top, d.pad_left, d.out_h, d.out_w)
        d.zeros = np.full(in_c, plans[0].pad_byte, dtype=np.uint8)
    elif d.dilation_w == 1:  # one segment per filter row, read in place
        r = row_segments.plan(*x.shape, d.filter_h, d.filter_w, d.stride_h, d.stride_w, d.dilation_h, d.pad_top,
                              d.pad_left, d.out_h, d.out_w)
        if r is not None:
            r.plan = gemm.make_plan(row_segments.padded_filter(values, d.filter_h, d.filter_w, in_c), wzp, bias,
                                    x.dtype, x.zero_point, mult, shift, ozp, lo, hi, k_real=values.shape[1])
            d.rows = r
    return d


def plan_conv(ctx: OperationContext):
    p: ConvParams = ctx.params
    w = ctx.input(FILTER).value
    mult_fields = dict(stride_h=p.rows.stride, stride_w=p.cols.stride, dilation_h=p.rows.dilation,
                       dilation_w=p.cols.dilation, pad_top=p.rows.pad_head, pad_left=p.cols.pad_head,
                       out_h=p.rows.out, out_w=p.cols.out)
    if p.depthwise:
        return depthwise.plan(ctx, *_requant(ctx, p.out_c), mult_fields)
    if vnni.AVAILABLE:
        return _int_gemm(ctx, p.out_c, 1, mult_fields)
    # [out_c, fh, fw, in_c] -> [fh*fw*in_c, out_c], rows in (fy, fx, c) order like the im2col columns
    d = _gemm_data(ctx, w.reshape(p.out_c, -1).T, p.out_c)
    d.filter_h, d.filter_w = p.rows.filter, p.cols.filter
    for k, v in mult_fields.items():
        setattr(d, k, v)
    return d


@dataclass
class GroupedData:
    """GROUPED_CONV_2D: one GEMM layer per group, over its slice of the input channels."""

    groups: list  # GemmData per group (weights [fh*fw*in_c/groups, out_c/groups])
    in_c: int
    out_c: int


def plan_grouped(ctx: OperationContext) -> GroupedData | IntGemm:
    p: ConvParams = ctx.params
    if vnni.AVAILABLE:
        return _int_gemm(ctx, p.out_c, p.groups, dict(
            stride_h=p.rows.stride, stride_w=p.cols.stride, dilation_h=p.rows.dilation, dilation_w=p.cols.dilation,
            pad_top=p.rows.pad_head, pad_left=p.cols.pad_head, out_h=p.rows.out, out_w=p.cols.out))
    w = ctx.input(FILTER).value  # [out_c, fh, fw, in_c / groups]
    mult, shift, ozp, lo, hi = _requant(ctx, p.out_c)
    oc_g = p.out_c // p.groups
    groups = []
    for g in range(p.groups):
        part = slice(g * oc_g, (g + 1) * oc_g)
        d = _gemm_data(ctx, w[part].reshape(oc_g, -1).T, oc_g, ctx.input(BIAS).value[part])
        d.multipliers, d.shifts = mult[part].copy(), shift[part].copy()
        _with_lanes(d)
        d.filter_h, d.filter_w = p.rows.filter, p.cols.filter
        d.stride_h, d.stride_w, d.pad_top, d.pad_left = p.rows.stride, p.cols.stride, p.rows.pad_head, p.cols.pad_head
        d.out_h, d.out_w = p.rows.out, p.cols.out
        groups.append(d)
    return GroupedData(groups, p.in_c, p.out_c)


def plan_fully_connected(ctx: OperationContext) -> GemmData | IntGemm | fc_float.FloatFc:
    p: FullyConnectedParams = ctx.params
    if ctx.input(INPUT).type == FLOAT32:
        return fc_float.plan(ctx)
    if vnni.AVAILABLE:
        return _int_gemm(ctx, p.num_units, 1, None, batch=p.batch)
    w = ctx.input(FILTER).value  # [num_units, input_size]
    d = _gemm_data(ctx, w.reshape(p.num_units, p.input_size).T, p.num_units)
    d.out_h = p.batch  # execute reads ctx.data only (a cached plan has no params): [batch, input_size]
    return d


def supports_fully_connected(ctx: OperationContext) -> str | None:
    if ctx.input(INPUT).type == FLOAT32:
        return fc_float.supports(ctx)
    return None if ctx.input(FILTER).is_constant and ctx.input(BIAS).is_constant \
        else "weights or bias is not a constant"


# ---- native kernels ---------------------------------------------------------------------------

I64, F32 = numba.int64, numba.float32
Q8 = (np.int8, np.uint8)
_SIGS_IM2COL = [numba.void(ro(t, 4), F32, *[I64] * 11, rw(np.float32, 2)) for t in Q8]


@njit(_SIGS_IM2COL, cache=True, nogil=True)
def _im2col(x, pad_value, shift0, fh, fw, sh, sw, dh, dw, top, left, out_h, out_w, cols):
    """cols[(n, oy, ox), (fy, fx, c)] = x[n, iy, ix, c] - shift0, or pad_value outside the image."""
    n_b, h, w, c = x.shape
    row = 0
    for n in range(n_b):
        for oy in range(out_h):
            for ox in range(out_w):
                col = 0
                for fy in range(fh):
                    iy = oy * sh - top + fy * dh
                    for fx in range(fw):
                        ix = ox * sw - left + fx * dw
                        if 0 <= iy < h and 0 <= ix < w:
                            for ch in range(c):
                                cols[row, col + ch] = np.float32(np.int64(x[n, iy, ix, ch]) - shift0)
                        else:
                            for ch in range(c):
                                cols[row, col + ch] = pad_value
                        col += c
                row += 1


_SIGS_CAST = [numba.void(ro(t, 2), I64, rw(np.float32, 2)) for t in Q8]


@njit(_SIGS_CAST, cache=True, nogil=True)
def _to_float(x, shift0, out):
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = np.float32(np.int64(x[i, j]) - shift0)


_SIGS_REQ = [numba.void(ro(acc, 2), ro(np.int64, 1), ro(np.int64, 1), ro(np.int64, 1), I64, I64, I64, rw(t, 2))
             for acc in (np.float32, np.float64) for t in Q8]


@njit(_SIGS_REQ, cache=True, nogil=True)
def _requantize(acc, bias, mult, shift, out_zp, lo, hi, out):
    """out = clamp(MultiplyByQuantizedMultiplier(acc + bias) + zero point) per output channel."""
    for i in range(acc.shape[0]):
        for c in range(acc.shape[1]):
            v = np.int64(acc[i, c]) + bias[c]
            out[i, c] = clamp(multiply_by_quantized_multiplier(v, mult[c], shift[c]) + out_zp, lo, hi)


@njit(_SIGS_REQ, cache=True, nogil=True)
def _requantize_right(acc, bias, mult, shift, out_zp, lo, hi, out):
    """_requantize for layers whose every shift is <= 0 (a multiplier below 1, the usual case) and
    multipliers are non-negative int32: the int32 accumulator times the multiplier is a 32x32->64
    product the compiler vectorises, and no left shift or INT32_MIN saturation can occur."""
    for i in range(acc.shape[0]):
        for c in range(acc.shape[1]):
            v = np.int32(np.int64(acc[i, c]) + bias[c])  # TFLite's int32 accumulator (wraps like it)
            r = multiply_right_shift(np.int64(v), np.int64(np.int32(mult[c])), -shift[c]) + out_zp
            out[i, c] = clamp(r, lo, hi)


# ---- execute ----------------------------------------------------------------------------------

def _gemm(d: GemmData, a: np.ndarray) -> np.ndarray:
    return quant.exact_float32_gemm(a, d.weights, d.chunks)


def _finish(d: GemmData, acc: np.ndarray, dtype: np.dtype) -> np.ndarray:
    out = np.empty(acc.shape, dtype=dtype)
    if d.lanes is not None and acc.dtype == np.float32 and acc.flags.c_contiguous:
        requant_rows.requantize(acc.reshape(-1), acc.shape[0], acc.shape[1], *d.lanes, d.output_zp, d.act_min,
                                d.act_max, out.reshape(-1))
        return out
    (_requantize_right if d.right_only else _requantize)(acc, d.bias, d.multipliers, d.shifts, d.output_zp,
                                                       d.act_min, d.act_max, out)
    return out


def _run_int(d: IntGemm, x: np.ndarray, out: np.ndarray, table: np.ndarray = gemm._NO_TABLE) -> np.ndarray:
    """``out`` (int8/uint8, [rows, out_c] in memory) from the contiguous NHWC ``x``; ``table``: 256
    bytes looked up on each block of output rows as it is computed (or empty)."""
    rows = out.size // d.out_c
    ob = out.reshape(-1).view(np.uint8)
    count = len(d.groups)
    in_g, oc_g = d.in_c // count, d.out_c // count
    taps = d.filter_h * d.filter_w
    if d.amx is not None and amx.AVAILABLE:  # a cached plan may come from a machine with AMX
        amx_conv.run(d.amx, x, out, table)
        return out
    r = d.rows
    if r is not None and r.ind.size == rows * d.filter_h:  # planned for this batch size
        a = x.reshape(-1).view(np.uint8)
        buf = row_segments.edge_segments(r, a, x.shape[2], d.in_c, d.filter_w, r.plan.pad_byte)
        gemm.run_indirect(r.plan, a, r.ind, buf, d.filter_h, rows, ob, table, seg_valid=d.filter_w * d.in_c)
        return out
    if d.ind is not None and d.ind.size == rows * taps:  # planned for this batch size
        gemm.run_indirect(d.groups[0], x.reshape(-1).view(np.uint8), d.ind, d.zeros, taps, rows, ob, table)
        return out
    for g, p in enumerate(d.groups):
        if d.direct:
            gemm.run(p, x.reshape(-1).view(np.uint8), g * in_g, d.in_c, rows, ob, g * oc_g, d.out_c, table)
            continue
        xs = x if count == 1 else np.ascontiguousarray(x[..., g * in_g:(g + 1) * in_g])
        cols = gemm.gather(p, xs, d.filter_h, d.filter_w, d.stride_h, d.stride_w, d.dilation_h, d.dilation_w,
                           d.pad_top, d.pad_left, d.out_h, d.out_w)
        gemm.run(p, cols.reshape(-1), 0, cols.shape[1], rows, ob, g * oc_g, d.out_c, table)
    return out


def convolve(d, x: np.ndarray, table: np.ndarray = gemm._NO_TABLE) -> np.ndarray:
    """CONV_2D / GROUPED_CONV_2D / DEPTHWISE_CONV_2D of the contiguous NHWC ``x`` with plan ``d``,
    then ``table`` (256 bytes, or empty) looked up on the output: an 8-bit unary operation that
    follows it (hal.fusion's ``table_after``), while the output is still in cache where the
    kernels allow."""
    n = x.shape[0]
    if type(d) is IntGemm:
        out = np.empty((n, d.out_h, d.out_w, d.out_c), dtype=x.dtype)
        if d.direct and len(d.groups) == 1:  # the common 1x1 layer: straight to the GEMM
            gemm.run(d.groups[0], x.reshape(-1).view(np.uint8), 0, d.in_c, out.size // d.out_c,
                     out.reshape(-1).view(np.uint8), 0, d.out_c, table=table)
            return out
        return _run_int(d, x, out, table)
    if isinstance(d, depthwise.DepthwiseData):
        return depthwise.execute(d, x, table)
    if isinstance(d, GroupedData):
        in_g = d.in_c // len(d.groups)
        parts = [_gemm_conv(g, np.ascontiguousarray(x[..., k * in_g:(k + 1) * in_g]))
                 for k, g in enumerate(d.groups)]
        out = np.concatenate(parts, axis=3)
    else:
        out = _gemm_conv(d, x)
    if table.size:
        gemm.lookup_in_place(out.reshape(-1).view(np.uint8), 0, out.size, table)
    return out


def execute_conv(ctx: OperationContext, inputs: list) -> list:
    x = inputs[INPUT]
    return [convolve(ctx.data, x if x.flags.c_contiguous else np.ascontiguousarray(x))]


def bound_convolve(d, x: np.ndarray, out: np.ndarray, table: np.ndarray = gemm._NO_TABLE):
    """``convolve`` of the fixed contiguous ``x`` into the fixed ``out`` as a zero-argument runner
    (scratch allocated here), or None: the forms without VNNI plans run through ``execute``."""
    if x is None or not x.flags.c_contiguous:
        return None
    if isinstance(d, depthwise.DepthwiseData):
        return depthwise.bind(d, x, out, table)
    if type(d) is not IntGemm:
        return None
    rows, ob, a = out.size // d.out_c, out.reshape(-1).view(np.uint8), x.reshape(-1).view(np.uint8)
    count, taps, r = len(d.groups), d.filter_h * d.filter_w, d.rows
    in_g, oc_g = d.in_c // count, d.out_c // count
    if d.direct and count == 1:  # the order convolve and _run_int choose in
        return gemm.bound(d.groups[0], a, 0, d.in_c, rows, ob, 0, d.out_c, table)
    if d.amx is not None and amx.AVAILABLE:
        return amx_conv.bound(d.amx, x, out, table)
    if r is not None and r.ind.size == rows * d.filter_h:
        buf, fill = row_segments.bound_edge_segments(r, a, x.shape[2], d.in_c, d.filter_w, r.plan.pad_byte)
        return gemm.in_order(fill, gemm.bound_indirect(r.plan, a, r.ind, buf, d.filter_h, rows, ob, table,
                                                       seg_valid=d.filter_w * d.in_c))
    if d.ind is not None and d.ind.size == rows * taps:
        return gemm.bound_indirect(d.groups[0], a, d.ind, d.zeros, taps, rows, ob, table)
    if d.direct:
        return gemm.in_order(*[gemm.bound(p, a, g * in_g, d.in_c, rows, ob, g * oc_g, d.out_c, table)
                               for g, p in enumerate(d.groups)])
    if count != 1:
        return None
    p = d.groups[0]
    cols, gather = gemm.bound_gather(p, x, d.filter_h, d.filter_w, d.stride_h, d.stride_w, d.dilation_h, d.dilation_w,
                                     d.pad_top, d.pad_left, d.out_h, d.out_w)
    return gemm.in_order(gather, gemm.bound(p, cols.reshape(-1), 0, cols.shape[1], rows, ob, 0, d.out_c, table))


def bind_conv(ctx: OperationContext, inputs: list, outputs: list):
    return bound_convolve(ctx.data, inputs[INPUT], outputs[0])


def _gemm_conv(d: GemmData, x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    k = d.weights.shape[0]
    rows = n * d.out_h * d.out_w
    a = np.empty((rows, k), dtype=np.float32)
    if d.filter_h == d.filter_w == d.stride_h == d.stride_w == 1 and d.pad_top == d.pad_left == 0 \
            and (d.out_h, d.out_w) == x.shape[1:3]:
        _to_float(x.reshape(rows, k), d.shift0, a)
    else:
        _im2col(x, np.float32(d.pad_value), d.shift0, d.filter_h, d.filter_w, d.stride_h, d.stride_w, d.dilation_h,
                d.dilation_w, d.pad_top, d.pad_left, d.out_h, d.out_w, a)
    out = _finish(d, _gemm(d, a), x.dtype)
    return out.reshape(n, d.out_h, d.out_w, d.weights.shape[1])


def execute_fully_connected(ctx: OperationContext, inputs: list) -> list:
    d = ctx.data
    if isinstance(d, fc_float.FloatFc):
        return fc_float.execute(ctx, inputs)
    if isinstance(d, IntGemm):
        x = np.ascontiguousarray(inputs[INPUT]).reshape(d.batch, 1, 1, d.in_c)
        return [_run_int(d, x, np.empty((d.batch, d.out_c), dtype=x.dtype))]
    x = np.ascontiguousarray(inputs[INPUT]).reshape(d.out_h, d.weights.shape[0])
    a = np.empty(x.shape, dtype=np.float32)
    _to_float(x, d.shift0, a)
    return [_finish(d, _gemm(d, a), x.dtype)]


def bind_fully_connected(ctx: OperationContext, inputs: list, outputs: list):
    """``execute_fully_connected`` of the fixed input into the fixed ``outputs[0]``: a zero-argument
    runner (the VNNI GEMM as a 1x1 convolution of the rows, or the float kernel), else None."""
    d, x, out = ctx.data, inputs[INPUT], outputs[0]
    if x is None or not x.flags.c_contiguous:
        return None
    if isinstance(d, fc_float.FloatFc):
        return d.bind([x], [out]) if x.dtype == np.float32 else None
    if isinstance(d, IntGemm):
        return bound_convolve(d, x.reshape(d.batch, 1, 1, d.in_c), out.reshape(d.batch, 1, 1, d.out_c))
    return None


@dataclass
class TableAfter:
    """hal.fusion's ``table_after`` for a convolution: its plan, then a 256-byte table (the
    following unary operation's, or a fused swish's: lut.TableData, the reference's results)."""

    conv: object
    table: np.ndarray  # uint8 [256]: raw output byte -> raw byte


def plan_table_after(ctx) -> TableAfter | None:
    producer, consumer = ctx.members
    d, t = producer.ctx.data, consumer.ctx.data
    if producer.ctx.op_type not in (CONV, DW, GROUPED) or not isinstance(t, lut.TableData) \
            or t.table.size != 256 or t.table.dtype != producer.ctx.outputs[0].dtype \
            or tuple(t.shape) != tuple(producer.ctx.outputs[0].shape):
        return None
    return TableAfter(d, np.ascontiguousarray(t.table.view(np.uint8)))


def bind_table_after(ctx, inputs: list, outputs: list):
    return bound_convolve(ctx.data.conv, inputs[INPUT], outputs[0], ctx.data.table)


def execute_table_after(ctx, inputs: list) -> list:
    x = inputs[INPUT]
    return [convolve(ctx.data.conv, x if x.flags.c_contiguous else np.ascontiguousarray(x), ctx.data.table)]


BACKEND.register_fusion("table_after", plan=plan_table_after, execute=execute_table_after, bind=bind_table_after)
BACKEND.register([CONV, DW], plan=plan_conv, execute=execute_conv, types=QUANT8, supports=supports,
                 prepacked_inputs=(FILTER, BIAS), bind=bind_conv)
BACKEND.register(GROUPED, plan=plan_grouped, execute=execute_conv, types=QUANT8, supports=supports,
                 prepacked_inputs=(FILTER, BIAS), bind=bind_conv)
BACKEND.register(FC, plan=plan_fully_connected, execute=execute_fully_connected, types=(QU8, QS8, FLOAT32),
                 supports=supports_fully_connected, prepacked_inputs=(FILTER, BIAS), bind=bind_fully_connected)
BACKEND.register_fusion("fc_chain", plan=fc_float.plan_chain, execute=fc_float.execute)
