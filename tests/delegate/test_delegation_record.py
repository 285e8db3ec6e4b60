"""The delegation record: a warm start delegates exactly as a cold one, without mapping the graph.

Real service process, real cache files, the real TFLite interpreter. The cold start's delegation
(report, partitions, tokens, outputs) is the oracle for the warm one; TFLite's CPU for the results.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from delegate import load_delegate
from tests.cache.tamper import replace_file
from tests.delegate.helpers import assert_outputs_equal, interpreter, random_inputs, run
from tests.delegate.models import head_model

#: Two partitions around an unmappable COS, both delegated.
SPLIT = dict(max_delegated_partitions=0, partitioning="largest")


def _delegation(d) -> tuple:
    return ([(n.index, n.op, n.placement, n.reason) for n in d.report.nodes], d.report.partitions,
            [(k.params.nodes, k.inputs, k.outputs, k.state_tensors, k.node_operations, k.token)
             for k in d.impl.kernels])


def _files(server, key: bytes) -> tuple[str, str]:
    return tuple(os.path.join(server.cache_dir, key.hex() + ext) for ext in (".model", ".data"))


def test_warm_start_delegates_from_the_record_as_the_cold_start_did(server):
    model = head_model(np.float32, unsupported_middle=True)
    cold = load_delegate(server.address, **SPLIT)
    it_cold = interpreter(model, cold)
    assert cold.impl._record is None and all(k._part is not None for k in cold.impl.kernels)
    assert all(os.path.exists(p) for p in _files(server, cold.impl._record_key))
    warm = load_delegate(server.address, **SPLIT)
    it_warm = interpreter(model, warm)
    assert warm.impl._record is not None and len(warm.impl.kernels) == 2
    assert all(k._part is None and k.from_cache for k in warm.impl.kernels), "nothing converted, all loaded"
    assert _delegation(warm) == _delegation(cold)
    ref = interpreter(model)
    rng = np.random.default_rng(31)
    for _ in range(3):
        xs = random_inputs(ref, rng)
        got = run(it_warm, xs)
        assert_outputs_equal(got, run(ref, xs))
        for a, b in zip(got, run(it_cold, xs)):
            np.testing.assert_array_equal(a, b)
    for k, c in zip(warm.impl.kernels, cold.impl.kernels):  # converted on demand: what the record says
        assert k.part.model == c.part.model and k.token == c.token


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_quantized_warm_start_is_bit_exact(server, dtype):
    model = head_model(dtype, seed=5)
    cold = load_delegate(server.address)
    it_cold = interpreter(model, cold)
    warm = load_delegate(server.address)
    it_warm = interpreter(model, warm)
    assert warm.impl._record is not None and warm.impl.kernels[0]._part is None
    assert _delegation(warm) == _delegation(cold)
    ref = interpreter(model)
    xs = random_inputs(ref, np.random.default_rng(32))
    assert_outputs_equal(run(it_warm, xs), run(ref, xs))
    for a, b in zip(run(it_warm, xs), run(it_cold, xs)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("change", ["weights", "allow_fp16", "cache_token", "partitioning"])
def test_a_changed_model_or_option_misses_the_record(server, change):
    model, options = head_model(np.float32, seed=3), dict(SPLIT)
    interpreter(model, load_delegate(server.address, **options))
    if change == "weights":
        model = head_model(np.float32, seed=4)  # same structure
    elif change == "partitioning":
        options.update(max_delegated_partitions=1)
    else:
        options[change] = True if change == "allow_fp16" else b"another app"
    d = load_delegate(server.address, **options)
    it = interpreter(model, d)
    assert d.impl._record_key is not None and d.impl._record is None
    assert all(k._part is not None for k in d.impl.kernels)
    ref = interpreter(model)
    xs = random_inputs(ref, np.random.default_rng(33))
    assert_outputs_equal(run(it, xs), run(ref, xs))


def test_a_changed_service_misses_the_record(server, monkeypatch):
    """The service's version string is in the key: another driver version never reuses a record."""
    from service.client import Client
    model = head_model(np.float32, seed=6)
    interpreter(model, load_delegate(server.address))
    connect = Client.connect.__func__

    def other_version(cls, *a, **kw):
        c = connect(cls, *a, **kw)
        c.version += "-other"
        return c
    monkeypatch.setattr(Client, "connect", classmethod(other_version))
    d = load_delegate(server.address)
    interpreter(model, d)
    assert d.impl._record_key is not None and d.impl._record is None


