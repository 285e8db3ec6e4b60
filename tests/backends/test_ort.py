"""The onnxruntime backend against the reference backend: every CTS case of the operations it
lowers runs in an onnxruntime partition (nothing silently falls back) and meets CTS's float
criteria against the reference backend; partitions form as the compiler says; the compilation
cache stores the optimised model and loads it without lowering again."""
from __future__ import annotations

import functools

import numpy as np
import pytest

ort_backend = pytest.importorskip("hal.backends.ort")

from hal.compiler import compile_model  # noqa: E402
from hal.executor import execute  # noqa: E402
from hal.types import OperandType, OperationType  # noqa: E402
from nnhal.cts.corpus import load_cases  # noqa: E402
from tests.backends.differential import check_cached_load, compare, graph_backend_cts_runs  # noqa: E402

BACKEND = ort_backend.BACKEND
ORDER = ["onnxruntime", "reference"]
LOWERED = sorted(OperationType(t).name for t in BACKEND.lowerings)


@functools.cache
def _cases(operation: str) -> tuple:
    return tuple(c for c in load_cases(operations=[operation]) if not c.expect_failure)


@pytest.mark.parametrize("operation", LOWERED)
def test_cts_cases_run_in_onnxruntime_and_match_the_reference(operation):
    """Per lowered operation: each CTS case (every operand type) through onnxruntime-first and
    reference-only planning; the operation must have run in a partition on some float32 case,
    never fallen back, and every output meets CTS's float criteria against the reference."""
    if not _cases(operation):
        pytest.skip(f"the CTS has no {operation} case: checked by test_operations_without_cts_vectors")
    ran = graph_backend_cts_runs(BACKEND, operation, _cases(operation), ORDER)
    assert ran, f"no CTS case of {operation} ran in an onnxruntime partition"


def test_lowerings_take_float32_only_unless_they_say_so():
    for t, lowering in BACKEND.lowerings.items():
        assert lowering.types is not None, f"{OperationType(t).name}: lowering must list its input types"
        # (WHILE's input 0 is its condition subgraph: the loop values are the subgraphs' lowerings' types)
        loop = {OperandType.SUBGRAPH} if t == OperationType.WHILE else set()
        assert set(lowering.types) <= {OperandType.TENSOR_FLOAT32, OperandType.TENSOR_INT32,
                                       OperandType.TENSOR_BOOL8} | loop, OperationType(t).name


# ---- partitions, fallback, cache ---------------------------------------------------------------
F32, QU8 = OperandType.TENSOR_FLOAT32, OperandType.TENSOR_QUANT8_ASYMM


def _conv(b, x, rng, channels: int = 2):
    w = b.add_constant(F32, rng.standard_normal((channels, 1, 1, channels)).astype(np.float32))
    bias = b.add_constant(F32, rng.standard_normal(channels).astype(np.float32))
    y = b.add_operand(F32, (1, 4, 4, channels))
    b.add_operation(OperationType.CONV_2D, [x, w, bias, b.add_int32(1), b.add_int32(1), b.add_int32(1),
                                            b.add_int32(0)], [y])
    return y


def _split_model():
    """conv, conv | QUANTIZE, DEQUANTIZE (not lowered) | conv: two partitions; the first conv's
    output is also a model output, so the first partition has two outputs."""
    from hal.model import ModelBuilder
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.add_operand(F32, (1, 4, 4, 2))
    a = _conv(b, x, rng)
    c = _conv(b, a, rng)
    q = b.add_operand(QU8, (1, 4, 4, 2), scale=0.05, zero_point=128)
    b.add_operation(OperationType.QUANTIZE, [c], [q])
    d = b.add_operand(F32, (1, 4, 4, 2))
    b.add_operation(OperationType.DEQUANTIZE, [q], [d])
    e = _conv(b, d, rng)
    b.identify_inputs_and_outputs([x], [a, e])
    return b.finish()


def _x():
    return np.random.default_rng(1).standard_normal((1, 4, 4, 2)).astype(np.float32)


