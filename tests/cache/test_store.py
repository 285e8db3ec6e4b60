"""CacheStore never trusts a file: NNAPI VTS CompilationCachingTests, storage level."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cache.store as store_mod
from cache.store import CacheError, CacheStore
from tests.cache.tamper import replace_file

TOKEN = bytes(range(32))
OTHER = bytes(range(1, 33))


def make(d, **kw) -> CacheStore:
    args = {"driver_version": "nnhal-test+1", "capabilities_fingerprint": "caps-1"}
    args.update(kw)
    return CacheStore(str(d), **args)


def sample(seed: int = 0):
    rng = np.random.default_rng(seed)
    return (b'{"model": %d}' % seed,
            [rng.standard_normal((17, 5)).astype(np.float32), np.arange(7, dtype=np.int8),
             rng.integers(0, 255, (3, 3, 3), dtype=np.uint8)])


def assert_same(got, want):
    payload, arrays = got
    assert payload == want[0]
    assert len(arrays) == len(want[1])
    for a, b in zip(arrays, want[1]):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def files(s: CacheStore, token=TOKEN):
    h = token.hex()
    return os.path.join(s.dir, h + ".model"), os.path.join(s.dir, h + ".data")


def rejected(s: CacheStore, token=TOKEN, match: str | None = None) -> str:
    with pytest.raises(CacheError, match=match) as e:
        s.get(token)
    assert not any(os.path.exists(p) for p in files(s, token)), "a rejected entry must be removed"
    return str(e.value)


def test_round_trip_and_layout(tmp_path):
    s = make(tmp_path)
    want = sample()
    s.put(TOKEN, *want)
    assert_same(s.get(TOKEN), want)
    assert oct(os.stat(os.path.join(s.dir, "cache.key")).st_mode & 0o777) == "0o600"
    assert oct(os.stat(s.dir).st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("arrays", [[], [np.zeros((0, 3), np.float32), np.arange(3)], [np.float32(2.5)]],
                         ids=["no arrays", "empty array", "scalar"])
def test_degenerate_arrays_round_trip(tmp_path, arrays):
    s = make(tmp_path)
    want = (b"{}", [np.asarray(a) for a in arrays])
    s.put(TOKEN, *want)
    assert_same(s.get(TOKEN), want)


def test_arrays_are_aligned(tmp_path):
    s = make(tmp_path)
    s.put(TOKEN, *sample())
    _, arrays = s.get(TOKEN)
    base = arrays[0].__array_interface__["data"][0]
    for a in arrays:
        assert (a.__array_interface__["data"][0] - base) % 64 == 0


@pytest.mark.parametrize("which", [0, 1])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pos=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_any_flipped_bit_is_rejected(tmp_path, which, pos, bit):
    s = make(tmp_path)
    s.put(TOKEN, *sample())
    path = files(s)[which]
    raw = bytearray(open(path, "rb").read())
    i = int(pos * len(raw))
    raw[i] ^= 1 << bit
    replace_file(path, bytes(raw))
    rejected(s)


@pytest.mark.parametrize("which", [0, 1])
def test_truncation_and_appended_byte(tmp_path, which):
    s = make(tmp_path)
    want = sample()
    for mutate in (lambda b: b[:-1], lambda b: b[: len(b) // 2], lambda b: b"", lambda b: b + b"\0"):
        s.put(TOKEN, *want)
        path = files(s)[which]
        raw = open(path, "rb").read()
        replace_file(path, mutate(raw))
        rejected(s)


def test_other_driver_version_capabilities_or_key(tmp_path):
    make(tmp_path).put(TOKEN, *sample())
    rejected(make(tmp_path, driver_version="nnhal-test+2"), match="written by driver")
    make(tmp_path).put(TOKEN, *sample())
    rejected(make(tmp_path, capabilities_fingerprint="caps-2"), match="capabilities")
    make(tmp_path).put(TOKEN, *sample())
    os.unlink(tmp_path / "cache.key")
    rejected(make(tmp_path), match="HMAC")  # a new key: old entries no longer authenticate


def test_entry_copied_over_another_token(tmp_path):
    """ReplaceSecuritySensitiveCache: another model's valid files under this token's name."""
    s = make(tmp_path)
    s.put(OTHER, *sample(1))
    for src, dst in zip(files(s, OTHER), files(s, TOKEN)):
        replace_file(dst, open(src, "rb").read())
    rejected(s, match="token inside the file differs")
    assert_same(s.get(OTHER), sample(1))


def test_token_differing_in_one_bit_finds_nothing(tmp_path):
    s = make(tmp_path)
    s.put(TOKEN, *sample())
    flipped = bytes([TOKEN[0] ^ 1]) + TOKEN[1:]
    with pytest.raises(CacheError, match="no cache entry"):
        s.get(flipped)
    with pytest.raises(CacheError, match="32 bytes"):
        s.get(TOKEN[:31])


def test_wrong_number_of_files(tmp_path):
    s = make(tmp_path)
    s.put(TOKEN, *sample())
    os.unlink(files(s)[1])
    rejected(s, match="data file missing")
    s.put(TOKEN, *sample())
    os.unlink(files(s)[0])
    with pytest.raises(CacheError, match="no cache entry"):
        s.get(TOKEN)


def test_data_file_swapped_during_load(tmp_path, monkeypatch):
    """Time of check / time of use: the other entry's data replaces ours after the model file
    was read. The digest the model file names no longer matches: rejected, never mixed."""
    s = make(tmp_path)
    s.put(OTHER, *sample(1))
    s.put(TOKEN, *sample(0))
    real = store_mod.read_file

    def swapping(path, limit):
        out = real(path, limit)
        if path.endswith(TOKEN.hex() + ".model"):
            replace_file(files(s, TOKEN)[1], open(files(s, OTHER)[1], "rb").read())
        return out
    monkeypatch.setattr(store_mod, "read_file", swapping)
    rejected(s, match="checksum")


def test_file_replaced_after_verification_is_not_used(tmp_path, monkeypatch):
    """The data file is mapped through the descriptor that was checked: a file renamed over it
    once the digest matched (or while it is being hashed) is never what the arrays show."""
    s = make(tmp_path)
    want = sample(0)
    s.put(TOKEN, *want)
    real = store_mod.digest

    def replacing(buf):
        out = real(buf)
        if len(buf) > 64:  # the data file, verified: now swap in other bytes under its name
            replace_file(files(s)[1], b"\xff" * len(buf))
        return out
    monkeypatch.setattr(store_mod, "digest", replacing)
    payload, arrays = s.get(TOKEN)
    assert open(files(s)[1], "rb").read(4) == b"\xff" * 4  # the swap did happen
    assert_same((payload, arrays), want)


def test_a_verified_data_file_is_hashed_again_only_when_it_changed(tmp_path, monkeypatch):
    """A data file verified once is not hashed again while its status is unchanged; changing its
    bytes in place (made writable, written, made read-only again) is still detected."""
    monkeypatch.setattr(store_mod._Verified, "SETTLED_NS", 20_000_000)
    s = make(tmp_path)
    want = sample(0)
    s.put(TOKEN, *want)
    time.sleep(0.05)  # the entry's last change is older than SETTLED_NS: its status can be remembered
    hashed = []
    real = store_mod.digest
    monkeypatch.setattr(store_mod, "digest", lambda buf: hashed.append(len(buf)) or real(buf))
    assert_same(s.get(TOKEN), want)
    assert_same(s.get(TOKEN), want)
    assert len(hashed) == 1
    data = files(s)[1]
    os.chmod(data, 0o600)
    with open(data, "r+b") as f:
        f.write(bytes([f.read(1)[0] ^ 1]))
    os.chmod(data, 0o400)
    rejected(s, match="checksum")
    assert len(hashed) == 2


def test_a_data_file_changed_just_before_it_was_read_is_hashed_on_every_load(tmp_path, monkeypatch):
    """Within SETTLED_NS of a file's last change, its change time could survive another change
    (the kernel's clock is coarse): such a file is not remembered."""
    monkeypatch.setattr(store_mod._Verified, "SETTLED_NS", 1 << 62)
    s = make(tmp_path)
    s.put(TOKEN, *sample(0))
    hashed = []
    real = store_mod.digest
    monkeypatch.setattr(store_mod, "digest", lambda buf: hashed.append(len(buf)) or real(buf))
    for _ in range(3):
        s.get(TOKEN)
    assert len(hashed) == 3


def test_entries_are_read_only_and_mapped_read_only(tmp_path):
    s = make(tmp_path)
    s.put(TOKEN, *sample())
    for p in files(s):
        assert os.stat(p).st_mode & 0o777 == 0o400
    _, arrays = s.get(TOKEN)
    assert not any(a.flags.writeable for a in arrays)
    with pytest.raises(ValueError, match="read-only"):
        arrays[0][0, 0] = 1.0


def test_writable_or_foreign_data_file_is_not_mapped(tmp_path):
    """A data file someone can write in place could change under the mapping: refused."""
    s = make(tmp_path)
    s.put(TOKEN, *sample())
    os.chmod(files(s)[1], 0o620)
    rejected(s, match="read-only")
    s.put(TOKEN, *sample())
    data = files(s)[1]
    os.replace(data, data + ".real")
    os.symlink(data + ".real", data)  # O_NOFOLLOW: a link is not our file
    rejected(s, match="cannot be opened")


@pytest.mark.parametrize("which", [0, 1])
def test_fifo_planted_as_an_entry_file_is_refused_not_waited_on(tmp_path, which):
    """Opening a FIFO for reading blocks until a writer appears: a loader must never hang on one."""
    import threading
    s = make(tmp_path)
    s.put(TOKEN, *sample())
    path = files(s)[which]
    os.unlink(path)
    os.mkfifo(path)
    errors = []
    t = threading.Thread(target=lambda: errors.append(rejected(s)), daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():
        with open(path, "wb"):  # unblock the loader so the test process can exit
            pass
        pytest.fail("the loader blocked on a FIFO")
    assert errors and "not a regular file" in errors[0]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300), st.booleans())
