"""QUANTIZED_LSTM (NNAPI 1.3): one LSTM step entirely in integers — int8 activations and weights,
an int16 cell state, int16 gates (TFLite's fully integer "8x8_16" LSTM). Not to be confused with
QUANTIZED_16BIT_LSTM (``quantized_lstm.py``), the NNAPI 1.2 op with fixed scales and uint8.

Inputs (32):
 0 input [batch, input_size], TENSOR_QUANT8_ASYMM_SIGNED
 1-4 input_to_{input,forget,cell,output}_weights [num_units, input_size], TENSOR_QUANT8_SYMM
     (1 optional: CIFG)
 5-8 recurrent_to_{input,forget,cell,output}_weights [num_units, output_size], TENSOR_QUANT8_SYMM
     (5 optional: CIFG)
 9-11 cell_to_{input,forget,output}_weights [num_units], TENSOR_QUANT16_SYMM (optional: peephole)
 12-15 {input,forget,cell,output}_gate_bias [num_units], TENSOR_INT32 (12 omitted with CIFG)
 16 projection_weights [output_size, num_units], TENSOR_QUANT8_SYMM (optional)
 17 projection_bias [output_size], TENSOR_INT32 (optional, needs 16)
 18 output_state_in [batch, output_size], TENSOR_QUANT8_ASYMM_SIGNED
 19 cell_state_in [batch, num_units], TENSOR_QUANT16_SYMM; its scale must be 2^k with k <= -9
 20-23 {input,forget,cell,output}_layer_norm_weights [num_units], TENSOR_QUANT16_SYMM (optional;
     20 omitted with CIFG). With layer norm a gate's bias is added after the normalisation.
 24 cell_clip, 25 proj_clip (FLOAT32, >= 0; 0: no clipping)
 26-29 {input,forget,cell,output} intermediate scale (FLOAT32): the scale of each gate's int16
     matmul sum (before layer norm). Without layer norm TFLite's converter implies 2^-12 (Q3.12).
 30 hidden state zero point (INT32, an int8 value), 31 hidden state scale (FLOAT32): the
    quantization of o ⊙ tanh(c) before the projection.
Outputs: 0 output_state_out [batch, output_size] (as input 18), 1 cell_state_out
[batch, num_units] (as input 19), 2 output [batch, output_size] (as input 18).

The optional groups follow the float LSTM's all-or-none rules (``lstm.check_cell``). The
arithmetic (``hal/backends/reference/quantized_lstm_int8.py``) is TFLite's; where AOSP's QLSTM.cpp
differs from it (gate biases dropped without layer norm, peepholes reading the output buffer, the
projection clip divided by the projection weights' scale, a variance guard of min(1, ·)), the
TFLite arithmetic is what this driver does: it is what the models were quantized for.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hal.operations.common import FLOAT32, I32, INT32, QS8, param
from hal.operations.lstm import CellConfig, CellTensors, check_cell, check_cell_ranks
from hal.quant import quantize_multiplier
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperandType, OperationType

QUANTIZED_LSTM = OperationType.QUANTIZED_LSTM
QS8_SYMM = OperandType.TENSOR_QUANT8_SYMM
Q16 = OperandType.TENSOR_QUANT16_SYMM

INPUT = 0
INPUT_TO_INPUT_WEIGHTS, RECURRENT_TO_INPUT_WEIGHTS = 1, 5
CELL_TO_INPUT_WEIGHTS, CELL_TO_FORGET_WEIGHTS, CELL_TO_OUTPUT_WEIGHTS = 9, 10, 11
INPUT_GATE_BIAS = 12
PROJECTION_WEIGHTS, PROJECTION_BIAS = 16, 17
OUTPUT_STATE_IN, CELL_STATE_IN = 18, 19
INPUT_LAYER_NORM_WEIGHTS, OUTPUT_LAYER_NORM_WEIGHTS = 20, 23
CELL_CLIP, PROJ_CLIP = 24, 25
INTERMEDIATE_SCALES = (26, 27, 28, 29)  # input, forget, cell, output gate
HIDDEN_STATE_ZERO_POINT, HIDDEN_STATE_SCALE = 30, 31
OUTPUT_STATE_OUT, CELL_STATE_OUT, OUTPUT = 0, 1, 2

#: The cell tensors' positions (the float LSTM's layout, layer norm weights right after the state).
QLSTM_CELL = CellTensors(*range(1, 20), *range(20, 24))

#: NNAPI's operand type of every input (AOSP's QLSTM validate).
INPUT_TYPES = ((QS8,) + (QS8_SYMM,) * 8 + (Q16,) * 3 + (I32,) * 4 + (QS8_SYMM, I32, QS8, Q16) + (Q16,) * 4
               + (FLOAT32,) * 6 + (INT32, FLOAT32))
OUTPUT_TYPES = (QS8, Q16, QS8)

OPTIONAL = (INPUT_TO_INPUT_WEIGHTS, RECURRENT_TO_INPUT_WEIGHTS, CELL_TO_INPUT_WEIGHTS, CELL_TO_FORGET_WEIGHTS,
            CELL_TO_OUTPUT_WEIGHTS, INPUT_GATE_BIAS, PROJECTION_WEIGHTS, PROJECTION_BIAS, 20, 21, 22, 23)

f32 = np.float32


@dataclass(frozen=True)
class Gate:
    """One gate's integer parameters: (multiplier, shift) pairs of its input, recurrent and
    peephole products into the gate's int16 sum, and of its layer normalisation."""

    input_scale: tuple[int, int]
    recurrent_scale: tuple[int, int]
    cell_scale: tuple[int, int] | None  # None: no peephole into this gate
    layer_norm_scale: tuple[int, int] | None  # None: no layer norm
    variance_guard: int  # the variance used when the computed one is < 1


