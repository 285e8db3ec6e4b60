"""Client sessions: who owns each prepared model and buffer, and how much memory it holds.

NNAPI's driver learns of a client's death from binder and drops its objects. Here a client
keeps one ``OpenSession`` stream open; every resource it creates is recorded under its
session, and ending the stream (close, channel loss, the process dying) releases them all.
Each session has a memory budget, so one client cannot grow the service without bound.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import secrets
import threading
from dataclasses import dataclass, field

from hal.errors import HalError
from hal.types import ErrorStatus

log = logging.getLogger("nnhal.service")

#: Clients connected at once (each holds one server thread for its session stream).
DEFAULT_MAX_CLIENTS = 64
#: Memory one client's prepared models and buffers may hold (an estimate, see ``footprint``).
DEFAULT_CLIENT_MAX_BYTES = 4 << 30


@dataclass
class Session:
    id: str
    peer: str
    uid: int | None = None  # the client's uid on the unix socket (service.peer_gate); None over TCP
    prepared: dict[str, int] = field(default_factory=dict)  # prepared model id -> bytes charged
    buffers: dict[int, int] = field(default_factory=dict)   # buffer token -> bytes charged

    @property
    def charged(self) -> int:
        return sum(self.prepared.values()) + sum(self.buffers.values())


class Sessions:
    """The live sessions. Thread-safe; the driver calls ``charge`` before creating a resource and
    ``record`` after, and asks ``close`` which resources to drop."""

    def __init__(self, max_clients: int = DEFAULT_MAX_CLIENTS, client_max_bytes: int = DEFAULT_CLIENT_MAX_BYTES):
        self.max_clients = max_clients
        self.client_max_bytes = client_max_bytes
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}

    def open(self, peer: str, uid: int | None = None) -> Session:
        with self._lock:
            if len(self._sessions) >= self.max_clients:
                raise HalError(ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT,
                               f"the service has {self.max_clients} clients connected, its limit "
                               f"(nnhal serve --max-clients)")
            s = Session(secrets.token_hex(16), peer, uid)
            self._sessions[s.id] = s
        log.debug("session %s opened by %s%s", s.id[:8], peer, "" if uid is None else f" (uid {uid})")
        return s

    def get(self, session_id: str | None) -> Session:
        with self._lock:
            s = self._sessions.get(session_id or "")
        if s is None:
            raise HalError(ErrorStatus.INVALID_ARGUMENT,
                           "no open session: a client must keep an OpenSession stream and send its id as "
                           "'nnhal-session' metadata (service.client.Client does)" if not session_id else
                           "unknown or closed session (the service restarted, or the client closed it)")
        return s

    def charge(self, session: Session, nbytes: int, what: str) -> None:
        """Refuse a resource that would take the session over its budget."""
        if nbytes > self.client_max_bytes:
            raise HalError(ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT,
                           f"{what} needs about {nbytes} bytes, more than a client may hold "
                           f"({self.client_max_bytes}, nnhal serve --client-max-bytes)")
        with self._lock:
            held = session.charged
        if held + nbytes > self.client_max_bytes:
            raise HalError(ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT,
                           f"{what} needs about {nbytes} bytes; this client already holds {held} of its "
                           f"{self.client_max_bytes} (release prepared models or buffers first)")

    def record_prepared(self, session: Session, prepared_id: str, nbytes: int) -> bool:
        """False when the session closed meanwhile (the caller then drops the resource)."""
        with self._lock:
            if self._sessions.get(session.id) is not session:
                return False
            session.prepared[prepared_id] = nbytes
            return True

    def record_buffer(self, session: Session, token: int, nbytes: int) -> bool:
        with self._lock:
            if self._sessions.get(session.id) is not session:
                return False
            session.buffers[token] = nbytes
            return True

    def forget_prepared(self, prepared_id: str) -> None:
        with self._lock:
            for s in self._sessions.values():
                if s.prepared.pop(prepared_id, None) is not None:
                    return

    def owner_of(self, prepared_id: str) -> str:
        """The id of the session owning a prepared model; "" if none does (an in-process caller)."""
        with self._lock:
            return next((s.id for s in self._sessions.values() if prepared_id in s.prepared), "")

    def forget_buffer(self, token: int) -> None:
        with self._lock:
            for s in self._sessions.values():
                if s.buffers.pop(token, None) is not None:
                    return

    def close(self, session_id: str) -> Session | None:
        """Remove a session; returns it (with what it owned) or None if already closed."""
        with self._lock:
            return self._sessions.pop(session_id, None)

    def count(self) -> int:
        with self._lock:
            return len(self._sessions)


def _libc_malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


_malloc_trim = _libc_malloc_trim()


def return_memory() -> None:
    """Hand freed heap pages back to the system (glibc keeps them otherwise): a service that
    released a client's models should shrink, not only stop growing."""
    if _malloc_trim is not None:
        _malloc_trim(0)
