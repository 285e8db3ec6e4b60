"""The cuda backend against the reference backend: every CTS case of the operations it takes runs
in a cuda partition (nothing falls back) and meets CTS's float criteria, float32 and (relaxed
models) float16; whole models within 1e-4 of the output's scale; the compilation cache keeps the
lowered graph and loads it without lowering; the backend's identity names torch and the device.

Without a GPU (CI) the backend runs on torch's CPU device (``CudaBackend("cpu", float16=True)``:
the same programs, eagerly); on a machine with one, the backend the registry made on the GPU is
the one tested, and the CUDA-only tests (graph capture, bound page-locked copies, TF32 off) run.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install nnhal[cuda])")

from hal import backends  # noqa: E402
from hal.backends.cuda import device as cuda_device  # noqa: E402
from hal.backends.cuda.backend import NOT_TAKEN, CudaArtifact, CudaBackend  # noqa: E402
from hal.compiler import compile_model  # noqa: E402
from hal.executor import execute  # noqa: E402
from hal.types import OperationType  # noqa: E402
from nnhal.cts.corpus import load_cases  # noqa: E402
from tests.backends.differential import (  # noqa: E402
    assert_matches_reference,
    check_cached_load,
    compare,
    graph_backend_cts_runs,
)
from tests.backends.test_ort import _no_cts_models, _split_model, _x  # noqa: E402

ORDER = ["cuda", "reference"]
GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="no CUDA device: graph capture, page-locked copies and TF32 "
                                               "are checked on a GPU machine (make bench-gpu)")


@pytest.fixture(scope="module")
def backend():
    """The registry's cuda backend where it made one (a GPU), else one on torch's CPU device that
    computes relaxed models in float16, registered for this module."""
    backends.ensure_loaded()
    made = backends.get("cuda")
    if made is not None:
        yield made
        return
    b = backends.register_backend(CudaBackend("cpu", float16=True))
    try:
        yield b
    finally:
        backends.unregister_backend("cuda")


def _taken() -> list[str]:
    from hal.backends.ort import BACKEND as ORT
    return sorted(OperationType(t).name for t in ORT.lowerings if t not in NOT_TAKEN)


@functools.cache
def _cases(operation: str) -> tuple:
    return tuple(c for c in load_cases(operations=[operation]) if not c.expect_failure)


@pytest.mark.parametrize("operation", _taken())
def test_cts_cases_run_in_cuda_partitions_and_match_the_reference(backend, operation):
    """Per operation: each CTS case (float32, and relaxed ones in float16) planned cuda-first runs
    in a cuda partition, never falls back, and meets CTS's criteria against the reference."""
    if not _cases(operation):
        pytest.skip(f"the CTS has no {operation} case: test_operations_without_cts_vectors")
    ran = graph_backend_cts_runs(backend, operation, _cases(operation), ORDER)
    relaxed = [compiled for model, compiled in ran if model.relax_computation_float32_to_float16]
    # a relaxed model's partitions compute in float16 where the backend does (a GPU; the stand-in here)
    assert all(s.ctx.artifact.half == backend.float16
               for compiled in relaxed for s in compiled.static_plan.program if s.backend == backend.name)
    assert ran, f"no CTS case of {operation} ran in a cuda partition"


@pytest.mark.parametrize("label,model,x", list(_no_cts_models()), ids=lambda v: v if isinstance(v, str) else "")
def test_operations_without_cts_vectors(backend, label, model, x):
    assert assert_matches_reference(model, [x], backend.name).assigned == [0], label


