"""The numba backend's disk-cached kernels that are closures hold plain values only.

numba keys a cached closure on its cells' pickle. A cell holding a compiled function (a
dispatcher) pickles differently in every process, so such a kernel is compiled again at every
service start, and concurrent starts rewrite one cache index under each other (a driver of
f32_expand.py once did, and loaded a driver compiled for another depthwise kernel: NaN outputs).
The closures here (per-batch, per-filter and per-kernel variants) must hold ints and bools."""
from __future__ import annotations

import importlib
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
    """``_FillLock``: while one process imports the kernels into a directory not yet filled, it
    holds an exclusive lock that another opener of the lock file cannot take; on success the
    directory is marked filled, and later loads take no lock."""
    import fcntl
    import os
    monkeypatch.setattr(package, "CACHE", tmp_path)
    with package._FillLock() as held:
        assert held.fd is not None
        other = os.open(tmp_path / ".fill.lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    assert (tmp_path / package.FILLED_MARKER).exists()
    with package._FillLock() as again:
        assert again.fd is None
    (tmp_path / package.FILLED_MARKER).unlink()
    with pytest.raises(RuntimeError):
        with package._FillLock():
            raise RuntimeError("an import failed")
    assert not (tmp_path / package.FILLED_MARKER).exists()  # a failed fill is not marked
