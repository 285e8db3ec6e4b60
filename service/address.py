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
import socket
import stat
import struct

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


def unix_socket_path(address: str) -> str | None:
    """The filesystem path of a ``unix:`` address (``unix:///abs`` too); None for TCP and for
    abstract sockets (no file to check)."""
    if not address.startswith("unix:"):
        return None
    path = address[len("unix:"):]
    return "/" + path.lstrip("/") if path.startswith("//") else path


def _trusted_owner(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def untrusted_socket(path: str) -> str | None:
    """Why the service socket at ``path`` is not this user's service (None: it is, or there is no
    socket, which connecting will report). The checks `nnhal serve` makes on its own directory, from
    the client's side, plus the listener's credentials: whoever owns or can write the directory can
    put their own socket there, and the delegate would send it the model's weights and inputs.

    - the directory: owned by this user or root, not writable by group or others (who could
      replace the socket);
    - the socket: a socket, owned by this user or root. Its mode may let others connect (a
      socket's write bit is connect permission: `nnhal serve --allow-uid` makes it 0666 and checks
      each client's uid itself); who can replace it is the directory's matter;
    - the process listening on it (SO_PEERCRED): running as this user or root."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        st_dir, st = os.stat(directory), os.lstat(path)
    except OSError:
        return None
    for what, name, s in (("directory", directory, st_dir), ("socket", path, st)):
        if not _trusted_owner(s.st_uid):
            return f"its {what} {name} is owned by uid {s.st_uid}, not by this user (uid {os.geteuid()}) or root"
    if st_dir.st_mode & 0o022:
        return (f"its directory {directory} is writable by group or others (mode {st_dir.st_mode & 0o7777:o}): "
                f"anyone could have put that socket there")
    if not stat.S_ISSOCK(st.st_mode):
        return f"{path} is not a socket"
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(path)
        creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
    except OSError:
        return None  # nothing listens: connecting says so
    finally:
        probe.close()
    pid, uid, _ = struct.unpack("iII", creds)  # struct ucred
    if not _trusted_owner(uid):
        return f"the process listening on it (pid {pid}) runs as uid {uid}, not as this user or root"
    return None


def denied_socket(path: str) -> str | None:
    """Why this user may never connect to the socket at ``path``: a directory on the way it may not
    search, or a socket it may not write (connect permission). A service may well be listening
    there, for another user: waiting for it to answer would only end in a timeout that says
    nothing about the cause. None: it may connect, or nothing is there yet (a service starting,
    which connecting waits for)."""
    me = f"this user (uid {os.geteuid()})"
    try:
        st = os.stat(path)
    except PermissionError:
        return (f"{me} may not reach {path}: a directory on its path is not searchable by this user "
                f"(is the service another user's?)")
    except OSError:
        return None
    if not os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids):
        return (f"{me} may not connect to {path} (mode {st.st_mode & 0o777:o}, owner uid {st.st_uid}): "
                f"a service of another user admits other users only with `nnhal serve --allow-uid`")
    return None


# ---- several services (service.fleet) ------------------------------------------------------------
def is_fleet(address: str | None) -> bool:
    """Several services: a comma-separated list of addresses, or a ``dns:`` name (every address it
    resolves to is a replica). gRPC's own ``ipv4:a,b`` / ``ipv6:a,b`` / ``unix:a,b`` lists count too."""
    return bool(address) and ("," in address or address.startswith("dns:"))


def fleet_addresses(address: str) -> list[str]:
    """The normalized replicas of a list (each as client_address makes it: ``unix:/a.sock,
    unix:/b.sock``, ``h1:50051,h2:50051``; gRPC's ``unix:/a,/b`` and ``ipv4:a:1,b:2`` lists read the
    same, their later elements being a bare path or a HOST:PORT); ValueError for an empty element,
    a duplicate, or a list mixing unix sockets and TCP (shared memory and TLS apply to all replicas
    or none). A ``dns:`` name stays one element: it is
    resolved by service.fleet, again and again."""
    if address.startswith("dns:"):
        if "," in address:
            raise ValueError(f"service address {address!r}: a dns: name names one host, not a list")
        return [address]
    out: list[str] = []
    for part in address.split(","):
        if not part.strip():
            raise ValueError(f"service address list {address!r} has an empty element")
        out.append(client_address(part.strip()))  # "/b" of unix:/a,/b is a bare path: unix:/b
    if len(set(out)) != len(out):
        raise ValueError(f"service address list {address!r} names a replica twice")
    if len({is_unix(a) for a in out}) > 1:
        raise ValueError(f"service address list {address!r} mixes unix sockets and TCP: give one kind")
    return out


def resolve(address: str) -> list[tuple[str, str | None]]:
    """The replicas ``address`` names: (address as gRPC takes it, TLS host name or None). A
    ``dns:`` name becomes one ``ipv4:``/``ipv6:`` address per IP it resolves to (socket.getaddrinfo,
    as gRPC's native resolver does), each checked against the name's certificate."""
    if not address.startswith("dns:"):
        return [(a, None) for a in fleet_addresses(address)]
    target = address[len("dns:"):].lstrip("/")
    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise ValueError(f"service address {address!r}: a dns: name needs a port (dns:///HOST:PORT)")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []  # nothing resolves now: the caller resolves again later
    out = []
    for family, _, _, _, sockaddr in infos:
        a = f"ipv4:{sockaddr[0]}:{port}" if family == socket.AF_INET else f"ipv6:[{sockaddr[0]}]:{port}"
        if (a, host) not in out:
            out.append((a, host))
    return out


def stateless_target(address: str, replicas: list[str], tls: bool = False) -> str | None:
    """One gRPC target covering every replica, for round_robin: the ``dns:`` name itself, the unix
    sockets as gRPC's ``unix:a,b`` list, IP literals as an ``ipv4:``/``ipv6:`` list; None when the
    replicas have host names (gRPC resolves one name per target), and for a TLS list (one channel
    checks every certificate against one name: each replica's own probe channel checks its own)."""
    if address.startswith("dns:"):
        return address
    if all(is_unix(a) and unix_socket_path(a) for a in replicas):
        return "unix:" + ",".join(unix_socket_path(a) for a in replicas)
    if tls:
        return None
    for family, scheme in ((socket.AF_INET, "ipv4:"), (socket.AF_INET6, "ipv6:")):
        hosts = []
        for a in replicas:
            host, _, port = a.removeprefix(scheme).rpartition(":")
            try:
                socket.inet_pton(family, host.strip("[]"))
            except OSError:
                break
            hosts.append(f"{host}:{port}")
        else:
            return scheme + ",".join(hosts)
    return None
