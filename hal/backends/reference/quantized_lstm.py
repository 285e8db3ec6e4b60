"""QUANTIZED_16BIT_LSTM on numpy, bit-exact with TFLite's LstmCell<4> (what AOSP runs).

Each gate is a fully connected layer over the input and the previous output, both uint8 with zero
point 128: ``bias + Σ (q − 128)(w − w_zero)`` in int32 (see ``_gate_inputs`` for which weight
column meets which activation), scaled to Q3.12 by
MultiplyByQuantizedMultiplier(4096 · bias_scale) and saturated to int16. Then, in int16
fixed point (``fixedpoint16``): i, f, o = logistic, g = tanh (of Q3.12);
``c = saturate(Rescale<4>(i·g) + f·c_prev)`` in Q4.11; ``h = o · tanh(Rescale<3>(c))`` in Q0.15,
stored as ``128 + clamp(RoundingDivideByPOT(h, 8), −128, 127)``.
The int32 sums are exact in float64 BLAS (|products| < 2^16, far fewer than 2^37 of them).
"""
from __future__ import annotations

import numpy as np

from hal import quant
from hal.backends.reference import BACKEND
from hal.backends.reference import fixedpoint16 as fp
from hal.operations.quantized_lstm import (
    BIASES,
    INPUT,
    PREV_CELL_STATE,
    PREV_OUTPUT,
    QUANTIZED_16BIT_LSTM,
    QuantizedLstmParams,
)
from hal.registry import OperationContext

STATE_INTEGER_BITS = 4
GATE_INTEGER_BITS = 3  # the fully connected output, Q3.12


def plan(ctx: OperationContext) -> QuantizedLstmParams:
    return ctx.params


def _gate_inputs(p: QuantizedLstmParams, inputs: list) -> list[np.ndarray]:
    """The four gates' Q3.12 pre-activations [batch, output_size], NNAPI's order (input, forget,
    cell, output).

    As AOSP (whose results the CTS vectors are), the row [input, prev_output] is multiplied by
    the weight columns [recurrent_to_gate, input_to_gate]: AOSP concatenates the activations
    input first and the weights recurrent first. When input_size != output_size this differs
    from ``input · W_xᵀ + prev_output · W_hᵀ``, and the CTS vectors follow AOSP."""
    row = np.concatenate([inputs[INPUT], inputs[PREV_OUTPUT]], axis=1).astype(np.float64) - 128.0
    zw = float(p.weights_zero_point)
    gates = []
    for g in range(4):
        weights = np.concatenate([inputs[5 + g], inputs[1 + g]], axis=1).astype(np.float64) - zw
        acc = (row @ weights.T).astype(np.int64) + inputs[BIASES[g]].astype(np.int64)
        acc = quant.multiply_by_quantized_multiplier(quant.wrap_int32(acc), p.accum_multiplier, p.accum_shift)
        gates.append(np.clip(acc, fp.INT16_MIN, fp.INT16_MAX))
    return gates


def execute(ctx: OperationContext, inputs: list) -> list:
    p: QuantizedLstmParams = ctx.data
    pre_i, pre_f, pre_g, pre_o = _gate_inputs(p, inputs)
    i = fp.lookup("logistic", pre_i, GATE_INTEGER_BITS)
    f = fp.lookup("logistic", pre_f, GATE_INTEGER_BITS)
    g = fp.lookup("tanh", pre_g, GATE_INTEGER_BITS)
    o = fp.lookup("logistic", pre_o, GATE_INTEGER_BITS)
    c_prev = inputs[PREV_CELL_STATE].astype(np.int64)
    c = fp.saturating_add(fp.rescale(fp.mul(i, g), 0, STATE_INTEGER_BITS), fp.mul(f, c_prev))
    h = fp.mul(o, fp.lookup("tanh", fp.rescale(c, STATE_INTEGER_BITS, GATE_INTEGER_BITS), GATE_INTEGER_BITS))
    out = 128 + np.clip(quant.rounding_divide_by_pot(h, 8), -128, 127)
    return [c.astype(np.int16), out.astype(np.uint8)]


BACKEND.register(QUANTIZED_16BIT_LSTM, plan=plan, execute=execute)
