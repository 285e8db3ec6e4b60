"""hal.bound_program: a whole static program bound to fixed arrays (a burst's slots) against
``execute`` on the same compiled model and against the reference backend, bit-exact; its deadline
checks, timings and errors."""
from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("hal.backends.numba_kernels")

from delegate.mapping import convert_partition  # noqa: E402
from delegate.tfl import read_model  # noqa: E402
from hal.bound_program import BoundProgram, _nothing  # noqa: E402
from hal.compiler import compile_model  # noqa: E402
from hal.errors import HalError  # noqa: E402
from hal.executor import OperationTiming, execute  # noqa: E402
from hal.executor import bind as hal_bind  # noqa: E402
from hal.types import ErrorStatus, ExecutionPreference, OperationType, Priority  # noqa: E402
from nnhal.examples import efficientnet_b0, mobilenet_like  # noqa: E402
from nnhal.examples_quantized import blazeface_quantized, small_cnn  # noqa: E402
from service.execution import TIMED_ONE_IN, PreparedModel  # noqa: E402
from tests.backends.test_numba import _fc  # noqa: E402 - the numba tests' FULLY_CONNECTED model
from tests.harness import random_tensor  # noqa: E402

vnni = pytest.importorskip("hal.backends.numba_kernels.vnni")

ORDER = ["numba", "reference"]
#: The operations these models run on the numba backend that must bind (not run ``execute``).
BINDING = {OperationType.CONV_2D, OperationType.DEPTHWISE_CONV_2D, OperationType.ADD, OperationType.PAD,
           OperationType.MAX_POOL_2D, OperationType.AVERAGE_POOL_2D, OperationType.SOFTMAX, OperationType.MEAN,
           OperationType.CONCATENATION, OperationType.FULLY_CONNECTED, OperationType.MUL,
           OperationType.LOGISTIC}
#: Without AVX-512 VNNI the 8-bit convolutions and FULLY_CONNECTED run numba's float32 BLAS path
#: (conv.py), which has no bound form: those steps run ``execute`` in the bound program.
GEMM_BOUND_WITH_VNNI = {OperationType.CONV_2D, OperationType.FULLY_CONNECTED, OperationType.GROUPED_CONV_2D}


def _model(build, dtype):
    return convert_partition(read_model(build(dtype))).model


def _bind(compiled):
    plan = compiled.static_plan
    ins = [np.zeros(compiled.input_info(k).shape, compiled.input_info(k).dtype)
           for k in range(len(compiled.input_indexes))]
    outs = [np.full(plan.infos[o].shape, 7, plan.infos[o].dtype) for o in compiled.output_indexes]
    return ins, outs, hal_bind(compiled, ins, outs)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("build", [lambda d: mobilenet_like(d, 32, 16), lambda d: efficientnet_b0(d, 32),
                                   lambda d: blazeface_quantized(d, 64), lambda d: small_cnn(d, 32)],
                         ids=["mobilenet_like", "efficientnet_b0", "blazeface", "small_cnn"])
def test_the_bound_program_matches_execute_and_the_reference(build, dtype):
    model = _model(build, dtype)
    compiled = compile_model(model, backend_order=ORDER)
    reference = compile_model(model, backend_order=["reference"])
    ins, outs, runner = _bind(compiled)
    assert isinstance(runner, BoundProgram)
    binding = BINDING if vnni.AVAILABLE else BINDING - GEMM_BOUND_WITH_VNNI
    executed = [s.ctx.name for c, s in zip(runner.calls, runner.steps)
                if c is not _nothing and getattr(c, "__qualname__", "").startswith("_executed")
                and s.backend == "numba" and s.ctx.op_type in binding]
    assert not executed, f"no bound form: {executed}"
    assert runner.chained  # the plain form makes the numba steps' calls natively (native_chain)
    rng = np.random.default_rng(3)
    for form in ("plain", "timed", "deadline"):
        for x in ins:  # the bound arrays' contents change between executions
            x[...] = random_tensor(rng, x.shape, x.dtype)
        want_timings: list[OperationTiming] = []
        want = execute(compiled, [x.copy() for x in ins], want_timings)
        timings: list[OperationTiming] | None = [] if form == "timed" else None
        runner(timings, time.monotonic_ns() + 60 * 10**9 if form == "deadline" else None)
        for got, w, r in zip(outs, want, execute(reference, [x.copy() for x in ins])):
            np.testing.assert_array_equal(got, w)
            np.testing.assert_array_equal(got, r)
        if timings is not None:
            assert [(t.index, t.type, t.backend, t.count) for t in timings] == \
                [(t.index, t.type, t.backend, t.count) for t in want_timings]


