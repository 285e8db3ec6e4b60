"""hal.quant vs independent exact-integer definitions (Python ints / Fractions)."""
import math
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hal import quant

int32s = st.integers(-(2**31), 2**31 - 1)


def srdhm_ref(a: int, b: int) -> int:
    """round-half-up(a*b / 2^31), saturating the single overflow case."""
    if a == b == -(2**31):
        return 2**31 - 1
    return math.floor(Fraction(a * b, 2**31) + Fraction(1, 2))


def rdbpot_ref(x: int, e: int) -> int:
    """x / 2^e rounded to nearest, ties away from zero."""
    q = Fraction(x, 2**e)
    return math.floor(q + Fraction(1, 2)) if q >= 0 else -math.floor(-q + Fraction(1, 2))


@settings(max_examples=500)
@given(st.lists(st.tuples(int32s, int32s), min_size=1, max_size=50))
def test_srdhm_matches_definition(pairs):
    a = np.array([p[0] for p in pairs])
    b = np.array([p[1] for p in pairs])
    want = [srdhm_ref(x, y) for x, y in pairs]
    got = quant.saturating_rounding_doubling_high_mul(a, b)
    assert [int(g) for g in got] == want
    # The same pairs as one array above quant.SMALL: the in-place path.
    k = quant.SMALL // len(pairs) + 1
    got = quant.saturating_rounding_doubling_high_mul(np.tile(a, k), np.tile(b, k))
    assert got.size > quant.SMALL and [int(g) for g in got] == want * k


def test_srdhm_saturates():
    assert int(quant.saturating_rounding_doubling_high_mul(-(2**31), -(2**31))) == 2**31 - 1
    big = np.full(quant.SMALL + 1, -(2**31))
    assert set(quant.saturating_rounding_doubling_high_mul(big, big).tolist()) == {2**31 - 1}


@settings(max_examples=500)
@given(st.lists(int32s, min_size=1, max_size=50), st.integers(0, 31))
def test_rounding_divide_by_pot_matches_definition(xs, e):
    got = quant.rounding_divide_by_pot(np.array(xs), e)
    assert [int(g) for g in got] == [rdbpot_ref(x, e) for x in xs]


@settings(max_examples=500)
@given(st.floats(min_value=1e-9, max_value=1e6, allow_nan=False))
def test_quantize_multiplier_represents_the_real_value(real):
    m, shift = quant.quantize_multiplier(real)
    if m == 0:  # underflow: TFLite flushes multipliers below 2^-32 to zero
        assert real < 2.0 ** -31
        return
    assert 2**30 <= m < 2**31
    approx = Fraction(m) * Fraction(2) ** (shift - 31)
    assert abs(approx - Fraction(real)) <= Fraction(2) ** (shift - 32)


def test_quantize_multiplier_rounds_up_to_next_power():
    # q * 2^31 rounding to 2^31 must renormalise (TFLite's q_fixed == 1<<31 case).
    m, shift = quant.quantize_multiplier(1.0 - 2.0 ** -40)
    assert (m, shift) == (2**30, 1)


@settings(max_examples=300)
@given(st.lists(int32s, min_size=1, max_size=20), st.integers(1, 2**31 - 1), st.integers(-31, 0))
def test_multiply_by_quantized_multiplier_is_srdhm_then_rdbpot(xs, m, shift):
    got = quant.multiply_by_quantized_multiplier(np.array(xs), m, shift)
    assert [int(g) for g in got] == [rdbpot_ref(srdhm_ref(x, m), -shift) for x in xs]


def test_round_half_away_from_zero():
    assert quant.tflite_round(2.5) == 3 and quant.tflite_round(-2.5) == -3
    np.testing.assert_array_equal(quant.round_half_away(np.array([0.5, -0.5, 1.49, -1.5])),
                                  [1.0, -1.0, 1.0, -2.0])


def test_round_half_away_is_exact_below_one_half():
    x = np.array([np.nextafter(np.float32(0.5), np.float32(0)), -np.nextafter(np.float32(0.5), np.float32(0)),
                  2.5, -2.5, 3.49999976], dtype=np.float32)
    np.testing.assert_array_equal(quant.round_half_away(x), [0.0, -0.0, 3.0, -3.0, 3.0])


@settings(max_examples=300)
@given(st.lists(int32s, min_size=1, max_size=20), st.integers(1, 2**20))
def test_trunc_div_is_c_division(xs, d):
    got = quant.trunc_div(np.array(xs, dtype=np.int64), d)
    assert [int(g) for g in got] == [int(Fraction(x, d)) for x in xs]  # int(Fraction) truncates
