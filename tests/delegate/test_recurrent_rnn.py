"""RNN, UNIDIRECTIONAL/BIDIRECTIONAL_SEQUENCE_RNN, SVDF and LSH_PROJECTION through the nnhal
delegate, judged against TFLite's CPU kernels (reference kernels) on the same model.

The recurrent ops keep their state in TFLite variable tensors: every test invokes several times
in a row (the state carried from one invoke to the next) with a ``reset_all_variables()`` in
between, and checks that the state matters (the same input twice gives different outputs), so a
delegate that dropped or mis-copied the state would fail.
"""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from delegate import load_delegate
from delegate.mapping.core import options_reader
from delegate.mapping.sequence_steps import MAX_UNROLLED_STEPS
from delegate.simple import PythonDelegate
from delegate.tfl import read_model
from delegate.tfl.builder import TfLiteModelBuilder
from delegate.tfl.schema import ActivationFunctionType as Act
from delegate.tfl.schema import BuiltinOperator
from hal.types import OperationType
from tests.delegate.helpers import (
    assert_outputs_equal,
    check_stateful_against_cpu,
    interpreter,
    live_and_file_options,
    run,
    stateful_feeds,
)

F32 = np.float32
BATCH, INPUT, UNITS, TIME = 2, 3, 4, 5


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """One `nnhal serve` for the module (tests.service.conftest.ServerProcess)."""
    from tests.service.conftest import ServerProcess
    s = ServerProcess(tmp_path_factory.mktemp("rnn"))
    yield s
    s.stop()


def _const(b: TfLiteModelBuilder, rng, name: str, shape, scale: float = 0.5) -> int:
    return b.add_constant(name, rng.uniform(-scale, scale, shape).astype(F32))


def _cell(b, rng, prefix: str, input_size: int, units: int, batch: int = BATCH) -> list[int]:
    """weights, recurrent_weights, bias and the hidden state (a variable tensor) of one RNN cell."""
    return [_const(b, rng, f"{prefix}w", (units, input_size)), _const(b, rng, f"{prefix}r", (units, units)),
            _const(b, rng, f"{prefix}b", (units,)), b.add_tensor(f"{prefix}h", [batch, units], is_variable=True)]


def rnn_model(act=Act.RELU, seed=0, hybrid=False) -> bytes:
    rng = np.random.default_rng(seed)
    b = TfLiteModelBuilder()
    x = b.add_input("x", [BATCH, INPUT])
    w, r, bias, h = _cell(b, rng, "", INPUT, UNITS)
    if hybrid:  # int8 weights with float activations: TFLite's hybrid kernel
        w, r = (b.add_constant(f"{n}q", rng.integers(-127, 128, shape).astype(np.int8), scale=0.01, zero_point=0)
                for n, shape in (("w", (UNITS, INPUT)), ("r", (UNITS, UNITS))))
    y = b.add_tensor("y", [BATCH, UNITS])
    b.add_operator("RNN", [x, w, r, bias, h], [y], ("RNNOptions", {"fused_activation_function": act}),
                   version=2 if hybrid else 1)
    b.set_outputs([y])
    return b.build()


def _sequence_shape(time_major: bool, size: int, steps: int = TIME) -> list[int]:
    return [steps, BATCH, size] if time_major else [BATCH, steps, size]


def sequence_rnn_model(time_major: bool, act=Act.RELU, seed=1, steps: int = TIME) -> bytes:
    rng = np.random.default_rng(seed)
    b = TfLiteModelBuilder()
    x = b.add_input("x", _sequence_shape(time_major, INPUT, steps))
    cell = _cell(b, rng, "", INPUT, UNITS)
    y = b.add_tensor("y", _sequence_shape(time_major, UNITS, steps))
    b.add_operator("UNIDIRECTIONAL_SEQUENCE_RNN", [x, *cell], [y], (
        "SequenceRNNOptions", {"time_major": time_major, "fused_activation_function": act}))
    b.set_outputs([y])
    return b.build()


