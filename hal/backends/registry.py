"""The backend registry: which backends exist (built-in ones imported on first use, vendor
extensions' registered by them) and which operations and types their kernels take. Which of them
runs a model, in what order, with how many threads, is policy: ``hal.backends.policy``."""
from __future__ import annotations

import importlib
import threading
from typing import Iterable

from hal.backends.backend import Backend
from hal.registry import registrations

REFERENCE = "reference"

_lock = threading.RLock()
_BACKENDS: dict[str, Backend] = {}
#: Backends shipped with nnhal, imported on first use (kernels never load with the specs alone).
_BUILTIN_MODULES = ("hal.backends.reference", "hal.backends.numba_kernels", "hal.backends.ort", "hal.backends.cuda")
_loaded = False


def register_backend(backend: Backend) -> Backend:
    with _lock:
        _BACKENDS[backend.name] = backend
    return backend


def unregister_backend(name: str) -> None:
    if name == REFERENCE:
        raise ValueError("the reference backend cannot be removed")
    with _lock:
        _BACKENDS.pop(name, None)


def ensure_loaded() -> None:
    """Import the built-in backends once (thread-safe). A backend whose dependencies are missing
    is simply not available; the reference backend always is."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        for module in _BUILTIN_MODULES:
            try:
                importlib.import_module(module)
            except ImportError:
                if module.endswith("." + REFERENCE):
                    raise
        _loaded = True


def get(name: str) -> Backend | None:
    ensure_loaded()
    with _lock:
        return _BACKENDS.get(name)


def available() -> list[Backend]:
    """Every registered backend that runs builtin operations, best priority first, reference last."""
    ensure_loaded()
    with _lock:
        found = [b for b in _BACKENDS.values() if b.extension is None]
    return sorted(found, key=lambda b: (b.name == REFERENCE, -b.priority, b.name))


def runs(spec, operand_type: int, order: Iterable[Backend] | None = None) -> list[str]:
    """Names of the backends (of ``order``, default: all available) with a kernel for this spec and
    input type."""
    found = []
    for b in (available() if order is None else order):
        if b.takes(spec.type, operand_type):
            found.append(b.name)
    return found


def support_matrix() -> list[tuple[object, tuple[int, ...]]]:
    """(spec, input-0 types) for every builtin operation some backend runs: what the specs define
    and the kernels implement, in common. The support table (``nnhal ops``) and the capabilities
    fingerprint come from here."""
    rows = []
    for spec in registrations():
        types = tuple(t for t in spec.input_types or () if runs(spec, t))
        if types:
            rows.append((spec, types))
    return rows


def extension_backend(extension: str) -> Backend | None:
    with _lock:
        b = _BACKENDS.get(extension)
    return b if b is not None and b.extension == extension else None
