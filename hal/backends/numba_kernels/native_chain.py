"""Consecutive bound steps of this backend as one native call (``Backend.chain``).

A bound step's runner is a zero-argument ``functools.partial`` of a compiled kernel (or an
``InOrder`` of several). Called from Python, each such call goes through numba's dispatcher: the
type of every argument worked out, an overload chosen, every array unboxed into a new structure,
then the native function: a cost per step that a model of many short steps pays many times. Here the
arguments are worked out once, at binding, into a block of 8-byte slots per call (an array: the
fields of numba's array structure, its data pointer included; a scalar: its value), and one native
loop calls each kernel's compiled function with them through a *trampoline* (one per compiled
kernel signature, made once per process: it loads the slots as that function's arguments and
calls it with numba's calling convention). The kernels are the same compiled code the dispatcher
calls, on the same arrays, so results are the same bytes.

``loop`` makes a bound WHILE's trips one native call the same way (hal.bound_loop): the
condition's calls, a test of its flag byte, the body's calls and a memcpy per carried value, the
clock (clock_gettime, time.monotonic_ns's clock) read before each trip so that the loop stops at
the limit it is given (LATE), as a Python loop would.

What cannot be called so stays a Python call, in its place in the order: a runner that is not a
partial of a compiled kernel (a thread pool's split, numpy's ``copyto``), an argument numba's
array and scalar models do not flatten to slots (a tuple of arrays, an object), a kernel that
returns a value. The binding holds its arrays, as the partials did. Threads: a step split over
threads is a Python call (``gemm._bound_split``); the loop itself runs without the GIL (ctypes
releases it), as the kernels (nogil) do.
"""
from __future__ import annotations

import ctypes
import functools
import struct
import threading
import time
from typing import Callable

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.core.compiler_lock import global_compiler_lock
from numba.core.dispatcher import Dispatcher
from numba.core.registry import cpu_target

from hal.backends.numba_kernels.lazy import materialize

_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
#: numba's return codes a call that returned normally gives (callconv.RETCODE_OK, RETCODE_NONE).
_RETURNED = (0, -2)
_RUN_NAME = "nnhal_native_chain_run"
_LOOP_NAME = "nnhal_native_loop"
#: hal.bound_loop's answers, as ``loop``'s native function gives them.
_DONE, _LATE, _FAILED = 0, 1, 2
#: The native loop's frame: 8-byte words (``NativeLoop``).
(_UNTIL, _N_COND, _COND_FNS, _COND_SLOTS, _FLAG, _N_BODY, _BODY_FNS, _BODY_SLOTS, _N_COPIES, _COPIES, _TRIPS,
 _CLOCK, _CLOCK_ID, _FRAME_WORDS) = range(14)

_lock = threading.Lock()
_trampolines: dict[int, tuple[object, int, tuple]] = {}  # id(cres) -> (cres, address, slot types)
_libraries: list = []  # the compiled trampoline modules, alive as long as the process
_run_address: int | None = None
_loop_address: int | None = None


class InOrder:
    """One zero-argument runner making ``calls`` in order; ``chain`` reads its calls one by one."""

    __slots__ = ("calls",)

    def __init__(self, calls) -> None:
        self.calls = tuple(calls)

    def __call__(self) -> None:
        for call in self.calls:
            call()


def chain(runners: list[Callable[[], object]]) -> list[Callable[[], object]]:
    """``runners`` (bound steps' runners, in order) as equivalent runners: each run of calls that
    can be made natively (two or more) as one ``NativeRun``, the others as they were. The
    trampolines the calls need and the process lacks are compiled together, in one module."""
    calls = list(_in_order(runners))
    resolved = [_resolve(c) for c in calls]
    _make_trampolines([r[0] for r in resolved if r is not None])
    natives = [None if r is None else _slots(*r) for r in resolved]
    out: list[Callable[[], object]] = []
    k = 0
    while k < len(calls):
        j = k
        while j < len(calls) and natives[j] is not None:
            j += 1
        if j - k >= 2:
            out.append(NativeRun(calls[k:j], natives[k:j]))
            k = j
        else:
            out.append(calls[k])
            k += 1
    return out


