"""TFLite's integer arithmetic, vectorised with numpy and bit-exact.

Every quantized kernel uses these, so a rounding rule is written once. The
functions mirror tensorflow/lite/kernels/internal/common.h and gemmlowp's
fixedpoint.h (double-rounding MultiplyByQuantizedMultiplier, which is what
tflite-runtime 2.14 builds use):

    real value r = S * (q - Z);   M = S1 * S2 / S3 = M0 * 2^shift,  M0 in [2^30, 2^31)
"""
from __future__ import annotations

import math

import numpy as np

from hal.types import FusedActivationFunc, OperandType

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1

QUANT_RANGE = {
    OperandType.TENSOR_QUANT8_ASYMM: (0, 255),
    OperandType.TENSOR_QUANT8_ASYMM_SIGNED: (-128, 127),
    OperandType.TENSOR_QUANT8_SYMM: (-127, 127),
    OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL: (-127, 127),
    OperandType.TENSOR_QUANT16_ASYMM: (0, 65535),
    OperandType.TENSOR_QUANT16_SYMM: (-32768, 32767),
}


def tflite_round(x: float) -> float:
    """std::round: half away from zero (Python's round() is half-to-even)."""
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


def round_half_away(x: np.ndarray) -> np.ndarray:
    """Vectorised std::round, exact: ``floor(|x| + 0.5)`` would misround 0.49999997f up to 1."""
    whole = np.trunc(x)
    return whole + np.sign(x) * (np.abs(x - whole) >= 0.5)


#: float32 represents every integer up to this: a sum of integer products below it is exact.
FLOAT32_EXACT = 1 << 24


