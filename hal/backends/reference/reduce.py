"""MEAN on numpy: float32, uint8 and int8.

Quantized MEAN reproduces TFLite 2.14's reference kernel (reduce.cc with
BUILTIN_REF -> reference_ops::QuantizedMeanOrSum), which treats every axis set
alike: the multiplier M * 2^shift of in_scale / out_scale absorbs 1/count as
M' = (M << k) // count, shift' = shift - k (k = floor(log2(count)), capped at
32 and at 31 + shift), then

    out = MultiplyByQuantizedMultiplier(sum(q) - count * in_zp, M', shift') + out_zp.

(Checked bit-exact against tflite-runtime 2.14; older TFLite sources with a
separate "Mean4D" path for axes [1, 2] do not describe 2.14.) NNAPI requires the
quantized output to share the input's scale and zero point, which the spec's
validate enforces; the kernel itself would handle different ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hal import quant
from hal.backends.reference import BACKEND
from hal.operations.common import F32, QUANT8
from hal.operations.reduce import MEAN, MeanParams
from hal.registry import OperationContext


@dataclass
class MeanData:
    axes: tuple[int, ...]  # resolved: non-negative, deduplicated, sorted
    out_shape: tuple[int, ...]
    count: int  # elements averaged into each output
    multiplier: int = 0
    shift: int = 0
    input_zero_point: int = 0
    output_zero_point: int = 0


def _mean_multiplier(real: float, count: int) -> tuple[int, int]:
    """QuantizeMultiplier(real) with 1/count folded in, as QuantizedMeanOrSum does it."""
    multiplier, shift = quant.quantize_multiplier(real)
    k = min(count.bit_length() - 1, 32, 31 + shift)
    return (multiplier << k) // count, shift - k


def plan(ctx: OperationContext) -> MeanData:
    p: MeanParams = ctx.params
    x, out = ctx.input(0), ctx.output(0)
    d = MeanData(axes=p.axes, out_shape=p.out_shape, count=math.prod(x.shape[i] for i in p.axes),
                 input_zero_point=x.zero_point, output_zero_point=out.zero_point)
    if x.type in QUANT8 and d.count > 0:
        # PrepareMeanOrSum: float scales promoted to double before dividing.
        real = float(np.float32(x.scale)) / float(np.float32(out.scale))
        d.multiplier, d.shift = _mean_multiplier(real, d.count)
    return d


def execute(ctx: OperationContext, inputs: list) -> list:
    d: MeanData = ctx.data
    x = inputs[0]
    t = ctx.outputs[0].type
    if d.count == 0:  # TFLite fills an empty reduction with NaN (0 for integers)
        return [np.full(d.out_shape, np.nan if t == F32 else 0, x.dtype)]
    if t == F32:
        mean = np.mean(x, axis=d.axes, dtype=np.float64)
        return [mean.astype(np.float32).reshape(d.out_shape)]
    acc = np.sum(x, axis=d.axes, dtype=np.int64) - d.count * d.input_zero_point
    acc = quant.multiply_by_quantized_multiplier(acc, d.multiplier, d.shift) + d.output_zero_point
    return [quant.saturate_cast(acc, t).reshape(d.out_shape)]


BACKEND.register(MEAN, plan=plan, execute=execute)
