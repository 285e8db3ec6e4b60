"""QUANTIZED_LSTM on numpy, bit-exact with TFLite's fully integer LSTM (lstm_eval's 8x8_16 step).

Each gate's int16 sum (Q3.12 when its intermediate scale is 2^-12) is built in steps, each
saturated to int16: ``MBQM(x·W_xᵀ + b_x)``, then ``+ MBQM(h·W_hᵀ + b_h)``, then the peephole
``+ MBQM(w_c ⊙ c)``; the effective biases fold in the zero points (``-zp · Σ_row W``) and, without
layer norm, the gate bias. With layer norm the sum is normalised in integers (``_layer_norm``)
and the bias added there. Then i, f, o = logistic and g = tanh of FixedPoint<int16, 3>
(``fixedpoint16``). The cell: ``c = sat16(RDivPOT(f·c_prev, 15) + RDivPOT(i·g, 30 + cell_shift))``
(i = 32767 − f with CIFG), clipped. The hidden state ``sat8(MBQM(o · tanh(c)) + hidden_zp)`` is
the output; with a projection it is ``sat8(MBQM(o · tanh(c)) − hidden_zp)`` and the output
``sat8(MBQM(hidden·W_pᵀ + b_p + hidden_zp · Σ_row W_p) + zp_out)``, clipped in raw int8 units.
The int32 sums are exact in float64 BLAS (|products| < 2^15, far fewer than 2^38 of them) and
wrap like C's int32 afterwards.
"""
from __future__ import annotations

import numpy as np

from hal import quant
from hal.backends.reference import BACKEND
from hal.backends.reference import fixedpoint16 as fp
from hal.backends.reference.lstm import check_runnable
from hal.backends.reference.unary import inv_sqrt_multiplier_exp
from hal.operations.quantized_lstm_int8 import (
    INPUT,
    OUTPUT_STATE_IN,
    QUANTIZED_LSTM,
    Gate,
    QuantizedLstmParams,
)
from hal.registry import OperationContext

INT8_MIN, INT8_MAX = -128, 127
GATE_INTEGER_BITS = 3


def plan(ctx: OperationContext) -> QuantizedLstmParams:
    return ctx.params


def _effective_bias(weights: np.ndarray, zero_point: int, bias: np.ndarray | None) -> np.ndarray:
    """PrecomputeZeroPointTimesWeightWithBias: bias (or 0) + zero_point · (row sums of the weights)."""
    out = np.zeros(weights.shape[0], np.int64) if bias is None else bias.astype(np.int64)
    if zero_point:
        out = quant.wrap_int32(out + zero_point * weights.astype(np.int64).sum(axis=1))
    return out


def _matmul_accumulate(x: np.ndarray, weights: np.ndarray, bias: np.ndarray, scale: tuple[int, int],
                       acc: np.ndarray, zero_point: int, lo: int, hi: int) -> np.ndarray:
    """MatrixBatchVectorMultiplyAccumulate (int8 × int8 + bias, rescaled, + zero point, added to
    ``acc`` and saturated to [lo, hi])."""
    dot = (x.astype(np.float64) @ weights.astype(np.float64).T).astype(np.int64)
    v = quant.multiply_by_quantized_multiplier(quant.wrap_int32(dot + bias), *scale)
    return np.clip(v + zero_point + acc, lo, hi)