def test_runs_of_lowered_operations_become_one_partition_each():
    model = _split_model()
    plan = compile_model(model, backend_order=ORDER).static_plan
    assert [s.backend for s in plan.steps] == ["onnxruntime", "onnxruntime", "reference", "reference", "onnxruntime"]
    assert [(s.backend, s.operations) for s in plan.program] == [
        ("onnxruntime", (0, 1)), ("reference", (2,)), ("reference", (3,)), ("onnxruntime", (4,))]
    first = plan.program[0]
    a = model.main.output_indexes[0]
    assert first.inputs == tuple(model.main.input_indexes) and a in first.outputs and len(first.outputs) == 2
    timings = []
    got = execute(compile_model(model, backend_order=ORDER), [_x()], timings)
    assert [(t.backend, t.count) for t in timings] == [("onnxruntime", 2), ("reference", 1), ("reference", 1),
                                                       ("onnxruntime", 1)]
    want = execute(compile_model(model, backend_order=["reference"]), [_x()])
    for g, w in zip(got, want, strict=True):
        assert compare(g, w) is None


def test_a_run_whose_results_nothing_reads_still_executes():
    """NNAPI allows an operation whose output nobody reads; a graph needs an output, so such a run
    is planned operation by operation (make fuzz found GENERAL_FAILURE here), also from the cache."""
    from hal.model import ModelBuilder
    from hal.serialize import dump_compiled, load_compiled
    b = ModelBuilder()
    x = b.add_operand(F32, (2, 1))
    dead = b.add_operand(F32, (2, 1))
    b.add_operation(OperationType.ADD, [x, x, b.add_int32(0)], [dead])
    idx = b.add_operand(OperandType.TENSOR_INT32, (1,))
    y = b.add_operand(F32, (1, 1))
    b.add_operation(OperationType.EMBEDDING_LOOKUP, [idx, x], [y])
    b.identify_inputs_and_outputs([idx, x], [y])
    model = b.finish()
    inputs = [np.array([1], np.int32), np.array([[3.0], [4.0]], np.float32)]
    want = execute(compile_model(model, backend_order=["reference"]), inputs)
    compiled = compile_model(model, backend_order=ORDER)
    np.testing.assert_array_equal(execute(compiled, inputs)[0], want[0])
    np.testing.assert_array_equal(execute(load_compiled(*dump_compiled(compiled), ORDER), inputs)[0], want[0])


