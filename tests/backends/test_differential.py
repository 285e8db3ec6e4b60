"""The differential harness catches what it must and accepts what CTS accepts; every available
fast backend is held to it on whole models."""
from __future__ import annotations

import numpy as np
import pytest

from delegate.mapping import convert_partition
from delegate.mapping.host_runtime import TFLITE_RUNTIME_2_14
from delegate.tfl import read_model
from hal import backends
from nnhal.examples import mobilenet_like
from tests.backends import fake_backends
from tests.backends.differential import assert_matches_reference, compare
from tests.harness import random_tensor
from tests.service.models import add_model


@pytest.fixture
def registered():
    """Register test backends for one test, and remove them after."""
    names = []

    def add(backend):
        backends.register_backend(backend)
        names.append(backend.name)
        return backend
    yield add
    for n in names:
        backends.unregister_backend(n)


def _mobilenet(dtype):
    """NNAPI operations only, whatever TFLite runtime is installed (LiteRT's quantized FULLY_CONNECTED
    maps to an extension operation, which only its extension's backend runs)."""
    return convert_partition(read_model(mobilenet_like(dtype, input_size=16, width=8)),
                             runtime=TFLITE_RUNTIME_2_14).model


def _input(dtype):
    return [random_tensor(np.random.default_rng(3), (1, 16, 16, 3), dtype)]


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int8])
def test_twin_of_the_reference_passes_and_runs_every_operation(registered, dtype):
    registered(fake_backends.twin())
    model = _mobilenet(dtype)
    result = assert_matches_reference(model, _input(dtype), "twin")
    assert result.assigned == list(range(result.operations))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_a_quantized_step_off_is_caught(registered, dtype):
    registered(fake_backends.one_step_off())
    with pytest.raises(AssertionError, match="bit-exact required"):
        assert_matches_reference(_mobilenet(dtype), _input(dtype), "mutant_step")


def test_float_error_outside_cts_tolerance_is_caught_inside_accepted(registered):
    registered(fake_backends.float_error("mutant_far", 1e-4))
    registered(fake_backends.float_error("mutant_near", 2.0 ** -23))
    model, x = _mobilenet(np.float32), _input(np.float32)
    with pytest.raises(AssertionError, match="outside CTS tolerance"):
        assert_matches_reference(model, x, "mutant_far")
    assert_matches_reference(model, x, "mutant_near")  # 1 ulp: within 5 ulp + 1e-5


def test_a_backend_that_runs_nothing_is_reported(registered):
    registered(fake_backends.twin("twin_softmax_only", ops=[25]))  # SOFTMAX: not in an ADD model
    with pytest.raises(AssertionError, match="ran none"):
        assert_matches_reference(add_model(), [np.ones((2, 3), np.float32)] * 2, "twin_softmax_only")


def test_compare_rules():
    f = np.array([1.0, 100.0, np.nan], np.float32)
    assert compare(f, f.copy()) is None  # NaN meets NaN
    assert compare(np.array([1.0, 100.0, 1.0], np.float32), f) is not None  # a number for a NaN
    assert compare(f + np.float32(2e-5), f) is not None  # beyond 1e-5 + 5 ulp at 1.0
    assert compare(np.array([1.0, 100.00005, np.nan], np.float32), f) is None  # within 5 ulp at 100
    assert compare(np.array([1, 2], np.int8), np.array([1, 3], np.int8)) is not None
    h = np.array([1.0], np.float16)
    assert compare(h + np.float16(0.004), h) is None and compare(h + np.float16(0.02), h) is not None
    assert compare(np.zeros(2, np.float32), np.zeros(3, np.float32)) is not None


FAST = [b.name for b in backends.available() if b.name != backends.REFERENCE]


@pytest.mark.skipif(not FAST, reason="no backend besides the reference one is available")
@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int8])
def test_every_available_backend_matches_the_reference_on_whole_models(backend, dtype):
    assert_matches_reference(_mobilenet(dtype), _input(dtype), backend, require_assigned=False)


def test_op_tests_check_the_named_backend(registered, monkeypatch):
    """$NNHAL_DIFF_BACKEND hooks every op-test model (tests.harness.hal_run) into the harness."""
    from delegate.tfl import TfLiteModelBuilder
    from tests.harness import hal_run
    b = TfLiteModelBuilder()
    x = b.add_input("x", [7], np.int8, scale=0.5, zero_point=0)
    y = b.add_tensor("y", [7], np.int8, scale=0.5, zero_point=0)
    b.add_operator("ADD", [x, x], [y], ("AddOptions", {"fused_activation_function": 0}))
    b.set_outputs([y])
    model, inputs = b.build(), [np.arange(7, dtype=np.int8)]
    registered(fake_backends.one_step_off())
    registered(fake_backends.twin())
    monkeypatch.setenv("NNHAL_DIFF_BACKEND", "twin")
    hal_run(model, inputs)
    monkeypatch.setenv("NNHAL_DIFF_BACKEND", "mutant_step")
    with pytest.raises(AssertionError, match="backend 'mutant_step' vs reference"):
        hal_run(model, inputs)
