"""BATCH_TO_SPACE_ND and SPACE_TO_BATCH_ND as Reshape / Transpose / Reshape in NHWC.

ONNX has no such operators; the reference kernel's 6-D shuffle is written here node for node
(block offsets to the batch in TensorFlow's order: output batch (dy * bw + dx) * batch + b).
SPACE_TO_BATCH_ND first pads height and width with 0.0. NCHW operands are transposed to NHWC and
back. Values are only moved: exact.
"""
from __future__ import annotations

import numpy as np

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph
from hal.backends.ort.shape import reshape_to, zero_sized
from hal.operations.batch_space import BatchSpaceParams
from hal.operations.common import F32
from hal.registry import OperationContext
from hal.types import OperationType


def _shuffle(g: OnnxGraph, x: str, split, perm, out) -> str:
    y = reshape_to(g, x, split)
    y = g.node("Transpose", [y], perm=list(perm))
    return reshape_to(g, y, out)


def lower_batch_space(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: BatchSpaceParams = ctx.params
    y = g.nhwc(x[0]) if p.nchw else x[0]
    shape = ctx.input(0).shape
    n, h, w, c = (shape[0], shape[2], shape[3], shape[1]) if p.nchw else shape
    bh, bw = p.block
    if ctx.op_type == OperationType.BATCH_TO_SPACE_ND:
        batch = n // (bh * bw)
        y = _shuffle(g, y, [bh, bw, batch, h, w, c], (2, 3, 0, 4, 1, 5), [batch, h * bh, w * bw, c])
    else:
        (top, bottom), (left, right) = p.paddings
        if top or bottom or left or right:
            pads = g.ints([0, top, left, 0, 0, bottom, right, 0])
            y = g.node("Pad", [y, pads, g.const(np.float32(0))], mode="constant")
            h, w = h + top + bottom, w + left + right
        y = _shuffle(g, y, [n, h // bh, bh, w // bw, bw, c], (2, 4, 0, 1, 3, 5),
                     [n * bh * bw, h // bh, w // bw, c])
    return [g.nchw(y) if p.nchw else y]


BACKEND.lowering([OperationType.BATCH_TO_SPACE_ND, OperationType.SPACE_TO_BATCH_ND], lower=lower_batch_space,
                 types=[F32], supports=zero_sized)
