"""Compilation caching through the real service: round trip, tampering, colliding structures."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from hal.types import ErrorStatus
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


def test_tampered_entry_is_rejected_then_recompiled(client, server):
    model = add_chain(4, (3, 3))
    token = model_token(model)
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    client.prepare_model(model, token=token)
    model_file, data_file = _entry_files(server, token)
    raw = bytearray(open(model_file, "rb").read())
    raw[len(raw) // 2] ^= 0x10
    replace_file(model_file, bytes(raw))
    with pytest.raises(ServiceError) as e:
        client.prepare_model_from_cache(model, token)
    assert e.value.status == ErrorStatus.GENERAL_FAILURE and "rejected" in e.value.message
    assert not os.path.exists(model_file)  # dropped
    # The client falls back to prepareModel, which rewrites the entry; outputs are right.
    pm = client.prepare_model(model, token=token)
    np.testing.assert_array_equal(pm.execute([x]).outputs[0], 5 * x)
    np.testing.assert_array_equal(client.prepare_model_from_cache(model, token).execute([x]).outputs[0], 5 * x)


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
