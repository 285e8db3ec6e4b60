"""MEAN and REDUCE_* on numpy.

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

REDUCE_SUM and REDUCE_PROD accumulate in float32 one element at a time, in the input's row-major
order, as TFLite's reference ReduceGeneric and AOSP's CPU kernel do (numpy's pairwise sum would
round differently). REDUCE_MAX / REDUCE_MIN are exact for every type: quantized ones compare the
stored values (input and output share one quantization). float16 runs through the float32 kernels.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hal import quant
from hal.backends.reference import BACKEND
from hal.operations.common import F32, QUANT8
from hal.operations.reduce import (
    MEAN,
    REDUCE_ALL,
    REDUCE_ANY,
    REDUCE_MAX,
    REDUCE_MIN,
    REDUCE_PROD,
    REDUCE_SUM,
    ReduceParams,
)
from hal.registry import OperationContext

# ---- MEAN ----------------------------------------------------------------------------------------

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


def plan_mean(ctx: OperationContext, p: ReduceParams | None = None) -> MeanData:
    """``p``: the resolved reduction when not ``ctx.params`` (an extension's MEAN-shaped operation)."""
    p = ctx.params if p is None else p
    x, out = ctx.input(0), ctx.output(0)
    d = MeanData(axes=p.axes, out_shape=p.out_shape, count=math.prod(x.shape[i] for i in p.axes),
                 input_zero_point=x.zero_point, output_zero_point=out.zero_point)
    if x.type in QUANT8 and d.count > 0:
        # PrepareMeanOrSum: float scales promoted to double before dividing.
        real = float(np.float32(x.scale)) / float(np.float32(out.scale))
        d.multiplier, d.shift = _mean_multiplier(real, d.count)
    return d


def execute_mean(ctx: OperationContext, inputs: list) -> list:
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


# ---- REDUCE_* ------------------------------------------------------------------------------------

@dataclass
class ReduceData:
    axes: tuple[int, ...]  # resolved: non-negative, deduplicated, sorted (empty: identity)
    out_shape: tuple[int, ...]


def plan_reduce(ctx: OperationContext) -> ReduceData:
    p: ReduceParams = ctx.params
    return ReduceData(tuple(p.axes), tuple(p.out_shape))


def _rows(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """x as a 2-D array [outputs, reduced elements], each row in the input's row-major order."""
    kept = [i for i in range(x.ndim) if i not in axes]
    count = math.prod(x.shape[i] for i in axes)
    return np.transpose(x, kept + list(axes)).reshape(-1, count)


def _sequential(ufunc):
    """A float32 sum or product accumulated one element after the other (no pairwise rounding)."""
    def reduce(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        rows = _rows(x, axes)
        return ufunc.accumulate(rows, axis=1, dtype=x.dtype)[:, -1]
    return reduce


_REDUCERS = {
    REDUCE_SUM: _sequential(np.add),
    REDUCE_PROD: _sequential(np.multiply),
    REDUCE_MAX: lambda x, axes: np.max(x, axis=axes),
    REDUCE_MIN: lambda x, axes: np.min(x, axis=axes),
    REDUCE_ANY: lambda x, axes: np.any(x, axis=axes),
    REDUCE_ALL: lambda x, axes: np.all(x, axis=axes),
}


def execute_reduce(ctx: OperationContext, inputs: list) -> list:
    d: ReduceData = ctx.data
    x = inputs[0]
    y = _REDUCERS[ctx.op_type](x, d.axes)
    return [np.asarray(y, dtype=x.dtype).reshape(d.out_shape)]


BACKEND.register(MEAN, plan=plan_mean, execute=execute_mean)
BACKEND.register(list(_REDUCERS), plan=plan_reduce, execute=execute_reduce)
