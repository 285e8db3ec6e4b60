"""Who may call what on the service: the one check every servicer method makes (``Access.caller``).

- Unix socket: a session opens only with a ticket from the handshake socket (service.peer_gate),
  which is issued only to a uid on `nnhal serve --allow-uid`; so a live session id proves an
  allowed uid. Every call except GetCapabilities, GetType, GetVersionString,
  GetSupportedExtensions, GetNumberOfCacheFilesNeeded and gRPC health (what a client reads before
  it has a session, and nothing beyond the device's description) needs one: the support query
  too, since it validates a whole model and may name shared memory.
- TCP: TLS is the gate (SECURITY.md); a session separates clients from each other, and the calls
  that create something (PrepareModel, PrepareModelFromCache, Allocate, PutDelegationRecord) need one.
- Shared memory (a segment named in /dev/shm, a local burst's memfd and socket): only for a
  session on the unix socket whose uid is the service's own. A name is opened with the service's
  rights, so a client of another uid (TCP, or a listed uid) sends tensors and weights inline.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from hal.errors import HalError
from hal.types import ErrorStatus
from service.driver import Driver
from service.peer_gate import TICKET_KEY, Tickets
from service.sessions import Session

#: The metadata key carrying the caller's session id (see OpenSession).
SESSION_KEY = "nnhal-session"

#: Why a shared-memory pool is refused (the client library then sends inline).
SHARED_REFUSED = ("shared-memory pools are accepted only on the service's unix socket, from a client of the "
                  "service's own user; over TCP or from another user, tensors and weights travel inline")


def check_shared_allowed(allowed: bool) -> None:
    if not allowed:
        raise HalError(ErrorStatus.INVALID_ARGUMENT, SHARED_REFUSED)


def metadata_value(context, key: str) -> str:
    for k, value in context.invocation_metadata() or ():
        if k == key:
            return value
    return ""


@dataclass(frozen=True)
class Caller:
    session_id: str            # what the caller names ("" for none): what it may reach (Driver.get)
    session: Session | None    # the live session, when looked up
    shared: bool               # may name shared memory and open local bursts


class Access:
    """The rules above for one server."""

    def __init__(self, driver: Driver, unix_server: bool, tickets: Tickets | None = None):
        self.driver = driver
        self.unix_server = unix_server
        self.tickets = tickets  # a unix server's: OpenSession needs one of them
        self.own_uid = os.geteuid()

    def open_session(self, context) -> Session:
        """OpenSession's check: on the unix socket it spends the caller's ticket, and the session
        records the uid the ticket was issued to."""
        uid = None if self.tickets is None else self.tickets.redeem(metadata_value(context, TICKET_KEY))
        return self.driver.open_session(context.peer(), uid)

    def caller(self, context, *, session: bool = False) -> Caller:
        """This call's caller. On the unix socket, or with ``session``, it must name a live
        session: INVALID_ARGUMENT otherwise."""
        sid = metadata_value(context, SESSION_KEY)
        if not (session or self.unix_server):
            return Caller(sid, None, False)
        s = self.driver.sessions.get(sid)
        shared = self.unix_server and s.uid == self.own_uid and (context.peer() or "").startswith("unix:")
        return Caller(sid, s, shared)
