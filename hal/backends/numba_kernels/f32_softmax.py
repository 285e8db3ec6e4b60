"""Float32 SOFTMAX on numba: a classifier's last operation, so that a float CNN whose every
operation the numba backend runs is taken from onnxruntime whole (hal.compiler's
``_whole_run_instead``; f32_conv.py says why).

As the reference computes it (reference_ops::Softmax): along the axis, the maximum, then
exp((x - max)·beta) in float32, their float32 sum, and each exponential over the sum. A NaN makes
its whole row NaN, as numpy's max does in the reference.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np

from hal.backends.numba_kernels import BACKEND
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.operations.softmax import SoftmaxParams
from hal.registry import OperationContext
from hal.types import OperandType, OperationType

F32 = OperandType.TENSOR_FLOAT32


@numba.njit([numba.void(ro(np.float32, 3), numba.float32, rw(np.float32, 3))], cache=True, nogil=True)
def softmax(x, beta, out):
    """Over axis 1 of [outer, n, inner]."""
    outer, n, inner = x.shape
    for o in range(outer):
        for i in range(inner):
            m = x[o, 0, i]
            for k in range(1, n):
                v = x[o, k, i]
                if v > m or v != v:  # a NaN stays the maximum
                    m = v
            total = np.float32(0.0)
            for k in range(n):
                e = np.exp((x[o, k, i] - m) * beta)
                out[o, k, i] = e
                total += e
            for k in range(n):
                out[o, k, i] = out[o, k, i] / total


@dataclass
class FloatSoftmax:
    beta: float
    axis: int


def plan(ctx: OperationContext) -> FloatSoftmax:
    p: SoftmaxParams = ctx.params
    return FloatSoftmax(float(np.float32(p.beta)), p.axis)


def _rows(a: np.ndarray, axis: int) -> np.ndarray:
    shape = a.shape
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    return a.reshape(outer, shape[axis], -1)


def execute(ctx: OperationContext, inputs: list) -> list:
    d: FloatSoftmax = ctx.data
    x = np.ascontiguousarray(inputs[0], np.float32)
    out = np.empty_like(x)
    if x.size:
        softmax(_rows(x, d.axis), np.float32(d.beta), _rows(out, d.axis))
    return [out]


def bind(ctx: OperationContext, inputs: list, outputs: list):
    d: FloatSoftmax = ctx.data
    x, out = inputs[0], outputs[0]
    if x is None or not x.flags.c_contiguous or x.size == 0:
        return None
    return functools.partial(softmax, _rows(x, d.axis), np.float32(d.beta), _rows(out, d.axis))


BACKEND.register(OperationType.SOFTMAX, plan=plan, execute=execute, types=(F32,), bind=bind)
