"""INSTANCE_NORMALIZATION, L2_NORMALIZATION, LOCAL_RESPONSE_NORMALIZATION on numpy (float32;
float16 operations run widened to float32, as AOSP's CPU driver runs them).

Quantized L2_NORMALIZATION is bit-exact with TFLite 2.14's kernels along the last axis:
uint8 is reference_ops::L2Normalization (``128 + MultiplyByQuantizedMultiplierSmallerThanOneExp(
128 * diff, inv_sqrt)``), int8 is reference_integer_ops::L2Normalization
(``MultiplyByQuantizedMultiplier(diff, inv_sqrt, shift + 7)``), both with the per-row
GetInvSqrtQuantizedMultiplierExp of the sum of squared differences (a Newton-Raphson 1/sqrt in
gemmlowp fixed point). Another axis is moved last and computed the same way. (AOSP's int8 path
for a non-last axis uses the uint8 formula instead, which may differ by one step.)

LOCAL_RESPONSE_NORMALIZATION sums the window [i - radius, i + radius] (both ends included), as
NNAPI, AOSP and TFLite's optimized kernel do; TFLite's *reference* kernel stops one short of the
upper end, which is not NNAPI's operation.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal import quant
from hal.backends.reference import BACKEND
from hal.backends.reference import fixedpoint as fp
from hal.operations.common import QS8, QU8
from hal.operations.normalization import (
    INSTANCE_NORMALIZATION,
    L2_EPSILON,
    L2_NORMALIZATION,
    LOCAL_RESPONSE_NORMALIZATION,
    InstanceNormParams,
    L2NormParams,
    LrnParams,
)
from hal.registry import OperationContext

_L2_EPSILON = np.float32(L2_EPSILON)


# ---- INSTANCE_NORMALIZATION ---------------------------------------------------------------------

def plan_instance_norm(ctx: OperationContext) -> InstanceNormParams:
    return ctx.params


def execute_instance_norm(ctx: OperationContext, inputs: list) -> list:
    p: InstanceNormParams = ctx.data
    x = inputs[0].astype(np.float64)
    spatial = (2, 3) if p.nchw else (1, 2)
    mean = x.mean(axis=spatial, keepdims=True)
    centred = x - mean
    sigma = np.sqrt((centred * centred).mean(axis=spatial, keepdims=True) + np.float32(p.epsilon))
    out = centred * np.float32(p.gamma) / sigma + np.float32(p.beta)
    return [out.astype(np.float32)]


# ---- L2_NORMALIZATION ---------------------------------------------------------------------------

@dataclass
class L2NormData:
    axis: int
    input_zero_point: int = 0


def plan_l2_norm(ctx: OperationContext) -> L2NormData:
    p: L2NormParams = ctx.params
    return L2NormData(p.axis, ctx.input(0).zero_point)


def _bit_length(x: np.ndarray) -> np.ndarray:
    """Bit length of non-negative int64 values below 2^53 (frexp is exact there)."""
    return np.frexp(x.astype(np.float64))[1].astype(np.int64)


def inv_sqrt_quantized_multiplier_exp(acc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's GetInvSqrtQuantizedMultiplierExp(acc, reverse_shift=-1) on an array of int32 sums:
    (multiplier, left shift <= 0) with 1/sqrt(acc) = multiplier * 2^(shift - 31) (roughly)."""
    acc = quant.wrap_int32(acc)
    tiny = acc <= 1  # 0 (all zero) and 1 are answered as "multiply by one"
    x = np.where(tiny, 2, acc)
    shift = np.full(x.shape, 11, dtype=np.int64)
    for _ in range(2):  # at most twice for an int32: bring x below 2^29
        big = x >= (1 << 29)
        x = np.where(big, x // 4, x)
        shift += big
    left_shift_bit_pairs = (32 - _bit_length(x) - 1) // 2 - 1
    shift -= left_shift_bit_pairs
    x = x << (2 * left_shift_bit_pairs)  # now in [2^27, 2^29)
    # Newton-Raphson in FixedPoint<int32, 3>: r <- 1.5 r - (x/2) r^3, from r = 1, five times.
    half_input = quant.rounding_divide_by_pot(x >> 1, 1)
    half_three = (1 << 28) + (1 << 27)
    r = np.full(x.shape, 1 << 28, dtype=np.int64)
    for _ in range(5):
        r3 = fp.rescale(fp.mul(fp.mul(r, r), r), 9, 3)
        r = fp.rescale(fp.wrap32(fp.mul(half_three, r) - fp.mul(half_input, r3)), 6, 3)
    r = fp.mul(r, 1518500250)  # * sqrt(2) / 2 in Q0.31
    negative = shift < 0
    r = np.where(negative, fp.wrap32(r << np.where(negative, -shift, 0)), r)
    shift = np.where(negative, 0, shift)
    return np.where(tiny, quant.INT32_MAX, r), np.where(tiny, 0, -shift)


def _l2_norm_quant8(x: np.ndarray, zero_point: int, out_type: int) -> np.ndarray:
    """Along the last axis, as TFLite's uint8 / int8 L2Normalization kernels."""
    diff = x.astype(np.int64) - zero_point
    multiplier, shift = inv_sqrt_quantized_multiplier_exp((diff * diff).sum(axis=-1, keepdims=True))
    if out_type == QU8:
        scaled = quant.multiply_by_quantized_multiplier_smaller_than_one_exp(128 * diff, multiplier, shift)
        return quant.saturate_cast(128 + scaled, QU8)
    return quant.saturate_cast(quant.multiply_by_quantized_multiplier(diff, multiplier, shift + 7), QS8)


def execute_l2_norm(ctx: OperationContext, inputs: list) -> list:
    d: L2NormData = ctx.data
    x = np.moveaxis(inputs[0], d.axis, -1)
    if x.dtype == np.float32:
        norm = np.maximum(np.sqrt((x * x).sum(axis=-1, keepdims=True, dtype=np.float32)), _L2_EPSILON)
        y = (x / norm).astype(np.float32)
    else:
        y = _l2_norm_quant8(x, d.input_zero_point, ctx.outputs[0].type)
    return [np.ascontiguousarray(np.moveaxis(y, -1, d.axis))]


# ---- LOCAL_RESPONSE_NORMALIZATION ---------------------------------------------------------------

def plan_lrn(ctx: OperationContext) -> LrnParams:
    return ctx.params


def execute_lrn(ctx: OperationContext, inputs: list) -> list:
    p: LrnParams = ctx.data
    x = np.moveaxis(inputs[0], p.axis, -1)
    n = x.shape[-1]
    reach = min(p.radius, n - 1) if n else 0  # window offsets beyond the axis add nothing
    padded = np.pad(x * x, [(0, 0)] * (x.ndim - 1) + [(reach, reach)])
    total = np.zeros_like(x)
    for k in range(2 * reach + 1):  # in index order, as AOSP accumulates
        total += padded[..., k:k + n]
    y = x * np.power(np.float32(p.bias) + np.float32(p.alpha) * total, np.float32(-p.beta))
    return [np.ascontiguousarray(np.moveaxis(y.astype(np.float32), -1, p.axis))]


BACKEND.register(INSTANCE_NORMALIZATION, plan=plan_instance_norm, execute=execute_instance_norm)
BACKEND.register(L2_NORMALIZATION, plan=plan_l2_norm, execute=execute_l2_norm)
BACKEND.register(LOCAL_RESPONSE_NORMALIZATION, plan=plan_lrn, execute=execute_lrn)
