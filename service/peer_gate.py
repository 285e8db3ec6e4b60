"""Who may use a unix-socket service: the peer-credential handshake behind `nnhal serve --allow-uid`.

grpcio tells a servicer nothing about a unix-socket client (its peer is "unix:", its auth context
holds no uid) and cannot adopt a connection accepted elsewhere. So the service also listens on a
plain socket next to its gRPC one (``PATH.peer``). A client connects there first; the kernel's
SO_PEERCRED names its uid, and a uid on the allow list is answered a ticket: 128 random bits, good
once, for ``TICKET_TTL_S``, bound to that uid. ``OpenSession`` takes the ticket (metadata
``nnhal-ticket``) and records the uid on the session; every call that costs the service work or
reveals anything needs that session (service.access). Another uid is answered one line of refusal.

The trust comes from the kernel: SO_PEERCRED is the uid of the process that connected, which a
client cannot forge. A listed user may hand its ticket to someone else, as it could relay calls.
"""
from __future__ import annotations

import logging
import os
import secrets
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass

from hal.errors import HalError
from hal.types import ErrorStatus

log = logging.getLogger("nnhal.service")

#: The handshake socket's path is the gRPC socket's with this suffix.
PEER_SUFFIX = ".peer"
#: The metadata key carrying a ticket on OpenSession.
TICKET_KEY = "nnhal-ticket"
#: A ticket is redeemed right after it is issued (Client.connect); older ones are refused.
TICKET_TTL_S = 5.0
#: Unredeemed tickets kept at once; beyond it the oldest are dropped (one client asking in a loop
#: cannot grow the service).
MAX_TICKETS = 1024
#: The longest the handshake thread spends on one connection (its answer is one short line).
ANSWER_TIMEOUT_S = 1.0
#: How long the handshake thread waits before accepting again after a failed accept.
ACCEPT_RETRY_MS = 100
#: The longest answer line a client reads.
MAX_ANSWER_BYTES = 512

_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid


