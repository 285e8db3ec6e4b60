"""hal.fusion: the numba backend's ``swish`` step (LOGISTIC then MUL of its input and output) is
bit-exact with the unfused operations on the reference backend for every 8-bit input value, is
made only where the LOGISTIC's output has no other use, survives the compilation cache, and is
timed as one record covering both operations."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hal.backends.numba_kernels")

from hal.compiler import compile_model  # noqa: E402
from hal.executor import execute  # noqa: E402
from hal.fusion import FusedContext  # noqa: E402
from hal.model import ModelBuilder  # noqa: E402
from hal.serialize import dump_compiled, load_compiled  # noqa: E402
from hal.types import OperandType, OperationType  # noqa: E402

QU8 = OperandType.TENSOR_QUANT8_ASYMM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
DTYPE = {QU8: np.uint8, QS8: np.int8}
ORDER = ("numba", "reference")


def _swish_model(t, *, x_first=True, act=0, extra_reader=False, logistic_is_output=False, y_scale=0.02,
                 shape=(1, 8, 8, 16)):
    """x -> LOGISTIC -> y; MUL(x, y) (or (y, x)) -> z; optionally y also read by an ADD, or y a model output."""
    mb = ModelBuilder()
    zp = {QU8: 131, QS8: -3}[t]
    x = mb.add_operand(t, shape, scale=0.07, zero_point=zp)
    y = mb.add_operand(t, shape, scale=1 / 256, zero_point=0 if t == QU8 else -128)  # LOGISTIC's fixed scale
    mb.add_operation(OperationType.LOGISTIC, [x], [y])
    z = mb.add_operand(t, shape, scale=y_scale, zero_point={QU8: 120, QS8: 5}[t])
    mb.add_operation(OperationType.MUL, [x, y, mb.add_int32(act)] if x_first else [y, x, mb.add_int32(act)], [z])
    outputs = [z]
    if extra_reader:
        w = mb.add_operand(t, shape, scale=0.05, zero_point=zp)
        mb.add_operation(OperationType.ADD, [z, y, mb.add_int32(0)], [w])
        outputs = [w]
    if logistic_is_output:
        outputs.append(y)
    mb.identify_inputs_and_outputs([x], outputs)
    return mb.finish()


def _every_value(t, shape=(1, 8, 8, 16)):
    """Every 8-bit value at least once (4 times over 1024 elements), shuffled."""
    v = np.resize(np.arange(256, dtype=np.uint8), int(np.prod(shape)))
    np.random.default_rng(1).shuffle(v)
    return v.view(DTYPE[t]).reshape(shape)


def _fused(compiled) -> list:
    return [s for s in compiled.static_plan.program if isinstance(s.ctx, FusedContext)]


@pytest.mark.parametrize("t", [QU8, QS8])
@pytest.mark.parametrize("x_first", [True, False])
@pytest.mark.parametrize("act,y_scale", [(0, 0.02), (1, 0.02), (3, 0.004), (0, 0.3)])
def test_swish_is_one_step_and_exact_on_every_value(t, x_first, act, y_scale):
    model = _swish_model(t, x_first=x_first, act=act, y_scale=y_scale)
    fast, ref = compile_model(model, backend_order=ORDER), compile_model(model, backend_order=("reference",))
    [step] = _fused(fast)
    assert step.operations == (0, 1) and len(fast.static_plan.program) == 1
    assert not _fused(ref)  # the oracle runs the operations as they are
    x = _every_value(t)
    got, want = execute(fast, [x])[0], execute(ref, [x])[0]
    assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("kwargs", [{"extra_reader": True}, {"logistic_is_output": True}])
def test_a_logistic_output_read_elsewhere_is_not_fused(kwargs):
    model = _swish_model(QS8, **kwargs)
    fast, ref = compile_model(model, backend_order=ORDER), compile_model(model, backend_order=("reference",))
    assert not _fused(fast)
    x = _every_value(QS8)
    for got, want in zip(execute(fast, [x]), execute(ref, [x])):
        assert np.array_equal(got, want)


def test_a_cached_plan_fuses_again():
    model = _swish_model(QU8)
    compiled = compile_model(model, backend_order=ORDER)
    payload, arrays = dump_compiled(compiled)
    loaded = load_compiled(payload, arrays, backend_order=ORDER)
    assert len(_fused(loaded)) == 1 and len(loaded.static_plan.steps) == 2
    x = _every_value(QU8)
    assert np.array_equal(execute(loaded, [x])[0], execute(compiled, [x])[0])


def test_timings_name_both_operations_in_one_record():
    """One record for the fused step: its first operation's type, the count of its operations; the
    service names it by them (not as a graph backend's PARTITION)."""
    from service.driver import perf_name
    compiled = compile_model(_swish_model(QS8), backend_order=ORDER)
    timings = []
    execute(compiled, [_every_value(QS8)], timings)
    [t] = timings
    assert (t.index, t.count, t.type, t.backend) == (0, 2, OperationType.LOGISTIC, "numba")
    assert perf_name(t.type, t.count) == "LOGISTIC (+1 fused)"


def _conv_then(t, then: str, *, depthwise=False, also_output=False, k=1, seed=0):
    """x [1, 9, 11, 24] -> CONV_2D (k x k, SAME) or DEPTHWISE_CONV_2D -> y, then ``then``: "swish"
    (LOGISTIC, MUL(y, logistic)), "logistic" or "tanh"; ``also_output``: y is a model output too."""
    rng = np.random.default_rng(seed)
    mb = ModelBuilder()
    zp = {QU8: 131, QS8: -3}[t]
    x = mb.add_operand(t, (1, 9, 11, 24), scale=0.05, zero_point=zp)
    out_c = 24 if depthwise else 40
    w_shape = (1, k, k, 24) if depthwise else (out_c, k, k, 24)
    w = mb.add_constant(t, rng.integers(0 if t == QU8 else -127, 128 if t == QS8 else 256, w_shape).astype(DTYPE[t]),
                        scale=0.02, zero_point=119 if t == QU8 else 0)
    b = mb.add_constant(OperandType.TENSOR_INT32, rng.integers(-3000, 3000, out_c).astype(np.int32),
                        scale=float(np.float32(0.05) * np.float32(0.02)))
    y = mb.add_operand(t, (1, 9, 11, out_c), scale=0.06, zero_point={QU8: 120, QS8: 5}[t])
    pad = [mb.add_int32(1)]  # implicit padding: SAME
    if depthwise:
        mb.add_operation(OperationType.DEPTHWISE_CONV_2D, [x, w, b, *pad, mb.add_int32(1), mb.add_int32(1),
                                                           mb.add_int32(1), mb.add_int32(0)], [y])
    else:
        mb.add_operation(OperationType.CONV_2D, [x, w, b, *pad, mb.add_int32(1), mb.add_int32(1), mb.add_int32(0)],
                         [y])
    shape = (1, 9, 11, out_c)
    if then == "tanh":
        s = mb.add_operand(t, shape, scale=1 / 128, zero_point=128 if t == QU8 else 0)
        mb.add_operation(OperationType.TANH, [y], [s])
    else:
        s = mb.add_operand(t, shape, scale=1 / 256, zero_point=0 if t == QU8 else -128)
        mb.add_operation(OperationType.LOGISTIC, [y], [s])
    if then == "swish":
        z = mb.add_operand(t, shape, scale=0.03, zero_point={QU8: 100, QS8: -20}[t])
        mb.add_operation(OperationType.MUL, [y, s, mb.add_int32(0)], [z])
        s = z
    mb.identify_inputs_and_outputs([x], [s, y] if also_output else [s])
    return mb.finish()


@pytest.mark.parametrize("t", [QU8, QS8])
@pytest.mark.parametrize("then", ["swish", "logistic", "tanh"])
@pytest.mark.parametrize("depthwise,k", [(False, 1), (False, 3), (True, 3)])
def test_a_convolution_applies_the_next_table_itself(t, then, depthwise, k):
    model = _conv_then(t, then, depthwise=depthwise, k=k)
    fast, ref = compile_model(model, backend_order=ORDER), compile_model(model, backend_order=("reference",))
    [step] = fast.static_plan.program
    assert step.ctx.pattern == "table_after" and step.operations == tuple(range(len(model.main.operations)))
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = rng.integers(0, 256, (1, 9, 11, 24)).astype(np.uint8).view(DTYPE[t])
        got, want = execute(fast, [x])[0], execute(ref, [x])[0]
        assert np.array_equal(got, want)
    loaded = load_compiled(*dump_compiled(fast), backend_order=ORDER)
    assert [s.ctx.pattern for s in loaded.static_plan.program] == ["table_after"]
    assert np.array_equal(execute(loaded, [x])[0], want)
    timings = []
    execute(fast, [x], timings)
    assert [(r.index, r.count) for r in timings] == [(0, len(model.main.operations))]


def test_a_convolution_output_read_elsewhere_keeps_its_step():
    model = _conv_then(QS8, "swish", also_output=True)
    fast, ref = compile_model(model, backend_order=ORDER), compile_model(model, backend_order=("reference",))
    assert [getattr(s.ctx, "pattern", None) for s in fast.static_plan.program] == [None, "swish"]
    x = np.random.default_rng(4).integers(-128, 128, (1, 9, 11, 24)).astype(np.int8)
    for got, want in zip(execute(fast, [x]), execute(ref, [x])):
        assert np.array_equal(got, want)
