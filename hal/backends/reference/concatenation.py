"""CONCATENATION on numpy, quantized inputs requantized as TFLite and AOSP do.

TFLite's reference kernel (reference_ops::ConcatenationWithScaling, uint8) copies inputs whose
quantization equals the output's and requantizes the others in float32:
``round(q * (s_in * (1 / s_out)) + (-zp_in * that)) + zp_out``, clamped to [0, 255]. The same
float32 operations run here in the same order. For int8, TFLite refuses differing scales; this
follows AOSP's CPU driver, which shifts int8 values and zero points by +128 and runs the uint8
kernel.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal import quant
from hal.backends.reference import BACKEND
from hal.operations.common import QS8, QUANT8
from hal.operations.concatenation import ConcatParams, axis_input
from hal.registry import OperationContext
from hal.types import OperationType

f32 = np.float32


@dataclass
class InputRescale:
    """How one quantized input reaches the output's quantization (None in ConcatData: copy)."""

    scale: np.float32
    bias: np.float32


@dataclass
class ConcatData:
    axis: int
    rescale: list[InputRescale | None]
    out_zero_point: int = 0  # in the uint8 domain (int8 shifted by +128)
    shift: int = 0  # 128 for int8 (AOSP's int8 -> uint8 detour), else 0


def plan(ctx: OperationContext) -> ConcatData:
    p: ConcatParams = ctx.params
    n = axis_input(ctx)
    first, out = ctx.input(0), ctx.output(0)
    data = ConcatData(p.axis, [None] * n)
    if first.type in QUANT8:
        data.shift = 128 if first.type == QS8 else 0
        data.out_zero_point = out.zero_point + data.shift
        inverse_out = f32(1) / f32(out.scale)
        for i in range(n):
            q = ctx.input(i)
            if q.zero_point == out.zero_point and f32(q.scale) == f32(out.scale):
                continue  # TFLite: memcpy
            scale = f32(q.scale) * inverse_out
            data.rescale[i] = InputRescale(scale, f32(-(q.zero_point + data.shift)) * scale)
    return data


def execute(ctx: OperationContext, inputs: list) -> list:
    d: ConcatData = ctx.data
    parts = []
    for x, r in zip(inputs[:-1], d.rescale, strict=True):
        if r is not None:
            v = (x.astype(np.int32) + d.shift).astype(f32) * r.scale + r.bias  # float32 throughout
            q = quant.round_half_away(v).astype(np.int32) + d.out_zero_point
            x = (np.clip(q, 0, 255) - d.shift).astype(x.dtype)
        parts.append(x)
    return [np.concatenate(parts, axis=d.axis)]


BACKEND.register(OperationType.CONCATENATION, plan=plan, execute=execute)