def peer_socket_path(socket_path: str) -> str:
    return socket_path + PEER_SUFFIX


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a connected unix socket (SO_PEERCRED)."""
    pid, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid


def refusal(uid: int) -> str:
    return (f"uid {uid} is not allowed to use this nnhal service "
            f"(its owner can allow it with nnhal serve --allow-uid)")


class Tickets:
    """Tickets issued and not yet redeemed: ticket -> (uid, expiry). Thread-safe."""

    def __init__(self, ttl_s: float = TICKET_TTL_S, clock=time.monotonic):
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._issued: dict[str, tuple[int, float]] = {}

    def issue(self, uid: int) -> str:
        ticket = secrets.token_hex(16)
        now = self._clock()
        with self._lock:
            for t in [t for t, (_, expiry) in self._issued.items() if expiry <= now]:
                del self._issued[t]
            while len(self._issued) >= MAX_TICKETS:
                del self._issued[next(iter(self._issued))]  # the oldest (dicts keep insertion order)
            self._issued[ticket] = (uid, now + self.ttl_s)
        return ticket

    def redeem(self, ticket: str) -> int:
        """The uid ``ticket`` was issued to; the ticket is spent. INVALID_ARGUMENT for no ticket, an
        unknown, spent or expired one."""
        if not ticket:
            raise HalError(ErrorStatus.INVALID_ARGUMENT,
                           f"no '{TICKET_KEY}' in OpenSession: on a unix socket a client first asks the "
                           f"service's {PEER_SUFFIX} socket for a ticket (service.client.Client does)")
        with self._lock:
            uid, expiry = self._issued.pop(ticket, (None, 0.0))
        if uid is None or expiry <= self._clock():
            raise HalError(ErrorStatus.INVALID_ARGUMENT,
                           "unknown, used or expired session ticket: ask the service's "
                           f"{PEER_SUFFIX} socket for a new one right before OpenSession")
        return uid


class PeerGate:
    """The handshake socket's server: one daemon thread that accepts, reads the peer's uid,
    answers one line and closes. ``listener`` is bound and listening already (create_server binds
    it under the socket directory's lock)."""

    def __init__(self, listener: socket.socket, allow_uids: frozenset[int], tickets: Tickets):
        self.listener = listener
        self.allow_uids = allow_uids
        self.tickets = tickets
        self._refused_uids: set[int] = set()  # logged once each: a refused client may retry in a loop
        listener.setblocking(False)
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="nnhal-peer-gate", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = select.poll()  # not select.select: the service's descriptors may number above 1024
        poller.register(self.listener, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        stopping = select.poll()
        stopping.register(self._wake_r, select.POLLIN)
        try:
            while True:
                if any(fd == self._wake_r for fd, _ in poller.poll()):
                    return
                try:
                    conn, _ = self.listener.accept()
                except (BlockingIOError, ConnectionAbortedError):  # the client gave up before we accepted
                    continue
                except OSError as e:  # e.g. out of descriptors: the connection waits; do not spin on it
                    log.warning("peer handshake: cannot accept (%s)", e.strerror)
                    if stopping.poll(ACCEPT_RETRY_MS):
                        return
                    continue
                with conn:
                    self._answer(conn)
        finally:
            self.listener.close()
            os.close(self._wake_r)

    def _answer(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(ANSWER_TIMEOUT_S)
            pid, uid = peer_credentials(conn)
            if uid in self.allow_uids:
                line = f"ticket {self.tickets.issue(uid)}\n"
            else:
                if uid not in self._refused_uids and len(self._refused_uids) < MAX_TICKETS:
                    self._refused_uids.add(uid)
                    log.warning("refused a client: pid %d runs as uid %d, not on the allow list "
                                "(nnhal serve --allow-uid)", pid, uid)
                line = f"refused: {refusal(uid)}\n"
            conn.sendall(line.encode())
        except OSError as e:  # a client that closed at once, or never read
            log.debug("peer handshake: %s", e)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread; it closes the listener (create_server's caller removes the file)."""
        if self._wake_w < 0:
            return
        os.write(self._wake_w, b"x")
        self._thread.join(timeout_s)
        os.close(self._wake_w)
        self._wake_w = -1


@dataclass(frozen=True)
class Handshake:
    """What the service's handshake socket answered a client."""
    ticket: str | None = None       # to send as TICKET_KEY on OpenSession
    refused: str | None = None      # the service's reason, when it refused this client's uid
    service_uid: int | None = None  # who runs the service (SO_PEERCRED of the connection)


#: How often a client waiting for a handshake socket to appear looks for it.
APPEAR_POLL_S = 0.01


def request_ticket(socket_path: str, timeout_s: float) -> Handshake:
    """Ask the service on ``socket_path`` for a ticket (the client side). Every unix-socket service
    binds its handshake socket before its gRPC socket and removes it when it stops, so one that is
    missing is a service not (yet) there: a restart between the old service's stop and the new
    one's start. It is waited for, within ``timeout_s``: a session opened without a ticket would
    reach the new service and be refused. Still missing then: an empty Handshake (the service, if
    any, refuses OpenSession itself, with its reason). OSError for a connection that breaks or an
    answer that is not one."""
    path = peer_socket_path(socket_path)
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() >= deadline:
            return Handshake()
        time.sleep(APPEAR_POLL_S)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(max(timeout_s, 0.05))
        s.connect(path)
        _, service_uid = peer_credentials(s)
        answer = b""
        while not answer.endswith(b"\n") and len(answer) < MAX_ANSWER_BYTES:
            chunk = s.recv(MAX_ANSWER_BYTES - len(answer))
            if not chunk:
                break
            answer += chunk
    line = answer.decode("utf-8", "replace").strip()
    kind, _, rest = line.partition(" ")
    if kind == "ticket" and rest:
        return Handshake(ticket=rest, service_uid=service_uid)
    if kind == "refused:" and rest:
        return Handshake(refused=rest, service_uid=service_uid)
    raise OSError(f"{path} gave no ticket (answered {line[:80]!r})")