def _layer_norm(g: np.ndarray, weights: np.ndarray, bias: np.ndarray, gate: Gate) -> np.ndarray:
    """TFLite's integer ApplyLayerNorm on int16 sums [batch, n]: the mean and variance in 2^10-scaled
    integers, 1/stddev by GetInvSqrtQuantizedMultiplierExp, then weights, bias and the layer norm
    scale (with 12 more bits: the result is Q3.12)."""
    n = g.shape[-1]
    s = g.sum(axis=-1, keepdims=True)
    sum_sq = (g * g).sum(axis=-1, keepdims=True)
    mean = quant.trunc_div(s * 1024, n)
    variance = sum_sq * ((1 << 20) // n) - mean * mean
    variance = quant.trunc_div(variance, 1 << 20)
    variance = np.where(variance < 1, gate.variance_guard, variance)
    inv, inv_shift = inv_sqrt_multiplier_exp(variance)
    rescaled = quant.multiply_by_quantized_multiplier(quant.wrap_int32(1024 * g - mean), inv, inv_shift)
    v3 = quant.wrap_int32(quant.wrap_int32(rescaled * weights.astype(np.int64)) + bias.astype(np.int64))
    v4 = quant.trunc_div(np.where(v3 > 0, v3 + 512, v3 - 512), 1024)
    a, b = gate.layer_norm_scale
    v5 = quant.multiply_by_quantized_multiplier(quant.wrap_int32(v4), a, b + 12)
    return np.clip(v5, fp.INT16_MIN, fp.INT16_MAX)


def _gate(p: QuantizedLstmParams, gate: Gate, k: int, inputs: list, x: np.ndarray, h: np.ndarray,
          c: np.ndarray, sigmoid: bool) -> np.ndarray:
    """CalculateLstmGateInteger8x8_16 for gate k (0 input, 1 forget, 2 cell, 3 output): Q0.15."""
    t = p.cell.tensors
    bias = inputs[t.biases[k]]
    w_x, w_h = inputs[t.input_weights[k]], inputs[t.recurrent_weights[k]]
    bias_x = _effective_bias(w_x, -p.input_zero_point, None if gate.layer_norm_scale else bias)
    bias_h = _effective_bias(w_h, -p.output_state_zero_point, None)
    acc = np.zeros((x.shape[0], p.cell.num_units), np.int64)
    acc = _matmul_accumulate(x, w_x, bias_x, gate.input_scale, acc, 0, fp.INT16_MIN, fp.INT16_MAX)
    acc = _matmul_accumulate(h, w_h, bias_h, gate.recurrent_scale, acc, 0, fp.INT16_MIN, fp.INT16_MAX)
    if gate.cell_scale is not None:
        peephole = inputs[t.peepholes[{0: 0, 1: 1, 3: 2}[k]]].astype(np.int64)
        prod = quant.multiply_by_quantized_multiplier(peephole * c, *gate.cell_scale)
        acc = np.clip(prod + acc, fp.INT16_MIN, fp.INT16_MAX)
    if gate.layer_norm_scale is not None:
        acc = _layer_norm(acc, inputs[t.layer_norms[k]], bias, gate)
    return fp.lookup("logistic" if sigmoid else "tanh", acc, GATE_INTEGER_BITS)


def lstm_step(p: QuantizedLstmParams, inputs: list, x: np.ndarray, h_prev: np.ndarray,
              c_prev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One step: (output int8 [batch, output_size], cell state int16 [batch, num_units])."""
    x, h_prev, c = (a.astype(np.int64) for a in (x, h_prev, c_prev))
    i_gate = None if p.gates[0] is None else _gate(p, p.gates[0], 0, inputs, x, h_prev, c, True)
    f_gate = _gate(p, p.gates[1], 1, inputs, x, h_prev, c, True)
    g_gate = _gate(p, p.gates[2], 2, inputs, x, h_prev, c, False)
    if i_gate is None:
        i_gate = fp.INT16_MAX - f_gate  # Sub1Vector
    c = fp.wrap16(quant.rounding_divide_by_pot(f_gate * c, 15))
    c = fp.saturating_add(c, fp.wrap16(quant.rounding_divide_by_pot(i_gate * g_gate, 30 + p.cell_shift)))
    if p.cell_clip > 0:
        c = np.clip(c, -p.cell_clip, p.cell_clip)
    o_gate = _gate(p, p.gates[3], 3, inputs, x, h_prev, c, True)

    tanh_c = fp.lookup("tanh", c, 15 + p.cell_shift)
    hidden = quant.multiply_by_quantized_multiplier(o_gate * tanh_c, *p.hidden_scale)
    # TFLite's sign conventions: the hidden state is the output with the zero point added; feeding
    # a projection, it is stored with the zero point subtracted and the projection's bias adds
    # zero_point · Σ_row W_p back. The two differ only where the int8 range saturates.
    zp = p.hidden_zero_point if p.projection_scale is None else -p.hidden_zero_point
    hidden = np.clip(hidden + zp, INT8_MIN, INT8_MAX)
    if p.projection_scale is not None:
        t = p.cell.tensors
        w_p = inputs[t.projection_weights]
        bias_p = _effective_bias(w_p, p.hidden_zero_point,
                                 inputs[t.projection_bias] if p.cell.use_projection_bias else None)
        out = _matmul_accumulate(hidden, w_p, bias_p, p.projection_scale, np.zeros((x.shape[0], w_p.shape[0]),
                                 np.int64), p.output_state_zero_point, INT8_MIN, INT8_MAX)
        if p.proj_clip > 0:
            out = np.clip(out, -p.proj_clip, p.proj_clip)
    else:
        out = hidden
    return out.astype(np.int8), c.astype(np.int16)


def execute(ctx: OperationContext, inputs: list) -> list:
    p: QuantizedLstmParams = ctx.data
    check_runnable(ctx, p)
    t = p.cell.tensors
    out, c = lstm_step(p, inputs, inputs[INPUT], inputs[OUTPUT_STATE_IN], inputs[t.cell_state_in])
    return [out, c, out.copy()]


BACKEND.register(QUANTIZED_LSTM, plan=plan, execute=execute)
