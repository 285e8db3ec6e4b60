"""Quantized (uint8 / int8) PAD and PAD_V2 of rank 1 to 4: one native pass over the output.

The reference backend's plan (the output shape, the input's window in it, the pad value: PAD's
zero point, PAD_V2's given value), a rank below 4 seen as [1, ..., shape]. Each output row of the
last dimension is written once (``simd.fill_copy``: the input's row, if any, then pad bytes, in
64-byte masked moves), where numpy fills the whole output then copies the input over it. Values
are copied, never computed: exact.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np

from hal.backends.numba_kernels import BACKEND
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.backends.numba_kernels.simd import fill_copy
from hal.backends.reference import pad as reference
from hal.operations.common import QUANT8
from hal.registry import OperationContext
from hal.types import OperationType

I64 = numba.int64


@njit([numba.void(ro(t, 1), ro(np.int64, 1), ro(np.int64, 2), I64, rw(t, 1)) for t in (np.int8, np.uint8)],
            cache=True, nogil=True)
def _pad4(x, out_shape, window, value, out):
    """Flat NHWC ``out`` (``out_shape``) = ``value`` with flat ``x`` in ``window`` ([4, 2]: start,
    stop per dimension): per output row of the last dimension, one fill, or a fill, a copy of
    the input's row and a fill."""
    n_o, h_o, w_o, c_o = out_shape[0], out_shape[1], out_shape[2], out_shape[3]
    h_i, w_i = window[1, 1] - window[1, 0], window[2, 1] - window[2, 0]
    c0, c1 = window[3, 0], window[3, 1]
    c_i = c1 - c0
    row = 0
    for n in range(n_o):
        in_n = window[0, 0] <= n < window[0, 1]
        for y in range(h_o):
            in_y = in_n and window[1, 0] <= y < window[1, 1]
            for xx in range(w_o):
                if in_y and window[2, 0] <= xx < window[2, 1]:
                    src = (((n - window[0, 0]) * h_i + y - window[1, 0]) * w_i + xx - window[2, 0]) * c_i
                    if c0:
                        fill_copy(out, row, x, src, 0, c0, value)
                    fill_copy(out, row + c0, x, src, c_i, c_o - c0, value)
                else:
                    fill_copy(out, row, x, 0, 0, c_o, value)
                row += c_o


@dataclass
class PadPlan:
    out_shape: tuple[int, ...]
    shape4: np.ndarray  # int64 [4]: the output shape, [1, ...]-extended to rank 4
    window: np.ndarray  # int64 [4, 2]: (start, stop) of the input in the output, per dimension
    value: int


def supports(ctx: OperationContext) -> str | None:
    if len(ctx.input(0).shape) > 4:
        return "rank above 4"
    return None


def plan(ctx: OperationContext) -> PadPlan:
    d = reference.plan(ctx)
    lead = 4 - len(d.out_shape)
    return PadPlan(tuple(d.out_shape), np.array((1,) * lead + tuple(d.out_shape), dtype=np.int64),
                   np.array([(0, 1)] * lead + [list(w) for w in d.window], dtype=np.int64), int(d.value))


def execute(ctx: OperationContext, inputs: list) -> list:
    d: PadPlan = ctx.data
    x = inputs[0]
    out = np.empty(d.out_shape, dtype=x.dtype)
    _pad4(x.reshape(-1) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(-1), d.shape4, d.window,
          d.value, out.reshape(-1))
    return [out]


def bind(ctx: OperationContext, inputs: list, outputs: list):
    """``execute`` of the fixed contiguous input into the fixed ``outputs[0]``: a zero-argument runner."""
    d: PadPlan = ctx.data
    x = inputs[0]
    if x is None or not x.flags.c_contiguous:
        return None
    return functools.partial(_pad4, x.reshape(-1), d.shape4, d.window, d.value, outputs[0].reshape(-1))


BACKEND.register([OperationType.PAD, OperationType.PAD_V2], plan=plan, execute=execute, types=QUANT8,
                 supports=supports, bind=bind)
