"""SOFTMAX: NNAPI's signature, rules and output shape.

Inputs: 0 the tensor (rank 1 to 4), 1 beta (a FLOAT32 scalar, positive), 2 the optional axis
(an INT32 scalar in [-rank, rank), default -1; NNAPI 1.2). The output has the input's type and
shape; quantized outputs have NNAPI's fixed quantization (SOFTMAX_OUTPUT_QUANT).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from hal.operations.common import F32, FLOAT32, INT32, QS8, QU8, QUANT8, optional_param, param
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperationType

TYPES = (F32, QU8, QS8)
INPUT, BETA, AXIS = 0, 1, 2
MAX_RANK = 4

#: NNAPI's fixed output quantization (scale, zero point).
SOFTMAX_OUTPUT_QUANT = {QU8: (1.0 / 256, 0), QS8: (1.0 / 256, -128)}


@dataclass
class SoftmaxParams:
    beta: float
    axis: int  # non-negative


def _check_beta(ctx: OperationContext, beta: float | None) -> None:
    if beta is not None and not (math.isfinite(beta) and beta > 0):
        raise ctx.fail(f"input {BETA}: beta must be a positive finite number, got {beta}")


def _check_axis(ctx: OperationContext, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ctx.fail(f"input {AXIS}: axis {axis} is out of range for a rank-{rank} input")
    return axis % rank


def validate(ctx: OperationContext) -> None:
    t = ctx.input_type(INPUT)
    ctx.expect_output_type(0, t)
    ctx.expect_input_rank_between(INPUT, 1, MAX_RANK)
    _check_beta(ctx, param(ctx, BETA, FLOAT32))
    axis = optional_param(ctx, AXIS, -1, INT32)
    if axis is not None and ctx.rank_known(INPUT):
        _check_axis(ctx, axis, ctx.input(INPUT).rank)
    if t in QUANT8:
        ctx.expect_output_quantization(0, *SOFTMAX_OUTPUT_QUANT[t])


def prepare(ctx: OperationContext) -> SoftmaxParams:
    x = ctx.input(INPUT)
    ctx.set_output_shape(0, x.shape)
    beta = ctx.scalar(BETA, FLOAT32)
    _check_beta(ctx, beta)
    axis = _check_axis(ctx, ctx.optional_scalar(AXIS, -1, INT32), x.rank)
    return SoftmaxParams(beta, axis)


register(OperationType.SOFTMAX, validate=validate, prepare=prepare, input_types=TYPES, num_inputs=(2, 3),
         optional_inputs=(AXIS,), min_feature_level=FeatureLevel.FL1, type_feature_levels={QS8: FeatureLevel.FL4})