@pytest.mark.partition_fallback
def test_a_partition_that_fails_to_compile_runs_operation_by_operation(monkeypatch):
    def broken(partition):
        raise RuntimeError("lowering bug")
    monkeypatch.setattr(BACKEND, "compile", broken)
    model = _split_model()
    plan = compile_model(model, backend_order=ORDER).static_plan
    assert {s.backend for s in plan.program} == {"reference"} and len(plan.program) == 5
    want = execute(compile_model(model, backend_order=["reference"]), [_x()])
    for g, w in zip(execute(compile_model(model, backend_order=ORDER), [_x()]), want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_the_cache_keeps_the_optimised_model_and_loads_it_without_lowering(monkeypatch):
    from hal.serialize import dump_compiled
    model = _split_model()
    compiled = compile_model(model, backend_order=ORDER)
    payload, arrays = dump_compiled(compiled)
    tree = __import__("json").loads(payload)
    assert tree["backends"]["onnxruntime"] == BACKEND.identity() and len(tree["partitions"]) == 2
    # constants only the partitions read (filters, biases) live in the ORT model, not beside it
    conv_weights = {i for s in compiled.static_plan.steps if s.backend == "onnxruntime" for i in s.inputs[1:3]}
    assert not conv_weights & {int(i) for i, _ in tree["constants"]}

    def no_lowering(*args):
        raise AssertionError("a cached partition must not be lowered again")
    monkeypatch.setattr(ort_backend, "lower_partition", no_lowering)
    check_cached_load(compiled, payload, arrays, ORDER, [_x()])


def test_sessions_use_the_compute_thread_setting(monkeypatch):
    from hal import backends
    monkeypatch.setattr(backends.policy, "_compute_threads", 2)
    assert ort_backend.session_options().intra_op_num_threads == 2


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("adj_x,adj_y", [(False, False), (True, False), (False, True), (True, True)])
def test_batch_matmul_has_no_cts_vectors_so_it_is_checked_here(dtype, adj_x, adj_y):
    """BATCH_MATMUL (feature level 6) against the reference: float32 by CTS criteria, int32
    bit-exact including the accumulator's wrap-around."""
    from hal.model import ModelBuilder
    from tests.backends.differential import assert_matches_reference
    rng = np.random.default_rng(0)
    t = OperandType.TENSOR_FLOAT32 if dtype == np.float32 else OperandType.TENSOR_INT32
    lhs_shape, rhs_shape = (2, 3, 4), (2, 4, 5)
    if adj_x:
        lhs_shape = (2, 4, 3)
    if adj_y:
        rhs_shape = (2, 5, 4)
    b = ModelBuilder()
    x = b.add_operand(t, lhs_shape)
    w = b.add_constant(t, (rng.standard_normal(rhs_shape) if dtype == np.float32
                           else rng.integers(-2**31, 2**31, rhs_shape)).astype(dtype))
    y = b.add_operand(t, (2, 3, 5))
    b.add_operation(OperationType.BATCH_MATMUL, [x, w, b.add_bool(adj_x), b.add_bool(adj_y)], [y])
    b.identify_inputs_and_outputs([x], [y])
    xs = (rng.standard_normal(lhs_shape) if dtype == np.float32 else rng.integers(-2**31, 2**31, lhs_shape))
    result = assert_matches_reference(b.finish(), [xs.astype(dtype)], "onnxruntime")
    assert result.assigned == [0]


def _no_cts_models():
    """(operation, model, input) for the lowered operations NNAPI's CTS has no vectors for
    (NNAPI 1.3 and later): edge values included (±0, large, the HARD_SWISH knees ±3)."""
    from hal.model import ModelBuilder
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 3, 4)) * 4).astype(np.float32)
    x.flat[:6] = [0.0, -0.0, 3.0, -3.0, 80.0, -80.0]

    def one(op, params, out_shape=(2, 3, 4)):
        b = ModelBuilder()
        i = b.add_operand(OperandType.TENSOR_FLOAT32, x.shape)
        o = b.add_operand(OperandType.TENSOR_FLOAT32, out_shape)
        b.add_operation(op, [i, *params(b)], [o])
        b.identify_inputs_and_outputs([i], [o])
        return b.finish()
    i32 = OperandType.TENSOR_INT32
    yield "HARD_SWISH", one(OperationType.HARD_SWISH, lambda b: []), x
    for alpha in (1.0, 0.3, -0.5):
        yield f"ELU alpha={alpha}", one(OperationType.ELU, lambda b, alpha=alpha: [b.add_float32(alpha)]), x
    for axis in range(3):
        yield f"REVERSE axis={axis}", one(OperationType.REVERSE,
                                          lambda b, axis=axis: [b.add_constant(i32, np.array([axis], np.int32))]), x
    pads = np.array([[1, 0], [0, 2], [2, 1]], np.int32)
    for mode in (0, 1):
        yield f"MIRROR_PAD mode={mode}", one(OperationType.MIRROR_PAD, lambda b, mode=mode: [
            b.add_constant(i32, pads), b.add_int32(mode)], (3, 5, 7)), x


@pytest.mark.parametrize("label,model,x", list(_no_cts_models()), ids=lambda v: v if isinstance(v, str) else "")
def test_operations_without_cts_vectors(label, model, x):
    from tests.backends.differential import assert_matches_reference
    assert assert_matches_reference(model, [x], "onnxruntime").assigned == [0], label


def test_every_lowered_operation_is_checked_somewhere():
    """Each lowering has CTS cases above or a model of its own here (a new lowering without
    either would pass unchecked)."""
    # IF and WHILE (NNAPI 1.3, not in the CTS corpus): tests/backends/test_ort_control_flow.py
    own = {label.split()[0] for label, _, _ in _no_cts_models()} | {"BATCH_MATMUL", "IF", "WHILE"}
    assert not [op for op in LOWERED if not _cases(op) and op not in own]


def test_a_cached_partition_computes_what_the_compiled_one_does():
    """The artifact is loaded without optimising again: same graph, bit-identical outputs."""
    from delegate.mapping import convert_partition
    from delegate.tfl import read_model
    from hal.serialize import dump_compiled, load_compiled
    from nnhal.examples import mobilenet_like
    model = convert_partition(read_model(mobilenet_like(np.float32, input_size=32, width=8))).model
    compiled = compile_model(model, backend_order=ORDER)
    assert [s.backend for s in compiled.static_plan.program] == ["onnxruntime"]
    loaded = load_compiled(*dump_compiled(compiled), backend_order=ORDER)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 32, 32, 3)).astype(np.float32)
    np.testing.assert_array_equal(execute(loaded, [x])[0], execute(compiled, [x])[0])


