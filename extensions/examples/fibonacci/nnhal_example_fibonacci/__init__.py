"""com.example.fibonacci: NNAPI's example extension (EXAMPLE_INT64, EXAMPLE_FIBONACCI).

EXAMPLE_FIBONACCI maps each element n (a non-negative integer, stored as float32 or as the
extension's EXAMPLE_INT64 tensor type) to the n-th Fibonacci number F(n), F(0)=0, F(1)=1.
TFLite models carry it as a CUSTOM op with custom_code "com.example.fibonacci".
"""
from __future__ import annotations

import numpy as np
from nnhal.extensions import Extension, ExtensionOperation, OperandTypeSpec
from nnhal.hal.errors import HalError
from nnhal.hal.types import ErrorStatus, OperandType

NAME = "com.example.fibonacci"
EXAMPLE_INT64 = 0
EXAMPLE_FIBONACCI = 0
MAX_N = 92  # F(93) overflows int64

_TABLE = [0, 1]
for _ in range(MAX_N - 1):
    _TABLE.append(_TABLE[-1] + _TABLE[-2])
FIB_INT64 = np.array(_TABLE, np.int64)
FIB_FLOAT32 = FIB_INT64.astype(np.float32)


def _types(ctx):
    """(input type, the model's EXAMPLE_INT64 code) — input must be float32 or EXAMPLE_INT64."""
    t = ctx.input_type(0)
    if t == OperandType.TENSOR_FLOAT32:
        return "float32"
    if t >> 16 and (t & 0xFFFF) == EXAMPLE_INT64:
        return "int64"
    raise ctx.fail(f"input 0 must be TENSOR_FLOAT32 or {NAME}:EXAMPLE_INT64, got type {t}")


def validate(ctx) -> None:
    ctx.expect_num_inputs(1)
    ctx.expect_num_outputs(1)
    _types(ctx)
    if ctx.output(0).type != ctx.input_type(0):
        raise ctx.fail("output 0 must have the type of input 0")


def prepare(ctx):
    ctx.set_output_shape(0, ctx.input_shape(0))
    return _types(ctx)


def execute(ctx, inputs):
    x = inputs[0]
    n = np.asarray(x)
    if ctx.data == "float32" and not np.all(n == np.floor(n)):
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"{ctx.name}: inputs must be whole numbers")
    n = n.astype(np.int64)
    if n.size and (n.min() < 0 or n.max() > MAX_N):
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"{ctx.name}: n must be in [0, {MAX_N}]")
    return [(FIB_FLOAT32 if ctx.data == "float32" else FIB_INT64)[n]]


def map_tflite(ctx, node, code: int) -> None:
    """CUSTOM(com.example.fibonacci): float32 stays float32, int64 becomes EXAMPLE_INT64."""
    from nnhal.delegate.mapping import MappingError
    from nnhal.delegate.tfl.schema import TensorType
    src = ctx.input_tensor(0)
    if len(node.inputs) != 1 or len(node.outputs) != 1:
        raise MappingError("com.example.fibonacci takes one input and one output")
    if src.type == TensorType.INT64:
        int64 = ctx.extension_code(NAME, EXAMPLE_INT64)
        x, y = ctx.tensor(node.inputs[0], type=int64), ctx.tensor(node.outputs[0], type=int64)
    elif src.type == TensorType.FLOAT32:
        x, y = ctx.tensor(node.inputs[0]), ctx.tensor(node.outputs[0])
    else:
        raise MappingError("com.example.fibonacci takes float32 or int64 tensors")
    ctx.operation(code, [x], [y])


EXTENSION = Extension(
    name=NAME, version="1.0",
    operand_types=(OperandTypeSpec(EXAMPLE_INT64, "EXAMPLE_INT64", np.int64),),
    operations=(ExtensionOperation(EXAMPLE_FIBONACCI, "EXAMPLE_FIBONACCI", validate, prepare, execute,
                                   custom_codes=(NAME,), map_tflite=map_tflite),),
    description="NNAPI's example extension")
