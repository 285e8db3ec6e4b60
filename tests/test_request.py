"""validateRequest and execution-time checks, each with its message."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import OutputShape, execute, execute_request
from hal.model import DataLocation, ModelBuilder, Request, RequestArgument
from hal.types import ErrorStatus, OperandType, OperationType

X = np.arange(6, dtype=np.float32).reshape(2, 3)


def add_model(dims=(2, 3)):
    b = ModelBuilder()
    a = b.add_operand(OperandType.TENSOR_FLOAT32, dims)
    c = b.add_operand(OperandType.TENSOR_FLOAT32, dims)
    y = b.add_operand(OperandType.TENSOR_FLOAT32, dims)
    b.add_operation(OperationType.ADD, [a, c, b.add_int32(0)], [y])
    b.identify_inputs_and_outputs([a, c], [y])
    return b.finish()


def good_request():
    pool = bytearray(X.tobytes() + X.tobytes() + bytes(24))
    arg = RequestArgument
    return Request(inputs=[arg(False, DataLocation(0, 0, 24)), arg(False, DataLocation(0, 24, 24))],
                   outputs=[arg(False, DataLocation(0, 48, 24))], pools=[pool])


def test_good_request_writes_outputs():
    compiled = compile_model(add_model())
    req = good_request()
    shapes = execute_request(compiled, req)
    assert [(s.dimensions, s.is_sufficient) for s in shapes] == [((2, 3), True)]
    np.testing.assert_array_equal(np.frombuffer(req.pools[0], np.float32, 6, 48).reshape(2, 3), X + X)


def _set(obj, **kw):
    for k, v in kw.items():
        setattr(obj, k, v)
    return obj


CASES = {
    "argument count": (lambda r: r.inputs.pop(), "request has 1 inputs, the model has 2"),
    "output count": (lambda r: r.outputs.append(RequestArgument(False, DataLocation(0, 48, 24))),
                     "request has 2 outputs, the model has 1"),
    "omitted output": (lambda r: _set(r.outputs[0], has_no_value=True), "outputs cannot be omitted"),
    "negative offset": (lambda r: _set(r.inputs[0], location=DataLocation(0, -1, 24)), "negative field"),
    "missing pool": (lambda r: _set(r.inputs[0], location=DataLocation(2, 0, 24)), "uses pool 2, the request has 1"),
    "outside pool": (lambda r: _set(r.inputs[1], location=DataLocation(0, 60, 24)),
                     "[60, 84) is outside pool 0 of 72 bytes"),
    "negative dimension": (lambda r: _set(r.inputs[0], dimensions=(2, -3)), "dimensions must be non-negative"),
    "wrong rank": (lambda r: _set(r.inputs[0], dimensions=(6,)), "rank 1 differs from the model's 2"),
    "wrong dimension": (lambda r: _set(r.inputs[0], dimensions=(3, 2)), "dimension 0 is 3, the model says 2"),
    "wrong length": (lambda r: _set(r.inputs[0], location=DataLocation(0, 0, 20)), "20 bytes given, [2, 3] needs 24"),
    "too long": (lambda r: _set(r.inputs[1], location=DataLocation(0, 24, 28)), "28 bytes given, [2, 3] needs 24"),
    "negative pool index": (lambda r: _set(r.inputs[0], location=DataLocation(-1, 0, 24)), "negative field"),
    "output negative length": (lambda r: _set(r.outputs[0], location=DataLocation(0, 48, -24)), "negative field"),
    "output outside pool": (lambda r: _set(r.outputs[0], location=DataLocation(0, 64, 24)),
                            "request output 0 (operand 2, TENSOR_FLOAT32): [64, 88) is outside pool 0"),
    "output missing pool": (lambda r: _set(r.outputs[0], location=DataLocation(1, 0, 24)),
                            "uses pool 1, the request has 1"),
    "output wrong rank": (lambda r: _set(r.outputs[0], dimensions=(2, 3, 1)), "rank 3 differs from the model's 2"),
    "output wrong dimension": (lambda r: _set(r.outputs[0], dimensions=(2, 4)), "dimension 1 is 4, the model says 3"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_request_rule(case):
    mutate, message = CASES[case]
    req = good_request()
    mutate(req)
    with pytest.raises(HalError) as e:
        execute_request(compile_model(add_model()), req)
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT
    assert message in e.value.message
    assert e.value.message.startswith("request ")


def test_unspecified_input_dimensions():
    compiled = compile_model(add_model((2, 0)))  # an unknown dimension: the request must give it
    with pytest.raises(HalError, match=r"input dimensions must be fully specified, got \[2, 0\]"):
        execute_request(compiled, good_request())
    req = good_request()
    req.inputs[0].dimensions = (2, 3)
    req.inputs[1].dimensions = (2, 3)
    assert execute_request(compiled, req)[0].dimensions == (2, 3)


def test_input_over_the_size_limit():
    req = good_request()
    req.inputs[0].dimensions = (1 << 30, 3)
    with pytest.raises(HalError, match=r"request input 0 .*\[1073741824, 3\] needs 12884901888 bytes, over the limit"):
        execute_request(compile_model(add_model((0, 3))), req)


def test_output_insufficient_size_reports_shapes():
    req = good_request()
    req.outputs[0].location = DataLocation(0, 48, 12)
    with pytest.raises(HalError) as e:
        execute_request(compile_model(add_model()), req)
    assert e.value.status == ErrorStatus.OUTPUT_INSUFFICIENT_SIZE
    assert "output 0 needs 24 bytes, got 12" in e.value.message
    assert [(s.dimensions, s.is_sufficient) for s in e.value.output_shapes] == [((2, 3), False)]


def test_omitted_input_is_refused_where_the_operation_needs_it():
    """NNAPI lets a request omit an input (no value): fine for an optional operand, refused with the
    operation's own message for ADD's second operand."""
    req = good_request()
    req.inputs[1].has_no_value = True
    with pytest.raises(HalError, match=r"operation 0 \(ADD\): input 1 must have a value \(it is omitted\)"):
        execute_request(compile_model(add_model()), req)


@pytest.mark.parametrize("inputs, message", [
    ([X], "model has 2 inputs, got 1"),
    ([X, X.astype(np.float64)], "input 1 (TENSOR_FLOAT32) must have dtype float32, got float64"),
    ([X, X.reshape(3, 2)], "input 1 has shape [3, 2], the model says [2, 3]"),
    ([X, X.reshape(6)], "input 1 has shape [6], the model says [2, 3]"),
    ([X, np.float32(1)], "input 1 has shape []"),
    ([X, X, X], "model has 2 inputs, got 3"),
])
def test_execute_checks_inputs(inputs, message):
    with pytest.raises(HalError) as e:
        execute(compile_model(add_model()), inputs)
    assert message in e.value.message


def test_dynamic_shapes_are_planned_per_input_shape():
    compiled = compile_model(add_model((0, 3)))
    for rows in (1, 4, 1):
        x = np.ones((rows, 3), np.float32)
        assert execute(compiled, [x, x])[0].shape == (rows, 3)


def test_missed_deadline():
    with pytest.raises(HalError) as e:
        execute(compile_model(add_model(), backend_order=["reference"]), [X, X], deadline_ns=0)
    assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
    assert "deadline passed before operation 0 (ADD)" in e.value.message


def test_dynamic_output_written_with_its_shape():
    compiled = compile_model(add_model((0, 3)))
    req = good_request()
    req.inputs[0].dimensions = req.inputs[1].dimensions = (2, 3)
    assert execute_request(compiled, req) == [OutputShape((2, 3), True)]
    np.testing.assert_array_equal(np.frombuffer(req.pools[0], np.float32, 6, 48).reshape(2, 3), X + X)


# ---- rules found missing by review, now enforced ----

def test_read_only_output_pool_is_invalid():
    req = good_request()
    req.pools[0] = bytes(req.pools[0])
    with pytest.raises(HalError) as e:
        execute_request(compile_model(add_model()), req)
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


def test_execute_refuses_zero_sized_input_for_unspecified_dimension():
    x = np.zeros((2, 0), np.float32)
    with pytest.raises(HalError, match="input 0"):
        execute(compile_model(add_model((2, 0))), [x, x])


# ---- fuzzing ----

_VALUES = st.one_of(st.integers(-2, 80), st.sampled_from([2**31 - 1, -(2**31), 1 << 40]))
_ARG_MUTATION = st.one_of(
    st.tuples(st.just("location"), st.builds(DataLocation, st.integers(-1, 2), _VALUES, _VALUES)),
    st.tuples(st.just("dimensions"), st.lists(_VALUES, max_size=3).map(tuple)),
    st.tuples(st.just("has_no_value"), st.booleans()),
)
_REQUEST_MUTATION = st.one_of(
    st.tuples(st.sampled_from(["inputs", "outputs"]), st.integers(0, 2), _ARG_MUTATION),
    st.tuples(st.just("drop"), st.sampled_from(["inputs", "outputs"])),
    st.tuples(st.just("pool"), st.integers(0, 100)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_REQUEST_MUTATION, min_size=1, max_size=4), st.sampled_from([(2, 3), (0, 3), (0, 0), ()]))
def test_fuzzed_requests_never_crash(mutations, dims):
    """Corrupted requests (on writable pools) give a HalError or run; never another exception."""
    req = good_request()
    for kind, *args in mutations:
        if kind == "drop":
            args_list = getattr(req, args[0])
            if args_list:
                args_list.pop()
        elif kind == "pool":
            req.pools.append(bytearray(args[0]))
        else:
            k, (field, value) = args
            targets = getattr(req, kind)
            if targets:
                setattr(targets[k % len(targets)], field, value)
    try:
        execute_request(compile_model(add_model(dims)), req)
        event("ran")
    except HalError as e:
        event(e.status.name)