@dataclass(frozen=True)
class QuantizedLstmParams:
    cell: CellConfig
    batch: int
    gates: tuple[Gate | None, ...]  # input, forget, cell, output; input is None with CIFG
    input_zero_point: int
    output_state_zero_point: int
    cell_shift: int  # log2 of the cell state scale (<= -9)
    hidden_scale: tuple[int, int]
    hidden_zero_point: int
    projection_scale: tuple[int, int] | None
    cell_clip: int  # quantized, 0: none
    proj_clip: int  # quantized, 0: none

    @property
    def cells(self) -> tuple[CellConfig, ...]:
        return (self.cell,)


def checked_log2(x: float) -> int | None:
    """TFLite's CheckedLog2: the exponent when x is (within 1e-3 in log2) a power of two."""
    if not x > 0 or not math.isfinite(x):
        return None
    v = f32(math.log(f32(x))) * f32(1.0 / math.log(2.0))
    r = f32(math.floor(v + 0.5) if v >= 0 else -math.floor(-v + 0.5))
    return int(r) if abs(float(v - r)) < 1e-3 else None


def validate(ctx: OperationContext) -> None:
    for i, t in enumerate(INPUT_TYPES):
        if ctx.has_input(i):
            ctx.expect_input_type(i, t)
    for o, t in enumerate(OUTPUT_TYPES):
        ctx.expect_output_type(o, t)
    ctx.expect_input_rank(INPUT, 2)
    check_cell_ranks(ctx, QLSTM_CELL)
    for i in (CELL_CLIP, PROJ_CLIP, *INTERMEDIATE_SCALES, HIDDEN_STATE_SCALE):
        v = param(ctx, i, FLOAT32)
        ctx.check(v is None or (math.isfinite(v) and v >= 0), f"input {i} must be finite and >= 0, got {v}")
    zp = param(ctx, HIDDEN_STATE_ZERO_POINT, INT32)
    ctx.check(zp is None or -128 <= zp <= 127, f"hidden state zero point must be in [-128, 127], got {zp}")


def _multiplier(ctx: OperationContext, real: float, what: str) -> tuple[int, int]:
    ctx.check(math.isfinite(real) and real > 0, f"{what} scale must be finite and > 0, got {real}")
    return quantize_multiplier(float(real))


