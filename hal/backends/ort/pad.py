"""PAD, PAD_V2 and MIRROR_PAD as ONNX Pad (and Gather for SYMMETRIC).

PAD pads with 0.0, PAD_V2 with its float32 scalar (``ctx.params.value``); ONNX Pad's "constant"
mode with the (before..., after...) pads. MIRROR_PAD's REFLECT (the edge not repeated) is ONNX
Pad's "reflect"; ONNX has no SYMMETRIC (edge repeated), so each padded axis gathers its rows
through constant indices (numpy's "symmetric" padding of arange(dim)). Values are only copied:
int32 is exact too. A 4-D input that exists in NCHW is padded there (the paddings permuted).
"""
from __future__ import annotations

import numpy as np

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph, nchw_axis
from hal.backends.ort.shape import zero_sized
from hal.operations.common import F32, I32
from hal.operations.pad import REFLECT, MirrorPadParams, PadParams
from hal.registry import OperationContext
from hal.types import OperationType

#: The types lower_mirror_pad is exact for (values are only copied).
MIRROR_PAD_TYPES = (F32, I32)


def _onnx_pads(paddings) -> list[int]:
    return [b for b, _ in paddings] + [a for _, a in paddings]


def _in_layout(g: OnnxGraph, x: str, paddings, pad) -> str:
    """``pad(value, paddings, axis_of)`` on ``x``, in NCHW when x exists there (4-D)."""
    if len(paddings) != 4 or not g.in_nchw(x):
        return pad(x, list(paddings), lambda axis: axis)
    nchw = list(paddings)
    for a in range(4):
        nchw[nchw_axis(a)] = paddings[a]
    return g.nhwc(pad(g.nchw(x), nchw, nchw_axis))


def lower_pad(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: PadParams = ctx.params
    if not any(b or a for b, a in p.paddings):
        return [g.node("Identity", [x[0]])]
    value = g.const(np.float32(p.value), "pad_value")
    return [_in_layout(g, x[0], p.paddings, lambda v, paddings, _: g.node(
        "Pad", [v, g.ints(_onnx_pads(paddings)), value], mode="constant"))]


def lower_mirror_pad(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: MirrorPadParams = ctx.params
    if not any(b or a for b, a in p.paddings):
        return [g.node("Identity", [x[0]])]
    if p.mode == REFLECT:
        return [_in_layout(g, x[0], p.paddings, lambda v, paddings, _: g.node(
            "Pad", [v, g.ints(_onnx_pads(paddings))], mode="reflect"))]
    shape = ctx.input(0).shape

    def symmetric(y: str, paddings, axis_of) -> str:
        for axis, (dim, (before, after)) in enumerate(zip(shape, p.paddings, strict=True)):
            if before or after:
                index = np.pad(np.arange(dim, dtype=np.int64), (before, after), mode="symmetric")
                y = g.node("Gather", [y, g.const(index, "mirror_index")], axis=axis_of(axis))
        return y
    return [_in_layout(g, x[0], p.paddings, symmetric)]


BACKEND.lowering([OperationType.PAD, OperationType.PAD_V2], lower=lower_pad, types=[F32], supports=zero_sized)
BACKEND.lowering(OperationType.MIRROR_PAD, lower=lower_mirror_pad, types=MIRROR_PAD_TYPES, supports=zero_sized)