def test_garbage_files_never_crash(tmp_path, junk, which):
    s = make(tmp_path)
    s.put(TOKEN, *sample())
    replace_file(files(s)[int(which)], junk)
    rejected(s)


def _writer(d: str, seed: int, n: int) -> None:
    s = make(d)
    for _ in range(n):
        s.put(TOKEN, *sample(0))
        got = None
        try:
            got = s.get(TOKEN)
        except CacheError:
            pass  # the other writer may be mid-way; a miss is allowed, a wrong entry is not
        if got is not None:
            assert_same(got, sample(0))


def test_concurrent_writers_and_readers(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), k, 30)) for k in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert_same(make(tmp_path).get(TOKEN), sample(0))
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]


def test_lru_eviction(tmp_path):
    s = make(tmp_path)
    tokens = [bytes([k]) * 32 for k in range(4)]
    s.put(tokens[0], *sample(0))
    one = s.total_bytes()
    s.max_bytes = int(one * 3.5)
    s.put(tokens[1], *sample(1))
    s.put(tokens[2], *sample(2))
    os.utime(files(s, tokens[0])[0], (1, 1))  # make the ages unambiguous
    os.utime(files(s, tokens[1])[0], (2, 2))
    os.utime(files(s, tokens[2])[0], (3, 3))
    s.get(tokens[0])  # tokens[0] is now the most recently used
    s.put(tokens[3], *sample(3))
    left = {e.token_hex for e in s.entries()}
    assert tokens[1].hex() not in left
    assert {tokens[0].hex(), tokens[2].hex(), tokens[3].hex()} <= left
    assert s.total_bytes() <= s.max_bytes