def bidirectional_rnn_model(time_major: bool, merge: bool, linking: str = "none", seed=2, aux_size: int = 0,
                            act=Act.RELU, steps: int = TIME) -> bytes:
    """``linking``: none (no aux tensors), parallel (aux_input is the backward cell's input), cross
    (aux_input times each cell's aux weights added to both cells). TFLite requires the backward
    weights to take input 0's size even when they read aux_input (parallel). A separate bw_output
    is declared as the forward one."""
    rng = np.random.default_rng(seed)
    fw_units, bw_units = UNITS, UNITS + 1
    aux_size = aux_size or (INPUT + 2 if linking == "cross" and not time_major else INPUT)
    b = TfLiteModelBuilder()
    x = b.add_input("x", _sequence_shape(time_major, INPUT, steps))
    aux = b.add_input("aux", _sequence_shape(time_major, aux_size, steps)) if linking != "none" else -1
    fw = _cell(b, rng, "fw_", INPUT, fw_units)
    bw = _cell(b, rng, "bw_", INPUT, bw_units)
    aux_w = [-1, -1]
    if linking == "cross":
        aux_w = [_const(b, rng, "fw_aux_w", (fw_units, aux_size)), _const(b, rng, "bw_aux_w", (bw_units, aux_size))]
    if merge:
        outs = [b.add_tensor("y", _sequence_shape(time_major, fw_units + bw_units, steps))]
    else:
        outs = [b.add_tensor("fw_y", _sequence_shape(time_major, fw_units, steps)),
                b.add_tensor("bw_y", _sequence_shape(time_major, bw_units, steps))]
    b.add_operator("BIDIRECTIONAL_SEQUENCE_RNN", [x, *fw, *bw, aux, *aux_w], outs, (
        "BidirectionalSequenceRNNOptions", {"time_major": time_major, "merge_outputs": merge,
                                            "fused_activation_function": act}))
    b.set_outputs(outs)
    return b.build()


def svdf_model(rank: int, act=Act.NONE, bias=True, seed=3, memory=4) -> bytes:
    rng = np.random.default_rng(seed)
    filters = UNITS * rank
    b = TfLiteModelBuilder()
    x = b.add_input("x", [BATCH, INPUT])
    wf, wt = _const(b, rng, "wf", (filters, INPUT)), _const(b, rng, "wt", (filters, memory))
    bb = _const(b, rng, "b", (UNITS,)) if bias else -1
    s = b.add_tensor("s", [BATCH, memory * filters], is_variable=True)
    y = b.add_tensor("y", [BATCH, UNITS])
    b.add_operator("SVDF", [x, wf, wt, bb, s], [y], ("SVDFOptions", {"rank": rank, "fused_activation_function": act}))
    b.set_outputs([y])
    return b.build()


def lsh_model(kind: int, weighted: bool, dtype=F32, seed=4) -> bytes:
    rng = np.random.default_rng(seed)
    num_hash, num_bits, rows = 3, 5, 4
    b = TfLiteModelBuilder()
    x = b.add_input("x", [rows, 2], dtype)
    h = _const(b, rng, "hash", (num_hash, num_bits), scale=10.0)
    weight = [_const(b, rng, "weight", (rows,), scale=1.0)] if weighted else []  # TFLite: 2 inputs, or 3
    y = b.add_tensor("y", [num_hash * num_bits if kind == 2 else num_hash], np.int32)
    b.add_operator("LSH_PROJECTION", [h, x, *weight], [y], ("LSHProjectionOptions", {"type": kind}))
    b.set_outputs([y])
    return b.build()


def check_against_cpu(service, model: bytes, seed: int = 0, stateful: bool = True, n: int = 6) -> PythonDelegate:
    """check_stateful_against_cpu with small integers (LSH_PROJECTION's int32 inputs)."""
    return check_stateful_against_cpu(service, model, seed, n, stateful, int_range=(-3, 4))


# ---- the live interpreter: delegated, state carried ------------------------------------------------

@pytest.mark.parametrize("act", [Act.NONE, Act.RELU, Act.RELU_N1_TO_1, Act.RELU6, Act.TANH])
def test_rnn(service, act):
    d = check_against_cpu(service, rnn_model(act), seed=int(act))
    (kernel,) = d.impl.kernels
    assert len(kernel.part.state_tensors) == 1  # the hidden state, copied back after every run


@pytest.mark.parametrize("time_major", [False, True])
@pytest.mark.parametrize("act", [Act.NONE, Act.RELU])
def test_unidirectional_sequence_rnn(service, time_major, act):
    check_against_cpu(service, sequence_rnn_model(time_major, act), seed=10 + time_major)


@pytest.mark.parametrize("merge", [False, True])
@pytest.mark.parametrize("linking,time_major", [("none", False), ("none", True), ("parallel", True),
                                                ("cross", False), ("cross", True)])
def test_bidirectional_sequence_rnn(service, time_major, merge, linking):
    """Batch-major parallel linking: TFLite's kernel ignores aux_input (test_unmappable_variant_...)."""
    d = check_against_cpu(service, bidirectional_rnn_model(time_major, merge, linking), seed=20 + merge)
    assert len(d.impl.kernels[0].part.state_tensors) == 2  # forward and backward hidden states


def _operation_counts(d: PythonDelegate) -> dict[OperationType, int]:
    ops = [OperationType(o.type) for o in d.impl.kernels[0].part.model.main.operations]
    return {t: ops.count(t) for t in set(ops)}


