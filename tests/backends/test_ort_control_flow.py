"""WHILE and IF lowered by the onnxruntime backend (hal/backends/ort/control_flow.py): one partition
running an ONNX Loop / If, against the reference backend (the executor running the subgraphs)."""
from __future__ import annotations

import time

import numpy as np
import onnx
import pytest

from hal import ErrorStatus, HalError, compile_model, execute
from hal.backends.ort.control_flow import UNROLL
from hal.model import ModelBuilder
from hal.serialize import dump_compiled, load_compiled
from hal.types import OperandType as T
from hal.types import OperationType as O
from tests.control_flow_models import SHAPE, branches, counter_body, counter_cond, counter_loop, loop_inputs

pytest.importorskip("onnxruntime")
ORT = ["onnxruntime", "reference"]


def _program(compiled) -> list[tuple[str, object]]:
    return [(s.backend, s.ctx.name) for s in compiled.static_plan.program]


def _onnx_ops(compiled) -> list[str]:
    (step,) = compiled.static_plan.program
    graph = onnx.load_from_string(step.ctx.artifact.model.tobytes()).graph
    return [n.op_type for n in graph.node]


def _same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def _greater_cond():
    """(i, x, n) -> n > i: the condition written the other way round (no counted-loop pattern)."""
    b = ModelBuilder()
    i, x, n = b.add_operand(T.TENSOR_INT32, (1,)), b.add_operand(T.TENSOR_FLOAT32, SHAPE), \
        b.add_operand(T.TENSOR_INT32, (1,))
    out = b.add_operand(T.TENSOR_BOOL8, (1,))
    b.add_operation(O.GREATER, [n, i], [out])
    b.identify_inputs_and_outputs([i, x, n], [out])
    return b.finish()


def _counter_read_body():
    """(i, x, n) -> (i + 1, x * 0.5 + float(i)): the body reads the counter beyond its step."""
    b = ModelBuilder()
    i, x, n = b.add_operand(T.TENSOR_INT32, (1,)), b.add_operand(T.TENSOR_FLOAT32, SHAPE), \
        b.add_operand(T.TENSOR_INT32, (1,))
    one, half, none = b.add_constant(T.TENSOR_INT32, [1]), b.add_constant(T.TENSOR_FLOAT32, np.float32([0.5])), \
        b.add_int32(0)
    i2, fi = b.add_operand(T.TENSOR_INT32, (1,)), b.add_operand(T.TENSOR_FLOAT32, (1,))
    t, x2 = b.add_operand(T.TENSOR_FLOAT32, SHAPE), b.add_operand(T.TENSOR_FLOAT32, SHAPE)
    b.add_operation(O.ADD, [i, one, none], [i2])
    b.add_operation(O.CAST, [i], [fi])
    b.add_operation(O.MUL, [x, half, none], [t])
    b.add_operation(O.ADD, [t, fi, none], [x2])
    b.identify_inputs_and_outputs([i, x, n], [i2, x2])
    return b.finish()


def _loop(cond, body):
    b = ModelBuilder()
    i, x, n = b.add_operand(T.TENSOR_INT32, (1,)), b.add_operand(T.TENSOR_FLOAT32, SHAPE), \
        b.add_operand(T.TENSOR_INT32, (1,))
    c, d = b.add_subgraph_operand(b.add_referenced(cond)), b.add_subgraph_operand(b.add_referenced(body))
    i_out, x_out = b.add_operand(T.TENSOR_INT32, (1,)), b.add_operand(T.TENSOR_FLOAT32, SHAPE)
    b.add_operation(O.WHILE, [c, d, i, x, n], [i_out, x_out])
    b.identify_inputs_and_outputs([i, x, n], [i_out, x_out])
    return b.finish()


