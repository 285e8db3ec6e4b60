"""INSTANCE_NORMALIZATION, L2_NORMALIZATION, LOCAL_RESPONSE_NORMALIZATION: NNAPI's signatures,
rules and output shapes (every output has the input's type and shape).

INSTANCE_NORMALIZATION (NNAPI 1.2; TENSOR_FLOAT32/FLOAT16): 0 a 4-D tensor (NHWC, or NCHW with the
layout flag), 1 gamma, 2 beta, 3 epsilon (FLOAT16 scalars with a TENSOR_FLOAT16 tensor, else
FLOAT32), 4 the NCHW layout flag (BOOL). Each (batch, channel) plane is normalised:
``(x - mean) * gamma / sqrt(variance + epsilon) + beta``.

L2_NORMALIZATION (float32 since 1.0, float16 and uint8 since 1.2, int8 since 1.3): 0 the tensor
(rank 1 to 4; NNAPI 1.0 had rank 4 only), 1 the optional axis (INT32 in [-rank, rank), default
-1; NNAPI 1.2). ``x / max(sqrt(sum(x^2)), 1e-6)`` along the axis. A quantized output has NNAPI's
fixed quantization: scale 1/128 with zero point 128 (uint8) or 0 (int8).

LOCAL_RESPONSE_NORMALIZATION (float32 since 1.0, float16 since 1.2): 0 the tensor (rank 1 to 4),
1 the radius (INT32 >= 0), 2 bias, 3 alpha, 4 beta (FLOAT16 scalars with a TENSOR_FLOAT16 tensor,
else FLOAT32), 5 the optional axis (INT32, default -1; NNAPI 1.2). Along the axis,
``x[i] / (bias + alpha * sum(x[j]^2 for |j - i| <= radius)) ^ beta``.
"""
from __future__ import annotations

from dataclasses import dataclass

from hal.operations.common import BOOL, F16, F32, FLOAT32, INT32, QS8, QU8, QUANT8, param
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperandType, OperationType

FLOAT16 = OperandType.FLOAT16
INSTANCE_NORMALIZATION = OperationType.INSTANCE_NORMALIZATION
L2_NORMALIZATION = OperationType.L2_NORMALIZATION
LOCAL_RESPONSE_NORMALIZATION = OperationType.LOCAL_RESPONSE_NORMALIZATION
MAX_RANK = 4

#: NNAPI's fixed L2_NORMALIZATION output quantization (scale, zero point).
L2_OUTPUT_QUANT = {QU8: (1.0 / 128, 128), QS8: (1.0 / 128, 0)}


def scalar_type(tensor_type: int) -> OperandType:
    """Float parameters are FLOAT16 scalars with a TENSOR_FLOAT16 tensor, else FLOAT32."""
    return FLOAT16 if tensor_type == F16 else FLOAT32


