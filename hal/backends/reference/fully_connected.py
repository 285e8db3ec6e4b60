"""FULLY_CONNECTED on numpy: float32, uint8 and int8 (per-tensor weights).

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
from hal.backends.reference import BACKEND
from hal.operations.common import F32, QUANT8
from hal.operations.fully_connected import BIAS, INPUT, WEIGHTS, FullyConnectedParams
from hal.registry import OperationContext
from hal.types import OperationType


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


def plan(ctx: OperationContext) -> FullyConnectedData:
    p: FullyConnectedParams = ctx.params
    x, w, b, out = ctx.input(INPUT), ctx.input(WEIGHTS), ctx.input(BIAS), ctx.output(0)
    d = FullyConnectedData(act=p.act, batch=p.batch, input_size=p.input_size, num_units=p.num_units)
    if x.type in QUANT8:
        d.input_offset = -x.zero_point
        d.weights_offset = -w.zero_point
        d.output_offset = out.zero_point
        # GetQuantizedConvolutionMultipler (TFLite's kernel_util.cc and AOSP's OperationsUtils.cpp):
        # the scales' product in float32, the quotient in double.
        real = float(np.float32(x.scale) * np.float32(w.scale)) / float(np.float32(out.scale))
        d.output_multiplier, d.output_shift = quant.quantize_multiplier(real)
        d.act_min, d.act_max = quant.activation_range_quantized(d.act, out.type, out.scale, out.zero_point)
    if w.is_constant and ctx.packing:
        d.weights_t = _pack_weights(w.value, d.weights_offset)
    if b.is_constant:
        d.bias = b.value.astype(np.float64)
    return d


def _pack_weights(w: np.ndarray, offset: int) -> np.ndarray:
    return np.ascontiguousarray((w.astype(np.float64) + offset).T)


def execute(ctx: OperationContext, inputs: list) -> list:
    d: FullyConnectedData = ctx.data
    x = inputs[INPUT].reshape(d.batch, d.input_size)
    w_t = d.weights_t if d.weights_t is not None else _pack_weights(inputs[WEIGHTS], d.weights_offset)
    bias = d.bias if d.bias is not None else inputs[BIAS].astype(np.float64)
    out_type = ctx.outputs[0].type
    if out_type == F32:
        acc = x.astype(np.float64) @ w_t + bias
        return [quant.apply_activation_float(acc.astype(np.float32), d.act)]
    acc = (x.astype(np.float64) + d.input_offset) @ w_t + bias
    acc = quant.multiply_by_quantized_multiplier(acc.astype(np.int64), d.output_multiplier,
                                                 d.output_shift) + d.output_offset
    return [quant.saturate_cast(acc, out_type, d.act_min, d.act_max)]


# Constant weights and bias are packed by plan (d.weights_t, d.bias): the cache stores only those.
BACKEND.register(OperationType.FULLY_CONNECTED, plan=plan, execute=execute, prepacked_inputs=(WEIGHTS, BIAS))
