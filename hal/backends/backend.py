"""Backend: a named, versioned set of kernels, and its identity (what a cached plan was computed by)."""
from __future__ import annotations

import hashlib
import importlib
import pathlib
import sys
from typing import Callable, Iterable

from hal.backends.kernel import Bind, Execute, Kernel, Plan, Supports, by_input_type
from hal.extension_registry import extension, extension_identity, extension_modules, file_digest
from hal.types import OperationType


class Backend:
    """A named set of kernels. ``modules`` are the Python modules (packages include every module
    under them) whose code defines the backend: its identity hashes their files, and the cache's
    deserialiser admits their plan-data types, nothing else outside hal's core."""

    def __init__(self, name: str, version: str, modules: Iterable[str] = (), *, priority: int = 0,
                 description: str = "", extension: str | None = None, opt_in: bool = False):
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
        #: Not in the default preference order: only where an order names it (a backend on a stand-in
        #: device, such as the cuda backend on torch's CPU device for tests).
        self.opt_in = opt_in
        self.kernels: dict[int, Kernel] = {}
        #: Kernels for operation patterns this backend runs as one step (``hal.fusion``), by name:
        #: several per pattern where modules for different operand types fuse it (tried in order).
        self.fusions: dict[str, tuple[Kernel, ...]] = {}
        #: Kernels for a vendor extension's operations, by (extension name, type within it): a
        #: faster way to compute what the extension's own kernel defines (which stays the fallback).
        self.extension_kernels: dict[tuple[str, int], Kernel] = {}
        #: ``chain(runners) -> runners``: consecutive bound steps' zero-argument runners of this
        #: backend (``Kernel.bind``'s) as equivalent runners, fewer where the backend can make
        #: several calls as one (``hal.bound_program``); None: each runner is called.
        self.chain: Callable[[list[Callable[[], object]]], list[Callable[[], object]]] | None = None
        #: ``ready(kernels)``: called with the kernels of a plan's steps once the plan is made or
        #: loaded from the compilation cache (``hal.compiler.ready``): a backend that loads its code
        #: when first used loads what they run, so that no execution does; None: nothing to load.
        self.ready: Callable[[list[Kernel]], None] | None = None
        #: ``loop(condition runners, flag, body runners, copies)``: a bound WHILE's trips as one
        #: call of this backend's (``hal.bound_loop``): ``run(until_ns)`` runs the condition's
        #: runners, stops when ``flag[0]`` is false, else runs the body's and copies each (dst,
        #: src) pair, and again, reading the clock (time.monotonic_ns's) before each trip; it
        #: answers hal.bound_loop's DONE, LATE or FAILED + the failed call, ``run.trips`` the trips
        #: made. None from it, or no hook: the trips are a Python loop.
        self.loop: Callable | None = None
        #: Graph backend name -> operand types for which this per-operation backend takes that
        #: graph backend's whole run of operations when it plans every one of them (hal.compiler's
        #: ``_whole_run_instead``): where it was measured faster on them than that engine.
        self.takes_runs: dict[str, frozenset[int]] = {}
        #: Operation codes whose presence leaves a run with its graph backend even so: where that
        #: engine was measured faster on the runs that hold them.
        self.leaves_runs_with: frozenset[int] = frozenset()
        self._identity: str | None = None

    def register(self, op_types: OperationType | int | Iterable[OperationType | int], *, plan: Plan,
                 execute: Execute, types: Iterable[int] | None = None, supports: Supports | None = None,
                 prepacked_inputs: Iterable[int] = (), native_float16: bool = False,
                 bind: Bind | None = None) -> None:
        """``native_float16``: the kernel computes float16 operands itself (else float16
        operations reach it widened to float32: see ``via_float32``). ``bind``: see ``Kernel.bind``.
        An operation may be registered again for other input types (a module of float kernels
        beside one of quantized kernels): see ``by_input_type``."""
        if isinstance(op_types, int):
            op_types = [op_types]
        for t in op_types:
            kernel = Kernel(self.name, plan, execute, None if types is None else tuple(types), supports,
                            tuple(prepacked_inputs), native_float16, bind)
            if int(t) in self.kernels:
                kernel = by_input_type(self.kernels[int(t)], kernel)
                if kernel is None:
                    raise RuntimeError(f"backend {self.name}: operation {t} registered twice")
            self.kernels[int(t)] = kernel
        self._identity = None

    def register_fusion(self, pattern: str, *, plan: Plan, execute: Execute, bind: Bind | None = None) -> None:
        """Run ``pattern`` (one of ``hal.fusion.PATTERNS``) as one step: ``plan(ctx)`` gets a
        ``hal.fusion.FusedContext`` whose members are the pattern's steps as this backend planned
        them, and returns the fused step's data, or None to leave the operations as they are. A
        pattern may be registered again (a module of float kernels beside one of quantized
        kernels): each plan is offered the pattern in turn, the first to return data runs it."""
        if any(k.plan is plan for k in self.fusions.get(pattern, ())):
            raise RuntimeError(f"backend {self.name}: fusion {pattern!r} registered twice with one plan")
        self.fusions[pattern] = (*self.fusions.get(pattern, ()), Kernel(self.name, plan, execute, bind=bind))
        self._identity = None

    def register_extension_kernel(self, extension: str, op_type: int, *, plan: Plan, execute: Execute,
                                  supports: Supports | None = None, prepacked_inputs: Iterable[int] = (),
                                  bind: Bind | None = None) -> None:
        """Run operation ``op_type`` (its code within ``extension``) of a vendor extension; the
        extension's own backend stays next in line (and is what the kernel must equal)."""
        self.extension_kernels[(extension, int(op_type))] = Kernel(self.name, plan, execute, None, supports,
                                                                   tuple(prepacked_inputs), bind=bind)
        self._identity = None

    def kernel(self, op_type: int) -> Kernel | None:
        return self.kernels.get(int(op_type))

    def kernel_for(self, op_type: int, extension: str | None = None) -> Kernel | None:
        """The kernel for a builtin operation (``extension`` None), or for operation ``op_type``
        of ``extension``: this backend's own if it is that extension's, else one it registered."""
        if extension is None or extension == self.extension:
            return self.kernels.get(int(op_type))
        return self.extension_kernels.get((extension, int(op_type)))

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
        return extension(self.extension)

    def owns_module(self, module: str) -> bool:
        ext = self._types()
        return ext is not None and module in extension_modules(ext)

    def identity(self) -> str:
        return extension_identity(self.extension) or "<not loaded>"
