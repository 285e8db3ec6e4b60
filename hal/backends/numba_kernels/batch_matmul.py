"""Quantized (int8) BATCH_MATMUL on the GEMM tiles (gemm.py: AVX-512 VNNI, AMX-INT8 where the
CPU has it), bit-exact with the reference backend and so with TFLite's reference kernel.

Each batch slice is one GEMM: the rows of the left-hand side's slice (transposed first under
adj_x) times the right-hand side's slice as the filter [depth, cols] (transposed under adj_y).
``gemm.make_plan`` folds both zero points: the left-hand side's into a per-column bias, the
right-hand side's into a per-row term; the tiles' epilogue applies TFLite's per-tensor
MultiplyByQuantizedMultiplier (the reference plan's multiplier and shift), the output zero point
and the int8 saturation (BATCH_MATMUL has no fused activation). A constant right-hand side is
packed at plan time, one plan per slice (the AMX tiles take its blocks where they pay); one
computed by the model is packed at each execution (``_pack``: the panels and column sums,
natively) into the arrays of a plan-time template, the packing any GEMM library does per call,
and runs on the VNNI tiles (``gemm.run_repacked``). A left-hand side whose rows are whole 4-byte
blocks is read in place; others are copied into rows padded with bytes that flip to 0 (the row
term sums whole blocks). Without AVX-512 VNNI the operation is left to the next backend.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np

from hal import backends
from hal.backends.numba_kernels import BACKEND, gemm, vnni
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.operations.batch_matmul import BATCH_MATMUL, LHS, RHS, BatchMatmulParams
from hal.operations.common import QS8
from hal.registry import OperationContext

#: int8 values of the padding bytes of a copied left-hand side row: 0x80, which the tiles' flip of
#: int8 activations (XOR 0x80) makes 0
_PAD = -128


@dataclass
class IntBatchMatmul:
    adj_x: bool
    adj_y: bool
    slices: int  # the batch dimensions' product
    rows: int
    depth: int
    cols: int
    lhs_zp: int
    rhs_zp: int
    output_zp: int
    multiplier: int
    shift: int  # TFLite's: positive left, negative right
    #: gemm.GemmPlan per slice of a constant right-hand side; None: packed at each execution
    plans: list | None = None
    #: a computed right-hand side's: the plan of an all-zero one (shapes, requantization, the
    #: bias's constant term), whose packed weights and bias each slice's replace
    template: gemm.GemmPlan | None = None


def supports(ctx: OperationContext) -> str | None:
    return None if vnni.AVAILABLE else "the int8 GEMM tiles need AVX-512 VNNI"


def plan(ctx: OperationContext) -> IntBatchMatmul:
    p: BatchMatmulParams = ctx.params
    ref = backends.get(backends.REFERENCE).kernel(BATCH_MATMUL).plan(ctx)  # TFLite's multiplier and offsets
    d = IntBatchMatmul(p.adj_x, p.adj_y, int(np.prod(p.batch, dtype=np.int64)), p.rows, p.depth, p.cols,
                       -ref.lhs_offset, -ref.rhs_offset, ref.output_offset, ref.multiplier, ref.shift)
    y = ctx.input(RHS)
    if y.is_constant:
        d.plans = [_plan(d, w) for w in _slices(d, y.value)]
    else:
        d.template = _plan(d, np.zeros((d.depth, d.cols), dtype=np.int8))
    return d


def _slices(d: IntBatchMatmul, y: np.ndarray) -> list[np.ndarray]:
    """The right-hand side's slices as [depth, cols] (views)."""
    return [w.T if d.adj_y else w for w in np.asarray(y, dtype=np.int8).reshape(d.slices, *y.shape[-2:])]


def _plan(d: IntBatchMatmul, w2d: np.ndarray) -> gemm.GemmPlan:
    per_column = functools.partial(np.full, d.cols, dtype=np.int64)
    return gemm.make_plan(np.ascontiguousarray(w2d), d.rhs_zp, np.zeros(d.cols, dtype=np.int32), np.int8, d.lhs_zp,
                          per_column(d.multiplier), per_column(d.shift), d.output_zp, -128, 127)


@njit(numba.void(ro(np.int8, 2), numba.boolean, numba.int64, numba.int64, rw(np.int8, 1), rw(np.int32, 1)),
            cache=True, nogil=True)