def test_a_reshape_reads_its_inputs_buffer_unless_it_is_a_model_output():
    compiled = compile_model(_model(lambda d: blazeface_quantized(d, 64), np.int8), backend_order=ORDER)
    _, _, runner = _bind(compiled)
    views = [s.ctx.op_type for c, s in zip(runner.calls, runner.steps) if c is _nothing]
    assert views and set(views) == {OperationType.RESHAPE}


def test_a_passed_deadline_stops_before_the_next_step():
    compiled = compile_model(_model(lambda d: small_cnn(d, 32), np.int8), backend_order=ORDER)
    steps = compiled.static_plan.program[:3]
    ran = []
    for timed in (False, True):
        # far enough ahead that a loaded machine reaches the first step's check before it (1 ms was not)
        deadline = time.monotonic_ns() + 50 * 10**6

        def late_step(deadline: int = deadline) -> None:  # the first step outlasts the deadline
            while time.monotonic_ns() <= deadline:
                pass
        program = BoundProgram([late_step, lambda: ran.append(1), lambda: ran.append(2)], steps, OperationTiming)
        with pytest.raises(HalError) as e:
            program([] if timed else None, deadline)
        assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
        assert steps[1].ctx.name in e.value.message
    assert ran == []
    with pytest.raises(HalError) as e:
        _bind(compiled)[2](None, time.monotonic_ns() - 1)
    assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT


@pytest.mark.parametrize("form", ["plain", "timed", "deadline"])
def test_a_failing_step_is_a_general_failure_naming_it(form):
    compiled = compile_model(_model(lambda d: small_cnn(d, 32), np.int8), backend_order=ORDER)
    steps = compiled.static_plan.program[:4]

    def failing() -> None:
        raise ValueError("broken")
    program = BoundProgram([lambda: None, _nothing, failing, lambda: None], steps, OperationTiming)
    with pytest.raises(HalError) as e:
        program([] if form == "timed" else None, time.monotonic_ns() + 10**10 if form == "deadline" else None)
    assert e.value.status == ErrorStatus.GENERAL_FAILURE
    assert e.value.message.startswith(steps[2].ctx.name) and "broken" in e.value.message


def test_the_service_binds_a_multi_step_program():
    model = _model(lambda d: blazeface_quantized(d, 64), np.int8)
    compiled = compile_model(model, backend_order=ORDER)
    pm = PreparedModel("m", compiled, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM)
    ins, outs, _ = _bind(compiled)
    bound = pm.bind(ins, outs)
    assert bound._runner is not None  # computes into the outputs: no copy
    rng = np.random.default_rng(4)
    for _ in range(2):
        ins[0][...] = random_tensor(rng, ins[0].shape, ins[0].dtype)
        result = bound(None, 0)
        for got, want in zip(outs, execute(compiled, [ins[0].copy()])):
            np.testing.assert_array_equal(got, want)
        assert len(result.timings) == len(compiled.static_plan.program)


def test_unmeasured_executions_of_a_bound_model_are_timed_per_operation_one_in_sixteen():
    model = _model(lambda d: small_cnn(d, 32), np.int8)
    compiled = compile_model(model, backend_order=ORDER)
    reference = compile_model(model, backend_order=["reference"])
    pm = PreparedModel("m", compiled, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM)
    ins, outs, _ = _bind(compiled)
    bound = pm.bind(ins, outs)
    rng = np.random.default_rng(5)
    timed = []
    for _ in range(2 * TIMED_ONE_IN):
        ins[0][...] = random_tensor(rng, ins[0].shape, ins[0].dtype)
        timed.append(bool(bound(None, 0, 0, measure=False).timings))
        np.testing.assert_array_equal(outs[0], execute(reference, [ins[0].copy()])[0])
    assert timed == [k % TIMED_ONE_IN == 0 for k in range(2 * TIMED_ONE_IN)]
    assert all(len(bound(None, 0).timings) == len(compiled.static_plan.program) for _ in range(3))  # measured
    executions, ops = pm.perf.snapshot()
    assert executions == 2 * TIMED_ONE_IN + 3 and {op.executions for op in ops} == {2 + 3}


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_a_fully_connected_layer_binds(dtype):
    model = _fc(dtype, 40, 9, 5)
    compiled = compile_model(model, backend_order=ORDER)
    ins, outs, runner = _bind(compiled)
    # bound where the VNNI GEMM runs it; numba's float32 BLAS path (no VNNI) runs execute, bit-exact too
    assert getattr(runner.calls[0], "__qualname__", "").startswith("_executed") != vnni.AVAILABLE
    reference = compile_model(model, backend_order=["reference"])
    rng = np.random.default_rng(6)
    for _ in range(2):
        ins[0][...] = random_tensor(rng, ins[0].shape, dtype)
        runner()
        np.testing.assert_array_equal(outs[0], execute(reference, [ins[0].copy()])[0])
