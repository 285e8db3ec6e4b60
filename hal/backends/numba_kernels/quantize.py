"""QUANTIZE: float32 and float16 to uint8 / int8, bit-exact with the reference backend.

float32: the reference's arithmetic in one native pass: ``x / scale`` divided in float32 (never
multiplied by a reciprocal), NaN to 0 and infinities to the bounds, clamped to the type's range
minus the zero point (integers, so clamping before rounding is clamping after), std::round (half
away from zero, from the exact fractional part), plus the zero point.

float16: a half has 65,536 bit patterns, so at plan time the reference kernel (through the float32
adapter that widens halves, exactly, as it runs float16 operations) quantizes every one of them,
and execution is one table lookup per element — no widened copy of the input.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numba
import numpy as np

from hal import backends, quant
from hal.backends.numba_kernels import BACKEND
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.operations.common import F16, F32
from hal.operations.quantization import QUANTIZE
from hal.registry import OperationContext, lookup
from hal.types import NUMPY_DTYPE


@dataclass
class QuantizeData:
    scale: float  # a float32 value
    zero_point: int
    low: float  # bounds of round(x / scale): the type's range minus the zero point
    high: float
    out_type: int
    table: np.ndarray | None = None  # float16 input: the output of every bit pattern (65,536 entries)


def _tabulate(ctx: OperationContext) -> np.ndarray:
    """The reference backend's QUANTIZE of every float16 bit pattern."""
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    g = OperationContext(ctx.index, ctx.op_type, [dataclasses.replace(ctx.input(0), shape=halves.shape, value=None)],
                         [dataclasses.replace(ctx.output(0), shape=halves.shape)])
    g.params = lookup(ctx.op_type).prepare(g)
    kernel = backends.get(backends.REFERENCE).kernel(ctx.op_type).for_context(g)
    g.data = kernel.plan(g)
    return np.ascontiguousarray(kernel.execute(g, [halves])[0])


def plan(ctx: OperationContext) -> QuantizeData:
    out = ctx.output(0)
    lo, hi = quant.quant_range(out.type)
    return QuantizeData(float(np.float32(out.scale)), int(out.zero_point), float(lo - out.zero_point),
                        float(hi - out.zero_point), int(out.type), _tabulate(ctx) if ctx.input(0).type == F16 else None)


_F = numba.float32
_SIGS = [numba.void(ro(np.float32, 1), _F, _F, _F, numba.int64, rw(t, 1)) for t in (np.uint8, np.int8)]


@njit(_SIGS, cache=True, nogil=True)
def _quantize(x, scale, low, high, zero_point, out):
    """Every step in float32 (the integers involved are exact), branch-free: it vectorises."""
    half, one, zero = np.float32(0.5), np.float32(1), np.float32(0)
    zp = np.float32(zero_point)
    for i in range(x.shape[0]):
        v = x[i] / scale  # float32 / float32: a float32 division
        v = zero if v != v else v
        v = low if v < low else (high if v > high else v)
        whole = np.float32(np.trunc(v))
        frac = v - whole  # exact
        r = whole + (one if frac >= half else zero) - (one if frac <= -half else zero) + zp
        out[i] = np.int32(r)


_SIGS_F16 = [numba.void(ro(np.uint16, 1), ro(t, 1), rw(t, 1)) for t in (np.uint8, np.int8)]


@njit(_SIGS_F16, cache=True, nogil=True)
def _lookup(x, table, out):
    for i in range(x.shape[0]):
        out[i] = table[x[i]]


def execute(ctx: OperationContext, inputs: list) -> list:
    d: QuantizeData = ctx.data
    out = np.empty(inputs[0].shape, dtype=NUMPY_DTYPE[d.out_type])
    if d.table is not None:
        if out.size:
            _lookup(np.ascontiguousarray(inputs[0]).reshape(-1).view(np.uint16), d.table, out.reshape(-1))
        return [out]
    x = np.ascontiguousarray(inputs[0], dtype=np.float32)
    if x.size:
        _quantize(x.reshape(-1), np.float32(d.scale), np.float32(d.low), np.float32(d.high), d.zero_point,
                  out.reshape(-1))
    return [out]


def bind(ctx: OperationContext, inputs: list, outputs: list):
    """``execute`` of the fixed contiguous input into the fixed ``outputs[0]``: a zero-argument runner
    (the float16 form, a table, and the float32 one; another input dtype runs ``execute``)."""
    d: QuantizeData = ctx.data
    x, out = inputs[0], outputs[0].reshape(-1)
    if x is None or not x.flags.c_contiguous or x.size == 0:
        return None
    if d.table is not None:
        return functools.partial(_lookup, x.reshape(-1).view(np.uint16), d.table, out) if x.itemsize == 2 else None
    if x.dtype != np.float32:
        return None
    return functools.partial(_quantize, x.reshape(-1), np.float32(d.scale), np.float32(d.low), np.float32(d.high),
                             d.zero_point, out)


BACKEND.register(QUANTIZE, plan=plan, execute=execute, types=(F32, F16), native_float16=True, bind=bind)
