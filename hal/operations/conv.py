"""CONV_2D and DEPTHWISE_CONV_2D: float32, uint8 and int8 (per-tensor or per-channel filters).

Both NNAPI signatures (explicit and implicit padding), strides, dilation, depth
multiplier, fused activation, and the NCHW layout (transposed around the NHWC
kernel). Quantized products are summed exactly in float64 (every partial sum is
an integer far below 2^53), then requantized as TFLite 2.14's reference kernels
do (reference_ops::Conv / DepthwiseConv for uint8 per-tensor,
reference_integer_ops::ConvPerChannel / DepthwiseConvPerChannel otherwise):
``MultiplyByQuantizedMultiplier(acc + bias) + output_zp``, clamped. Padded cells
contribute nothing, like TFLite's "skip points outside the image".
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal import quant
from hal.operations._legacy import register
from hal.operations.common import (
    BOOL,
    F32,
    I32,
    INT32,
    QPC,
    QS8,
    QU8,
    QUANT8,
    conv_output_size,
    fused_activation,
    implicit_padding,
    padding_scheme,
)
from hal.registry import OperationContext
from hal.types import OperationType

CONV, DW = OperationType.CONV_2D, OperationType.DEPTHWISE_CONV_2D
f32 = np.float32

#: Tolerance between the bias scale and input_scale * filter_scale (TFLite and AOSP use 1e-6).
_BIAS_SCALE_RTOL = 1e-6


@dataclass
class ConvParams:
    """The scalar operands, whichever signature (explicit / implicit padding) was used."""

    stride_w: int
    stride_h: int
    act: int
    nchw: bool
    dilation_w: int = 1
    dilation_h: int = 1
    multiplier: int = 1  # DEPTHWISE_CONV_2D only
    pad_left: int = 0
    pad_right: int = 0
    pad_top: int = 0
    pad_bottom: int = 0
    scheme: int | None = None  # implicit padding scheme; None when padding is explicit


@dataclass
class ConvData:
    """What execute needs: geometry, packed constant filter/bias and requantization params."""

    depthwise: bool
    nchw: bool
    filter_h: int
    filter_w: int
    stride_h: int
    stride_w: int
    dilation_h: int
    dilation_w: int
    out_h: int
    out_w: int
    out_c: int
    multiplier: int
    pads: tuple  # np.pad widths for the NHWC input (tail only as far as windows reach)
    act: int
    filter: np.ndarray | None = None  # packed filter (see _pack_filter), None if not constant
    bias: np.ndarray | None = None  # [out_c] float32 (float) or float64 (exact int32 values)
    input_offset: int = 0  # -input zero point
    filter_offset: int = 0  # -filter zero point (0 for per-channel filters)
    output_offset: int = 0
    multipliers: np.ndarray | None = None  # [out_c] int64
    shifts: np.ndarray | None = None  # [out_c] int64
    act_min: int = 0
    act_max: int = 0


# ---- signature ------------------------------------------------------------------

def _layout(ctx: OperationContext) -> tuple[bool, int]:
    """(explicit padding?, index of the first scalar after the strides), as AOSP decides:
    explicit when there are enough inputs and the input at the stride_w / stride_h position
    (7 for CONV_2D, 8 for DEPTHWISE_CONV_2D) is an INT32 rather than the BOOL layout flag."""
    depthwise = ctx.op_type == DW
    probe = 8 if depthwise else 7
    n = ctx.num_inputs
    explicit_counts = (11, 12, 14) if depthwise else (10, 11, 13)
    implicit_counts = (8, 9, 11) if depthwise else (7, 8, 10)
    ctx.expect_num_inputs(*sorted(set(explicit_counts + implicit_counts)))
    probe_info = ctx.inputs[probe] if n > probe else None
    explicit = n >= explicit_counts[0] and probe_info is not None and probe_info.type == INT32
    if explicit and n not in explicit_counts:
        raise ctx.fail(f"explicit padding signature takes "
                       f"{' or '.join(map(str, explicit_counts))} inputs, got {n}")
    if not explicit and n not in implicit_counts:
        raise ctx.fail(f"implicit padding signature takes "
                       f"{' or '.join(map(str, implicit_counts))} inputs, got {n}")
    return explicit, (9 if explicit else 6)


def _params(ctx: OperationContext) -> ConvParams:
    """Read and check the scalar operands (NNAPI 1.3 input order)."""
    explicit, k = _layout(ctx)
    if explicit:  # 3-6: pad left, right, top, bottom; 7, 8: strides
        pads = [ctx.scalar(i, INT32) for i in (3, 4, 5, 6)]
        ctx.check(all(p >= 0 for p in pads), f"paddings must be >= 0, got {pads}")
        scheme = None
        sw, sh = ctx.scalar(7, INT32), ctx.scalar(8, INT32)
    else:  # 3: scheme; 4, 5: strides
        pads, scheme = [0, 0, 0, 0], padding_scheme(ctx, 3)
        sw, sh = ctx.scalar(4, INT32), ctx.scalar(5, INT32)
    ctx.check(sw >= 1 and sh >= 1, f"strides must be >= 1, got width {sw}, height {sh}")
    multiplier = 1
    if ctx.op_type == DW:
        multiplier = ctx.scalar(k, INT32)
        ctx.check(multiplier >= 1, f"input {k}: depth multiplier must be >= 1, got {multiplier}")
        k += 1
    act = fused_activation(ctx, k)
    nchw = bool(ctx.optional_scalar(k + 1, False, BOOL))
    dw = ctx.optional_scalar(k + 2, 1, INT32)
    dh = ctx.optional_scalar(k + 3, 1, INT32)
    ctx.check(dw >= 1 and dh >= 1, f"dilation factors must be >= 1, got width {dw}, height {dh}")
    return ConvParams(sw, sh, int(act), nchw, dw, dh, multiplier, *pads, scheme=scheme)


def _validate(ctx: OperationContext) -> None:
    depthwise = ctx.op_type == DW
    ctx.expect_num_outputs(1)
    p = _params(ctx)
    ctx.expect_input_type(0, F32, QU8, QS8)
    t = ctx.input_type(0)
    if t == F32:
        ctx.expect_input_type(1, F32)
        ctx.expect_input_type(2, F32)
    else:
        ctx.expect_input_type(1, t, QPC)
        ctx.expect_input_type(2, I32)
    ctx.expect_output_type(0, t)
    for i in (0, 1):
        ctx.expect_input_rank(i, 4)
    ctx.expect_input_rank(2, 1)
    x, w, b = ctx.input(0), ctx.input(1), ctx.input(2)
    if w.type == QPC:
        want = 3 if depthwise else 0
        ctx.check(w.channel_dim == want, f"input 1: per-channel quantization must be along "
                                         f"dimension {want}, got {w.channel_dim}")
    out_c = w.shape[3] if depthwise else w.shape[0]
    ctx.check(not out_c or not b.shape[0] or out_c == b.shape[0],
              f"bias has {b.shape[0]} elements but the filter has {out_c} output channels")
    in_c = x.shape[1] if p.nchw else x.shape[3]
    if depthwise:
        ctx.check(w.shape[0] in (0, 1), f"filter dimension 0 must be 1, got {w.shape[0]}")
        ctx.check(not in_c or not out_c or in_c * p.multiplier == out_c,
                  f"output channels {out_c} must equal input channels {in_c} * depth multiplier "
                  f"{p.multiplier}")
    else:
        ctx.check(not in_c or not w.shape[3] or in_c == w.shape[3],
                  f"filter has {w.shape[3]} input channels but the input has {in_c}")
    if t in QUANT8 and w.type != QPC:
        # NNAPI: bias scale == input scale * filter scale (per-channel filters: bias scale ignored).
        product = float(f32(x.scale)) * float(f32(w.scale))
        ctx.check(abs(product - b.scale) <= _BIAS_SCALE_RTOL * min(product, b.scale),
                  f"bias scale {b.scale} must equal input scale * filter scale = {product}")


# ---- prepare ----------------------------------------------------------------------

def _prepare(ctx: OperationContext) -> ConvData:
    depthwise = ctx.op_type == DW
    p = _params(ctx)
    x, w, b, out = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output(0)
    shape = x.shape
    n, c, h, wd = shape if p.nchw else (shape[0], shape[3], shape[1], shape[2])
    _, fh, fw, _ = w.shape
    out_c = w.shape[3] if depthwise else w.shape[0]
    ctx.check(h > 0 and wd > 0 and c > 0, f"input height, width and channels must be > 0, got "
                                         f"{h}x{wd}x{c}")
    ctx.check(fh > 0 and fw > 0 and out_c > 0,
              f"filter shape {list(w.shape)} must be fully specified for this driver")
    ctx.check(b.shape[0] in (0, out_c),
              f"bias has {b.shape[0]} elements but the filter has {out_c} output channels")
    if depthwise:
        ctx.check(c * p.multiplier == out_c, f"output channels {out_c} must equal input channels "
                                             f"{c} * depth multiplier {p.multiplier}")
    else:
        ctx.check(c == w.shape[3], f"filter has {w.shape[3]} input channels but the input has {c}")
    if p.scheme is not None:
        p.pad_top, p.pad_bottom = implicit_padding(h, p.stride_h, fh, p.dilation_h, p.scheme)
        p.pad_left, p.pad_right = implicit_padding(wd, p.stride_w, fw, p.dilation_w, p.scheme)
    eff_h, eff_w = (fh - 1) * p.dilation_h + 1, (fw - 1) * p.dilation_w + 1
    # AOSP: a padding as large as the (dilated) filter would make whole windows of padding.
    ctx.check(max(p.pad_top, p.pad_bottom) < eff_h and max(p.pad_left, p.pad_right) < eff_w,
              f"paddings (left {p.pad_left}, right {p.pad_right}, top {p.pad_top}, bottom "
              f"{p.pad_bottom}) must be smaller than the dilated filter {eff_h}x{eff_w}")
    out_h = conv_output_size(h, fh, p.stride_h, p.dilation_h, p.pad_top, p.pad_bottom)
    out_w = conv_output_size(wd, fw, p.stride_w, p.dilation_w, p.pad_left, p.pad_right)
    ctx.check(out_h >= 1 and out_w >= 1,
              f"dilated filter {eff_h}x{eff_w} does not fit the padded input {h}x{wd} "
              f"(output would be {out_h}x{out_w})")
    ctx.set_output_shape(0, (n, out_c, out_h, out_w) if p.nchw else (n, out_h, out_w, out_c))
    tail_h = max(0, (out_h - 1) * p.stride_h + eff_h - p.pad_top - h)
    tail_w = max(0, (out_w - 1) * p.stride_w + eff_w - p.pad_left - wd)
    d = ConvData(depthwise, p.nchw, fh, fw, p.stride_h, p.stride_w, p.dilation_h, p.dilation_w,
                 out_h, out_w, out_c, p.multiplier,
                 ((0, 0), (p.pad_top, tail_h), (p.pad_left, tail_w), (0, 0)), p.act)
    if x.type in QUANT8:
        d.input_offset = -x.zero_point
        d.filter_offset = 0 if w.type == QPC else -w.zero_point
        d.output_offset = out.zero_point
        d.multipliers, d.shifts = _requant_params(x, w, out, out_c)
        d.act_min, d.act_max = quant.activation_range_quantized(p.act, out.type, out.scale,
                                                                out.zero_point)
    if w.is_constant and ctx.packing:
        d.filter = _pack_filter(d, w.value)
    if b.is_constant:
        d.bias = _bias(b.value)
    return d


def _requant_params(x, w, out, out_c: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-output-channel (multiplier, shift), with TFLite's float/double evaluation order:
    uint8 per-tensor (GetQuantizedConvolutionMultipler) multiplies the scales in float, then
    divides in double; int8 and per-channel (PopulateConvolutionQuantizationParams) work in
    double from the float32 scales."""
    if w.type == QPC:
        filter_scales = [float(s) for s in np.asarray(w.channel_scales, dtype=f32)]
    else:
        filter_scales = [float(f32(w.scale))] * out_c
    if x.type == QU8 and w.type == QU8:
        reals = [float(f32(x.scale) * f32(w.scale)) / float(f32(out.scale))] * out_c
    else:
        reals = [float(f32(x.scale)) * s / float(f32(out.scale)) for s in filter_scales]
    pairs = [quant.quantize_multiplier(r) for r in reals]
    return (np.array([m for m, _ in pairs], dtype=np.int64),
            np.array([s for _, s in pairs], dtype=np.int64))


