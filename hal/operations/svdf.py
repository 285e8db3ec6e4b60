"""SVDF (NNAPI 1.0): a singular value decomposition filter, a fully connected layer whose
[num_units, input_size * memory_size] weights are factored, per unit, into ``rank`` pairs of a
feature filter and a time filter, with the recent feature activations kept as state.

Inputs: 0 input [batch, input_size]; 1 weights_feature [num_filters, input_size] and 2 weights_time
[num_filters, memory_size], where num_filters = num_units * rank; 3 bias [num_units] (optional);
4 state_in [batch, memory_size * num_filters] (each filter's last memory_size activations, oldest
first, as AOSP's kernel and the CTS vectors lay it out); 5 rank (INT32 >= 1, dividing num_filters);
6 the fused activation (INT32). Types: TENSOR_FLOAT32 (1.0) or TENSOR_FLOAT16 (1.2), every
tensor of input 0's type. Outputs: 0 state_out, shaped as state_in; 1 output [batch, num_units].
"""
from __future__ import annotations

from dataclasses import dataclass

from hal.operations.common import F16, F32, INT32, fused_activation, param
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperationType

SVDF = OperationType.SVDF
TYPES = (F32, F16)

INPUT, WEIGHTS_FEATURE, WEIGHTS_TIME, BIAS, STATE_IN, RANK, ACTIVATION = range(7)
STATE_OUT, OUTPUT = 0, 1


@dataclass
class SvdfParams:
    batch: int
    input_size: int
    num_filters: int
    num_units: int
    memory_size: int
    rank: int
    act: int


def validate(ctx: OperationContext) -> None:
    t = ctx.input_type(INPUT)
    for i in (WEIGHTS_FEATURE, WEIGHTS_TIME, BIAS, STATE_IN):
        if ctx.has_input(i):
            ctx.expect_input_type(i, t)
    ctx.expect_output_type(STATE_OUT, t)
    ctx.expect_output_type(OUTPUT, t)
    for i, rank in ((INPUT, 2), (WEIGHTS_FEATURE, 2), (WEIGHTS_TIME, 2), (STATE_IN, 2)):
        ctx.expect_input_rank(i, rank)
    if ctx.has_input(BIAS):
        ctx.expect_input_rank(BIAS, 1)
    rank = param(ctx, RANK, INT32)
    ctx.check(rank is None or rank >= 1, f"rank must be >= 1, got {rank}")
    fused_activation(ctx, ACTIVATION)


def prepare(ctx: OperationContext) -> SvdfParams:
    x, wf, wt, s = (ctx.input_shape(i) for i in (INPUT, WEIGHTS_FEATURE, WEIGHTS_TIME, STATE_IN))
    ctx.check(len(x) == 2 and len(wf) == 2 and len(wt) == 2 and len(s) == 2,
              "input, weights_feature, weights_time and state_in must be rank 2")
    rank = ctx.scalar(RANK, INT32)
    ctx.check(rank >= 1, f"rank must be >= 1, got {rank}")
    batch, input_size = x
    num_filters, memory_size = wf[0], wt[1]
    ctx.check(num_filters % rank == 0, f"weights_feature has {num_filters} filters, not a multiple of rank {rank}")
    num_units = num_filters // rank
    ctx.check(wf[1] == input_size, f"weights_feature {list(wf)} does not match input size {input_size}")
    ctx.check(wt[0] == num_filters, f"weights_time {list(wt)} must have {num_filters} rows (num_units * rank)")
    ctx.check(memory_size >= 1, f"weights_time {list(wt)}: memory_size must be >= 1")
    if ctx.has_input(BIAS):
        b = ctx.input_shape(BIAS)
        ctx.check(len(b) == 1 and b[0] == num_units, f"bias {list(b)} must be [{num_units}]")
    ctx.check(tuple(s) == (batch, memory_size * num_filters),
              f"state_in {list(s)} must be [{batch}, {memory_size * num_filters}] (batch, memory_size * num_filters)")
    ctx.set_output_shape(STATE_OUT, (batch, memory_size * num_filters))
    ctx.set_output_shape(OUTPUT, (batch, num_units))
    return SvdfParams(batch, input_size, num_filters, num_units, memory_size, rank,
                      int(fused_activation(ctx, ACTIVATION)))


register(SVDF, validate=validate, prepare=prepare, input_types=TYPES, num_inputs=(7,), num_outputs=(2,),
         optional_inputs=(BIAS,), min_feature_level=FeatureLevel.FL1, type_feature_levels={F16: FeatureLevel.FL3})
