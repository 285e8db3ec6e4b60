"""Trust boundaries (issue 34): what a client may name on the service's machine.

A shared-memory pool is a file name the service opens with its own rights. Over TCP (insecure
loopback or TLS) a client could name any file in the service host's /dev/shm and read or overwrite
it; the service now accepts shared-memory pools only on its unix socket, and there only segments
an nnhal client of the service's user made. Every attack here runs against a real `nnhal serve`.
"""
from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from hal.types import ErrorStatus, OperandType
from service import convert
from service.client import SHM_THRESHOLD, Client, ServiceError
from service.proto import nnhal_pb2 as pb
from tests.service.certs import CertificateAuthority
from tests.service.conftest import TcpServer
from tests.service.models import add_model

SECRET = np.arange(6, dtype=np.float32) + 1000.0  # what the victim segment holds


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca = CertificateAuthority(tmp_path_factory.mktemp("pki"), "a")
    return {"ca": ca.cert, "server": ca.issue("server", server=True), "client": ca.issue("client", server=False)}


@pytest.fixture(params=["insecure", "mtls"])
def tcp_client(request, tmp_path, pki):
    """A client of a TCP service: insecure loopback, or TLS with a client certificate (mTLS: the
    strongest TCP client there is; it still names no file on the service's machine)."""
    if request.param == "insecure":
        server = TcpServer(tmp_path, "--insecure")
        client = Client.connect(server.address)
    else:
        server = TcpServer(tmp_path, "--tls-cert", str(pki["server"].cert), "--tls-key", str(pki["server"].key),
                           "--tls-client-ca", str(pki["ca"]))
        client = Client.connect(server.address, root_certificates=pki["ca"].read_bytes(),
                                private_key=pki["client"].key.read_bytes(),
                                certificate_chain=pki["client"].cert.read_bytes())
    yield client
    client.close()
    server.stop()


@pytest.fixture
def victim():
    """A file in /dev/shm as the service's user keeps one: 0600, one link, nnhal-named (so nothing
    but the transport stands between a TCP client and its bytes)."""
    path = f"/dev/shm/nnhal-victim-{uuid.uuid4().hex[:12]}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.write(fd, SECRET.tobytes() + b"\0" * (4096 - SECRET.nbytes))
    os.close(fd)
    yield path
    os.unlink(path)


def _ref(path: str, size: int = 4096) -> pb.Memory:
    return pb.Memory(shared=pb.SharedMemoryRef(name=os.path.basename(path), size=size))


def _execute(client: Client, pm_id: str, request: pb.Request) -> pb.ExecuteReply:
    return client.prepared.Execute(pb.ExecuteRequest(prepared_model_id=pm_id, request=request), timeout=60,
                                   metadata=client.session)


def _read_request(path: str) -> pb.Request:
    """a + 0 with ``a`` read from the named segment: the output would be its first 24 bytes."""
    r = pb.Request(pools=[_ref(path)])
    r.inputs.add(location=pb.DataLocation(pool_index=0, offset=0, length=24))
    r.inputs.add(data=np.zeros(6, np.float32).tobytes())
    r.outputs.add(inline_capacity=24)
    return r


def _write_request(path: str) -> pb.Request:
    """1 + 1 written into the named segment at offset 0."""
    r = pb.Request(pools=[_ref(path)])
    r.inputs.add(data=np.ones(6, np.float32).tobytes())
    r.inputs.add(data=np.ones(6, np.float32).tobytes())
    r.outputs.add(location=pb.DataLocation(pool_index=0, offset=0, length=24))
    return r


def _refused_over_tcp(reply) -> None:
    assert reply.status.code == ErrorStatus.INVALID_ARGUMENT, reply.status
    assert "only on the service's unix socket" in reply.status.message


def _intact(path: str) -> None:
    with open(path, "rb") as f:
        assert np.frombuffer(f.read(24), np.float32).tolist() == SECRET.tolist()


