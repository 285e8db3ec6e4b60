"""INT32 ADD, SUB and MUL, the six comparisons (int32 or float32 inputs) and CAST to the input's own
type, for the small tensors a converted WHILE loop counts with: its body's ``i + 1``, its
condition's ``i < n``, and the copies a converter makes of the values the body passes through
unchanged. With them a loop's condition and body subgraphs run wholly on this backend, and their
bound steps in one native loop (native_chain.py's ``loop``) instead of a graph engine's loop node.

Either input may be a single element broadcast against the other; otherwise both have the
output's size (other broadcasts decline). The arithmetic is the reference's numpy: int32 sums and
products wrap around (NNAPI's int32 ADD/SUB/MUL take no activation), comparisons are IEEE's (NaN
compares unequal to everything), each written as one loop over the flattened output.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np

from hal.backends.numba_kernels import BACKEND
from hal.backends.numba_kernels.fixedpoint import ro, rw
from hal.backends.numba_kernels.lazy import njit
from hal.operations.comparison import COMPARISONS, EQUAL, GREATER, GREATER_EQUAL, LESS, LESS_EQUAL, NOT_EQUAL
from hal.operations.elementwise import ADD, MUL, SUB
from hal.operations.quantization import CAST
from hal.registry import OperationContext
from hal.types import OperandType

#: Operation codes as the kernels number them.
ARITHMETIC = {ADD: 0, SUB: 1, MUL: 2}
COMPARE = {LESS: 0, LESS_EQUAL: 1, GREATER: 2, GREATER_EQUAL: 3, EQUAL: 4, NOT_EQUAL: 5}

_I64 = numba.int64


@njit(numba.void(_I64, ro(np.int32, 1), ro(np.int32, 1), rw(np.int32, 1)), cache=True, nogil=True)
def arithmetic(op, a, b, out):
    """out = a op b (int32, wrapping), an input of one element broadcast."""
    sa, sb = 1 if a.shape[0] > 1 else 0, 1 if b.shape[0] > 1 else 0
    for i in range(out.shape[0]):
        x, y = a[i * sa], b[i * sb]
        out[i] = x + y if op == 0 else x - y if op == 1 else x * y  # int64, stored as its low 32 bits


_COMPARE_SIGS = [numba.void(_I64, ro(t, 1), ro(t, 1), rw(np.bool_, 1)) for t in (np.int32, np.float32)]


@njit(_COMPARE_SIGS, cache=True, nogil=True)
def compare(op, a, b, out):
    """out = a op b, an input of one element broadcast."""
    sa, sb = 1 if a.shape[0] > 1 else 0, 1 if b.shape[0] > 1 else 0
    for i in range(out.shape[0]):
        x, y = a[i * sa], b[i * sb]
        if op == 0:
            out[i] = x < y
        elif op == 1:
            out[i] = x <= y
        elif op == 2:
            out[i] = x > y
        elif op == 3:
            out[i] = x >= y
        elif op == 4:
            out[i] = x == y
        else:
            out[i] = x != y


_COPY_SIGS = [numba.void(ro(t, 1), rw(t, 1)) for t in (np.int32, np.float32)]


@njit(_COPY_SIGS, cache=True, nogil=True)
def copy(a, out):
    """CAST to its own type: the values, unchanged."""
    for i in range(out.shape[0]):
        out[i] = a[i]


@dataclass
class Counter:
    op: int  # ARITHMETIC's or COMPARE's number
    compares: bool


def supports(ctx: OperationContext) -> str | None:
    a, b, out = ctx.input(0), ctx.input(1), ctx.output(0)
    n = int(np.prod(out.shape)) if out.shape else 1
    for info in (a, b):
        size = int(np.prod(info.shape)) if info.shape else 1
        if size not in (1, n):
            return "an input broadcast other than one element (the counter kernels take only that)"
    if b.type != a.type:
        return "inputs of two types"
    return None


def plan(ctx: OperationContext) -> Counter:
    compares = ctx.op_type in COMPARISONS
    return Counter((COMPARE if compares else ARITHMETIC)[ctx.op_type], compares)


def _flat(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1)


def execute(ctx: OperationContext, inputs: list) -> list:
    d: Counter = ctx.data
    shape = ctx.output_shapes[0]
    out = np.empty(shape, np.bool_ if d.compares else np.int32)
    if out.size:
        (compare if d.compares else arithmetic)(d.op, _flat(inputs[0]), _flat(inputs[1]), out.reshape(-1))
    return [out]


def bind(ctx: OperationContext, inputs: list, outputs: list):
    """``execute`` of the fixed contiguous inputs into the fixed ``outputs[0]``."""
    d: Counter = ctx.data
    a, b, out = inputs[0], inputs[1], outputs[0]
    if a is None or b is None or not (a.flags.c_contiguous and b.flags.c_contiguous) or out.size == 0:
        return None
    return functools.partial(compare if d.compares else arithmetic, d.op, a.reshape(-1), b.reshape(-1),
                             out.reshape(-1))


def supports_copy(ctx: OperationContext) -> str | None:
    return None if ctx.input(0).type == ctx.output(0).type else "a CAST to another type (this kernel copies)"


def execute_copy(ctx: OperationContext, inputs: list) -> list:
    return [np.array(inputs[0], copy=True)]


def bind_copy(ctx: OperationContext, inputs: list, outputs: list):
    a, out = inputs[0], outputs[0]
    if a is None or not a.flags.c_contiguous or out.size == 0:
        return None
    return functools.partial(copy, a.reshape(-1), out.reshape(-1))


BACKEND.register(CAST, plan=lambda ctx: None, execute=execute_copy,
                 types=(OperandType.TENSOR_INT32, OperandType.TENSOR_FLOAT32), supports=supports_copy, bind=bind_copy)
BACKEND.register(list(ARITHMETIC), plan=plan, execute=execute, types=(OperandType.TENSOR_INT32,),
                 supports=supports, bind=bind)
BACKEND.register(list(COMPARE), plan=plan, execute=execute,
                 types=(OperandType.TENSOR_INT32, OperandType.TENSOR_FLOAT32), supports=supports, bind=bind)
