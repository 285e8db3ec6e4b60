"""Several services as one (issue 35, service.fleet): real `nnhal serve` replicas on unix sockets and
on TCP (plaintext on loopback, and TLS), one shared compilation cache; replicas killed, stopped and
started later. Outputs are checked against the same model computed by numpy (ADD) or TFLite."""
from __future__ import annotations

import os
import shutil
import threading
import time

import numpy as np
import pytest

from delegate.options import NnhalOptions
from service.address import fleet_addresses, is_fleet, resolve, stateless_target
from service.client import Client, ServiceError, ServiceUnavailableError
from service.fleet import FleetClient
from service.server import MAX_SOCKET_PATH_BYTES
from tests.service.conftest import HANG_LIMIT_S, ServerProcess, TcpServer, returns, stopped
from tests.service.models import add_model
from tests.service.test_tls import TlsServer, _delegated_run, pki  # noqa: F401, F811 - pki is a fixture

X = np.arange(6, dtype=np.float32).reshape(2, 3)
Y = np.full((2, 3), 0.5, np.float32)


def replica(tmp_path, i: int, cache) -> ServerProcess:
    d = tmp_path / f"r{i}"
    d.mkdir(exist_ok=True)
    return ServerProcess(d, "--cache-dir", str(cache))


@pytest.fixture
def fleet(tmp_path):
    servers = [replica(tmp_path, i, tmp_path / "cache") for i in range(3)]
    yield servers
    for s in servers:
        if s.proc.poll() is None:
            s.stop()


def server_of(servers, pm) -> ServerProcess:
    return next(s for s in servers if s.address == pm.replica.address)


def until(predicate, what: str):
    """Wait for ``predicate`` (health checks run every half second); a bound against hangs only."""
    deadline = time.monotonic() + HANG_LIMIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def test_address_lists_are_parsed_checked_and_normalized(tmp_path):
    assert fleet_addresses("unix:/a.sock,/b.sock") == ["unix:/a.sock", "unix:/b.sock"]
    assert fleet_addresses("h1:50051, h2:50051") == ["h1:50051", "h2:50051"]
    assert is_fleet("dns:///nnhal:50051") and is_fleet("a:1,b:2") and not is_fleet("a:1") and not is_fleet(None)
    for bad, why in (("/a.sock,h1:1", "mixes unix sockets and TCP"), ("a:1,a:1", "twice"), ("a:1,,b:2", "empty"),
                     ("dns:///x:1,y:2", "names one host"), ("a:1,localhost", "neither HOST:PORT nor a socket")):
        with pytest.raises(ValueError, match=why):
            fleet_addresses(bad)
    with pytest.raises(ValueError, match="needs a port"):
        resolve("dns:///localhost")
    assert resolve("dns:///localhost:7") == [("ipv4:127.0.0.1:7", "localhost")]
    assert stateless_target("x", ["unix:/a", "unix:/b"]) == "unix:/a,/b"
    assert stateless_target("x", ["127.0.0.1:1", "ipv4:127.0.0.2:2"]) == "ipv4:127.0.0.1:1,127.0.0.2:2"
    assert stateless_target("x", ["h1:1", "h2:2"]) is None  # host names: one gRPC target resolves one name
    assert stateless_target("x", ["127.0.0.1:1", "127.0.0.2:2"], tls=True) is None  # each checked as itself
    # The delegate's option: each element normalized (a bare path becomes unix:ABS), socket paths checked.
    o = NnhalOptions.from_kwargs(service_address=f"{tmp_path}/a.sock,{tmp_path}/b.sock")
    assert o.service_address == f"unix:{tmp_path}/a.sock,unix:{tmp_path}/b.sock"
    with pytest.raises(ValueError, match=f"at most {MAX_SOCKET_PATH_BYTES}"):
        NnhalOptions.from_kwargs(service_address=f"/a.sock,/{'x' * 200}.sock")


def test_one_address_stays_the_one_service_client(server):
    """No fleet machinery on the one-service path (its shared-memory burst is the hot path)."""
    from delegate.embedded import connect
    health_threads = sum(t.name == "nnhal-fleet-health" for t in threading.enumerate())
    c = connect(server.address)
    try:
        assert type(c) is Client
        assert sum(t.name == "nnhal-fleet-health" for t in threading.enumerate()) == health_threads
    finally:
        c.close()


