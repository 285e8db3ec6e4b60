"""BATCH_MATMUL as ONNX MatMul (float32 and int32).

adj_x / adj_y transpose the last two dimensions of that input first (a constant is transposed
once here). NNAPI's batch dimensions are equal (no broadcasting), which MatMul takes as they are.
int32 products and sums wrap modulo 2^32 in onnxruntime's int32 MatMul as in the reference's
int32 accumulator (tests/ops/test_batch_matmul.py checks the wrap).

NNAPI's CTS has no BATCH_MATMUL vectors (feature level 6): tests/backends/test_ort.py checks it
against the reference backend on its own models, and tests/ops/test_batch_matmul.py with
NNHAL_DIFF_BACKEND=onnxruntime against TFLite.
"""
from __future__ import annotations

import numpy as np

from hal.backends.ort import BACKEND
from hal.backends.ort.graph import OnnxGraph
from hal.operations.batch_matmul import BATCH_MATMUL, LHS, RHS, BatchMatmulParams
from hal.operations.common import F32, I32
from hal.registry import OperationContext


def _operand(g: OnnxGraph, ctx: OperationContext, x, i: int, adjoint: bool) -> str:
    info = ctx.input(i)
    if not adjoint:
        return x[i]
    if info.value is not None:
        return g.const(np.swapaxes(np.asarray(info.value, info.dtype), -1, -2), "adjoint")
    perm = list(range(info.rank))
    perm[-2:] = perm[-1], perm[-2]
    return g.node("Transpose", [x[i]], perm=perm)


def lower_batch_matmul(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: BatchMatmulParams = ctx.params
    return [g.node("MatMul", [_operand(g, ctx, x, LHS, p.adj_x), _operand(g, ctx, x, RHS, p.adj_y)])]


BACKEND.lowering(BATCH_MATMUL, lower=lower_batch_matmul, types=[F32, I32])
