"""PAD on numpy: a tensor filled with the logical zero (0.0, or the zero point when quantized),
the input copied into its window.

The plan stores the window as (start, stop) pairs; execute builds the ``slice`` objects (the
compilation cache stores plain ints only).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal.backends.reference import BACKEND
from hal.operations.common import QUANT8
from hal.operations.pad import PadParams
from hal.registry import OperationContext
from hal.types import OperationType


@dataclass
class PadData:
    out_shape: tuple[int, ...]
    window: tuple[tuple[int, int], ...]  # (start, stop) per dimension: where the input lands in the output
    value: float | int


def plan(ctx: OperationContext) -> PadData:
    p: PadParams = ctx.params
    shape = ctx.input_shape(0)
    window = tuple((b, b + d) for d, (b, _) in zip(shape, p.paddings, strict=True))
    info = ctx.input(0)
    return PadData(tuple(p.out_shape), window, info.zero_point if info.type in QUANT8 else 0.0)


def execute(ctx: OperationContext, inputs: list) -> list:
    d: PadData = ctx.data
    x = inputs[0]
    y = np.full(d.out_shape, d.value, dtype=x.dtype)
    y[tuple(slice(a, b) for a, b in d.window)] = x
    return [y]


BACKEND.register(OperationType.PAD, plan=plan, execute=execute)