def _in_order(runners):
    """The calls ``runners`` make, in order (an ``InOrder``'s own, at any depth)."""
    for r in runners:
        if isinstance(r, InOrder):
            yield from _in_order(r.calls)
        else:
            yield r


class NativeRun:
    """Calls made by one native loop over their trampolines and argument slots."""

    __slots__ = ("calls", "_slots", "_table", "_run")

    def __init__(self, calls: list, natives: list[tuple[int, bytes]]) -> None:
        self.calls = calls  # holds the arrays whose addresses the slots hold
        sizes = [len(blob) for _, blob in natives]
        self._slots = np.frombuffer(b"".join(blob for _, blob in natives) or b"\0" * 8, dtype=np.uint8).copy()
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        base = self._slots.ctypes.data
        # row 0 the trampolines, row 1 their slots' addresses
        self._table = np.array([[addr for addr, _ in natives], list(base + starts)], dtype=np.int64)
        run = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)(_run_address)
        self._run = functools.partial(run, len(calls), self._table[0].ctypes.data, self._table[1].ctypes.data)

    def __call__(self) -> None:
        failed = self._run()
        if failed:
            raise RuntimeError(f"native call {failed - 1} of {len(self.calls)} failed")


def loop(cond_runners: list, flag: np.ndarray, body_runners: list, copies: list) -> "NativeLoop | None":
    """``Backend.loop``: the trips of a bound WHILE as one native call, or None where a call
    cannot be made natively (or the C library's clock cannot be called)."""
    cond_calls, body_calls = list(_in_order(cond_runners)), list(_in_order(body_runners))
    resolved = [_resolve(c) for c in cond_calls + body_calls]
    clock = _clock_address()
    if clock is None or any(r is None for r in resolved) or flag.dtype != np.bool_ or flag.size != 1 \
            or any(d.nbytes != s.nbytes or not (d.flags.c_contiguous and s.flags.c_contiguous) for d, s in copies):
        return None
    _make_trampolines([r[0] for r in resolved])
    natives = [_slots(*r) for r in resolved]
    if any(n is None for n in natives):
        return None
    return NativeLoop(cond_calls + body_calls, natives, len(cond_calls), flag, copies, clock)


def _clock_address() -> int | None:
    try:
        return ctypes.cast(ctypes.CDLL(None).clock_gettime, ctypes.c_void_p).value
    except (AttributeError, OSError):
        return None


class NativeLoop:
    """``loop``'s runner: ``run(until_ns)`` -> DONE, LATE or FAILED + k; ``trips``: trips made."""

    __slots__ = ("calls", "flag", "copies", "_slots", "_tables", "_frame", "_run")

    def __init__(self, calls: list, natives: list[tuple[int, bytes]], n_cond: int, flag: np.ndarray, copies: list,
                 clock: int) -> None:
        self.calls, self.flag, self.copies = calls, flag, copies  # held: the frame has their addresses
        sizes = [len(blob) for _, blob in natives]
        self._slots = np.frombuffer(b"".join(blob for _, blob in natives) or b"\0" * 8, dtype=np.uint8).copy()
        starts = self._slots.ctypes.data + np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        fns = [addr for addr, _ in natives]
        pairs = [(d.ctypes.data, s.ctypes.data, d.nbytes) for d, s in copies]
        self._tables = [np.array(t or [0], dtype=np.int64) for t in (
            fns[:n_cond], list(starts[:n_cond]), fns[n_cond:], list(starts[n_cond:]), [w for p in pairs for w in p])]
        frame = np.zeros(_FRAME_WORDS, np.int64)
        frame[_N_COND], frame[_N_BODY], frame[_N_COPIES] = n_cond, len(natives) - n_cond, len(copies)
        for at, table in zip((_COND_FNS, _COND_SLOTS, _BODY_FNS, _BODY_SLOTS, _COPIES), self._tables):
            frame[at] = table.ctypes.data
        frame[_FLAG], frame[_CLOCK], frame[_CLOCK_ID] = flag.ctypes.data, clock, time.CLOCK_MONOTONIC
        self._frame = frame
        run = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)(_loop_address)
        self._run = functools.partial(run, frame.ctypes.data)

    def __call__(self, until_ns: int) -> int:
        self._frame[_UNTIL] = until_ns
        return self._run()

    @property
    def trips(self) -> int:
        return int(self._frame[_TRIPS])


