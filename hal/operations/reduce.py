"""MEAN and the REDUCE_* family: NNAPI's signatures, rules and output shapes.

Inputs: 0 the tensor (rank 1 to 4); 1 the axes, a 1-D TENSOR_INT32 (values in [-rank, rank),
negative ones counting from the end, duplicates allowed; an empty list reduces nothing: NNAPI 1.3
notes that MEAN's original "empty means every axis" was never implemented); 2 keep_dims (reduced
dimensions stay, with length 1): an INT32 scalar for MEAN (positive means true), a BOOL scalar for
REDUCE_*. Reducing every dimension without keep_dims gives shape [1]. The output has input 0's type.

* MEAN (1.1): TENSOR_FLOAT32, TENSOR_QUANT8_ASYMM; TENSOR_FLOAT16 (1.2); TENSOR_QUANT8_ASYMM_SIGNED
  (1.3). A quantized output must have the input's scale and zero point.
* REDUCE_SUM, REDUCE_PROD (1.2): TENSOR_FLOAT16, TENSOR_FLOAT32.
* REDUCE_MAX, REDUCE_MIN (1.2): TENSOR_FLOAT16, TENSOR_FLOAT32, TENSOR_QUANT8_ASYMM;
  TENSOR_QUANT8_ASYMM_SIGNED (1.3). A quantized output has the input's scale and zero point.
* REDUCE_ALL, REDUCE_ANY (1.2): TENSOR_BOOL8.
"""
from __future__ import annotations

from dataclasses import dataclass

from hal.operations.common import BOOL, F16, F32, I32, INT32, QS8, QU8, QUANT8, param
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperandType, OperationType

MEAN = OperationType.MEAN
REDUCE_SUM, REDUCE_PROD = OperationType.REDUCE_SUM, OperationType.REDUCE_PROD
REDUCE_MAX, REDUCE_MIN = OperationType.REDUCE_MAX, OperationType.REDUCE_MIN
REDUCE_ALL, REDUCE_ANY = OperationType.REDUCE_ALL, OperationType.REDUCE_ANY
BOOL8 = OperandType.TENSOR_BOOL8

#: Input-0 types each operation is defined for here.
TYPES = {MEAN: (F32, F16, QU8, QS8), REDUCE_SUM: (F32, F16), REDUCE_PROD: (F32, F16),
         REDUCE_MAX: (F32, F16, QU8, QS8), REDUCE_MIN: (F32, F16, QU8, QS8),
         REDUCE_ALL: (BOOL8,), REDUCE_ANY: (BOOL8,)}
REDUCE_OPS = (REDUCE_SUM, REDUCE_PROD, REDUCE_MAX, REDUCE_MIN, REDUCE_ALL, REDUCE_ANY)
MAX_RANK = 4

INPUT, AXES, KEEP_DIMS = 0, 1, 2


@dataclass
class ReduceParams:
    """Resolved reduction: what every backend computes from."""

    axes: tuple[int, ...]  # non-negative, deduplicated, sorted (empty: nothing is reduced)
    keep_dims: bool
    out_shape: tuple[int, ...]



def _keep_dims_type(ctx: OperationContext) -> int:
    return INT32 if ctx.op_type == MEAN else BOOL


def validate(ctx: OperationContext) -> None:
    t = ctx.input_type(INPUT)
    ctx.expect_output_type(0, t)
    ctx.expect_input_rank_between(INPUT, 1, MAX_RANK)
    ctx.expect_input_type(AXES, I32)
    ctx.expect_input_rank(AXES, 1)
    param(ctx, KEEP_DIMS, _keep_dims_type(ctx))
    if t in QUANT8:
        ctx.expect_same_quantization(INPUT)


def _axes(ctx: OperationContext, rank: int) -> tuple[int, ...]:
    """Resolved axes (negative values count from the end; duplicates count once)."""
    raw = [int(a) for a in ctx.constant(AXES).reshape(-1)]
    for a in raw:
        ctx.check(-rank <= a < rank, f"axis {a} is out of range for an input of rank {rank}")
    return tuple(sorted({a % rank for a in raw}))


def prepare(ctx: OperationContext) -> ReduceParams:
    return resolve(ctx, _keep_dims_type(ctx))


def resolve(ctx: OperationContext, keep_dims_type: int) -> ReduceParams:
    """The axes and output shape of a (input, axes, keep_dims) reduction, output shape set; an INT32
    keep_dims means true when positive (MEAN's, and operations shaped like it in extensions)."""
    shape = ctx.input_shape(INPUT)
    ctx.check(1 <= len(shape) <= MAX_RANK, f"input 0 must have rank 1 to {MAX_RANK}, got {len(shape)}")
    axes = _axes(ctx, len(shape))
    keep = ctx.scalar(KEEP_DIMS, keep_dims_type)
    keep = keep > 0 if keep_dims_type == INT32 else bool(keep)
    if keep:
        out_shape = tuple(1 if i in axes else d for i, d in enumerate(shape))
    else:
        out_shape = tuple(d for i, d in enumerate(shape) if i not in axes) or (1,)
    ctx.set_output_shape(0, out_shape)
    return ReduceParams(axes, keep, out_shape)


# Zero-sized inputs: an empty MEAN gives NaN (0 when quantized), as TFLite's MEAN does. AOSP does
# not allow them for REDUCE_*.
register(MEAN, validate=validate, prepare=prepare, input_types=TYPES[MEAN], num_inputs=(3,),
         allow_zero_sized_inputs=True, min_feature_level=FeatureLevel.FL2,
         type_feature_levels={F16: FeatureLevel.FL3, QS8: FeatureLevel.FL4})
for _op in REDUCE_OPS:
    register(_op, validate=validate, prepare=prepare, input_types=TYPES[_op], num_inputs=(3,),
             min_feature_level=FeatureLevel.FL3, type_feature_levels={QS8: FeatureLevel.FL4})
