"""The embedded default service: use the per-user socket, or start a private `nnhal serve`.

With no ``service_address``, the delegate first tries the default socket; if
nothing answers there it starts ``nnhal serve`` as a child process on a private
socket and stops it when this Python process exits (the child also watches this process and
stops when it dies, even by SIGKILL). The tools' reference for CUSTOM ops TFLite cannot run is
such a child too, with the reference backend only (reference_address).
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

from service import fleet
from service.client import Client, ClientRefusedError, ServiceUnavailableError, UntrustedServiceError, answers
from service.server import MAX_SOCKET_PATH_BYTES, default_address

log = logging.getLogger("nnhal.delegate")

_lock = threading.Lock()
_child: subprocess.Popen | None = None  # the embedded default service
_child_address: str | None = None
_reference: subprocess.Popen | None = None  # the tools' reference service (reference_address)
_reference_address: str | None = None


def connect(address: str | None, timeout_s: float = 2.0, **tls) -> Client | fleet.FleetClient:
    """Client for ``address``; with None, the default socket or an embedded child service.
    ``tls``: Client.connect's TLS arguments, for an address given (the local ones are unix sockets)."""
    if address is not None:  # one service, or several (service.fleet: a list or a dns: name)
        return fleet.connect(address, timeout_s=timeout_s, **tls)
    try:
        return Client.connect(default_address(), timeout_s=min(timeout_s, 0.3))
    except (UntrustedServiceError, ClientRefusedError) as e:  # not ours, or it will not serve us: say so
        log.warning("%s; starting a private service instead", e.message)
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
        if _child is None or _child.poll() is not None:
            _child, _child_address = _start_child("embedded", _child_address)
        return _child_address


def reference_address() -> str:
    """A private ``nnhal serve --backend reference --no-cache``, started on first use and stopped
    with this process: the tools' oracle for the CUSTOM ops TFLite has no kernel for (nnhal.reference).
    Private, so that neither the service under test (its backends, its compilation cache, its
    transport) nor another user's default service is part of the reference."""
    global _reference, _reference_address
    with _lock:
        if _reference is None or _reference.poll() is not None:
            _reference, _reference_address = _start_child("reference", _reference_address,
                                                          "--backend", "reference", "--no-cache")
        return _reference_address


def _start_child(what: str, previous: str | None, *args: str) -> tuple[subprocess.Popen, str]:
    """``nnhal serve *args`` on a private socket in a new directory (nnhal-<what>-*); returns once
    it answers. One that does not start is stopped: nothing is left running."""
    prefix = f"nnhal-{what}-"
    if previous is not None:  # a previous child died: its directory may be left
        shutil.rmtree(os.path.dirname(previous[len("unix:"):]), ignore_errors=True)
    d = tempfile.mkdtemp(prefix=prefix)
    sock = os.path.join(d, "nnhal.sock")
    if len(os.fsencode(sock)) > MAX_SOCKET_PATH_BYTES:  # a deep $TMPDIR: AF_UNIX paths are short
        os.rmdir(d)
        d = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
        sock = os.path.join(d, "nnhal.sock")
    # --parent-pid: the child stops when this process exits however it exits (even SIGKILL,
    # when atexit never runs) and removes the directory.
    child = subprocess.Popen([sys.executable, "-m", "nnhal.cli", "serve", "--socket", sock,
                              "--log-level", _child_log_level(), "--parent-pid", str(os.getpid()), *args],
                             stdout=subprocess.DEVNULL)
    address = "unix:" + sock
    # Generous: a service's first start on a machine compiles the numba kernels (~12 s on 2
    # cores; `make setup` does it ahead), after which it starts in about a second.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
        if answers(address):
            log.info("started %s nnhal service (pid %d) on %s", what, child.pid, address)
            return child, address
        time.sleep(0.005)
    child.kill()  # it removes its directory only when it stops by itself
    child.wait()
    shutil.rmtree(d, ignore_errors=True)
    raise ServiceUnavailableError(f"the {what} nnhal service did not start")


@atexit.register
def stop_embedded() -> None:
    global _child, _reference
    with _lock:
        for child, address in ((_child, _child_address), (_reference, _reference_address)):
            if child is not None and child.poll() is None:
                child.terminate()
                try:
                    child.wait(10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
            if address is not None:  # the child removes it too; not if it was killed
                shutil.rmtree(os.path.dirname(address[len("unix:"):]), ignore_errors=True)
        _child = _reference = None