def exact_float32_chunks(k: int, max_product: int) -> tuple[int, ...]:
    """Split points of a reduction over ``k`` integer products of magnitude at most ``max_product``
    into chunks whose float32 sums are exact integers: how 8-bit GEMMs run in float32 BLAS."""
    step = max(1, FLOAT32_EXACT // max(1, max_product))
    return tuple(range(0, k, step)) + (k,)


def exact_float32_gemm(a: np.ndarray, weights: np.ndarray, chunks) -> np.ndarray:
    """``a @ weights`` (float32 integer values) summed exactly: one GEMM when one chunk suffices,
    else the chunks' exact float32 GEMMs added in float64 (exact below 2^53)."""
    if len(chunks) == 2:
        return a @ weights
    acc = np.zeros((a.shape[0], weights.shape[1]), dtype=np.float64)
    for k0, k1 in zip(chunks[:-1], chunks[1:]):
        acc += a[:, k0:k1] @ weights[k0:k1]
    return acc


def quantize_multiplier(real_multiplier: float) -> tuple[int, int]:
    """QuantizeMultiplier: real = M0 * 2^(shift - 31) with M0 an int32 in [2^30, 2^31)."""
    if real_multiplier == 0.0:
        return 0, 0
    q, shift = math.frexp(real_multiplier)
    q_fixed = int(tflite_round(q * (1 << 31)))
    if q_fixed == (1 << 31):
        q_fixed //= 2
        shift += 1
    if shift < -31:
        shift, q_fixed = 0, 0
    return q_fixed, shift


def quantize_multiplier_smaller_than_one_exp(real_multiplier: float) -> tuple[int, int]:
    """QuantizeMultiplierSmallerThanOneExp: shift <= 0 (returned as a left shift)."""
    m, shift = quantize_multiplier(real_multiplier)
    if shift > 0:
        raise ValueError(f"multiplier {real_multiplier} is not smaller than one")
    return m, shift


def trunc_div(a: np.ndarray, d) -> np.ndarray:
    """C integer division (truncates toward zero); numpy's // floors."""
    q = np.abs(a) // np.abs(d)
    return np.where((a >= 0) == (np.asarray(d) >= 0), q, -q)


#: Up to this many elements, saturating_rounding_doubling_high_mul takes its path with fewer numpy
#: calls (each costs ~1 us whatever the size); above it, the in-place one (fewer temporaries).
SMALL = 64


def saturating_rounding_doubling_high_mul(a, b) -> np.ndarray:
    """gemmlowp SaturatingRoundingDoublingHighMul on int32 values (int64 arrays in/out).

    In-place on one int64 temporary: this runs on every element of every quantized tensor. Small
    arrays (a recurrent cell's per-step scalars: an int8 LSTM's layer norm calls this 84 times a
    step) take a path of half as many numpy calls: 28 -> 9 us on one element here."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    v = a * b
    if v.size <= SMALL:
        # round(v / 2^31) half up, truncating toward zero after the nudge as C does; only
        # INT32_MIN * INT32_MIN exceeds INT32_MAX.
        out = np.where(v >= 0, (v + (1 << 30)) >> 31, -(((1 << 30) - 1 - v) >> 31))
        return np.minimum(out, INT32_MAX, out=out)
    negative = v < 0
    v += 1 << 30
    v -= negative * ((1 << 31) - 1)  # the nudge: 2^30, or 1 - 2^30 for negative products
    # C's truncating division by 2^31: an arithmetic shift floors; add 1 back to negative values
    # that had a remainder.
    fix = (v < 0) & ((v & ((1 << 31) - 1)) != 0)
    v >>= 31
    v += fix
    if np.any(b == INT32_MIN):  # the one overflow case: INT32_MIN * INT32_MIN
        v = np.where((a == INT32_MIN) & (b == INT32_MIN), INT32_MAX, v)
    return v


def rounding_divide_by_pot(x, exponent) -> np.ndarray:
    """gemmlowp RoundingDivideByPOT (round half away from zero)."""
    x = np.asarray(x, dtype=np.int64)
    exponent = np.asarray(exponent, dtype=np.int64)
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def wrap_int32(x) -> np.ndarray:
    """int32 two's-complement wrap-around of int64 values (C's overflow on the targets we mirror)."""
    x = np.asarray(x, dtype=np.int64)
    return ((x + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def multiply_by_quantized_multiplier(x, multiplier, shift) -> np.ndarray:
    """MultiplyByQuantizedMultiplier (double rounding). ``multiplier``/``shift`` may be
    per-channel arrays broadcasting against ``x``."""
    x = np.asarray(x, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    left = np.maximum(shift, 0)
    right = np.maximum(-shift, 0)
    return rounding_divide_by_pot(
        saturating_rounding_doubling_high_mul(wrap_int32(x << left), multiplier), right)


def multiply_by_quantized_multiplier_smaller_than_one_exp(x, multiplier, left_shift) -> np.ndarray:
    return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(x, multiplier),
                                  -np.asarray(left_shift, dtype=np.int64))


def multiply_by_quantized_multiplier_greater_than_one(x, multiplier, left_shift) -> np.ndarray:
    x = np.asarray(x, dtype=np.int64)
    return saturating_rounding_doubling_high_mul(wrap_int32(x << left_shift), multiplier)


def quant_range(t: int) -> tuple[int, int]:
    return QUANT_RANGE[OperandType(t)]


def activation_range_quantized(act: int, t: int, scale: float, zero_point: int) -> tuple[int, int]:
    """CalculateActivationRangeQuantized: bounds computed as TFLite does (f / scale in float32)."""
    qmin, qmax = quant_range(t)

    def q(f: float) -> int:
        return zero_point + int(tflite_round(float(np.float32(f) / np.float32(scale))))

    act = FusedActivationFunc(act)
    if act == FusedActivationFunc.RELU:
        return max(qmin, q(0.0)), qmax
    if act == FusedActivationFunc.RELU6:
        return max(qmin, q(0.0)), min(qmax, q(6.0))
    if act == FusedActivationFunc.RELU1:
        return max(qmin, q(-1.0)), min(qmax, q(1.0))
    return qmin, qmax


def activation_range_float(act: int) -> tuple[float, float]:
    act = FusedActivationFunc(act)
    if act == FusedActivationFunc.RELU:
        return 0.0, math.inf
    if act == FusedActivationFunc.RELU6:
        return 0.0, 6.0
    if act == FusedActivationFunc.RELU1:
        return -1.0, 1.0
    return -math.inf, math.inf


def apply_activation_float(x: np.ndarray, act: int) -> np.ndarray:
    """Fused activation on a float tensor, in place when possible."""
    if act == FusedActivationFunc.NONE:
        return x
    lo, hi = activation_range_float(act)
    return np.clip(x, lo, None if math.isinf(hi) else hi, out=x)


def saturate_cast(x: np.ndarray, t: int, lo: int | None = None, hi: int | None = None) -> np.ndarray:
    """Clamp an int array into [lo, hi] (default: the type's range) and cast to its dtype."""
    qmin, qmax = quant_range(t)
    lo = qmin if lo is None else lo
    hi = qmax if hi is None else hi
    from hal.types import NUMPY_DTYPE
    return np.clip(x, lo, hi).astype(NUMPY_DTYPE[OperandType(t)])


def conv_multipliers(input_scale: float, filter_scales, output_scale: float,
                     uint8_per_tensor: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-output-channel (multiplier, shift) of a convolution or fully-connected layer, with
    TFLite's float/double evaluation order: uint8 per-tensor (GetQuantizedConvolutionMultipler)
    multiplies the two scales in float, then divides in double; int8 and per-channel
    (PopulateConvolutionQuantizationParams) work in double from the float32 scales."""
    f32 = np.float32
    scales = [float(s) for s in np.asarray(filter_scales, dtype=f32).reshape(-1)]
    if uint8_per_tensor:
        reals = [float(f32(input_scale) * f32(s)) / float(f32(output_scale)) for s in scales]
    else:
        reals = [float(f32(input_scale)) * s / float(f32(output_scale)) for s in scales]
    pairs = [quantize_multiplier(r) for r in reals]
    return (np.array([m for m, _ in pairs], dtype=np.int64), np.array([s for _, s in pairs], dtype=np.int64))