def test_tcp_client_cannot_read_a_segment_by_name(tcp_client, victim):
    pm = tcp_client.prepare_model(add_model())
    reply = _execute(tcp_client, pm.id, _read_request(victim))
    _refused_over_tcp(reply)
    assert not reply.outputs


def test_tcp_client_cannot_overwrite_a_segment_by_name(tcp_client, victim):
    pm = tcp_client.prepare_model(add_model())
    _refused_over_tcp(_execute(tcp_client, pm.id, _write_request(victim)))
    _intact(victim)


def test_tcp_client_cannot_read_a_segment_as_model_constants(tcp_client, victim):
    model = convert.model_to_proto(add_model(constant=np.zeros((2, 3), np.float32)))
    for o in model.main.operands:
        if o.lifetime == 1:  # CONSTANT_COPY -> CONSTANT_POOL 0: the weights would be the victim's bytes
            o.lifetime = 2
            o.location.pool_index = 0
    model.operand_values = b""
    model.pools.append(_ref(victim))
    for call, request in ((tcp_client.device.PrepareModel, pb.PrepareModelRequest(model=model)),
                          (tcp_client.device.GetSupportedOperations, pb.SupportedOperationsRequest(model=model))):
        _refused_over_tcp(call(request, timeout=60, metadata=tcp_client.session))


def test_tcp_client_cannot_register_a_segment_in_a_burst(tcp_client, victim):
    pm = tcp_client.prepare_model(add_model())
    msg = pb.BurstRequest(serial=0)
    msg.register_pools.add(pool_id=1, memory=_ref(victim))
    msg.execute.prepared_model_id = pm.id
    msg.execute.request.CopyFrom(_write_request(victim))
    msg.execute.request.pools[0].CopyFrom(pb.Memory(burst_pool=1))
    replies = list(tcp_client.prepared.ExecuteBurst(iter([msg]), timeout=60, metadata=tcp_client.session))
    _refused_over_tcp(replies[0].result)
    _intact(victim)


