"""com.nnhal.tflite: TFLite quantized semantics that no NNAPI operation has, as nnhal's own extension.

QUANTIZED_MEAN (type 0): TFLite's MEAN on TENSOR_QUANT8_ASYMM / TENSOR_QUANT8_ASYMM_SIGNED whose
output quantization differs from the input's (NNAPI's MEAN requires them equal). Signature as
NNAPI's MEAN: 0 input (rank 1-4), 1 axes (TENSOR_INT32, 1-D, negative counting from the end,
duplicates once), 2 keep_dims (INT32, positive = keep); output of the input's type, any scale and
zero point. Arithmetic: TFLite 2.14's reference kernel (reduce.cc EvalMean, BUILTIN_REF ->
EvalQuantizedMean -> reference_ops::QuantizedMeanOrSum, for every axis set), which hal's MEAN
kernel already implements (hal.backends.reference.reduce: in_scale / out_scale as
QuantizeMultiplier, 1/count folded in by integer division, then
MultiplyByQuantizedMultiplier(sum - count * in_zp) + out_zp, saturated). The delegate maps TFLite
MEAN here only when the quantizations differ (delegate/mapping/reduce.py says why no NNAPI rewrite
is exact).

nnhal ships and registers it itself (extensions.registry.load_plugins, and the MEAN mapper in the
client's process): it is not a vendor plugin, and needs no installation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from extensions.registry import Extension, ExtensionOperation
from hal.backends.reference.reduce import _mean_multiplier, execute_mean
from hal.operations.common import I32, INT32, QS8, QU8, param
from hal.operations.reduce import MAX_RANK

NAME = "com.nnhal.tflite"
QUANTIZED_MEAN = 0
INPUT, AXES, KEEP_DIMS = 0, 1, 2


@dataclass
class QuantizedMeanData:
    """hal's MeanData fields (execute_mean reads them), defined here so the compilation cache may
    store it: an extension's plan data may only hold types of its own modules or of hal's core."""

    axes: tuple[int, ...]  # resolved: non-negative, deduplicated, sorted
    out_shape: tuple[int, ...]
    count: int  # elements averaged into each output
    multiplier: int = 0
    shift: int = 0
    input_zero_point: int = 0
    output_zero_point: int = 0


def validate(ctx) -> None:
    ctx.expect_num_inputs(3)
    ctx.expect_num_outputs(1)
    ctx.expect_input_type(INPUT, QU8, QS8)
    ctx.expect_output_type(0, ctx.input_type(INPUT))
    ctx.expect_input_rank_between(INPUT, 1, MAX_RANK)
    ctx.expect_input_type(AXES, I32)
    ctx.expect_input_rank(AXES, 1)
    param(ctx, KEEP_DIMS, INT32)


def prepare(ctx) -> QuantizedMeanData:
    shape = ctx.input_shape(INPUT)
    rank = len(shape)
    ctx.check(1 <= rank <= MAX_RANK, f"input 0 must have rank 1 to {MAX_RANK}, got {rank}")
    raw = [int(a) for a in np.asarray(ctx.constant(AXES)).reshape(-1)]
    for a in raw:
        ctx.check(-rank <= a < rank, f"axis {a} is out of range for an input of rank {rank}")
    axes = tuple(sorted({a % rank for a in raw}))
    if ctx.scalar(KEEP_DIMS, INT32) > 0:
        out_shape = tuple(1 if i in axes else d for i, d in enumerate(shape))
    else:
        out_shape = tuple(d for i, d in enumerate(shape) if i not in axes) or (1,)
    ctx.set_output_shape(0, out_shape)
    x, out = ctx.input(INPUT), ctx.output(0)
    d = QuantizedMeanData(axes=axes, out_shape=out_shape, count=math.prod(shape[i] for i in axes),
                 input_zero_point=x.zero_point, output_zero_point=out.zero_point)
    if d.count > 0:
        # PrepareMeanOrSum: the float scales promoted to double before dividing.
        d.multiplier, d.shift = _mean_multiplier(float(np.float32(x.scale)) / float(np.float32(out.scale)),
                                                 d.count)
    return d


def execute(ctx, inputs: list) -> list:
    return execute_mean(ctx, inputs)  # reads ctx.data, prepare's QuantizedMeanData


EXTENSION = Extension(
    name=NAME, version="1.0",
    operations=(ExtensionOperation(QUANTIZED_MEAN, "QUANTIZED_MEAN", validate, prepare, execute),),
    description="TFLite quantized semantics NNAPI lacks (MEAN with a different output quantization)")


def ensure_registered() -> None:
    """Register the extension in this process unless it is (the delegate's mappers call this)."""
    from extensions.registry import lookup, register
    if lookup(NAME) is None:
        register(EXTENSION)
