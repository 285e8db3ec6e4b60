"""TLS files for the service and its clients, read once up front: a missing, unreadable or non-PEM
file is one clear ValueError before anything connects or listens, not a handshake that fails later
with a transport error."""
from __future__ import annotations

from dataclasses import dataclass


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
    """TLS applies to a TCP address (HOST:PORT); the unix socket is protected by its file mode."""
    if address is None or address.startswith("unix:") or address.startswith("unix-abstract:"):
        raise ValueError(f"{option} needs a TCP service address (HOST:PORT), not "
                         f"{address or 'the default unix socket'}")


@dataclass(frozen=True)
class ServerTls:
    """The service's certificate and key; with ``client_ca``, clients must present a certificate
    signed by it (mTLS)."""
    cert_chain: bytes
    private_key: bytes
    client_ca: bytes | None = None

    def credentials(self):
        import grpc
        return grpc.ssl_server_credentials([(self.private_key, self.cert_chain)], root_certificates=self.client_ca,
                                           require_client_auth=self.client_ca is not None)


def server_tls(cert_file: str, key_file: str, client_ca_file: str | None = None) -> ServerTls:
    """`nnhal serve`'s --tls-cert, --tls-key and --tls-client-ca, read (ValueError: one line)."""
    return ServerTls(read_pem(cert_file, "--tls-cert"), read_pem(key_file, "--tls-key"),
                     read_pem(client_ca_file, "--tls-client-ca") if client_ca_file else None)
