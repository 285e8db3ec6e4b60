"""Compute backends: who runs an operation, kept apart from what the operation is.

An operation's spec (``hal/operations/``) says what NNAPI requires and what shape comes out; a
backend says how to compute it. A backend has a name, a version and kernels keyed by operation
code. A :class:`Kernel` has

* ``plan(ctx) -> data``: precomputed at prepareModel (packed weights, multipliers, gather
  indices), stored as ``ctx.data`` and in the compilation cache;
* ``execute(ctx, inputs) -> outputs``: the arithmetic, reading ``ctx.data`` only;
* what it runs: the input-0 ``types`` (None: every type the spec defines) and an optional
  ``supports(ctx) -> reason | None`` for parameters it cannot take;
* ``prepacked_inputs``: positions whose constant value plan packed, so the cache stores only the
  packed form.

The compiler gives each operation to the first backend in the preference order whose kernel
takes it. ``reference`` (numpy, the living definition of every operation, bit-exact with TFLite's
reference kernels) is always last: the fallback, and the oracle fast backends are tested against
(ARM NN's CpuRef, tinygrad's Python backend). The order comes from ``set_preference`` (``nnhal
serve --backend``), else ``$NNHAL_BACKENDS`` (comma-separated names), else every available
backend by priority. A vendor extension's kernels form one more backend, named after the
extension, which alone runs that extension's operations.

A backend's identity (name, version, digest of its modules' files) goes into every cache entry
that uses it: editing one backend invalidates only the entries compiled with it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib
import os
import pathlib
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from hal.errors import HalError
from hal.extension_registry import file_digest
from hal.registry import OperandInfo, OperationContext
from hal.types import ErrorStatus, OperandType, OperationType, type_name

ENV_VAR = "NNHAL_BACKENDS"
REFERENCE = "reference"

Plan = Callable[[OperationContext], Any]
Execute = Callable[[OperationContext, list], list]
Supports = Callable[[OperationContext], "str | None"]


@dataclass(frozen=True)
class Kernel:
    """One backend's implementation of one operation code (or of several sharing it)."""

    backend: str
    plan: Plan
    execute: Execute
    types: tuple[int, ...] | None = None  # input-0 operand types; None = all the spec defines
    supports: Supports | None = None
    prepacked_inputs: tuple[int, ...] = ()
    #: False: the kernel is written for float32 and runs float16 operations through
    #: ``via_float32`` (NNAPI's CPU path: widen, compute in float32, round the outputs once).
    native_float16: bool = False

    def for_context(self, ctx: OperationContext) -> "Kernel":
        """The kernel to run ``ctx`` with: itself, or its float32 adapter for float16 operands."""
        if self.native_float16 or not has_float16(ctx):
            return self
        return via_float32(self)

    def runs_type(self, operand_type: int) -> bool:
        return self.types is None or operand_type in self.types

    def unsupported(self, ctx: OperationContext) -> str | None:
        """Why this kernel cannot take this operation as prepared, or None."""
        if ctx.inputs and ctx.inputs[0] is not None and not self.runs_type(ctx.inputs[0].type):
            return f"input type {type_name(ctx.inputs[0].type)} is not implemented"
        if self.supports is not None:
            return self.supports(ctx)
        return None


#: float16 operand types and the float32 type a widened context gives them.
FLOAT16_TO_FLOAT32 = {OperandType.TENSOR_FLOAT16: OperandType.TENSOR_FLOAT32, OperandType.FLOAT16: OperandType.FLOAT32}


def has_float16(ctx: OperationContext) -> bool:
    return any(info is not None and info.type in FLOAT16_TO_FLOAT32 for info in (*ctx.inputs, *ctx.outputs))


def _widen(info: OperandInfo | None) -> OperandInfo | None:
    if info is None or info.type not in FLOAT16_TO_FLOAT32:
        return info
    value = None if info.value is None else info.value.astype(np.float32)  # exact: every half is a float
    return dataclasses.replace(info, type=FLOAT16_TO_FLOAT32[info.type], value=value)


def float32_view(ctx: OperationContext) -> OperationContext:
    """``ctx`` as the float32 operation it widens to: every float16 operand (tensor or scalar)
    retyped float32, constant values widened; params, data and backend shared."""
    view = OperationContext(ctx.index, ctx.op_type, [_widen(i) for i in ctx.inputs],
                            [_widen(o) for o in ctx.outputs])
    view.output_shapes = list(ctx.output_shapes)
    view.params, view.data, view.backend, view.packing = ctx.params, ctx.data, ctx.backend, ctx.packing
    return view


@functools.lru_cache(maxsize=None)
def via_float32(kernel: Kernel) -> Kernel:
    """A float32 kernel run on float16 operations as AOSP's CPU driver runs most of them: inputs
    widened to float32, the float32 kernel, each float16 output rounded to nearest once. CTS judges
    float16 results with 5·2⁻¹⁰ tolerances, which one rounding always meets where float32 does."""
    def plan(ctx: OperationContext) -> Any:
        return kernel.plan(float32_view(ctx))

    def execute(ctx: OperationContext, inputs: list) -> list:
        args = [x.astype(np.float32) if x is not None and x.dtype == np.float16 else x for x in inputs]
        outs = kernel.execute(float32_view(ctx), args)
        return [o.astype(np.float16) if info.type in FLOAT16_TO_FLOAT32 else o for o, info in zip(outs, ctx.outputs)]

    plan.__qualname__ = execute.__qualname__ = f"via_float32({getattr(kernel.execute, '__qualname__', '?')})"
    supports = None if kernel.supports is None else (lambda ctx: kernel.supports(float32_view(ctx)))
    return dataclasses.replace(kernel, plan=plan, execute=execute, supports=supports, native_float16=True)


