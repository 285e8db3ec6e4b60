"""TLS end to end (issue 18, finding 8): a real `nnhal serve --listen` with certificates made here;
the client library, the delegate and the tools connect over TLS, and `--tls-client-ca` makes the
service require client certificates (mTLS). Missing or bad TLS files are one clear line."""
from __future__ import annotations

import logging
import re
import subprocess
import sys

import numpy as np
import pytest

from delegate import load_delegate
from nnhal.examples import mobilenet_like
from service.client import Client, ServiceUnavailableError
from tests.delegate.helpers import assert_outputs_equal, interpreter, random_inputs, run
from tests.service.certs import CertificateAuthority
from tests.service.conftest import HANG_LIMIT_S, TcpServer

MODEL = mobilenet_like(np.int8, input_size=16, width=4)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Two CAs: "a" signs the service's and a client's certificate, "b" (a stranger) another client's."""
    d = tmp_path_factory.mktemp("pki")
    a, b = CertificateAuthority(d, "a"), CertificateAuthority(d, "b")
    return {"ca": a.cert, "server": a.issue("server", server=True), "client": a.issue("client", server=False),
            "stranger": b.issue("client", server=False), "other_ca": b.cert}


def TlsServer(tmp_path, pki, *extra: str) -> TcpServer:
    """`nnhal serve --listen 127.0.0.1:0` with TLS; the port is read from what serve prints."""
    return TcpServer(tmp_path, "--tls-cert", str(pki["server"].cert), "--tls-key", str(pki["server"].key), *extra)


@pytest.fixture
def tls_server(tmp_path, pki):
    s = TlsServer(tmp_path, pki)
    yield s
    s.stop()


@pytest.fixture
def mtls_server(tmp_path, pki):
    s = TlsServer(tmp_path, pki, "--tls-client-ca", str(pki["ca"]))
    yield s
    s.stop()


def _delegated_run(address: str, **options):
    """The int8 model through the delegate (TFLite's reference kernels elsewhere) and through TFLite
    alone, on the same inputs: (delegate's report, outputs, TFLite's outputs)."""
    d = load_delegate(address, **options)
    it = interpreter(MODEL, d)
    cpu = interpreter(MODEL)
    inputs = random_inputs(cpu, np.random.default_rng(0))
    return d.report, run(it, inputs), run(cpu, inputs)


def test_delegate_over_tls_matches_tflite(tls_server, pki):
    report, got, want = _delegated_run(tls_server.address, tls_ca_file=str(pki["ca"]))
    assert report.error is None and report.delegated == len(report.nodes) > 0
    assert report.service == tls_server.address
    assert_outputs_equal(got, want)


def test_plaintext_client_is_refused_by_a_tls_service(tls_server):
    """Named as a TLS mismatch, not as a service that is not there."""
    with pytest.raises(ServiceUnavailableError, match=f"service at {tls_server.address} speaks TLS and this "
                                                      f"client does not: give .*--tls-ca-file"):
        Client.connect(tls_server.address, timeout_s=1.0)


def test_untrusted_service_certificate_is_refused(tls_server, pki):
    """The client checks the service: a CA that did not sign its certificate fails the handshake."""
    with pytest.raises(ServiceUnavailableError, match="over TLS .*CERTIFICATE_VERIFY_FAILED"):
        Client.connect(tls_server.address, timeout_s=1.0, root_certificates=pki["other_ca"].read_bytes())


def test_mtls_client_certificate_signed_by_the_ca_works(mtls_server, pki):
    c = pki["client"]
    with Client.connect(mtls_server.address, root_certificates=pki["ca"].read_bytes(),
                        private_key=c.key.read_bytes(), certificate_chain=c.cert.read_bytes()) as client:
        assert client.get_version_string().startswith("nnhal-")
    report, got, want = _delegated_run(mtls_server.address, tls_ca_file=str(pki["ca"]),
                                       tls_cert_file=str(c.cert), tls_key_file=str(c.key))
    assert report.error is None and report.delegated == len(report.nodes) > 0
    assert_outputs_equal(got, want)


@pytest.mark.parametrize("who", ["no certificate", "stranger"])
def test_mtls_refuses_clients_without_a_certificate_from_its_ca(mtls_server, pki, who, caplog):
    """Refused with a message that says TLS and what to check; the delegate then runs nothing and
    TFLite computes the model itself: the result is still right."""
    cert = {} if who == "no certificate" else {"tls_cert_file": str(pki["stranger"].cert),
                                               "tls_key_file": str(pki["stranger"].key)}
    with caplog.at_level(logging.WARNING, logger="nnhal.delegate"):
        report, got, want = _delegated_run(mtls_server.address, tls_ca_file=str(pki["ca"]), **cert)
    assert any("over TLS" in r.getMessage() for r in caplog.records), caplog.text
    assert report.delegated == 0 and "over TLS" in report.error and "tls_cert_file" in report.error
    assert_outputs_equal(got, want)


