"""LSTM, UNIDIRECTIONAL_SEQUENCE_LSTM and BIDIRECTIONAL_SEQUENCE_LSTM (float32) through the nnhal
delegate, judged against TFLite's CPU kernels (reference kernels) on the same model; and a
keyword-spotting LSTM model delegated whole.

The states are TFLite variable tensors: every test invokes several times in a row, with a
``reset_all_variables()`` in between, and checks that the state matters (the same input twice
gives different outputs) and that the reset restores it, so a delegate that dropped or mis-copied
a state would fail.
"""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from delegate import load_delegate
from delegate.mapping import MappingContext, MappingError, map_node
from delegate.mapping.core import options_reader
from delegate.simple import PythonDelegate
from delegate.tfl import read_model
from delegate.tfl.builder import TfLiteModelBuilder
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
from tests.delegate.kws_model import CLASSES, kws_model, mfcc_like
from tests.delegate.lstm_models import Cell, bidirectional_model, lstm_model, unidirectional_model
from tests.harness import assert_float_close


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """One `nnhal serve` for the module (tests.service.conftest.ServerProcess)."""
    from tests.service.conftest import ServerProcess
    s = ServerProcess(tmp_path_factory.mktemp("lstm"))
    yield s
    s.stop()


def check_against_cpu(service, model: bytes, seed: int = 0, n: int = 6, states: int = 2) -> PythonDelegate:
    """check_stateful_against_cpu, and the partition carries ``states`` state tensors."""
    d = check_stateful_against_cpu(service, model, seed, n)
    (kernel,) = d.impl.kernels
    assert len(kernel.part.state_tensors) == states
    return d


#: Cell variants: every option alone, and together.
CELLS = {
    "plain": Cell(),
    "cifg": Cell(cifg=True),
    "peephole": Cell(peephole=True),
    "cifg-peephole": Cell(cifg=True, peephole=True),
    "projection": Cell(projection=4),
    "projection-bias": Cell(projection=8, projection_bias=True),
    "layer-norm": Cell(layer_norm=True),
    "cifg-layer-norm": Cell(cifg=True, layer_norm=True),
    "all": Cell(peephole=True, projection=4, projection_bias=True, layer_norm=True),
    "all-cifg": Cell(cifg=True, peephole=True, projection=5, projection_bias=True, layer_norm=True),
}
#: (cell_clip, proj_clip): small enough to bite with these weights (TFLite refuses negative clips).
CLIPS = {"no-clip": (0.0, 0.0), "clips": (0.3, 0.15), "cell-clip": (0.2, 0.0), "proj-clip": (0.0, 0.1)}


# ---- the live interpreter: delegated, state carried ------------------------------------------------

@pytest.mark.parametrize("cell", CELLS.values(), ids=CELLS.keys())
def test_lstm(service, cell):
    check_against_cpu(service, lstm_model(cell), seed=1)


@pytest.mark.parametrize("clips", CLIPS.values(), ids=CLIPS.keys())
def test_lstm_clips(service, clips):
    check_against_cpu(service, lstm_model(CELLS["all"], cell_clip=clips[0], proj_clip=clips[1], seed=2), seed=2)


def test_lstm_without_layer_norm_inputs(service):
    """The 20-input form (LSTM before layer normalisation: no inputs 20-23)."""
    check_against_cpu(service, lstm_model(Cell(peephole=True, projection=4), inputs=20), seed=3)


@pytest.mark.parametrize("time_major", [False, True])
@pytest.mark.parametrize("cell", [CELLS[k] for k in ("plain", "cifg-peephole", "projection-bias", "all",
                                                     "all-cifg")],
                         ids=["plain", "cifg-peephole", "projection-bias", "all", "all-cifg"])
def test_unidirectional_sequence_lstm(service, cell, time_major):
    model = unidirectional_model(cell, time_major=time_major, cell_clip=0.4, proj_clip=0.3, seed=4)
    check_against_cpu(service, model, seed=4 + time_major)


def test_unidirectional_sequence_lstm_batch_of_one_long_sequence(service):
    check_against_cpu(service, unidirectional_model(CELLS["all"], time=30, batch=1, seed=5), seed=5)


