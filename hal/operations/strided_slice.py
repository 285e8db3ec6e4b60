"""STRIDED_SLICE: begin/end/strides per axis with begin, end and shrink-axis masks.

Index resolution follows TFLite 2.14's strided_slice_logic.h (StridedSliceStart/
EndForAxis), which for NNAPI's inputs agrees with AOSP's ClampedIndex: negative
indices count from the end, then begin/end are clamped to [0, dim] for a
positive stride and [-1, dim - 1] for a negative one; a mask bit replaces the
index with the full range. A shrink axis must select exactly one element with a
positive stride (NNAPI; AOSP checks the same), and disappears from the output.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal.operations._legacy import register
from hal.operations.common import INT32
from hal.operations.shape import SHAPE_TYPES, int_vector, need_constant_vector, need_shape, validate_same_io
from hal.registry import OperationContext
from hal.types import OperationType


@dataclass
class SliceData:
    index: tuple[slice, ...]
    out_shape: tuple[int, ...]


def axis_range(dim: int, begin: int, end: int, stride: int, begin_masked: bool,
               end_masked: bool) -> tuple[int, int]:
    """(start, stop) along one axis, after negative-index handling, clamping and masks."""
    lo, hi = (0, dim) if stride > 0 else (-1, dim - 1)
    start = begin + dim if begin < 0 else begin
    start = min(max(start, lo), hi)
    if begin_masked:
        start = 0 if stride > 0 else dim - 1
    stop = end + dim if end < 0 else end
    stop = min(max(stop, lo), hi)
    if end_masked:
        stop = dim if stride > 0 else -1
    return start, stop


def _count(start: int, stop: int, stride: int) -> int:
    return max(0, -((stop - start) // -stride))  # ceil((stop - start) / stride), at least 0


def _as_slice(start: int, n: int, stride: int) -> slice:
    if n == 0:
        return slice(0, 0)
    last = start + (n - 1) * stride
    stop = last + (1 if stride > 0 else -1)
    return slice(start, None if stop < 0 else stop, stride)


def _vectors(ctx: OperationContext, rank: int | None, need: bool):
    names = ("begin", "end", "strides")
    get = need_constant_vector if need else int_vector
    return [get(ctx, i, name, rank) for i, name in zip((1, 2, 3), names, strict=True)]


def _validate(ctx: OperationContext) -> None:
    ctx.expect_num_inputs(7)
    validate_same_io(ctx)
    info = ctx.input(0)
    _, _, strides = _vectors(ctx, info.rank if info.shape else None, need=False)
    for i in (4, 5, 6):
        ctx.scalar(i, INT32)
    if strides is not None and 0 in strides:
        raise ctx.fail(f"input 3 (strides) entries must be non-zero, got {strides}")


def _prepare(ctx: OperationContext) -> SliceData:
    shape = need_shape(ctx)
    begin, end, strides = _vectors(ctx, len(shape), need=True)
    if 0 in strides:
        raise ctx.fail(f"input 3 (strides) entries must be non-zero, got {strides}")
    begin_mask, end_mask, shrink_mask = (ctx.scalar(i, INT32) for i in (4, 5, 6))
    index, out_shape = [], []
    for k, dim in enumerate(shape):
        bit = 1 << k
        start, stop = axis_range(dim, begin[k], end[k], strides[k], bool(begin_mask & bit),
                                 bool(end_mask & bit))
        n = _count(start, stop, strides[k])
        if shrink_mask & bit:
            if strides[k] <= 0 or n != 1:
                raise ctx.fail(f"shrink axis {k} must select exactly one element with a positive "
                               f"stride (begin={begin[k]}, end={end[k]}, stride={strides[k]}, "
                               f"dim={dim})")
            index.append(start)
        else:
            index.append(_as_slice(start, n, strides[k]))
            out_shape.append(n)
    out = tuple(out_shape) or (1,)  # NNAPI: shrinking every axis leaves shape [1]
    ctx.set_output_shape(0, out)
    return SliceData(tuple(index), out)


def _execute(ctx: OperationContext, inputs: list) -> list:
    d: SliceData = ctx.data
    return [np.array(inputs[0][d.index]).reshape(d.out_shape)]  # a copy, never a view


register(OperationType.STRIDED_SLICE, validate=_validate, prepare=_prepare, execute=_execute,
         supported_types=SHAPE_TYPES)
