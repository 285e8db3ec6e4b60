"""Float32 ADD, MUL and PRELU: one native pass over the output, for the float CNNs that run wholly
on this backend (residual additions, per-channel scales and biases, squeeze-excite gates, PReLU
activations), their bound steps called natively one after the other (native_chain.py).

A broadcast operand varies along one contiguous run of the output's dimensions (the others 1 or
absent): the output is then [R, P, Q] with the operand [P]. Two loops cover every such form, each
a plain contiguous loop that LLVM vectorises (numba's own code):

* ``_rows`` (Q = 1: the same shape, a per-channel [C] / [1, 1, 1, C] operand, any suffix): rows
  of the output against the operand's row. A short period (a few dozen channels) is first
  repeated into a row of at least ``WIDE`` floats whose length is a multiple of 16, so the loop
  runs in whole vectors; the repetition is made at each call (the operand may change between
  executions) into a scratch row allocated once per binding.
* ``_blocks`` (Q > 1: a scalar-like [1] operand, or one that is constant over the trailing
  dimensions, as [1, H, W, 1] against [1, H, W, C]): each block of Q outputs against one value.

ADD and MUL are commutative (bit for bit, in IEEE arithmetic): where input 0 is the broadcast one
the inputs are swapped. PRELU's input must have the output's shape (alpha broadcasts). Anything
else (both inputs broadcast, an operand varying along two separate runs of dimensions) declines.

The arithmetic is the reference's: one float32 addition or multiplication, PRELU's
``x if x >= 0 else x * alpha``, then the fused activation's clamp written ``lo if y < lo else y``
so that NaN passes through it as it does through numpy's clip. No fastmath.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numba
import numpy as np

from hal import quant
from hal.backends.numba_kernels import BACKEND
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.operations.elementwise import ADD, MUL, PRELU
from hal.registry import OperationContext
from hal.types import OperandType

F32_TYPES = (OperandType.TENSOR_FLOAT32,)
OPS = {ADD: 0, MUL: 1, PRELU: 2}
#: A period shorter than this is repeated into a row at least this long (a multiple of 16 floats).
WIDE = 256


@numba.njit(inline="always")
def _apply(op, x, y, lo, hi):
    if op == 0:
        v = x + y
    elif op == 1:
        v = x * y
    else:
        v = x if x >= 0 else x * y
    v = lo if v < lo else v
    return hi if v > hi else v


@numba.njit(inline="always")
def _rows_of(op, a, row, width, lo, hi, out):
    n = out.shape[0]
    for start in range(0, n, width):
        m = min(width, n - start)
        src, dst = a[start:start + m], out[start:start + m]
        for j in range(m):
            dst[j] = _apply(op, src[j], row[j], lo, hi)


I64, F32 = numba.int64, numba.float32


@njit(numba.void(I64, ro(np.float32, 1), ro(np.float32, 1), rw(np.float32, 1), F32, F32, rw(np.float32, 1)),
            cache=True, nogil=True)
def _rows(op, a, b, wide, lo, hi, out):
    """out = act(a op b), flat, ``b`` repeating along ``out`` (its size divides out's); ``wide``
    (empty, or room for whole repeats of ``b``) is filled from ``b`` first and read instead."""
    p = b.shape[0]
    if wide.shape[0] > p:
        for r in range(wide.shape[0] // p):
            dst = wide[r * p:(r + 1) * p]
            for j in range(p):
                dst[j] = b[j]
        _rows_of(op, a, wide, wide.shape[0], lo, hi, out)
    else:
        _rows_of(op, a, b, p, lo, hi, out)


@njit(numba.void(I64, ro(np.float32, 1), ro(np.float32, 1), I64, F32, F32, rw(np.float32, 1)),
            cache=True, nogil=True)
def _blocks(op, a, b, blk, lo, hi, out):
    """out = act(a op b) for ``out`` as [R, P, Q] (flat), ``b`` [P] and blocks of ``blk`` = Q."""
    p = b.shape[0]
    for r in range(out.shape[0] // (p * blk)):
        for j in range(p):
            s = b[j]
            o = (r * p + j) * blk
            src, dst = a[o:o + blk], out[o:o + blk]
            for k in range(blk):
                dst[k] = _apply(op, src[k], s, lo, hi)


def pattern(shape, out_shape) -> tuple[int, int, int] | None:
    """(R, P, Q) with ``out_shape`` seen as [R, P, Q] and an operand of ``shape`` (broadcast to it
    by NNAPI's rules) as [P]; None where the operand varies along separate runs of dimensions."""
    s = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    dims = [(int(o), int(d) == int(o)) for o, d in zip(out_shape, s) if o != 1]
    varying = [k for k, (_, v) in enumerate(dims) if v]
    if not varying:
        return 1, 1, math.prod(o for o, _ in dims)
    first, last = varying[0], varying[-1]
    if last - first + 1 != len(varying):
        return None
    return (math.prod(o for o, _ in dims[:first]), math.prod(o for o, _ in dims[first:last + 1]),
            math.prod(o for o, _ in dims[last + 1:]))


@dataclass
class F32Binary:
    op: int  # 0 ADD, 1 MUL, 2 PRELU
    swap: bool  # input 1 is the full-shape operand, input 0 the broadcast one
    blocks: int  # Q: 1 for _rows, else _blocks' block length
    wide: int  # _rows' scratch row length (0: none)
    shape: tuple[int, ...]
    lo: float
    hi: float


def _form(ctx: OperationContext) -> tuple[bool, tuple[int, int, int]] | str:
    """(swap, (R, P, Q)), or why the operation is declined."""
    out = tuple(ctx.params.shape)
    a, b = tuple(ctx.input(0).shape), tuple(ctx.input(1).shape)
    swapped = math.prod(a) != math.prod(out)  # same element count: the output's shape, 1s aside
    if swapped and ctx.op_type == PRELU:
        return f"input shape {list(a)} is broadcast to the output's {list(out)}"
    if swapped and math.prod(b) != math.prod(out):
        return f"both inputs broadcast ({list(a)} and {list(b)} to {list(out)})"
    form = pattern(a if swapped else b, out)
    if form is None:
        return f"input shape {list(a if swapped else b)} broadcasts along separate dimensions of {list(out)}"
    return swapped, form


def supports(ctx: OperationContext) -> str | None:
    form = _form(ctx)
    return form if isinstance(form, str) else None


def plan(ctx: OperationContext) -> F32Binary:
    swap, (r, p, q) = _form(ctx)
    n = r * p * q
    if p == 1:
        q = n  # a scalar-like operand: one block
    wide = 0
    if q == 1 and p < min(WIDE, n):
        wide = p * (16 // math.gcd(p, 16))  # whole repeats, a multiple of 16 floats
        wide = min(wide * -(-WIDE // wide), n)  # the last row may be partial: whole repeats still
    lo, hi = quant.activation_range_float(ctx.params.act)  # NONE for PRELU
    return F32Binary(OPS[ctx.op_type], swap, q, wide if wide > p else 0, tuple(ctx.params.shape), lo, hi)


def _call(d: F32Binary, a: np.ndarray, b: np.ndarray, out: np.ndarray):
    if d.swap:
        a, b = b, a
    lo, hi = np.float32(d.lo), np.float32(d.hi)
    a, b, out = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    if d.blocks > 1:
        return functools.partial(_blocks, d.op, a, b, d.blocks, lo, hi, out)
    return functools.partial(_rows, d.op, a, b, np.empty(d.wide, np.float32), lo, hi, out)


def execute(ctx: OperationContext, inputs: list) -> list:
    d: F32Binary = ctx.data
    out = np.empty(d.shape, np.float32)
    if out.size:
        _call(d, np.ascontiguousarray(inputs[0]), np.ascontiguousarray(inputs[1]), out)()
    return [out]


def bind(ctx: OperationContext, inputs: list, outputs: list):
    """``execute`` of the fixed contiguous inputs into the fixed ``outputs[0]``: a zero-argument
    runner (its scratch row, if any, allocated here once)."""
    a, b = inputs[0], inputs[1]
    if a is None or b is None or not (a.flags.c_contiguous and b.flags.c_contiguous) or outputs[0].size == 0:
        return None
    return _call(ctx.data, a, b, outputs[0])


BACKEND.register([ADD, MUL, PRELU], plan=plan, execute=execute, types=F32_TYPES, supports=supports, bind=bind)
