"""Float32 SOFTMAX on numba: a classifier's last operation, so that a float CNN whose every
operation the numba backend runs is taken from onnxruntime whole (hal.compiler's
``_whole_run_instead``; f32_conv.py says why).

As the reference computes it (reference_ops::Softmax): along the axis, the maximum, then
exp((x - max)·beta) in float32, their float32 sum, and each exponential over the sum. A NaN makes
its whole row NaN, as numpy's max does in the reference. Along the last axis (a classifier's:
rows of consecutive floats) each pass is 16 lanes at a time in LLVM vector IR (``_row``, exp:
f32_lanes' ``exp_lanes``, about 1 ULP of libm's), the sum in 16 partial sums added at the end;
along another axis, a scalar loop with libm's exp.
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
from hal.backends.numba_kernels.f32_lanes import const, exp_lanes, when
from hal.backends.numba_kernels.f32_simd import _VF, LANES, _lanes_below, _load, _store
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.backends.numba_kernels.simd import _data, counted_loop, splat
from hal.operations.softmax import SoftmaxParams
from hal.registry import OperationContext
from hal.types import OperandType, OperationType

F32 = OperandType.TENSOR_FLOAT32
_F, _I32, _I64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)


@njit([numba.void(ro(np.float32, 3), numba.float32, rw(np.float32, 3))], cache=True, nogil=True)
def softmax(x, beta, out):
    """Over axis 1 of [outer, n, inner]."""
    outer, n, inner = x.shape
    for o in range(outer):
        for i in range(inner):
            m = x[o, 0, i]
            for k in range(1, n):
                v = x[o, k, i]
                if v > m or v != v:  # a NaN stays the maximum
                    m = v
            total = np.float32(0.0)
            for k in range(n):
                e = np.exp((x[o, k, i] - m) * beta)
                out[o, k, i] = e
                total += e
            for k in range(n):
                out[o, k, i] = out[o, k, i] / total


def _reduce(b, v, op):
    """``op(acc, lane)`` over the 16 lanes of ``v``, in lane order."""
    acc = b.extract_element(v, ir.Constant(_I32, 0))
    for k in range(1, LANES):
        acc = op(acc, b.extract_element(v, ir.Constant(_I32, k)))
    return acc


@intrinsic
def _row(typingctx, x, x_off, out, o_off, n, beta):
    """Softmax of the n floats at x[x_off:] into out[o_off:] (the last vector of each pass masked)."""
    sig = types.void(x, x_off, out, o_off, n, beta)

    def codegen(context, builder, signature, args):
        b = builder
        xa, x_off_v, oa, o_off_v, n_v, beta_v = args
        xp = b.gep(_data(context, b, signature.args[0], xa, _F), [x_off_v])
        op = b.gep(_data(context, b, signature.args[2], oa, _F), [o_off_v])
        whole = b.and_(n_v, ir.Constant(_I64, -LANES))
        keep = _lanes_below(b, b.sub(n_v, whole))
        has_tail = b.icmp_signed(">", n_v, whole)

        def max_of(m, v):  # a NaN stays the maximum
            return b.select(b.or_(b.fcmp_ordered(">", v, m), b.fcmp_unordered("uno", v, v)), v, m)
        low = const(-np.inf)
        i, (m,), close = counted_loop(b, "sm.max", whole, [low], step=LANES)
        close([max_of(m, _load(b, b.gep(xp, [i])))])
        m = when(b, has_tail, [m], lambda ms: [max_of(ms[0], _load(b, b.gep(xp, [whole]), keep, low))])[0]
        top = _reduce(b, m, lambda acc, v: b.select(b.or_(b.fcmp_ordered(">", v, acc), b.fcmp_unordered("uno", v, v)),
                                                    v, acc))
        tops, betas = splat(b, top, _VF), splat(b, beta_v, _VF)

        def exps(v):
            t = b.fmul(b.fsub(v, tops), betas)
            return b.select(b.fcmp_unordered("uno", t, t), t, exp_lanes(b, t))
        zero = const(0.0)
        i, (acc,), close = counted_loop(b, "sm.exp", whole, [zero], step=LANES)
        e = exps(_load(b, b.gep(xp, [i])))
        _store(b, e, b.gep(op, [i]))
        close([b.fadd(acc, e)])

        def tail(accs):
            e = exps(_load(b, b.gep(xp, [whole]), keep, zero))
            _store(b, e, b.gep(op, [whole]), keep)
            return [b.fadd(accs[0], b.select(keep, e, zero))]
        acc = when(b, has_tail, [acc], tail)[0]
        totals = splat(b, _reduce(b, acc, b.fadd), _VF)
        i, _, close = counted_loop(b, "sm.div", whole, step=LANES)
        _store(b, b.fdiv(_load(b, b.gep(op, [i])), totals), b.gep(op, [i]))
        close()
        with b.if_then(has_tail):
            _store(b, b.fdiv(_load(b, b.gep(op, [whole]), keep, zero), totals), b.gep(op, [whole]), keep)
        return context.get_dummy_value()
    return sig, codegen


@njit([numba.void(ro(np.float32, 2), numba.float32, rw(np.float32, 2))], cache=True, nogil=True)
def softmax_rows(x, beta, out):
    """Over the last axis of [rows, n]."""
    n = x.shape[1]
    for r in range(x.shape[0]):
        _row(x, r * n, out, r * n, n, beta)


@dataclass
class FloatSoftmax:
    beta: float
    axis: int


def plan(ctx: OperationContext) -> FloatSoftmax:
    p: SoftmaxParams = ctx.params
    return FloatSoftmax(float(np.float32(p.beta)), p.axis)


def _rows(a: np.ndarray, axis: int) -> np.ndarray:
    shape = a.shape
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    return a.reshape(outer, shape[axis], -1)


def _call(d: FloatSoftmax, x: np.ndarray, out: np.ndarray):
    """The kernel's call on contiguous ``x`` and ``out``: the vector rows where the axis is the last."""
    if d.axis == x.ndim - 1:
        n = x.shape[-1]
        return functools.partial(softmax_rows, x.reshape(-1, n), np.float32(d.beta), out.reshape(-1, n))
    return functools.partial(softmax, _rows(x, d.axis), np.float32(d.beta), _rows(out, d.axis))


def execute(ctx: OperationContext, inputs: list) -> list:
    x = np.ascontiguousarray(inputs[0], np.float32)
    out = np.empty_like(x)
    if x.size:
        _call(ctx.data, x, out)()
    return [out]


def bind(ctx: OperationContext, inputs: list, outputs: list):
    x, out = inputs[0], outputs[0]
    if x is None or not x.flags.c_contiguous or x.size == 0:
        return None
    return _call(ctx.data, x, out)


BACKEND.register(OperationType.SOFTMAX, plan=plan, execute=execute, types=(F32,), bind=bind)