class Backend:
    """A named set of kernels. ``modules`` are the Python modules (packages include every module
    under them) whose code defines the backend: its identity hashes their files, and the cache's
    deserialiser admits their plan-data types, nothing else outside hal's core."""

    def __init__(self, name: str, version: str, modules: Iterable[str] = (), *, priority: int = 0,
                 description: str = "", extension: str | None = None):
        if not name or "," in name or ":" in name:
            raise ValueError(f"bad backend name {name!r}")
        self.name = name
        self.version = version
        self.modules = tuple(modules)
        self.priority = priority
        self.description = description
        #: For a vendor extension's backend: the extension whose operations it runs (keys are types
        #: within the extension, since prefixes are assigned per model).
        self.extension = extension
        self.kernels: dict[int, Kernel] = {}
        self._identity: str | None = None

    def register(self, op_types: OperationType | int | Iterable[OperationType | int], *, plan: Plan,
                 execute: Execute, types: Iterable[int] | None = None, supports: Supports | None = None,
                 prepacked_inputs: Iterable[int] = (), native_float16: bool = False) -> None:
        """``native_float16``: the kernel computes float16 operands itself (else float16
        operations reach it widened to float32: see ``via_float32``)."""
        if isinstance(op_types, int):
            op_types = [op_types]
        for t in op_types:
            if int(t) in self.kernels:
                raise RuntimeError(f"backend {self.name}: operation {t} registered twice")
            self.kernels[int(t)] = Kernel(self.name, plan, execute, None if types is None else tuple(types),
                                          supports, tuple(prepacked_inputs), native_float16)
        self._identity = None

    def kernel(self, op_type: int) -> Kernel | None:
        return self.kernels.get(int(op_type))

    def takes(self, op_type: int, operand_type: int) -> bool:
        """Whether it runs this operation code for this input-0 type (parameters aside)."""
        k = self.kernel(op_type)
        return k is not None and k.runs_type(operand_type)

    def owns_module(self, module: str) -> bool:
        return any(module == m or module.startswith(m + ".") for m in self.modules)

    def source_files(self) -> list[tuple[str, str | None]]:
        """(name, path) of every file that defines the backend: a package's whole directory
        (every Python source or compiled module under it), a plain module's file."""
        files: list[tuple[str, str | None]] = []
        for m in self.modules:
            mod = sys.modules.get(m)
            if mod is None:
                try:
                    mod = importlib.import_module(m)
                except ImportError:
                    files.append((m, None))
                    continue
            paths = getattr(mod, "__path__", None)
            if paths:  # a package: everything under it, so an edit in any submodule counts
                for root in paths:
                    base = pathlib.Path(root)
                    for p in sorted(base.rglob("*")):
                        if p.suffix in (".py", ".so", ".pyd") and "__pycache__" not in p.parts:
                            files.append((f"{m}/{p.relative_to(base).as_posix()}", str(p)))
            else:
                files.append((m, getattr(mod, "__file__", None)))
        return files

    def identity(self) -> str:
        """``name@version+digest``: what a cached plan of this backend was computed by."""
        if self._identity is None:
            h = hashlib.sha256(f"{self.name}|{self.version}".encode())
            for name, path in self.source_files():
                h.update(f"|{name}:".encode() + file_digest(path))
            self._identity = f"{self.name}@{self.version}+{h.hexdigest()[:16]}"
        return self._identity


class ExtensionBackend(Backend):
    """The kernels of one vendor extension. Its identity is the extension's (types, operation codes,
    implementing modules' files: ``hal.extension_registry.extension_identity``), so re-registering the
    extension with other types or code invalidates what was compiled with it."""

    def __init__(self, extension: str, version: str):
        super().__init__(extension, version, extension=extension)

    def _types(self):
        from hal.extension_registry import extension
        return extension(self.extension)

    def owns_module(self, module: str) -> bool:
        from hal.extension_registry import extension_modules
        ext = self._types()
        return ext is not None and module in extension_modules(ext)

    def identity(self) -> str:
        from hal.extension_registry import extension_identity
        return extension_identity(self.extension) or "<not loaded>"


_lock = threading.RLock()
_BACKENDS: dict[str, Backend] = {}
_preference: tuple[str, ...] | None = None
#: Backends shipped with nnhal, imported on first use (kernels never load with the specs alone).
_BUILTIN_MODULES = ("hal.backends.reference", "hal.backends.numba_kernels", "hal.backends.ort")
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
    """The preference order in force."""
    with _lock:
        order = _preference
    if order is not None:
        return order
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return parse_preference(env)
    return tuple(b.name for b in available())


def candidates(order: Iterable[str] | None = None) -> list[Backend]:
    """Backends to try for a builtin operation, in order; reference always last."""
    names = preference() if order is None else parse_preference(order)
    out = [b for n in names if (b := get(n)) is not None]
    return out


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
    from hal.registry import registrations
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


__all__ = ["Backend", "ExtensionBackend", "Kernel", "REFERENCE", "available", "candidates", "ensure_loaded",
           "extension_backend", "get", "parse_preference", "preference", "register_backend", "runs",
           "set_preference", "support_matrix", "unregister_backend"]
