"""WHILE loops on the numba backend: the counter kernels (numba_kernels/counters.py: int32 ADD, SUB,
MUL, the comparisons, CAST to its own type) and float32 TANH against the reference backend; a loop
whose condition and body the numba kernels plan wholly, run bound as one native loop
(hal.bound_loop, native_chain.py's ``loop``) and by the executor (hal.control_flow's per-thread
bound loop), against the reference backend's executor running the subgraphs trip by trip; its
loop timeout and deadline; the Python loop where no native one is made; a cached plan."""
from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("hal.backends.numba_kernels")

from delegate.mapping import convert_partition  # noqa: E402
from delegate.tfl import read_model  # noqa: E402
from hal import ErrorStatus, HalError, backends, compile_model, execute  # noqa: E402
from hal.executor import bind  # noqa: E402
from hal.model import ModelBuilder  # noqa: E402
from hal.serialize import dump_compiled, load_compiled  # noqa: E402
from hal.types import OperandType as T  # noqa: E402
from hal.types import OperationType as O  # noqa: E402
from tests.backends.differential import compare, float_cts_examples_on  # noqa: E402
from tests.control_flow_models import counter_loop, loop_inputs  # noqa: E402
from tests.delegate.control_flow_models import RNN_UNITS, recurrent_loop_model  # noqa: E402

ORDER = ["numba", "reference"]
DEFAULT = ["onnxruntime", "numba", "reference"]
I32_EDGES = np.array([0, 1, -1, 7, -7, 2 ** 31 - 1, -2 ** 31, 2 ** 30, 46341, -46341], np.int32)


def _binary(op, a_type, a_shape, b_shape, out_type, out_shape):
    mb = ModelBuilder()
    a, b = mb.add_operand(a_type, a_shape), mb.add_operand(a_type, b_shape)
    out = mb.add_operand(out_type, out_shape)
    extra = [mb.add_int32(0)] if op in (O.ADD, O.SUB, O.MUL) else []
    mb.add_operation(op, [a, b, *extra], [out])
    mb.identify_inputs_and_outputs([a, b], [out])
    return mb.finish()


def _both(model, inputs) -> tuple[list, list, list[str]]:
    compiled = compile_model(model, backend_order=ORDER)
    got, want = execute(compiled, inputs), execute(compile_model(model, backend_order=["reference"]), inputs)
    return got, want, [s.backend for s in compiled.static_plan.program]


@pytest.mark.parametrize("op", [O.ADD, O.SUB, O.MUL])
@pytest.mark.parametrize("shapes", [((10,), (10,)), ((10,), (1,)), ((1,), (10,)), ((2, 5), (1,))])
def test_int32_arithmetic_wraps_as_the_reference_does(op, shapes):
    a_shape, b_shape = shapes
    rng = np.random.default_rng(int(op))
    a = rng.choice(I32_EDGES, a_shape).astype(np.int32)
    b = rng.choice(I32_EDGES, b_shape).astype(np.int32)
    out_shape = a_shape if len(a_shape) >= len(b_shape) and np.prod(a_shape) >= np.prod(b_shape) else b_shape
    got, want, ran = _both(_binary(op, T.TENSOR_INT32, a_shape, b_shape, T.TENSOR_INT32, out_shape), [a, b])
    assert ran == ["numba"]
    assert compare(got[0], want[0]) is None


@pytest.mark.parametrize("op", [O.LESS, O.LESS_EQUAL, O.GREATER, O.GREATER_EQUAL, O.EQUAL, O.NOT_EQUAL])
@pytest.mark.parametrize("operand", [T.TENSOR_INT32, T.TENSOR_FLOAT32])
def test_comparisons_match_the_reference(op, operand):
    if operand == T.TENSOR_INT32:
        a, b = I32_EDGES, np.roll(I32_EDGES, 3)
    else:
        a = np.array([0.0, -0.0, 1.5, np.nan, np.inf, -np.inf, 2.0, np.nan, 1e-45, -3.0], np.float32)
        b = np.array([-0.0, 0.0, 1.5, 1.0, np.inf, 0.0, np.nan, np.nan, 0.0, 2.0], np.float32)
    for b_in in (b, b[:1]):
        got, want, ran = _both(_binary(op, operand, a.shape, b_in.shape, T.TENSOR_BOOL8, a.shape), [a, b_in])
        assert ran == ["numba"]
        assert compare(got[0], want[0]) is None


