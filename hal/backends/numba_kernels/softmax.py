"""Quantized (uint8 / int8) SOFTMAX along any axis, bit-exact with the reference backend.

The reference kernel (TFLite's reference_ops::Softmax) computes, per element, a fixed-point
exponential of its difference to the row maximum, and per row one sum and one reciprocal. A
difference is an integer in [-255, 0], so at plan time the reference's own fixed-point functions
tabulate both per-element values (the Q0.31 exponential and its Q12.19 term of the sum) for all 256
differences. Execution is one native pass per row: maximum, wrapped int32 sum of the tabulated
terms, TFLite's GetReciprocal (the same gemmlowp arithmetic, on scalars), then the scaled
exponentials. Differences below the kernel's ``diff_min`` contribute nothing and give the type
minimum, as in the reference.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np

from hal import backends, quant
from hal.backends.numba_kernels import BACKEND
from hal.backends.numba_kernels.fixedpoint import INT32_MAX, INT32_MIN, clamp, ro, rounding_divide_by_pot, rw, srdhm
from hal.backends.numba_kernels.lazy import njit
from hal.backends.reference import fixedpoint as fp
from hal.operations.common import QUANT8
from hal.operations.softmax import SOFTMAX
from hal.registry import OperationContext

_SCALED_DIFF_INTEGER_BITS = 5  # as the reference kernel: exp() inputs in Q5.26
_ACCUMULATION_INTEGER_BITS = 12  # the sum of exponentials in Q12.19
_OUT_BITS = 8


@dataclass
class SoftmaxTables:
    axis: int
    exps: np.ndarray  # [256] int64: Q0.31 exp of the difference -k to the row maximum
    terms: np.ndarray  # [256] int64: its Q12.19 term of the sum, 0 beyond ``radius``
    radius: int  # largest k = max - x the kernel uses (the reference's -diff_min)
    qmin: int
    qmax: int


def plan(ctx: OperationContext) -> SoftmaxTables:
    # the reference plan: its checks (beta * scale too small for the fixed point) and constants
    ref = backends.get(backends.REFERENCE).kernel(SOFTMAX).plan(ctx)
    k = np.arange(256, dtype=np.int64)
    used = -k >= ref.diff_min
    safe_diff = np.where(used, -k, 0)
    scaled = quant.multiply_by_quantized_multiplier_greater_than_one(safe_diff, ref.input_multiplier,
                                                                     ref.input_left_shift)
    exps = fp.exp_on_negative_values(scaled, _SCALED_DIFF_INTEGER_BITS)
    terms = np.where(used, fp.rescale(exps, 0, _ACCUMULATION_INTEGER_BITS), 0)
    qmin, qmax = quant.quant_range(ctx.output(0).type)
    return SoftmaxTables(ref.axis, np.ascontiguousarray(exps, dtype=np.int64),
                         np.ascontiguousarray(terms, dtype=np.int64), int(-ref.diff_min), qmin, qmax)


# ---- gemmlowp fixed point on int64 scalars holding int32 values ------------------------------

_jit = numba.njit(cache=True, nogil=True, inline="always")


@_jit
def _wrap32(x):
    return ((x + (np.int64(1) << 31)) & np.int64(0xFFFFFFFF)) - (np.int64(1) << 31)


@_jit
def _mul_by_pot(x, exponent):
    """SaturatingRoundingMultiplyByPOT for a positive exponent (a saturating left shift)."""
    threshold = (np.int64(1) << (31 - exponent)) - 1
    if x > threshold:
        return INT32_MAX
    if x < -threshold:
        return INT32_MIN
    return _wrap32(x << exponent)


@_jit
def _one_over_one_plus_x(a):
    """1 / (1 + a) for a in [0, 1), Q0.31: three Newton-Raphson steps in Q2.29."""
    s = a + INT32_MAX  # RoundingHalfSum(a, 1), half away from zero
    s = s + 1 if s >= 0 else s - 1
    half_denominator = s // 2 if s >= 0 else -((-s) // 2)
    x = _wrap32(np.int64(1515870810) + srdhm(half_denominator, np.int64(-1010580540)))
    one_q2 = np.int64(1) << 29
    for _ in range(3):
        one_minus_dx = _wrap32(one_q2 - srdhm(half_denominator, x))
        x = _wrap32(x + _mul_by_pot(srdhm(x, one_minus_dx), 2))
    return _mul_by_pot(x, 1)


@_jit
def _reciprocal(total):
    """TFLite's GetReciprocal of a Q12.19 sum: (1/sum normalised to Q0.31, num_bits_over_unit)."""
    u = total & np.int64(0xFFFFFFFF)
    bits = 0
    while u != 0:
        u >>= 1
        bits += 1
    headroom_plus_one = np.int64(32 - bits)
    shifted_minus_one = _wrap32(((total << headroom_plus_one) & np.int64(0xFFFFFFFF)) - (np.int64(1) << 31))
    return _one_over_one_plus_x(shifted_minus_one), np.int64(_ACCUMULATION_INTEGER_BITS) - headroom_plus_one


_SIGS = [numba.void(ro(t, 3), ro(np.int64, 1), ro(np.int64, 1), numba.int64, numba.int64, numba.int64, rw(t, 3))
         for t in (np.uint8, np.int8)]


@njit(_SIGS, cache=True, nogil=True)
def _softmax(x, exps, terms, radius, qmin, qmax, out):
    """x, out: [outer, n, inner], softmax along n."""
    outer, n, inner = x.shape
    for o in range(outer):
        for j in range(inner):
            top = np.int64(x[o, 0, j])
            for i in range(1, n):
                v = np.int64(x[o, i, j])
                top = v if v > top else top
            total = np.int64(0)
            for i in range(n):
                total += terms[top - np.int64(x[o, i, j])]
            reciprocal, bits_over_unit = _reciprocal(_wrap32(total))
            exponent = bits_over_unit + (31 - _OUT_BITS)
            for i in range(n):
                k = top - np.int64(x[o, i, j])
                if k <= radius:
                    v = rounding_divide_by_pot(srdhm(reciprocal, exps[k]), exponent) + qmin
                    out[o, i, j] = clamp(v, qmin, qmax)
                else:
                    out[o, i, j] = qmin


def execute(ctx: OperationContext, inputs: list) -> list:
    d: SoftmaxTables = ctx.data
    x = np.ascontiguousarray(inputs[0])
    out = np.empty(x.shape, dtype=x.dtype)
    if x.size == 0:
        return [out]
    n = x.shape[d.axis]
    outer = 1
    for k in x.shape[:d.axis]:
        outer *= k
    _softmax(x.reshape(outer, n, -1), d.exps, d.terms, d.radius, d.qmin, d.qmax, out.reshape(outer, n, -1))
    return [out]


def bind(ctx: OperationContext, inputs: list, outputs: list):
    """``execute`` of the fixed contiguous input into the fixed ``outputs[0]``: a zero-argument runner."""
    d: SoftmaxTables = ctx.data
    x, out = inputs[0], outputs[0]
    if x is None or not x.flags.c_contiguous or x.size == 0:
        return None
    n = x.shape[d.axis]
    outer = 1
    for k in x.shape[:d.axis]:
        outer *= k
    return functools.partial(_softmax, x.reshape(outer, n, -1), d.exps, d.terms, d.radius, d.qmin, d.qmax,
                             out.reshape(outer, n, -1))


BACKEND.register(SOFTMAX, plan=plan, execute=execute, types=QUANT8, bind=bind)
