"""ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM, PRELU on numpy.

Float paths are numpy ufuncs (bit-identical to TFLite's float kernels); the
quantized paths reproduce TFLite 2.14's reference integer kernels exactly
(add.cc / sub.cc / mul.cc Prepare, reference_ops and reference_integer_ops
Add, Mul and Prelu). Multipliers are derived from float32 scales in float or
double exactly where TFLite does, since one ulp can flip a rounding.
Quantized MAXIMUM/MINIMUM with differing quantizations follow AOSP's CPU driver
(each input requantized to the output's scale before comparing). int32 ADD, SUB and
MUL wrap around in two's complement (TFLite's and AOSP's int32_t arithmetic on
every platform they run on); int32 DIV is NNAPI's floor division (AOSP's CPU driver;
TFLite's DIV truncates instead, its FLOOR_DIV floors). float16 runs through the
float32 kernels (hal.backends.via_float32), as AOSP's CPU driver does.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal import quant
from hal.backends.reference import BACKEND
from hal.operations.common import QUANT8
from hal.operations.elementwise import ADD, DIV, MAXIMUM, MINIMUM, MUL, PRELU, SUB, BinaryParams
from hal.registry import OperationContext
from hal.types import FusedActivationFunc

f32 = np.float32


def _activation_range(ctx: OperationContext, act: int) -> tuple[int, int]:
    out = ctx.output(0)
    return quant.activation_range_quantized(act, out.type, out.scale, out.zero_point)


# ---- ADD / SUB ----------------------------------------------------------------

@dataclass
class AddSubData:
    """ADD/SUB quantized parameters (TFLite's OpData for add.cc/sub.cc)."""

    act: int
    input1_offset: int = 0
    input2_offset: int = 0
    output_offset: int = 0
    left_shift: int = 20
    input1_multiplier: int = 0
    input1_shift: int = 0
    input2_multiplier: int = 0
    input2_shift: int = 0
    output_multiplier: int = 0
    output_shift: int = 0
    act_min: int = 0
    act_max: int = 0


def plan_add_sub(ctx: OperationContext) -> AddSubData:
    p: BinaryParams = ctx.params
    a, b, out = ctx.input(0), ctx.input(1), ctx.output(0)
    data = AddSubData(act=p.act)
    if a.type in QUANT8:
        # add.cc / sub.cc PrepareGeneralSubOp (8-bit): `2 * max(s1, s2)` is a float product
        # promoted to double, the per-input ratios are float / double, as in TFLite.
        data.input1_offset = -a.zero_point
        data.input2_offset = -b.zero_point
        data.output_offset = out.zero_point
        twice_max = float(f32(2) * max(f32(a.scale), f32(b.scale)))
        data.input1_multiplier, data.input1_shift = quant.quantize_multiplier_smaller_than_one_exp(
            float(f32(a.scale)) / twice_max)
        data.input2_multiplier, data.input2_shift = quant.quantize_multiplier_smaller_than_one_exp(
            float(f32(b.scale)) / twice_max)
        data.output_multiplier, data.output_shift = quant.quantize_multiplier_smaller_than_one_exp(
            twice_max / float(f32(1 << data.left_shift) * f32(out.scale)))
        if ctx.op_type == SUB:
            # sub.cc runs the ADD kernel with input 2's multiplier negated (op_sign = -1). Not
            # the same as subtracting: SaturatingRoundingDoublingHighMul breaks ties asymmetrically.
            data.input2_multiplier = -data.input2_multiplier
        data.act_min, data.act_max = _activation_range(ctx, data.act)
    return data


def execute_add_sub(ctx: OperationContext, inputs: list) -> list:
    a, b = inputs[0], inputs[1]
    d: AddSubData = ctx.data
    if a.dtype == np.float32:
        op = np.add if ctx.op_type == ADD else np.subtract
        return [quant.apply_activation_float(op(a, b), d.act)]
    if a.dtype == np.int32:  # activation NONE (NNAPI); numpy's int32 arrays wrap around
        return [np.add(a, b) if ctx.op_type == ADD else np.subtract(a, b)]
    return [_add_quant8(a, b, d, ctx.outputs[0].type)]


def _add_quant8(a: np.ndarray, b: np.ndarray, d: AddSubData, out_type: int) -> np.ndarray:
    """reference_ops::AddElementwise / BroadcastAdd*Slow (uint8 and int8 are the same math)."""
    x = (a.astype(np.int64) + d.input1_offset) << d.left_shift
    y = (b.astype(np.int64) + d.input2_offset) << d.left_shift
    x = quant.multiply_by_quantized_multiplier_smaller_than_one_exp(x, d.input1_multiplier, d.input1_shift)
    y = quant.multiply_by_quantized_multiplier_smaller_than_one_exp(y, d.input2_multiplier, d.input2_shift)
    raw = quant.multiply_by_quantized_multiplier_smaller_than_one_exp(
        x + y, d.output_multiplier, d.output_shift) + d.output_offset
    return quant.saturate_cast(raw, out_type, d.act_min, d.act_max)


# ---- MUL ------------------------------------------------------------------------

@dataclass
class MulData:
    """mul.cc OpData: one output multiplier for s1 * s2 / s_out."""

    act: int
    input1_offset: int = 0
    input2_offset: int = 0
    output_offset: int = 0
    output_multiplier: int = 0
    output_shift: int = 0
    act_min: int = 0
    act_max: int = 0


def plan_mul(ctx: OperationContext) -> MulData:
    p: BinaryParams = ctx.params
    a, b, out = ctx.input(0), ctx.input(1), ctx.output(0)
    data = MulData(act=p.act)
    if a.type in QUANT8:
        data.input1_offset = -a.zero_point
        data.input2_offset = -b.zero_point
        data.output_offset = out.zero_point
        # mul.cc: `double real_multiplier = s1 * s2 / s_out` evaluated in float.
        real = float(f32(a.scale) * f32(b.scale) / f32(out.scale))
        data.output_multiplier, data.output_shift = quant.quantize_multiplier(real)
        data.act_min, data.act_max = _activation_range(ctx, data.act)
    return data


def execute_mul(ctx: OperationContext, inputs: list) -> list:
    a, b = inputs[0], inputs[1]
    d: MulData = ctx.data
    if a.dtype == np.float32:
        return [quant.apply_activation_float(np.multiply(a, b), d.act)]
    if a.dtype == np.int32:
        return [np.multiply(a, b)]
    prod = (a.astype(np.int64) + d.input1_offset) * (b.astype(np.int64) + d.input2_offset)
    raw = quant.multiply_by_quantized_multiplier(prod, d.output_multiplier, d.output_shift)
    return [quant.saturate_cast(raw + d.output_offset, ctx.outputs[0].type, d.act_min, d.act_max)]


# ---- DIV ----------------------------------------------------------------------------

def plan_div(ctx: OperationContext) -> FusedActivationFunc:
    p: BinaryParams = ctx.params
    return p.act


def execute_div(ctx: OperationContext, inputs: list) -> list:
    a, b = inputs[0], inputs[1]
    if a.dtype == np.int32:
        return [_floor_div_int32(a, b)]
    with np.errstate(divide="ignore", invalid="ignore"):  # x/0 is inf or nan, as in TFLite
        y = np.divide(a, b)
    return [quant.apply_activation_float(y, ctx.data)]


def _floor_div_int32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NNAPI's int32 DIV: floor division. x // 0 and INT32_MIN // -1 are undefined (AOSP traps);
    numpy gives 0 and INT32_MIN (wrapped), without a trap."""
    with np.errstate(divide="ignore", over="ignore"):
        return np.floor_divide(a, b)


# ---- MAXIMUM / MINIMUM -----------------------------------------------------------

@dataclass
class MinMaxData:
    """Whether quantized inputs must be requantized to the output's scale (NNAPI allows
    different scales; TFLite compares raw values and needs them equal)."""

    requantize: bool = False
    in_scales: tuple[float, float] = (0.0, 0.0)
    in_zero_points: tuple[int, int] = (0, 0)
    out_scale: float = 0.0
    out_zero_point: int = 0


def plan_min_max(ctx: OperationContext) -> MinMaxData:
    a, b, out = ctx.input(0), ctx.input(1), ctx.output(0)
    if a.type not in QUANT8:
        return MinMaxData()
    same = all((t.scale, t.zero_point) == (out.scale, out.zero_point) for t in (a, b))
    return MinMaxData(not same, (a.scale, b.scale), (a.zero_point, b.zero_point),
                      out.scale, out.zero_point)


def _requantize(x: np.ndarray, scale: float, zero_point: int, d: MinMaxData, out_type: int) -> np.ndarray:
    """AOSP requantize<T>: (q - zp) * scale in float, then / out_scale + out_zp in double,
    clamped and rounded half away from zero."""
    real = ((x.astype(np.int32) - zero_point).astype(np.float32) * f32(scale)).astype(np.float64)
    q = real / float(f32(d.out_scale)) + d.out_zero_point
    lo, hi = quant.quant_range(out_type)
    return quant.saturate_cast(quant.round_half_away(np.clip(q, lo, hi)), out_type)


def execute_min_max(ctx: OperationContext, inputs: list) -> list:
    a, b = inputs[0], inputs[1]
    d: MinMaxData = ctx.data
    if d.requantize:
        t = ctx.outputs[0].type
        a = _requantize(a, d.in_scales[0], d.in_zero_points[0], d, t)
        b = _requantize(b, d.in_scales[1], d.in_zero_points[1], d, t)
    # TFLite's `el1 > el2 ? el1 : el2` (and `<` for MINIMUM), NaN handling included.
    pick_a = np.greater(a, b) if ctx.op_type == MAXIMUM else np.less(a, b)
    return [np.where(pick_a, a, b)]


# ---- PRELU ----------------------------------------------------------------------

@dataclass
class PreluData:
    """activations.cc PreluPrepare: one multiplier for x >= 0, one for x * alpha."""

    input_offset: int = 0
    alpha_offset: int = 0
    output_offset: int = 0
    output_multiplier_1: int = 0
    output_shift_1: int = 0
    output_multiplier_2: int = 0
    output_shift_2: int = 0


def plan_prelu(ctx: OperationContext) -> PreluData:
    x, alpha, out = ctx.input(0), ctx.input(1), ctx.output(0)
    data = PreluData()
    if x.type in QUANT8:
        data.input_offset = -x.zero_point
        data.alpha_offset = -alpha.zero_point
        data.output_offset = out.zero_point
        # TFLite computes both ratios in float before widening to double.
        data.output_multiplier_1, data.output_shift_1 = quant.quantize_multiplier(
            float(f32(x.scale) / f32(out.scale)))
        data.output_multiplier_2, data.output_shift_2 = quant.quantize_multiplier(
            float(f32(x.scale) * f32(alpha.scale) / f32(out.scale)))
    return data


def execute_prelu(ctx: OperationContext, inputs: list) -> list:
    x, alpha = inputs[0], inputs[1]
    d: PreluData = ctx.data
    shape = ctx.output_shapes[0]
    if x.dtype == np.float32:
        x = np.broadcast_to(x, shape)
        with np.errstate(over="ignore", invalid="ignore"):  # inf * alpha, nan: IEEE results, no warning
            return [np.where(x >= 0, x, x * alpha)]
    xv = np.broadcast_to(x.astype(np.int64) + d.input_offset, shape)
    av = alpha.astype(np.int64) + d.alpha_offset
    pos = quant.multiply_by_quantized_multiplier(xv, d.output_multiplier_1, d.output_shift_1)
    neg = quant.multiply_by_quantized_multiplier(xv * av, d.output_multiplier_2, d.output_shift_2)
    raw = np.where(xv >= 0, pos, neg) + d.output_offset
    return [quant.saturate_cast(raw, ctx.outputs[0].type)]


BACKEND.register([ADD, SUB], plan=plan_add_sub, execute=execute_add_sub)
BACKEND.register(MUL, plan=plan_mul, execute=execute_mul)
BACKEND.register(DIV, plan=plan_div, execute=execute_div)
BACKEND.register([MAXIMUM, MINIMUM], plan=plan_min_max, execute=execute_min_max)
BACKEND.register(PRELU, plan=plan_prelu, execute=execute_prelu)
