"""TLS files for the service and its clients, read once up front: a missing, unreadable or non-PEM
file is one clear ValueError before anything connects or listens, not a handshake that fails later
with a transport error. And, when a client cannot connect, whether TLS is why (connect_failure)."""
from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass

import grpc

from service.address import client_address, is_unix, tcp_host_port
from service.proto import nnhal_pb2 as pb
from service.proto import nnhal_pb2_grpc as pb_grpc

#: The HTTP/2 client preface and an empty SETTINGS frame: a plaintext gRPC service answers it with
#: its own SETTINGS frame (type 4, the fourth byte of the frame header).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 4


def read_pem(path: str, what: str) -> bytes:
    """The bytes of PEM file ``path``; ``what`` names it in the error ("TLS CA file")."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"{what} {path} is not a PEM file (no -----BEGIN line)")
    return data


@dataclass(frozen=True)
class ClientTls:
    """What a client proves and trusts: grpc.ssl_channel_credentials' three arguments."""
    root_certificates: bytes | None = None  # None: the system's trusted roots
    private_key: bytes | None = None  # with certificate_chain: a client certificate (mTLS)
    certificate_chain: bytes | None = None

    def connect_kwargs(self) -> dict:
        return {"root_certificates": self.root_certificates, "private_key": self.private_key,
                "certificate_chain": self.certificate_chain}


def client_tls(ca_file: str | None, cert_file: str | None, key_file: str | None,
               names: tuple[str, str, str] = ("tls_ca_file", "tls_cert_file", "tls_key_file")) -> ClientTls | None:
    """Read a client's TLS files; None when none is given (plaintext). ``names`` are the option or
    flag names the caller's user typed, for the error messages."""
    if ca_file is None and cert_file is None and key_file is None:
        return None
    if (cert_file is None) != (key_file is None):
        raise ValueError(f"{names[1]} and {names[2]} go together (the client certificate and its key)")
    return ClientTls(read_pem(ca_file, names[0]) if ca_file else None,
                     read_pem(key_file, names[2]) if key_file else None,
                     read_pem(cert_file, names[1]) if cert_file else None)


def check_tls_address(address: str | None, option: str = "TLS") -> None:
    """TLS applies to a TCP address (HOST:PORT); the unix socket (unix:PATH or a bare path) is
    protected by its file mode."""
    if address is None or is_unix(client_address(address)):
        raise ValueError(f"{option} needs a TCP service address (HOST:PORT), not "
                         f"{address or 'the default unix socket'}")


def probe_transport(address: str, timeout_s: float = 1.0) -> str | None:
    """"tls" or "plaintext": what the service at TCP ``address`` speaks, asked on a fresh socket of
    its own; None when that cannot be told (a unix socket, nothing listening, neither answer).
    Only after a connection failed: gRPC reports a TLS/plaintext mismatch as a channel that never
    becomes ready, indistinguishable from a service that is not there."""
    where = tcp_host_port(address)
    if where is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # only whether it speaks TLS: who it is, the real channel checks
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection(where, timeout=timeout_s) as raw, context.wrap_socket(raw):
            return "tls"  # the handshake completed (an mTLS service refuses a certificate-less client later)
    except ssl.SSLError as e:
        if "ALERT" in (e.reason or ""):  # it answered with a TLS alert: it speaks TLS, and refused
            return "tls"
    except OSError:
        return None
    try:
        with socket.create_connection(where, timeout=timeout_s) as raw:
            raw.sendall(_H2_PREFACE)
            frame = b""
            while len(frame) < 9 and (chunk := raw.recv(9 - len(frame))):
                frame += chunk
    except OSError:
        return None
    return "plaintext" if len(frame) == 9 and frame[3] == _H2_SETTINGS else None


@dataclass(frozen=True)
class ServerTls:
    """The service's certificate and key; with ``client_ca``, clients must present a certificate
    signed by it (mTLS)."""
    cert_chain: bytes
    private_key: bytes
    client_ca: bytes | None = None

    def credentials(self):
        return grpc.ssl_server_credentials([(self.private_key, self.cert_chain)], root_certificates=self.client_ca,
                                           require_client_auth=self.client_ca is not None)


def server_tls(cert_file: str, key_file: str, client_ca_file: str | None = None) -> ServerTls:
    """`nnhal serve`'s --tls-cert, --tls-key and --tls-client-ca, read (ValueError: one line)."""
    return ServerTls(read_pem(cert_file, "--tls-cert"), read_pem(key_file, "--tls-key"),
                     read_pem(client_ca_file, "--tls-client-ca") if client_ca_file else None)


def connect_failure(address: str, timeout_s: float, tls: bool, channel: grpc.Channel) -> str:
    """Why no service answered a client at ``address`` (Client.connect): a TLS/plaintext mismatch
    is named as such (gRPC shows it only as a channel that never becomes ready), a refused
    handshake in the transport's words (a refused certificate must not look like a service that is
    down)."""
    speaks = probe_transport(address)
    if speaks == "tls" and not tls:
        return (f"the nnhal service at {address} speaks TLS and this client does not: give the CA "
                f"that signed its certificate (--tls-ca-file; tls_ca_file from Python)")
    if speaks == "plaintext" and tls:
        return (f"the nnhal service at {address} does not speak TLS (nnhal serve --insecure): connect "
                f"without --tls-ca-file/--tls-cert-file/--tls-key-file (tls_* from Python)")
    why = _tls_failure(channel) if tls else "(start one with `nnhal serve`)"
    return f"no nnhal service answers at {address} within {timeout_s:g} s {why}"


def _tls_failure(channel: grpc.Channel) -> str:
    """The transport's reason a TLS channel is not ready (an untrusted certificate, a client
    certificate the service refuses)."""
    try:
        pb_grpc.DeviceStub(channel).GetVersionString(pb.Empty(), timeout=1.0)
        return "over TLS"
    except grpc.RpcError as e:
        detail = e.details() if hasattr(e, "details") else str(e)
    return (f"over TLS ({detail}); check the CA file (--tls-ca-file), and the client certificate "
            f"(--tls-cert-file, --tls-key-file) if the service requires one (tls_ca_file, tls_cert_file, "
            f"tls_key_file from Python)")
