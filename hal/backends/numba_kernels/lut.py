"""8-bit element-wise operations as lookup tables, exact by construction.

A quantized element-wise operation of one 8-bit input has 256 possible inputs, one of two 8-bit
inputs 65,536: at plan time the reference backend itself computes the operation on every possible
input (a grid shaped like the operation's inputs), and execution is one native pass of table
lookups. The result is the reference backend's (so TFLite's reference kernels') bit for bit,
whatever the arithmetic — the 64-bit requantization products that do not vectorise are paid once
per plan, not per element.

Binary: ADD, SUB, MUL (same 8-bit type in and out). These are also computed directly, 16 lanes at
a time, with TFLite's integer arithmetic (simd.add_run: two input scalings in 32-bit lanes and one
requantization per element; mul_run: one requantization; several times faster than a lookup in a
64 KiB table); plan uses that kernel only after checking it against the table on all 65,536 input
pairs, so it is exact by the same construction.
Unary: LOGISTIC, TANH, HARD_SWISH, RELU, RELU1, RELU6 (8-bit in and out) and DEQUANTIZE (8-bit in,
float32 out); an 8-bit table is looked up 64 bytes at a time where the CPU has AVX-512 VBMI. Broadcasting: an input
shaped like a suffix of the output (a per-channel scale, a squeeze-excite gate) is read
cyclically; any other broadcast is materialised first.

Fused (hal.fusion): ``swish``, LOGISTIC(x) then MUL(x, LOGISTIC(x)), one 256-entry table from the
two member plans, so one lookup pass instead of a lookup pass and a multiplication pass.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numba
import numpy as np

from hal import backends
from hal.backends.numba_kernels import BACKEND, vnni
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.backends.numba_kernels.simd import add_run, mul_run

if vnni.VBMI:
    from hal.backends.numba_kernels.vnni import lookup_run
from hal.operations.common import QUANT8
from hal.registry import OperationContext, lookup
from hal.types import OperationType as Op

_VBMI = vnni.VBMI
BINARY = (Op.ADD, Op.SUB, Op.MUL)
UNARY = (Op.LOGISTIC, Op.TANH, Op.HARD_SWISH, Op.RELU, Op.RELU1, Op.RELU6, Op.DEQUANTIZE)


@dataclass
class TableData:
    table: np.ndarray  # 256 (unary) or 65536 (binary, index a·256 + b over the raw bytes) entries; none
    # (the output dtype only) when ``arith`` computes the binary operation
    shape: tuple[int, ...]  # output shape
    #: Binary: simd.add_run / mul_run's int32 parameters, when they reproduce ``table`` (else None)
    arith: np.ndarray | None = None
    mul: bool = False


def _grid(dtype: np.dtype, inputs: int) -> list[np.ndarray]:
    """Every raw byte value (as ``dtype``), or every pair: input 0 is the high byte of the index."""
    byte = np.arange(256, dtype=np.uint8).view(dtype)
    if inputs == 1:
        return [byte]
    return [np.repeat(byte, 256), np.tile(byte, 256)]


def tabulate(ctx: OperationContext, inputs: int) -> np.ndarray:
    """The reference backend's results for every possible input, through the operation's own spec
    (prepare on the grid's shapes) and the reference kernel (plan, execute)."""
    grid = _grid(ctx.input(0).dtype, inputs)
    n = grid[0].size
    ins = [dataclasses.replace(info, shape=(n,), value=None) if k < inputs else info
           for k, info in enumerate(ctx.inputs)]
    outs = [dataclasses.replace(o, shape=(n,)) for o in ctx.outputs]
    g = OperationContext(ctx.index, ctx.op_type, ins, outs)
    g.params = lookup(ctx.op_type).prepare(g)
    kernel = backends.get(backends.REFERENCE).kernel(ctx.op_type).for_context(g)
    g.data = kernel.plan(g)
    return np.ascontiguousarray(kernel.execute(g, grid)[0])


def plan(ctx: OperationContext) -> TableData:
    n = 2 if ctx.op_type in BINARY else 1
    d = TableData(tabulate(ctx, n), tuple(ctx.params.shape) if n == 2 else tuple(ctx.input(0).shape))
    if n == 2:
        _plan_arith(ctx, d)
    return d


def _plan_arith(ctx: OperationContext, d: TableData) -> None:
    """The direct kernel's parameters (the reference plan's, i.e. TFLite's OpData), kept only if it
    gives ``d.table`` on every input pair."""
    ref = backends.get(backends.REFERENCE).kernel(ctx.op_type).plan(ctx)
    if ctx.op_type == Op.MUL:
        shift = ref.output_shift
        p = [ref.input1_offset, ref.input2_offset, ref.output_multiplier, max(shift, 0), max(-shift, 0), 0, 0, 0, 0]
    else:
        p = [ref.input1_offset, ref.input2_offset, ref.left_shift, ref.input1_multiplier, -ref.input1_shift,
             ref.input2_multiplier, -ref.input2_shift, ref.output_multiplier, -ref.output_shift]
    params = np.array(p + [ref.output_offset, ref.act_min, ref.act_max], dtype=np.int64)
    if (np.abs(params) >= 1 << 31).any() or (params[[3, 5, 7] if ctx.op_type != Op.MUL else [2]] == -(1 << 31)).any():
        return
    params = params.astype(np.int32)
    grid = _grid(d.table.dtype, 2)
    got = np.empty(grid[0].size, dtype=d.table.dtype)
    _arith(ctx.op_type == Op.MUL, grid[0], grid[0].size, grid[1], grid[1].size, params, got)
    if np.array_equal(got, d.table):  # the 64 KiB table is then only its dtype (plans are cached)
        d.arith, d.mul, d.table = params, ctx.op_type == Op.MUL, d.table[:0].copy()


_Q8 = (np.int8, np.uint8)
_UNARY_SIGS = [numba.void(ro(np.uint8, 1), ro(t, 1), rw(t, 1)) for t in (*_Q8, np.float32)]
_BINARY_SIGS = [numba.void(ro(np.uint8, 1), numba.int64, ro(np.uint8, 1), numba.int64, ro(t, 1), rw(t, 1))
                for t in _Q8]


@njit(_UNARY_SIGS, cache=True, nogil=True)
def _lookup1(x, table, out):
    for i in range(x.shape[0]):
        out[i] = table[x[i]]


if vnni.VBMI:
    @njit(numba.void(ro(np.uint8, 1), ro(np.uint8, 1), rw(np.uint8, 1)), cache=True, nogil=True)
    def _lookup_bytes(x, table, out):
        """_lookup1 for an 8-bit table (raw bytes), 64 elements per step (vnni.lookup_run)."""
        lookup_run(x, 0, table, out, 0, x.shape[0])


@njit(_BINARY_SIGS, cache=True, nogil=True)
def _lookup2(a, period_a, b, period_b, table, out):
    # out is walked in blocks of the shorter period (which divides the longer): no division per element
    block = min(period_a, period_b)
    for start in range(0, out.shape[0], block):
        ia, ib = start % period_a, start % period_b
        for j in range(block):
            out[start + j] = table[(np.int64(a[ia + j]) << 8) | np.int64(b[ib + j])]


_ARITH_SIGS = [numba.void(numba.boolean, ro(t, 1), numba.int64, ro(t, 1), numba.int64, ro(np.int32, 1), rw(t, 1))
               for t in _Q8]


#: A repeating operand shorter than this is repeated into a row about this long first: the kernel's
#: rows then hold several repeats (a squeeze-excite gate over 32 channels: 8 pixels a row, not 1),
#: so its per-row work (the row's bounds, the masked tail) is paid once per several pixels.
WIDE_ROW = 256


@numba.njit(inline="always")
def _whole(mul, a, b, period, params, out, n):
    """One call over all n elements, ``b`` repeating every ``period``; a short period is widened
    first (``b``'s repeats copied into a row of about WIDE_ROW: whole repeats, at most n)."""
    if period < WIDE_ROW and period < n:
        reps = min(WIDE_ROW // period, n // period)
        w = np.empty(reps * period, dtype=b.dtype)
        for r in range(reps):
            w[r * period:(r + 1) * period] = b[:period]
        if mul:
            mul_run(a, 0, w, 0, params, out, 0, n, reps * period)
        else:
            add_run(a, 0, w, 0, params, out, 0, n, reps * period)
    elif mul:
        mul_run(a, 0, b, 0, params, out, 0, n, period)
    else:
        add_run(a, 0, b, 0, params, out, 0, n, period)


@njit(_ARITH_SIGS, cache=True, nogil=True)
def _arith(mul, a, period_a, b, period_b, params, out):
    """The binary operation computed: in one call where an operand is whole and the other whole
    or repeating (a per-channel scale, a squeeze-excite gate: its period one row of the call,
    widened to several repeats), else in blocks like ``_lookup2``'s. A repeating first operand is
    passed second, with its parameters (zero point; ADD's multiplier and shift) swapped: both
    operations treat their operands alike."""
    n = out.shape[0]
    if period_a < period_b == n:
        swapped = params.copy()
        swapped[0], swapped[1] = params[1], params[0]
        if not mul:
            swapped[3], swapped[4], swapped[5], swapped[6] = params[5], params[6], params[3], params[4]
        _whole(mul, b, a, period_a, swapped, out, n)
        return
    if period_a == n:
        _whole(mul, a, b, period_b, params, out, n)
        return
    block = min(period_a, period_b)
    for start in range(0, n, block):
        ia, ib = start % period_a, start % period_b
        if mul:
            mul_run(a, ia, b, ib, params, out, start, block, block)
        else:
            add_run(a, ia, b, ib, params, out, start, block, block)


def _operand(x: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """(raw bytes, period): an input shaped like a suffix of ``shape`` repeats every x.size elements."""
    if x.shape != shape and x.size != 1:
        dims = list(x.shape)
        while dims and dims[0] == 1:
            dims.pop(0)
        if not dims or tuple(dims) != tuple(shape[len(shape) - len(dims):]):
            x = np.broadcast_to(x, shape)
    flat = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    return flat, max(flat.size, 1)


def execute(ctx: OperationContext, inputs: list) -> list:
    d: TableData = ctx.data
    table = d.table
    out = np.empty(d.shape, dtype=table.dtype)
    if table.size == 256:
        x = inputs[0]
        x = (x if x.flags.c_contiguous else np.ascontiguousarray(x)).reshape(-1).view(np.uint8)
        if _VBMI and table.itemsize == 1:
            _lookup_bytes(x, table.view(np.uint8), out.reshape(-1).view(np.uint8))
        else:
            _lookup1(x, table, out.reshape(-1))
    else:
        (a, pa), (b, pb) = _operand(inputs[0], d.shape), _operand(inputs[1], d.shape)
        if d.arith is not None:
            _arith(d.mul, a.view(out.dtype), pa, b.view(out.dtype), pb, d.arith, out.reshape(-1))
        else:
            _lookup2(a, pa, b, pb, d.table, out.reshape(-1))
    return [out]


def bind(ctx: OperationContext, inputs: list, outputs: list):
    """``execute`` of the fixed inputs into the fixed ``outputs[0]`` as a zero-argument runner; None
    where an input would be broadcast into a copy (its contents are read per execution)."""
    d: TableData = ctx.data
    table, out = d.table, outputs[0].reshape(-1)
    if any(x is None or not x.flags.c_contiguous for x in inputs[:1 if table.size == 256 else 2]):
        return None
    if table.size == 256:
        x = inputs[0].reshape(-1).view(np.uint8)
        if _VBMI and table.itemsize == 1:
            return functools.partial(_lookup_bytes, x, table.view(np.uint8), out.view(np.uint8))
        return functools.partial(_lookup1, x, table, out)
    operands = [_operand(x, d.shape) for x in inputs[:2]]
    if any(not np.may_share_memory(flat, x) and not info.is_constant
           for (flat, _), x, info in zip(operands, inputs, ctx.inputs)):
        return None
    (a, pa), (b, pb) = operands
    if d.arith is not None:
        return functools.partial(_arith, d.mul, a.view(out.dtype), pa, b.view(out.dtype), pb, d.arith, out)
    return functools.partial(_lookup2, a, pa, b, pb, d.table, out)


def plan_swish(ctx) -> TableData | None:
    """hal.fusion's ``swish`` (LOGISTIC(x) -> y; MUL of x and y): as a function of x alone, one
    256-entry table, MUL's plan applied to (x, logistic table[x]). Both member plans are the
    reference's results (a tabulated LOGISTIC; a MUL whose arithmetic matched the reference on
    every input pair, or the reference's table), so the fused table is too."""
    logistic, mul = ctx.members
    ld, md = logistic.ctx.data, mul.ctx.data
    if not isinstance(ld, TableData) or not isinstance(md, TableData) or ld.table.size != 256 \
            or ld.table.dtype != md.table.dtype or ld.shape != md.shape:
        return None
    x, y = _grid(ld.table.dtype, 1)[0], ld.table
    a, b = (x, y) if mul.inputs[0] == logistic.inputs[0] else (y, x)
    table = np.empty(256, dtype=md.table.dtype)
    if md.arith is not None:
        _arith(md.mul, a, 256, b, 256, md.arith, table)
    else:
        _lookup2(a.view(np.uint8), 256, b.view(np.uint8), 256, md.table, table)
    return TableData(table, md.shape)


BACKEND.register(BINARY, plan=plan, execute=execute, types=QUANT8, bind=bind)
BACKEND.register(UNARY, plan=plan, execute=execute, types=QUANT8, bind=bind)
BACKEND.register_fusion("swish", plan=plan_swish, execute=execute, bind=bind)