BIDI = {  # (forward cell, backward cell, options); TFLite wants both cells of the same sizes
    "plain": (Cell(), Cell(), {}),
    "batch-major": (Cell(), Cell(), {"time_major": False}),
    "merge": (Cell(), Cell(), {"merge_outputs": True}),
    "merge-batch-major-1": (Cell(), Cell(), {"merge_outputs": True, "time_major": False, "batch": 1}),
    "options": (CELLS["all-cifg"], Cell(cifg=True, peephole=True, projection=5), {"cell_clip": 0.3,
                                                                                   "proj_clip": 0.2}),
    "mixed-options": (Cell(peephole=True, projection=4), Cell(cifg=True, projection=4, projection_bias=True), {}),
    "cross-aux": (Cell(), Cell(), {"aux": "cross", "aux_size": 5}),
    "cross-aux-cifg-merge": (Cell(cifg=True), Cell(cifg=True), {"aux": "cross", "aux_size": 5,
                                                                "merge_outputs": True}),
    "parallel-aux": (Cell(peephole=True), Cell(peephole=True), {"aux": "parallel", "time_major": False}),
}


@pytest.mark.parametrize("fw,bw,options", BIDI.values(), ids=BIDI.keys())
def test_bidirectional_sequence_lstm(service, fw, bw, options):
    check_against_cpu(service, bidirectional_model(fw, bw, seed=6, **options), seed=6, states=4)


def test_float16_weights_are_folded_and_delegated(service):
    """What TFLite calls a float16 LSTM: fp16 constants DEQUANTIZEd to the float32 weights (TFLite
    has no float16 LSTM kernel). The DEQUANTIZEs fold into constants; the model is delegated whole."""
    rng = np.random.default_rng(7)
    b = TfLiteModelBuilder()
    x = b.add_input("x", [4, 2, 5])

    def weights(name, shape):
        half = b.add_constant(name + "/fp16", rng.uniform(-0.5, 0.5, shape).astype(np.float16))
        full = b.add_tensor(name, list(shape))
        b.add_operator("DEQUANTIZE", [half], [full])
        return full
    ins = [x, *(weights(f"w{k}", (6, 5)) for k in range(4)), *(weights(f"r{k}", (6, 6)) for k in range(4)),
           -1, -1, -1, *(weights(f"b{k}", (6,)) for k in range(4)), -1, -1,
           b.add_tensor("h", [2, 6], is_variable=True), b.add_tensor("c", [2, 6], is_variable=True), -1, -1, -1, -1]
    y = b.add_tensor("y", [4, 2, 6])
    b.add_operator("UNIDIRECTIONAL_SEQUENCE_LSTM", ins, [y], ("UnidirectionalSequenceLSTMOptions", {
        "fused_activation_function": 4, "time_major": True}))
    b.set_outputs([y])
    d = check_against_cpu(service, b.build(), seed=7)
    assert [r.op for r in d.report.nodes].count("DEQUANTIZE") == 12


# ---- the fully integer LSTM: NNAPI's QUANTIZED_LSTM ------------------------------------------------

QLSTM_VARIANTS = {  # tests/ops/test_quantized_lstm_int8.py's, through the delegate
    "basic": {},
    "cifg-peephole": dict(cifg=True, peephole=True),
    "projection-bias": dict(projection=True, projection_bias=True),
    "layer-norm": dict(layer_norm=True),
    "cifg-layer-norm": dict(cifg=True, layer_norm=True),
    # TFLite's peephole walks the cell state with a stride of output_size: keep it equal to num_units.
    "everything": dict(peephole=True, projection=True, projection_bias=True, layer_norm=True, output_size=4),
    "clips": dict(projection=True, cell_clip=0.3, proj_clip=0.2),
}


@pytest.mark.parametrize("variant", QLSTM_VARIANTS.values(), ids=QLSTM_VARIANTS.keys())
def test_integer_lstm_bit_exact(service, variant):
    """int8 LSTM (int16 cell state, 5 intermediates) -> QUANTIZED_LSTM: bit-exact with TFLite's
    reference kernels over several invokes, the states carried and reset."""
    from tests.ops._qlstm_tflite import random_case, tflite_model
    case = random_case(np.random.default_rng(9), **variant)
    d = check_against_cpu(service, tflite_model(case).model, seed=9)
    assert d.impl.kernels[0].part.model.main.operations[0].type == OperationType.QUANTIZED_LSTM


