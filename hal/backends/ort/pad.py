"""PAD, PAD_V2 and MIRROR_PAD as ONNX Pad (and Gather for SYMMETRIC).

PAD pads with 0.0, PAD_V2 with its float32 scalar (``ctx.params.value``); ONNX Pad's "constant"
mode with the (before..., after...) pads. MIRROR_PAD's REFLECT (the edge not repeated) is ONNX
Pad's "reflect"; ONNX has no SYMMETRIC (edge repeated), so each padded axis gathers its rows
through constant indices (numpy's "symmetric" padding of arange(dim)). Values are only copied:
int32 is exact too.
"""
from __future__ import annotations

import numpy as np

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph
from hal.backends.ort.shape import zero_sized
from hal.operations.common import F32, I32
from hal.operations.pad import REFLECT, MirrorPadParams, PadParams
from hal.registry import OperationContext
from hal.types import OperationType

#: The types lower_mirror_pad is exact for (values are only copied).
MIRROR_PAD_TYPES = (F32, I32)


def _onnx_pads(paddings) -> list[int]:
    return [b for b, _ in paddings] + [a for _, a in paddings]


def lower_pad(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: PadParams = ctx.params
    if not any(b or a for b, a in p.paddings):
        return [g.node("Identity", [x[0]])]
    value = g.const(np.float32(p.value), "pad_value")
    return [g.node("Pad", [x[0], g.ints(_onnx_pads(p.paddings)), value], mode="constant")]


def lower_mirror_pad(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: MirrorPadParams = ctx.params
    if not any(b or a for b, a in p.paddings):
        return [g.node("Identity", [x[0]])]
    if p.mode == REFLECT:
        return [g.node("Pad", [x[0], g.ints(_onnx_pads(p.paddings))], mode="reflect")]
    y = x[0]
    for axis, (dim, (before, after)) in enumerate(zip(ctx.input(0).shape, p.paddings, strict=True)):
        if before or after:
            index = np.pad(np.arange(dim, dtype=np.int64), (before, after), mode="symmetric")
            y = g.node("Gather", [y, g.const(index, "mirror_index")], axis=axis)
    return [y]


BACKEND.lowering([OperationType.PAD, OperationType.PAD_V2], lower=lower_pad, types=[F32], supports=zero_sized)
BACKEND.lowering(OperationType.MIRROR_PAD, lower=lower_mirror_pad, types=MIRROR_PAD_TYPES, supports=zero_sized)