def test_clear(tmp_path):
    s = make(tmp_path)
    s.put(TOKEN, *sample())
    s.put(OTHER, *sample(1))
    removed, skipped = s.clear()
    assert removed == 4 and skipped == []
    assert s.entries() == []


# ---- issue 18, finding 4: never destroy or trust files nnhal did not write ------------------------

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nnhal.cli", *args], capture_output=True, text=True, timeout=120)


def _plant_foreign_files(d) -> dict[str, bytes]:
    """Files a user could have in a folder passed as --cache-dir, some with entry-like names."""
    foreign = {"thesis.model": b"my model", "points.data": b"1,2,3", "notes.txt": b"hi",
               "ab" * 32 + ".model": b"not nnhal's", "cd" * 32 + ".data": b"orphan, no model names it",
               ".tmp-notes": b"mine"}
    for name, content in foreign.items():
        (d / name).write_bytes(content)
    return foreign


def test_clear_removes_only_its_own_entries(tmp_path):
    s = make(tmp_path)
    s.put(TOKEN, *sample())
    make(tmp_path, driver_version="nnhal-old").put(OTHER, *sample(1))  # still ours: another driver's entry
    foreign = _plant_foreign_files(tmp_path)
    removed, skipped = s.clear()
    assert removed == 4
    assert sorted(name for name, _ in skipped) == sorted(foreign)
    for name, content in foreign.items():
        assert (tmp_path / name).read_bytes() == content
    assert (tmp_path / "cache.key").exists()


