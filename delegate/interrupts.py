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
"""
from __future__ import annotations

import sys
from types import FrameType


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
    caller = callback.f_back
    while caller is not None and caller.f_code.co_name == "__del__":
        caller = caller.f_back
    if caller is None:  # TFLite called from no Python frame (at interpreter exit): no one to tell
        return
    caller.f_trace = _raise_interrupt
    if sys.gettrace() is None:  # frame trace functions are called only while the thread traces
        sys.settrace(_untraced)