@pytest.mark.parametrize("form", ["counted", "counter read", "checked"])
def test_a_while_is_one_loop_in_one_partition_and_matches_the_reference(form):
    """counted: LESS(i, n) with i stepped by 1 runs as a trip count (unrolled: trip counts on
    and off its multiples); checked: the condition lowered before the Loop and again in its body."""
    model = {"counted": counter_loop(seed=3).model, "counter read": _loop(counter_cond(), _counter_read_body()),
             "checked": _loop(_greater_cond(), counter_body(3))}[form]
    compiled, reference = compile_model(model, backend_order=ORT), compile_model(model, backend_order=["reference"])
    assert [b for b, _ in _program(compiled)] == ["onnxruntime"]
    ops = _onnx_ops(compiled)
    # counted: whole blocks of UNROLL trips, then the rest (one Loop each)
    assert ops.count("Loop") == (1 if form == "checked" else 2) and ("Greater" in ops) == (form == "checked")
    for n in (0, 1, 2, UNROLL - 1, UNROLL, UNROLL + 1, 2 * UNROLL, 2 * UNROLL + 3, -3):
        _same(execute(compiled, loop_inputs(n)), execute(reference, loop_inputs(n)))
    start = loop_inputs(4)
    start[0] = np.array([9], np.int32)  # starts past the bound: no trip, the counter unchanged
    _same(execute(compiled, start), execute(reference, start))


def test_an_endless_lowered_loop_ends_at_the_loop_timeout_or_the_deadline():
    compiled = compile_model(counter_loop().model, backend_order=ORT)
    assert [b for b, _ in _program(compiled)] == ["onnxruntime"]
    t = time.monotonic()
    with pytest.raises(HalError) as e:
        execute(compiled, loop_inputs(2 ** 31 - 1), loop_timeout_ns=50_000_000)
    assert time.monotonic() - t < 10
    assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
    assert "operation 0 (WHILE): the loop ran longer than the loop timeout (0.05 s)" in e.value.message
    with pytest.raises(HalError) as e:
        execute(compiled, loop_inputs(2 ** 31 - 1), deadline_ns=time.monotonic_ns() + 50_000_000)
    assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT and "deadline" in e.value.message
    assert execute(compiled, loop_inputs(3))[0].tolist() == [3]  # and the session goes on


def test_a_lowered_loop_comes_back_from_the_cache_with_its_timeout():
    compiled = compile_model(counter_loop(seed=5).model, backend_order=ORT)
    loaded = load_compiled(*dump_compiled(compiled), backend_order=ORT)
    for n in (0, 5):
        _same(execute(loaded, loop_inputs(n)), execute(compiled, loop_inputs(n)))
    with pytest.raises(HalError) as e:
        execute(loaded, loop_inputs(2 ** 31 - 1), loop_timeout_ns=50_000_000)
    assert "loop timeout" in e.value.message


def test_an_if_is_one_if_node_and_takes_either_branch():
    model = branches().model
    compiled, reference = compile_model(model, backend_order=ORT), compile_model(model, backend_order=["reference"])
    assert [b for b, _ in _program(compiled)] == ["onnxruntime"] and "If" in _onnx_ops(compiled)
    rng = np.random.default_rng(0)
    a, c = (rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2))
    for flag in (True, False):
        _same(execute(compiled, [np.array([flag]), a, c]), execute(reference, [np.array([flag]), a, c]))
    # NNAPI's BOOL8 is true for any nonzero byte
    _same(execute(compiled, [np.array([2], np.uint8).view(np.bool_), a, c]),
          execute(reference, [np.array([True]), a, c]))