def _cli(*args, timeout=HANG_LIMIT_S):
    return subprocess.run([sys.executable, "-m", "nnhal.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_tools_over_mtls(mtls_server, pki, tmp_path):
    model = tmp_path / "m.tflite"
    model.write_bytes(MODEL)
    tls = ["--service-address", mtls_server.address, "--tls-ca-file", str(pki["ca"]),
           "--tls-cert-file", str(pki["client"].cert), "--tls-key-file", str(pki["client"].key)]
    diff = _cli("inference-diff", "--model_file", str(model), "--num_runs", "2", "--reference_kernels", *tls)
    assert diff.returncode == 0, diff.stderr
    assert re.search(r"Delegation: (\d+)/\1 nodes in 1 partition\(s\) on nnhal$", diff.stdout, re.M), diff.stdout
    assert "OutputDiff[0]: avg_error=0," in diff.stdout
    bench = _cli("benchmark", "--model_file", str(model), "--runs", "2", "--warmup", "0", "--json", *tls)
    assert bench.returncode == 0, bench.stderr
    assert '"service": "' + mtls_server.address in bench.stdout
    report = _cli("report", "--model_file", str(model), *tls)
    assert report.returncode == 0 and f"to {mtls_server.address}" in report.stdout, report.stderr
    cts = _cli("cts", "--service", mtls_server.address, "--op", "RELU", "--tls-ca-file", str(pki["ca"]),
               "--tls-cert-file", str(pki["client"].cert), "--tls-key-file", str(pki["client"].key))
    assert cts.returncode == 0 and f"service ({mtls_server.address})" in cts.stdout, cts.stderr


# ---- missing or bad TLS files: one line, exit 2 (finding 7) --------------------------------------

def _one_line_error(r: subprocess.CompletedProcess, *words: str) -> str:
    lines = [x for x in r.stderr.splitlines() if not re.match(r"[EIW]\d{4} ", x)]  # grpc's own C log lines
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


def test_serve_with_missing_or_bad_tls_files(tmp_path, pki):
    srv = pki["server"]
    listen = ["serve", "--listen", "127.0.0.1:0", "--no-cache"]
    missing = str(tmp_path / "missing.pem")
    _one_line_error(_cli(*listen, "--tls-cert", missing, "--tls-key", str(srv.key)), "--tls-cert", missing,
                    "No such file")
    _one_line_error(_cli(*listen, "--tls-cert", str(srv.cert), "--tls-key", str(srv.key), "--tls-client-ca",
                         missing), "--tls-client-ca", missing)
    not_pem = tmp_path / "key.txt"
    not_pem.write_text("not a key\n")
    _one_line_error(_cli(*listen, "--tls-cert", str(srv.cert), "--tls-key", str(not_pem)), "not a PEM file")
    # A key that is not the certificate's: grpc cannot build the TLS context.
    _one_line_error(_cli(*listen, "--tls-cert", str(srv.cert), "--tls-key", str(pki["client"].key)),
                    "cannot listen on 127.0.0.1:0", "does not match")
    _one_line_error(_cli("serve", "--socket", str(tmp_path / "s.sock"), "--tls-client-ca", str(pki["ca"])),
                    "--tls-client-ca needs --tls-cert")


@pytest.mark.parametrize("tool", [("report",), ("inference-diff", "--num_runs", "1"),
                                  ("benchmark", "--runs", "1")])
def test_tools_with_missing_tls_files(tmp_path, pki, tool):
    model = tmp_path / "m.tflite"
    model.write_bytes(MODEL)
    missing = str(tmp_path / "missing.pem")
    base = [*tool, "--model_file", str(model), "--service-address", "127.0.0.1:9"]
    _one_line_error(_cli(*base, "--tls-ca-file", missing), "--tls-ca-file", missing, "No such file")
    _one_line_error(_cli(*base, "--tls-cert-file", str(pki["client"].cert)), "--tls-cert-file and --tls-key-file")
    for unix in (f"unix:{tmp_path}/s.sock", f"{tmp_path}/s.sock"):  # a bare path is a unix socket too
        _one_line_error(_cli(*tool, "--model_file", str(model), "--service-address", unix,
                             "--tls-ca-file", str(pki["ca"])), "needs a TCP service address")


def test_cts_with_missing_tls_file(tmp_path):
    _one_line_error(_cli("cts", "--service", "127.0.0.1:9", "--tls-ca-file", str(tmp_path / "none.pem")),
                    "--tls-ca-file", "No such file")


def test_delegate_option_with_missing_tls_file(tmp_path):
    with pytest.raises(ValueError, match="cannot read tls_ca_file .*none.pem: No such file"):
        load_delegate("127.0.0.1:9", tls_ca_file=str(tmp_path / "none.pem"))
