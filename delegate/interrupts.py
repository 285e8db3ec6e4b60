"""Ctrl-C inside a TFLite call reaches the application as KeyboardInterrupt.

TFLite runs the delegate's callbacks from C (ctypes), and invoke() spends most of its time in them:
that is where SIGINT's Python handler raises KeyboardInterrupt. It cannot cross the C boundary
(ctypes prints it as "Exception ignored" and hands TFLite a made-up status), so a callback catches
it and fails quietly: TFLite stops, as after any failed node, and its Python wrapper raises
RuntimeError ("Node number N (NnhalDelegate) failed to invoke") in the Python frame that called
into TFLite. That frame is the callback's caller on the thread's stack, so the callback arms it
with a trace function: the first event Python reports in it (that RuntimeError arriving, or a
return where TFLite did not fail) raises KeyboardInterrupt in its place. The application's
``except KeyboardInterrupt`` fires, whichever TFLite call was running (Interpreter(),
allocate_tensors, invoke, a signature runner) and whichever runtime made it (LiteRT,
tflite_runtime, tf.lite): they all call TFLite from Python the same way.

Why not a signal: a SIGINT raised again (``_thread.interrupt_main``) is handled at the next
bytecode, still inside the callback, and TFLite's RuntimeError would precede it anyway.

Python switches a thread's tracing off when a trace function raises (sys.settrace): a tracer the
thread already had (a debugger, coverage) stops at the interrupt.

A SIGINT that arrives while TFLite runs C code (its own kernels, between two delegate callbacks) is
raised by the first Python code that runs next: the next callback, as it starts, before its own
``try``. ctypes hands such an exception to ``sys.unraisablehook`` and returns an undefined status
to TFLite, so the interrupt would be printed and lost (an application looping on invoke() until
Ctrl-C never stops). ``guard`` installs a hook that does for the callbacks it names what their
``except KeyboardInterrupt`` does, and passes everything else to the hook that was there before.
"""
from __future__ import annotations

import sys
from types import CodeType, FrameType
from typing import Callable

#: The code of the callbacks TFLite calls from C whose KeyboardInterrupt ``_unraisable`` re-raises.
_guarded: set[CodeType] = set()
_previous_hook: Callable | None = None


def _untraced(frame: FrameType, event: str, arg) -> None:
    """The thread's trace function while a frame is armed: frames called meanwhile are not traced."""
    return None


def _raise_interrupt(frame: FrameType, event: str, arg):
    raise KeyboardInterrupt


def reraise_in_caller(callback: FrameType) -> None:
    """``callback``, a frame TFLite called from C, swallowed a KeyboardInterrupt: raise it again in
    the Python frame that called into TFLite, as soon as TFLite returns there. TFLite frees the
    kernels from the Interpreter's ``__del__``, where Python would print and drop an exception: the
    frame that let go of the Interpreter gets it instead."""
    _arm(callback.f_back)


def _arm(caller: FrameType | None) -> None:
    """Raise KeyboardInterrupt in ``caller``, the frame that called into TFLite, at its next event
    (a ``__del__`` frame: the frame that let the object go)."""
    while caller is not None and caller.f_code.co_name == "__del__":
        caller = caller.f_back
    if caller is None:  # TFLite called from no Python frame (at interpreter exit): no one to tell
        return
    caller.f_trace = _raise_interrupt
    if sys.gettrace() is None:  # frame trace functions are called only while the thread traces
        sys.settrace(_untraced)


def guard(*callbacks: Callable) -> None:
    """``callbacks`` (functions or bound methods TFLite calls through ctypes): a KeyboardInterrupt
    raised as one of them starts reaches the application as KeyboardInterrupt, quietly."""
    global _previous_hook
    _guarded.update(getattr(c, "__func__", c).__code__ for c in callbacks)
    if sys.unraisablehook is not _unraisable:
        _previous_hook, sys.unraisablehook = sys.unraisablehook, _unraisable


def _unraisable(unraisable) -> None:
    code = getattr(getattr(unraisable.object, "__func__", unraisable.object), "__code__", None)
    if issubclass(unraisable.exc_type, KeyboardInterrupt) and code in _guarded:
        _arm(sys._getframe(1))  # ctypes calls the hook from C: the next frame called into TFLite
        return
    (_previous_hook or sys.__unraisablehook__)(unraisable)
