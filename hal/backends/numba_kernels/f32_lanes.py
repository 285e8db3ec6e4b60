"""Float32 activations on 16-lane vectors, as LLVM IR: shared by f32_activations.py's passes over
a tensor and by the convolutions' epilogues (fc_float's fused tiles, f32_depthwise.py), which
apply them to sums still in registers. Every step is one IEEE float32 operation or fused
multiply-add (no fast-math flags), so a pass and an epilogue give the same bytes.

* HARD_SWISH as the reference computes it: ``x · clip(x + 3, 0, 6) / 6``, each step one float32
  rounding in that order (the division's exactly rounded quotient, ``divide_by_6``), the clip
  written so that NaN passes it as it passes numpy's: the reference's bytes wherever the result
  is a normal float (-inf gives NaN there too: -inf · 0).
* LOGISTIC: ``1 / (1 + exp(-x))`` with exp a float32 Cephes-style ``expf``: n = ``t·log2 e``
  rounded to nearest (adding and subtracting 1.5·2^23), ``r = t - n·ln 2`` in two parts, a degree-6
  polynomial (Horner's rule in fused multiply-adds), times 2^n made from its exponent bits. That
  is about 1 ULP of libm's, so the result is within 4 ULP of the reference's numpy expression
  (most often its bytes), far inside CTS's float32 tolerance (1e-5 + 5 ULP). ``t = -x`` is
  clamped to [-87, 88] first, where 2^n is a normal float (a NaN becomes 88 there, so the
  exponent's conversion to int32 is always defined);
  then where ``t`` is beyond float32's exp range (> 88.72: the reference's exp overflows to inf)
  the result is 0 as the reference's, and a NaN input gives NaN. Outside [-87, 88] the clamp
  changes nothing the reference keeps: sigmoid is 1.0 in float32 from t < -17, and for t between
  88 and 88.72 the reference's results are denormals below 1e-38.
* swish: ``x · LOGISTIC(x)``, one more rounding (the reference's MUL of the two).
* TANH: Cephes' ``tanhf``: below |x| = 0.625 the odd polynomial ``x + x·z·P(z)`` (z = x²: no
  cancellation near 0), above it ``1 - 2 / (exp(2|x|) + 1)`` with the sign of x (exp as LOGISTIC's;
  from |x| = 44 the clamped exp gives 1, as tanh is 1 in float32 from |x| = 9.01). Within 2 ULP of
  libm's tanhf, which the reference's numpy calls; NaN stays NaN and -0 stays -0.
* exp alone (f32_softmax.py's): the same ``expf``; below -87 it gives exp(-87), 1.6e-38, where
  float32's is a smaller denormal or 0.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import cgutils

LANES = 16
_F, _I32, _I64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
_VF, _VI = ir.VectorType(_F, LANES), ir.VectorType(_I32, LANES)

#: An epilogue's activation, the code ``activate`` switches on.
ACT_NONE, ACT_HARD_SWISH, ACT_SWISH = 0, 1, 2

#: Cephes' expf: ln 2 in two parts (the first exact in few bits), the polynomial's coefficients.
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
_T_HI, _T_LO = 88.0, -87.0  # exp's argument clamped to where 2^n is a normal float
_T_OVER = 88.72283935546875  # above it float32's exp is inf (ln FLT_MAX, rounded up)
_ROUND = 12582912.0  # 1.5·2^23: v + it - it is v rounded to an integer (|v| < 2^22)


def const(value: float) -> ir.Constant:
    """A vector of 16 float32 ``value``s (rounded to float32 as numpy would)."""
    return ir.Constant(_VF, [float(np.float32(value))] * LANES)


def exp_lanes(b, t):
    """exp(t) of t clamped to [-87, 88] (a NaN becomes 88: the caller decides what NaN gives)."""
    c = b.select(b.fcmp_ordered("<", t, const(_T_HI)), t, const(_T_HI))
    c = b.select(b.fcmp_ordered(">", c, const(_T_LO)), c, const(_T_LO))
    n = b.fsub(_fma(b, c, const(np.log2(np.e)), const(_ROUND)), const(_ROUND))
    r = _fma(b, n, const(-_LN2_LO), _fma(b, n, const(-_LN2_HI), c))
    p = const(_POLY[0])
    for k in _POLY[1:]:
        p = _fma(b, p, r, const(k))
    p = b.fadd(_fma(b, p, b.fmul(r, r), r), const(1.0))
    exponent = b.add(b.fptosi(n, _VI), ir.Constant(_VI, [127] * LANES))  # in [1, 254]
    return b.fmul(p, b.bitcast(b.shl(exponent, ir.Constant(_VI, [23] * LANES)), _VF))


def sigmoid_lanes(b, v):
    t = b.fneg(v)
    s = b.fdiv(const(1.0), b.fadd(const(1.0), exp_lanes(b, t)))
    s = b.select(b.fcmp_ordered(">", t, const(_T_OVER)), const(0.0), s)
    return b.select(b.fcmp_unordered("uno", v, v), v, s)


#: Cephes' tanhf: its polynomial below |x| = _TANH_SMALL, highest degree first.
_TANH_SMALL = 0.625
_TANH_POLY = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1)


def tanh_lanes(b, v):
    a = b.call(cgutils.get_or_insert_function(b.module, ir.FunctionType(_VF, [_VF]), "llvm.fabs.v16f32"), [v])
    z = b.fmul(v, v)
    p = const(_TANH_POLY[0])
    for k in _TANH_POLY[1:]:
        p = _fma(b, p, z, const(k))
    small = _fma(b, b.fmul(p, z), v, v)
    e = exp_lanes(b, b.fadd(a, a))
    large = b.fsub(const(1.0), b.fdiv(const(2.0), b.fadd(e, const(1.0))))
    sign = ir.Constant(_VI, [-(1 << 31)] * LANES)
    large = b.bitcast(b.or_(b.bitcast(large, _VI), b.and_(b.bitcast(v, _VI), sign)), _VF)
    t = b.select(b.fcmp_ordered("<", a, const(_TANH_SMALL)), small, large)
    return b.select(b.fcmp_unordered("ueq", v, const(0.0)), v, t)  # NaN, and ±0 (the sum gives +0)


def _fma(b, x, y, z):
    fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(_VF, [_VF] * 3), "llvm.fma.v16f32")
    return b.call(fn, [x, y, z])


def divide_by_6(b, p):
    """``p / 6`` rounded once, without a division (one costs as much as the rest of hard-swish
    together): q = p · RN(1/6), then q + (p - 6q)·RN(1/6), the remainder exact in a fused
    multiply-add (Markstein's correction). Checked against numpy's p / 6 on every float32: the
    same bytes wherever the quotient is a normal float; a remainder of 0 (q exact, -0.0 among
    them) or not a number (p infinite or NaN) keeps q. Below float32's normal range (|p| < 7e-38)
    q may be one subnormal step off."""
    sixth = const(1 / 6)
    q = b.fmul(p, sixth)
    r = _fma(b, b.fneg(q), const(6.0), p)
    return b.select(b.fcmp_ordered("!=", r, const(0.0)), _fma(b, r, sixth, q), q)


def hard_swish_lanes(b, v):
    c = b.fadd(v, const(3.0))
    c = b.select(b.fcmp_ordered("<", c, const(0.0)), const(0.0), c)  # NaN passes, as through numpy's clip
    c = b.select(b.fcmp_ordered(">", c, const(6.0)), const(6.0), c)
    return divide_by_6(b, b.fmul(v, c))


def swish_lanes(b, v):
    return b.fmul(v, sigmoid_lanes(b, v))


def activate(b, act, values: list) -> list:
    """``values`` (16-lane vectors) through the activation ``act`` (an i64 ``ACT_*``, the same for
    the whole call): one switch, then each activation's code on every value (a branch the core
    predicts: an epilogue's activation is fixed per layer), joined by phis."""
    done = {}
    end = b.append_basic_block("act.end")
    switch = b.switch(act, end)
    done[b.block] = values
    for code, lanes in ((ACT_HARD_SWISH, hard_swish_lanes), (ACT_SWISH, swish_lanes)):
        block = b.append_basic_block(f"act.{code}")
        switch.add_case(ir.Constant(act.type, code), block)
        b.position_at_end(block)
        applied = [lanes(b, v) for v in values]
        done[b.block] = applied
        b.branch(end)
    b.position_at_end(end)
    joined = []
    for k, v in enumerate(values):
        phi = b.phi(v.type)
        for block, vs in done.items():
            phi.add_incoming(vs[k], block)
        joined.append(phi)
    return joined


def when(b, cond, values: list, fn) -> list:
    """``fn(values)`` where ``cond`` (an i1, the same for the whole call) holds, else ``values``:
    a branch around ``fn``'s code, joined by phis."""
    before = b.block
    then, end = b.append_basic_block("when.then"), b.append_basic_block("when.end")
    b.cbranch(cond, then, end)
    b.position_at_end(then)
    applied = fn(values)
    done = b.block
    b.branch(end)
    b.position_at_end(end)
    joined = []
    for v, a in zip(values, applied):
        phi = b.phi(v.type)
        phi.add_incoming(v, before)
        phi.add_incoming(a, done)
        joined.append(phi)
    return joined