def test_a_body_with_an_operation_onnxruntime_does_not_lower_stays_in_the_executor(caplog):
    """The WHILE is declined with the reason (the body's operation and its backend)."""
    body = ModelBuilder()
    i, x, n = body.add_operand(T.TENSOR_INT32, (1,)), body.add_operand(T.TENSOR_FLOAT32, SHAPE), \
        body.add_operand(T.TENSOR_INT32, (1,))
    one = body.add_constant(T.TENSOR_INT32, [1])
    none = body.add_int32(0)
    i2, x2 = body.add_operand(T.TENSOR_INT32, (1,)), body.add_operand(T.TENSOR_FLOAT32, SHAPE)
    body.add_operation(O.ADD, [i, one, none], [i2])
    body.add_operation(O.DIV, [i, one, none], [body.add_operand(T.TENSOR_INT32, (1,))])  # int32 DIV: not lowered
    body.add_operation(O.FLOOR, [x], [x2])
    body.identify_inputs_and_outputs([i, x, n], [i2, x2])
    model = _loop(counter_cond(), body.finish())
    with caplog.at_level("INFO"):
        compiled = compile_model(model, backend_order=ORT)
    assert [b for b, _ in _program(compiled)] == ["reference"]
    assert any("WHILE" in r.getMessage() and "(DIV) runs on reference" in r.getMessage() for r in caplog.records)
    reference = compile_model(model, backend_order=["reference"])
    _same(execute(compiled, loop_inputs(4)), execute(reference, loop_inputs(4)))


def test_an_endless_loop_in_a_lowered_branch_ends_at_the_loop_timeout():
    loop = counter_loop(seed=5)
    b = ModelBuilder()
    cond = b.add_operand(T.TENSOR_BOOL8, (1,))
    i, x, n = b.add_operand(T.TENSOR_INT32, (1,)), b.add_operand(T.TENSOR_FLOAT32, SHAPE), \
        b.add_operand(T.TENSOR_INT32, (1,))
    then = b.add_subgraph_operand(b.add_referenced(loop.model))
    other = b.add_subgraph_operand(b.add_referenced(loop.body))
    i_out, x_out = b.add_operand(T.TENSOR_INT32, (1,)), b.add_operand(T.TENSOR_FLOAT32, SHAPE)
    b.add_operation(O.IF, [cond, then, other, i, x, n], [i_out, x_out])
    b.identify_inputs_and_outputs([cond, i, x, n], [i_out, x_out])
    model = b.finish()
    compiled, reference = compile_model(model, backend_order=ORT), compile_model(model, backend_order=["reference"])
    assert [b for b, _ in _program(compiled)] == ["onnxruntime"]
    for flag in (True, False):
        feeds = [np.array([flag])] + loop_inputs(6)
        _same(execute(compiled, feeds), execute(reference, feeds))
    with pytest.raises(HalError) as e:
        execute(compiled, [np.array([True])] + loop_inputs(2 ** 31 - 1), loop_timeout_ns=50_000_000)
    assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT and "loop timeout" in e.value.message


def test_subgraphs_lowered_into_the_loop_compile_no_partitions_of_their_own():
    """The condition's and body's steps are inlined into the Loop: their own partitions are compiled
    only once the executor runs them (planned again from the constants after a cache load)."""
    model = counter_loop(seed=2).model
    compiled, reference = compile_model(model, backend_order=ORT), compile_model(model, backend_order=["reference"])
    assert [b for b, _ in _program(compiled)] == ["onnxruntime"]
    assert not any(compiled.subgraphs.get(k).static_plan.built for k in range(2))
    loaded = load_compiled(*dump_compiled(compiled), backend_order=ORT)
    _same(execute(loaded, loop_inputs(5)), execute(reference, loop_inputs(5)))
    for k in range(2):
        sub = loaded.subgraphs.get(k)
        assert not sub.static_plan.built
        _same(execute(sub, loop_inputs(3)), execute(reference.subgraphs.get(k), loop_inputs(3)))
        assert [s.backend for s in sub.static_plan.program] == ["onnxruntime"]


UNITS = 16  # a 1 KiB weight: kept apart from the graph (EXTERNAL_MIN_BYTES)


