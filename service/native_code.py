"""Small native functions for transports' steady paths: LLVM IR built with llvmlite and compiled
in this process (MCJIT), once per process.

Why: a steady local-burst invoke from TFLite through Python (a ctypes callback, the kernel's
checks, the slot copies, the doorbell, the wait) cost 30-70 us per invoke on a 2-vCPU virtual
machine, more than a small model's whole execution. The same steps as native code need no GIL
and no Python object. llvmlite comes with numba (a dependency); its binding alone imports in a
fraction of numba's time, and a client process needs nothing else of it.

Native code here calls nothing by symbol: the C library's functions (the clock, sched_yield,
send) are passed in as addresses, as ``hal.backends.numba_kernels.native_chain`` does. Where any
of this is unavailable (not x86-64 Linux, no llvmlite, ``NNHAL_NATIVE_INVOKE=0``), ``available``
is False and callers keep their Python path.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform
import threading

log = logging.getLogger("nnhal.service")

#: Set to 0 to keep every transport on its Python path (a diagnosis, an A/B measurement).
ENV = "NNHAL_NATIVE_INVOKE"

_lock = threading.Lock()
_engines: list = []  # compiled modules' engines: their code lives as long as the process


def enabled() -> bool:
    """Whether native steady paths may be used here: x86-64 Linux (the doorbell's memory order,
    ``service.doorbell``), not turned off by ``NNHAL_NATIVE_INVOKE=0``."""
    return (os.environ.get(ENV, "1") != "0" and platform.system() == "Linux"
            and platform.machine().lower() in ("x86_64", "amd64"))


@functools.lru_cache(maxsize=None)
def libc_address(name: str) -> int | None:
    """The address of the C library's function ``name`` (None: not found)."""
    try:
        return ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value
    except (AttributeError, OSError):
        return None


def compile_ir(module) -> "Compiled | None":
    """``module`` (an ``llvmlite.ir.Module``) compiled for this CPU; None where it cannot be
    (llvmlite missing or failing: said once in the log)."""
    with _lock:
        try:
            import llvmlite.binding as llvm

            _initialize(llvm)
            parsed = llvm.parse_assembly(str(module))
            parsed.verify()
            target = llvm.Target.from_default_triple()
            machine = target.create_target_machine(opt=2)
            engine = llvm.create_mcjit_compiler(parsed, machine)
            engine.finalize_object()
        except Exception as e:  # noqa: BLE001 - the Python path serves instead
            log.warning("native code unavailable (%s: %s); keeping the Python path", type(e).__name__, e)
            return None
        _engines.append(engine)
        return Compiled(engine)


@functools.lru_cache(maxsize=None)
def _initialize(llvm) -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


class Compiled:
    """A compiled module: its functions' addresses."""

    def __init__(self, engine) -> None:
        self._engine = engine

    def address(self, name: str) -> int:
        address = self._engine.get_function_address(name)
        if not address:
            raise LookupError(f"no native function {name!r}")
        return address


__all__ = ["ENV", "Compiled", "compile_ir", "enabled", "libc_address"]
