"""PAD: constant padding with the logical zero (0.0, or the zero point when quantized).

NNAPI (since 1.2) and TFLite's PAD without a constant_values input both pad a
quantized tensor with its zero point; scale and zero point are unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal.operations._legacy import register
from hal.operations.common import I32, QUANT8
from hal.operations.shape import MAX_RANK, SHAPE_TYPES, need_shape, validate_same_io
from hal.registry import OperationContext
from hal.types import OperationType


@dataclass
class PadData:
    out_shape: tuple[int, ...]
    window: tuple[slice, ...]  # where the input lands in the output
    value: float | int


def _paddings(ctx: OperationContext, rank: int | None) -> np.ndarray | None:
    ctx.expect_input_type(1, I32)
    info = ctx.input(1)
    shape = info.value.shape if info.is_constant else info.shape
    if shape and (len(shape) != 2 or shape[1] != 2 or (rank is not None and shape[0] != rank)):
        want = f"[{rank}, 2]" if rank is not None else "[rank, 2]"
        raise ctx.fail(f"input 1 (paddings) must have shape {want}, got {list(shape)}")
    if not info.is_constant:
        return None
    pads = info.value
    if np.any(pads < 0):
        raise ctx.fail(f"input 1 (paddings) must be non-negative, got {pads.tolist()}")
    return pads


def _validate(ctx: OperationContext) -> None:
    ctx.expect_num_inputs(2)
    validate_same_io(ctx, MAX_RANK)
    info = ctx.input(0)
    _paddings(ctx, info.rank if info.shape else None)


def _prepare(ctx: OperationContext) -> PadData:
    shape = need_shape(ctx)
    pads = _paddings(ctx, len(shape))
    if pads is None:
        raise ctx.fail("input 1 (paddings) must be a constant operand for this driver")
    out = tuple(int(b + d + a) for d, (b, a) in zip(shape, pads.tolist(), strict=True))
    ctx.set_output_shape(0, out)
    window = tuple(slice(int(b), int(b) + d) for d, (b, _) in zip(shape, pads.tolist(), strict=True))
    info = ctx.input(0)
    return PadData(out, window, info.zero_point if info.type in QUANT8 else 0.0)


def _execute(ctx: OperationContext, inputs: list) -> list:
    d: PadData = ctx.data
    x = inputs[0]
    y = np.full(d.out_shape, d.value, dtype=x.dtype)
    y[d.window] = x
    return [y]


register(OperationType.PAD, validate=_validate, prepare=_prepare, execute=_execute,
         supported_types=SHAPE_TYPES)