def test_a_broadcast_other_than_one_element_stays_on_the_reference():
    model = _binary(O.LESS, T.TENSOR_INT32, (2, 3), (3,), T.TENSOR_BOOL8, (2, 3))
    assert [s.backend for s in compile_model(model, backend_order=ORDER).static_plan.program] == ["reference"]


@pytest.mark.parametrize("operand", [T.TENSOR_INT32, T.TENSOR_FLOAT32])
def test_a_cast_to_its_own_type_copies(operand):
    mb = ModelBuilder()
    x, y = mb.add_operand(operand, (7,)), mb.add_operand(operand, (7,))
    mb.add_operation(O.CAST, [x], [y])
    mb.identify_inputs_and_outputs([x], [y])
    x_value = (I32_EDGES[:7] if operand == T.TENSOR_INT32 else np.float32([0, -0.0, np.nan, np.inf, 1, -2, 3e-41]))
    got, want, ran = _both(mb.finish(), [x_value])
    assert ran == ["numba"]
    assert got[0].tobytes() == want[0].tobytes()


def test_cts_float32_tanh_cases_meet_the_cts_and_the_reference():
    ran = float_cts_examples_on("numba", "TANH", O.TANH, ORDER)
    assert ran >= 4, f"only {ran} float32 CTS examples of TANH ran on the numba kernel"


def test_tanh_meets_the_cts_criteria_everywhere_and_keeps_nan_and_signed_zero():
    rng = np.random.default_rng(0)
    x = np.concatenate([np.float32([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-45, -1e-45, 0.6249999, 0.625, -0.625,
                                    9.0, 9.1, -9.1, 44.0, 88.0, 100.0, 3.4e38, -3.4e38]),
                        rng.uniform(-10, 10, 5000).astype(np.float32),
                        (rng.choice([-1, 1], 2000) * 10.0 ** rng.uniform(-40, 2, 2000)).astype(np.float32)])
    mb = ModelBuilder()
    a, y = mb.add_operand(T.TENSOR_FLOAT32, x.shape), mb.add_operand(T.TENSOR_FLOAT32, x.shape)
    mb.add_operation(O.TANH, [a], [y])
    mb.identify_inputs_and_outputs([a], [y])
    got, want, ran = _both(mb.finish(), [x])
    assert ran == ["numba"]
    assert compare(got[0], want[0]) is None
    assert np.signbit(got[0][:2]).tolist() == [False, True] and np.isnan(got[0][2])


def _loop_planned(model, order=None):
    with backends.thread_limit(1):
        return compile_model(model, backend_order=order or DEFAULT)


def _bound(compiled, inputs):
    outs = [np.empty(compiled.static_plan.infos[o].shape, compiled.static_plan.infos[o].dtype)
            for o in compiled.output_indexes]
    runner = bind(compiled, inputs, outs)
    assert runner is not None
    return runner, outs


def _run_bound(compiled, inputs, **limits):
    runner, outs = _bound(compiled, inputs)
    runner(None, limits.get("deadline_ns"), limits.get("loop_timeout_ns"))
    return outs


def test_a_loop_the_numba_kernels_cover_runs_as_one_native_loop_and_matches_the_reference():
    loop = counter_loop(seed=4)
    compiled, reference = _loop_planned(loop.model), compile_model(loop.model, backend_order=["reference"])
    # the WHILE is the executor's (reference's placeholder); its subgraphs are numba's
    assert [s.backend for s in compiled.static_plan.program] == ["reference"]
    for sub in compiled.subgraphs.all():
        assert {s.backend for s in sub.static_plan.program} == {"numba"}
    runner, _ = _bound(compiled, loop_inputs(3))
    (bound_loop,) = runner.loops
    assert bound_loop.native is not None
    starts = [loop_inputs(n, seed=abs(n) + 2) for n in (0, 1, 2, 17, -3)]
    past = loop_inputs(4)
    past[0] = np.array([9], np.int32)  # starts past the bound: no trip, the counter unchanged
    for inputs in [*starts, past]:
        want = execute(reference, inputs)
        for got in (execute(compiled, inputs), _run_bound(compiled, inputs)):
            for g, w in zip(got, want):
                assert compare(g, w) is None


