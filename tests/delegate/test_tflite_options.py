"""TFLite NNAPI delegate option names (delegate.options.ALIASES and friends), each through the real
TFLite interpreter against a real service."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from delegate import load_delegate
from delegate.options import ALIASES, NnhalOptions
from hal.types import ExecutionPreference
from service import DEVICE_NAME
from tests.delegate.helpers import assert_outputs_equal, interpreter, random_inputs, run
from tests.delegate.models import add_runs, head_model


def _options(**kw) -> NnhalOptions:
    return load_delegate(**kw).impl.options


def test_aliases_land_on_our_options():
    assert _options(model_token=b"app-v3").cache_token == b"app-v3"
    assert _options(model_token="app-v3").cache_token == b"app-v3"
    assert _options(max_number_delegated_partitions=2).max_delegated_partitions == 2
    assert _options(disallow_nnapi_cpu=True).allow_in_process_fallback is False
    assert _options(disallow_nnapi_cpu=False).allow_in_process_fallback is True
    assert _options().allow_in_process_fallback is True
    assert _options(allow_fp16=True).allow_fp16 is True
    assert _options(accelerator_name=DEVICE_NAME).accelerator_name == "nnhal"
    for name in ("low_power", "fast_single_answer", "sustained_speed"):
        assert _options(execution_preference=name).execution_preference == ExecutionPreference[name.upper()]


@pytest.mark.parametrize("value", [0, -1, -7])
def test_max_number_delegated_partitions_at_most_zero_is_unlimited(server, value):
    model = add_runs(4)  # partitions of 2, 3, 4, 5 ADDs; largest-first keeps 3 by default
    d = load_delegate(server.address, max_number_delegated_partitions=value, partitioning="largest")
    it, ref = interpreter(model, d), interpreter(model)
    xs = random_inputs(ref, np.random.default_rng(1))
    assert_outputs_equal(run(it, xs), run(ref, xs))
    assert [len(p) for p in d.report.partitions] == [5, 4, 3, 2]


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_an_alias_and_its_canonical_name_together_are_refused(alias):
    with pytest.raises(ValueError, match=f"give {alias} or {ALIASES[alias]}, not both"):
        load_delegate(**{alias: 1, ALIASES[alias]: 1})


def test_unknown_accelerator_is_refused_naming_the_available_one():
    with pytest.raises(ValueError, match="unknown accelerator_name 'qti-dsp' \\(available: nnhal\\)"):
        load_delegate(accelerator_name="qti-dsp")


def test_accelerator_name_nnhal_delegates(server):
    model = head_model(np.int8)
    d = load_delegate(server.address, accelerator_name="nnhal")
    it, ref = interpreter(model, d), interpreter(model)
    xs = random_inputs(ref, np.random.default_rng(2))
    assert_outputs_equal(run(it, xs), run(ref, xs))
    assert d.report.delegated == len(d.report.nodes)


def _from_cache(server, model: bytes, **options) -> bool:
    d = load_delegate(server.address, **options)
    interpreter(model, d)
    (kernel,) = d.impl.kernels
    return kernel.from_cache


def test_model_token_keys_the_cache(server):
    model = head_model(np.uint8, seed=21)
    assert _from_cache(server, model, model_token=b"app-a") is False
    assert _from_cache(server, model, model_token=b"app-a") is True  # a stable token: cached across loads
    assert _from_cache(server, model, model_token=b"app-b") is False
    assert _from_cache(server, model, cache_token=b"app-b") is True  # the same option under our name


def test_cache_dir_keys_the_cache_by_its_real_path(server, tmp_path):
    model = head_model(np.uint8, seed=22)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    os.symlink(a, tmp_path / "link-to-a")
    assert _from_cache(server, model, cache_dir=str(a)) is False
    assert _from_cache(server, model, cache_dir=str(a)) is True
    assert _from_cache(server, model, cache_dir=str(tmp_path / "link-to-a")) is True  # same directory
    assert _from_cache(server, model, cache_dir=str(b)) is False  # another app's directory: no sharing
    assert _from_cache(server, model) is False  # no cache_dir: not a's entry either
    assert os.listdir(a) == [] and os.listdir(b) == []  # the service's cache holds the artifacts


def test_cache_dir_must_be_a_directory(tmp_path):
    for bad in (tmp_path / "missing", ""):
        with pytest.raises(ValueError, match="is not a directory"):
            load_delegate(cache_dir=str(bad))


@pytest.mark.parametrize("alias", [True, False])
def test_no_in_process_fallback_fails_the_invoke(server, alias):
    model = head_model(np.int8)
    option = {"disallow_nnapi_cpu": True} if alias else {"allow_in_process_fallback": False}
    d = load_delegate(server.address, **option)
    it, ref = interpreter(model, d), interpreter(model)
    rng = np.random.default_rng(3)
    xs = random_inputs(ref, rng)
    assert_outputs_equal(run(it, xs), run(ref, xs))
    server.proc.kill()
    server.proc.wait()
    for _ in range(2):  # the failing invoke, then one while the service is still gone
        with pytest.raises(RuntimeError):
            run(it, random_inputs(ref, rng))
        assert "in-process fallback is off (disallow_nnapi_cpu)" in d.last_error, d.last_error
        assert "Traceback" not in d.last_error
    assert d.impl.kernels[0].fallbacks == 0


def test_no_in_process_fallback_with_no_service_leaves_the_model_to_tflite(tmp_path):
    model = head_model(np.float32)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        d = load_delegate("unix:" + str(tmp_path / "nobody.sock"), disallow_nnapi_cpu=True)
        it, ref = interpreter(model, d), interpreter(model)
    xs = random_inputs(ref, np.random.default_rng(4))
    assert_outputs_equal(run(it, xs), run(ref, xs))
    assert d.report.delegated == 0 and not d.impl.kernels
