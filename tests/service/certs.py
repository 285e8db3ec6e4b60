"""Certificates for the TLS tests, made on the spot: a CA, a server certificate for 127.0.0.1 and
localhost signed by it, and client certificates (mTLS). EC P-256 keys: quick to generate."""
from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Issued:
    cert: Path
    key: Path


class CertificateAuthority:
    def __init__(self, directory: Path, name: str):
        self.dir = directory
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"nnhal test CA {name}")])
        self._cert = (self._builder(self._subject, self._key.public_key())
                      .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                      .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                   content_commitment=False, key_encipherment=False,
                                                   data_encipherment=False, key_agreement=False,
                                                   encipher_only=False, decipher_only=False), critical=True)
                      .sign(self._key, hashes.SHA256()))
        self.cert = directory / f"{name}-ca.pem"
        self.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def _builder(self, subject: x509.Name, public_key) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.timezone.utc)
        return (x509.CertificateBuilder().subject_name(subject)
                .issuer_name(self._subject if hasattr(self, "_cert") else subject)
                .public_key(public_key).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1)))

    def issue(self, common_name: str, *, server: bool) -> Issued:
        """A leaf certificate: for a server (SAN 127.0.0.1, ::1 and localhost) or a client."""
        key = ec.generate_private_key(ec.SECP256R1())
        b = self._builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]), key.public_key())
        b = b.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        if server:
            b = b.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("::1"))]), critical=False)
            b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        else:
            b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        cert = b.sign(self._key, hashes.SHA256())
        out = Issued(self.dir / f"{self.name}-{common_name}.pem", self.dir / f"{self.name}-{common_name}.key")
        out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        out.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
        out.key.chmod(0o600)
        return out
