"""The service addresses a client accepts, in one place (Client.connect, the delegate's
service_address, the tools' --service-address, `nnhal cts --service`):

- ``unix:PATH`` (``unix:///abs/path`` too): the service's unix socket, as `nnhal serve` prints it;
- a bare path: ``/run/s.sock``, ``./s.sock``, ``dir/s.sock``, ``~/s.sock`` (anything whose part
  before a first ``:`` holds a ``/``) is that socket, ``unix:/absolute/path`` (made absolute now: a
  channel that reconnects later must not depend on the working directory then); a socket path is
  what `nnhal serve --socket` takes, so it is what people type;
- ``HOST:PORT`` (``[::1]:PORT``, gRPC's ``dns:``, ``ipv4:``, ``ipv6:`` names): TCP, with or without
  TLS.

A name with neither ``/`` nor ``:`` (``s.sock``, ``localhost``) could be a socket in this directory
or a host without its port: refused, with both spellings in the message, rather than guessed."""
from __future__ import annotations

import os

UNIX_SCHEMES = ("unix:", "unix-abstract:")


def client_address(address: str) -> str:
    """``address`` as gRPC takes it: a bare socket path becomes ``unix:PATH``; ValueError when it
    cannot tell a socket from a host."""
    head, colon, _ = address.partition(":")
    if "/" in head:
        return "unix:" + os.path.abspath(os.path.expanduser(address))
    if not colon:
        raise ValueError(f"service address {address!r} is neither HOST:PORT nor a socket path: give "
                         f"HOST:PORT for TCP, or unix:{address} (or ./{address}) for a unix socket")
    return address


def is_unix(address: str) -> bool:
    return address.startswith(UNIX_SCHEMES)


def tcp_host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a TCP address in any form client_address passes on; None for a unix socket
    or a form without a numeric port (the first of several ``ipv4:a,b`` addresses is taken)."""
    if is_unix(address):
        return None
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if address.startswith(scheme):
            address = address[len(scheme):]
            break
    address = address.split(",")[0]
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)