def test_layout_transposes_only_at_the_partitions_edges():
    """Activations stay in NCHW between operations (tests/backends/test_ort_layout.py counts them
    on MediaPipe-style graphs): lowered, MobileNet's partition transposes only its pooled
    [1, 1, 1, C] value back (its stem convolution reads the NHWC image as one channel, ort/conv.py);
    optimised, no more than that."""
    import onnx
    import onnxruntime as ort

    from delegate.mapping import convert_partition
    from delegate.tfl import read_model
    from hal.plan import make_partition
    from nnhal.examples import mobilenet_like
    model = convert_partition(read_model(mobilenet_like(np.float32, input_size=32, width=8))).model
    plan = compile_model(model, backend_order=ORDER).static_plan
    part = make_partition(model, plan.steps, 0, len(plan.steps), plan.infos, plan.keep)
    graph, _ = ort_backend.lower_partition(BACKEND, part)
    lowered = graph.model(part.inputs, part.outputs)
    assert sum(n.op_type == "Conv" for n in lowered.graph.node) > 5
    assert sum(n.op_type == "Transpose" for n in lowered.graph.node) == 1
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".onnx") as f:
        so = ort_backend.session_options()
        so.optimized_model_filepath = f.name
        ort.InferenceSession(lowered.SerializeToString(), so, providers=["CPUExecutionProvider"])
        optimised = onnx.load(f.name)
    assert sum(n.op_type == "Transpose" for n in optimised.graph.node) <= 1


def test_low_power_models_get_one_intra_op_thread(monkeypatch):
    """nnhal serve --threads N gives partitions N intra-op threads, except LOW_POWER models
    (NNAPI's "prefer a single core"): 1."""
    from hal import backends
    from hal.types import ExecutionPreference, Priority
    from service.driver import Driver
    monkeypatch.setattr(backends.policy, "_compute_threads", 2)
    if backends.get("numba") is not None:  # at one thread (LOW_POWER) it takes these runs: not the subject
        monkeypatch.setattr(backends.get("numba"), "takes_runs", {})
    driver = Driver()

    def threads(pref):
        entry = driver.prepare(_split_model(), int(pref), int(Priority.MEDIUM), None)
        sessions = [s.ctx.executable.session for s in entry.compiled.static_plan.program if s.backend == BACKEND.name]
        return {s.get_session_options().intra_op_num_threads for s in sessions}
    assert threads(ExecutionPreference.FAST_SINGLE_ANSWER) == {2}
    assert threads(ExecutionPreference.SUSTAINED_SPEED) == {2}
    assert threads(ExecutionPreference.LOW_POWER) == {1}
    with backends.thread_limit(1):
        assert ort_backend.session_options().intra_op_num_threads == 1
    assert ort_backend.session_options().intra_op_num_threads == 2


def test_cached_weights_are_external_initializers_read_in_place():
    """The artifact keeps the optimised graph small and its weights apart: loaded from read-only
    arrays (the cache entry's mapping), outputs are bit-identical; an initializer of another shape
    is a failed load (a cache miss), never a crash."""
    import dataclasses

    from delegate.mapping import convert_partition
    from delegate.tfl import read_model
    from hal.serialize import SerializationError, dump_compiled, load_compiled
    from nnhal.examples import mobilenet_like
    model = convert_partition(read_model(mobilenet_like(np.float32, input_size=32, width=8))).model
    compiled = compile_model(model, backend_order=ORDER)
    (artifact,) = [s.ctx.artifact for s in compiled.static_plan.program if s.backend == "onnxruntime"]
    assert artifact.initializer_names and artifact.model.nbytes < sum(a.nbytes for a in artifact.initializers)
    payload, arrays = dump_compiled(compiled)
    read_only = []
    for a in arrays:
        a = a.copy()
        a.flags.writeable = False
        read_only.append(a)
    loaded = load_compiled(payload, read_only, backend_order=ORDER)
    x = np.random.default_rng(1).uniform(-1, 1, (1, 32, 32, 3)).astype(np.float32)
    np.testing.assert_array_equal(execute(loaded, [x])[0], execute(compiled, [x])[0])
    weights = next(i for i, a in enumerate(arrays) if a.dtype == np.float32 and a.ndim >= 2)
    wrong = list(arrays)
    wrong[weights] = np.ascontiguousarray(arrays[weights].reshape(-1)[:-1])
    with pytest.raises(SerializationError, match="could not load"):
        load_compiled(payload, wrong, backend_order=ORDER)
    with pytest.raises(ValueError, match="not an onnxruntime partition artifact"):
        ort_backend.load_partition(None, dataclasses.replace(artifact, initializers=artifact.initializers[1:]))