def _axis(ctx: OperationContext, i: int, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ctx.fail(f"input {i}: axis {axis} is out of range for a rank-{rank} input")
    return axis % rank


def _validate_optional_axis(ctx: OperationContext, i: int) -> None:
    if ctx.num_inputs > i:
        axis = param(ctx, i, INT32)
        if axis is not None and ctx.rank_known(0):
            _axis(ctx, i, axis, ctx.input(0).rank)


def _prepare_optional_axis(ctx: OperationContext, i: int) -> int:
    rank = ctx.input(0).rank
    return _axis(ctx, i, ctx.scalar(i, INT32) if ctx.num_inputs > i else -1, rank)


# ---- INSTANCE_NORMALIZATION ---------------------------------------------------------------------

IN_GAMMA, IN_BETA, IN_EPSILON, IN_LAYOUT = 1, 2, 3, 4


@dataclass
class InstanceNormParams:
    gamma: float
    beta: float
    epsilon: float
    nchw: bool


def validate_instance_norm(ctx: OperationContext) -> None:
    t = ctx.input_type(0)
    ctx.expect_output_type(0, t)
    ctx.expect_input_rank(0, 4)
    for i in (IN_GAMMA, IN_BETA, IN_EPSILON):
        param(ctx, i, scalar_type(t))
    param(ctx, IN_LAYOUT, BOOL)


def prepare_instance_norm(ctx: OperationContext) -> InstanceNormParams:
    x = ctx.input(0)
    ctx.check(x.rank == 4, f"input 0 must be rank 4, got {x.rank}")
    ctx.set_output_shape(0, x.shape)
    st = scalar_type(x.type)
    return InstanceNormParams(float(ctx.scalar(IN_GAMMA, st)), float(ctx.scalar(IN_BETA, st)),
                              float(ctx.scalar(IN_EPSILON, st)), bool(ctx.scalar(IN_LAYOUT, BOOL)))


register(INSTANCE_NORMALIZATION, validate=validate_instance_norm, prepare=prepare_instance_norm,
         input_types=(F32, F16), num_inputs=(5,), min_feature_level=FeatureLevel.FL3)


# ---- L2_NORMALIZATION ---------------------------------------------------------------------------

#: TFLite's and AOSP's floor on the float L2 norm (every backend divides by at least this).
L2_EPSILON = 1e-6

L2_AXIS = 1


@dataclass
class L2NormParams:
    axis: int  # non-negative


def validate_l2_norm(ctx: OperationContext) -> None:
    t = ctx.input_type(0)
    ctx.expect_output_type(0, t)
    ctx.expect_input_rank_between(0, 1, MAX_RANK)
    _validate_optional_axis(ctx, L2_AXIS)
    if t in QUANT8:
        ctx.expect_output_quantization(0, *L2_OUTPUT_QUANT[t])


def prepare_l2_norm(ctx: OperationContext) -> L2NormParams:
    x = ctx.input(0)
    ctx.check(1 <= x.rank <= MAX_RANK, f"input 0 must have rank 1 to {MAX_RANK}, got {x.rank}")
    ctx.set_output_shape(0, x.shape)
    return L2NormParams(_prepare_optional_axis(ctx, L2_AXIS))


register(L2_NORMALIZATION, validate=validate_l2_norm, prepare=prepare_l2_norm, input_types=(F32, F16, QU8, QS8),
         num_inputs=(1, 2), min_feature_level=FeatureLevel.FL1,
         type_feature_levels={F16: FeatureLevel.FL3, QU8: FeatureLevel.FL3, QS8: FeatureLevel.FL4})


# ---- LOCAL_RESPONSE_NORMALIZATION ---------------------------------------------------------------

LRN_RADIUS, LRN_BIAS, LRN_ALPHA, LRN_BETA, LRN_AXIS = 1, 2, 3, 4, 5


@dataclass
class LrnParams:
    radius: int
    bias: float
    alpha: float
    beta: float
    axis: int  # non-negative


def _check_radius(ctx: OperationContext, radius: int | None) -> None:
    if radius is not None and radius < 0:
        raise ctx.fail(f"input {LRN_RADIUS}: radius must be >= 0, got {radius}")


def validate_lrn(ctx: OperationContext) -> None:
    t = ctx.input_type(0)
    ctx.expect_output_type(0, t)
    ctx.expect_input_rank_between(0, 1, MAX_RANK)
    _check_radius(ctx, param(ctx, LRN_RADIUS, INT32))
    for i in (LRN_BIAS, LRN_ALPHA, LRN_BETA):
        param(ctx, i, scalar_type(t))
    _validate_optional_axis(ctx, LRN_AXIS)


def prepare_lrn(ctx: OperationContext) -> LrnParams:
    x = ctx.input(0)
    ctx.check(1 <= x.rank <= MAX_RANK, f"input 0 must have rank 1 to {MAX_RANK}, got {x.rank}")
    ctx.set_output_shape(0, x.shape)
    radius = ctx.scalar(LRN_RADIUS, INT32)
    _check_radius(ctx, radius)
    st = scalar_type(x.type)
    return LrnParams(int(radius), float(ctx.scalar(LRN_BIAS, st)), float(ctx.scalar(LRN_ALPHA, st)),
                     float(ctx.scalar(LRN_BETA, st)), _prepare_optional_axis(ctx, LRN_AXIS))


register(LOCAL_RESPONSE_NORMALIZATION, validate=validate_lrn, prepare=prepare_lrn, input_types=(F32, F16),
         num_inputs=(5, 6), min_feature_level=FeatureLevel.FL1, type_feature_levels={F16: FeatureLevel.FL3})
