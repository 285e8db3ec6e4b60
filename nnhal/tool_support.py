"""What the TFLite-style tools (report, benchmark, inference_diff) share: the flags that reach the
service (address, TLS) and the delegate's options, checked before any run; the output file, checked
before the run too; and Ctrl-C that ends a run with one line, even inside TFLite."""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading

#: Exit status after Ctrl-C, as shells report a process ended by SIGINT.
INTERRUPTED = 130


def add_service_arguments(p: argparse.ArgumentParser, preference: bool = True) -> None:
    p.add_argument("--service_address", default=None,
                   help="HOST:PORT or unix:PATH (default: the per-user socket, else an embedded service)")
    p.add_argument("--tls_ca_file", metavar="PEM", default=None, help="TLS to a HOST:PORT service: the CA to trust")
    p.add_argument("--tls_cert_file", metavar="PEM", default=None,
                   help="client certificate, for a service that requires one (nnhal serve --tls-client-ca)")
    p.add_argument("--tls_key_file", metavar="PEM", default=None, help="the client certificate's private key")
    if preference:
        p.add_argument("--execution_preference", default="fast_single_answer",
                       help="low_power, fast_single_answer (default) or sustained_speed")
        p.add_argument("--priority", default="medium", help="low, medium (default) or high")


def delegate_options(args: argparse.Namespace, **more) -> dict:
    """load_delegate's options (without service_address) from the flags, checked now: a missing
    TLS file or an unknown preference is a ValueError (one line) before TFLite loads anything."""
    from delegate.nnhal_delegate import NnhalOptions
    options = {"tls_ca_file": args.tls_ca_file, "tls_cert_file": args.tls_cert_file,
               "tls_key_file": args.tls_key_file, **more}
    for name in ("execution_preference", "priority"):
        if hasattr(args, name):
            options[name] = getattr(args, name)
    NnhalOptions.from_kwargs(service_address=args.service_address, **options)
    return options


def check_output_file(path: str | None) -> str | None:
    """Why ``path`` cannot be written, or None: checked before a run, not after it."""
    if not path:
        return None
    if os.path.isdir(path):
        return f"{path} is a directory"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"no such directory: {folder}"
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return f"{path} is not writable"
    return None


class _Deferral:
    depth = 0  # TFLite calls in progress on the main thread
    pending = False  # Ctrl-C came during one


_state = _Deferral()


@contextlib.contextmanager
def tflite_call():
    """Around a TFLite call that may run the delegate's callbacks (Interpreter(), allocate_tensors,
    invoke): a KeyboardInterrupt raised inside a ctypes callback is printed by ctypes as "Exception
    ignored", TFLite sees a failed node, and the interrupt is lost. So Ctrl-C is noted meanwhile and
    raised when the call returns (a second Ctrl-C stops at once). A no-op unless a tool installed
    the handler (interrupts_after_tflite_calls)."""
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
        if _state.pending and _state.depth == 0:
            _state.pending = False
            raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_after_tflite_calls(prog: str):
    """Install the SIGINT handler tflite_call relies on, for one tool run (main thread only; a
    SIGINT the caller ignores stays ignored)."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return

    def on_sigint(signum, frame):
        if _state.depth == 0:
            raise KeyboardInterrupt
        if _state.pending:  # the second Ctrl-C: the user does not want to wait for TFLite
            os.write(2, f"{prog}: interrupted\n".encode())
            os._exit(INTERRUPTED)
        _state.pending = True

    old = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        _state.pending = False


def interrupted(prog: str) -> int:
    print(f"{prog}: interrupted", file=sys.stderr)
    return INTERRUPTED


def tflite_error(e: BaseException, model_file: str) -> str:
    """TFLite's load / prepare error in one line: its error reporter often repeats the message (the
    repeat is dropped), and a custom op without a kernel gets which extension would provide it."""
    text = _drop_repeat(" ".join(str(e).split()) or type(e).__name__)
    if "unresolved custom op" in text:  # TFLite's link to its docs out, which extension has it in
        from delegate.report import custom_op_hints
        hint = custom_op_hints(model_file)
        text = text.split(" See instructions:")[0].rstrip(".") + (f" ({hint})" if hint else "")
    return text


def _drop_repeat(text: str) -> str:
    """"A.A." or "A. A." (+ anything) -> "A." (+ the same): the longest repeated start, 10+ chars."""
    for n in range(len(text) // 2, 9, -1):
        for rest in (text[n:], text[n + 1:] if text[n:n + 1] == " " else ""):
            if rest.startswith(text[:n]):
                return text[:n] + rest[n:]
    return text
