"""FULLY_CONNECTED: float32, uint8 and int8 (per-tensor weights).

The GEMM runs in float64 BLAS: for 8-bit operands every product and partial
sum is an integer far below 2^53, so the result equals TFLite's int32
accumulation, and the requantization after it reproduces
reference_ops::FullyConnected (uint8) / reference_integer_ops::FullyConnected
(int8) bit-exactly. Float accumulates in float64 too (within 1e-5 of TFLite's
float32 loop).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal import quant
from hal.operations._legacy import register
from hal.operations.common import F32, I32, QS8, QU8, QUANT8, fused_activation
from hal.registry import OperationContext
from hal.types import OperationType

#: NNAPI/TFLite tolerance between the bias scale and input_scale * weights_scale.
_BIAS_SCALE_RTOL = 1e-6


@dataclass
class FullyConnectedData:
    """What execute needs: shapes, prepacked constants and requantization parameters."""

    act: int
    batch: int
    input_size: int
    num_units: int
    weights_t: np.ndarray | None = None  # [input_size, num_units] float64, offset applied
    bias: np.ndarray | None = None  # [num_units] float64 (exact int32 values when quantized)
    input_offset: int = 0
    weights_offset: int = 0
    output_offset: int = 0
    output_multiplier: int = 0
    output_shift: int = 0
    act_min: int = 0
    act_max: int = 0


def _validate(ctx: OperationContext) -> None:
    ctx.expect_num_inputs(4)
    ctx.expect_num_outputs(1)
    ctx.expect_input_type(0, F32, QU8, QS8)
    t = ctx.input_type(0)
    ctx.expect_input_type(1, t)
    ctx.expect_input_type(2, F32 if t == F32 else I32)
    ctx.expect_output_type(0, t)
    fused_activation(ctx, 3)
    ctx.check(ctx.input(0).rank >= 2, f"input 0 must have rank >= 2, got {ctx.input(0).rank}")
    ctx.expect_input_rank(1, 2)
    ctx.expect_input_rank(2, 1)
    units, in_size = ctx.input_shape(1)
    (bias_len,) = ctx.input_shape(2)
    ctx.check(not units or not bias_len or units == bias_len,
              f"bias has {bias_len} elements but weights have {units} units")
    if t in QUANT8:
        x, w, b = ctx.input(0), ctx.input(1), ctx.input(2)
        product = float(np.float32(x.scale)) * float(np.float32(w.scale))
        ctx.check(abs(product - b.scale) <= _BIAS_SCALE_RTOL * min(product, b.scale),
                  f"bias scale {b.scale} must equal input scale * weights scale = {product}")


def _prepare(ctx: OperationContext) -> FullyConnectedData:
    x, w, b, out = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output(0)
    num_units, input_size = w.shape
    ctx.check(input_size > 0 and num_units > 0,
              f"weights shape {list(w.shape)} must be fully specified for this driver")
    count = int(np.prod(x.shape))
    ctx.check(count % input_size == 0,
              f"input 0 has {count} elements, not a multiple of input_size {input_size}")
    batch = count // input_size
    ctx.check(b.shape[0] in (0, num_units), f"bias has {b.shape[0]} elements but weights have "
                                            f"{num_units} units")
    ctx.set_output_shape(0, (batch, num_units))
    d = FullyConnectedData(act=fused_activation(ctx, 3), batch=batch, input_size=input_size,
                           num_units=num_units)
    if x.type in QUANT8:
        d.input_offset = -x.zero_point
        d.weights_offset = -w.zero_point
        d.output_offset = out.zero_point
        # GetQuantizedConvolutionMultipler: the scales' product and quotient in double.
        real = float(np.float32(x.scale)) * float(np.float32(w.scale)) / float(np.float32(out.scale))
        d.output_multiplier, d.output_shift = quant.quantize_multiplier(real)
        d.act_min, d.act_max = quant.activation_range_quantized(d.act, out.type, out.scale,
                                                                out.zero_point)
    if w.is_constant and ctx.packing:
        d.weights_t = _pack_weights(w.value, d.weights_offset)
    if b.is_constant:
        d.bias = b.value.astype(np.float64)
    return d


def _pack_weights(w: np.ndarray, offset: int) -> np.ndarray:
    return np.ascontiguousarray((w.astype(np.float64) + offset).T)


def _execute(ctx: OperationContext, inputs: list) -> list:
    d: FullyConnectedData = ctx.data
    x = inputs[0].reshape(d.batch, d.input_size)
    w_t = d.weights_t if d.weights_t is not None else _pack_weights(inputs[1], d.weights_offset)
    bias = d.bias if d.bias is not None else inputs[2].astype(np.float64)
    out_type = ctx.outputs[0].type
    if out_type == F32:
        acc = x.astype(np.float64) @ w_t + bias
        return [quant.apply_activation_float(acc.astype(np.float32), d.act)]
    acc = (x.astype(np.float64) + d.input_offset) @ w_t + bias
    acc = quant.multiply_by_quantized_multiplier(acc.astype(np.int64), d.output_multiplier,
                                                 d.output_shift) + d.output_offset
    return [quant.saturate_cast(acc, out_type, d.act_min, d.act_max)]


register(OperationType.FULLY_CONNECTED, validate=_validate, prepare=_prepare, execute=_execute,
         supported_types=(F32, QU8, QS8), prepacked_inputs=(1, 2))  # constant weights/bias: d.weights_t, d.bias
