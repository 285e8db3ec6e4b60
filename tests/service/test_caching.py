"""Compilation caching through the real service: round trip, tampering, colliding structures."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hal.model import DataLocation
from hal.types import ErrorStatus, OperandLifeTime
from service.client import Client, ServiceError
from service.token import model_token
from tests.cache.tamper import replace_file
from tests.service.models import add_chain, add_model


def _entry_files(server, token):
    h = token.hex()
    return os.path.join(server.cache_dir, h + ".model"), os.path.join(server.cache_dir, h + ".data")


def test_prepare_then_from_cache(client, server):
    w = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    model = add_model((4, 4), constant=w)
    token = model_token(model)
    x = np.ones((4, 4), np.float32)
    first = client.prepare_model(model, token=token).execute([x]).outputs[0]
    assert all(os.path.exists(p) for p in _entry_files(server, token))
    cached = client.prepare_model_from_cache(model, token)
    np.testing.assert_array_equal(cached.execute([x]).outputs[0], first)


def _flip(path, where):
    raw = bytearray(open(path, "rb").read())
    raw[int(where * (len(raw) - 1))] ^= 0x10
    replace_file(path, bytes(raw))


def _edit(path, change):
    replace_file(path, change(open(path, "rb").read()))


def _copy_entry(server, src_token, dst_token, which=(0, 1)):
    for k in which:
        replace_file(_entry_files(server, dst_token)[k], open(_entry_files(server, src_token)[k], "rb").read())


def _model_file(server, token):
    return _entry_files(server, token)[0]


def _data_file(server, token):
    return _entry_files(server, token)[1]


# Each tampering a VTS CompilationCachingTest (or a cache-file attack) makes, as f(server, token,
# other): ``other`` is the token of a valid entry of a same-shaped model with other weights.
TAMPERING = {
    "model file: flipped bit in header": lambda s, t, o: _flip(_model_file(s, t), 0.1),
    "model file: flipped bit in payload": lambda s, t, o: _flip(_model_file(s, t), 0.6),
    "model file: flipped bit in HMAC": lambda s, t, o: _flip(_model_file(s, t), 1.0),
    "data file: flipped bit": lambda s, t, o: _flip(_data_file(s, t), 0.5),
    "model file: truncated": lambda s, t, o: _edit(_model_file(s, t), lambda b: b[:-1]),
    "data file: truncated": lambda s, t, o: _edit(_data_file(s, t), lambda b: b[: len(b) // 2]),
    "data file: appended byte": lambda s, t, o: _edit(_data_file(s, t), lambda b: b + b"\0"),
    "data file: missing (wrong number of files)": lambda s, t, o: os.unlink(_data_file(s, t)),
    "data file: another entry's": lambda s, t, o: _copy_entry(s, o, t, (1,)),
    "entry of another model copied over": lambda s, t, o: _copy_entry(s, o, t),
    "data file: made writable": lambda s, t, o: os.chmod(_data_file(s, t), 0o644),
}


@pytest.mark.parametrize("kind", list(TAMPERING))
def test_tampered_entry_is_rejected_then_recompiled(client, server, kind):
    """Every tampering: GENERAL_FAILURE, the entry is gone, prepareModel recompiles, outputs are
    right, and the rewritten entry loads again. The service keeps serving throughout."""
    rng = np.random.default_rng(len(kind))
    w, w_other = (rng.standard_normal((16, 16)).astype(np.float32) for _ in range(2))
    model, other = add_model((16, 16), constant=w), add_model((16, 16), constant=w_other)
    token, other_token = model_token(model), model_token(other)
    x = rng.standard_normal((16, 16)).astype(np.float32)
    client.prepare_model(model, token=token).release()
    client.prepare_model(other, token=other_token).release()
    model_file, data_file = _entry_files(server, token)
    TAMPERING[kind](server, token, other_token)
    with pytest.raises(ServiceError) as e:
        client.prepare_model_from_cache(model, token)
    assert e.value.status == ErrorStatus.GENERAL_FAILURE and "rejected" in e.value.message, e.value.message
    assert not os.path.exists(model_file) and not os.path.exists(data_file)  # dropped
    pm = client.prepare_model(model, token=token)  # what the delegate does next
    np.testing.assert_array_equal(pm.execute([x]).outputs[0], x + w)
    np.testing.assert_array_equal(client.prepare_model_from_cache(model, token).execute([x]).outputs[0], x + w)
    np.testing.assert_array_equal(client.prepare_model_from_cache(other, other_token).execute([x]).outputs[0],
                                  x + w_other)


def test_loaded_model_survives_its_entry_being_removed(client, server):
    """A model prepared from the cache runs on a mapping of the data file: clearing or evicting
    the entry (or renaming garbage over it) afterwards changes nothing it computes."""
    w = np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32)
    model = add_model((64, 64), constant=w)
    token = model_token(model)
    x = np.ones((64, 64), np.float32)
    client.prepare_model(model, token=token).release()
    cached = client.prepare_model_from_cache(model, token)
    model_file, data_file = _entry_files(server, token)
    replace_file(data_file, b"\xff" * os.path.getsize(data_file))
    np.testing.assert_array_equal(cached.execute([x]).outputs[0], x + w)
    cleared = subprocess.run([sys.executable, "-m", "nnhal.cli", "cache", "clear", "--cache-dir", server.cache_dir],
                             capture_output=True, text=True, timeout=60)
    assert cleared.returncode == 0 and not os.path.exists(model_file)
    np.testing.assert_array_equal(cached.execute([x]).outputs[0], x + w)


def test_corrupted_data_file_never_crashes(client, server):
    model = add_model((64, 64), constant=np.ones((64, 64), np.float32))
    token = model_token(model)
    client.prepare_model(model, token=token)
    _, data_file = _entry_files(server, token)
    replace_file(data_file, os.urandom(os.path.getsize(data_file)))
    with pytest.raises(ServiceError, match="rejected"):
        client.prepare_model_from_cache(model, token)
    assert client.get_version_string()  # still serving


def test_same_structure_different_weights(client):
    """TFLite's structure-only token would collide here; ours covers the weights."""
    x = np.zeros((2, 2), np.float32)
    m1 = add_model((2, 2), constant=np.full((2, 2), 1, np.float32))
    m2 = add_model((2, 2), constant=np.full((2, 2), 2, np.float32))
    t1, t2 = model_token(m1), model_token(m2)
    assert t1 != t2
    client.prepare_model(m1, token=t1)
    client.prepare_model(m2, token=t2)
    np.testing.assert_array_equal(client.prepare_model_from_cache(m1, t1).execute([x]).outputs[0], 1)
    np.testing.assert_array_equal(client.prepare_model_from_cache(m2, t2).execute([x]).outputs[0], 2)