@pytest.mark.parametrize("time_major", [False, True], ids=["batch-major", "time-major"])
@pytest.mark.parametrize("variant", QLSTM_VARIANTS.values(), ids=QLSTM_VARIANTS.keys())
def test_integer_sequence_lstm_bit_exact(service, variant, time_major):
    """int8 UNIDIRECTIONAL_SEQUENCE_LSTM, unrolled into one QUANTIZED_LSTM a time step: bit-exact
    with TFLite's reference kernels over several invokes, the states carried and reset."""
    from tests.ops._qlstm_tflite import random_case, tflite_model
    case = random_case(np.random.default_rng(11), **variant)
    d = check_against_cpu(service, tflite_model(case, steps=5, time_major=time_major).model, seed=11)
    ops = [op.type for op in d.impl.kernels[0].part.model.main.operations]
    assert ops.count(OperationType.QUANTIZED_LSTM) == 5, ops


def test_integer_sequence_lstm_of_one_step_and_too_many_steps(service):
    """One step: no SPLIT or CONCATENATION, still right; past the unrolling bound: refused, with why."""
    from delegate.mapping.sequence_steps import MAX_UNROLLED_STEPS
    from tests.ops._qlstm_tflite import random_case, tflite_model
    case = random_case(np.random.default_rng(12))
    d = check_against_cpu(service, tflite_model(case, steps=1).model, seed=12)
    assert [op.type for op in d.impl.kernels[0].part.model.main.operations] == [
        OperationType.RESHAPE, OperationType.QUANTIZED_LSTM, OperationType.RESHAPE]
    assert f"integer sequence LSTM of {MAX_UNROLLED_STEPS + 1} time steps" in _refusal(
        tflite_model(case, steps=MAX_UNROLLED_STEPS + 1).model)


def test_integer_lstm_without_its_intermediates_is_refused():
    from tests.ops._qlstm_tflite import random_case, tflite_model
    graph = read_model(tflite_model(random_case(np.random.default_rng(10))).model)
    graph.nodes[0].intermediates = graph.nodes[0].intermediates[:4]
    with pytest.raises(MappingError, match="needs its 5 intermediate tensors"):
        map_node(MappingContext(graph), graph.nodes[0])


# ---- item 3: a keyword-spotting model ---------------------------------------------------------------

def test_keyword_spotting_lstm_model_is_delegated_whole(service):
    """MFCC frames -> UNIDIRECTIONAL_SEQUENCE_LSTM -> last step -> FULLY_CONNECTED -> SOFTMAX, in one
    partition; over a stream of windows (the state carried, then reset) its class probabilities are
    TFLite's within 1e-4 of the output's scale."""
    model = kws_model()
    d = load_delegate(service.address)
    it, ref = interpreter(model, d), interpreter(model)
    assert d.report.partitions == [[0, 1, 2, 3]] and d.report.delegated == 4, \
        [(r.op, r.reason) for r in d.report.nodes]
    windows = mfcc_like(np.random.default_rng(12), 5)
    seen = []
    for k, x in enumerate([*windows, windows[0]]):
        if k == len(windows):
            it.reset_all_variables()
            ref.reset_all_variables()
        (want,), (got,) = run(ref, [x]), run(it, [x])
        assert got.shape == (1, CLASSES)
        assert_float_close(got, want, rtol=0, atol=1e-4 * float(np.max(np.abs(want))))
        seen.append(want)
    assert not np.allclose(seen[0], seen[1], atol=1e-3)  # different windows, different answers
    np.testing.assert_array_equal(seen[0], seen[-1])  # the reset: the first window's answer again
    assert [k.fallbacks for k in d.impl.kernels] == [0]
    assert len(d.impl.kernels[0].part.state_tensors) == 2


# ---- variants NNAPI cannot express stay on TFLite's CPU, with the reason -------------------------

@pytest.mark.parametrize("model,why", [
    (lstm_model(Cell(hybrid=True)), "the hybrid LSTM kernel has no NNAPI equivalent"),
    (unidirectional_model(Cell(hybrid=True, peephole=True)), "the hybrid LSTM kernel has no NNAPI equivalent"),
], ids=["lstm-hybrid", "sequence-hybrid"])
def test_hybrid_lstm_stays_on_cpu_with_its_reason(service, model, why):
    d = load_delegate(service.address)
    it, ref = interpreter(model, d), interpreter(model)
    for xs in stateful_feeds(ref, np.random.default_rng(8), 3):
        assert_outputs_equal(run(it, xs), run(ref, xs))
    (node,) = d.report.nodes
    assert node.placement == "CPU" and why in node.reason, node.reason
    assert d.impl.kernels == []


