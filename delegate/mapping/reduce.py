"""MEAN: TFLite -> NNAPI.

Not delegated: non-constant or empty axis lists (NNAPI reads "no axes" as "every axis", TFLite
as "none"; the axes are needed here to tell) and reducing everything without keep_dims (TFLite
gives a scalar, NNAPI shape [1]). NNAPI's own rules (ranks 1 to 4, output type, a quantized
output with the input's scale and zero point) are hal's validate's.
"""
from __future__ import annotations

import numpy as np

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import OptionsReader, bools
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import BuiltinOperator, TensorType
from hal.types import OperandType, OperationType


def _read_reducer(a: int) -> dict:
    return {"keep_dims": bools(a, 1)[0]}  # TfLiteReducerParams


@mapper(BuiltinOperator.MEAN, options=OptionsReader("ReducerOptions", _read_reducer))
def map_mean(ctx: MappingContext, node: TfLiteNode) -> None:
    x, axis = ctx.input_tensor(0), ctx.input_tensor(1)
    rank = len(x.shape)
    if axis.type != TensorType.INT32 or not axis.is_constant:
        raise MappingError("the axis tensor must be a constant int32 tensor")
    axes = np.asarray(axis.data, dtype=np.int32).reshape(-1)
    if axes.size == 0:
        raise MappingError("an empty axis list means 'reduce nothing' in TFLite but 'reduce all' in NNAPI")
    if np.any((axes < -rank) | (axes >= rank)):
        raise MappingError(f"axis {axes.tolist()} out of range for rank {rank}")
    keep = bool(ctx.option("keep_dims", False))
    if not keep and len({int(a) % rank for a in axes}) == rank:
        raise MappingError("reducing every dimension without keep_dims gives a TFLite scalar "
                           "(NNAPI gives shape [1])")
    x_op = ctx.tensor(node.inputs[0])
    axes_op = ctx.constant(OperandType.TENSOR_INT32, axes)  # 1-D even if TFLite's axis is 0-D
    ctx.operation(OperationType.MEAN, [x_op, axes_op, ctx.int32(1 if keep else 0)],
                  [ctx.tensor(node.outputs[0])])
