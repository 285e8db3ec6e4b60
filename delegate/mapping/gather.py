"""GATHER, TILE, EXPAND_DIMS: TFLite -> NNAPI (TFLite has no CHANNEL_SHUFFLE builtin).

* GATHER: the options' axis goes to NNAPI's INT32 axis; batch_dims must be 0 (NNAPI has none).
  Indices may be computed (int32) or constant (int32 or int64, re-emitted as int32). A scalar
  (rank-0) index, which drops the axis, becomes a GATHER of a one-element index vector followed by
  a RESHAPE to TFLite's output shape (a computed scalar index is that [1] vector already, and a
  scalar output is [1]: delegate.mapping.scalars).
* TILE: the multiples must be constant. EXPAND_DIMS: the axis must be a constant with one value.

NNAPI's own rules (types, a quantized output with the input's scale and zero point, index and axis
ranges) are hal's validate's.
"""
from __future__ import annotations

import numpy as np

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import OptionsReader, ints, no_options
from delegate.mapping.scalars import nnapi_shape
from delegate.mapping.slicing import arity, constant_int, constant_ints, int32_tensor
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import BuiltinOperator, TensorType
from hal.types import OperationType


def _read_gather(a: int) -> dict:
    axis, batch_dims = ints(a, 2)  # TfLiteGatherParams
    return {"axis": axis, "batch_dims": batch_dims}


@mapper(BuiltinOperator.GATHER, options=OptionsReader("GatherOptions", _read_gather))
def map_gather(ctx: MappingContext, node: TfLiteNode) -> None:
    arity(node, 2)
    if int(ctx.option("batch_dims", 0)):
        raise MappingError(f"batch_dims {ctx.option('batch_dims')} has no NNAPI equivalent (NNAPI: 0 only)")
    x, indices, y = ctx.input_tensor(0), ctx.input_tensor(1), ctx.output_tensor(0)
    rank = len(x.shape)
    axis = int(ctx.option("axis", 0))
    if not -rank <= axis < rank:
        raise MappingError(f"axis {axis} is out of range for rank {rank}")
    if indices.is_constant:
        values = constant_ints(ctx, 1, "indices")
        idx = int32_tensor(ctx, values)
    elif indices.type == TensorType.INT32:
        idx = ctx.tensor(node.inputs[1])
    else:
        raise MappingError("computed indices must be int32 (NNAPI's index type)")
    ins = [ctx.tensor(node.inputs[0]), ctx.int32(axis), idx]
    out = ctx.tensor(node.outputs[0])
    if indices.shape:
        ctx.operation(OperationType.GATHER, ins, [out])
        return
    # A scalar index: gather [index] (the axis kept, of size 1), then drop the axis.
    a = axis % rank
    kept_shape = (*x.shape[:a], 1, *x.shape[a + 1:])
    if kept_shape == nnapi_shape(y):  # a rank-1 x: TFLite's scalar output is [1] here already
        ctx.operation(OperationType.GATHER, ins, [out])
        return
    kept = ctx.new_temporary(ins[0], shape=kept_shape)
    ctx.operation(OperationType.GATHER, ins, [kept])
    ctx.operation(OperationType.RESHAPE, [kept, int32_tensor(ctx, np.array(y.shape))], [out])


@mapper(BuiltinOperator.TILE, options=no_options("TileOptions"))
def map_tile(ctx: MappingContext, node: TfLiteNode) -> None:
    arity(node, 2)
    multiples = constant_ints(ctx, 1, "multiples").reshape(-1)
    ctx.operation(OperationType.TILE, [ctx.tensor(node.inputs[0]), int32_tensor(ctx, multiples)],
                  [ctx.tensor(node.outputs[0])])


@mapper(BuiltinOperator.EXPAND_DIMS, options=no_options("ExpandDimsOptions"))
def map_expand_dims(ctx: MappingContext, node: TfLiteNode) -> None:
    arity(node, 2)
    axis = constant_int(ctx, 1, "axis")
    ctx.operation(OperationType.EXPAND_DIMS, [ctx.tensor(node.inputs[0]), ctx.int32(axis)],
                  [ctx.tensor(node.outputs[0])])