def test_relaxed_models_compute_in_float16(backend):
    """A relaxed model's partition is a float16 program (the artifact says so) and meets the
    relaxed criteria; the same model unrelaxed is float32."""
    import dataclasses
    model = _split_model()
    relaxed = dataclasses.replace(model, relax_computation_float32_to_float16=True)
    for m, want_half in ((model, False), (relaxed, backend.float16)):
        compiled = compile_model(m, backend_order=ORDER)
        parts = [s for s in compiled.static_plan.program if s.backend == backend.name]
        assert parts and all(s.ctx.artifact.half == want_half for s in parts)
        got = execute(compiled, [_x()])
        want = execute(compile_model(m, backend_order=["reference"]), [_x()])
        for g, w in zip(got, want, strict=True):
            assert compare(g, w, relaxed=want_half) is None


def test_float_work_goes_to_cuda_and_8_bit_work_to_the_cpu_backends(backend):
    """With cuda first (as on a GPU), a model's float runs become cuda partitions and its 8-bit
    operations (QUANTIZE, DEQUANTIZE here) go to the next backends; the answers stay right."""
    model = _split_model()
    order = [n for n in ("cuda", "numba", "onnxruntime", "reference") if backends.get(n) is not None]
    plan = compile_model(model, backend_order=order).static_plan
    on_cuda = [s.operations for s in plan.program if s.backend == "cuda"]
    assert on_cuda == [(0, 1), (4,)]
    eight_bit = [s.backend for s in plan.program if s.operations in ((2,), (3,))]
    assert len(eight_bit) == 2 and "cuda" not in eight_bit
    want = execute(compile_model(model, backend_order=["reference"]), [_x()])
    for g, w in zip(execute(compile_model(model, backend_order=order), [_x()]), want, strict=True):
        assert compare(g, w) is None


@pytest.mark.partition_fallback
def test_a_partition_that_fails_to_compile_goes_to_the_next_graph_backend(backend, monkeypatch):
    """cuda's failure hands its run to onnxruntime's partitions (not operation by operation: an
    operation planned as a graph backend's member runs only inside a partition)."""
    def broken(partition):
        raise RuntimeError("lowering bug")
    monkeypatch.setattr(backend, "compile", broken)
    model = _split_model()
    order = ["cuda", "onnxruntime", "reference"]
    plan = compile_model(model, backend_order=order).static_plan
    assert [(s.backend, s.operations) for s in plan.program] == [
        ("onnxruntime", (0, 1)), ("reference", (2,)), ("reference", (3,)), ("onnxruntime", (4,))]
    want = execute(compile_model(model, backend_order=["reference"]), [_x()])
    for g, w in zip(execute(compile_model(model, backend_order=order), [_x()]), want, strict=True):
        assert compare(g, w) is None


def _scaled_error(got: list, want: list) -> float:
    return max(float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1e-30)) for g, w in zip(got, want))


def _example(name: str):
    from delegate.mapping import convert_partition
    from delegate.tfl import read_model
    from nnhal import examples
    build = {"mobilenet_like": lambda: examples.mobilenet_like(np.float32, input_size=32, width=8),
             "face_landmark_like": lambda: examples.face_landmark_like(input_size=48),
             "efficientnet_b0": lambda: examples.efficientnet_b0(input_size=32),
             "blazeface_like": lambda: examples.blazeface_like(np.float32, 64),
             "pose_landmark_like": lambda: examples.pose_landmark_like(64)}[name]
    return convert_partition(read_model(build())).model


@pytest.mark.parametrize("name", ["mobilenet_like", "face_landmark_like", "efficientnet_b0", "blazeface_like",
                                  "pose_landmark_like"])
def test_whole_float_models_are_one_partition_within_1e_4_of_the_output_scale(backend, name):
    """EfficientNet's squeeze-excite gate is spread over the feature map by a nearest Resize in
    onnxruntime's lowering (ort/gate.py): the program runs it, so the model is one partition. On a
    GPU the float32 programs run their convolutions fused with the adds and ReLUs after them."""
    model = _example(name)
    compiled = compile_model(model, backend_order=ORDER)
    assert [s.backend for s in compiled.static_plan.program] == [backend.name]
    shape = model.main.operands[model.main.input_indexes[0]].dimensions
    x = np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)
    want = execute(compile_model(model, backend_order=["reference"]), [x])
    assert _scaled_error(execute(compiled, [x]), want) <= 1e-4


