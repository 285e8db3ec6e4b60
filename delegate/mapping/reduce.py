"""MEAN: TFLite -> NNAPI.

Not delegated: non-constant or empty axis lists (NNAPI reads "no axes" as
"every axis", TFLite as "none"), reducing everything without keep_dims (TFLite
gives a scalar, NNAPI shape [1]), rank > 4, and quantized MEAN whose output
scale or zero point differs from the input's (NNAPI requires them equal).
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
    x, axis, y = ctx.input_tensor(0), ctx.input_tensor(1), ctx.output_tensor(0)
    rank = len(x.shape)
    if not 1 <= rank <= 4:
        raise MappingError(f"NNAPI MEAN supports ranks 1 to 4, got {rank}")
    if axis.type != TensorType.INT32 or not axis.is_constant:
        raise MappingError("the axis tensor must be a constant int32 tensor")
    axes = np.asarray(axis.data, dtype=np.int32).reshape(-1)
    if axes.size == 0:
        raise MappingError("an empty axis list means 'reduce nothing' in TFLite but 'reduce all' in NNAPI")
    if np.any((axes < -rank) | (axes >= rank)):
        raise MappingError(f"axis {axes.tolist()} out of range for rank {rank}")
    if y.type != x.type:
        raise MappingError(f"output type {y.type} differs from input type {x.type}")
    keep = bool(ctx.option("keep_dims", False))
    if not keep and len({int(a) % rank for a in axes}) == rank:
        raise MappingError("reducing every dimension without keep_dims gives a TFLite scalar "
                           "(NNAPI gives shape [1])")
    if x.is_quantized and (x.scales[:1] != y.scales[:1] or x.zero_points[:1] != y.zero_points[:1]):
        raise MappingError("quantized MEAN with different input and output quantization "
                           "(NNAPI requires them equal)")
    x_op = ctx.tensor(node.inputs[0])
    axes_op = ctx.constant(OperandType.TENSOR_INT32, axes)  # 1-D even if TFLite's axis is 0-D
    ctx.operation(OperationType.MEAN, [x_op, axes_op, ctx.int32(1 if keep else 0)],
                  [ctx.tensor(node.outputs[0])])
