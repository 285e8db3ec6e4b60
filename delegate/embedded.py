"""The embedded default service: use the per-user socket, or start a private `nnhal serve`.

With no ``service_address``, the delegate first tries the default socket; if
nothing answers there it starts ``nnhal serve`` as a child process on a private
socket and stops it when this Python process exits (the child also watches this process and
stops when it dies, even by SIGKILL).
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from service.client import Client, ServiceUnavailableError
from service.server import MAX_SOCKET_PATH_BYTES, default_address

log = logging.getLogger("nnhal.delegate")

_lock = threading.Lock()
_child: subprocess.Popen | None = None
_child_address: str | None = None


def connect(address: str | None, timeout_s: float = 2.0, **tls) -> Client:
    """Client for ``address``; with None, the default socket or an embedded child service.
    ``tls``: Client.connect's TLS arguments, for an address given (the local ones are unix sockets)."""
    if address is not None:
        return Client.connect(address, timeout_s=timeout_s, **tls)
    try:
        return Client.connect(default_address(), timeout_s=min(timeout_s, 0.3))
    except ServiceUnavailableError:
        pass
    return Client.connect(_embedded_address(), timeout_s=timeout_s)


def _child_log_level() -> str:
    """The embedded service's level: $NNHAL_LOG (the same as this process's), else errors only."""
    from service.logconfig import resolve_level
    try:
        return resolve_level(None, default="error")
    except ValueError:  # already said by configure_library_logging
        return "error"


def _embedded_address() -> str:
    global _child, _child_address
    with _lock:
        if _child is not None and _child.poll() is None:
            return _child_address
        if _child_address is not None:  # a previous child died: its directory may be left
            shutil.rmtree(os.path.dirname(_child_address[len("unix:"):]), ignore_errors=True)
        d = tempfile.mkdtemp(prefix="nnhal-embedded-")
        sock = os.path.join(d, "nnhal.sock")
        if len(os.fsencode(sock)) > MAX_SOCKET_PATH_BYTES:  # a deep $TMPDIR: AF_UNIX paths are short
            os.rmdir(d)
            d = tempfile.mkdtemp(prefix="nnhal-embedded-", dir="/tmp")
            sock = os.path.join(d, "nnhal.sock")
        # --parent-pid: the child stops when this process exits however it exits (even SIGKILL,
        # when atexit never runs) and removes the directory.
        _child = subprocess.Popen([sys.executable, "-m", "nnhal.cli", "serve", "--socket", sock,
                                   "--log-level", _child_log_level(), "--parent-pid", str(os.getpid())],
                                  stdout=subprocess.DEVNULL)
        _child_address = "unix:" + sock
        # Generous: a service's first start on a machine compiles the numba kernels (~12 s on 2
        # cores; `make setup` does it ahead), after which it starts in about a second.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _child.poll() is None:
            if os.path.exists(sock):
                try:
                    Client.connect(_child_address, timeout_s=0.5).close()
                    log.info("started embedded nnhal service (pid %d) on %s", _child.pid, _child_address)
                    return _child_address
                except ServiceUnavailableError:
                    pass
            time.sleep(0.05)
        raise ServiceUnavailableError("the embedded nnhal service did not start")


@atexit.register
def stop_embedded() -> None:
    global _child
    with _lock:
        if _child is not None and _child.poll() is None:
            _child.terminate()
            try:
                _child.wait(10)
            except subprocess.TimeoutExpired:
                _child.kill()
                _child.wait()
        if _child_address is not None:  # the child removes it too; not if it was killed
            shutil.rmtree(os.path.dirname(_child_address[len("unix:"):]), ignore_errors=True)
        _child = None