def test_the_cache_keeps_the_lowered_graph_and_loads_it_without_lowering(backend, monkeypatch):
    import json

    from hal.backends.cuda import backend as cuda_backend
    from hal.serialize import dump_compiled
    compiled = compile_model(_split_model(), backend_order=ORDER)
    payload, arrays = dump_compiled(compiled)
    assert json.loads(payload)["backends"]["cuda"] == backend.identity()

    def no_lowering(*args):
        raise AssertionError("a cached partition must not be lowered again")
    monkeypatch.setattr(cuda_backend, "lower_partition", no_lowering)
    loaded = check_cached_load(compiled, payload, arrays, ORDER, [_x()])
    assert all(isinstance(s.ctx.artifact, CudaArtifact) for s in loaded.static_plan.program if s.backend == "cuda")


def test_identity_names_torch_and_the_device(backend):
    version = backend.identity().split("@", 1)[1]
    assert f"torch{torch.__version__}" in version
    if backend.on_gpu:
        props = torch.cuda.get_device_properties(backend.device.index or 0)
        assert f"cuda{torch.version.cuda}" in version and f"sm{props.major}{props.minor}" in version
    else:
        assert "-cpu-" in version


def test_a_stand_in_device_is_opt_in(backend, monkeypatch):
    """On torch's CPU device the backend runs only where an order names it; on a GPU it is first."""
    monkeypatch.delenv(backends.ENV_VAR, raising=False)
    order = backends.preference()
    if backend.on_gpu:
        assert order[0] == "cuda"
    else:
        assert "cuda" not in order and backends.parse_preference("cuda")[0] == "cuda"


def test_capabilities_state_the_gpu_for_float_and_the_cpu_backends_for_8_bit(backend):
    """getCapabilities' figures (hal.performance) for an order with cuda first: float32 is the
    GPU's figure on a GPU; a stand-in device states nothing, so the next backend's figure stands."""
    from hal.performance import MEASURED, RELAXED, exec_times, relaxed_exec_time, stated
    from hal.types import OperandType
    order = [n for n in ["cuda", "numba", "onnxruntime", "reference"] if backends.get(n) is not None]
    times = exec_times(order)
    f32, s8 = int(OperandType.TENSOR_FLOAT32), int(OperandType.TENSOR_QUANT8_ASYMM_SIGNED)
    assert times[f32] == MEASURED["cuda" if backend.on_gpu else "onnxruntime"][f32]
    # relaxed float32: the GPU's float16 figure; the CPU backends compute it in float32
    assert relaxed_exec_time(order, times) == (RELAXED["cuda"] if backend.on_gpu else times[f32])
    if backends.get("numba") is not None:
        assert times[s8] == stated("numba")[s8]


@pytest.mark.parametrize("value,want", [("off", None), ("cpu", "cpu"), ("cuda:1", "cuda:1"), (" CUDA ", "cuda")])
def test_the_device_comes_from_the_environment(monkeypatch, value, want):
    monkeypatch.setenv(cuda_device.ENV_VAR, value)
    assert cuda_device.chosen() == want


def test_without_a_gpu_no_device_is_chosen(monkeypatch):
    monkeypatch.delenv(cuda_device.ENV_VAR, raising=False)
    assert cuda_device.chosen() == ("cuda" if cuda_device.gpu_present() else None)


def test_control_flow_is_left_to_the_next_backend(backend):
    assert not NOT_TAKEN & set(backend.lowerings)


# ---- on a GPU only ------------------------------------------------------------------------------
@needs_gpu
def test_float32_is_float32_on_the_gpu(backend):
    _ = compile_model(_split_model(), backend_order=ORDER)
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32


