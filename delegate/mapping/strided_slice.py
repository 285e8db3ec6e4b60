"""STRIDED_SLICE: TFLite -> NNAPI.

NNAPI has no ellipsis_mask, new_axis_mask or offset: refused when set. TFLite
ignores `end` on a shrink axis (it takes begin + 1), while NNAPI requires the
begin/end pair to select one element: shrink axes are re-emitted as the
resolved [start, start + 1) with their mask bits cleared, which needs
begin/end/strides constant with one entry per input dimension (and values that
fit NNAPI's int32). NNAPI's other rules (non-zero strides, ...) are hal's.
"""
from __future__ import annotations

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import OptionsReader, bools, ints
from delegate.mapping.shape import constant_ints, int32_constant, same_io
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import BuiltinOperator
from hal.operations.strided_slice import axis_range
from hal.types import OperationType

_INT32_MAX = 2**31 - 1


def _read_strided_slice(a: int) -> dict:
    begin, end, ellipsis, new_axis, shrink = ints(a, 5)  # TfLiteStridedSliceParams
    return {"begin_mask": begin, "end_mask": end, "ellipsis_mask": ellipsis, "new_axis_mask": new_axis,
            "shrink_axis_mask": shrink, "offset": bools(a + 20, 1)[0]}


@mapper(BuiltinOperator.STRIDED_SLICE, options=OptionsReader("StridedSliceOptions", _read_strided_slice))
def map_strided_slice(ctx: MappingContext, node: TfLiteNode) -> None:
    x, _, _ = same_io(ctx, node, OperationType.STRIDED_SLICE, (4,))
    for name in ("ellipsis_mask", "new_axis_mask", "offset"):
        if ctx.option(name, 0):
            raise MappingError(f"{name} has no NNAPI equivalent")
    rank = len(x.shape)
    vectors = [constant_ints(ctx, k, what).reshape(-1) for k, what in
               ((1, "begin"), (2, "end"), (3, "strides"))]
    if any(v.shape != (rank,) for v in vectors):
        raise MappingError(f"begin/end/strides must have {rank} entries (the input rank), got "
                           f"{[len(v) for v in vectors]}")
    begin, end, strides = (v.tolist() for v in vectors)
    if any(abs(v) > _INT32_MAX for v in begin + end + strides):
        raise MappingError("begin/end/strides do not fit in int32")
    begin_mask = int(ctx.option("begin_mask", 0))
    end_mask = int(ctx.option("end_mask", 0))
    shrink = int(ctx.option("shrink_axis_mask", 0)) & ((1 << rank) - 1)
    for k in range(rank):
        bit = 1 << k
        if not shrink & bit:
            continue
        start, _ = axis_range(x.shape[k], begin[k], end[k], strides[k], bool(begin_mask & bit), False)
        if strides[k] < 0 or start >= x.shape[k]:
            raise MappingError(f"shrink axis {k} must select one element with a positive stride")
        begin[k], end[k] = start, start + 1
        begin_mask &= ~bit
        end_mask &= ~bit
    ins = [ctx.tensor(node.inputs[0]), int32_constant(ctx, begin), int32_constant(ctx, end),
           int32_constant(ctx, strides), ctx.int32(begin_mask), ctx.int32(end_mask), ctx.int32(shrink)]
    ctx.operation(OperationType.STRIDED_SLICE, ins, [ctx.tensor(node.outputs[0])])