def prepare(ctx: OperationContext) -> QuantizedLstmParams:
    x = ctx.input_shape(INPUT)
    ctx.check(len(x) == 2, f"input must be rank 2 [batch, input_size], got {list(x)}")
    batch, input_size = x
    cell = check_cell(ctx, QLSTM_CELL, batch, input_size)
    ctx.set_output_shape(OUTPUT_STATE_OUT, (batch, cell.output_size))
    ctx.set_output_shape(CELL_STATE_OUT, (batch, cell.num_units))
    ctx.set_output_shape(OUTPUT, (batch, cell.output_size))

    scale = lambda i: f32(ctx.input(i).scale)  # noqa: E731
    cell_shift = checked_log2(float(scale(CELL_STATE_IN)))
    ctx.check(cell_shift is not None and cell_shift <= -9,
              f"cell state scale must be a power of two 2^k with k <= -9, got {ctx.input(CELL_STATE_IN).scale}")
    x_scale, h_scale = scale(INPUT), scale(OUTPUT_STATE_IN)
    t = cell.tensors
    gates: list[Gate | None] = []
    for g in range(4):
        if g == 0 and cell.use_cifg:
            gates.append(None)
            continue
        inter = f32(ctx.scalar(INTERMEDIATE_SCALES[g], FLOAT32))
        ctx.check(inter > 0, f"input {INTERMEDIATE_SCALES[g]}: intermediate scale must be > 0, got {inter}")
        # TFLite's float expressions: products of float scales in float; the peephole's in double.
        in_scale = f32(scale(t.input_weights[g]) * x_scale) / inter
        rec_scale = f32(scale(t.recurrent_weights[g]) * h_scale) / inter
        peep = {0: t.cell_to_input, 1: t.cell_to_forget, 3: t.cell_to_output}.get(g, -1)
        cell_scale = None
        if cell.use_peephole and peep >= 0 and not (g == 0 and cell.use_cifg):
            real = f32(2.0 ** cell_shift * float(scale(peep)) / float(inter))
            cell_scale = _multiplier(ctx, real, f"gate {g} peephole")
        ln_scale, guard = None, 1
        if cell.use_layer_norm:
            s = scale(t.layer_norms[g])
            ln_scale = _multiplier(ctx, s, f"gate {g} layer norm weights")
            guard = max(1, int(f32(10000) * s))
        gates.append(Gate(_multiplier(ctx, in_scale, f"gate {g} input"),
                          _multiplier(ctx, rec_scale, f"gate {g} recurrent"), cell_scale, ln_scale, guard))

    hidden_scale = f32(ctx.scalar(HIDDEN_STATE_SCALE, FLOAT32))
    ctx.check(hidden_scale > 0, f"hidden state scale must be > 0, got {hidden_scale}")
    hidden = _multiplier(ctx, float(f32(2.0 ** -15 / float(hidden_scale) * 2.0 ** -15)), "hidden state")
    projection = None
    if cell.use_projection:
        projection = _multiplier(ctx, float(f32(scale(PROJECTION_WEIGHTS) * hidden_scale) / h_scale), "projection")
    cell_clip = float(ctx.scalar(CELL_CLIP, FLOAT32))
    proj_clip = float(ctx.scalar(PROJ_CLIP, FLOAT32))
    ctx.check(cell_clip >= 0 and proj_clip >= 0, f"clips must be >= 0, got {cell_clip}, {proj_clip}")
    q_cell_clip = int(min(max(f32(cell_clip) / scale(CELL_STATE_IN), f32(-32768)), f32(32767))) if cell_clip > 0 else 0
    q_proj_clip = int(min(max(f32(proj_clip) / h_scale, f32(-128)), f32(127))) if proj_clip > 0 else 0
    return QuantizedLstmParams(cell, batch, tuple(gates), int(ctx.input(INPUT).zero_point),
                               int(ctx.input(OUTPUT_STATE_IN).zero_point), cell_shift, hidden,
                               int(ctx.scalar(HIDDEN_STATE_ZERO_POINT, INT32)), projection, q_cell_clip, q_proj_clip)


register(QUANTIZED_LSTM, validate=validate, prepare=prepare, input_types=(QS8,), num_inputs=(32,),
         num_outputs=(3,), optional_inputs=OPTIONAL, min_feature_level=FeatureLevel.FL4)
