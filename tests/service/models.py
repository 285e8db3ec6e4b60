"""Small NNAPI models for service tests (built with hal's ModelBuilder)."""
from __future__ import annotations

import numpy as np

from hal.model import Model, ModelBuilder
from hal.types import OperandType as T
from hal.types import OperationType as O


def add_model(shape=(2, 3), constant: np.ndarray | None = None) -> Model:
    """y = a + b (or a + constant)."""
    b = ModelBuilder()
    a = b.add_operand(T.TENSOR_FLOAT32, shape)
    if constant is None:
        x = b.add_operand(T.TENSOR_FLOAT32, shape)
        inputs = [a, x]
    else:
        x = b.add_constant(T.TENSOR_FLOAT32, constant.astype(np.float32))
        inputs = [a]
    y = b.add_operand(T.TENSOR_FLOAT32, shape)
    b.add_operation(O.ADD, [a, x, b.add_int32(0)], [y])
    b.identify_inputs_and_outputs(inputs, [y])
    return b.finish()


def add_chain(n: int, shape=(8, 8)) -> Model:
    """y = x + x + ... (n ADDs): a model with many operations."""
    b = ModelBuilder()
    x = b.add_operand(T.TENSOR_FLOAT32, shape)
    cur = x
    for _ in range(n):
        nxt = b.add_operand(T.TENSOR_FLOAT32, shape)
        b.add_operation(O.ADD, [cur, x, b.add_int32(0)], [nxt])
        cur = nxt
    b.identify_inputs_and_outputs([x], [cur])
    return b.finish()


def unimplemented_operation() -> int:
    """A valid NNAPI operation nnhal does not run: OEM_OPERATION (every other one is implemented)."""
    from hal.types import OEM_OPERATION
    return OEM_OPERATION


def unsupported_model() -> Model:
    """A valid model with an operation nnhal does not implement (see unimplemented_operation)."""
    b = ModelBuilder()
    x = b.add_operand(T.TENSOR_FLOAT32, (4,))
    y = b.add_operand(T.TENSOR_FLOAT32, (4,))
    b.add_operation(unimplemented_operation(), [x], [y])
    b.identify_inputs_and_outputs([x], [y])
    return b.finish()


def slow_model(rows: int = 2048, k: int = 2048) -> Model:
    """One FULLY_CONNECTED of rows x k x k multiply-adds (~8.6 GFLOP: hundreds of milliseconds on
    any backend): a model that is one step, so the executor has no point between steps to check a
    deadline at."""
    b = ModelBuilder()
    x = b.add_operand(T.TENSOR_FLOAT32, (rows, k))
    w = b.add_constant(T.TENSOR_FLOAT32, np.full((k, k), 1e-3, np.float32))
    bias = b.add_constant(T.TENSOR_FLOAT32, np.zeros(k, np.float32))
    y = b.add_operand(T.TENSOR_FLOAT32, (rows, k))
    b.add_operation(O.FULLY_CONNECTED, [x, w, bias, b.add_int32(0)], [y])
    b.identify_inputs_and_outputs([x], [y])
    return b.finish()
