"""Activations (RELU, RELU1, RELU6, LOGISTIC, TANH, HARD_SWISH), element-wise math (ABS, EXP, LOG,
NEG, SIN, SQRT, RSQRT, FLOOR, ELU) and CAST between float32 and int32 as ONNX operators.

Each is its ONNX namesake; where onnxruntime's answer differs from the reference's:

* HARD_SWISH: ONNX HardSwish is x * clip(x / 6 + 1/2, 0, 1), the reference x * clip(x + 3, 0, 6) / 6;
  within CTS's tolerance everywhere (checked on a dense sweep), inf/-inf/NaN alike.
* LOGISTIC / TANH / EXP / LOG / SIN: onnxruntime's vectorised approximations, within CTS's tolerance.
* RSQRT: Reciprocal(Sqrt(x)), the reference's 1 / sqrt(x) exactly.
* ELU: Elu computes alpha * (exp(x) - 1), not expm1: the error is alpha * 6e-8 near 0, so alphas
  beyond 100 are declined. NNAPI's max(0, x) + min(0, ...) turns NaN into 0 (Elu keeps it) and
  differs from Elu for a negative alpha: those take the formula as written.
* CAST float32 -> int32: onnxruntime's Cast truncates like static_cast but gives INT32_MIN out of
  range and for NaN; the reference saturates and maps NaN to 0, so both are made explicit.

All but CAST compute in NCHW when their input exists there (``OnnxGraph.pointwise``).
"""
from __future__ import annotations

import numpy as np

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph, TensorProto
from hal.operations.activations import HARD_SWISH, LOGISTIC, RELU, RELU1, RELU6, TANH, ActivationParams
from hal.operations.common import F32, I32
from hal.operations.quantization import CAST, ConversionParams
from hal.operations.unary import ABS, ELU, EXP, FLOOR, LOG, NEG, RSQRT, SIN, SQRT, UnaryParams
from hal.registry import OperationContext

INPUT = 0

_ONNX = {LOGISTIC: "Sigmoid", TANH: "Tanh", HARD_SWISH: "HardSwish", ABS: "Abs", EXP: "Exp", LOG: "Log",
         NEG: "Neg", SIN: "Sin", SQRT: "Sqrt", FLOOR: "Floor"}

#: Largest |alpha| whose exp(x) - 1 stays within CTS's 1e-5 absolute tolerance of alpha * expm1(x).
ELU_MAX_ALPHA = 100.0

_INT32_MAX = np.int32(np.iinfo(np.int32).max)
_TWO_TO_31 = np.float32(2.0 ** 31)
#: The largest float32 below 2^31: Cast is exact (after truncation) for [-2^31, this].
_BELOW_TWO_TO_31 = np.nextafter(_TWO_TO_31, np.float32(0))


def lower_relu(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: ActivationParams = ctx.params
    return [g.pointwise(x[INPUT], lambda v: g.activation(v, p.clamp))]


def lower_simple(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    return [g.pointwise(x[INPUT], lambda v: g.node(_ONNX[ctx.op_type], [v]))]


def lower_rsqrt(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    return [g.pointwise(x[INPUT], lambda v: g.node("Reciprocal", [g.node("Sqrt", [v])]))]


# ---- ELU ------------------------------------------------------------------------------------------

def supports_elu(ctx: OperationContext) -> str | None:
    p: UnaryParams = ctx.params
    if not abs(p.alpha) <= ELU_MAX_ALPHA:
        return f"alpha {p.alpha}: exp(x) - 1 is not within tolerance of alpha * expm1(x)"
    return None


def lower_elu(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    return [g.pointwise(x[INPUT], lambda v: _elu(g, ctx, v))]


def _elu(g: OnnxGraph, ctx: OperationContext, data: str) -> str:
    p: UnaryParams = ctx.params
    zero = g.const(np.float32(0))
    if p.alpha >= 0:  # max(0, x) + min(0, alpha * expm1(x)) is Elu but for NaN, which gives 0
        return g.node("Where", [g.node("IsNaN", [data]), zero, g.node("Elu", [data], alpha=p.alpha)])
    # A negative alpha: both terms as written; a comparison with NaN is false, so NaN gives 0 + 0.
    positive = g.node("Where", [g.node("Greater", [data, zero]), data, zero])
    em1 = g.node("Sub", [g.node("Exp", [data]), g.const(np.float32(1))])
    scaled = g.node("Mul", [em1, g.const(np.float32(p.alpha))])
    negative = g.node("Where", [g.node("Less", [scaled, zero]), scaled, zero])
    return g.node("Add", [positive, negative])


# ---- CAST -----------------------------------------------------------------------------------------

def supports_cast(ctx: OperationContext) -> str | None:
    if ctx.output(0).type not in (F32, I32):
        return "only casts between TENSOR_FLOAT32 and TENSOR_INT32 are lowered"
    return None


def lower_cast(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: ConversionParams = ctx.params
    data = x[INPUT]
    if p.in_type == p.out_type:
        return [g.node("Identity", [data])]
    if p.out_type == F32:  # int32 -> float32: round to nearest even, as numpy
        return [g.node("Cast", [data], to=TensorProto.FLOAT)]
    # float32 -> int32: NaN -> 0, truncate, saturate (Cast is only defined inside int32's range).
    zero = g.const(np.float32(0))
    finite = g.node("Where", [g.node("IsNaN", [data]), zero, data])
    clipped = g.node("Clip", [finite, g.const(np.float32(-_TWO_TO_31)), g.const(_BELOW_TWO_TO_31)])
    y = g.node("Cast", [clipped], to=TensorProto.INT32)
    too_big = g.node("GreaterOrEqual", [finite, g.const(_TWO_TO_31)])
    return [g.node("Where", [too_big, g.const(_INT32_MAX), y])]


BACKEND.lowering([RELU, RELU1, RELU6], lower=lower_relu, types=[F32])
BACKEND.lowering([LOGISTIC, TANH, HARD_SWISH, EXP, LOG, SIN, SQRT, FLOOR], lower=lower_simple, types=[F32])
BACKEND.lowering([ABS, NEG], lower=lower_simple, types=[F32, I32])
BACKEND.lowering(RSQRT, lower=lower_rsqrt, types=[F32])
BACKEND.lowering(ELU, lower=lower_elu, types=[F32], supports=supports_elu)
BACKEND.lowering(CAST, lower=lower_cast, types=[F32, I32], supports=supports_cast)
