"""MEAN: NNAPI's signature, rules and output shape.

Inputs: 0 the tensor (rank 1 to 4); 1 the axes, a 1-D TENSOR_INT32 (values in [-rank, rank),
negative ones counting from the end, duplicates allowed; no entries means every axis); 2 keep_dims,
an INT32 scalar (positive: reduced dimensions stay, with length 1). Reducing every dimension
without keep_dims gives shape [1]. A quantized output must have the input's scale and zero point.
"""
from __future__ import annotations

from dataclasses import dataclass

from hal.operations.common import F32, I32, INT32, QS8, QU8, QUANT8, param
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperationType

MEAN = OperationType.MEAN
TYPES = (F32, QU8, QS8)
MAX_RANK = 4

INPUT, AXES, KEEP_DIMS = 0, 1, 2


@dataclass
class MeanParams:
    """Resolved reduction: what every backend computes from."""

    axes: tuple[int, ...]  # non-negative, deduplicated, sorted
    keep_dims: bool
    out_shape: tuple[int, ...]


def validate(ctx: OperationContext) -> None:
    t = ctx.input_type(INPUT)
    ctx.expect_output_type(0, t)
    ctx.expect_input_rank_between(INPUT, 1, MAX_RANK)
    ctx.expect_input_type(AXES, I32)
    ctx.expect_input_rank(AXES, 1)
    param(ctx, KEEP_DIMS, INT32)
    if t in QUANT8:
        ctx.expect_same_quantization(INPUT)


def _axes(ctx: OperationContext, rank: int) -> tuple[int, ...]:
    """Resolved axes (NNAPI: negative values count from the end; no axes means all of them)."""
    raw = [int(a) for a in ctx.constant(AXES).reshape(-1)]
    for a in raw:
        ctx.check(-rank <= a < rank, f"axis {a} is out of range for an input of rank {rank}")
    return tuple(sorted({a % rank for a in raw})) if raw else tuple(range(rank))


def prepare(ctx: OperationContext) -> MeanParams:
    shape = ctx.input_shape(INPUT)
    axes = _axes(ctx, len(shape))
    keep = ctx.scalar(KEEP_DIMS, INT32) > 0
    if keep:
        out_shape = tuple(1 if i in axes else d for i, d in enumerate(shape))
    else:
        out_shape = tuple(d for i, d in enumerate(shape) if i not in axes) or (1,)
    ctx.set_output_shape(0, out_shape)
    return MeanParams(axes, keep, out_shape)


# Zero-sized inputs: an empty reduction gives NaN (0 when quantized), as TFLite's MEAN does.
register(MEAN, validate=validate, prepare=prepare, input_types=TYPES, num_inputs=(3,), allow_zero_sized_inputs=True,
         min_feature_level=FeatureLevel.FL2, type_feature_levels={QS8: FeatureLevel.FL4})
