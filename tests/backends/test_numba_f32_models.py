"""Whole float32 CNNs on the numba backend's float kernels, as the default preference order plans
them at one compute thread (hal.compiler's ``_whole_run_instead`` hands onnxruntime's run to
numba when its kernels cover every operation; $NNHAL_NUMBA_FLOAT_RUNS=0 keeps it on
onnxruntime): every step on numba, the residual blocks fused (``conv_epilogue``), and the outputs
within 1e-4 of their scale of TFLite's reference kernels, also bound to fixed arrays (the
service's path, natively chained) and after the compilation cache."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hal.backends.numba_kernels")
pytest.importorskip("hal.backends.ort")

from delegate.mapping import convert_partition  # noqa: E402
from delegate.tfl import read_model  # noqa: E402
from hal import backends  # noqa: E402
from hal.compiler import compile_model  # noqa: E402
from hal.executor import bind as hal_bind  # noqa: E402
from hal.executor import execute  # noqa: E402
from hal.fusion import CONV_EPILOGUE, FusedContext  # noqa: E402
from hal.serialize import dump_compiled, load_compiled  # noqa: E402
from hal.types import OperationType  # noqa: E402
from nnhal.examples import (  # noqa: E402
    blazeface_like,
    efficientnet_b0,
    face_landmark_like,
    iris_landmark_like,
    mobilenet_v2,
    pose_landmark_like,
)
from nnhal.examples_mobilenet_v3 import mobilenet_v3_small  # noqa: E402
from tests.harness import tflite_run  # noqa: E402

ORDER = ["onnxruntime", "numba", "reference"]
MODELS = {
    "iris": lambda: iris_landmark_like(),
    "face": lambda: face_landmark_like(input_size=96),
    "blazeface": lambda: blazeface_like(np.float32, input_size=64),
    "mobilenet_v2": lambda: mobilenet_v2(np.float32, input_size=64, classes=50),
    # LOGISTIC, MEAN (f32_activations.py, f32_reduce_resize.py)
    "efficientnet_b0": lambda: efficientnet_b0(np.float32, input_size=64, classes=50),
    # HARD_SWISH, MEAN
    "mobilenet_v3_small": lambda: mobilenet_v3_small(np.float32, input_size=64, classes=50),
    # RESIZE_BILINEAR (half-pixel centers)
    "pose": lambda: pose_landmark_like(input_size=128),
}


@pytest.fixture
def float_runs(monkeypatch):
    """numba takes onnxruntime's float32 runs (the default; a test process may run with it off)."""
    from hal.types import OperandType
    monkeypatch.setattr(backends.get("numba"), "takes_runs", {"onnxruntime": frozenset({OperandType.TENSOR_FLOAT32})})
    monkeypatch.setattr(backends.policy, "_compute_threads", 1)  # what another test set must not decide


@pytest.fixture
def every_float_run(float_runs, monkeypatch):
    """numba takes runs with a LOGISTIC too (by default onnxruntime keeps those)."""
    monkeypatch.setattr(backends.get("numba"), "leaves_runs_with", frozenset())


_PLANNED_BACKENDS = """
from delegate.mapping import convert_partition
from delegate.tfl import read_model
from hal.compiler import compile_model
from nnhal.examples import iris_landmark_like
model = convert_partition(read_model(iris_landmark_like())).model
compiled = compile_model(model, backend_order=["onnxruntime", "numba", "reference"])
print(sorted({s.backend for s in compiled.static_plan.program}))
"""


@pytest.mark.parametrize("setting,planned", [(None, "['numba']"), ("0", "['onnxruntime']"), ("1", "['numba']")])
def test_the_variable_decides_at_import_whether_numba_takes_the_runs(setting, planned):
    """A fresh process, as the service starts: numba's runs by default, onnxruntime's with 0."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "NNHAL_NUMBA_FLOAT_RUNS"}
    if setting is not None:
        env["NNHAL_NUMBA_FLOAT_RUNS"] = setting
    r = subprocess.run([sys.executable, "-c", _PLANNED_BACKENDS], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == planned


@pytest.mark.parametrize("name,planned", [("efficientnet_b0", "onnxruntime"), ("mobilenet_v3_small", "numba"),
                                          ("pose", "numba")])
def test_runs_with_a_logistic_stay_onnxruntime_s(name, planned, float_runs):
    """numba's kernels cover all three; onnxruntime keeps EfficientNet, whose swish and gates it
    computes faster (numba_kernels' ``leaves_runs_with``)."""
    model = convert_partition(read_model(MODELS[name]())).model
    assert {s.backend for s in compile_model(model, backend_order=ORDER).static_plan.program} == {planned}


def test_at_two_compute_threads_onnxruntime_keeps_its_runs(float_runs, monkeypatch):
    monkeypatch.setattr(backends.policy, "_compute_threads", 2)
    compiled = compile_model(convert_partition(read_model(MODELS["iris"]())).model, backend_order=ORDER)
    assert {s.backend for s in compiled.static_plan.program} == {"onnxruntime"}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_float_cnn_runs_wholly_on_numba_within_1e_4_of_tflite(name, every_float_run):
    data = MODELS[name]()
    graph = read_model(data)
    part = convert_partition(graph)
    compiled = compile_model(part.model, backend_order=ORDER)
    program = compiled.static_plan.program
    assert {s.backend for s in program} == {"numba"}, [(s.backend, s.ctx.name) for s in program]
    fused = [s for s in program if isinstance(s.ctx, FusedContext) and s.ctx.pattern == CONV_EPILOGUE]
    if name in ("iris", "face", "blazeface"):
        assert fused, "the residual blocks' ADD and PRELU are the convolutions' epilogues"
    if name in ("efficientnet_b0", "mobilenet_v3_small"):  # activations and PADs are the convolutions'
        left = {OperationType(s.ctx.op_type).name for s in program if s.spec is not None}
        assert not left & {"HARD_SWISH", "PAD"}, left
        assert sum(len(s.operations) > 1 for s in fused) > 10
    rng = np.random.default_rng(1)
    by_tensor = {t: rng.uniform(-1, 1, graph.tensors[t].shape).astype(np.float32) for t in graph.inputs}
    args = [by_tensor[t] for t in part.input_tensors]
    want = dict(zip(graph.outputs, tflite_run(data, [by_tensor[t] for t in graph.inputs])))
    got = dict(zip(part.output_tensors, execute(compiled, args)))
    plan = compiled.static_plan
    outs = [np.empty(plan.infos[i].shape, plan.infos[i].dtype) for i in compiled.output_indexes]
    hal_bind(compiled, [a.copy() for a in args], outs)(None, None, None)
    loaded = load_compiled(*dump_compiled(compiled), backend_order=ORDER)
    assert [getattr(s.ctx, "pattern", None) for s in loaded.static_plan.program] == \
        [getattr(s.ctx, "pattern", None) for s in program]
    cached = dict(zip(part.output_tensors, execute(loaded, args)))
    for k, t in enumerate(part.output_tensors):
        w = want[t].reshape(got[t].shape)
        scale = max(float(np.abs(w).max()), 1e-6)
        assert np.abs(got[t] - w).max() <= 1e-4 * scale, (name, t)
        assert np.array_equal(outs[k], got[t]) and np.array_equal(cached[t], got[t])