def _pack_filter(d: ConvData, w: np.ndarray) -> np.ndarray:
    """CONV_2D: [fh*fw*in_c, out_c] GEMM matrix (rows in (fy, fx, c) order, like the im2col
    columns); DEPTHWISE: [fh, fw, in_c, multiplier]. Quantized filters get their offset
    applied and become float64 (exact); float filters stay float32 for depthwise."""
    if d.filter_offset or w.dtype != np.float32:
        w = w.astype(np.float64) + d.filter_offset
    if d.depthwise:
        return np.ascontiguousarray(w.reshape(d.filter_h, d.filter_w, -1, d.multiplier))
    return np.ascontiguousarray(w.reshape(d.out_c, -1).T.astype(np.float64))


def _bias(b: np.ndarray) -> np.ndarray:
    return b if b.dtype == np.float32 else b.astype(np.float64)


# ---- execute ----------------------------------------------------------------------

def _taps(d: ConvData, xp: np.ndarray):
    """(fy, fx, strided view [N, out_h, out_w, C] of the padded input under that tap)."""
    span_h = (d.out_h - 1) * d.stride_h + 1
    span_w = (d.out_w - 1) * d.stride_w + 1
    for fy in range(d.filter_h):
        y0 = fy * d.dilation_h
        for fx in range(d.filter_w):
            x0 = fx * d.dilation_w
            yield fy, fx, xp[:, y0:y0 + span_h:d.stride_h, x0:x0 + span_w:d.stride_w, :]


