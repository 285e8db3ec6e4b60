"""Backend policy: the preference order the compiler tries backends in, and the threads kernels
may use. Apart from the registry (what exists) and the kernels (what runs), so a service's or a
tool's choices are made in one place."""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Iterable

from hal.backends.backend import Backend
from hal.backends.registry import REFERENCE, available, get
from hal.errors import HalError
from hal.types import ErrorStatus

ENV_VAR = "NNHAL_BACKENDS"

_lock = threading.Lock()
_preference: tuple[str, ...] | None = None


def parse_preference(spec: str | Iterable[str]) -> tuple[str, ...]:
    """Names from ``"numba,reference"`` (or a list), checked; reference is appended if absent."""
    names = [n.strip() for n in (spec.split(",") if isinstance(spec, str) else spec) if n.strip()]
    known = {b.name for b in available()}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise HalError(ErrorStatus.INVALID_ARGUMENT,
                       f"unknown backend {', '.join(map(repr, unknown))} (available: {', '.join(sorted(known))})")
    if len(set(names)) != len(names):
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"backend listed twice in {names}")
    if REFERENCE in names[:-1]:
        raise HalError(ErrorStatus.INVALID_ARGUMENT,
                       f"{REFERENCE!r} is the fallback of every order and must come last, got {','.join(names)}")
    if REFERENCE not in names:
        names.append(REFERENCE)
    return tuple(names)


def set_preference(spec: str | Iterable[str] | None) -> tuple[str, ...]:
    """Set this process's preference order (None: back to $NNHAL_BACKENDS / the default)."""
    global _preference
    order = None if spec is None else parse_preference(spec)
    with _lock:
        _preference = order
    return preference()


def preference() -> tuple[str, ...]:
    """The preference order in force (by default every available backend but the opt-in ones)."""
    with _lock:
        order = _preference
    if order is not None:
        return order
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return parse_preference(env)
    return tuple(b.name for b in available() if not b.opt_in)


def candidates(order: Iterable[str] | None = None) -> list[Backend]:
    """Backends to try for a builtin operation, in order; reference always last."""
    names = preference() if order is None else parse_preference(order)
    out = [b for n in names if (b := get(n)) is not None]
    return out


_compute_threads = 0


_thread_limit = threading.local()


def compute_threads() -> int:
    """The thread count ``set_compute_threads`` set (0: never set; onnxruntime then uses 1 intra-op
    thread), within this thread's ``thread_limit``. Graph backends read it when they compile or
    load a partition."""
    limit = getattr(_thread_limit, "n", None)
    return _compute_threads if limit is None else min(_compute_threads or limit, limit)


@contextlib.contextmanager
def thread_limit(n: int | None):
    """At most ``n`` threads for what graph backends compile in this thread meanwhile (the service:
    1 for a LOW_POWER model, NNAPI's "prefer a single core"). None: no limit."""
    previous = getattr(_thread_limit, "n", None)
    _thread_limit.n = n
    try:
        yield
    finally:
        _thread_limit.n = previous


def set_compute_threads(n: int | None) -> int:
    """Threads a kernel may use (the BLAS GEMMs; numba's parallel regions): ``n``, or every core
    for None / 0. Process-wide, so the service sets it once at start (``nnhal serve --threads``):
    operations run concurrently on the service's worker threads anyway."""
    global _compute_threads
    n = n or os.cpu_count() or 1
    _compute_threads = n
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(limits=n, user_api="blas")
    except ImportError:  # without threadpoolctl BLAS keeps its own default (every core)
        pass
    numba = sys.modules.get("numba")
    if numba is not None:
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    return n
