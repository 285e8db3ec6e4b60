"""RESHAPE, SQUEEZE, TRANSPOSE, DEPTH_TO_SPACE, SPACE_TO_DEPTH on numpy.

None of them changes a value, so quantized tensors need no arithmetic: NNAPI requires the output's
scale and zero point to equal the input's (the spec checks it), and every type runs the same numpy
index shuffle. Outputs are fresh arrays, never views of an input, so a caller may reuse its input
buffers.
"""
from __future__ import annotations

import numpy as np

from hal.backends.reference import BACKEND
from hal.operations.shape import BlockParams, ReshapeParams, TransposeParams
from hal.registry import OperationContext
from hal.types import OperationType

# ---- RESHAPE / SQUEEZE ----------------------------------------------------------------

def _plan_reshape(ctx: OperationContext) -> tuple[int, ...]:
    p: ReshapeParams = ctx.params
    return tuple(p.shape)


def _copy(ctx: OperationContext, inputs: list) -> list:
    return [np.array(inputs[0], copy=True).reshape(ctx.data)]


# ---- TRANSPOSE ----------------------------------------------------------------------

def _plan_transpose(ctx: OperationContext) -> tuple[int, ...]:
    p: TransposeParams = ctx.params
    return tuple(p.perm)


def _execute_transpose(ctx: OperationContext, inputs: list) -> list:
    return [np.ascontiguousarray(np.transpose(inputs[0], ctx.data))]


# ---- DEPTH_TO_SPACE / SPACE_TO_DEPTH -------------------------------------------------

def _plan_block(ctx: OperationContext) -> BlockParams:
    return ctx.params  # block size and layout: all execute needs


def _execute_block(ctx: OperationContext, inputs: list) -> list:
    """TFLite's layout: depth index (dy * block + dx) * c_small + c, in NHWC."""
    d: BlockParams = ctx.data
    x = inputs[0]
    if d.nchw:
        x = np.transpose(x, (0, 2, 3, 1))
    n, h, w, c = x.shape
    b = d.block
    if ctx.op_type == OperationType.DEPTH_TO_SPACE:
        y = x.reshape(n, h, w, b, b, c // (b * b)).transpose(0, 1, 3, 2, 4, 5)
        y = y.reshape(n, h * b, w * b, c // (b * b))
    else:
        y = x.reshape(n, h // b, b, w // b, b, c).transpose(0, 1, 3, 2, 4, 5)
        y = y.reshape(n, h // b, w // b, b * b * c)
    if d.nchw:
        y = np.transpose(y, (0, 3, 1, 2))
    return [np.ascontiguousarray(y)]


BACKEND.register([OperationType.RESHAPE, OperationType.SQUEEZE], plan=_plan_reshape, execute=_copy)
BACKEND.register(OperationType.TRANSPOSE, plan=_plan_transpose, execute=_execute_transpose)
BACKEND.register([OperationType.DEPTH_TO_SPACE, OperationType.SPACE_TO_DEPTH], plan=_plan_block,
                 execute=_execute_block)
