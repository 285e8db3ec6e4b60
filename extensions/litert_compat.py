"""com.nnhal.litert: LiteRT reference-kernel arithmetic that no NNAPI operation has, as nnhal's own
extension. One operation:

FULLY_CONNECTED_DOUBLE_REQUANT (type 0): FULLY_CONNECTED on 8-bit tensors whose int32 accumulators
are requantized in double precision, as LiteRT's reference kernel does. LiteRT >= 1.3 (ai-edge-litert;
LiteRT commit 921360770, "Make the fully_connected ref kernel do requant in float") computes every
quantized FULLY_CONNECTED of its reference kernels (BUILTIN_REF: uint8, int8 with per-tensor or
per-channel weights) as

    acc[b][c] = sum_k (w[c][k] - w_zp) * (x[b][k] - x_zp) + bias[c]            (int32)
    scale[c]  = double(x_scale) * double(w_scale[c]) / double(y_scale)          (in this order)
    y[b][c]   = clamp(int32(round(double(acc[b][c]) * scale[c])) + y_zp, act_min, act_max)

with round() half away from zero, [act_min, act_max] CalculateActivationRangeQuantized's. NNAPI's
FULLY_CONNECTED (and CONV_2D, which nnhal uses for per-channel weights) requantizes in fixed point
instead: a 31-bit multiplier, SaturatingRoundingDoublingHighMul, then RoundingDivideByPOT. The two
roundings give another answer in about one output in a thousand, a different rounding rule, so no
choice of NNAPI scales can make the fixed-point form equal this one. tflite-runtime 2.14 and
LiteRT < 1.3 use the fixed-point form; the delegate picks the operation by the runtime it runs in
(delegate/mapping/fully_connected.py, delegate/mapping/host_runtime.py).

nnhal ships and registers it itself, as com.nnhal.tflite: extensions.tflite_compat.ensure_registered
(which extensions.plugins.load_plugins calls in the service) registers both, and the
FULLY_CONNECTED mapper this one alone in the client's process.

Signature, as NNAPI's FULLY_CONNECTED: 0 input (TENSOR_QUANT8_ASYMM or TENSOR_QUANT8_ASYMM_SIGNED,
rank >= 2, read as [batch, input_size] with batch = elements / input_size), 1 weights
[num_units, input_size] (the input's type with any zero point, or for a signed input
TENSOR_QUANT8_SYMM_PER_CHANNEL along dimension 0), 2 bias TENSOR_INT32 [num_units] (its scale is not
read: the kernel takes the input and weights scales), 3 fused activation (INT32, NNAPI's codes).
Output 0: the input's type, [batch, num_units], any scale and zero point.

A double outside int32's range converts to INT32_MIN (x86-64's cvttsd2si, what LiteRT's x86-64
wheels execute for the cast), to which the output zero point is added with int32 wrap-around before
the clamp. The accumulators come from float32 GEMMs as in the numba backend's FULLY_CONNECTED
(chunks of K whose sums are exact); the requantization is numpy's float64, which is IEEE double as
C's. Checked against LiteRT 2.3's BUILTIN_REF in tests/delegate/test_fully_connected_runtimes.py, and
against a loop over Python numbers in tests/ops/test_fully_connected_requantization.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from extensions.registry import Extension, ExtensionOperation, lookup, register
from hal import quant
from hal.operations import fully_connected as fc_spec
from hal.operations.common import I32, QPC, QS8, QU8, fused_activation
from hal.operations.fully_connected import ACTIVATION, BIAS, INPUT, WEIGHTS

NAME = "com.nnhal.litert"
FULLY_CONNECTED_DOUBLE_REQUANT = 0


#: Below this magnitude a rounded value plus any 8-bit zero point stays within int32.
_EDGE = float(quant.INT32_MAX - 255)


@dataclass
class Gemm:
    """The weights as float32 GEMM operands (what the numba backend's FULLY_CONNECTED does): inputs
    shifted into [-128, 127], weights minus their zero point, so a chunk of K products sums exactly
    in float32; the zero points' constant part is folded into ``offset``."""

    weights: np.ndarray  # [input_size, num_units] float32
    offset: np.ndarray  # [num_units] int64: (shift - input zero point) * column sums
    chunks: tuple[int, ...]  # split points of K (each chunk sums exactly)


@dataclass
class DoubleRequantData:
    """Prepare's result (plan data: a type of this module, which the compilation cache admits)."""

    batch: int
    input_size: int
    num_units: int
    shift: int  # subtracted from input values: 128 for uint8 (into [-128, 127]), 0 for int8
    input_zero_point: int
    weights_zero_point: int
    output_zero_point: int
    scales: np.ndarray  # [num_units] float64: each unit's effective scale, LiteRT's evaluation order
    act_min: int
    act_max: int
    out_type: int
    gemm: Gemm | None = None  # for constant weights


def validate(ctx) -> None:
    ctx.expect_num_inputs(4)
    ctx.expect_num_outputs(1)
    ctx.expect_input_type(INPUT, QU8, QS8)
    t = ctx.input_type(INPUT)
    ctx.expect_input_type(WEIGHTS, *((QS8, QPC) if t == QS8 else (QU8,)))
    ctx.expect_input_type(BIAS, I32)
    ctx.expect_output_type(0, t)
    fused_activation(ctx, ACTIVATION)
    ctx.expect_input_rank_between(INPUT, 2, None)
    ctx.expect_input_rank(WEIGHTS, 2)
    ctx.expect_input_rank(BIAS, 1)
    w = ctx.input(WEIGHTS)
    if w.type == QPC:
        ctx.check(w.channel_dim == 0, f"input {WEIGHTS}: per-channel weights must be quantized along dimension 0 "
                                      f"(one scale per unit), got channelDim {w.channel_dim}")


def prepare(ctx) -> DoubleRequantData:
    p = fc_spec.prepare(ctx)  # NNAPI FULLY_CONNECTED's shapes and output shape
    x, w, out = ctx.input(INPUT), ctx.input(WEIGHTS), ctx.output(0)
    if w.type == QPC:
        w_scales = np.asarray(w.channel_scales, np.float32)
        ctx.check(w_scales.size == p.num_units, f"weights have {w_scales.size} scales for {p.num_units} units")
        w_zero_point = 0
    else:
        w_scales = np.full(p.num_units, w.scale, np.float32)
        w_zero_point = w.zero_point
    # double(input_scale) * double(filter_scale) / double(output_scale), left to right
    scales = np.float64(np.float32(x.scale)) * w_scales.astype(np.float64) / np.float64(np.float32(out.scale))
    lo, hi = quant.activation_range_quantized(p.act, out.type, out.scale, out.zero_point)
    d = DoubleRequantData(p.batch, p.input_size, p.num_units, 128 if x.type == QU8 else 0, x.zero_point,
                          w_zero_point, out.zero_point, scales, lo, hi, int(out.type))
    if w.is_constant and ctx.packing:
        d.gemm = _gemm(d, ctx.constant(WEIGHTS))
    return d


def _gemm(d: DoubleRequantData, w: np.ndarray) -> Gemm:
    wq = w.astype(np.int64).T - d.weights_zero_point  # [K, N], |wq| <= 255
    max_product = 128 * max(1, int(np.abs(wq).max()) if wq.size else 1)
    return Gemm(np.ascontiguousarray(wq, np.float32), (d.shift - d.input_zero_point) * wq.sum(axis=0),
                quant.exact_float32_chunks(wq.shape[0], max_product))


def requantize(acc: np.ndarray, scales: np.ndarray, output_zero_point: int, lo: int, hi: int) -> np.ndarray:
    """int32(round(double(acc) * scale)) + output_zero_point, clamped to [lo, hi]: integer values
    (a float64 array, exact)."""
    r = quant.round_half_away(np.asarray(acc, np.float64) * scales)  # std::round
    if r.size and np.abs(r).max() >= _EDGE:  # near int32's limits: the cast's INT32_MIN and the add's wrap
        r = np.where((r >= quant.INT32_MIN) & (r <= quant.INT32_MAX), r, quant.INT32_MIN).astype(np.int64)
        return np.clip(quant.wrap_int32(r + output_zero_point), lo, hi).astype(np.float64)
    return np.clip(r + output_zero_point, lo, hi)


def execute(ctx, inputs: list) -> list:
    d: DoubleRequantData = ctx.data
    g = d.gemm if d.gemm is not None else _gemm(d, inputs[WEIGHTS])
    a = inputs[INPUT].reshape(d.batch, d.input_size).astype(np.float32)
    if d.shift:
        a -= d.shift
    products = quant.exact_float32_gemm(a, g.weights, g.chunks)
    bias = inputs[BIAS]
    acc = products.astype(np.int64) + g.offset + (bias.astype(np.int64) if bias.size else 0)
    y = requantize(acc, d.scales, d.output_zero_point, d.act_min, d.act_max)
    return [y.astype(np.uint8 if d.out_type == QU8 else np.int8)]


EXTENSION = Extension(
    name=NAME, version="1.0",
    operations=(ExtensionOperation(FULLY_CONNECTED_DOUBLE_REQUANT, "FULLY_CONNECTED_DOUBLE_REQUANT", validate,
                                   prepare, execute),),
    description="LiteRT reference arithmetic NNAPI lacks (FULLY_CONNECTED requantized in double)")


def ensure_registered() -> None:
    """Register the extension in this process unless it is. Its modules import hal's specs and
    hal.quant only: the delegate's process registers it without loading any backend's kernels."""
    if lookup(NAME) is None:
        register(EXTENSION)