def _resolve(call) -> tuple[object, list] | None:
    """(the compiled overload, its flattened argument values) of a call made natively, or None."""
    if not isinstance(call, functools.partial) or not isinstance(call.func, Dispatcher) or call.keywords:
        return None
    cres = _overload(call.func, call.args)
    if cres is None or cres.signature.return_type != types.none:
        return None
    values: list = []
    for value, param in zip(call.args, cres.signature.args):
        flat = _flatten(param, value)
        if flat is None:
            return None
        values.extend(flat)
    return cres, values


def _slots(cres, values: list) -> tuple[int, bytes] | None:
    """(the trampoline's address, the argument slots) of a resolved call."""
    _, address, slot_types = _trampolines[id(cres)]
    if len(values) != len(slot_types):
        return None
    return address, b"".join(_slot(t, v) for t, v in zip(slot_types, values))


def _overload(dispatcher: Dispatcher, args: tuple):
    """The compiled overload a call with ``args`` runs: the one for exactly their types, else the
    one overload every argument's type converts to (None where several do: the dispatcher's
    choice among them is left to it, a Python call), compiled now where none does."""
    materialize(dispatcher)  # a kernel not used yet: its declared signatures, not the arguments' types
    try:
        argtys = tuple(dispatcher.typeof_pyval(a) for a in args)
    except (ValueError, TypeError):
        return None
    overloads = dict(dispatcher.overloads)
    if argtys in overloads:
        return overloads[argtys]
    typing = cpu_target.typing_context
    fits = [cres for sig, cres in overloads.items()
            if len(sig) == len(argtys) and all(typing.can_convert(a, p) is not None for a, p in zip(argtys, sig))]
    if fits:
        return fits[0] if len(fits) == 1 else None
    try:
        dispatcher.compile(argtys)
    except Exception:  # noqa: BLE001 - what the call would raise, it raises when made in Python
        return None
    return dispatcher.overloads.get(argtys)


def _flatten(param, value) -> list | None:
    """The slots' values of one argument, in the order numba's argument packer flattens them."""
    if isinstance(param, types.Array):
        if not isinstance(value, np.ndarray) or value.ndim != param.ndim:
            return None
        return [0, 0, value.size, value.itemsize, value.ctypes.data, *value.shape, *value.strides]
    if isinstance(param, (types.Integer, types.Boolean)):
        return [int(value)]
    if isinstance(param, types.Float):
        return [float(value)]
    if isinstance(param, types.UniTuple) and isinstance(value, tuple) and len(value) == param.count:
        flat: list = []
        for v in value:
            f = _flatten(param.dtype, v)
            if f is None:
                return None
            flat.extend(f)
        return flat
    return None


def _slot(llvm_type, value) -> bytes:
    if isinstance(llvm_type, ir.FloatType):
        return struct.pack("<f4x", value)
    if isinstance(llvm_type, ir.DoubleType):
        return struct.pack("<d", value)
    return struct.pack("<Q", int(value) & 0xFFFF_FFFF_FFFF_FFFF)  # an integer's low bytes first, a pointer