def _pack(w, transposed, kq, x_term, packed, bias):
    """gemm.make_plan's packing of a [depth, cols] slice (stored [cols, depth] where ``transposed``)
    into ``packed`` (panel, 4-byte block q, column, k; already zero past depth and cols) and its
    folded bias: ``bias`` holds the template's constant term and gains ``x_term``·Σ column, wrapped
    as the int32 accumulator."""
    depth, cols = (w.shape[1], w.shape[0]) if transposed else (w.shape[0], w.shape[1])
    for c in range(cols):
        p, col = c // 16, c % 16
        s = np.int64(0)
        for k in range(depth):
            v = w[c, k] if transposed else w[k, c]
            packed[((p * kq + k // 4) * 16 + col) * 4 + k % 4] = v
            s += np.int64(v)
        bias[c] = np.int32(((np.int64(bias[c]) + x_term * s + (1 << 31)) & 0xFFFFFFFF) - (1 << 31))


if vnni.AVAILABLE:
    _NO_AMX, _NO_TABLE = np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.uint8)
    I64 = numba.int64

    @njit(numba.void(ro(np.uint8, 1), I64, ro(np.int8, 3), numba.boolean, I64, I64, rw(np.int8, 1),
                           ro(np.int32, 1), rw(np.int32, 1), I64, I64, I64, ro(np.int32, 1), ro(np.int32, 1),
                           ro(np.int64, 1), I64, I64, rw(np.uint8, 1), I64), cache=True, nogil=True)
    def _computed_slices(x, depth, ys, transposed, kq, x_term, packed, template_bias, bias, rows, cols, row_coef,
                         mult, left, rq, out_zp, a_xor, out, flags):
        """Every slice of a computed right-hand side ``ys`` in one call, on one thread: packed
        (``_pack``), then its rows of ``x`` (read in place, ``depth`` bytes each) on the VNNI tiles
        with the template's requantization, into ``out``."""
        for s in range(ys.shape[0]):
            bias[:] = template_bias
            _pack(ys[s], transposed, kq, x_term, packed, bias)
            gemm._gemm_rows(x, s * rows * depth, depth, rows, a_xor, packed, kq, cols, bias, row_coef, mult, left, rq,
                            out_zp, -128, 127, _NO_AMX, 0, out, s * rows * cols, cols, 0, rows, _NO_TABLE, flags)


def run(d: IntBatchMatmul, x: np.ndarray, y: np.ndarray | None, out: np.ndarray) -> None:
    """``out`` (int8, [..., rows, cols], contiguous) from the left-hand side ``x`` and, where the
    plan has no packed slices, the right-hand side ``y``."""
    plan0 = d.plans[0] if d.plans is not None else d.template
    kp = plan0.kq * gemm.KSTEP
    xs = x.reshape(d.slices, *x.shape[-2:])
    ob = out.reshape(-1).view(np.uint8)
    in_place = not d.adj_x and kp == d.depth and xs.flags.c_contiguous
    flat = xs.reshape(-1).view(np.uint8) if in_place else None
    if d.plans is None:  # a computed right-hand side: packed into copies of the template's arrays
        t = d.template
        ys = np.ascontiguousarray(y, dtype=np.int8).reshape(d.slices, *y.shape[-2:])
        packed, bias, x_term = t.packed.copy(), np.empty_like(t.bias), -128 - d.lhs_zp  # zeros: the padding stays
        if in_place and gemm.threads_for(d.rows, d.depth, d.cols) == 1:  # the common case in one native call
            a_xor, _, kq, _, _, row_coef, mult, left, rq, out_zp, *_ = t.kernel_args
            _computed_slices(flat, d.depth, ys, d.adj_y, kq, x_term, packed, t.bias, bias, d.rows, d.cols, row_coef,
                             mult, left, rq, out_zp, a_xor, ob, t.flags)
            return
    buf = None if in_place else np.full((d.rows, kp), _PAD, dtype=np.int8)
    for s in range(d.slices):
        if in_place:
            a, a_off, lda = flat, s * d.rows * d.depth, d.depth
        else:
            buf[:, :d.depth] = xs[s].T if d.adj_x else xs[s]
            a, a_off, lda = buf.reshape(-1).view(np.uint8), 0, kp
        o_off = s * d.rows * d.cols
        if d.plans is not None:
            gemm.run(d.plans[s], a, a_off, lda, d.rows, ob, o_off, d.cols)
            continue
        bias[:] = t.bias
        _pack(ys[s], d.adj_y, t.kq, x_term, packed, bias)
        gemm.run_repacked(t, packed, bias, a, a_off, lda, d.rows, ob, o_off, d.cols)


def execute(ctx: OperationContext, inputs: list) -> list:
    d: IntBatchMatmul = ctx.data
    x = np.asarray(inputs[LHS])
    out = np.empty((*x.shape[:-2], d.rows, d.cols), dtype=np.int8)
    run(d, x, None if d.plans is not None else np.asarray(inputs[RHS]), out)
    return [out]


def bind(ctx: OperationContext, inputs: list, outputs: list):
    """``run`` on the fixed inputs (their contents read at each run) into the fixed ``outputs[0]``."""
    d: IntBatchMatmul = ctx.data
    x, y, out = inputs[LHS], inputs[RHS], outputs[0]
    if x is None or not out.flags.c_contiguous or (d.plans is None and y is None):
        return None
    return functools.partial(run, d, x, None if d.plans is not None else y, out)


BACKEND.register(BATCH_MATMUL, plan=plan, execute=execute, types=(QS8,), supports=supports, bind=bind)
