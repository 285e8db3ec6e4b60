"""gemmlowp fixed-point arithmetic on int16 raw values (``FixedPoint<int16, I>``), bit-exact.

The int32 counterpart is ``fixedpoint.py``; this one is what QUANTIZED_16BIT_LSTM's gates need:
logistic and tanh of Q3.12 values, products and rescalings. Values are int16 raws held in int64
arrays. As in gemmlowp's generic code, plain additions and negations wrap to int16, products are
SaturatingRoundingDoublingHighMul, and the int32 constants of the shared algorithms are
rounding-shifted right by 16 bits (RescaleConstantInitializer).
"""
from __future__ import annotations

import functools

import numpy as np

from hal.quant import rounding_divide_by_pot

INT16_MIN, INT16_MAX = -(1 << 15), (1 << 15) - 1
ONE_F0 = INT16_MAX  # FixedPoint<int16, 0>::One()


def wrap16(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.int64)
    return ((x + (1 << 15)) & 0xFFFF) - (1 << 15)


def constant(int32_value: int) -> int:
    """RescaleConstantInitializer<int16>: a Q0.31-style int32 constant as an int16 raw."""
    return int(rounding_divide_by_pot(np.int64(int32_value), 16))


def mul(a, b) -> np.ndarray:
    """SaturatingRoundingDoublingHighMul for int16 (the product of two FixedPoints)."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    ab = a * b
    nudged = ab + np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    q = np.abs(nudged) >> 15  # C's division truncates toward zero
    q = np.where(nudged < 0, -q, q)
    return np.where((a == INT16_MIN) & (b == INT16_MIN), INT16_MAX, wrap16(q))


def saturating_add(a, b) -> np.ndarray:
    return np.clip(np.asarray(a, dtype=np.int64) + np.asarray(b, dtype=np.int64), INT16_MIN, INT16_MAX)


def multiply_by_pot(x, exponent: int) -> np.ndarray:
    """SaturatingRoundingMultiplyByPOT<exponent> on int16."""
    x = np.asarray(x, dtype=np.int64)
    if exponent == 0:
        return x
    if exponent < 0:
        return rounding_divide_by_pot(x, -exponent)
    threshold = (1 << (15 - exponent)) - 1
    return np.where(x > threshold, INT16_MAX, np.where(x < -threshold, INT16_MIN, wrap16(x << exponent)))


def rescale(x, src_integer_bits: int, dst_integer_bits: int) -> np.ndarray:
    return multiply_by_pot(x, src_integer_bits - dst_integer_bits)


def rounding_half_sum(a, b) -> np.ndarray:
    s = np.asarray(a, dtype=np.int64) + np.asarray(b, dtype=np.int64)
    s = s + np.where(s >= 0, 1, -1)
    q = np.abs(s) // 2
    return wrap16(np.where(s >= 0, q, -q))


def _exp_on_interval_between_negative_one_quarter_and_0_excl(a: np.ndarray) -> np.ndarray:
    """exp(a) for a in [-1/4, 0) in Q0.15: Taylor series around -1/8."""
    exp_minus_one_eighth = constant(1895147668)
    one_third = constant(715827883)
    x = wrap16(a + (1 << 12))  # a + 1/8
    x2 = mul(x, x)
    x3 = mul(x2, x)
    x4 = mul(x2, x2)
    x4_over_4 = multiply_by_pot(x4, -2)
    poly = multiply_by_pot(wrap16(mul(wrap16(x4_over_4 + x3), one_third) + x2), -1)
    return saturating_add(exp_minus_one_eighth, mul(exp_minus_one_eighth, wrap16(x + poly)))


#: exp(-2^k) for the barrel shifter, k = -2 .. 4 (gemmlowp's int32 constants).
_EXP_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308),
               (2, 39332535), (3, 720401), (4, 242))


def exp_on_negative_values(a, integer_bits: int) -> np.ndarray:
    """exp(a) for a <= 0 in FixedPoint<int16, integer_bits>; the result in Q0.15."""
    a = np.asarray(a, dtype=np.int64)
    frac_bits = 15 - integer_bits
    one_quarter = 1 << (frac_bits - 2)
    a_mod_quarter_minus_one_quarter = wrap16((a & (one_quarter - 1)) - one_quarter)
    result = _exp_on_interval_between_negative_one_quarter_and_0_excl(
        rescale(a_mod_quarter_minus_one_quarter, integer_bits, 0))
    remainder = wrap16(a_mod_quarter_minus_one_quarter - a)
    for exponent, multiplier in _EXP_BARREL:
        if integer_bits > exponent:
            bit = remainder & (1 << (frac_bits + exponent))
            result = np.where(bit != 0, mul(result, constant(multiplier)), result)
    if integer_bits > 5:
        result = np.where(a < -(1 << (36 - integer_bits - 16)), 0, result)  # below -32
    return np.where(a == 0, ONE_F0, result)


def _newton_reciprocal_q2(half_denominator: np.ndarray) -> np.ndarray:
    """1 / (2 · half_denominator) in Q2.13 by three Newton-Raphson steps (48/17 − 32/17·d start)."""
    x = wrap16(constant(1515870810) + mul(half_denominator, constant(-1010580540)))
    one_q2 = 1 << 13
    for _ in range(3):
        one_minus_dx = wrap16(one_q2 - mul(half_denominator, x))
        x = wrap16(x + rescale(mul(x, one_minus_dx), 4, 2))
    return x


def one_over_one_plus_x_for_x_in_0_1(a) -> np.ndarray:
    x = _newton_reciprocal_q2(rounding_half_sum(a, ONE_F0))
    return rescale(x, 1, 0)  # ExactMulByPot<-1> (Q2 -> Q1, same raw), then Rescale<0>


def one_minus_x_over_one_plus_x_for_x_in_0_1(a) -> np.ndarray:
    x = _newton_reciprocal_q2(rounding_half_sum(a, ONE_F0))
    return rescale(wrap16(x - (1 << 13)), 2, 0)


def logistic(a, integer_bits: int) -> np.ndarray:
    """gemmlowp::logistic of FixedPoint<int16, integer_bits>, in Q0.15."""
    a = np.asarray(a, dtype=np.int64)
    positive = a > 0
    abs_input = np.where(positive, a, wrap16(-a))
    if_positive = one_over_one_plus_x_for_x_in_0_1(exp_on_negative_values(wrap16(-abs_input), integer_bits))
    if_negative = wrap16(ONE_F0 - if_positive)
    return np.where(a == 0, constant(1 << 30), np.where(positive, if_positive, if_negative))


def tanh(a, integer_bits: int) -> np.ndarray:
    """gemmlowp::tanh of FixedPoint<int16, integer_bits>, in Q0.15."""
    a = np.asarray(a, dtype=np.int64)
    negative = a < 0
    n = np.where(negative, a, wrap16(-a))
    # ExactMulByPot<1>: the same raw, read with one more integer bit.
    t = one_minus_x_over_one_plus_x_for_x_in_0_1(exp_on_negative_values(n, integer_bits + 1))
    return np.where(a == 0, 0, np.where(negative, wrap16(-t), t))


@functools.lru_cache(maxsize=None)
def table(function: str, integer_bits: int) -> np.ndarray:
    """``logistic`` or ``tanh`` of FixedPoint<int16, integer_bits> for every int16 raw (index raw +
    32768). Both are elementwise functions of one raw, so the table made here by the functions
    above is the same arithmetic, computed once per process."""
    raws = np.arange(INT16_MIN, INT16_MAX + 1, dtype=np.int64)
    out = np.asarray(logistic(raws, integer_bits) if function == "logistic" else tanh(raws, integer_bits),
                     dtype=np.int64)
    out.flags.writeable = False
    return out


def lookup(function: str, raw, integer_bits: int) -> np.ndarray:
    """``function`` (``logistic`` or ``tanh``) of int16 raws through its ``table``."""
    return table(function, integer_bits)[np.asarray(raw, dtype=np.int64) - INT16_MIN]