@needs_gpu
def test_the_captured_graph_replays_what_the_program_computes(backend):
    from hal.backends.cuda.runner import GraphRunner
    compiled = compile_model(_split_model(), backend_order=ORDER)
    part = next(s for s in compiled.static_plan.program if s.backend == "cuda")
    runner = part.ctx.executable
    assert isinstance(runner, GraphRunner) and runner._captured  # captured at prepareModel
    x = _x()
    with torch.inference_mode():
        eager = [t.cpu().numpy() for t in runner.program([torch.from_numpy(x).to(backend.device)])]
    for _ in range(3):  # replays: the same answers each time, from new inputs
        for g, w in zip(runner([x]), eager, strict=True):
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)


@needs_gpu
def test_a_bound_run_reads_and_writes_the_callers_arrays(backend):
    compiled = compile_model(_split_model(), backend_order=ORDER)
    part = next(s for s in compiled.static_plan.program if s.backend == "cuda")
    x = _x()
    want = part.ctx.executable([x])
    outs = [np.zeros_like(w) for w in want]
    run = part.ctx.executable.bind([x], outs)
    run()
    for g, w in zip(outs, want, strict=True):
        np.testing.assert_array_equal(g, w)
    x[...] = 0.5  # the binding reads the array's current contents
    run()
    for g, w in zip(outs, part.ctx.executable([x]), strict=True):
        np.testing.assert_array_equal(g, w)


@needs_gpu
def test_convolutions_fuse_with_their_add_and_relu_in_float32_only(backend):
    """BlazeFace's Conv -> Add -> Relu chains run as cuDNN's fused call in float32 (within 1e-4 of
    the reference: the whole-model test), apart in a relaxed (float16) program."""
    for relaxed, fused in ((False, True), (True, False)):
        model = _example("blazeface_like")
        model.relax_computation_float32_to_float16 = relaxed
        compiled = compile_model(model, backend_order=ORDER)
        program = compiled.static_plan.program[0].ctx.executable.program
        assert (program.node_types["ConvAddRelu"] > 0) == fused, program.node_types
        shape = model.main.operands[model.main.input_indexes[0]].dimensions
        x = np.random.default_rng(1).uniform(-1, 1, shape).astype(np.float32)
        want = execute(compile_model(model, backend_order=["reference"]), [x])
        assert _scaled_error(execute(compiled, [x]), want) <= (1e-4 if not relaxed else 2e-2)


@needs_gpu
def test_a_bound_run_copies_straight_between_page_locked_slots_and_the_gpu(backend):
    """Arrays in a mapping pinned through hal.backends.host_memory (what a local burst does with
    its slots) are read and written by the copy engine in place, with the same results as staged
    copies; once released they are not page-locked any more."""
    import mmap

    from hal.backends import host_memory
    compiled = compile_model(_split_model(), backend_order=ORDER)
    part = next(s for s in compiled.static_plan.program if s.backend == "cuda")
    x = _x()
    want = part.ctx.executable([x])
    region = mmap.mmap(-1, 1 << 20)
    pinned = host_memory.pin(region)
    assert pinned
    try:
        slot = np.frombuffer(region, x.dtype, x.size, 0).reshape(x.shape)
        slot[...] = x
        offsets = np.cumsum([4096] + [w.nbytes + 4096 - w.nbytes % 4096 for w in want])
        outs = [np.frombuffer(region, w.dtype, w.size, int(o)).reshape(w.shape) for w, o in zip(want, offsets)]
        run = part.ctx.executable.bind([slot], outs)
        assert run.direct == (1, len(outs))
        run()
        for g, w in zip(outs, want, strict=True):
            np.testing.assert_array_equal(g, w)
        slot[...] = 0.5  # read anew on each run
        run()
        for g, w in zip(outs, part.ctx.executable([slot]), strict=True):
            np.testing.assert_array_equal(g, w)
        staged = part.ctx.executable.bind([slot.copy()], [np.empty_like(w) for w in want])
        assert staged.direct == (0, 0)
    finally:
        pinned.release()
    assert not torch.from_numpy(slot).is_pinned()
