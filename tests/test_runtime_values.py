"""Parameters that are not constants (NNAPI allows a shape, axes or paddings to be a model input
or a computed operand): such models are planned per execution, from the values.

The oracle is the same operation with the parameter as a constant (the static path, itself tested
against TFLite in tests/ops/)."""
from __future__ import annotations

import numpy as np
import pytest

from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute, execute_request
from hal.model import DataLocation, ModelBuilder, Request, RequestArgument
from hal.support import support_reasons
from hal.types import ErrorStatus, OperandType, OperationType
from tests.harness import per_operation_order

F32, I32, INT32 = OperandType.TENSOR_FLOAT32, OperandType.TENSOR_INT32, OperandType.INT32


def _mean(axes=None, keep=0, computed=False):
    """MEAN over a [2, 3, 4] input; axes a constant, a model input, or CAST from a float input."""
    b = ModelBuilder()
    x = b.add_operand(F32, (2, 3, 4))
    if axes is not None:
        ax = b.add_constant(I32, np.array(axes, np.int32))
        inputs = [x]
    elif computed:
        axf = b.add_operand(F32, (1,))
        ax = b.add_operand(I32, (1,))
        b.add_operation(OperationType.CAST, [axf], [ax])
        inputs = [x, axf]
    else:
        ax = b.add_operand(I32, (1,))
        inputs = [x, ax]
    y = b.add_operand(F32, ())  # rank and dimensions unknown: they depend on the axes' value
    b.add_operation(OperationType.MEAN, [x, ax, b.add_int32(keep)], [y])
    b.identify_inputs_and_outputs(inputs, [y])
    return b.finish()


X = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_axes_given_as_a_model_input(axis):
    compiled = compile_model(_mean())
    assert compiled.static_plan is None and compiled.runtime_values
    got = execute(compiled, [X, np.array([axis], np.int32)])[0]
    want = execute(compile_model(_mean(axes=[axis]), backend_order=per_operation_order()), [X])[0]
    np.testing.assert_array_equal(got, want)


def test_axes_computed_inside_the_model():
    compiled = compile_model(_mean(computed=True))
    for axis in (2.0, 0.0):
        got = execute(compiled, [X, np.array([axis], np.float32)])[0]
        static = compile_model(_mean(axes=[int(axis)]), backend_order=per_operation_order())
        np.testing.assert_array_equal(got, execute(static, [X])[0])


def test_support_is_claimed_and_steps_are_reused_while_values_repeat():
    model = _mean()
    assert support_reasons(model) == [None]
    compiled = compile_model(model)
    for _ in range(3):
        execute(compiled, [X, np.array([1], np.int32)])
    assert len(compiled._steps) == 1
    execute(compiled, [X, np.array([2], np.int32)])
    assert len(compiled._steps) == 2


def test_a_bad_runtime_value_is_a_clean_error():
    compiled = compile_model(_mean())
    with pytest.raises(HalError) as e:
        execute(compiled, [X, np.array([5], np.int32)])
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT and "operation 0 (MEAN)" in e.value.message
    np.testing.assert_array_equal(execute(compiled, [X, np.array([0], np.int32)])[0],
                                  execute(compile_model(_mean(axes=[0]), backend_order=per_operation_order()), [X])[0])


def test_request_with_an_unknown_output_size_gets_the_shape_back():
    """NNAPI's dynamic output: a too-small output buffer answers OUTPUT_INSUFFICIENT_SIZE with the
    shape the values produce; a buffer of that size then receives the result."""
    compiled = compile_model(_mean())
    x, axes = X.tobytes(), np.array([1], np.int32).tobytes()
    pools = [bytearray(x + axes), bytearray(4)]
    request = Request(inputs=[RequestArgument(location=DataLocation(0, 0, len(x))),
                              RequestArgument(location=DataLocation(0, len(x), len(axes)))],
                      outputs=[RequestArgument(location=DataLocation(1, 0, 4))], pools=pools)
    with pytest.raises(HalError) as e:
        execute_request(compiled, request)
    assert e.value.status == ErrorStatus.OUTPUT_INSUFFICIENT_SIZE
    assert e.value.output_shapes[0].dimensions == (2, 4)
    pools[1] = bytearray(2 * 4 * 4)
    request.outputs[0] = RequestArgument(location=DataLocation(1, 0, len(pools[1])))
    execute_request(compiled, request)
    want = execute(compile_model(_mean(axes=[1]), backend_order=per_operation_order()), [X])[0]
    np.testing.assert_array_equal(np.frombuffer(bytes(pools[1]), np.float32).reshape(2, 4), want)


def test_runtime_planned_models_keep_the_memory_plan():
    """Planned per execution, a model still drops each temporary after its last reader: the
    structural release plan equals the one a static compilation makes."""
    static = compile_model(_mean(axes=[1]), backend_order=per_operation_order())
    assert static.runtime_releases() == static.static_plan.release
    computed = compile_model(_mean(computed=True))
    cast_out = computed.model.main.operations[0].outputs[0]
    assert computed.runtime_releases() == [(), (cast_out,)]
