"""IF and WHILE in hal: the executor against the same computation orchestrated in Python from
the standalone subgraph models; validation of the subgraph rules; loop timeout; the compilation
cache's copy of a model with subgraphs. (Against TFLite's IF/WHILE: tests/ops/test_control_flow.py.)"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hal import ErrorStatus, HalError, compile_model, execute, support_reasons
from hal.control_flow import DEFAULT_LOOP_TIMEOUT_NS, MAX_LOOP_TIMEOUT_NS, loop_timeout_ns
from hal.model import DataLocation, ModelBuilder
from hal.serialize import dump_compiled, load_compiled
from hal.types import OperandLifeTime
from hal.types import OperandType as T
from hal.types import OperationType as O
from hal.validation import validate_model
from tests.control_flow_models import branches, counter_loop, growing_loop, loop_inputs


def python_loop(cond, body, values: list[np.ndarray], carried: int) -> list[np.ndarray]:
    """WHILE as NNAPI defines it, run from Python with the standalone cond and body models."""
    c, b = compile_model(cond), compile_model(body)
    values = list(values)
    while bool(execute(c, values)[0][0]):
        outs = execute(b, values)
        values[:len(outs)] = outs
    return values[:carried]


@pytest.mark.parametrize("n", [0, 1, 7])
def test_while_equals_the_loop_run_from_python(n):
    loop = counter_loop(seed=n)
    compiled = compile_model(loop.model)
    assert compiled.static_plan is not None  # shapes do not change between iterations: planned once
    got = execute(compiled, loop_inputs(n))
    want = python_loop(loop.cond, loop.body, loop_inputs(n), 2)
    assert got[0].tolist() == [n]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_while_with_subgraph_shapes_left_open_is_planned_from_the_actual_shapes():
    loop = counter_loop(seed=3, inner_shape=(0, 0))
    compiled = compile_model(loop.model)
    assert compiled.static_plan is not None
    want = execute(compile_model(counter_loop(seed=3).model), loop_inputs(4))
    for g, w in zip(execute(compiled, loop_inputs(4)), want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("n", [0, 1, 3])
def test_while_whose_shapes_grow_takes_the_output_shape_from_the_run(n):
    model, cond, body = growing_loop()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    inputs = [np.array([0], np.int32), x, np.array([n], np.int32)]
    compiled = compile_model(model)
    assert compiled.static_plan is None  # the output's size is known once the loop has run
    got = execute(compiled, inputs)
    want = python_loop(cond, body, inputs, 2)
    assert got[1].shape == (2 * 2 ** n, 3)
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("condition", [True, False])
def test_if_runs_the_branch_the_condition_names(condition):
    br = branches()
    rng = np.random.default_rng(int(condition))
    a, c = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    got = execute(compile_model(br.model), [np.array([condition]), a, c])
    want = execute(compile_model(br.then if condition else br.other), [a, c])
    np.testing.assert_array_equal(got[0], want[0])


def test_a_loop_nested_in_a_branch():
    """IF(cond, then: the counter WHILE, else: its body once): subgraphs of subgraphs."""
    loop = counter_loop(seed=5)
    b = ModelBuilder()
    cond = b.add_operand(T.TENSOR_BOOL8, (1,))
    i, x, n = b.add_operand(T.TENSOR_INT32, (1,)), b.add_operand(T.TENSOR_FLOAT32, (2, 3)), \
        b.add_operand(T.TENSOR_INT32, (1,))
    then = b.add_subgraph_operand(b.add_referenced(loop.model))
    other = b.add_subgraph_operand(b.add_referenced(loop.body))
    i_out, x_out = b.add_operand(T.TENSOR_INT32, (1,)), b.add_operand(T.TENSOR_FLOAT32, (2, 3))
    b.add_operation(O.IF, [cond, then, other, i, x, n], [i_out, x_out])
    b.identify_inputs_and_outputs([cond, i, x, n], [i_out, x_out])
    model = b.finish()
    assert len(model.referenced) == 4  # the loop model's main and its two subgraphs, then the body
    compiled = compile_model(model)
    for flag, want_model in ((True, loop.model), (False, loop.body)):
        got = execute(compiled, [np.array([flag])] + loop_inputs(6))
        want = execute(compile_model(want_model), loop_inputs(6))
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_an_endless_loop_ends_with_missed_deadline_at_the_loop_timeout():
    loop = counter_loop()
    compiled = compile_model(loop.model)
    with pytest.raises(HalError) as e:
        execute(compiled, loop_inputs(2 ** 31 - 1), loop_timeout_ns=50_000_000)
    assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
    assert "loop timeout" in e.value.message
    # and the compiled model is still good
    assert execute(compiled, loop_inputs(2))[0].tolist() == [2]


def test_loop_timeout_default_and_clamp_are_nnapis():
    assert loop_timeout_ns(None) == loop_timeout_ns(0) == DEFAULT_LOOP_TIMEOUT_NS == 2 * 10 ** 9
    assert loop_timeout_ns(60 * 10 ** 9) == MAX_LOOP_TIMEOUT_NS == 15 * 10 ** 9
    assert loop_timeout_ns(10 ** 6) == 10 ** 6


def test_the_execution_deadline_also_stops_a_loop():
    import time
    compiled = compile_model(counter_loop().model)
    with pytest.raises(HalError) as e:
        execute(compiled, loop_inputs(2 ** 31 - 1), deadline_ns=time.monotonic_ns() + 50_000_000)
    assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT


def test_cached_copy_of_a_model_with_subgraphs_runs_the_same():
    loop = counter_loop(seed=2)
    compiled = compile_model(loop.model)
    payload, arrays = dump_compiled(compiled)
    loaded = load_compiled(payload, arrays)
    for n in (0, 4):
        for g, w in zip(execute(loaded, loop_inputs(n)), execute(compiled, loop_inputs(n))):
            np.testing.assert_array_equal(g, w)


def test_support_of_a_while_covers_its_subgraphs():
    assert support_reasons(counter_loop().model) == [None]
    assert support_reasons(branches().model) == [None]


# ---- validation -------------------------------------------------------------------------------

def _invalid(model, match: str) -> None:
    with pytest.raises(HalError, match=match) as e:
        validate_model(model)
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


def test_a_subgraph_that_references_itself_is_invalid():
    model = counter_loop().model
    body = model.referenced[1]
    # the body names itself through a SUBGRAPH operand (used by nothing: the reference is enough)
    body.operands.append(dataclasses.replace(body.operands[0], type=T.SUBGRAPH, dimensions=(),
                                             lifetime=OperandLifeTime.SUBGRAPH,
                                             location=DataLocation(0, 1, 0)))
    _invalid(model, "references itself")


def test_a_subgraph_operand_out_of_range_is_invalid():
    model = counter_loop().model
    sub = next(op for op in model.main.operands if op.type == T.SUBGRAPH)
    sub.location = DataLocation(0, 9, 0)
    _invalid(model, "references subgraph 9")


def test_an_if_whose_branch_takes_other_inputs_is_invalid():
    br = branches()
    then = br.model.referenced[0]
    then.operands[then.input_indexes[1]].type = T.TENSOR_INT32
    _invalid(br.model, "not compatible")


def test_an_if_condition_must_be_bool8_of_one_element():
    br = branches()
    br.model.main.operands[br.model.main.operations[0].inputs[0]].dimensions = (2,)
    _invalid(br.model, r"shape \[1\]")


def test_a_while_condition_must_output_bool8():
    model = counter_loop().model
    cond = model.referenced[0]
    cond.operands[cond.output_indexes[0]].type = T.TENSOR_INT32
    _invalid(model, "condition")


def test_a_while_with_more_outputs_than_its_body_gives_is_invalid():
    model = counter_loop().model
    main = model.main
    extra = len(main.operands)
    main.operands.append(dataclasses.replace(main.operands[main.output_indexes[0]]))
    op = main.operations[0]
    main.operations[0] = dataclasses.replace(op, outputs=op.outputs + (extra,))
    main.output_indexes.append(extra)
    _invalid(model, "the body has 2 outputs")


def test_a_branch_with_a_wrong_output_count_is_invalid():
    br = branches()
    br.model.referenced[1].output_indexes.clear()
    with pytest.raises(HalError):
        validate_model(br.model)
