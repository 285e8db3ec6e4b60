"""RESHAPE, SQUEEZE, EXPAND_DIMS, TRANSPOSE, DEPTH_TO_SPACE, SPACE_TO_DEPTH, CHANNEL_SHUFFLE.

Pure data movement, so every lowered type is exact. The shape parameters are read from
``ctx.params`` (already resolved by the spec: no -1, squeezed axes dropped), and the target shape
is always given to ONNX Reshape explicitly.

NNAPI's (TFLite's) DEPTH_TO_SPACE depth order is (dy * block + dx) * c_small + c: ONNX
DepthToSpace's "DCR" mode; SPACE_TO_DEPTH's is ONNX SpaceToDepth's only order. Both are NCHW in
ONNX, so NHWC operands are transposed around them (the optimiser cancels adjacent pairs).
"""
from __future__ import annotations

import math

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph
from hal.operations.common import F32, I32
from hal.operations.gather import ChannelShuffleParams
from hal.operations.shape import BlockParams, TransposeParams
from hal.registry import OperationContext
from hal.types import OperationType


def zero_sized(ctx: OperationContext, tensors: int = 1) -> str | None:
    """Declines zero-sized operands (ONNX handles them unevenly; they are rare). Output shapes are
    the prepared ones: when ``supports`` runs, ``ctx.outputs`` still holds the declared shapes."""
    shapes = [ctx.input(i).shape for i in range(tensors)] + [s for s in ctx.output_shapes if s is not None]
    if any(0 in s for s in shapes):
        return "zero-sized tensors are left to the reference backend"
    return None


def reshape_to(g: OnnxGraph, x: str, shape) -> str:
    """``x`` reshaped to ``shape``; allowzero: a 0 is a 0, never "copy the input's dimension"."""
    return g.node("Reshape", [x, g.ints(shape)], allowzero=1)


def lower_reshape(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    """RESHAPE, SQUEEZE, EXPAND_DIMS: the same elements in the same order, shape ctx.output(0)'s."""
    return [reshape_to(g, x[0], ctx.output(0).shape)]


def lower_transpose(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: TransposeParams = ctx.params
    return [g.node("Transpose", [x[0]], perm=list(p.perm))]


def lower_block(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: BlockParams = ctx.params
    data = x[0] if p.nchw else g.nchw(x[0])
    if ctx.op_type == OperationType.DEPTH_TO_SPACE:
        y = g.node("DepthToSpace", [data], blocksize=p.block, mode="DCR")
    else:
        y = g.node("SpaceToDepth", [data], blocksize=p.block)
    return [y if p.nchw else g.nhwc(y)]


def lower_channel_shuffle(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    """The axis seen as [groups, dim / groups] and transposed (as the reference kernel does)."""
    p: ChannelShuffleParams = ctx.params
    shape = ctx.input(0).shape
    outer = math.prod(shape[:p.axis])
    inner = math.prod(shape[p.axis + 1:])
    y = reshape_to(g, x[0], [outer, p.groups, shape[p.axis] // p.groups, inner])
    y = g.node("Transpose", [y], perm=[0, 2, 1, 3])
    return [reshape_to(g, y, shape)]


BACKEND.lowering([OperationType.RESHAPE, OperationType.EXPAND_DIMS], lower=lower_reshape, types=[F32, I32],
                 supports=zero_sized)
BACKEND.lowering(OperationType.SQUEEZE, lower=lower_reshape, types=[F32], supports=zero_sized)
BACKEND.lowering(OperationType.TRANSPOSE, lower=lower_transpose, types=[F32], supports=zero_sized)
BACKEND.lowering([OperationType.DEPTH_TO_SPACE, OperationType.SPACE_TO_DEPTH], lower=lower_block, types=[F32],
                 supports=zero_sized)
BACKEND.lowering(OperationType.CHANNEL_SHUFFLE, lower=lower_channel_shuffle, types=[F32], supports=zero_sized)
