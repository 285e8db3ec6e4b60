"""PAD (NNAPI 1.1): constant padding with the logical zero.

Inputs: 0 the tensor (rank <= 4), 1 the paddings, a TENSOR_INT32 of shape [rank(input0), 2] of
non-negative (before, after) counts per dimension (this driver needs it constant). The output has
input 0's type, scale and zero point; since NNAPI 1.2 a quantized tensor is padded with its zero
point (as TFLite's PAD without a constant_values input does).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal.operations.common import I32, QS8, QU8
from hal.operations.shape import MAX_RANK, SHAPE_TYPES, need_shape, validate_same_io
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperationType

INPUT = 0
PADDINGS = 1


@dataclass
class PadParams:
    paddings: tuple[tuple[int, int], ...]  # (before, after) per input dimension
    out_shape: tuple[int, ...]


def validate(ctx: OperationContext) -> None:
    validate_same_io(ctx, MAX_RANK)
    ctx.expect_input_type(PADDINGS, I32)
    info = ctx.input(PADDINGS)
    if info.rank_known and info.shape and info.rank != 2:
        raise ctx.fail(f"input 1 (paddings) must have shape [rank, 2], got {list(info.shape)}")


def _paddings(ctx: OperationContext, rank: int) -> np.ndarray:
    info = ctx.input(PADDINGS)
    shape = info.value.shape if info.value is not None else info.shape
    if shape and (len(shape) != 2 or shape[1] != 2 or shape[0] != rank):
        raise ctx.fail(f"input 1 (paddings) must have shape [{rank}, 2], got {list(shape)}")
    if info.value is None:
        raise ctx.fail("input 1 (paddings) must be a constant operand for this driver")
    pads = info.value
    if np.any(pads < 0):
        raise ctx.fail(f"input 1 (paddings) must be non-negative, got {pads.tolist()}")
    return pads


def prepare(ctx: OperationContext) -> PadParams:
    shape = need_shape(ctx)
    pads = tuple((int(b), int(a)) for b, a in _paddings(ctx, len(shape)).tolist())
    out = tuple(b + d + a for d, (b, a) in zip(shape, pads, strict=True))
    ctx.set_output_shape(0, out)
    return PadParams(pads, out)


register(OperationType.PAD, validate=validate, prepare=prepare, input_types=SHAPE_TYPES, num_inputs=(2,),
         min_feature_level=FeatureLevel.FL2, type_feature_levels={QU8: FeatureLevel.FL2, QS8: FeatureLevel.FL4})