def test_entry_under_a_lost_key_is_still_cleared(tmp_path):
    make(tmp_path).put(TOKEN, *sample())
    os.unlink(tmp_path / "cache.key")
    removed, skipped = make(tmp_path).clear()
    assert removed == 2 and skipped == []


def test_cache_clear_command_says_what_it_kept(tmp_path):
    make(tmp_path).put(TOKEN, *sample())
    foreign = _plant_foreign_files(tmp_path)
    r = _cli("cache", "clear", "--cache-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "removed 2 files" in r.stdout and "kept 6" in r.stdout and "thesis.model" in r.stdout
    assert sorted(os.listdir(tmp_path)) == sorted([*foreign, "cache.key"])


def test_ls_verify_and_eviction_ignore_foreign_files(tmp_path):
    foreign = _plant_foreign_files(tmp_path)
    s = make(tmp_path, max_bytes=1)
    assert s.entries() == []
    r = _cli("cache", "verify", "--cache-dir", str(tmp_path))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    s.max_bytes = 10**9
    s.put(TOKEN, *sample())
    s.max_bytes = 1
    s.evict()
    for name, content in foreign.items():
        assert (tmp_path / name).read_bytes() == content


def test_entry_larger_than_the_cache_is_not_stored_and_evicts_nothing(tmp_path, caplog):
    s = make(tmp_path)
    s.put(TOKEN, *sample(0))
    s.max_bytes = s.total_bytes() + 100
    big = (b"{}", [np.zeros(10_000, np.float32)])
    stored = s.put(OTHER, *big)
    assert [e.token_hex for e in s.entries()] == [TOKEN.hex()]
    assert stored is False
    assert_same(s.get(TOKEN), sample(0))
    assert "larger than the cache" in caplog.text
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp-") or f.startswith(OTHER.hex())]


def test_negative_max_bytes_is_refused(tmp_path):
    with pytest.raises(ValueError, match="max_bytes"):
        make(tmp_path, max_bytes=-1)


@pytest.mark.parametrize("key", [b"short", b"x" * 33, b""], ids=["short", "long", "empty"])
def test_corrupt_key_is_one_clear_error(tmp_path, key):
    (tmp_path / "cache.key").write_bytes(key)
    os.chmod(tmp_path / "cache.key", 0o600)
    with pytest.raises(CacheError, match="cache key .* is corrupt"):
        make(tmp_path)
    for action in ("ls", "verify", "clear"):
        r = _cli("cache", action, "--cache-dir", str(tmp_path))
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith("nnhal cache: cache key") and len(r.stderr.strip().splitlines()) == 1
    assert (tmp_path / "cache.key").read_bytes() == key  # a cache command repairs nothing


@pytest.mark.parametrize("plant", ["directory", "symlink", "readable by others"])
def test_untrusted_key_is_refused(tmp_path, plant):
    k = tmp_path / "cache.key"
    if plant == "directory":
        k.mkdir()
    elif plant == "symlink":
        (tmp_path / "elsewhere").write_bytes(b"k" * 32)
        k.symlink_to(tmp_path / "elsewhere")
    else:
        k.write_bytes(b"k" * 32)
        os.chmod(k, 0o644)
    with pytest.raises(CacheError, match="cache key"):
        make(tmp_path)


def test_repair_moves_a_corrupt_key_aside(tmp_path):
    make(tmp_path).put(TOKEN, *sample())
    os.replace(tmp_path / "cache.key", tmp_path / "good.key")
    (tmp_path / "cache.key").write_bytes(b"junk")
    s = make(tmp_path, repair_key=True)
    assert len(s.key) == 32
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("cache.key.bad-")]
    assert len(aside) == 1 and aside[0].read_bytes() == b"junk"
    rejected(s, match="HMAC")  # entries made with the old key are dropped one by one, and recompiled
    assert make(tmp_path).key == s.key  # the new key is the one on disk


def _repairer(d: str, q) -> None:
    q.put(make(d, repair_key=True).key)


def test_concurrent_services_repair_a_bad_key_once(tmp_path):
    (tmp_path / "cache.key").write_bytes(b"junk")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_repairer, args=(str(tmp_path), q)) for _ in range(4)]
    for p in procs:
        p.start()
    keys = {q.get(timeout=120) for _ in procs}
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert keys == {make(tmp_path).key}  # all agree on the key on disk
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("cache.key.bad-")]) == 1


