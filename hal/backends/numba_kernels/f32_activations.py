"""Float32 LOGISTIC and HARD_SWISH: one native pass over the flattened tensor, for the float CNNs
that run wholly on this backend (EfficientNet's swish and squeeze-excite gates, MobileNetV3's
hard-swish activations).

Each is a run of 16-lane float vectors written as LLVM vector IR (a numba intrinsic on f32_simd.py's
loads and stores), the last vector masked, so that any length (a squeeze-excite gate of a few
dozen channels) takes whole vectors; no branch on the data (selects). LLVM's own vectoriser, held
to 256-bit vectors on AVX-512 machines, ran LOGISTIC 1.45x slower. No fast-math flags: every step
is one IEEE float32 operation.

* HARD_SWISH as the reference computes it: ``x · clip(x + 3, 0, 6) / 6``, each step one float32
  operation in that order (a division, not a multiplication by 1/6), the clip written so that NaN
  passes it as it passes numpy's: the reference's bytes (-inf gives NaN there too: -inf · 0).
* LOGISTIC: ``1 / (1 + exp(-x))`` with exp a float32 Cephes-style ``expf``: n = ``t·log2 e``
  rounded to nearest (adding and subtracting 1.5·2^23), ``r = t - n·ln 2`` in two parts, a degree-6
  polynomial, times 2^n made from its exponent bits. That is about 1 ULP of libm's, so the
  result is within 4 ULP of the reference's numpy expression (most often its bytes), far inside
  CTS's float32 tolerance (1e-5 + 5 ULP). ``t = -x`` is clamped to [-87, 88] first, where 2^n is a
  normal float (a NaN becomes 88 there, so the exponent's conversion to int32 is always defined);
  then where ``t`` is beyond float32's exp range (> 88.72: the reference's exp overflows to inf)
  the result is 0 as the reference's, and a NaN input gives NaN. Outside [-87, 88] the clamp
  changes nothing the reference keeps: sigmoid is 1.0 in float32 from t < -17, and for t between
  88 and 88.72 the reference's results are denormals below 1e-38.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from hal.backends.numba_kernels import BACKEND
from hal.backends.numba_kernels.f32_simd import LANES, _lanes_below, _load, _store
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.simd import _data, counted_loop
from hal.operations.activations import HARD_SWISH, LOGISTIC, ActivationParams
from hal.registry import OperationContext
from hal.types import OperandType

F32_TYPES = (OperandType.TENSOR_FLOAT32,)
_F, _I32, _I64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
_VF, _VI = ir.VectorType(_F, LANES), ir.VectorType(_I32, LANES)

#: Cephes' expf: ln 2 in two parts (the first exact in few bits), the polynomial's coefficients.
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
_T_HI, _T_LO = 88.0, -87.0  # exp's argument clamped to where 2^n is a normal float
_T_OVER = 88.72283935546875  # above it float32's exp is inf (ln FLT_MAX, rounded up)
_ROUND = 12582912.0  # 1.5·2^23: v + it - it is v rounded to an integer (|v| < 2^22)


def _c(value: float) -> ir.Constant:
    """A vector of 16 float32 ``value``s (rounded to float32 as numpy would)."""
    return ir.Constant(_VF, [float(np.float32(value))] * LANES)


def _sigmoid_lanes(b, v):
    t = b.fneg(v)
    c = b.select(b.fcmp_ordered("<", t, _c(_T_HI)), t, _c(_T_HI))  # a NaN becomes _T_HI
    c = b.select(b.fcmp_ordered(">", c, _c(_T_LO)), c, _c(_T_LO))
    n = b.fsub(b.fadd(b.fmul(c, _c(np.log2(np.e))), _c(_ROUND)), _c(_ROUND))
    r = b.fsub(b.fsub(c, b.fmul(n, _c(_LN2_HI))), b.fmul(n, _c(_LN2_LO)))
    p = _c(_POLY[0])
    for k in _POLY[1:]:
        p = b.fadd(b.fmul(p, r), _c(k))
    p = b.fadd(b.fadd(b.fmul(p, b.fmul(r, r)), r), _c(1.0))
    exponent = b.add(b.fptosi(n, _VI), ir.Constant(_VI, [127] * LANES))  # in [1, 254]
    e = b.fmul(p, b.bitcast(b.shl(exponent, ir.Constant(_VI, [23] * LANES)), _VF))
    s = b.fdiv(_c(1.0), b.fadd(_c(1.0), e))
    s = b.select(b.fcmp_ordered(">", t, _c(_T_OVER)), _c(0.0), s)
    return b.select(b.fcmp_unordered("uno", v, v), v, s)


def _hard_swish_lanes(b, v):
    c = b.fadd(v, _c(3.0))
    c = b.select(b.fcmp_ordered("<", c, _c(0.0)), _c(0.0), c)  # NaN passes, as through numpy's clip
    c = b.select(b.fcmp_ordered(">", c, _c(6.0)), _c(6.0), c)
    return b.fdiv(b.fmul(v, c), _c(6.0))


def _unary_run(lanes):
    """The intrinsic ``run(x, out, n)``: ``out[:n] = f(x[:n])`` (float32 arrays), 16 lanes at a
    time, ``lanes(builder, vector)`` building f; the last vector masked (nothing past ``n`` read
    or written). Each vector is loaded before it is stored: ``out`` may be ``x``."""
    @intrinsic
    def run(typingctx, x, out, n):
        sig = types.void(x, out, n)

        def codegen(context, builder, signature, args):
            xp = _data(context, builder, signature.args[0], args[0], _F)
            op = _data(context, builder, signature.args[1], args[1], _F)
            n_v = args[2]
            whole = builder.and_(n_v, ir.Constant(_I64, -LANES))
            i, _, close = counted_loop(builder, "lanes", whole, step=LANES)
            _store(builder, lanes(builder, _load(builder, builder.gep(xp, [i]))), builder.gep(op, [i]))
            close()
            with builder.if_then(builder.icmp_signed(">", n_v, whole)):
                keep = _lanes_below(builder, builder.sub(n_v, whole))
                v = _load(builder, builder.gep(xp, [whole]), keep, _c(0.0))
                _store(builder, lanes(builder, v), builder.gep(op, [whole]), keep)
            return context.get_dummy_value()
        return sig, codegen
    return run


_logistic_run, _hard_swish_run = _unary_run(_sigmoid_lanes), _unary_run(_hard_swish_lanes)


@numba.njit(numba.void(ro(np.float32, 1), rw(np.float32, 1)), cache=True, nogil=True)
def logistic(x, out):
    _logistic_run(x, out, out.shape[0])


@numba.njit(numba.void(ro(np.float32, 1), rw(np.float32, 1)), cache=True, nogil=True)
def hard_swish(x, out):
    _hard_swish_run(x, out, out.shape[0])


KERNELS = {LOGISTIC: logistic, HARD_SWISH: hard_swish}


@dataclass
class FloatUnary:
    op: int  # LOGISTIC or HARD_SWISH


def plan(ctx: OperationContext) -> FloatUnary:
    p: ActivationParams = ctx.params
    return FloatUnary(int(p.kind))


def execute(ctx: OperationContext, inputs: list) -> list:
    d: FloatUnary = ctx.data
    x = np.ascontiguousarray(inputs[0], np.float32)
    out = np.empty_like(x)
    if x.size:
        KERNELS[d.op](x.reshape(-1), out.reshape(-1))
    return [out]


def bind(ctx: OperationContext, inputs: list, outputs: list):
    """``execute`` of the fixed contiguous input into the fixed ``outputs[0]``: a zero-argument runner."""
    d: FloatUnary = ctx.data
    x, out = inputs[0], outputs[0]
    if x is None or not x.flags.c_contiguous or x.size == 0:
        return None
    return functools.partial(KERNELS[d.op], x.reshape(-1), out.reshape(-1))


BACKEND.register([LOGISTIC, HARD_SWISH], plan=plan, execute=execute, types=F32_TYPES, bind=bind)
