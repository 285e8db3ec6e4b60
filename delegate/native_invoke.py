"""A delegate kernel's invoke without Python, when nothing about it changed since the last one.

TFLite calls every delegate kernel's invoke through the registration's function pointer. Here
that pointer is a native trampoline (``service.native_code``) reading the node's ``user_data``:
the address of the kernel's ``NativeInvoke`` words. A kernel that armed them gave a native
function and its argument (the local burst's steady round trip, ``service.native_burst``) and the
tensors it reads and writes; the trampoline checks that TFLite has not moved or resized any of
them (the three words per tensor ``DelegateContext.arrays`` checks: data pointer, byte size, dims
pointer), calls the function, and returns kTfLiteOk on its DONE. In every other case (not armed,
a tensor moved, the function handed the invoke back) it calls the kernel's Python invoke (the
ctypes callback) with the function's answer left in RC, so the kernel finishes what was started
(``take``): Python keeps every decision, the native path only repeats the last one.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from delegate import capi
from service import native_code

NAME = "nnhal_delegate_invoke"
#: The words: ARMED, the Python invoke's address, the native function and its argument, the
#: tensor array's address when armed, the (word index, value) pairs checked, RC.
ARMED, PYTHON, FN, ARG, TENSORS, N_KEYS, KEYS, RC, WORDS = range(9)
#: RC when the native function was not called.
NOT_CALLED = -1
#: What the native function answers when it did the whole invoke.
DONE = 0

#: A TfLiteTensor in 64-bit words, and the words of its data pointer, byte size and dims pointer.
TENSOR_WORDS = ctypes.sizeof(capi.TfLiteTensor) // 8
KEY_WORDS = (capi.TfLiteTensor.data.offset // 8, capi.TfLiteTensor.bytes.offset // 8,
             capi.TfLiteTensor.dims.offset // 8)

_lock = threading.Lock()
_address: int | None = None
_failed = False


def trampoline_address() -> int | None:
    """The compiled trampoline ``int invoke(TfLiteContext*, TfLiteNode*)``, compiled on the first
    call (once per process); None where native code is unavailable."""
    global _address, _failed
    with _lock:
        if _address is None and not _failed:
            compiled = native_code.compile_ir(_module()) if native_code.enabled() else None
            _failed = compiled is None
            _address = None if compiled is None else compiled.address(NAME)
        return _address


class NativeInvoke:
    """One kernel's words: its node's ``user_data``, the trampoline's instructions for it."""

    def __init__(self, python_invoke: int) -> None:
        self.words = np.zeros(WORDS, np.int64)
        self.words[PYTHON] = python_invoke
        self.words[RC] = NOT_CALLED
        self._keys = np.zeros(2, np.int64)  # held: the words point at it
        self._keys_of: object = None  # the ``same`` token the keys were read for

    @property
    def address(self) -> int:
        return self.words.ctypes.data

    def arm(self, ctx: capi.TfLiteContext, tensors: tuple[int, ...], fn: int, arg: int, same: object = None) -> None:
        """Call ``fn(arg)`` for the next invokes while none of ``tensors`` (their indexes) moves.
        ``same``: a token that is the same object only while none of them moved (the list
        ``DelegateContext.arrays`` returns): the words already read for it are kept."""
        w = self.words
        if same is None or same is not self._keys_of or ctx.tensors != w[TENSORS]:
            base = TENSOR_WORDS * np.asarray(tensors, np.int64)
            index = (base[:, None] + np.asarray(KEY_WORDS, np.int64)[None, :]).reshape(-1)
            array = np.ctypeslib.as_array(
                (ctypes.c_int64 * (ctx.tensors_size * TENSOR_WORDS)).from_address(ctx.tensors))
            self._keys = np.stack([index, array[index]], axis=1).reshape(-1).copy()
            self._keys_of = same
            w[TENSORS], w[N_KEYS], w[KEYS] = ctx.tensors, len(index), self._keys.ctypes.data
        w[FN], w[ARG] = fn, arg
        w[ARMED] = 1

    def disarm(self) -> None:
        self.words[ARMED] = 0

    def take(self) -> int:
        """What the native function answered in the invoke that came to Python (NOT_CALLED: it
        was not called); disarmed, until armed again."""
        w = self.words
        w[ARMED] = 0
        rc, w[RC] = int(w[RC]), NOT_CALLED
        return rc


def _module():
    """The IR module defining the trampoline."""
    from llvmlite import ir

    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    c64 = lambda v: ir.Constant(i64, v)  # noqa: E731
    module = ir.Module("nnhal_delegate_invoke")
    node_fn = ir.FunctionType(i32, [i8.as_pointer(), i8.as_pointer()])
    fn = ir.Function(module, node_fn, NAME)
    ctx, node = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def field(base, offset):
        return b.load(b.bitcast(b.gep(base, [c64(offset)]), i64.as_pointer()), align=8)

    words = b.inttoptr(field(node, capi.TfLiteNode.user_data.offset), i64.as_pointer())

    def at(k):
        return b.gep(words, [c64(k)])

    python, check, keys_loop, key, call, done = (fn.append_basic_block(s) for s in (
        "python", "check", "keys", "key", "call", "done"))
    rc = b.alloca(i64)
    b.store(c64(NOT_CALLED), rc)
    b.cbranch(b.icmp_signed("!=", b.load(at(ARMED)), c64(0)), check, python)

    b.position_at_end(check)
    tensors = field(ctx, capi.TfLiteContext.tensors.offset)
    k = b.alloca(i64)
    b.store(c64(0), k)
    b.cbranch(b.icmp_signed("==", tensors, b.load(at(TENSORS))), keys_loop, python)
    b.position_at_end(keys_loop)
    j = b.load(k)
    b.cbranch(b.icmp_signed("<", j, b.load(at(N_KEYS))), key, call)
    b.position_at_end(key)
    pairs = b.inttoptr(b.load(at(KEYS)), i64.as_pointer())
    index = b.load(b.gep(pairs, [b.mul(j, c64(2))]))
    want = b.load(b.gep(pairs, [b.add(b.mul(j, c64(2)), c64(1))]))
    have = b.load(b.gep(b.inttoptr(tensors, i64.as_pointer()), [index]))
    b.store(b.add(j, c64(1)), k)
    b.cbranch(b.icmp_unsigned("==", have, want), keys_loop, python)

    b.position_at_end(call)
    native = b.inttoptr(b.load(at(FN)), ir.FunctionType(i32, [i64]).as_pointer())
    answer = b.sext(b.call(native, [b.load(at(ARG))]), i64)
    b.store(answer, rc)
    b.cbranch(b.icmp_signed("==", answer, c64(DONE)), done, python)
    b.position_at_end(done)
    b.ret(ir.Constant(i32, capi.kTfLiteOk))

    b.position_at_end(python)
    b.store(b.load(rc), at(RC))
    b.ret(b.call(b.inttoptr(b.load(at(PYTHON)), node_fn.as_pointer()), [ctx, node]))
    return module


__all__ = ["DONE", "NOT_CALLED", "NativeInvoke", "trampoline_address"]