@pytest.mark.parametrize("which", ["model", "data"])
def test_a_directory_where_an_entry_file_belongs_is_a_clean_miss_and_rewritable(tmp_path, caplog, which):
    """Issue 34 item 7: a directory at an entry's data (or model) path made get() raise
    IsADirectoryError out of remove() (an internal error with a traceback in the service), and put()
    could never rename a file over it: that token was never cached again."""
    import logging
    s = make(tmp_path)
    want = sample()
    s.put(TOKEN, *want)
    path = os.path.join(str(tmp_path), TOKEN.hex() + "." + which)
    os.unlink(path)
    os.makedirs(os.path.join(path, "inside"))  # not even empty
    with caplog.at_level(logging.INFO, logger="nnhal.cache"):
        with pytest.raises(CacheError):
            s.get(TOKEN)
    rejected = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(rejected) == 1 and "rejected" in rejected[0].getMessage() and not rejected[0].exc_info
    assert s.put(TOKEN, *want)
    assert_same(s.get(TOKEN), want)


def test_a_directory_in_the_way_of_a_first_put_is_replaced(tmp_path):
    s = make(tmp_path)
    os.makedirs(os.path.join(str(tmp_path), TOKEN.hex() + ".data"))
    want = sample()
    assert s.put(TOKEN, *want)
    assert_same(s.get(TOKEN), want)


def test_a_writable_data_file_is_a_clean_miss_and_rewritable(tmp_path):
    """The wrong mode (a data file others could change under the mapping): refused, removed, and
    the same token is stored again."""
    s = make(tmp_path)
    want = sample()
    s.put(TOKEN, *want)
    os.chmod(os.path.join(str(tmp_path), TOKEN.hex() + ".data"), 0o644)
    with pytest.raises(CacheError, match="read-only"):
        s.get(TOKEN)
    assert s.put(TOKEN, *want)
    assert_same(s.get(TOKEN), want)


def test_entry_kinds_never_load_as_each_other(tmp_path):
    """A delegate's record and a compiled model share the store: each is found only as its own kind.
    Asked as the other kind, a sound entry is a miss and stays; damaged or stale, a record is
    rejected and removed like a compiled entry."""
    from cache.store import CacheKindError
    s = make(tmp_path)
    compiled, record = sample(1), (b'{"record": 1}', [])
    s.put(TOKEN, *compiled)
    s.put(OTHER, *record, kind="delegation")
    assert_same(s.get(TOKEN), compiled)
    assert_same(s.get(OTHER, kind="delegation"), record)
    with pytest.raises(CacheKindError, match="'compiled', not a 'delegation'"):
        s.get(TOKEN, kind="delegation")
    with pytest.raises(CacheKindError, match="'delegation', not a 'compiled'"):
        s.get(OTHER)
    assert all(os.path.exists(p) for p in (*files(s), *files(s, OTHER)))
    assert s.verify(OTHER) is None and s.verify(TOKEN) is None
    model_file, _ = files(s, OTHER)
    raw = bytearray(open(model_file, "rb").read())
    raw[-40] ^= 0x01  # the payload's last byte
    replace_file(model_file, bytes(raw))
    with pytest.raises(CacheError, match="HMAC"):
        s.get(OTHER, kind="delegation")
    assert not any(os.path.exists(p) for p in files(s, OTHER))
    s.put(OTHER, *record, kind="delegation")
    with pytest.raises(CacheError, match="written by driver"):
        make(tmp_path, driver_version="nnhal-test+2").get(OTHER, kind="delegation")
    assert not any(os.path.exists(p) for p in files(s, OTHER))


def test_entry_written_before_kinds_is_a_compiled_model(tmp_path, monkeypatch):
    """Version 2 entries written before the header named a kind hold compiled models."""
    s = make(tmp_path)
    original = s._model_body

    def without_kind(*args):
        body = original(*args)
        prefix = store_mod._PREFIX
        magic, version, hlen = prefix.unpack_from(body)
        header = json.loads(body[prefix.size:prefix.size + hlen])
        del header["kind"]
        new = json.dumps(header, separators=(",", ":")).encode()
        return prefix.pack(magic, version, len(new)) + new + body[prefix.size + hlen:]
    monkeypatch.setattr(s, "_model_body", without_kind)
    want = sample(2)
    s.put(TOKEN, *want)
    assert b'"kind"' not in open(files(s)[0], "rb").read()
    assert_same(make(tmp_path).get(TOKEN), want)
