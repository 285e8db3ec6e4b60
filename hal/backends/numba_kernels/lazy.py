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
backend. A process loads from the directory under a shared lock and compiles into it under an
exclusive one (``LOCK``), so that a kernel missing from a filled directory is compiled by one of
the processes that need it at once, and the others load it.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import pathlib
import sys
import types

from numba.core import config, sigutils, typeinfer
from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import CPUDispatcher

try:
    import fcntl
except ImportError:  # not a POSIX system: nothing is locked
    fcntl = None

#: Compile every kernel when it is declared (a cache not yet filled); set by the package.
EAGER = True


class DirectoryLock:
    """An ``flock`` on the cache directory's lock file, shared or exclusive, re-entrant within the
    process (one descriptor per process: an exclusive hold covers the shared ones inside it).

    Why: numba's cache is not safe for processes writing it at once. Each picks a data file's number
    from the index it read, so two processes saving two kernels of one index (a function's several
    signatures, a factory's closures) can both take number 1, and a third then loads one under the
    other's entry (a test run's workers and services compiling together once computed garbage that
    way); and numba writes an index before its data file. So a process compiles into the directory
    only under the exclusive lock (filling it, mending a kernel), and loads from it under the shared
    one. Where the lock file cannot be made, nothing is locked (numba then does not save either)."""

    def __init__(self, path: pathlib.Path | None = None):
        self.path = path
        self._fd: int | None = None
        self._pid = 0
        self._level = 0  # 0 not held, 1 shared, 2 exclusive

    @contextlib.contextmanager
    def hold(self, exclusive: bool):
        """Hold the lock (shared, or ``exclusive``) for the block; yields whether it is held."""
        level = 2 if exclusive else 1
        if self._level >= level:
            yield True
            return
        if not self._open():
            yield False
            return
        previous = self._level
        fcntl.flock(self._fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        self._level = level
        try:
            yield True
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_SH if previous else fcntl.LOCK_UN)
            self._level = previous

    def _open(self) -> bool:
        if self._pid != os.getpid():  # a forked child shares its parent's descriptor, and so its lock
            self._fd, self._level, self._pid = None, 0, os.getpid()
        if self._fd is None and self.path is not None and fcntl is not None:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError:
                self.path = None
        return self._fd is not None


#: The cache directory's lock; the package names its file.
LOCK = DirectoryLock()

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
                with LOCK.hold(exclusive=False):
                    missing = [sig for sig in self._declared_signatures if not self._load(sig)]
                if missing:  # not in the cache, or unreadable there: compiled by one process at a time
                    with LOCK.hold(exclusive=True):
                        for sig in missing:
                            self._load_or_mend(sig)
            self.disable_compile()
            self._pending = False

    def _load(self, sig) -> bool:
        """Load ``sig`` from the cache as numba's ``compile`` does; False where it is not there or
        cannot be read (both left to ``_load_or_mend``)."""
        try:
            cres = self._cache.load_overload(sig, self.targetctx)
        except Exception:  # noqa: BLE001 - whatever unpickling a bad file raises
            return False
        if cres is None:
            return False
        self._cache_hits[sig] += 1
        self.targetctx.insert_user_function(cres.entry_point, cres.fndesc, [cres.library])
        self.add_overload(cres)
        return True

    def _load_or_mend(self, sig) -> None:
        """numba's ``compile``: the cache again (another process may have saved ``sig`` while this one
        waited for the lock), else a compilation, saved; unreadable files are removed first."""
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
