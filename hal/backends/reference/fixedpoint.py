"""gemmlowp fixed-point arithmetic (fixedpoint.h) on numpy arrays, bit-exact.

A ``FixedPoint<int32, I>`` value is its raw int32 held in an int64 array; the
number of integer bits ``I`` is passed explicitly (the C++ type parameter), so
the real value is ``raw / 2^(31 - I)``. Additions wrap to int32 as the C++ code
does on two's-complement hardware; products are SaturatingRoundingDoublingHighMul.
Used by the quantized SOFTMAX reference kernel.
"""
from __future__ import annotations

import numpy as np

from hal.quant import INT32_MAX, INT32_MIN, rounding_divide_by_pot, wrap_int32
from hal.quant import saturating_rounding_doubling_high_mul as mul

__all__ = ["mul", "wrap32", "saturating_rounding_multiply_by_pot", "rescale", "rounding_half_sum",
           "exp_on_negative_values", "one_over_one_plus_x_for_x_in_0_1", "get_reciprocal"]


wrap32 = wrap_int32


def saturating_rounding_multiply_by_pot(x, exponent: int) -> np.ndarray:
    """SaturatingRoundingMultiplyByPOT<exponent>: saturating left shift or rounding right shift."""
    x = np.asarray(x, dtype=np.int64)
    if exponent == 0:
        return x
    if exponent < 0:
        return rounding_divide_by_pot(x, -exponent)
    threshold = (1 << (31 - exponent)) - 1
    shifted = wrap32(x << exponent)
    return np.where(x > threshold, INT32_MAX, np.where(x < -threshold, INT32_MIN, shifted))


def rescale(x, src_integer_bits: int, dst_integer_bits: int) -> np.ndarray:
    """gemmlowp::Rescale<dst>(FixedPoint<int32, src>)."""
    return saturating_rounding_multiply_by_pot(x, src_integer_bits - dst_integer_bits)


def rounding_half_sum(a, b) -> np.ndarray:
    """(a + b) / 2 rounded half away from zero (gemmlowp RoundingHalfSum for int32)."""
    s = np.asarray(a, dtype=np.int64) + np.asarray(b, dtype=np.int64)
    s = s + np.where(s >= 0, 1, -1)
    q = np.abs(s) // 2
    return np.where(s >= 0, q, -q)


def _exp_on_interval_between_negative_one_quarter_and_0_excl(a: np.ndarray) -> np.ndarray:
    """exp(a) for a in [-1/4, 0), Q0.31 in and out: 4th-order Taylor series around -1/8."""
    exp_minus_one_eighth = 1895147668
    one_third = 715827883
    x = wrap32(a + (1 << 28))
    x2 = mul(x, x)
    x3 = mul(x2, x)
    x4 = mul(x2, x2)
    x4_over_4 = rounding_divide_by_pot(x4, 2)
    poly = rounding_divide_by_pot(wrap32(mul(wrap32(x4_over_4 + x3), one_third) + x2), 1)
    return wrap32(exp_minus_one_eighth + mul(exp_minus_one_eighth, wrap32(x + poly)))


#: exp(-2^k) in Q0.31 for the barrel shifter, k = -2 .. 4 (gemmlowp's constants).
_EXP_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308),
               (2, 39332535), (3, 720401), (4, 242))


def exp_on_negative_values(a, integer_bits: int) -> np.ndarray:
    """exp(a) for a <= 0 given as FixedPoint<int32, integer_bits>; result in Q0.31."""
    a = np.asarray(a, dtype=np.int64)
    frac_bits = 31 - integer_bits
    one_quarter = 1 << (frac_bits - 2)
    a_mod_quarter_minus_one_quarter = wrap32((a & (one_quarter - 1)) - one_quarter)
    result = _exp_on_interval_between_negative_one_quarter_and_0_excl(
        rescale(a_mod_quarter_minus_one_quarter, integer_bits, 0))
    remainder = wrap32(a_mod_quarter_minus_one_quarter - a)
    for exponent, multiplier in _EXP_BARREL:
        if integer_bits > exponent:
            bit = (remainder >> (frac_bits + exponent)) & 1
            result = np.where(bit != 0, mul(result, multiplier), result)
    if integer_bits > 5:
        clamp = -(1 << (36 - integer_bits))  # -32.0 in this format
        result = np.where(a < clamp, 0, result)
    return np.where(a == 0, INT32_MAX, result)


def one_over_one_plus_x_for_x_in_0_1(a) -> np.ndarray:
    """1 / (1 + a) for a in [0, 1) in Q0.31, by three Newton-Raphson steps in Q2.29."""
    half_denominator = rounding_half_sum(a, INT32_MAX)
    x = wrap32(1515870810 + mul(half_denominator, -1010580540))  # 48/17 - 32/17 * d
    one_q2 = 1 << 29
    for _ in range(3):
        one_minus_dx = wrap32(one_q2 - mul(half_denominator, x))
        x = wrap32(x + rescale(mul(x, one_minus_dx), 4, 2))
    return rescale(x, 1, 0)  # ExactMulByPot<-1> (Q2 -> Q1, same raw), then Rescale<0>


def _count_leading_zeros_u32(x: np.ndarray) -> np.ndarray:
    """CountLeadingZeros of uint32 values (frexp is exact for integers below 2^53)."""
    x = np.asarray(x, dtype=np.int64) & 0xFFFFFFFF
    _, bit_length = np.frexp(x.astype(np.float64))
    return 32 - bit_length.astype(np.int64)


def get_reciprocal(x, x_integer_digits: int) -> tuple[np.ndarray, np.ndarray]:
    """TFLite GetReciprocal: (1/x normalised to Q0.31, num_bits_over_unit) for x > 0 in
    FixedPoint<int32, x_integer_digits>."""
    x = np.asarray(x, dtype=np.int64)
    headroom_plus_one = _count_leading_zeros_u32(x)
    num_bits_over_unit = x_integer_digits - headroom_plus_one
    shifted_sum_minus_one = wrap32(((x << headroom_plus_one) & 0xFFFFFFFF) - (1 << 31))
    return one_over_one_plus_x_for_x_in_0_1(shifted_sum_minus_one), num_bits_over_unit
