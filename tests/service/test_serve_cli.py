"""`nnhal serve` flags: TCP needs TLS or loopback --insecure; health service answers."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.client import Client
from service.server import create_server


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nnhal.cli", "serve", *args], capture_output=True,
                          text=True, timeout=30)


def test_listen_without_tls_is_refused():
    r = _serve("--listen", "127.0.0.1:0")
    assert r.returncode == 2 and "--tls-cert" in r.stderr


def test_insecure_refused_off_loopback():
    r = _serve("--listen", "0.0.0.0:0", "--insecure")
    assert r.returncode == 2 and "loopback" in r.stderr


def test_tls_flags_go_together():
    r = _serve("--listen", "127.0.0.1:0", "--tls-cert", "x.pem")
    assert r.returncode == 2 and "go together" in r.stderr


def test_insecure_loopback_tcp_and_health():
    running = create_server(listen="127.0.0.1:0", insecure=True)
    try:
        with Client.connect(running.address) as c:
            assert c.get_version_string().startswith("nnhal-")
            stub = health_pb2_grpc.HealthStub(c.channel)
            for name in ("", "nnhal.v1.Device", "nnhal.v1.PreparedModel"):
                resp = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
                assert resp.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        running.stop()


def test_connect_to_nothing_is_a_clear_error(tmp_path):
    import pytest

    from service.client import ServiceUnavailableError
    with pytest.raises(ServiceUnavailableError, match="no nnhal service answers at unix:"):
        Client.connect("unix:" + str(tmp_path / "none.sock"), timeout_s=0.5)


def test_unknown_health_service(tmp_path):
    running = create_server(str(tmp_path / "s.sock"))
    try:
        with grpc.insecure_channel(running.address) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            try:
                stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
                raise AssertionError("expected NOT_FOUND")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.NOT_FOUND
    finally:
        running.stop()


# ---- issue 18, finding 4: files the service must never destroy or take over ---------------------

def _private_dir(tmp_path, name="run"):
    d = tmp_path / name
    d.mkdir(mode=0o700)
    return d


def test_regular_file_at_socket_path_is_refused_and_kept(tmp_path):
    f = _private_dir(tmp_path) / "F"
    f.write_text("important\n")
    r = _serve("--socket", str(f), "--no-cache")
    assert r.returncode == 2 and "not a socket" in r.stderr and "Traceback" not in r.stderr
    assert f.read_text() == "important\n"


def test_second_serve_refuses_a_live_socket(server):
    """A second server must not take the socket over (and later remove it from under the first)."""
    r = _serve("--socket", server.socket, "--no-cache")
    assert r.returncode == 2 and "already listening" in r.stderr and "Traceback" not in r.stderr
    assert os.path.exists(server.socket)
    with Client.connect(server.address) as c:  # the first server still owns and answers it
        assert c.get_version_string().startswith("nnhal-")


def test_stale_socket_is_replaced(tmp_path):
    path = str(_private_dir(tmp_path) / "s.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)  # bound, never listening, closed: what a crashed server leaves
    s.close()
    running = create_server(path)
    try:
        with Client.connect(running.address) as c:
            assert c.get_version_string().startswith("nnhal-")
    finally:
        running.stop()
    assert not os.path.exists(path)


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770])
def test_group_or_world_writable_socket_dir_is_refused(tmp_path, mode):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, mode)
    r = _serve("--socket", str(d / "s.sock"), "--no-cache")
    assert r.returncode == 2 and "writable by group or others" in r.stderr and "Traceback" not in r.stderr
    assert os.listdir(d) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_socket_dir_owned_by_another_user_is_refused(tmp_path):
    d = _private_dir(tmp_path, "theirs")
    os.chown(d, 65534, 65534)
    r = _serve("--socket", str(d / "s.sock"), "--no-cache")
    assert r.returncode == 2 and "owned by uid 65534" in r.stderr and "Traceback" not in r.stderr
    assert os.listdir(d) == []


def test_negative_cache_max_bytes_is_refused(tmp_path):
    r = _serve("--socket", str(_private_dir(tmp_path) / "s.sock"), "--cache-dir", str(tmp_path / "cache"),
               "--cache-max-bytes", "-1")
    assert r.returncode == 2 and "--cache-max-bytes" in r.stderr and "Traceback" not in r.stderr


def test_serve_moves_a_corrupt_cache_key_aside_and_makes_a_new_one(tmp_path):
    """The key authenticates every entry: a bad one makes the whole cache unusable, not the service."""
    from tests.service.conftest import ServerProcess
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / "cache.key").write_bytes(b"short")
    s = ServerProcess(tmp_path)
    try:
        with Client.connect(s.address) as c:
            assert c.get_version_string().startswith("nnhal-")
    finally:
        s.stop()
    assert len((cache / "cache.key").read_bytes()) == 32
    aside = [p for p in cache.iterdir() if p.name.startswith("cache.key.bad-")]
    assert len(aside) == 1 and aside[0].read_bytes() == b"short"
    assert "cache key" in s.output() and aside[0].name in s.output()


def test_second_serve_refuses_a_live_tcp_port():
    """Issue 34 item 3: gRPC's SO_REUSEPORT let a second service bind a port a live one holds (the
    kernel then splits the clients between them). The second one now fails in one line."""
    running = create_server(listen="127.0.0.1:0", insecure=True)
    try:
        r = _serve("--listen", running.address, "--insecure", "--no-cache")
        assert r.returncode != 0, r.stdout
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert lines[0] == f"nnhal serve: cannot listen on {running.address}: another server is already listening there"
        with Client.connect(running.address) as c:  # the first service still answers on it
            assert c.get_version_string().startswith("nnhal-")
    finally:
        running.stop(grace=0)


def test_bind_itself_refuses_a_live_tcp_port(monkeypatch):
    """Behind the probe, the bind: with SO_REUSEPORT off a second server racing the probe (or one
    it cannot reach) still fails to bind instead of sharing the port."""
    import service.server as server_module
    running = create_server(listen="127.0.0.1:0", insecure=True)
    try:
        monkeypatch.setattr(server_module, "_refuse_live_tcp_port", lambda listen: None)
        with pytest.raises(ValueError, match=f"cannot listen on {running.address}: the address is in use"):
            create_server(listen=running.address, insecure=True).stop(grace=0)
    finally:
        running.stop(grace=0)


def test_a_service_process_imports_nothing_of_the_delegate():
    """`nnhal serve`'s command line, service and extension plugins: no module of the delegate nor
    of TFLite's schema (the layering, and a tenth of a second of every service's start)."""
    code = ("import sys\nfrom nnhal.cli import build_parser\n"
            "build_parser('serve').parse_args(['serve'])\n"
            "import service.server\nfrom extensions.plugins import load_plugins\nload_plugins()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('delegate', 'tflite')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
