"""MobileNetV3-small (nnhal.examples_mobilenet_v3, at 32x32 and 10 classes to stay quick) against
TFLite's reference kernels (BUILTIN_REF): 8-bit through the numba backend bit-exact, float32
through one onnxruntime partition within 1e-4 of the output scale; and the whole model delegated
to a service (quantized bit-exact, float within 1e-4 of the output scale)."""
from __future__ import annotations

import numpy as np
import pytest

from delegate import load_delegate
from delegate.mapping import convert_partition
from delegate.tfl import read_model
from hal.compiler import compile_model
from hal.executor import execute
from hal.types import OperationType
from nnhal.examples_mobilenet_v3 import mobilenet_v3_small
from tests.delegate.helpers import interpreter, random_inputs, run
from tests.harness import random_tensor, tflite_run

SIZE, CLASSES = 32, 10
#: The operations of the converter's MobileNetV3 that a plain MobileNetV2 lacks.
V3_OPS = {"HARD_SWISH", "MUL", "MEAN", "PAD"}


def _compiled(dtype, order):
    model = convert_partition(read_model(mobilenet_v3_small(dtype, SIZE, CLASSES))).model
    return model, compile_model(model, backend_order=order)


def _within_output_scale(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.abs(got.astype(np.float64) - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_quantized_through_numba_is_bit_exact_with_tflite_reference_kernels(dtype):
    data = mobilenet_v3_small(dtype, SIZE, CLASSES)
    model, compiled = _compiled(dtype, ["numba", "reference"])
    by_numba = {OperationType(model.main.operations[s.index].type).name
                for s in compiled.static_plan.steps if s.backend == "numba"}
    assert V3_OPS <= by_numba, V3_OPS - by_numba
    assert sum(s.backend == "numba" for s in compiled.static_plan.steps) >= len(model.main.operations) - 1
    for seed in range(2):
        x = random_tensor(np.random.default_rng(seed), (1, SIZE, SIZE, 3), dtype)
        want = tflite_run(data, [x])[0]
        got = execute(compiled, [x])[0]
        np.testing.assert_array_equal(got, want)
        assert len(np.unique(want)) > 2, "degenerate (saturated) model output"


def test_float_through_onnxruntime_is_within_1e_4_of_the_output_scale():
    data = mobilenet_v3_small(np.float32, SIZE, CLASSES)
    _, compiled = _compiled(np.float32, ["onnxruntime", "reference"])
    assert [s.backend for s in compiled.static_plan.program] == ["onnxruntime"]
    for seed in range(2):
        x = random_tensor(np.random.default_rng(seed), (1, SIZE, SIZE, 3), np.float32)
        _within_output_scale(execute(compiled, [x])[0], tflite_run(data, [x])[0])


def test_the_whole_model_delegated_matches_the_reference_kernels(server):
    for dtype in (np.float32, np.int8, np.uint8):
        data = mobilenet_v3_small(dtype, SIZE, CLASSES)
        d = load_delegate(server.address)
        it, ref = interpreter(data, d), interpreter(data)
        assert d.report.delegated == len(d.report.nodes) and len(d.report.partitions) == 1
        rng = np.random.default_rng(3)
        for _ in range(2):
            xs = random_inputs(ref, rng)
            (got,), (want,) = run(it, xs), run(ref, xs)
            if dtype == np.float32:
                _within_output_scale(got, want)
            else:
                np.testing.assert_array_equal(got, want)


def test_other_types_are_refused():
    with pytest.raises(ValueError, match="float32, int8 or uint8"):
        mobilenet_v3_small(np.int16)
