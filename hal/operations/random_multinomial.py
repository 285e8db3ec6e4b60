"""RANDOM_MULTINOMIAL (NNAPI 1.2): draws class indices from the categorical distribution
softmax(logits), per batch.

Inputs: 0 logits [batches, classes] (TENSOR_FLOAT32 or TENSOR_FLOAT16); 1 sample_count (INT32
scalar, >= 1); 2 seeds, a TENSOR_INT32 [2] seeding the generator (TensorFlow's seed and seed2:
the same seeds give the same samples; two zeros ask for a fresh, unreproducible seed). Output:
TENSOR_INT32 [batches, sample_count], each in [0, classes). Non-finite logits get probability 0.
The generator is this driver's own: NNAPI fixes the distribution, not the bit stream (CTS judges
class frequencies).
"""
from __future__ import annotations

from dataclasses import dataclass

from hal.operations.common import F16, F32, I32, INT32, param
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperationType

RANDOM_MULTINOMIAL = OperationType.RANDOM_MULTINOMIAL
TYPES = (F32, F16)

INPUT, SAMPLE_COUNT, SEEDS = 0, 1, 2


@dataclass
class RandomMultinomialParams:
    batches: int
    classes: int
    sample_count: int


def validate(ctx: OperationContext) -> None:
    ctx.expect_input_rank(INPUT, 2)
    ctx.expect_input_type(SEEDS, I32)
    ctx.expect_input_rank(SEEDS, 1)
    ctx.expect_output_type(0, I32)
    n = param(ctx, SAMPLE_COUNT, INT32)
    ctx.check(n is None or n >= 1, f"sample_count must be >= 1, got {n}")


def prepare(ctx: OperationContext) -> RandomMultinomialParams:
    x, seeds = ctx.input_shape(INPUT), ctx.input_shape(SEEDS)
    ctx.check(len(x) == 2, f"input must be rank 2 [batches, classes], got {list(x)}")
    ctx.check(tuple(seeds) == (2,), f"seeds must be a [2] tensor, got {list(seeds)}")
    n = ctx.scalar(SAMPLE_COUNT, INT32)
    ctx.check(n >= 1, f"sample_count must be >= 1, got {n}")
    ctx.set_output_shape(0, (x[0], n))
    return RandomMultinomialParams(x[0], x[1], n)


register(RANDOM_MULTINOMIAL, validate=validate, prepare=prepare, input_types=TYPES, num_inputs=(3,),
         min_feature_level=FeatureLevel.FL3)