def _make_trampolines(overloads: list) -> None:
    """``i32 trampoline(i8* slots)`` for each compiled overload without one: loads its flattened
    arguments from 8-byte slots and calls it. Made once per overload per process, those of one
    chain in one module (one compilation)."""
    global _run_address, _loop_address
    with _lock:
        missing = list({id(c): c for c in overloads if id(c) not in _trampolines}.values())
        if not missing and _run_address is not None:
            return
        context = cpu_target.target_context
        module = ir.Module(f"nnhal_trampolines_{len(_libraries)}")
        if _run_address is None:
            _define_loop(module, _define_runner(module))
        made = []
        for cres in missing:
            params = cres.signature.args
            slot_types = tuple(context.call_conv._get_arg_packer(params).argument_types)  # noqa: SLF001
            fnty = context.call_conv.get_function_type(cres.signature.return_type, params)
            target = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
            name = f"nnhal_trampoline_{len(_trampolines) + len(made)}"
            fn = ir.Function(module, ir.FunctionType(_I32, [_I8.as_pointer()]), name)
            b = ir.IRBuilder(fn.append_basic_block("entry"))
            slots = b.bitcast(fn.args[0], _I64.as_pointer())
            args = [b.load(b.bitcast(b.gep(slots, [ir.Constant(_I64, j)]), t.as_pointer()), align=8)
                    for j, t in enumerate(slot_types)]
            ret = b.alloca(fnty.args[0].pointee)
            exc = b.alloca(fnty.args[1].pointee)
            b.store(ir.Constant(fnty.args[1].pointee, None), exc)
            callee = b.inttoptr(ir.Constant(_I64, target), fnty.as_pointer())
            b.ret(b.call(callee, [ret, exc, *args]))
            made.append((cres, name, slot_types))
        library = _compile(module)
        for cres, name, slot_types in made:
            _trampolines[id(cres)] = (cres, library.get_pointer_to_function(name), slot_types)
        if _run_address is None:
            _run_address = library.get_pointer_to_function(_RUN_NAME)
            _loop_address = library.get_pointer_to_function(_LOOP_NAME)


def _define_runner(module: ir.Module) -> ir.Function:
    """Add ``i32 run(i64 n, i64* trampolines, i64* slots)`` to ``module``: calls trampoline k with
    slots k in order; 0, or 1 + the first call whose return code is an error (the calls after it
    not made). One per process (``_run_address``), compiled with the first trampolines."""
    fn = ir.Function(module, ir.FunctionType(_I32, [_I64, _I64.as_pointer(), _I64.as_pointer()]), _RUN_NAME)
    n, fns, slots = fn.args
    entry, loop, body, fail, done = (fn.append_basic_block(s) for s in ("entry", "loop", "body", "fail", "done"))
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b.position_at_end(loop)
    k = b.phi(_I64)
    k.add_incoming(ir.Constant(_I64, 0), entry)
    b.cbranch(b.icmp_signed("<", k, n), body, done)
    b.position_at_end(body)
    tramp_type = ir.FunctionType(_I32, [_I8.as_pointer()])
    callee = b.inttoptr(b.load(b.gep(fns, [k])), tramp_type.as_pointer())
    code = b.call(callee, [b.inttoptr(b.load(b.gep(slots, [k])), _I8.as_pointer())])
    ok = b.or_(*(b.icmp_signed("==", code, ir.Constant(_I32, c)) for c in _RETURNED))
    k_next = b.add(k, ir.Constant(_I64, 1))
    k.add_incoming(k_next, body)
    b.cbranch(ok, loop, fail)
    b.position_at_end(fail)
    b.ret(b.trunc(k_next, _I32))
    b.position_at_end(done)
    b.ret(ir.Constant(_I32, 0))
    return fn