def _conv(d: ConvData, xp: np.ndarray, w: np.ndarray) -> np.ndarray:
    """im2col (columns in (fy, fx, c) order) times the packed filter: one BLAS GEMM."""
    n, c = xp.shape[0], xp.shape[3]
    cols = np.empty((n, d.out_h, d.out_w, d.filter_h * d.filter_w, c), dtype=np.float64)
    for fy, fx, tap in _taps(d, xp):
        cols[:, :, :, fy * d.filter_w + fx, :] = tap
    return cols.reshape(-1, d.filter_h * d.filter_w * c) @ w


def _depthwise(d: ConvData, xp: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per-tap multiply-accumulate in TFLite's (fy, fx) order; float32 stays float32, so
    float sums round as in reference_ops::DepthwiseConv."""
    n, c = xp.shape[0], xp.shape[3]
    acc = np.zeros((n, d.out_h, d.out_w, c, d.multiplier), dtype=w.dtype)
    for fy, fx, tap in _taps(d, xp):
        acc += tap[..., None] * w[fy, fx]
    return acc.reshape(-1, d.out_c)


def _execute(ctx: OperationContext, inputs: list) -> list:
    d: ConvData = ctx.data
    x = inputs[0]
    if d.nchw:
        x = x.transpose(0, 2, 3, 1)
    w = d.filter if d.filter is not None else _pack_filter(d, inputs[1])
    bias = d.bias if d.bias is not None else _bias(inputs[2])
    out_type = ctx.outputs[0].type
    n = x.shape[0]
    if out_type == F32:
        xp = np.pad(x, d.pads)
        if d.depthwise:
            acc = _depthwise(d, xp, w.astype(np.float32, copy=False))
        else:
            acc = _conv(d, xp, w).astype(np.float32)
        out = quant.apply_activation_float(acc + bias, d.act)
    else:
        # Subtracting the zero point first makes padded cells exact zeros.
        xp = np.pad(x.astype(np.float64) + d.input_offset, d.pads)
        acc = _depthwise(d, xp, w) if d.depthwise else _conv(d, xp, w)
        acc = (acc + bias).astype(np.int64)
        acc = quant.multiply_by_quantized_multiplier(acc, d.multipliers, d.shifts)
        out = quant.saturate_cast(acc + d.output_offset, out_type, d.act_min, d.act_max)
    out = out.reshape(n, d.out_h, d.out_w, d.out_c)
    if d.nchw:
        out = out.transpose(0, 3, 1, 2)
    return [np.ascontiguousarray(out)]


register([CONV, DW], validate=_validate, prepare=_prepare, execute=_execute,
         supported_types=(F32, QU8, QS8), prepacked_inputs=(1, 2))  # constant filter/bias: d.filter, d.bias
