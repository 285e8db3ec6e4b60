"""LSH_PROJECTION (NNAPI 1.0): locality-sensitive hashing of the input's rows into bits.

Inputs: 0 hash, the seeds [num_hash, num_bits] (TENSOR_FLOAT32, or TENSOR_FLOAT16 since 1.2;
num_bits <= 32); 1 input (rank >= 1, any tensor type: its rows along dimension 0 are hashed as
raw bytes); 2 weight (optional) [input rows], of input 0's type (omitted: every row weighs 1);
3 type (INT32): 1 SPARSE_DEPRECATED, 2 DENSE, 3 SPARSE (1.2). Each (hash function i, bit j) is
the sign of sum over rows r of weight[r] * Fingerprint64(float32 seed[i, j] bytes + row r bytes),
the fingerprint read as a signed 64-bit integer (1 when the sum is > 0). Output TENSOR_INT32:
DENSE gives every bit, [num_hash * num_bits]; the sparse types pack each function's bits into
one integer (first bit most significant), [num_hash], SPARSE adding i << num_bits so that the
functions' codes never collide (SPARSE_DEPRECATED, NNAPI 1.0's SPARSE, does not).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from hal.operations.common import F16, F32, I32, INT32, param
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperationType

LSH_PROJECTION = OperationType.LSH_PROJECTION
TYPES = (F32, F16)

HASH, INPUT, WEIGHT, TYPE = 0, 1, 2, 3
MAX_BITS = 32


class LshProjectionType(enum.IntEnum):
    SPARSE_DEPRECATED = 1
    DENSE = 2
    SPARSE = 3


@dataclass
class LshProjectionParams:
    type: LshProjectionType
    num_hash: int
    num_bits: int
    rows: int


def _type(ctx: OperationContext) -> LshProjectionType | None:
    v = param(ctx, TYPE, INT32)
    if v is None:
        return None
    try:
        return LshProjectionType(v)
    except ValueError:
        raise ctx.fail(f"type must be 1 (SPARSE_DEPRECATED), 2 (DENSE) or 3 (SPARSE), got {v}") from None


def validate(ctx: OperationContext) -> None:
    t = ctx.input_type(HASH)
    ctx.expect_input_rank(HASH, 2)
    ctx.expect_input_rank_between(INPUT, 1, None)
    if ctx.has_input(WEIGHT):
        ctx.expect_input_type(WEIGHT, t)
        ctx.expect_input_rank(WEIGHT, 1)
    ctx.expect_output_type(0, I32)
    _type(ctx)


def prepare(ctx: OperationContext) -> LshProjectionParams:
    h, x = ctx.input_shape(HASH), ctx.input_shape(INPUT)
    ctx.check(len(h) == 2, f"hash must be rank 2 [num_hash, num_bits], got {list(h)}")
    ctx.check(len(x) >= 1, "input must have rank >= 1")
    num_hash, num_bits = h
    ctx.check(num_bits <= MAX_BITS, f"num_bits (hash dimension 1) must be <= {MAX_BITS}, got {num_bits}")
    kind = _type(ctx)
    if ctx.has_input(WEIGHT):
        w = ctx.input_shape(WEIGHT)
        ctx.check(len(w) == 1 and w[0] == x[0], f"weight {list(w)} must be [{x[0]}] (the input's rows)")
    ctx.set_output_shape(0, (num_hash * num_bits,) if kind == LshProjectionType.DENSE else (num_hash,))
    return LshProjectionParams(kind, num_hash, num_bits, x[0])


register(LSH_PROJECTION, validate=validate, prepare=prepare, input_types=TYPES, num_inputs=(4,),
         optional_inputs=(WEIGHT,), min_feature_level=FeatureLevel.FL1, type_feature_levels={F16: FeatureLevel.FL3})