@pytest.mark.parametrize("steps", [1, TIME])
@pytest.mark.parametrize("time_major", [False, True])
def test_unidirectional_sequence_rnn_tanh_unrolled(service, time_major, steps):
    """TANH (Keras SimpleRNN's default), which NNAPI's sequence operation cannot apply: one RNN
    (activation NONE) and one TANH per step, the state carried from step to step and invoke to invoke."""
    d = check_against_cpu(service, sequence_rnn_model(time_major, Act.TANH, seed=12 + time_major, steps=steps),
                          seed=13 + steps)
    counts = _operation_counts(d)
    assert counts[OperationType.RNN] == counts[OperationType.TANH] == steps
    assert OperationType.UNIDIRECTIONAL_SEQUENCE_RNN not in counts
    assert len(d.impl.kernels[0].part.state_tensors) == 1


@pytest.mark.parametrize("merge", [False, True])
@pytest.mark.parametrize("linking,time_major,steps", [("none", False, TIME), ("none", True, TIME), ("none", False, 1),
                                                      ("none", True, 1), ("parallel", True, TIME),
                                                      ("cross", False, TIME), ("cross", True, TIME)])
def test_bidirectional_sequence_rnn_tanh_unrolled(service, time_major, merge, linking, steps):
    """Both cells unrolled (the backward one from the last step), with each linking TFLite's kernel
    computes as NNAPI does."""
    model = bidirectional_rnn_model(time_major, merge, linking, seed=24 + steps, act=Act.TANH, steps=steps)
    d = check_against_cpu(service, model, seed=25 + merge)
    counts = _operation_counts(d)
    assert counts[OperationType.RNN] == counts[OperationType.TANH] == 2 * steps
    assert len(d.impl.kernels[0].part.state_tensors) == 2


@pytest.mark.parametrize("rank,act,bias", [(1, Act.NONE, True), (2, Act.RELU, True), (1, Act.TANH, False),
                                           (3, Act.RELU6, True)])
def test_svdf(service, rank, act, bias):
    check_against_cpu(service, svdf_model(rank, act, bias), seed=30 + rank)


@pytest.mark.parametrize("kind", [1, 2])  # SPARSE, DENSE
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [F32, np.int32])
def test_lsh_projection(service, kind, weighted, dtype):
    check_against_cpu(service, lsh_model(kind, weighted, dtype), seed=40 + kind, stateful=False, n=4)


# ---- variants NNAPI cannot express stay on TFLite's CPU, with the reason -------------------------

@pytest.mark.parametrize("model,why", [
    (sequence_rnn_model(True, Act.TANH, steps=MAX_UNROLLED_STEPS + 1),
     f"TANH sequence of {MAX_UNROLLED_STEPS + 1} time steps: NNAPI's sequence operations have no TANH, and "
     f"unrolling it step by step is done for 1 to {MAX_UNROLLED_STEPS} steps"),
    (bidirectional_rnn_model(False, True, act=Act.TANH, steps=MAX_UNROLLED_STEPS + 1),
     f"TANH sequence of {MAX_UNROLLED_STEPS + 1} time steps"),
    (rnn_model(Act.SIGN_BIT), "fused activation 5 (SIGN_BIT) has no NNAPI equivalent"),
    (sequence_rnn_model(False, Act.SIGN_BIT), "fused activation 5 (SIGN_BIT) has no NNAPI equivalent"),
    (rnn_model(hybrid=True), "is not float32: hybrid RNN (quantized weights, float activations) has no NNAPI "
                             "equivalent"),
    (bidirectional_rnn_model(False, False, "parallel"), "batch-major with aux_input alone (parallel linking): "
                                                        "TFLite's kernel feeds its backward cell input 0"),
    (bidirectional_rnn_model(True, True, "cross", aux_size=INPUT + 2), "TFLite's kernel steps through aux_input "
                                                                       "by input 0's size"),
], ids=["sequence-tanh-too-long", "bidi-tanh-too-long", "sign-bit", "sequence-sign-bit", "hybrid",
       "bidi-parallel-batch-major", "bidi-cross-time-major"])
def test_unmappable_variant_stays_on_cpu_with_its_reason(service, model, why):
    d = load_delegate(service.address)
    it, ref = interpreter(model, d), interpreter(model)
    feeds = stateful_feeds(ref, np.random.default_rng(50), 3, int_range=(-3, 4))
    for xs in feeds:
        assert_outputs_equal(run(it, xs), run(ref, xs))
    (node,) = d.report.nodes
    assert node.placement == "CPU" and why in node.reason, node.reason
    assert d.impl.kernels == []