def test_token_covers_user_token_options_and_is_stable():
    m = add_model((2, 2), constant=np.eye(2, dtype=np.float32))
    t = model_token(m)
    assert len(t) == 32 and t == model_token(add_model((2, 2), constant=np.eye(2, dtype=np.float32)))
    assert model_token(m, user_token=b"app-1") != t
    assert model_token(m, options={"allow_fp16": True}) != t
    assert model_token(add_model((2, 2))) != model_token(add_model((2, 3)))


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_any_weight_byte_changes_the_token(data):
    """Every constant byte counts, in operand_values and in CONSTANT_POOL pools alike."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    model = add_model((3, 4), constant=w)
    base = model_token(model)
    i = data.draw(st.integers(0, len(model.operand_values) - 1))
    values = bytearray(model.operand_values)
    values[i] ^= 1 << data.draw(st.integers(0, 7))
    assert model_token(dataclasses.replace(model, operand_values=bytes(values))) != base
    # The same constant moved into a pool: its bytes still count.
    k = next(k for k, o in enumerate(model.main.operands) if o.lifetime == OperandLifeTime.CONSTANT_COPY
             and o.location.length == w.nbytes)
    operand = model.main.operands[k]
    pooled_operand = dataclasses.replace(operand, lifetime=OperandLifeTime.CONSTANT_POOL,
                                         location=DataLocation(0, 0, w.nbytes))
    operands = list(model.main.operands)
    operands[k] = pooled_operand
    pooled = dataclasses.replace(model, main=dataclasses.replace(model.main, operands=operands),
                                 pools=[bytearray(w.tobytes())])
    changed = bytearray(w.tobytes())
    changed[data.draw(st.integers(0, w.nbytes - 1))] ^= 1
    assert model_token(pooled) != model_token(dataclasses.replace(pooled, pools=[changed]))


def test_pool_boundaries_count_in_the_token():
    """Pools ["ab", "c"] and ["a", "bc"] hold the same byte stream but different constants."""
    model = add_model((1,), constant=np.zeros(1, np.float32))
    a = dataclasses.replace(model, pools=[bytearray(b"\0" * 8), bytearray(b"\1" * 4)])
    b = dataclasses.replace(model, pools=[bytearray(b"\0" * 4), bytearray(b"\0" * 4 + b"\1" * 4)])
    assert model_token(a) != model_token(b)


def test_two_clients_prepare_the_same_token_at_once(server):
    model = add_chain(3, (16, 16))
    token = model_token(model)
    errors = []

    def prepare_many():
        try:
            with Client.connect(server.address) as c:
                for _ in range(15):
                    c.prepare_model(model, token=token).release()
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=prepare_many) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    x = np.ones((16, 16), np.float32)
    with Client.connect(server.address) as c:
        np.testing.assert_array_equal(c.prepare_model_from_cache(model, token).execute([x]).outputs[0], 4 * x)


def test_cache_cli(client, server):
    model = add_model((2, 2), constant=np.eye(2, dtype=np.float32))
    token = model_token(model)
    client.prepare_model(model, token=token)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "nnhal.cli", "cache", *args, "--cache-dir", server.cache_dir],
                              capture_output=True, text=True, timeout=60)
    ls = cli("ls")
    assert ls.returncode == 0 and token.hex() in ls.stdout
    ok = cli("verify")
    assert ok.returncode == 0 and "ok" in ok.stdout
    model_file = _entry_files(server, token)[0]
    raw = bytearray(open(model_file, "rb").read())
    raw[20] ^= 1
    replace_file(model_file, bytes(raw))
    bad = cli("verify")
    assert bad.returncode == 1 and "HMAC" in bad.stdout
    assert "0 entries" in cli("ls").stdout  # verify removed the bad entry
    client.prepare_model(model, token=token)
    cleared = cli("clear")
    assert cleared.returncode == 0 and "removed 2 files" in cleared.stdout
    assert "0 entries" in cli("ls").stdout


def test_a_directory_as_data_file_is_a_miss_not_an_internal_error(client, server):
    """Issue 34 item 7, through the service: GENERAL_FAILURE (the client recompiles), no traceback
    in the service's log, and the next prepare with the token caches the entry again."""
    model = add_model((4, 4), constant=np.eye(4, dtype=np.float32))
    token = model_token(model)
    x = np.ones((4, 4), np.float32)
    client.prepare_model(model, token=token)
    data = _data_file(server, token)
    os.unlink(data)
    os.mkdir(data)
    with pytest.raises(ServiceError) as e:
        client.prepare_model_from_cache(model, token)
    assert e.value.status == ErrorStatus.GENERAL_FAILURE and "internal error" not in str(e.value)
    client.prepare_model(model, token=token)
    assert os.path.isfile(data)
    np.testing.assert_array_equal(client.prepare_model_from_cache(model, token).execute([x]).outputs[0], x + np.eye(4))
    assert "Traceback" not in server.output()
