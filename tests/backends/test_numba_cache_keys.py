"""The numba backend's disk-cached kernels that are closures hold plain values only.

numba keys a cached closure on its cells' pickle. A cell holding a compiled function (a
dispatcher) pickles differently in every process, so such a kernel is compiled again at every
service start, and concurrent starts rewrite one cache index under each other (a driver of
f32_expand.py once did, and loaded a driver compiled for another depthwise kernel: NaN outputs).
The closures here (per-batch, per-filter and per-kernel variants) must hold ints and bools."""
from __future__ import annotations

import importlib
import pathlib
import pkgutil

import pytest

pytest.importorskip("hal.backends.numba_kernels")

from numba.core.caching import NullCache  # noqa: E402
from numba.core.dispatcher import Dispatcher  # noqa: E402

import hal.backends.numba_kernels as package  # noqa: E402

PLAIN = (bool, int, float, str)


def _dispatchers(value, depth: int = 0):
    """The dispatchers ``value`` is or holds (a tuple, list or dict of them, one level down)."""
    if isinstance(value, Dispatcher):
        yield value
    elif depth < 2 and isinstance(value, (tuple, list)):
        for v in value:
            yield from _dispatchers(v, depth + 1)
    elif depth < 2 and isinstance(value, dict):
        for v in value.values():
            yield from _dispatchers(v, depth + 1)


def test_every_cached_closure_kernel_holds_plain_values_only():
    closures, bad = 0, []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name, value in vars(module).items():
            for kernel in _dispatchers(value):
                cells = kernel.py_func.__closure__
                if not cells or isinstance(kernel._cache, NullCache):
                    continue
                closures += 1
                kinds = [type(c.cell_contents).__name__ for c in cells if not isinstance(c.cell_contents, PLAIN)]
                if kinds:
                    bad.append(f"{info.name}.{name} ({kernel.py_func.__name__}): cells of {kinds}")
    assert closures >= 10, f"only {closures} cached closure kernels found: the walk no longer sees them"
    assert not bad, bad


def test_a_cache_directory_is_filled_under_a_lock_then_marked(tmp_path, monkeypatch):
    """``_filling``: while one process imports the kernels into a directory not yet filled, it holds
    the directory's exclusive lock, which another opener of the lock file can take neither
    exclusive nor shared; on success the directory is marked filled, and later loads take no
    exclusive lock."""
    import fcntl
    import os

    from hal.backends.numba_kernels import lazy
    monkeypatch.setattr(package, "CACHE", tmp_path)
    monkeypatch.setattr(lazy, "LOCK", lazy.DirectoryLock(tmp_path / ".lock"))
    with package._filling() as held:
        assert held
        other = os.open(tmp_path / ".lock", os.O_RDWR)
        try:
            for kind in (fcntl.LOCK_EX, fcntl.LOCK_SH):
                with pytest.raises(BlockingIOError):
                    fcntl.flock(other, kind | fcntl.LOCK_NB)
            with lazy.LOCK.hold(exclusive=False):  # re-entrant: a shared use inside the fill keeps it exclusive
                with pytest.raises(BlockingIOError):
                    fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)
        finally:
            os.close(other)
    assert (tmp_path / package.FILLED_MARKER).exists()
    with package._filling() as again:
        assert not again
    (tmp_path / package.FILLED_MARKER).unlink()
    with pytest.raises(RuntimeError):
        with package._filling():
            raise RuntimeError("an import failed")
    assert not (tmp_path / package.FILLED_MARKER).exists()  # a failed fill is not marked


def test_shared_holders_exclude_an_exclusive_one_and_a_fork_has_its_own_lock(tmp_path):
    import fcntl
    import os

    from hal.backends.numba_kernels import lazy
    lock = lazy.DirectoryLock(tmp_path / ".lock")
    other = os.open(tmp_path / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        with lock.hold(exclusive=False) as held:
            assert held
            fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)  # loads share it
            fcntl.flock(other, fcntl.LOCK_UN)
            pid = os.fork()
            if pid == 0:  # the child's exclusive hold must wait for its parent's shared one
                try:
                    with lock.hold(exclusive=True):
                        os._exit(0)
                except BaseException:
                    os._exit(3)
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the child took the lock its parent holds"
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released
    finally:
        os.close(other)


def test_a_second_installation_of_the_same_sources_has_its_own_cache_directory(tmp_path):
    """numba files kernels under their source's path: a copy of the package elsewhere loads none of
    this one's, so it must not find this directory's FILLED_MARKER."""
    import shutil
    here = pathlib.Path(package.__file__).parent
    copy = tmp_path / "site-packages" / "nnhal" / "hal" / "backends" / "numba_kernels"
    shutil.copytree(here, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert package._sources_digest() == package._sources_digest(here) == pathlib.Path(package.CACHE).name
    assert package._sources_digest(copy) != package._sources_digest(here)
    before = package._sources_digest(copy)
    (copy / "lazy.py").write_text((copy / "lazy.py").read_text() + "\n")
    assert package._sources_digest(copy) != before  # an edit: a directory of its own too