def test_integer_svdf_is_refused():
    """SVDF's full-integer variant (int8 input and weights, int16 state) has no NNAPI equivalent.
    (asymmetric_quantize_inputs only matters with hybrid weights, refused above: a float node
    ignores it, as TFLite's float kernel does.)"""
    from delegate.mapping import MappingContext, MappingError, map_node
    b = TfLiteModelBuilder()
    x = b.add_input("x", [BATCH, INPUT], np.int8, scale=0.1, zero_point=0)
    wf = b.add_constant("wf", np.ones((UNITS, INPUT), np.int8), scale=0.1, zero_point=0)
    wt = b.add_constant("wt", np.ones((UNITS, 2), np.int16), scale=0.1, zero_point=0)
    s = b.add_tensor("s", [BATCH, 2 * UNITS], np.int16, scale=0.1, zero_point=0, is_variable=True)
    y = b.add_tensor("y", [BATCH, UNITS], np.int8, scale=0.1, zero_point=0)
    b.add_operator("SVDF", [x, wf, wt, -1, s], [y], ("SVDFOptions", {"rank": 1}))
    b.set_outputs([y])
    graph = read_model(b.build())
    with pytest.raises(MappingError, match="SVDF with a INT8 input: NNAPI's SVDF is float only"):
        map_node(MappingContext(graph), graph.nodes[0])


# ---- options read from TFLite's C structs ---------------------------------------------------------

def _with_options(model_fn, *args, options: dict) -> bytes:
    """The model ``model_fn`` builds, with its only node's options replaced."""
    import delegate.tfl.builder as builder
    original = builder.TfLiteModelBuilder.add_operator

    def add_operator(self, op, inputs, outputs, opts=None, **kw):
        return original(self, op, inputs, outputs, (opts[0], {**opts[1], **options}), **kw)
    builder.TfLiteModelBuilder.add_operator = add_operator
    try:
        return model_fn(*args)
    finally:
        builder.TfLiteModelBuilder.add_operator = original


@pytest.mark.parametrize("model", [
    _with_options(rnn_model, Act.RELU6, options={"asymmetric_quantize_inputs": True}),
    _with_options(sequence_rnn_model, True, Act.RELU_N1_TO_1, options={"asymmetric_quantize_inputs": True}),
    _with_options(bidirectional_rnn_model, True, True, options={"asymmetric_quantize_inputs": True}),
    _with_options(bidirectional_rnn_model, False, False, options={"fused_activation_function": Act.TANH}),
    _with_options(svdf_model, 3, Act.RELU, options={"asymmetric_quantize_inputs": True}),
    lsh_model(2, True),
    lsh_model(1, False),
], ids=["rnn", "sequence", "bidi-merge", "bidi-tanh", "svdf", "lsh-dense", "lsh-sparse"])
def test_live_options_match_the_flatbuffer(model):
    """Every field a reader gives, read from the C struct TFLite 2.14 hands a delegate, equals the
    flatbuffer's value (non-default values, so a wrong offset reads a wrong one)."""
    live, file = live_and_file_options(model)
    assert live and "__undecoded__" not in live
    for key, value in live.items():
        assert file[key] == value, key
    assert any(v not in (0, False) for v in live.values())


@pytest.mark.parametrize("code,values,want", [
    (BuiltinOperator.RNN, [(C.c_int, 3), (C.c_bool, True)],
     {"fused_activation_function": 3, "asymmetric_quantize_inputs": True}),
    (BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_RNN, [(C.c_bool, True), (C.c_int, 2), (C.c_bool, True)],
     {"time_major": True, "fused_activation_function": 2, "asymmetric_quantize_inputs": True}),
    (BuiltinOperator.BIDIRECTIONAL_SEQUENCE_RNN, [(C.c_bool, True), (C.c_int, 4), (C.c_bool, True), (C.c_bool, False)],
     {"time_major": True, "fused_activation_function": 4, "merge_outputs": True, "asymmetric_quantize_inputs": False}),
    (BuiltinOperator.SVDF, [(C.c_int, 7), (C.c_int, 1), (C.c_bool, True)],
     {"rank": 7, "fused_activation_function": 1, "asymmetric_quantize_inputs": True}),
    (BuiltinOperator.LSH_PROJECTION, [(C.c_int, 2)], {"type": 2}),
])
def test_readers_follow_the_c_struct_layout(code, values, want):
    """The readers' offsets are those of a C struct with these members (ctypes lays it out as the
    compiler does: bools after ints padded to the int's alignment)."""
    struct = type("Params", (C.Structure,), {"_fields_": [(f"f{k}", t) for k, (t, _) in enumerate(values)]})
    data = struct(*(v for _, v in values))
    assert options_reader(code).read(C.addressof(data)) == want
