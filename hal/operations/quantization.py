"""QUANTIZE, DEQUANTIZE and CAST (NNAPI 1.3 signatures).

QUANTIZE follows TFLite's reference AffineQuantize: ``round(x / float(scale)) + zp`` with
the division in float32 (a float16 input is widened to float32 first, exactly, as AOSP's
``_Float16 / float`` does) and std::round, then saturation. DEQUANTIZE is ``scale * (q - zp)``:
TFLite evaluates it in double and rounds once to float, AOSP in float; the product of a float32
scale and a 9-bit integer is exact in double, so both round the same real number once.
CAST converts values, never bit patterns, and ignores quantization parameters (NNAPI):
float -> int truncates toward zero like static_cast, float32 <-> float16 rounds to nearest
even; to TENSOR_QUANT8_ASYMM it saturates to [0, 255] first, as AOSP's reference CAST does.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal import quant
from hal.operations._legacy import register
from hal.operations.common import F16, F32, I32, QPC, QS8, QU8
from hal.registry import OperationContext
from hal.types import NUMPY_DTYPE, OperandType, OperationType

QS8_SYMM = OperandType.TENSOR_QUANT8_SYMM
Q16_ASYMM = OperandType.TENSOR_QUANT16_ASYMM
Q16_SYMM = OperandType.TENSOR_QUANT16_SYMM
BOOL8 = OperandType.TENSOR_BOOL8


def _validate_unary(ctx: OperationContext, in_types, out_types) -> None:
    ctx.expect_num_inputs(1)
    ctx.expect_num_outputs(1)
    ctx.expect_input_type(0, *in_types)
    ctx.expect_output_type(0, *out_types)


def _same_shape(ctx: OperationContext) -> None:
    ctx.set_output_shape(0, ctx.input_shape(0))


# ---- QUANTIZE ------------------------------------------------------------------------
@dataclass
class QuantizeData:
    scale: np.float32
    zero_point: int
    low: float  # clamp bounds of round(x / scale), i.e. the type's range minus the zero point
    high: float
    out_type: int


def _validate_quantize(ctx: OperationContext) -> None:
    _validate_unary(ctx, (F32, F16), (QU8, QS8))


def _prepare_quantize(ctx: OperationContext) -> QuantizeData:
    _same_shape(ctx)
    out = ctx.output(0)
    lo, hi = quant.quant_range(out.type)
    return QuantizeData(np.float32(out.scale), out.zero_point, float(lo - out.zero_point),
                        float(hi - out.zero_point), out.type)


def _execute_quantize(ctx: OperationContext, inputs: list) -> list:
    """Clamping before rounding is the same as after (the bounds are integers) and keeps
    infinities out of round_half_away. NaN becomes the zero point (TFLite's static_cast of NaN
    is undefined; Arm's conversion gives 0)."""
    d: QuantizeData = ctx.data
    x = inputs[0].astype(np.float32, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        v = x / d.scale  # float32 division, as TFLite
    v = np.clip(np.nan_to_num(v, nan=0.0, posinf=d.high, neginf=d.low), d.low, d.high)
    q = quant.round_half_away(v).astype(np.int32) + d.zero_point
    return [q.astype(NUMPY_DTYPE[d.out_type])]


# ---- DEQUANTIZE ----------------------------------------------------------------------
@dataclass
class DequantizeData:
    scale: np.ndarray  # float64 (exact copies of float32 scales), broadcastable against the input
    zero_point: np.ndarray
    out_dtype: np.dtype


def _validate_dequantize(ctx: OperationContext) -> None:
    _validate_unary(ctx, (QU8, QS8, QS8_SYMM, QPC), (F32, F16))
    ctx.expect_max_input_rank(0, 4)


def _prepare_dequantize(ctx: OperationContext) -> DequantizeData:
    _same_shape(ctx)
    x = ctx.input(0)
    if x.type == QPC:
        shape = [1] * x.rank
        shape[x.channel_dim] = -1
        scale = x.channel_scales.astype(np.float64).reshape(shape)
        zp = np.zeros(1, np.int32)
    else:
        scale = np.array(np.float64(np.float32(x.scale)))
        zp = np.array(x.zero_point, np.int32)
    return DequantizeData(scale, zp, NUMPY_DTYPE[ctx.output(0).type])


def _execute_dequantize(ctx: OperationContext, inputs: list) -> list:
    """float16 output: rounded to float32 first, then to half (AOSP's static_cast<_Float16> of
    a float product)."""
    d: DequantizeData = ctx.data
    v = (inputs[0].astype(np.int32) - d.zero_point) * d.scale  # exact in double, one rounding below
    with np.errstate(over="ignore"):  # beyond 65504 a half is inf, as IEEE
        return [v.astype(np.float32).astype(d.out_dtype, copy=False)]


# ---- CAST ------------------------------------------------------------------------------
#: Any of these to any of these (NNAPI 1.2).
_CONVERTIBLE = (F16, F32, I32, QU8)
#: NNAPI 1.3 adds these, cast only to their own type (a copy).
_IDENTITY_ONLY = (BOOL8, Q16_ASYMM, Q16_SYMM, QS8, QS8_SYMM)
CAST_TYPES = _CONVERTIBLE + _IDENTITY_ONLY


def _validate_cast(ctx: OperationContext) -> None:
    ctx.expect_num_inputs(1)
    ctx.expect_num_outputs(1)
    ctx.expect_input_type(0, *CAST_TYPES)
    t = ctx.input_type(0)
    if t in _CONVERTIBLE:
        ctx.expect_output_type(0, *_CONVERTIBLE)
    else:
        ctx.expect_output_type(0, t)


def _prepare_cast(ctx: OperationContext) -> np.dtype:
    _same_shape(ctx)
    return NUMPY_DTYPE[ctx.output(0).type]


def _execute_cast(ctx: OperationContext, inputs: list) -> list:
    """Out-of-range float -> int32 saturates and NaN gives 0 (static_cast is undefined there)."""
    x, dtype = inputs[0], ctx.data
    if x.dtype == dtype:
        return [x.copy()]
    if dtype == np.uint8:  # AOSP: a < 0 -> 0, a > 255 -> 255, else static_cast (truncation)
        return [np.trunc(np.clip(np.nan_to_num(x.astype(np.float64)), 0, 255)).astype(np.uint8)]
    if dtype == np.int32 and x.dtype.kind == "f":
        info = np.iinfo(np.int32)
        return [np.clip(np.trunc(np.nan_to_num(x.astype(np.float64))), info.min, info.max).astype(np.int32)]
    with np.errstate(over="ignore"):  # int32 / float32 beyond 65504 -> inf in float16, as IEEE
        return [x.astype(dtype)]


register(OperationType.QUANTIZE, validate=_validate_quantize, prepare=_prepare_quantize,
         execute=_execute_quantize, supported_types=(F32, F16))
register(OperationType.DEQUANTIZE, validate=_validate_dequantize, prepare=_prepare_dequantize,
         execute=_execute_dequantize, supported_types=(QU8, QS8, QS8_SYMM, QPC))
register(OperationType.CAST, validate=_validate_cast, prepare=_prepare_cast, execute=_execute_cast,
         supported_types=CAST_TYPES)
