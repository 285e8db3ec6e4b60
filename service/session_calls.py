"""The client's session on every call: the service lets a session reach only the prepared models
and buffers it owns (service.driver.Driver.get), so every call about them must name it. The stubs
are wrapped once so that every call carries it, raw ones included (tests, tools), instead of each
call site.

Not a gRPC interceptor: an intercepted channel makes a new call handle on each call, and a call made
from a finalizer at interpreter exit (TFLite frees the delegate's kernels then, which release their
prepared models) made one on a channel already torn down: a segfault. The stub's own multicallables,
made once with the stub, fail such a late call with a ValueError instead."""
from __future__ import annotations

from service.access import SESSION_KEY


class _SessionCall:
    """One stub method: the call with the session's metadata unless it names metadata itself."""

    __slots__ = ("_call", "_session")

    def __init__(self, call, session: list[tuple[str, str]]):
        self._call = call
        self._session = session

    def __call__(self, request, timeout=None, metadata=None, **kw):
        return self._call(request, timeout=timeout, metadata=_with_session(metadata, self._session), **kw)

    def future(self, request, timeout=None, metadata=None, **kw):
        return self._call.future(request, timeout=timeout, metadata=_with_session(metadata, self._session), **kw)


def _with_session(metadata, session: list[tuple[str, str]]):
    if metadata is not None and any(k == SESSION_KEY for k, _ in metadata):
        return metadata  # an explicit session (tests name another one on purpose)
    return list(metadata or ()) + session if session else metadata


class SessionStub:
    """``stub`` with the session (the Client's list, filled in place when its session opens) added
    to every call's metadata."""

    def __init__(self, stub, session: list[tuple[str, str]]):
        for name, call in vars(stub).items():
            setattr(self, name, _SessionCall(call, session))
