"""The client's session on every call: the service lets a session reach only the prepared models
and buffers it owns (service.driver.Driver.get), so every call about them must name it. An
interceptor adds it once for all stubs, raw ones included (tests, tools), instead of each call site."""
from __future__ import annotations

import collections

import grpc

from service.servicer import SESSION_KEY


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                           "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


class SessionMetadata(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor,
                      grpc.StreamUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds the session's metadata to every call that does not name one itself: the service
    answers a call about a prepared model or buffer only for the session that owns it."""

    def __init__(self, session: list[tuple[str, str]]):
        self.session = session  # the Client's list, filled when its session opens

    def _details(self, d):
        metadata = list(d.metadata or ())
        if not self.session or any(k == SESSION_KEY for k, _ in metadata):
            return d
        return _CallDetails(d.method, d.timeout, metadata + self.session, d.credentials, d.wait_for_ready,
                            d.compression)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)