@pytest.mark.parametrize("damage", ["flip a payload byte", "truncate the record", "remove its data file",
                                    "a compiled entry's files in its place"])
def test_damaged_record_is_a_clean_miss(server, damage):
    """A damaged record is dropped by the service's cache: the delegate delegates afresh (same
    delegation, same results), stores a new record, and the next start uses that."""
    model = head_model(np.float32, unsupported_middle=True, seed=8)
    cold = load_delegate(server.address, **SPLIT)
    interpreter(model, cold)
    model_file, data_file = _files(server, cold.impl._record_key)
    if damage == "flip a payload byte":
        raw = bytearray(open(model_file, "rb").read())
        raw[-40] ^= 0x04
        replace_file(model_file, bytes(raw))
    elif damage == "truncate the record":
        replace_file(model_file, open(model_file, "rb").read()[:-9])
    elif damage == "remove its data file":
        os.unlink(data_file)
    else:
        compiled_model, compiled_data = _files(server, cold.impl.kernels[0].token)
        replace_file(model_file, open(compiled_model, "rb").read())
        replace_file(data_file, open(compiled_data, "rb").read())
    d = load_delegate(server.address, **SPLIT)
    it = interpreter(model, d)
    assert d.impl._record is None and _delegation(d) == _delegation(cold)
    ref = interpreter(model)
    xs = random_inputs(ref, np.random.default_rng(34))
    assert_outputs_equal(run(it, xs), run(ref, xs))
    again = load_delegate(server.address, **SPLIT)
    interpreter(model, again)
    assert again.impl._record is not None and _delegation(again) == _delegation(cold)


def test_record_without_its_compiled_model_converts_and_compiles(server):
    """The record names a token the service no longer has: the kernel converts its partition then,
    prepares it, and runs it as the cold start did."""
    model = head_model(np.float32, seed=9)
    cold = load_delegate(server.address)
    interpreter(model, cold)
    for p in _files(server, cold.impl.kernels[0].token):
        os.unlink(p)
    d = load_delegate(server.address)
    it = interpreter(model, d)
    k = d.impl.kernels[0]
    assert d.impl._record is not None and k.from_cache is False and k._part is not None
    assert _delegation(d) == _delegation(cold)
    ref = interpreter(model)
    xs = random_inputs(ref, np.random.default_rng(35))
    assert_outputs_equal(run(it, xs), run(ref, xs))


def test_service_killed_between_the_support_query_and_the_kernels(server, monkeypatch):
    """The service dies after it said what it supports and before the kernels prepare: no record is
    stored (there is no connection to store it on), the Interpreter is made and runs on the CPU."""
    from delegate.nnhal_delegate import NnhalDelegate
    planned = NnhalDelegate.on_plan

    def kill_then_plan(self, *args):
        server.proc.kill()
        server.proc.wait()
        return planned(self, *args)

    monkeypatch.setattr(NnhalDelegate, "on_plan", kill_then_plan)
    model = head_model(np.float32, unsupported_middle=True)
    d = load_delegate(server.address, **SPLIT)
    it = interpreter(model, d)
    assert d.last_error is None, d.last_error
    ref = interpreter(model)
    xs = random_inputs(ref, np.random.default_rng(3))
    assert_outputs_equal(run(it, xs), run(ref, xs))
