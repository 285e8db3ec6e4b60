"""ModelBuilder's constant storage and the cheap getSupportedOperations path."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import hal
from hal.backends.reference import conv, fully_connected
from hal.compiler import compile_model, decode_constant
from hal.model import ModelBuilder
from hal.types import OperandType as T


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=12), st.integers(0, 2**32 - 1))
def test_constants_land_aligned_and_intact(sizes, seed):
    """Small (copied at once) and large (referenced until finish) constants, interleaved."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    arrays = [rng.integers(-128, 127, max(n, 1), dtype=np.int8).astype(np.float32) for n in sizes]
    idx = [b.add_constant(T.TENSOR_FLOAT32, a) for a in arrays]
    model = b.finish()
    for i, a in zip(idx, arrays):
        operand = model.main.operands[i]
        assert operand.location.offset % 4 == 0
        np.testing.assert_array_equal(decode_constant(model, operand), a)


def test_small_constants_are_copied_at_once():
    """NNAPI's setOperandValue: values up to 128 bytes are copied when set."""
    b = ModelBuilder()
    small = np.arange(32, dtype=np.float32)  # 128 bytes
    i = b.add_constant(T.TENSOR_FLOAT32, small)
    small[:] = -1
    model = b.finish()
    np.testing.assert_array_equal(decode_constant(model, model.main.operands[i]), np.arange(32))


def _conv_model(filter_depth: int = 2):
    b = ModelBuilder()
    x = b.add_operand(T.TENSOR_FLOAT32, (1, 5, 5, 2))
    w = b.add_constant(T.TENSOR_FLOAT32, np.ones((3, 3, 3, filter_depth), np.float32))
    bias = b.add_constant(T.TENSOR_FLOAT32, np.zeros(3, np.float32))
    y = b.add_operand(T.TENSOR_FLOAT32, (1, 5, 5, 3))
    b.add_operation(hal.OperationType.CONV_2D, [x, w, bias, b.add_int32(1), b.add_int32(1), b.add_int32(1),
                                                 b.add_int32(0)], [y])
    b.identify_inputs_and_outputs([x], [y])
    return b.finish()


def test_support_queries_do_not_repack_weights(monkeypatch):
    """getSupportedOperations runs validate + prepare without the (costly) weight packing;
    compilation still packs."""
    model = _conv_model()

    def no_packing(*a, **k):
        raise AssertionError("weights packed for a support query")
    real = conv._pack_filter
    monkeypatch.setattr(conv, "_pack_filter", no_packing)
    monkeypatch.setattr(fully_connected, "_pack_weights", no_packing)
    assert hal.supported_operations(model, backend_order=["reference"]) == [True]
    monkeypatch.setattr(conv, "_pack_filter", real)
    compiled = compile_model(model, backend_order=["reference"])
    assert compiled.static_plan.steps[0].ctx.data.filter is not None
    monkeypatch.setattr(conv, "_pack_filter", no_packing)
    assert hal.supported_operations(_conv_model(filter_depth=4), backend_order=["reference"]) == [False]