def _refusal(model: bytes, **options) -> str:
    graph = read_model(model)
    graph.nodes[0].options.update(options)
    with pytest.raises(MappingError) as e:
        map_node(MappingContext(graph), graph.nodes[0])
    return str(e.value)


def test_unmappable_variants_are_refused_with_a_reason():
    assert "basic LSTM kernel" in _refusal(lstm_model(Cell()), kernel_type=1)
    assert "diagonal recurrent weights" in _refusal(unidirectional_model(Cell()), diagonal_recurrent_tensors=True)
    assert "diagonal (1-D) recurrent weights" in _refusal(lstm_model(Cell(diagonal=True)))
    # TFLite's own kernel is wrong there (it reads past its buffers): no result to reproduce.
    assert "batch-major merge_outputs with batch > 1" in _refusal(
        bidirectional_model(Cell(), Cell(), merge_outputs=True, time_major=False, batch=2))
    assert "reads aux_input with the input's width" in _refusal(
        bidirectional_model(Cell(), Cell(), aux="cross", aux_size=3))
    b = TfLiteModelBuilder()  # an int8 sequence LSTM without weights
    x = b.add_input("x", [1, 1, 2], np.int8, scale=0.1, zero_point=0)
    y = b.add_tensor("y", [1, 1, 2], np.int8, scale=0.1, zero_point=0)
    b.add_operator("UNIDIRECTIONAL_SEQUENCE_LSTM", [x] + [-1] * 23, [y], ("UnidirectionalSequenceLSTMOptions", {}))
    assert "only the float32 kernels and the fully integer (int8 weights) LSTM" in _refusal(b.build())


def test_a_state_that_is_not_a_variable_tensor_is_refused():
    graph = read_model(lstm_model(Cell()))
    graph.tensors[graph.nodes[0].inputs[18]].is_variable = False
    with pytest.raises(MappingError, match="output state .* is not a variable tensor"):
        map_node(MappingContext(graph), graph.nodes[0])


# ---- options read from TFLite's C structs ---------------------------------------------------------

@pytest.mark.parametrize("model", [
    lstm_model(Cell(), cell_clip=0.25, proj_clip=0.5),
    unidirectional_model(Cell(), time_major=True, cell_clip=1.5, proj_clip=2.5),
    bidirectional_model(Cell(), Cell(), merge_outputs=True, time_major=False, batch=1, cell_clip=3.0,
                        proj_clip=0.75),
], ids=["lstm", "sequence", "bidi"])
def test_live_options_match_the_flatbuffer(model):
    """Every field a reader gives, read from the C struct TFLite 2.14 hands a delegate, equals the
    flatbuffer's value (non-default values, so a wrong offset reads a wrong one)."""
    live, file = live_and_file_options(model)
    assert live and "__undecoded__" not in live
    for key, value in live.items():
        assert file[key] == pytest.approx(value), key
    assert live["cell_clip"] > 0 and live["fused_activation_function"] == 4


@pytest.mark.parametrize("code,values,want", [
    (BuiltinOperator.LSTM, [(C.c_int, 4), (C.c_float, 0.5), (C.c_float, 1.5), (C.c_int, 1), (C.c_bool, True)],
     {"fused_activation_function": 4, "cell_clip": 0.5, "proj_clip": 1.5, "kernel_type": 1}),
    (BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_LSTM,
     [(C.c_int, 1), (C.c_float, 2.0), (C.c_float, 3.0), (C.c_bool, True), (C.c_bool, False), (C.c_bool, True)],
     {"fused_activation_function": 1, "cell_clip": 2.0, "proj_clip": 3.0, "time_major": True,
      "diagonal_recurrent_tensors": True}),
    (BuiltinOperator.BIDIRECTIONAL_SEQUENCE_LSTM,
     [(C.c_int, 6), (C.c_float, 0.25), (C.c_float, 4.0), (C.c_bool, False), (C.c_bool, True), (C.c_bool, True)],
     {"fused_activation_function": 6, "cell_clip": 0.25, "proj_clip": 4.0, "merge_outputs": False,
      "time_major": True}),
])
def test_readers_follow_the_c_struct_layout(code, values, want):
    """The readers' offsets are those of a C struct with these members (ctypes lays it out as the
    compiler does)."""
    struct = type("Params", (C.Structure,), {"_fields_": [(f"f{k}", t) for k, (t, _) in enumerate(values)]})
    data = struct(*(v for _, v in values))
    assert options_reader(code).read(C.addressof(data)) == want
