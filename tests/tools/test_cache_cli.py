"""`nnhal cache ls|verify|clear` inspects a cache and creates nothing (issue 33, item 6): a missing
or mistyped --cache-dir is one line and exit 2, not a new empty cache; a read-only directory is one
line naming why, not a traceback."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from cache.store import CacheStore
from tests.service.conftest import HANG_LIMIT_S

pytestmark = pytest.mark.any_runtime

TOKEN = bytes(range(32))
CLI = [sys.executable, "-m", "nnhal.cli", "cache"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=HANG_LIMIT_S)


def _one_line_error(r: subprocess.CompletedProcess, *words: str) -> str:
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    assert lines[0].startswith("nnhal cache: ") and all(w in lines[0] for w in words), lines[0]
    return lines[0]


def _cache_with_an_entry(d) -> list[str]:
    """A cache directory holding one entry (written as the service writes it); its file names."""
    CacheStore(str(d), driver_version="nnhal-test", capabilities_fingerprint="caps").put(
        TOKEN, b"{}", [np.arange(8, dtype=np.float32)])
    return sorted(os.listdir(d))


@pytest.mark.parametrize("action", ["ls", "verify", "clear"])
def test_a_missing_directory_is_not_created(tmp_path, action):
    typo = tmp_path / "cahce"
    _one_line_error(_cli(action, "--cache-dir", str(typo)), f"cache directory {typo} does not exist")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("action", ["ls", "verify", "clear"])
def test_no_default_cache_yet_is_empty_not_an_error(tmp_path, action):
    """Before any `nnhal serve` has run as this user the default directory does not exist: that is an
    empty cache (exit 0), and still nothing is created."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    r = subprocess.run([*CLI, action], capture_output=True, text=True, timeout=HANG_LIMIT_S, env=env)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.startswith(f"0 entries: no compilation cache at {tmp_path / 'xdg' / 'nnhal'} yet"), r.stdout
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("action", ["ls", "verify", "clear"])
def test_a_directory_without_a_key_gets_none(tmp_path, action):
    (tmp_path / "notes.txt").write_text("mine")
    r = _cli(action, "--cache-dir", str(tmp_path))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]


def test_verify_without_the_key_removes_nothing(tmp_path):
    names = _cache_with_an_entry(tmp_path)
    os.unlink(tmp_path / "cache.key")
    _one_line_error(_cli("verify", "--cache-dir", str(tmp_path)), "cache key", "is missing", "1 entries")
    assert sorted(os.listdir(tmp_path)) == [n for n in names if n != "cache.key"]
    r = _cli("ls", "--cache-dir", str(tmp_path))  # listing needs no key
    assert r.returncode == 0 and TOKEN.hex() in r.stdout, r.stderr


def _read_only(directory, argv: list[str]) -> subprocess.CompletedProcess:
    """``argv`` run with ``directory`` read-only. Root ignores permission bits, so for root the
    directory is bind-mounted read-only in a private mount namespace of that process alone
    (unshare -m: nothing outside it sees the mount); for anyone else, mode 0500."""
    if os.geteuid() != 0:
        os.chmod(directory, 0o500)
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=HANG_LIMIT_S)
        finally:
            os.chmod(directory, 0o700)
    if shutil.which("unshare") is None:
        pytest.skip("running as root without unshare(1): no read-only directory to be had")
    probe = subprocess.run(["unshare", "-m", "mount", "--bind", "-o", "ro", str(directory), str(directory)],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"running as root where a read-only bind mount is not allowed: {probe.stderr.strip()}")
    return subprocess.run(["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"',
                           str(directory), *argv], capture_output=True, text=True, timeout=HANG_LIMIT_S)


def test_clear_on_a_read_only_directory_is_one_line(tmp_path):
    d = tmp_path / "cache"
    names = _cache_with_an_entry(d)
    r = _read_only(d, [*CLI, "clear", "--cache-dir", str(d)])
    line = _one_line_error(r, "cannot remove", str(d))
    assert line.endswith(("Read-only file system", "Permission denied")), line
    assert sorted(os.listdir(d)) == names
    ls = _read_only(d, [*CLI, "ls", "--cache-dir", str(d)])
    assert ls.returncode == 0 and "1 entries" in ls.stdout, ls.stderr
