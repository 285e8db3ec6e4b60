"""Quantized (uint8 / int8) MEAN over a contiguous run of axes: one native pass, sums and
requantization fused.

A contiguous run of reduced axes views the input as ``[outer, reduced, inner]`` (C order): the
spatial mean of NHWC (axes [1, 2] of a rank-4 tensor) is ``[N, H·W, C]``, a mean over the last
axis ``[rows, K, 1]``. Sums are int32 vectors over the contiguous ``inner`` elements (64 of them
held in registers over all the rows: ``_column_sums``), or one int32 sum per contiguous row when
``inner`` is 1. Then, per output, the reference kernel's (TFLite 2.14 QuantizedMeanOrSum) arithmetic:
``MultiplyByQuantizedMultiplier(sum - count·in_zp, M', shift') + out_zp``, saturated to the type,
with the reference backend's own M' and shift' (its plan). int32 sums that wrap are still exact:
MultiplyByQuantizedMultiplier wraps its (shifted) argument to int32, and that only depends on the
sum modulo 2^32. Other axis sets (not one contiguous run, or none) fall back to the reference.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hal import quant
from hal.backends.numba_kernels import BACKEND
from hal.backends.numba_kernels.fixedpoint import clamp, multiply_by_quantized_multiplier, ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.backends.numba_kernels.simd import LANES, counted_loop, masked_load, masked_store, splat
from hal.backends.reference import reduce as reference
from hal.operations.common import QUANT8
from hal.operations.reduce import MEAN, ReduceParams
from hal.registry import OperationContext


@dataclass
class MeanData:
    outer: int
    count: int  # reduced elements per output
    inner: int
    out_shape: tuple[int, ...]
    bias: int  # count · input zero point
    multiplier: int
    shift: int
    output_zero_point: int
    qmin: int
    qmax: int


def _run(p: ReduceParams) -> bool:
    return bool(p.axes) and list(p.axes) == list(range(p.axes[0], p.axes[-1] + 1))


def supports(ctx: OperationContext) -> str | None:
    p: ReduceParams = ctx.params
    if ctx.output(0).type not in QUANT8:
        return "output is not 8-bit quantized"
    if not _run(p):
        return f"axes {list(p.axes)} are not one contiguous run"
    return None


def plan(ctx: OperationContext) -> MeanData:
    p: ReduceParams = ctx.params
    ref = reference.plan_mean(ctx)  # the multiplier with 1/count folded in, exactly as the reference's
    shape = ctx.input(0).shape
    a, b = p.axes[0], p.axes[-1] + 1
    qmin, qmax = quant.quant_range(ctx.output(0).type)
    return MeanData(math.prod(shape[:a]), math.prod(shape[a:b]), math.prod(shape[b:]), tuple(ref.out_shape),
                    ref.count * ref.input_zero_point, ref.multiplier, ref.shift, ref.output_zero_point, qmin, qmax)


# ---- native kernels ---------------------------------------------------------------------------

I64 = numba.int64
Q8 = (np.int8, np.uint8)


#: Channels a full pass of ``_column_sums`` holds in registers (GROUPS int32 vectors of LANES).
GROUPS = 4


@intrinsic
def _column_sums(typingctx, x, x_off, rows, inner, sums):
    """``sums[c] = Σ_r x[x_off + r·inner + c]`` in int32 (wrapping) for c < ``inner``: passes over
    the rows holding GROUPS·LANES channels' sums in registers (one widening load and one add per
    16 channels per row), then passes of LANES channels for the rest (the last one's lanes past
    ``inner`` masked off), so that a row of a few dozen channels is not left to a scalar loop."""
    sig = types.void(x, x_off, rows, inner, sums)
    signed = x.dtype == types.int8

    def codegen(context, builder, signature, args):
        x_arr, x_off_v, rows_v, inner_v, s_arr = args
        i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
        v32, v8 = ir.VectorType(i32, LANES), ir.VectorType(i8, LANES)
        sa = signature.args
        x_ptr = builder.bitcast(context.make_array(sa[0])(context, builder, x_arr).data, i8.as_pointer())
        s_ptr = builder.bitcast(context.make_array(sa[4])(context, builder, s_arr).data, i32.as_pointer())
        lanes = ir.Constant(v32, list(range(LANES)))
        zero8, zero32 = ir.Constant(v8, [0] * LANES), ir.Constant(v32, [0] * LANES)

        def one_pass(c0, groups: int) -> None:
            keeps = []
            for g in range(groups):
                left = builder.sub(inner_v, builder.add(c0, ir.Constant(i64, g * LANES)))
                left = builder.select(builder.icmp_signed("<", left, ir.Constant(i64, LANES)), left,
                                      ir.Constant(i64, LANES))
                keeps.append(builder.icmp_signed("<", lanes, splat(builder, builder.trunc(left, i32), v32)))
            r, accs, close = counted_loop(builder, "sums", rows_v, [zero32] * groups)
            row = builder.add(builder.add(x_off_v, builder.mul(r, inner_v)), c0)
            new = []
            for g, (acc, keep) in enumerate(zip(accs, keeps)):
                ptr = builder.gep(x_ptr, [builder.add(row, ir.Constant(i64, g * LANES))])
                v = masked_load(builder, ptr, v8, keep, zero8)
                new.append(builder.add(acc, builder.sext(v, v32) if signed else builder.zext(v, v32)))
            close(new)
            for g, (acc, keep) in enumerate(zip(accs, keeps)):
                masked_store(builder, acc, builder.gep(s_ptr, [builder.add(c0, ir.Constant(i64, g * LANES))]), keep)

        width = ir.Constant(i64, GROUPS * LANES)
        full = builder.mul(builder.sdiv(inner_v, width), width)
        with cgutils.for_range_slice(builder, ir.Constant(i64, 0), full, width) as (c0, _):
            one_pass(c0, GROUPS)
        with cgutils.for_range_slice(builder, full, inner_v, ir.Constant(i64, LANES)) as (c0, _):
            one_pass(c0, 1)
        return context.get_dummy_value()
    return sig, codegen


@njit([numba.void(ro(t, 3), *[I64] * 6, rw(t, 2)) for t in Q8], cache=True, nogil=True)
def _mean_strided(x, bias, mult, shift, out_zp, lo, hi, out):
    """x [outer, count, inner] -> out [outer, inner]: int32 sums over axis 1, inner contiguous."""
    outer, count, inner = x.shape
    acc = np.empty(inner, dtype=np.int32)
    flat = x.reshape(-1)
    for o in range(outer):
        _column_sums(flat, o * count * inner, count, inner, acc)
        for i in range(inner):
            v = multiply_by_quantized_multiplier(np.int64(acc[i]) - bias, mult, shift) + out_zp
            out[o, i] = clamp(v, lo, hi)


@njit([numba.void(ro(t, 2), *[I64] * 6, rw(t, 1)) for t in Q8], cache=True, nogil=True)
def _mean_rows(x, bias, mult, shift, out_zp, lo, hi, out):
    """x [outer, count] -> out [outer]: one int32 sum per contiguous row."""
    outer, count = x.shape
    for o in range(outer):
        s = np.int32(0)
        for r in range(count):
            s = np.int32(s + np.int32(x[o, r]))  # int32 adds (numba would widen to int64)
        v = multiply_by_quantized_multiplier(np.int64(s) - bias, mult, shift) + out_zp
        out[o] = clamp(v, lo, hi)


def execute(ctx: OperationContext, inputs: list) -> list:
    d: MeanData = ctx.data
    x = np.ascontiguousarray(inputs[0])
    out = np.empty(d.out_shape, dtype=x.dtype)
    if out.size == 0:
        return [out]
    if d.count == 0:  # an empty reduction: the reference gives 0 (TFLite's integer fill)
        out[...] = 0
        return [out]
    args = (d.bias, d.multiplier, d.shift, d.output_zero_point, d.qmin, d.qmax)
    if d.inner == 1:
        _mean_rows(x.reshape(d.outer, d.count), *args, out.reshape(d.outer))
    else:
        _mean_strided(x.reshape(d.outer, d.count, d.inner), *args, out.reshape(d.outer, d.inner))
    return [out]


def bind(ctx: OperationContext, inputs: list, outputs: list):
    """``execute`` of the fixed contiguous input into the fixed ``outputs[0]``: a zero-argument runner."""
    d: MeanData = ctx.data
    x, out = inputs[0], outputs[0]
    if x is None or not x.flags.c_contiguous or out.size == 0 or d.count == 0:
        return None
    args = (d.bias, d.multiplier, d.shift, d.output_zero_point, d.qmin, d.qmax)
    if d.inner == 1:
        return functools.partial(_mean_rows, x.reshape(d.outer, d.count), *args, out.reshape(d.outer))
    return functools.partial(_mean_strided, x.reshape(d.outer, d.count, d.inner), *args, out.reshape(d.outer, d.inner))


BACKEND.register(MEAN, plan=plan, execute=execute, types=QUANT8, supports=supports, bind=bind)
