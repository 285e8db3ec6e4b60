"""CONCATENATION of uint8 / int8 tensors, bit-exact with the reference backend.

An input whose quantization is the output's is copied (the reference's own test decides which);
any other is requantized through a table of 256 entries, tabulated at plan time by the reference
kernel itself: one reference execution concatenating, for every input, all 256 byte values, under
the operation's quantizations. Execution writes each input's slab of the output, a table lookup
per element (or a plain copy), in one native pass per input. Copies alone in an output of few rows
(long slabs: nothing native to gain) are declined to the reference's numpy concatenate.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numba
import numpy as np

from hal import backends
from hal.backends.numba_kernels import BACKEND
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.gemm import in_order
from hal.backends.numba_kernels.lazy import njit
from hal.operations.common import QUANT8
from hal.operations.concatenation import axis_input
from hal.registry import OperationContext, lookup
from hal.types import NUMPY_DTYPE, OperationType

CONCATENATION = OperationType.CONCATENATION


@dataclass
class ConcatTables:
    axis: int
    tables: np.ndarray  # [n, 256] raw output bytes: input i's raw byte b becomes tables[i, b]
    copy: tuple[bool, ...]  # per input: its quantization is the output's (the table is the identity)
    out_type: int


#: Copies only, in fewer rows than this: numpy's concatenate (the reference's) is as fast or faster
#: than the native row loop, whose per-call costs are not paid back.
_FEW_ROWS = 1024


def supports(ctx: OperationContext) -> str | None:
    n = axis_input(ctx)
    out = ctx.output(0)
    rows = int(np.prod(ctx.output_shapes[0][:ctx.params.axis], dtype=np.int64)) if ctx.output_shapes[0] else 0
    same = all(ctx.input(i).zero_point == out.zero_point and np.float32(ctx.input(i).scale) == np.float32(out.scale)
               for i in range(n))  # the reference's test for a plain copy
    if same and rows < _FEW_ROWS:
        return f"plain copies in {rows} rows: the reference's numpy concatenate is as fast"
    return None


def plan(ctx: OperationContext) -> ConcatTables:
    n = axis_input(ctx)
    byte = np.arange(256, dtype=np.uint8).view(ctx.input(0).dtype)
    ins = [dataclasses.replace(info, shape=(256,), value=None) for info in ctx.inputs[:n]]
    axis = dataclasses.replace(ctx.inputs[n], value=np.array(0, dtype=np.int32))
    outs = [dataclasses.replace(o, shape=(256 * n,)) for o in ctx.outputs]
    g = OperationContext(ctx.index, ctx.op_type, [*ins, axis], outs)
    g.params = lookup(ctx.op_type).prepare(g)
    kernel = backends.get(backends.REFERENCE).kernel(ctx.op_type).for_context(g)
    g.data = kernel.plan(g)
    tables = kernel.execute(g, [byte] * n + [np.array(0, dtype=np.int32)])[0]
    copy = tuple(r is None for r in g.data.rescale)
    return ConcatTables(int(ctx.params.axis), np.ascontiguousarray(tables.reshape(n, 256)).view(np.uint8), copy,
                        int(ctx.output(0).type))


_SIGS = [numba.void(ro(np.uint8, 2), ro(np.uint8, 1), numba.int64, rw(np.uint8, 2))]


@njit(_SIGS, cache=True, nogil=True)
def _place(x, table, offset, out):
    """out[:, offset:offset + width] = table[x] for x [outer, width] (raw bytes)."""
    width = x.shape[1]
    for o in range(x.shape[0]):
        src = x[o]
        dst = out[o, offset:offset + width]
        for j in range(width):
            dst[j] = table[src[j]]


@njit(_SIGS[:1], cache=True, nogil=True)
def _copy(x, table, offset, out):
    """out[:, offset:offset + width] = x (``table`` unused: the signature of _place)."""
    width = x.shape[1]
    for o in range(x.shape[0]):
        src = x[o]
        dst = out[o, offset:offset + width]
        for j in range(width):  # an element loop: the compiler makes it a vector copy (a slice
            dst[j] = src[j]  # assignment costs numba a call per row)


def execute(ctx: OperationContext, inputs: list) -> list:
    d: ConcatTables = ctx.data
    xs = inputs[:len(d.copy)]
    shape = list(xs[0].shape)
    shape[d.axis] = sum(x.shape[d.axis] for x in xs)
    out = np.empty(shape, dtype=NUMPY_DTYPE[d.out_type])
    if out.size == 0:
        return [out]
    outer = 1
    for n in shape[:d.axis]:
        outer *= n
    out2 = out.reshape(outer, -1).view(np.uint8)
    offset = 0
    for x, table, copy in zip(xs, d.tables, d.copy, strict=True):
        if x.size:
            x2 = np.ascontiguousarray(x).reshape(outer, -1).view(np.uint8)
            (_copy if copy else _place)(x2, table, offset, out2)
            offset += x2.shape[1]
    return [out]


def bind(ctx: OperationContext, inputs: list, outputs: list):
    """``execute`` of the fixed contiguous inputs into the fixed ``outputs[0]``: a zero-argument runner."""
    d: ConcatTables = ctx.data
    xs, out = inputs[:len(d.copy)], outputs[0]
    if out.size == 0 or any(x is None or not x.flags.c_contiguous for x in xs):
        return None
    outer = 1
    for n in out.shape[:d.axis]:
        outer *= n
    out2 = out.reshape(outer, -1).view(np.uint8)
    calls, offset = [], 0
    for x, table, copy in zip(xs, d.tables, d.copy, strict=True):
        if x.size:
            x2 = x.reshape(outer, -1).view(np.uint8)
            calls.append(functools.partial(_copy if copy else _place, x2, table, offset, out2))
            offset += x2.shape[1]
    return in_order(*calls)


BACKEND.register(CONCATENATION, plan=plan, execute=execute, types=QUANT8, supports=supports, bind=bind)
