"""Cache identity per backend: an entry names the backends it used; editing one backend's code
invalidates only the entries compiled with it, and the driver's own version ignores backends."""
from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

from cache.store import CacheStore
from hal import backends
from hal.backends import Backend
from hal.errors import HalError
from hal.model import ModelBuilder
from hal.types import ErrorStatus, OperandType, OperationType
from service.driver import Driver, capabilities_fingerprint, core_source_files
from tests.service.models import add_model

BACKEND_SOURCE = '''
"""A one-kernel test backend: float32 ADD without activation."""
from dataclasses import dataclass

import numpy as np


@dataclass
class AddData:
    activation: int


def plan(ctx):
    act = ctx.scalar(2)
    if act != 0:
        raise ctx.fail("this test backend has no fused activations")
    return AddData(act)


def execute(ctx, inputs):
    return [np.add(inputs[0], inputs[1])]
'''


def _softmax_model():
    b = ModelBuilder()
    x = b.add_operand(OperandType.TENSOR_FLOAT32, (2, 3))
    y = b.add_operand(OperandType.TENSOR_FLOAT32, (2, 3))
    b.add_operation(OperationType.SOFTMAX, [x, b.add_float32(1.0)], [y])
    b.identify_inputs_and_outputs([x], [y])
    return b.finish()


def _load_backend(module_name: str) -> Backend:
    """(Re)build the backend from its module file, as a fresh service process would."""
    sys.modules.pop(module_name, None)
    mod = importlib.import_module(module_name)
    b = Backend("tmpadd", "1", modules=(module_name,), priority=1)
    b.register(OperationType.ADD, plan=mod.plan, execute=mod.execute, types=(OperandType.TENSOR_FLOAT32,))
    return backends.register_backend(b)


@pytest.fixture
def backend_module(tmp_path, monkeypatch):
    name = f"nnhal_test_backend_{tmp_path.name.replace('-', '_')}"
    path = tmp_path / f"{name}.py"
    path.write_text(BACKEND_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    _load_backend(name)
    yield name, path
    backends.unregister_backend("tmpadd")
    sys.modules.pop(name, None)


def _driver(cache_dir, order):
    store = CacheStore(str(cache_dir), driver_version=Driver.version_string(),
                       capabilities_fingerprint=capabilities_fingerprint())
    return Driver(store, order)


def test_an_edit_in_one_backend_invalidates_only_its_entries(tmp_path, backend_module):
    name, path = backend_module
    version = Driver.version_string()
    d = _driver(tmp_path / "cache", "tmpadd,reference")
    add_token, softmax_token = b"\x01" * 32, b"\x02" * 32
    entry = d.prepare(add_model(), 1, 1, None, add_token)
    assert [s.backend for s in entry.compiled.static_plan.steps] == ["tmpadd"]
    d.prepare(_softmax_model(), 1, 1, None, softmax_token)
    a, b = np.ones((2, 3), np.float32), np.full((2, 3), 2, np.float32)
    loaded = d.prepare_from_cache(add_token, 1, 1, None)
    assert loaded.compiled.static_plan.steps[0].backend == "tmpadd"
    from hal.executor import execute
    np.testing.assert_array_equal(execute(loaded.compiled, [a, b])[0], a + b)

    path.write_text(BACKEND_SOURCE + "\n# edited\n")
    _load_backend(name)  # what a restarted service would run
    assert Driver.version_string() == version  # the driver itself did not change
    with pytest.raises(HalError) as e:
        d.prepare_from_cache(add_token, 1, 1, None)
    assert e.value.status == ErrorStatus.GENERAL_FAILURE and "backend 'tmpadd' changed" in e.value.message
    assert d.prepare_from_cache(softmax_token, 1, 1, None).compiled.static_plan.steps[0].backend == "reference"
    with pytest.raises(HalError, match="no cache entry"):  # the stale entry was removed
        d.prepare_from_cache(add_token, 1, 1, None)


def test_an_entry_needs_its_backend_enabled(tmp_path, backend_module):
    token = b"\x03" * 32
    _driver(tmp_path / "cache", "tmpadd").prepare(add_model(), 1, 1, None, token)
    reference_only = _driver(tmp_path / "cache", "reference")
    with pytest.raises(HalError, match="backend 'tmpadd' is not enabled here"):
        reference_only.prepare_from_cache(token, 1, 1, None)


def test_a_declining_backend_hands_over_to_the_next(tmp_path, backend_module):
    """tmpadd's plan refuses fused activations: such an ADD runs on the reference backend."""
    b = ModelBuilder()
    x = b.add_operand(OperandType.TENSOR_FLOAT32, (2,))
    y = b.add_operand(OperandType.TENSOR_FLOAT32, (2,))
    z = b.add_operand(OperandType.TENSOR_FLOAT32, (2,))
    w = b.add_operand(OperandType.TENSOR_FLOAT32, (2,))
    b.add_operation(OperationType.ADD, [x, y, b.add_int32(1)], [z])  # RELU: declined
    b.add_operation(OperationType.ADD, [z, y, b.add_int32(0)], [w])
    b.identify_inputs_and_outputs([x, y], [w])
    d = _driver(tmp_path / "cache", "tmpadd")
    steps = d.prepare(b.finish(), 1, 1, None).compiled.static_plan.steps
    assert [s.backend for s in steps] == ["reference", "tmpadd"]


def test_driver_version_covers_the_specs_not_the_backends():
    names = {p.relative_to(p.parents[1]).as_posix() if p.parent.name != "hal" else p.name
             for p in core_source_files()}
    files = {p.as_posix() for p in core_source_files()}
    assert any(f.endswith("hal/operations/pooling.py") for f in files)  # specs are the driver's
    assert any(f.endswith("hal/backends/__init__.py") for f in files)  # the framework too
    assert any(f.endswith("hal/backends/policy.py") for f in files)
    assert not any("/hal/backends/reference/" in f for f in files), names  # kernels are not


def test_an_entry_compiled_under_another_preference_is_compiled_again(tmp_path, backend_module):
    """An entry made when only the reference backend was preferred would keep every operation there;
    once tmpadd is preferred, the same token compiles again and ADD moves to tmpadd."""
    token = b"\x04" * 32
    _driver(tmp_path / "cache", "reference").prepare(add_model(), 1, 1, None, token)
    preferring = _driver(tmp_path / "cache", "tmpadd,reference")
    with pytest.raises(HalError, match="compiled for backend preference reference, this service prefers "
                                       "tmpadd,reference"):
        preferring.prepare_from_cache(token, 1, 1, None)
    entry = preferring.prepare(add_model(), 1, 1, None, token)
    assert entry.compiled.static_plan.steps[0].backend == "tmpadd"
    assert preferring.prepare_from_cache(token, 1, 1, None).compiled.static_plan.steps[0].backend == "tmpadd"
