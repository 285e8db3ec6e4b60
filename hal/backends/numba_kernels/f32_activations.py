"""Float32 LOGISTIC, TANH and HARD_SWISH, and hal.fusion's ``swish`` (LOGISTIC(x), then MUL of x and
it): one native pass over the flattened tensor, for the float CNNs that run wholly on this backend
(EfficientNet's swish and squeeze-excite gates, MobileNetV3's hard-swish activations; a
recurrence's TANH, so that a WHILE loop's body runs wholly here). A
convolution's activation is applied in its epilogue instead (hal.fusion's ``conv_epilogue``); these
passes take the others.

Each is a run of 16-lane float vectors written as LLVM vector IR (a numba intrinsic on f32_simd.py's
loads and stores), the last vector masked, so that any length (a squeeze-excite gate of a few
dozen channels) takes whole vectors; no branch on the data (selects). LLVM's own vectoriser, held
to 256-bit vectors on AVX-512 machines, ran LOGISTIC 1.45x slower. The functions themselves, and
how close each is to the reference: f32_lanes.py. The fused swish is the reference's two
operations' float32 roundings in one pass: it writes neither LOGISTIC's tensor nor reads it back.
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
from hal.backends.numba_kernels.f32_elementwise import F32Binary
from hal.backends.numba_kernels.f32_lanes import (
    ACT_HARD_SWISH,
    ACT_SWISH,
    const,
    hard_swish_lanes,
    sigmoid_lanes,
    swish_lanes,
    tanh_lanes,
)
from hal.backends.numba_kernels.f32_simd import LANES, _lanes_below, _load, _store
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.backends.numba_kernels.simd import _data, counted_loop
from hal.operations.activations import HARD_SWISH, LOGISTIC, TANH, ActivationParams
from hal.registry import OperationContext
from hal.types import OperandType

F32_TYPES = (OperandType.TENSOR_FLOAT32,)
_F, _I64 = ir.FloatType(), ir.IntType(64)


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
                v = _load(builder, builder.gep(xp, [whole]), keep, const(0.0))
                _store(builder, lanes(builder, v), builder.gep(op, [whole]), keep)
            return context.get_dummy_value()
        return sig, codegen
    return run


_logistic_run, _hard_swish_run, _swish_run, _tanh_run = (
    _unary_run(f) for f in (sigmoid_lanes, hard_swish_lanes, swish_lanes, tanh_lanes))


@njit(numba.void(ro(np.float32, 1), rw(np.float32, 1)), cache=True, nogil=True)
def logistic(x, out):
    _logistic_run(x, out, out.shape[0])


@njit(numba.void(ro(np.float32, 1), rw(np.float32, 1)), cache=True, nogil=True)
def hard_swish(x, out):
    _hard_swish_run(x, out, out.shape[0])


@njit(numba.void(ro(np.float32, 1), rw(np.float32, 1)), cache=True, nogil=True)
def swish(x, out):
    _swish_run(x, out, out.shape[0])


@njit(numba.void(ro(np.float32, 1), rw(np.float32, 1)), cache=True, nogil=True)
def tanh(x, out):
    _tanh_run(x, out, out.shape[0])


#: By operation; SWISH (not an operation code): hal.fusion's ``swish``.
SWISH = -1
KERNELS = {LOGISTIC: logistic, HARD_SWISH: hard_swish, SWISH: swish, TANH: tanh}


@dataclass
class FloatUnary:
    op: int  # LOGISTIC, TANH, HARD_SWISH or SWISH


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


def activation_of(member) -> int | None:
    """The f32_lanes ``ACT_*`` code of a step this backend planned as a float32 HARD_SWISH or a
    fused swish (a ``conv_epilogue``'s activation member), or None (float16 operations reach
    these kernels widened, with the same plan: not theirs to fuse)."""
    d = member.ctx.data
    if not isinstance(d, FloatUnary):
        return None
    return {HARD_SWISH: ACT_HARD_SWISH, SWISH: ACT_SWISH}.get(d.op) if output_of(member).type in F32_TYPES else None


def output_of(member):
    """The operand a step writes: a fused swish's is its MUL's."""
    return member.ctx.members[-1].ctx.outputs[0] if member.spec is None else member.ctx.outputs[0]


def plan_swish(ctx) -> FloatUnary | None:
    """hal.fusion's ``swish`` on float32: the members' plans are this module's LOGISTIC and
    f32_elementwise's MUL of x and LOGISTIC(x), without an activation of its own (reads plans and
    shapes only: a plan from the compilation cache has no parameters)."""
    logistic, mul = ctx.members
    ld, md = logistic.ctx.data, mul.ctx.data
    if not isinstance(ld, FloatUnary) or ld.op != LOGISTIC or not isinstance(md, F32Binary) \
            or (md.lo, md.hi) != (-np.inf, np.inf) \
            or tuple(mul.ctx.outputs[0].shape) != tuple(logistic.ctx.inputs[0].shape):
        return None
    return FloatUnary(SWISH)


BACKEND.register([LOGISTIC, TANH, HARD_SWISH], plan=plan, execute=execute, types=F32_TYPES, bind=bind)
BACKEND.register_fusion("swish", plan=plan_swish, execute=execute, bind=bind)
