"""AVERAGE_POOL_2D, MAX_POOL_2D, L2_POOL_2D on numpy.

Kernels follow TFLite's reference pooling (reference_ops / reference_integer_ops
pooling.h): a window only counts the cells inside the input, so padding never
enters an average. The work is one vectorised numpy step per filter tap, in
TFLite's (filter_y, filter_x) order, so float sums round exactly as TFLite's do.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal import quant
from hal.backends.reference import BACKEND
from hal.operations.common import F32, QUANT8, Window
from hal.operations.pooling import AVG, L2, MAX, PoolParams
from hal.registry import OperationContext
from hal.types import OperationType


@dataclass
class PoolData:
    """What execute needs: window geometry, per-cell valid counts and the activation range."""

    kind: OperationType
    nchw: bool
    filter_h: int
    filter_w: int
    stride_h: int
    stride_w: int
    out_h: int
    out_w: int
    pads: tuple  # np.pad widths for the NHWC input (only as much tail padding as windows reach)
    counts: np.ndarray | None  # [1, out_h, out_w, 1] valid cells per window (avg / l2)
    act: int
    act_min: int = 0
    act_max: int = 0


def _valid_counts(a: Window) -> np.ndarray:
    """Cells of each window that lie inside the input (TFLite's filter_start/filter_end clamp)."""
    origin = np.arange(a.out) * a.stride - a.pad_head
    return np.minimum(a.filter, a.size - origin) - np.maximum(0, -origin)


def plan(ctx: OperationContext) -> PoolData:
    p: PoolParams = ctx.params
    rows, cols = p.rows, p.cols
    counts = None
    if p.kind != MAX:
        counts = (_valid_counts(rows)[:, None] * _valid_counts(cols)[None, :]).reshape(1, rows.out, cols.out, 1)
        if ctx.input_type(0) == F32:
            counts = counts.astype(np.float32)
    data = PoolData(p.kind, p.nchw, rows.filter, cols.filter, rows.stride, cols.stride, rows.out, cols.out,
                    ((0, 0), (rows.pad_head, rows.reach), (cols.pad_head, cols.reach), (0, 0)), counts, p.act)
    out = ctx.output(0)
    if out.type in QUANT8:
        data.act_min, data.act_max = quant.activation_range_quantized(p.act, out.type, out.scale, out.zero_point)
    return data


def _fill_value(kind: OperationType, dtype: np.dtype):
    """Padding value that never wins: it is excluded from sums by the counts, from max by order."""
    if kind != MAX:
        return 0
    return -np.inf if dtype == np.float32 else np.iinfo(dtype).min


def execute(ctx: OperationContext, inputs: list) -> list:
    d: PoolData = ctx.data
    x = inputs[0]
    if d.nchw:
        x = x.transpose(0, 2, 3, 1)
    is_float = x.dtype == np.float32
    xp = np.pad(x, d.pads, constant_values=_fill_value(d.kind, x.dtype))
    if d.kind == MAX:
        acc = None
    elif is_float:
        acc = np.zeros((x.shape[0], d.out_h, d.out_w, x.shape[3]), np.float32)
    else:
        acc = np.zeros((x.shape[0], d.out_h, d.out_w, x.shape[3]), np.int64)
    span_h, span_w = (d.out_h - 1) * d.stride_h + 1, (d.out_w - 1) * d.stride_w + 1
    for fy in range(d.filter_h):
        for fx in range(d.filter_w):
            tap = xp[:, fy:fy + span_h:d.stride_h, fx:fx + span_w:d.stride_w, :]
            if d.kind == MAX:
                acc = tap.copy() if acc is None else np.maximum(acc, tap, out=acc)
            elif d.kind == L2:
                acc += tap * tap
            else:
                acc += tap
    if d.kind == MAX:
        out = (quant.apply_activation_float(acc, d.act) if is_float
               else np.clip(acc, d.act_min, d.act_max).astype(x.dtype))
    elif d.kind == L2:
        out = quant.apply_activation_float(np.sqrt(acc / d.counts), d.act)
    elif is_float:
        out = quant.apply_activation_float(acc / d.counts, d.act)
    else:
        # reference_integer_ops::AveragePool: round half away from zero with C division
        # (for uint8 the sum is never negative, which is reference_ops' simpler formula).
        half = d.counts // 2
        rounded = np.sign(acc) * ((np.abs(acc) + half) // d.counts)
        out = np.clip(rounded, d.act_min, d.act_max).astype(x.dtype)
    if d.nchw:
        out = np.ascontiguousarray(out.transpose(0, 3, 1, 2))
    return [out]


BACKEND.register([AVG, MAX, L2], plan=plan, execute=execute)