def _define_loop(module: ir.Module, run: ir.Function) -> None:
    """Add ``i32 loop(i64* frame)`` (``NativeLoop``'s frame) to ``module``, calling ``run`` for
    the condition's and the body's calls."""
    fn = ir.Function(module, ir.FunctionType(_I32, [_I64.as_pointer()]), _LOOP_NAME)
    frame = fn.args[0]
    blocks = {s: fn.append_basic_block(s) for s in ("entry", "trip", "late", "cond", "body", "copy", "copied",
                                                    "next", "done")}
    b = ir.IRBuilder(blocks["entry"])
    word = lambda k: b.load(b.gep(frame, [ir.Constant(_I64, k)]))  # noqa: E731
    ptr = lambda k: b.inttoptr(word(k), _I64.as_pointer())  # noqa: E731
    until, n_cond, cond_fns, cond_slots = word(_UNTIL), word(_N_COND), ptr(_COND_FNS), ptr(_COND_SLOTS)
    flag = b.inttoptr(word(_FLAG), _I8.as_pointer())
    n_body, body_fns, body_slots = word(_N_BODY), ptr(_BODY_FNS), ptr(_BODY_SLOTS)
    n_copies, copies = word(_N_COPIES), ptr(_COPIES)
    clock_type = ir.FunctionType(_I32, [_I32, _I64.as_pointer()])
    clock = b.inttoptr(word(_CLOCK), clock_type.as_pointer())
    clock_id = b.trunc(word(_CLOCK_ID), _I32)
    timespec = b.alloca(_I64, 2)
    trips = b.alloca(_I64)
    result = b.alloca(_I32)
    k = b.alloca(_I64)
    b.store(ir.Constant(_I64, 0), trips)
    b.branch(blocks["trip"])

    b.position_at_end(blocks["trip"])  # the clock before each trip
    b.call(clock, [clock_id, timespec])
    now = b.add(b.mul(b.load(timespec), ir.Constant(_I64, 1_000_000_000)),
                b.load(b.gep(timespec, [ir.Constant(_I64, 1)])))
    b.cbranch(b.icmp_signed(">", now, until), blocks["late"], blocks["cond"])
    b.position_at_end(blocks["late"])
    b.store(ir.Constant(_I32, _LATE), result)
    b.branch(blocks["done"])

    b.position_at_end(blocks["cond"])
    rc = b.call(run, [n_cond, cond_fns, cond_slots])
    b.store(b.add(rc, ir.Constant(_I32, _FAILED - 1)), result)
    failed = b.icmp_signed("!=", rc, ir.Constant(_I32, 0))
    test = fn.append_basic_block("test")
    b.cbranch(failed, blocks["done"], test)
    b.position_at_end(test)
    b.store(ir.Constant(_I32, _DONE), result)
    b.cbranch(b.icmp_unsigned("==", b.load(flag), ir.Constant(_I8, 0)), blocks["done"], blocks["body"])

    b.position_at_end(blocks["body"])
    rc = b.call(run, [n_body, body_fns, body_slots])
    b.store(b.add(rc, b.add(b.trunc(n_cond, _I32), ir.Constant(_I32, _FAILED - 1))), result)
    b.store(ir.Constant(_I64, 0), k)
    b.cbranch(b.icmp_signed("!=", rc, ir.Constant(_I32, 0)), blocks["done"], blocks["copy"])

    b.position_at_end(blocks["copy"])  # each carried value's new bytes into the buffer the next trip reads
    j = b.load(k)
    b.cbranch(b.icmp_signed("<", j, n_copies), blocks["copied"], blocks["next"])
    b.position_at_end(blocks["copied"])
    at = b.mul(j, ir.Constant(_I64, 3))
    dst, src, size = (b.load(b.gep(copies, [b.add(at, ir.Constant(_I64, w))])) for w in range(3))
    cgutils.raw_memcpy(b, b.inttoptr(dst, _I8.as_pointer()), b.inttoptr(src, _I8.as_pointer()), size,
                       ir.Constant(_I64, 1))
    b.store(b.add(j, ir.Constant(_I64, 1)), k)
    b.branch(blocks["copy"])

    b.position_at_end(blocks["next"])
    b.store(b.add(b.load(trips), ir.Constant(_I64, 1)), trips)
    b.branch(blocks["trip"])

    b.position_at_end(blocks["done"])
    b.store(b.load(trips), b.gep(frame, [ir.Constant(_I64, _TRIPS)]))
    b.ret(b.load(result))


def _compile(module: ir.Module):
    """``module`` compiled (kept for the process's lifetime: its functions' addresses are in use)."""
    with global_compiler_lock:
        library = cpu_target.target_context.codegen().create_library(module.name)
        library.add_ir_module(module)
        library.finalize()
    _libraries.append(library)
    return library
