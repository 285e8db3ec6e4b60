"""NNAPI models with IF and WHILE for the hal, cache and service tests.

Each loop or branch is also returned as the standalone models it is made of, so a test can run
the same computation orchestrated in Python (the independent formulation the control flow
executor is compared with)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal.model import Model, ModelBuilder
from hal.types import OperandType as T
from hal.types import OperationType as O

SHAPE = (2, 3)


@dataclass
class Loop:
    model: Model  # WHILE(cond, body, i, x, n) -> (i, x)
    cond: Model  # (i, x, n) -> [i < n]
    body: Model  # (i, x, n) -> (i + 1, x * 0.5 + c)


def _signature(b: ModelBuilder, shape=SHAPE) -> tuple[int, int, int]:
    return (b.add_operand(T.TENSOR_INT32, (1,)), b.add_operand(T.TENSOR_FLOAT32, shape),
            b.add_operand(T.TENSOR_INT32, (1,)))


def counter_cond(shape=SHAPE) -> Model:
    b = ModelBuilder()
    i, x, n = _signature(b, shape)
    out = b.add_operand(T.TENSOR_BOOL8, (1,))
    b.add_operation(O.LESS, [i, n], [out])
    b.identify_inputs_and_outputs([i, x, n], [out])
    return b.finish()


def counter_body(seed: int = 0, shape=SHAPE) -> Model:
    """i + 1 and x * 0.5 + c (c random, broadcast over x's shape)."""
    b = ModelBuilder()
    i, x, n = _signature(b, shape)
    rng = np.random.default_rng(seed)
    one = b.add_constant(T.TENSOR_INT32, [1])
    half = b.add_constant(T.TENSOR_FLOAT32, np.float32([0.5]))
    c = b.add_constant(T.TENSOR_FLOAT32, rng.standard_normal(SHAPE[-1:]).astype(np.float32))
    none = b.add_int32(0)
    i2, t, x2 = b.add_operand(T.TENSOR_INT32, (1,)), b.add_operand(T.TENSOR_FLOAT32, shape), \
        b.add_operand(T.TENSOR_FLOAT32, shape)
    b.add_operation(O.ADD, [i, one, none], [i2])
    b.add_operation(O.MUL, [x, half, none], [t])
    b.add_operation(O.ADD, [t, c, none], [x2])
    b.identify_inputs_and_outputs([i, x, n], [i2, x2])
    return b.finish()


def counter_loop(seed: int = 0, inner_shape=SHAPE) -> Loop:
    """``inner_shape``: the subgraphs' declared x shape (zeros: left for the executor to infer)."""
    cond, body = counter_cond(inner_shape), counter_body(seed, inner_shape)
    b = ModelBuilder()
    i, x, n = _signature(b)
    c = b.add_subgraph_operand(b.add_referenced(cond))
    d = b.add_subgraph_operand(b.add_referenced(body))
    i_out, x_out = b.add_operand(T.TENSOR_INT32, (1,)), b.add_operand(T.TENSOR_FLOAT32, SHAPE)
    b.add_operation(O.WHILE, [c, d, i, x, n], [i_out, x_out])
    b.identify_inputs_and_outputs([i, x, n], [i_out, x_out])
    return Loop(b.finish(), cond, body)


def loop_inputs(n: int, seed: int = 1) -> list[np.ndarray]:
    x = np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)
    return [np.array([0], np.int32), x, np.array([n], np.int32)]


@dataclass
class Branches:
    model: Model  # IF(cond, then, else, a, b) -> y
    then: Model  # (a, b) -> a + b
    other: Model  # (a, b) -> a * b


def _binary(op: O) -> Model:
    b = ModelBuilder()
    a, c = b.add_operand(T.TENSOR_FLOAT32, SHAPE), b.add_operand(T.TENSOR_FLOAT32, SHAPE)
    y = b.add_operand(T.TENSOR_FLOAT32, SHAPE)
    b.add_operation(op, [a, c, b.add_int32(0)], [y])
    b.identify_inputs_and_outputs([a, c], [y])
    return b.finish()


def branches() -> Branches:
    then, other = _binary(O.ADD), _binary(O.MUL)
    b = ModelBuilder()
    cond = b.add_operand(T.TENSOR_BOOL8, (1,))
    a, c = b.add_operand(T.TENSOR_FLOAT32, SHAPE), b.add_operand(T.TENSOR_FLOAT32, SHAPE)
    t = b.add_subgraph_operand(b.add_referenced(then))
    e = b.add_subgraph_operand(b.add_referenced(other))
    y = b.add_operand(T.TENSOR_FLOAT32, SHAPE)
    b.add_operation(O.IF, [cond, t, e, a, c], [y])
    b.identify_inputs_and_outputs([cond, a, c], [y])
    return Branches(b.finish(), then, other)


def growing_loop() -> tuple[Model, Model, Model]:
    """WHILE (i < n): x = CONCATENATION(x, x) along axis 0: the carried shape doubles every
    iteration, so the WHILE's output shape is known only once it has run. (model, cond, body)."""
    dyn = (0, 3)

    def sig(b):
        return b.add_operand(T.TENSOR_INT32, (1,)), b.add_operand(T.TENSOR_FLOAT32, dyn), \
            b.add_operand(T.TENSOR_INT32, (1,))
    cb = ModelBuilder()
    i, x, n = sig(cb)
    out = cb.add_operand(T.TENSOR_BOOL8, (1,))
    cb.add_operation(O.LESS, [i, n], [out])
    cb.identify_inputs_and_outputs([i, x, n], [out])
    cond = cb.finish()
    bb = ModelBuilder()
    i, x, n = sig(bb)
    one = bb.add_constant(T.TENSOR_INT32, [1])
    i2, x2 = bb.add_operand(T.TENSOR_INT32, (1,)), bb.add_operand(T.TENSOR_FLOAT32, dyn)
    bb.add_operation(O.ADD, [i, one, bb.add_int32(0)], [i2])
    bb.add_operation(O.CONCATENATION, [x, x, bb.add_int32(0)], [x2])
    bb.identify_inputs_and_outputs([i, x, n], [i2, x2])
    body = bb.finish()
    b = ModelBuilder()
    i, x = b.add_operand(T.TENSOR_INT32, (1,)), b.add_operand(T.TENSOR_FLOAT32, (2, 3))
    n = b.add_operand(T.TENSOR_INT32, (1,))
    c = b.add_subgraph_operand(b.add_referenced(cond))
    d = b.add_subgraph_operand(b.add_referenced(body))
    i_out, x_out = b.add_operand(T.TENSOR_INT32, (1,)), b.add_operand(T.TENSOR_FLOAT32, dyn)
    b.add_operation(O.WHILE, [c, d, i, x, n], [i_out, x_out])
    b.identify_inputs_and_outputs([i, x, n], [i_out, x_out])
    return b.finish(), cond, body