def test_cts_checks_one_service_and_says_so(tmp_path, capsys):
    from nnhal.cli import main
    assert main(["cts", "--service", f"{tmp_path}/a.sock,{tmp_path}/b.sock"]) == 2
    assert "CTS checks one service" in capsys.readouterr().err


def test_nothing_answering_is_a_clear_error(tmp_path):
    with pytest.raises(ServiceUnavailableError, match=r"no nnhal service of .* answers \(.*a\.sock: .*b\.sock: "):
        FleetClient.connect(f"unix:{tmp_path}/a.sock,unix:{tmp_path}/b.sock", timeout_s=0.5)


def test_models_spread_over_replicas_and_move_when_one_dies_or_stops(fleet, monkeypatch):
    monkeypatch.setenv("NNHAL_EXECUTE_WAIT_MIN_S", "30")  # the health check, not this bound, ends a stop's wait
    with FleetClient.connect(",".join(s.address for s in fleet)) as client:
        assert client.get_version_string() == Client.connect(fleet[0].address).get_version_string()
        assert client.get_supported_operations(add_model()) == [True]
        token = os.urandom(32)
        with pytest.raises(ServiceError):
            client.prepare_model_from_cache(add_model(), token)  # not compiled yet anywhere
        first = client.prepare_model(add_model(), token=token)  # compiled where the cache missed
        models = [first] + [client.prepare_model_from_cache(add_model(), token) for _ in range(2)]
        # Round-robin over the healthy replicas: three models, three replicas (the shared cache had it).
        assert {pm.replica.address for pm in models} == {s.address for s in fleet}
        for pm in models:
            np.testing.assert_array_equal(pm.execute([X, Y]).outputs[0], X + Y)
        pm = models[0]
        burst = pm.local_burst()
        np.testing.assert_array_equal(burst.execute([X, Y]).outputs[0], X + Y)

        killed = server_of(fleet, pm)
        killed.proc.kill()
        killed.proc.wait()
        out = returns(burst.execute, [X, Y])  # retried once on another replica: the burst reopened there
        np.testing.assert_array_equal(out.outputs[0], X + Y)
        assert pm.replica.address != killed.address and client.failovers >= 1
        # Another model on the dead replica moves too, on its next execution (plain RPC this time).
        other = next(m for m in models[1:] if m.replica.address != pm.replica.address)
        np.testing.assert_array_equal(returns(other.execute, [X, 2 * Y]).outputs[0], X + 2 * Y)

        victim = server_of(fleet, pm)
        with stopped(victim):
            out = returns(burst.execute, [2 * X, Y])  # a stopped replica answers nothing: moved, not waited out
            np.testing.assert_array_equal(out.outputs[0], 2 * X + Y)
            assert pm.replica.address not in (victim.address, killed.address)
            assert not client.replicas[victim.address].healthy
        until(lambda: client.replicas[victim.address].healthy, "the resumed replica is healthy again")

        for s in fleet:  # every replica gone: the caller hears it (the delegate then runs on the CPU)
            if s.proc.poll() is None:
                s.proc.kill()
                s.proc.wait()
        with pytest.raises(ServiceUnavailableError):
            returns(burst.execute, [X, Y])
        burst.close()


def test_over_tcp_executions_and_grpc_bursts_move_off_a_stopped_or_killed_replica(tmp_path, monkeypatch):
    """TCP replicas (plaintext on loopback): no shared memory, so unary executions and gRPC bursts;
    a stopped replica's calls in flight are cancelled when its health check fails, then retried."""
    monkeypatch.setenv("NNHAL_EXECUTE_WAIT_MIN_S", "30")  # the health check, not this bound, ends the wait
    servers = []
    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
        servers.append(TcpServer(tmp_path / d, "--insecure"))
    try:
        with FleetClient.connect(",".join(s.address for s in servers)) as client:
            pm = client.prepare_model(add_model())
            burst = pm.burst()
            np.testing.assert_array_equal(burst.execute([X, Y]).outputs[0], X + Y)
            first = next(s for s in servers if s.address == pm.replica.address)
            with stopped(first):
                np.testing.assert_array_equal(returns(burst.execute, [X, 3 * Y]).outputs[0], X + 3 * Y)
                moved_to = pm.replica.address
                assert moved_to != first.address
                second = next(s for s in servers if s.address == moved_to)
                second.proc.kill()
                second.proc.wait()
                np.testing.assert_array_equal(returns(pm.execute, [2 * X, Y]).outputs[0], 2 * X + Y)
                assert pm.replica.address not in (first.address, moved_to)
            burst.close()
    finally:
        for s in servers:
            if s.proc.poll() is None:
                s.stop()


