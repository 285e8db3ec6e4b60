"""QUANTIZE, DEQUANTIZE and CAST on numpy.

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
from hal.backends.reference import BACKEND
from hal.operations.common import QPC
from hal.operations.quantization import CAST, DEQUANTIZE, QUANTIZE, ConversionParams
from hal.registry import OperationContext
from hal.types import NUMPY_DTYPE


def _dtype(operand_type: int) -> np.dtype:
    """Plan data hold type codes (a dtype is not serialisable); int keys find the IntEnum keys."""
    return NUMPY_DTYPE[operand_type]


# ---- QUANTIZE ------------------------------------------------------------------------
@dataclass
class QuantizeData:
    scale: np.float32
    zero_point: int
    low: float  # clamp bounds of round(x / scale), i.e. the type's range minus the zero point
    high: float
    out_type: int


def plan_quantize(ctx: OperationContext) -> QuantizeData:
    out = ctx.output(0)
    lo, hi = quant.quant_range(out.type)
    return QuantizeData(np.float32(out.scale), out.zero_point, float(lo - out.zero_point),
                        float(hi - out.zero_point), out.type)


def execute_quantize(ctx: OperationContext, inputs: list) -> list:
    """Clamping before rounding is the same as after (the bounds are integers) and keeps
    infinities out of round_half_away. NaN becomes the zero point (TFLite's static_cast of NaN
    is undefined; Arm's conversion gives 0)."""
    d: QuantizeData = ctx.data
    x = inputs[0].astype(np.float32, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        v = x / d.scale  # float32 division, as TFLite
    v = np.clip(np.nan_to_num(v, nan=0.0, posinf=d.high, neginf=d.low), d.low, d.high)
    q = quant.round_half_away(v).astype(np.int32) + d.zero_point
    return [q.astype(_dtype(d.out_type))]


# ---- DEQUANTIZE ----------------------------------------------------------------------
@dataclass
class DequantizeData:
    scale: np.ndarray  # float64 (exact copies of float32 scales), broadcastable against the input
    zero_point: np.ndarray
    out_type: int


def plan_dequantize(ctx: OperationContext) -> DequantizeData:
    p: ConversionParams = ctx.params
    x = ctx.input(0)
    if x.type == QPC:
        shape = [1] * x.rank
        shape[x.channel_dim] = -1
        scale = x.channel_scales.astype(np.float64).reshape(shape)
        zp = np.zeros(1, np.int32)
    else:
        scale = np.array(np.float64(np.float32(x.scale)))
        zp = np.array(x.zero_point, np.int32)
    return DequantizeData(scale, zp, p.out_type)


def execute_dequantize(ctx: OperationContext, inputs: list) -> list:
    """float16 output: rounded to float32 first, then to half (AOSP's static_cast<_Float16> of
    a float product)."""
    d: DequantizeData = ctx.data
    v = (inputs[0].astype(np.int32) - d.zero_point) * d.scale  # exact in double, one rounding below
    with np.errstate(over="ignore"):  # beyond 65504 a half is inf, as IEEE
        return [v.astype(np.float32).astype(_dtype(d.out_type), copy=False)]


# ---- CAST ------------------------------------------------------------------------------
@dataclass
class CastData:
    out_type: int


def plan_cast(ctx: OperationContext) -> CastData:
    p: ConversionParams = ctx.params
    return CastData(p.out_type)


def execute_cast(ctx: OperationContext, inputs: list) -> list:
    """Out-of-range float -> int32 saturates and NaN gives 0 (static_cast is undefined there)."""
    x, dtype = inputs[0], _dtype(ctx.data.out_type)
    if x.dtype == dtype:
        return [x.copy()]
    if dtype == np.uint8:  # AOSP: a < 0 -> 0, a > 255 -> 255, else static_cast (truncation)
        return [np.trunc(np.clip(np.nan_to_num(x.astype(np.float64)), 0, 255)).astype(np.uint8)]
    if dtype == np.int32 and x.dtype.kind == "f":
        info = np.iinfo(np.int32)
        return [np.clip(np.trunc(np.nan_to_num(x.astype(np.float64))), info.min, info.max).astype(np.int32)]
    with np.errstate(over="ignore"):  # int32 / float32 beyond 65504 -> inf in float16, as IEEE
        return [x.astype(dtype)]


BACKEND.register(QUANTIZE, plan=plan_quantize, execute=execute_quantize)
BACKEND.register(DEQUANTIZE, plan=plan_dequantize, execute=execute_dequantize)
BACKEND.register(CAST, plan=plan_cast, execute=execute_cast)
