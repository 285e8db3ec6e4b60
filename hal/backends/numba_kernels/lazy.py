"""Kernels declared with their exact signatures, loaded from numba's cache when first used.

``numba.njit(signatures, cache=True)`` compiles (or loads from the cache) every signature when the
decorator runs, so importing this package loaded all of its kernels: about 130 cached libraries,
seconds of a process's start (each is parsed, linked and mapped), in every ``nnhal serve``, every
tool that starts a service, every test's service, whether or not its models ever reach them.

``njit`` here declares the same dispatcher with the same signatures, and what it does with them
depends on the cache (``EAGER``, which the package sets before importing its kernel modules):
- a cache directory not yet filled (a first start on a machine, after an edit): each kernel is
  compiled when declared, as numba's own decorator does, so that no execution ever compiles;
- a filled one: nothing is loaded until the kernel is first used: called from Python (a plan, a
  binding, an execution), typed by a kernel being compiled, or resolved by the native chain
  (``materialize``). Then all of its declared signatures are loaded at once, and it compiles no
  other, exactly as an eager kernel: a call with other types is the same TypeError.

A kernel whose cache files cannot be read (truncated, corrupt, written by another numba) loses
them and is compiled again, once, with a warning: it costs that kernel a compilation, never the
backend.
"""
from __future__ import annotations

import functools
import logging
import pathlib
import sys
import types

from numba.core import config, sigutils, typeinfer
from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import CPUDispatcher

#: Compile every kernel when it is declared (a cache not yet filled); set by the package.
EAGER = True

_declared: list[LazyDispatcher] = []


class LazyDispatcher(CPUDispatcher):
    """numba's CPU dispatcher with its signatures loaded on first use (see the module)."""

    _declared_signatures: tuple = ()
    _pending: bool = False

    def materialize(self) -> None:
        """Load (compile where the cache lacks them) every declared signature; then compile no more."""
        if not self._pending:
            return
        with global_compiler_lock:
            if not self._pending:
                return
            with typeinfer.register_dispatcher(self):
                for sig in self._declared_signatures:
                    self._load_or_mend(sig)
            self.disable_compile()
            self._pending = False

    def _load_or_mend(self, sig) -> None:
        try:
            super().compile(sig)
        except Exception as e:  # noqa: BLE001 - numba raises whatever unpickling a bad file raises
            stale = self._cache_files()
            if not stale:
                raise  # not the cache: a kernel that does not compile
            logging.getLogger("nnhal.backends").warning(
                "numba cache of %s.%s unreadable (%r): recompiling it", self.py_func.__module__,
                self.py_func.__qualname__, e)
            for f in stale:
                f.unlink(missing_ok=True)
            super().compile(sig)

    def _cache_files(self) -> list[pathlib.Path]:
        """This function's index and data files (a factory's closures share them)."""
        cache_file = getattr(self._cache, "_cache_file", None)  # None: caching off (an unwritable directory)
        if cache_file is None:
            return []
        index = pathlib.Path(cache_file._index_path)
        stem = index.name[:-len(".nbi")]
        return [f for f in index.parent.glob(stem + ".*") if f.suffix in (".nbi", ".nbc")]

    # numba's three ways into a dispatcher that has no overload for a call yet:
    def _compile_for_args(self, *args, **kws):  # a call from Python finding no overload
        if self._pending:
            self.materialize()
            return self  # what numba's dispatcher then calls: the declared signatures, or its TypeError
        return super()._compile_for_args(*args, **kws)

    def get_call_template(self, args, kws):  # typing a call from a kernel being compiled
        self.materialize()
        return super().get_call_template(args, kws)

    def compile(self, sig):  # an explicit compilation: numba's, or a caller's
        if self._pending:
            self.materialize()
            args, _ = sigutils.normalize_signature(sig)
            if tuple(args) in self.overloads:
                return self.overloads[tuple(args)].entry_point
        return super().compile(sig)


def njit(signatures, **options):
    """``numba.njit(signatures, cache=True, **options)``, loaded from the cache on first use where
    the cache is filled (see the module). ``signatures``: one or a list, as numba takes them."""
    sigs = tuple(signatures) if isinstance(signatures, list) else (signatures,)
    if not sigs or not all(sigutils.is_signature(s) for s in sigs):
        raise TypeError(f"declare a kernel's signatures: njit(signatures, ...), not {signatures!r}")
    if not options.pop("cache", True):
        raise ValueError("a lazily loaded kernel must be cached")
    options.update(nopython=True, boundscheck=options.get("boundscheck"))

    def declare(fn) -> LazyDispatcher:
        if config.DISABLE_JIT:  # $NUMBA_DISABLE_JIT: numba's decorator returns the Python function too
            return fn
        disp = LazyDispatcher(py_func=fn, locals={}, targetoptions=options)
        disp.enable_caching()
        disp._declared_signatures = sigs
        disp._pending = True
        _declared.append(disp)
        if EAGER:
            disp.materialize()
        return disp
    return declare


def materialize(dispatcher) -> None:
    """Load ``dispatcher``'s declared signatures now where it is a lazily loaded kernel."""
    if isinstance(dispatcher, LazyDispatcher):
        dispatcher.materialize()


def _modules_of(fn, package: str, found: set[str], depth: int = 0) -> None:
    """The package's modules whose functions ``fn`` is or calls through its closure (a kernel made
    of others: hal.backends.kernel's ``by_input_type``, ``via_float32``)."""
    if fn is None or depth > 4:
        return
    if isinstance(fn, functools.partial):
        _modules_of(fn.func, package, found, depth + 1)
        return
    module = getattr(fn, "__module__", None) or ""
    if module.startswith(package + "."):
        found.add(module)
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        for part in (value, *(getattr(value, name, None) for name in ("plan", "execute", "bind"))):
            if callable(part):
                _modules_of(part, package, found, depth + 1)


def ready(kernels) -> None:
    """``Backend.ready``: load the kernels that ``kernels`` (a plan's steps') run, so that no
    execution loads one: every kernel their functions' modules declare or name, and those of the
    package's modules they name."""
    package = __name__.rpartition(".")[0]
    modules: set[str] = set()
    for k in kernels:
        for fn in (k.plan, k.execute, k.bind):
            _modules_of(fn, package, modules)
    named = set(modules)
    for name in modules:
        for value in vars(sys.modules[name]).values() if name in sys.modules else ():
            if isinstance(value, types.ModuleType) and value.__name__.startswith(package + "."):
                named.add(value.__name__)
            elif isinstance(value, LazyDispatcher):
                value.materialize()
    for d in _declared:
        if d._pending and d.py_func.__module__ in named:
            d.materialize()


def materialize_all() -> int:
    """Load every declared kernel (tests, warm-ups); the number of kernels."""
    for d in list(_declared):
        d.materialize()
    return len(_declared)


def pending() -> int:
    """How many declared kernels are not loaded yet."""
    return sum(d._pending for d in _declared)