def test_a_listed_replica_started_later_is_reached(tmp_path):
    cache = tmp_path / "cache"
    first = replica(tmp_path, 0, cache)
    later_dir = tmp_path / "r1"
    later_dir.mkdir()
    later_address = f"unix:{later_dir}/nnhal.sock"
    client = FleetClient.connect(f"{first.address},{later_address}")
    try:
        assert [r.address for r in client.healthy()] == [first.address]
        pm = client.prepare_model(add_model())
        assert pm.replica.address == first.address
        later = ServerProcess(later_dir, "--cache-dir", str(cache))
        try:
            until(lambda: len(client.healthy()) == 2, "the later replica is healthy")
            placed = {client.prepare_model(add_model()).replica.address for _ in range(2)}
            assert placed == {first.address, later_address}
            first.stop()
            np.testing.assert_array_equal(returns(pm.execute, [X, Y]).outputs[0], X + Y)
            assert pm.replica.address == later_address
        finally:
            later.stop()
    finally:
        client.close()
        if first.proc.poll() is None:
            first.stop()


def test_a_dns_name_is_resolved_again_and_reaches_new_replicas(tmp_path):
    """dns:///localhost:PORT over TCP, and a name that resolves to one more replica later on (the
    resolver stands in for DNS: this machine's names resolve to one address each)."""
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    a, b = TcpServer(tmp_path / "a", "--insecure"), TcpServer(tmp_path / "b", "--insecure")
    try:
        port = a.address.rsplit(":", 1)[1]
        with FleetClient.connect(f"dns:///localhost:{port}") as client:
            assert [r.address for r in client.healthy()] == [f"ipv4:127.0.0.1:{port}"]
            assert client.get_supported_operations(add_model()) == [True]
            np.testing.assert_array_equal(client.prepare_model(add_model()).execute([X, Y]).outputs[0], X + Y)
        names = [[(a.address, None)]]
        with FleetClient.connect("dns:///nnhal:1", resolver=lambda _: names[-1]) as client:
            names.append([(a.address, None), (b.address, None)])  # the name now has two addresses
            client._resolved_at = 0.0  # due for resolving again (every RESOLVE_INTERVAL_S)
            until(lambda: len(client.healthy()) == 2, "the new address is a healthy replica")
            assert {client.prepare_model(add_model()).replica.address for _ in range(2)} == {a.address, b.address}
    finally:
        a.stop()
        b.stop()


def test_tls_applies_to_every_replica(tmp_path, pki):  # noqa: F811 - the fixture imported above
    servers = []
    try:
        for i in range(2):
            (tmp_path / f"t{i}").mkdir()
            servers.append(TlsServer(tmp_path / f"t{i}", pki, "--tls-client-ca", str(pki["ca"])))
        tls = dict(tls_ca_file=str(pki["ca"]), tls_cert_file=str(pki["client"].cert),
                   tls_key_file=str(pki["client"].key))
        listed = ",".join(s.address for s in servers)
        port = servers[0].address.rsplit(":", 1)[1]
        for address in (listed, f"dns:///localhost:{port}"):  # IPs checked as IPs; the name's IPs as the name
            report, got, want = _delegated_run(address, **tls)
            assert report.error is None and report.delegated == len(report.nodes) > 0 and report.service == address
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
        without_client_cert = dict(tls_ca_file=str(pki["ca"]))
        report, _, _ = _delegated_run(listed, **without_client_cert)  # mTLS: refused by every replica
        assert report.delegated == 0 and "no nnhal service" in report.error
    finally:
        for s in servers:
            s.stop()


def test_replicas_sharing_a_cache_directory_load_what_another_wrote(tmp_path):
    cache = tmp_path / "cache"
    servers = [replica(tmp_path, i, cache) for i in range(2)]
    try:
        token = os.urandom(32)
        with Client.connect(servers[0].address) as one:
            one.prepare_model(add_model(), token=token)  # compiled and stored by replica 0
        with Client.connect(servers[1].address) as two:
            pm = two.prepare_model_from_cache(add_model(), token)  # loaded by replica 1
            np.testing.assert_array_equal(pm.execute([X, Y]).outputs[0], X + Y)
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(cache, ignore_errors=True)