def test_tcp_client_sends_large_tensors_inline(tcp_client):
    """The client library never offers shared memory over TCP: tensors and weights above the
    shared-memory threshold still work, inline."""
    shape = (SHM_THRESHOLD // 4 + 16,)
    rng = np.random.default_rng(0)
    weights, x = rng.random(shape, np.float32), rng.random(shape, np.float32)
    pm = tcp_client.prepare_model(add_model(shape, constant=weights))
    np.testing.assert_array_equal(pm.execute([x]).outputs[0], x + weights)
    with pm.burst() as burst:
        np.testing.assert_array_equal(burst.execute([x]).outputs[0], x + weights)


# ---- the unix socket: same user, and only segments made for the service -----------------------------

def _segment_at(path: str, mode: int = 0o600) -> str:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.write(fd, SECRET.tobytes() + b"\0" * (4096 - SECRET.nbytes))
    os.fchmod(fd, mode)
    os.close(fd)
    return path


@pytest.mark.parametrize("case", ["foreign name", "group readable", "other writable", "hard link"])
def test_unix_client_names_only_segments_made_for_the_service(server, client, case, tmp_path):
    """Even the service's own user cannot hand it a /dev/shm file that is not an nnhal client's
    segment: another program's (no nnhal- prefix), one shared with others (mode), or a second
    name of a file kept elsewhere (a hard link)."""
    tag = uuid.uuid4().hex[:12]
    made = []
    if case == "foreign name":
        path = _segment_at(f"/dev/shm/other-{tag}")
    elif case == "group readable":
        path = _segment_at(f"/dev/shm/nnhal-{tag}", 0o640)
    elif case == "other writable":
        path = _segment_at(f"/dev/shm/nnhal-{tag}", 0o602)
    else:
        original = _segment_at(f"/dev/shm/kept-{tag}")
        path = f"/dev/shm/nnhal-{tag}"
        os.link(original, path)
        made.append(original)
    made.append(path)
    try:
        pm = client.prepare_model(add_model())
        for request in (_read_request(path), _write_request(path)):
            reply = _execute(client, pm.id, request)
            assert reply.status.code == ErrorStatus.INVALID_ARGUMENT, (case, reply.status)
            assert not reply.outputs
        _intact(path)
    finally:
        for p in made:
            os.unlink(p)


def test_unix_client_segment_is_accepted(server, client):
    """The same requests on a segment as nnhal's client makes one: read and written."""
    path = _segment_at(f"/dev/shm/nnhal-{uuid.uuid4().hex[:12]}")
    try:
        pm = client.prepare_model(add_model())
        reply = _execute(client, pm.id, _read_request(path))
        assert reply.status.code == ErrorStatus.NONE, reply.status
        assert np.frombuffer(reply.outputs[0], np.float32).tolist() == SECRET.tolist()
        assert _execute(client, pm.id, _write_request(path)).status.code == ErrorStatus.NONE
        with open(path, "rb") as f:
            assert np.frombuffer(f.read(24), np.float32).tolist() == [2.0] * 6
    finally:
        os.unlink(path)


# ---- ownership: a session reaches only what it owns ---------------------------------------------------

def _unknown_model(reply) -> None:
    assert reply.status.code == ErrorStatus.INVALID_ARGUMENT, reply.status
    assert "unknown prepared model" in reply.status.message


def test_another_client_cannot_use_or_release_a_prepared_model(server, client):
    """Client ``other`` learns ``client``'s prepared model id and buffer token (ids leak: logs,
    a shared process): every call on them is answered as for an id that does not exist, and the
    owner's model and buffer still work afterwards."""
    pm = client.prepare_model(add_model())
    token = client.allocate(OperandType.TENSOR_FLOAT32, (2, 3), input_roles=[(pm, 0)])
    x = np.ones((2, 3), np.float32)
    with Client.connect(server.address) as other:
        ref = pb.PreparedModelId(prepared_model_id=pm.id)
        _unknown_model(other.prepared.Release(ref, timeout=60))
        _unknown_model(other.prepared.GetPerfInfo(ref, timeout=60))
        _unknown_model(other.prepared.ResetPerfInfo(ref, timeout=60))
        _unknown_model(other.prepared.OpenLocalBurst(pb.LocalBurstRequest(prepared_model_id=pm.id, slot_bytes=256),
                                                     timeout=60))
        r = pb.Request()
        r.inputs.add(data=x.tobytes())
        r.inputs.add(data=x.tobytes())
        r.outputs.add(inline_capacity=24)
        _unknown_model(other.prepared.Execute(pb.ExecuteRequest(prepared_model_id=pm.id, request=r), timeout=60))
        msg = pb.BurstRequest(serial=0, execute=pb.ExecuteRequest(prepared_model_id=pm.id, request=r))
        _unknown_model(next(iter(other.prepared.ExecuteBurst(iter([msg]), timeout=60))).result)
        _unknown_model(other.device.Allocate(pb.AllocateRequest(
            operand_type=int(OperandType.TENSOR_FLOAT32), dimensions=[2, 3],
            input_roles=[pb.BufferRole(prepared_model_id=pm.id, io_index=0, probability=1.0)]), timeout=60))
        # the owner's buffer, named in a request on the other's own model, and released by it
        mine = other.prepare_model(add_model())
        r.pools.add(driver_buffer=token)
        r.inputs[0].ClearField("data")
        r.inputs[0].location.CopyFrom(pb.DataLocation(pool_index=0, offset=0, length=24))
        reply = other.prepared.Execute(pb.ExecuteRequest(prepared_model_id=mine.id, request=r), timeout=60)
        assert "unknown driver buffer" in reply.status.message
        with pytest.raises(ServiceError, match="unknown driver buffer"):
            other.release_buffer(token)
        # no session at all: refused before anything is looked up (on the unix socket a session is the gate)
        reply = other.prepared.Release(ref, timeout=60, metadata=[("nnhal-session", "")])
        assert reply.status.code == ErrorStatus.INVALID_ARGUMENT and "no open session" in reply.status.message
    np.testing.assert_array_equal(pm.execute([x, x]).outputs[0], x + x)
    client.release_buffer(token)
    pm.release()


# ---- the client checks whose socket it talks to ----------------------------------------------------

@pytest.fixture
def impostor(tmp_path):
    """Someone else's listener where a service socket is expected: a socket in a directory anyone
    can write (as /tmp/nnhal-<uid> pre-created 0777 by another user). It records any connection."""
    import socket as socketlib
    d = tmp_path / "nnhal"
    d.mkdir()
    os.chmod(d, 0o777)
    listener = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    listener.bind(str(d / "nnhal.sock"))
    listener.listen(8)
    listener.settimeout(0.5)
    yield listener, str(d / "nnhal.sock")
    listener.close()


def _never_contacted(listener) -> None:
    import socket as socketlib
    with pytest.raises(socketlib.timeout):
        listener.accept()[0].close()


def test_client_refuses_a_socket_in_a_directory_others_can_write(impostor):
    from service.client import UntrustedServiceError
    listener, path = impostor
    with pytest.raises(UntrustedServiceError) as e:
        Client.connect(path, timeout_s=1.0)
    assert str(e.value).splitlines() == [str(e.value)]  # one line
    assert f"refusing the nnhal service socket {path}: its directory" in str(e.value)
    assert "writable by group or others (mode 777)" in str(e.value)
    _never_contacted(listener)


def test_client_accepts_a_socket_others_may_connect_to(tmp_path):
    """A socket's write bit is connect permission: `nnhal serve --allow-uid` makes it 0666 and checks
    each client's uid itself. Who can replace the socket is the directory's matter (0711 here, ours)."""
    from service.server import create_server
    d = tmp_path / "shared"
    d.mkdir(mode=0o700)
    running = create_server(str(d / "s.sock"), backends="reference", allow_uids={os.geteuid(), os.geteuid() + 1})
    try:
        assert os.stat(d / "s.sock").st_mode & 0o777 == 0o666 and os.stat(d).st_mode & 0o777 == 0o711
        with Client.connect(running.address, timeout_s=30) as c:
            assert c.get_version_string().startswith("nnhal-")
    finally:
        running.stop()


def test_default_socket_in_a_foreign_directory_is_not_used(impostor, monkeypatch):
    """The default socket ($XDG_RUNTIME_DIR/nnhal/nnhal.sock here) in a directory others can write:
    Client.connect() refuses it, and the delegate sends it nothing (its own service is the fallback
    for an unusable default; here the report says why, and the impostor saw no connection)."""
    from service.client import UntrustedServiceError
    listener, path = impostor
    monkeypatch.setenv("XDG_RUNTIME_DIR", os.path.dirname(os.path.dirname(path)))
    with pytest.raises(UntrustedServiceError, match="refusing the nnhal service socket"):
        Client.connect(timeout_s=1.0)
    from delegate import load_delegate
    from tests.delegate.helpers import interpreter
    from tests.delegate.models import head_model
    d = load_delegate(path)
    interpreter(head_model(), d)
    assert d.report.delegated == 0 and "refusing the nnhal service socket" in (d.report.error or "")
    _never_contacted(listener)


def test_client_accepts_its_own_service(server):
    with Client.connect(server.address, timeout_s=30) as c:
        assert c.get_version_string().startswith("nnhal-")


def test_tcp_client_cannot_open_a_local_burst(tcp_client):
    """A local burst is a socket and a memfd on the service's machine: nothing a TCP client can
    use, so it is refused instead of holding a thread and memory for nothing."""
    pm = tcp_client.prepare_model(add_model())
    reply = tcp_client.prepared.OpenLocalBurst(pb.LocalBurstRequest(prepared_model_id=pm.id, slot_bytes=256),
                                               timeout=60)
    assert reply.status.code == ErrorStatus.INVALID_ARGUMENT and "unix socket" in reply.status.message
