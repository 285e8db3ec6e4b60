"""Models with extension operations in the compilation cache: stored, reloaded, and invalidated
when the extension they were compiled with is gone or changed."""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from delegate.mapping import convert_partition
from delegate.tfl import read_model
from hal import extension_registry
from hal.compiler import compile_model
from hal.executor import execute
from hal.serialize import SerializationError, dump_compiled, load_compiled
from service.client import Client, ServiceError
from service.token import model_token
from tests.extensions.test_delegated_custom_ops import SAME, pool_reference, segnet_model, unpool_reference
from tests.extensions.test_registry import fib_model

FIB = "com.example.fibonacci"


@pytest.mark.parametrize("int64", [False, True])
def test_fibonacci_model_round_trips(int64):
    """An extension operation, and (int64) an extension operand type in and out."""
    model = fib_model(prefix=77, int64=int64)
    loaded = load_compiled(*dump_compiled(compile_model(model)))
    n = np.array([0, 1, 2, 10, 40], np.int64 if int64 else np.float32)
    np.testing.assert_array_equal(execute(loaded, [n])[0], execute(compile_model(model), [n])[0])
    assert loaded.static_plan.infos[0].extension_dtype == (np.dtype(np.int64) if int64 else None)


def test_argmax_pooling_model_round_trips():
    """Extension op data from the extension's own module (struct options) goes through the allow-list."""
    part = convert_partition(read_model(segnet_model((1, 8, 6, 3), padding=SAME, activation=1)))
    loaded = load_compiled(*dump_compiled(compile_model(part.model)))
    x = np.random.default_rng(0).standard_normal((1, 8, 6, 3)).astype(np.float32)
    unpooled, idx = execute(loaded, [x])
    want_v, want_i = pool_reference(x, 2, 2, 2, 2, SAME, 1)
    np.testing.assert_array_equal(idx, want_i)
    np.testing.assert_array_equal(unpooled, unpool_reference(want_v + want_v, want_i, 2, 2, 2, 2))


def test_requantizing_mean_round_trips_with_the_kernel_it_runs():
    """com.nnhal.tflite:QUANTIZED_MEAN's plan data is hal's reference MeanData: admitted because the
    extension registers that module's execute as its own, which also puts the kernel's file in the
    extension's identity (an edit to it invalidates what was cached)."""
    from extensions import tflite_compat
    from tests.ops.test_mean import _model
    tflite_compat.ensure_registered()
    model = _model(np.int8, [1, 7, 7, 6], [1, 2], True, {"scale": 0.05, "zero_point": 2},
                   {"scale": 0.02, "zero_point": -5})
    part = convert_partition(read_model(model))
    compiled = compile_model(part.model)
    loaded = load_compiled(*dump_compiled(compiled))
    x = np.random.default_rng(3).integers(-128, 128, (1, 7, 7, 6), dtype=np.int8)
    np.testing.assert_array_equal(execute(loaded, [x])[0], execute(compiled, [x])[0])
    modules = extension_registry.extension_modules(extension_registry.extension(tflite_compat.NAME))
    assert "hal.backends.reference.reduce" in modules


def test_missing_or_changed_extension_fails_the_load():
    payload, arrays = dump_compiled(compile_model(fib_model()))
    ext = extension_registry.extension(FIB)
    try:
        extension_registry.unregister_extension(FIB)
        with pytest.raises(SerializationError, match="not loaded or changed"):
            load_compiled(payload, arrays)
        # Same name, one more operand type: another identity.
        extra = extension_registry.ExtensionOperandType(9, np.dtype(np.int16))
        extension_registry.register_extension(dataclasses.replace(ext, operand_types={**ext.operand_types, 9: extra}))
        with pytest.raises(SerializationError, match="not loaded or changed"):
            load_compiled(payload, arrays)
    finally:
        extension_registry.register_extension(ext)
    assert execute(load_compiled(payload, arrays), [np.array([3, 4, 5, 6, 7], np.float32)])[0].tolist() == \
        [2, 3, 5, 8, 13]


def test_payload_may_not_reference_modules_of_unused_extensions():
    """The allow-list is per model: a fibonacci payload naming the pooling extension's module is refused."""
    payload, arrays = dump_compiled(compile_model(fib_model()))
    def module_of(name: str) -> str:
        return next(iter(extension_registry.extension_modules(extension_registry.extension(name))))

    pool_module, fib_module = module_of("com.nnhal.maxpool_argmax"), module_of(FIB)
    forged = payload.replace(f'"{fib_module}:'.encode(), f'"{pool_module}:'.encode())
    if forged == payload:  # fibonacci's op data holds no reference: plant one
        forged = payload.replace(b'"data":"float32"', f'"data":{{"t":"fn","ref":"{pool_module}:execute"}}'.encode())
    assert forged != payload
    with pytest.raises(SerializationError, match="refused reference"):
        load_compiled(forged, arrays)


def test_extension_model_from_the_service_cache(ext_server):
    model = fib_model(prefix=12, int64=True, n=4)
    token = model_token(model)
    n = np.array([5, 50, 90, 92], np.int64)
    with Client.connect(ext_server.address) as c:
        with pytest.raises(ServiceError, match="no cache entry"):
            c.prepare_model_from_cache(model, token)
        first = c.prepare_model(model, token=token).execute([n]).outputs[0]
        assert os.path.exists(os.path.join(ext_server.cache_dir, token.hex() + ".data"))
        cached = c.prepare_model_from_cache(model, token).execute([n]).outputs[0]
    np.testing.assert_array_equal(cached, first)
    np.testing.assert_array_equal(cached, [5, 12586269025, 2880067194370816120, 7540113804746346429])