def _rnn_loop(form: str):
    """WHILE i < n: (i + 1, h = tanh(FULLY_CONNECTED(h) + v)), reading x and n. ``form``: v is x, which the
    loop only reads ("invariant"); v is h ("carried"); or v is x and the body also outputs
    h + FULLY_CONNECTED(h) ("read twice")."""
    rng = np.random.default_rng(11)
    sig = [(T.TENSOR_INT32, (1,)), (T.TENSOR_FLOAT32, (1, UNITS)), (T.TENSOR_FLOAT32, (1, UNITS)),
           (T.TENSOR_INT32, (1,))]
    cond = ModelBuilder()
    ci, ch, cx, cn = (cond.add_operand(*s) for s in sig)
    less = cond.add_operand(T.TENSOR_BOOL8, (1,))
    cond.add_operation(O.LESS, [ci, cn], [less])
    cond.identify_inputs_and_outputs([ci, ch, cx, cn], [less])
    body = ModelBuilder()
    i, h, x, n = (body.add_operand(*s) for s in sig)
    none = body.add_int32(0)
    w = body.add_constant(T.TENSOR_FLOAT32, (rng.uniform(-1, 1, (UNITS, UNITS)) / UNITS ** 0.5).astype(np.float32))
    bias = body.add_constant(T.TENSOR_FLOAT32, rng.uniform(-0.1, 0.1, UNITS).astype(np.float32))
    i2 = body.add_operand(T.TENSOR_INT32, (1,))
    fc, pre, h2 = (body.add_operand(T.TENSOR_FLOAT32, (1, UNITS)) for _ in range(3))
    body.add_operation(O.ADD, [i, body.add_constant(T.TENSOR_INT32, [1]), none], [i2])
    body.add_operation(O.FULLY_CONNECTED, [h, w, bias, none], [fc])
    body.add_operation(O.ADD, [fc, h if form == "carried" else x, none], [pre])
    body.add_operation(O.TANH, [pre], [h2])
    if form == "read twice":
        h3 = body.add_operand(T.TENSOR_FLOAT32, (1, UNITS))
        body.add_operation(O.ADD, [h2, fc, none], [h3])
        h2 = h3
    body.identify_inputs_and_outputs([i, h, x, n], [i2, h2])
    b = ModelBuilder()
    ins = [b.add_operand(*s) for s in sig]
    c, d = (b.add_subgraph_operand(b.add_referenced(m.finish())) for m in (cond, body))
    outs = [b.add_operand(*s) for s in sig[:2]]
    b.add_operation(O.WHILE, [c, d, *ins], outs)
    b.identify_inputs_and_outputs(ins, outs)
    return b.finish()


def _loop_bodies(compiled) -> list[list[str]]:
    (step,) = compiled.static_plan.program
    art = step.ctx.artifact
    # the weight once however many copies of the body the Loops hold, packed once, not fed per run
    assert len(art.initializer_names) == 1 and art.prepacked == 1
    graph = onnx.load_from_string(step.ctx.artifact.model.tobytes()).graph
    return [[m.op_type for m in n.attribute[0].g.node] for n in graph.node if n.op_type == "Loop"]


@pytest.mark.parametrize("form", ["invariant", "carried", "read twice"])
def test_a_gemm_plus_a_value_the_loop_only_reads_takes_it_as_its_bias(form):
    """The invariant addend joins the Gemm's bias before the Loop: no Add per trip, and the Gemm
    fuses its activation (FusedGemm); not where the addend changes or the Gemm's result is read
    again."""
    model = _rnn_loop(form)
    compiled, reference = compile_model(model, backend_order=ORT), compile_model(model, backend_order=["reference"])
    bodies = _loop_bodies(compiled)
    assert bodies and all(("Add" in ops) == (form != "invariant") for ops in bodies)
    assert all(("FusedGemm" in ops) == (form == "invariant") for ops in bodies)
    rng = np.random.default_rng(2)
    h, x = (rng.uniform(-1, 1, (1, UNITS)).astype(np.float32) for _ in range(2))
    for n in (0, 1, 5, 16):
        feeds = [np.array([0], np.int32), h, x, np.array([n], np.int32)]
        for g, w in zip(execute(compiled, feeds), execute(reference, feeds)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
