"""Service addresses (issue 33, item 3): a bare socket path is the unix socket wherever an address
is taken (Client.connect, the delegate's service_address, the tools' --service-address, `nnhal cts
--service`); a name that could be a socket or a host is refused with both spellings; a TLS client
at a plaintext service, or a plaintext client at a TLS service, is told so instead of "no service"."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from delegate import load_delegate
from nnhal.examples import mobilenet_like
from service.address import client_address, tcp_host_port
from service.client import Client, ServiceUnavailableError
from service.server import create_server
from service.tls import ServerTls, probe_transport
from tests.delegate.helpers import assert_outputs_equal, interpreter, random_inputs, run
from tests.service.certs import CertificateAuthority
from tests.service.conftest import HANG_LIMIT_S

MODEL = mobilenet_like(np.int8, input_size=16, width=4)


@pytest.mark.parametrize("given, want", [
    ("unix:/run/s.sock", "unix:/run/s.sock"),
    ("unix:s.sock", "unix:s.sock"),
    ("127.0.0.1:50051", "127.0.0.1:50051"),
    ("[::1]:50051", "[::1]:50051"),
    ("dns:///example.org:443", "dns:///example.org:443"),
    ("/run/s.sock", "unix:/run/s.sock"),
    ("/run/odd:name.sock", "unix:/run/odd:name.sock"),
])
def test_address_forms(given, want):
    assert client_address(given) == want


def test_relative_and_home_paths_become_absolute(tmp_path, monkeypatch):
    """A channel reconnects later: its socket must not depend on the working directory then."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert client_address("./s.sock") == f"unix:{tmp_path}/s.sock"
    assert client_address("run/s.sock") == f"unix:{tmp_path}/run/s.sock"
    assert client_address("~/s.sock") == f"unix:{tmp_path}/home/s.sock"


@pytest.mark.parametrize("name", ["s.sock", "localhost"])
def test_a_name_that_could_be_a_socket_or_a_host_is_refused(name):
    with pytest.raises(ValueError, match=f"give HOST:PORT for TCP, or unix:{name} .* for a unix socket"):
        Client.connect(name, timeout_s=0.1)
    with pytest.raises(ValueError, match=f"unix:{name}"):
        load_delegate(name)


def test_tcp_host_port():
    assert tcp_host_port("127.0.0.1:5") == ("127.0.0.1", 5)
    assert tcp_host_port("[::1]:5") == ("::1", 5)
    assert tcp_host_port("ipv4:10.0.0.1:7,10.0.0.2:7") == ("10.0.0.1", 7)
    assert tcp_host_port("dns:///h:9") == ("h", 9)
    assert tcp_host_port("unix:/run/s.sock") is None


@pytest.fixture
def unix_server(tmp_path):
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    running = create_server(str(d / "s.sock"))
    yield running
    running.stop()


def test_client_connects_to_a_bare_socket_path(unix_server, tmp_path, monkeypatch):
    with Client.connect(unix_server.socket_path) as c:
        assert c.address == unix_server.address and c.get_version_string().startswith("nnhal-")
    monkeypatch.chdir(tmp_path)
    with Client.connect("./run/s.sock") as c:
        assert c.address == unix_server.address


def test_delegate_runs_on_a_bare_socket_path(unix_server):
    d = load_delegate(unix_server.socket_path)
    it, cpu = interpreter(MODEL, d), interpreter(MODEL)
    inputs = random_inputs(cpu, np.random.default_rng(0))
    got, want = run(it, inputs), run(cpu, inputs)
    assert d.report.error is None and d.report.delegated == len(d.report.nodes) > 0
    assert d.report.service == unix_server.address  # the local burst needs to see a unix socket
    assert_outputs_equal(got, want)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "nnhal.cli", *args], capture_output=True, text=True,
                          timeout=HANG_LIMIT_S)


def test_tools_take_a_bare_socket_path(unix_server, tmp_path):
    model = tmp_path / "m.tflite"
    model.write_bytes(MODEL)
    report = _cli("report", "--model_file", str(model), "--service-address", unix_server.socket_path)
    assert report.returncode == 0 and f"to {unix_server.address}" in report.stdout, report.stderr
    cts = _cli("cts", "--service", unix_server.socket_path, "--op", "RELU")
    assert cts.returncode == 0 and "service (" in cts.stdout, cts.stderr
    bad = _cli("cts", "--service", "s.sock", "--op", "RELU")
    assert bad.returncode == 2 and bad.stderr.startswith("nnhal cts: service address 's.sock'"), bad.stderr
    assert "unix:s.sock" in bad.stderr


# ---- TLS / plaintext mismatch ------------------------------------------------------------------

@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca = CertificateAuthority(tmp_path_factory.mktemp("pki"), "a")
    return ca, ca.issue("server", server=True)


@pytest.fixture
def plaintext_tcp():
    running = create_server(listen="127.0.0.1:0", insecure=True)
    yield running
    running.stop()


@pytest.fixture
def tls_tcp(pki):
    _, server = pki
    running = create_server(listen="127.0.0.1:0", tls=ServerTls(server.cert.read_bytes(), server.key.read_bytes()))
    yield running
    running.stop()


def test_probe_tells_tls_from_plaintext(plaintext_tcp, tls_tcp, unix_server):
    assert probe_transport(tls_tcp.address) == "tls"
    assert probe_transport(plaintext_tcp.address) == "plaintext"
    assert probe_transport(unix_server.address) is None
    running = create_server(listen="127.0.0.1:0", insecure=True)
    closed = running.address
    running.stop()
    assert probe_transport(closed) is None  # nothing listens: no answer to go by


def test_plaintext_client_at_a_tls_service(tls_tcp):
    with pytest.raises(ServiceUnavailableError, match=f"at {tls_tcp.address} speaks TLS and this client does "
                                                      f"not: give .*--tls-ca-file"):
        Client.connect(tls_tcp.address, timeout_s=0.5)
    cts = _cli("cts", "--service", tls_tcp.address, "--op", "RELU")
    assert cts.returncode == 2 and "speaks TLS" in cts.stderr and "Traceback" not in cts.stderr, cts.stderr


def test_tls_client_at_a_plaintext_service(plaintext_tcp, pki):
    ca, _ = pki
    with pytest.raises(ServiceUnavailableError, match=f"at {plaintext_tcp.address} does not speak TLS .*without "
                                                      f"--tls-ca-file"):
        Client.connect(plaintext_tcp.address, timeout_s=0.5, root_certificates=ca.cert.read_bytes())
    cts = _cli("cts", "--service", plaintext_tcp.address, "--op", "RELU", "--tls-ca-file", str(ca.cert))
    assert cts.returncode == 2 and "does not speak TLS" in cts.stderr, cts.stderr


def test_nothing_listening_is_still_no_service():
    running = create_server(listen="127.0.0.1:0", insecure=True)
    running.stop()
    with pytest.raises(ServiceUnavailableError, match="no nnhal service answers at .*start one"):
        Client.connect(running.address, timeout_s=0.3)
