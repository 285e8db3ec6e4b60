"""QUANTIZED_16BIT_LSTM (NNAPI 1.2): one LSTM step (no CIFG, peephole, projection or clipping) in
TFLite's fixed-point arithmetic: 8-bit activations and weights, a 16-bit cell state.

Inputs (15):
 0 input [num_batches, input_size], TENSOR_QUANT8_ASYMM, scale 1/128, zero point 128
 1-4 input_to_{input,forget,cell,output}_weights [output_size, input_size], TENSOR_QUANT8_ASYMM
 5-8 recurrent_to_{input,forget,cell,output}_weights [output_size, output_size], same type; all
     eight weights share one scale and zero point
 9-12 {input,forget,cell,output}_gate_bias [output_size], TENSOR_INT32, scale = weights scale / 128,
     zero point 0
 13 prev_cell_state [num_batches, output_size], TENSOR_QUANT16_SYMM, scale 2^-11 (4 integer bits),
     zero point 0
 14 prev_output [num_batches, output_size], TENSOR_QUANT8_ASYMM, scale 1/128, zero point 128
Outputs: 0 cell_state_out (as input 13), 1 output (as input 14).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal.operations.common import I32, QU8
from hal.quant import quantize_multiplier
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperandType, OperationType

QUANTIZED_16BIT_LSTM = OperationType.QUANTIZED_16BIT_LSTM
Q16 = OperandType.TENSOR_QUANT16_SYMM

INPUT = 0
INPUT_TO_INPUT_WEIGHTS, INPUT_TO_FORGET_WEIGHTS, INPUT_TO_CELL_WEIGHTS, INPUT_TO_OUTPUT_WEIGHTS = 1, 2, 3, 4
RECURRENT_TO_INPUT_WEIGHTS, RECURRENT_TO_FORGET_WEIGHTS = 5, 6
RECURRENT_TO_CELL_WEIGHTS, RECURRENT_TO_OUTPUT_WEIGHTS = 7, 8
INPUT_GATE_BIAS, FORGET_GATE_BIAS, CELL_GATE_BIAS, OUTPUT_GATE_BIAS = 9, 10, 11, 12
PREV_CELL_STATE, PREV_OUTPUT = 13, 14
CELL_STATE_OUT, OUTPUT = 0, 1

WEIGHTS = tuple(range(1, 9))
BIASES = tuple(range(9, 13))
#: The fixed quantizations: activations in [-1, 127/128], the cell state in [-16, 16).
ACTIVATION_SCALE, ACTIVATION_ZERO_POINT = 1.0 / 128.0, 128
CELL_STATE_SCALE = 2.0 ** -11


@dataclass(frozen=True)
class QuantizedLstmParams:
    batch: int
    input_size: int
    output_size: int
    weights_zero_point: int
    accum_multiplier: int  # 4096 * bias scale (the gates' fully connected output is Q3.12)
    accum_shift: int


def _same_scale(a: float, b: float) -> bool:
    return np.float32(a) == np.float32(b)


def validate(ctx: OperationContext) -> None:
    for i in (INPUT, *WEIGHTS, PREV_OUTPUT):
        ctx.expect_input_type(i, QU8)
    for i in BIASES:
        ctx.expect_input_type(i, I32)
    ctx.expect_input_type(PREV_CELL_STATE, Q16)
    ctx.expect_output_type(CELL_STATE_OUT, Q16)
    ctx.expect_output_type(OUTPUT, QU8)
    for i, rank in ((INPUT, 2), *((w, 2) for w in WEIGHTS), *((b, 1) for b in BIASES),
                    (PREV_CELL_STATE, 2), (PREV_OUTPUT, 2)):
        ctx.expect_input_rank(i, rank)
    for what, info in (("input 0", ctx.input(INPUT)), ("input 14", ctx.input(PREV_OUTPUT)),
                       ("output 1", ctx.output(OUTPUT))):
        ctx.check(_same_scale(info.scale, ACTIVATION_SCALE) and info.zero_point == ACTIVATION_ZERO_POINT,
                  f"{what} must be quantized with scale 1/128 and zero point 128, got scale {info.scale}, "
                  f"zero point {info.zero_point}")
    for what, info in (("input 13", ctx.input(PREV_CELL_STATE)), ("output 0", ctx.output(CELL_STATE_OUT))):
        ctx.check(_same_scale(info.scale, CELL_STATE_SCALE) and info.zero_point == 0,
                  f"{what} must be quantized with scale 2^-11 and zero point 0 (4 integer bits), got scale "
                  f"{info.scale}, zero point {info.zero_point}")
    w0 = ctx.input(INPUT_TO_INPUT_WEIGHTS)
    ctx.check(w0.scale > 0, f"weights scale must be > 0, got {w0.scale}")
    for i in WEIGHTS:
        w = ctx.input(i)
        ctx.check(_same_scale(w.scale, w0.scale) and w.zero_point == w0.zero_point,
                  f"input {i}: every weights tensor must share input 1's scale and zero point")
    for i in BIASES:
        b = ctx.input(i)
        ctx.check(_same_scale(b.scale, w0.scale / 128.0) and b.zero_point == 0,
                  f"input {i}: bias scale must be weights scale / 128 = {w0.scale / 128.0} with zero point 0, "
                  f"got scale {b.scale}, zero point {b.zero_point}")


def _check_shape(ctx: OperationContext, i: int, want: tuple[int, ...]) -> None:
    s = ctx.input_shape(i)
    ctx.check(len(s) == len(want) and all(a == b or a == 0 or b == 0 for a, b in zip(s, want)),
              f"input {i} has shape {list(s)}, expected {list(want)}")


def prepare(ctx: OperationContext) -> QuantizedLstmParams:
    x, prev = ctx.input_shape(INPUT), ctx.input_shape(PREV_OUTPUT)
    ctx.check(len(x) == 2 and len(prev) == 2, f"input and prev_output must be rank 2, got {list(x)}, {list(prev)}")
    batch, input_size = x
    output_size = prev[1]
    ctx.check(output_size > 0 and input_size > 0, "input_size and output_size must be known")
    _check_shape(ctx, PREV_OUTPUT, (batch, output_size))
    for i in WEIGHTS[:4]:
        _check_shape(ctx, i, (output_size, input_size))
    for i in WEIGHTS[4:]:
        _check_shape(ctx, i, (output_size, output_size))
    for i in BIASES:
        _check_shape(ctx, i, (output_size,))
    _check_shape(ctx, PREV_CELL_STATE, (batch, output_size))
    ctx.set_output_shape(CELL_STATE_OUT, (batch, output_size))
    ctx.set_output_shape(OUTPUT, (batch, output_size))
    bias_scale = float(np.float32(ctx.input(INPUT_GATE_BIAS).scale))
    multiplier, shift = quantize_multiplier(4096.0 * bias_scale)
    return QuantizedLstmParams(batch, input_size, output_size, int(ctx.input(INPUT_TO_INPUT_WEIGHTS).zero_point),
                               multiplier, shift)


register(QUANTIZED_16BIT_LSTM, validate=validate, prepare=prepare, input_types=(QU8,), num_inputs=(15,),
         num_outputs=(2,), min_feature_level=FeatureLevel.FL3)
