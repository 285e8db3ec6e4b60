"""GATHER, TILE, REVERSE, ARGMAX / ARGMIN and TOPK_V2 (float32 and int32: values are moved or compared, never
computed, so both are exact).

* GATHER: ONNX Gather with NNAPI's constant indices (checked in range by the spec). Indices given
  at execution are declined: NNAPI fails an out-of-range index with its own message (the reference
  does), onnxruntime would wrap a negative one.
* ARGMAX / ARGMIN: ONNX's select_last_index=0 keeps the first of equal values, as NNAPI / TFLite
  do; int64 indices are cast to NNAPI's int32, and the reduced shape reshaped to NNAPI's ([1] for
  a 1-D input, where ONNX gives a scalar).
* TOPK_V2: ONNX TopK (largest, sorted) along the last axis orders equal values by lower index
  first, TFLite's order; indices cast to int32.
* TILE: ONNX Tile with the constant multiples; REVERSE: a Slice with step -1 along the axis.
Zero-sized tensors are left to the reference backend.
"""
from __future__ import annotations

import numpy as np

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph, TensorProto
from hal.operations.argminmax import ARGMAX, ARGMIN, ArgMinMaxParams
from hal.operations.common import F32, I32
from hal.operations.gather import G_INDICES, GatherParams, TileParams
from hal.operations.pack_reverse import AxisParams
from hal.operations.topk import TOPK_V2, TopKParams
from hal.registry import OperationContext
from hal.types import OperationType

GATHER = OperationType.GATHER


def _zero_sized(ctx: OperationContext) -> str | None:
    shapes = [ctx.input(0).shape] + [o.shape for o in ctx.outputs]
    if any(0 in s for s in shapes):
        return "zero-sized tensors are left to the reference backend"
    return None


def supports_gather(ctx: OperationContext) -> str | None:
    if ctx.input(G_INDICES).value is None:
        return "indices given at execution (the reference checks them with NNAPI's error)"
    return _zero_sized(ctx)


def lower_gather(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    """Rank-0 indices (a scalar: the axis disappears) are reshaped back to a scalar: ``g.const``
    stores a 0-d array as [1] (np.ascontiguousarray makes it 1-D), which would keep the axis."""
    p: GatherParams = ctx.params
    info = ctx.input(G_INDICES)
    indices = g.const(np.asarray(info.value, np.int64), "indices")
    if len(info.shape) == 0:
        indices = g.node("Reshape", [indices, g.ints([])])
    return [g.node("Gather", [x[0], indices], axis=p.axis)]


def lower_argminmax(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: ArgMinMaxParams = ctx.params
    op = "ArgMax" if ctx.op_type == ARGMAX else "ArgMin"
    y = g.node(op, [x[0]], axis=p.axis, keepdims=0, select_last_index=0)
    y = g.node("Cast", [y], to=TensorProto.INT32)
    if len(ctx.input(0).shape) == 1:
        y = g.node("Reshape", [y, g.ints(p.out_shape)])
    return [y]


def lower_topk(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: TopKParams = ctx.params
    values, indices = g.node("TopK", [x[0], g.ints([p.k])], outputs=2, axis=-1, largest=1, sorted=1)
    return [values, g.node("Cast", [indices], to=TensorProto.INT32)]


def lower_tile(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: TileParams = ctx.params
    return [g.node("Tile", [x[0], g.ints(p.multiples)])]


def lower_reverse(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    """Slice from the last element backwards; INT64_MIN as the end: past element 0 (-1 would mean
    the last element)."""
    p: AxisParams = ctx.params
    return [g.node("Slice", [x[0], g.ints([-1]), g.ints([np.iinfo(np.int64).min]), g.ints([p.axis]), g.ints([-1])])]


BACKEND.lowering(GATHER, lower=lower_gather, types=[F32, I32], supports=supports_gather)
BACKEND.lowering([ARGMAX, ARGMIN], lower=lower_argminmax, types=[F32, I32], supports=_zero_sized)
BACKEND.lowering(TOPK_V2, lower=lower_topk, types=[F32, I32], supports=_zero_sized)
BACKEND.lowering(OperationType.TILE, lower=lower_tile, types=[F32, I32], supports=_zero_sized)
BACKEND.lowering(OperationType.REVERSE, lower=lower_reverse, types=[F32, I32], supports=_zero_sized)