def test_a_converted_recurrence_runs_on_numba_within_the_cts_criteria():
    """tests/delegate's WHILE RNN (make bench's): FULLY_CONNECTED, ADD and TANH per trip, and the
    converter's CASTs of the values its body passes through."""
    model = convert_partition(read_model(recurrent_loop_model())).model
    compiled, reference = _loop_planned(model), compile_model(model, backend_order=["reference"])
    assert [s.backend for s in compiled.static_plan.program] == ["reference", "numba", "numba"]
    runner, outs = _bound(compiled, [np.zeros((1, RNN_UNITS), np.float32), np.array([1], np.int32)])
    assert runner.loops[0].native is not None
    rng = np.random.default_rng(7)
    for trips in (0, 1, 16, 40):
        x = rng.uniform(-1, 1, (1, RNN_UNITS)).astype(np.float32)
        inputs = [x, np.array([trips], np.int32)]
        want = execute(reference, inputs)[0]
        assert compare(execute(compiled, inputs)[0], want) is None
        assert compare(_run_bound(compiled, inputs)[0], want) is None


@pytest.mark.parametrize("path", ["bound", "executor"])
def test_an_endless_native_loop_ends_at_the_loop_timeout_or_the_deadline(path):
    compiled = _loop_planned(counter_loop().model)
    run = _run_bound if path == "bound" else (lambda c, inputs, **kw: execute(c, inputs, **kw))
    t = time.monotonic()
    with pytest.raises(HalError) as e:
        run(compiled, loop_inputs(2 ** 31 - 1), loop_timeout_ns=50_000_000)
    assert time.monotonic() - t < 5
    assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
    assert "operation 0 (WHILE): the loop ran longer than the loop timeout (0.05 s) after" in e.value.message
    with pytest.raises(HalError) as e:
        run(compiled, loop_inputs(2 ** 31 - 1), deadline_ns=time.monotonic_ns() + 50_000_000)
    assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT and "deadline passed in iteration" in e.value.message
    assert run(compiled, loop_inputs(3))[0].tolist() == [3]  # and the model goes on


def test_without_a_native_loop_the_trips_run_in_python_with_the_same_results_and_limits(monkeypatch):
    compiled = _loop_planned(counter_loop(seed=2).model)
    reference = compile_model(counter_loop(seed=2).model, backend_order=["reference"])
    monkeypatch.setattr(backends.get("numba"), "loop", None)
    runner, _ = _bound(compiled, loop_inputs(3))
    assert runner.loops[0].native is None
    for n in (0, 5):
        for g, w in zip(_run_bound(compiled, loop_inputs(n)), execute(reference, loop_inputs(n))):
            assert compare(g, w) is None
    with pytest.raises(HalError) as e:
        _run_bound(compiled, loop_inputs(2 ** 31 - 1), loop_timeout_ns=30_000_000)
    assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT and "loop timeout" in e.value.message


def test_a_loop_from_the_cache_runs_natively_again():
    compiled = _loop_planned(counter_loop(seed=6).model)
    loaded = load_compiled(*dump_compiled(compiled), backend_order=DEFAULT)
    runner, _ = _bound(loaded, loop_inputs(3))
    assert runner.loops[0].native is not None
    for n in (0, 9):
        for g, w in zip(_run_bound(loaded, loop_inputs(n)), execute(compiled, loop_inputs(n))):
            assert compare(g, w) is None


def test_at_more_than_one_thread_the_loop_stays_onnxruntimes():
    with backends.thread_limit(2):
        compiled = compile_model(counter_loop().model, backend_order=DEFAULT)
    assert [s.backend for s in compiled.static_plan.program] == ["onnxruntime"]
