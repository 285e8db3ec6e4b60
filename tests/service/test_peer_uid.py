"""`nnhal serve` checks the uid of every unix-socket client (issue 34, `--allow-uid`).

grpcio gives a servicer no peer credentials on a unix socket, so a client first asks the service's
handshake socket (PATH.peer) for a one-time ticket; the service reads the client's uid there
(SO_PEERCRED) and answers only a listed uid. OpenSession spends the ticket; every call beyond the
device's description needs the session. Real servers on real sockets throughout; the other-uid
cases run a child process that drops to another uid.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest

from hal.errors import HalError
from hal.types import ErrorStatus, OperandType
from service import convert
from service.client import Client, ClientRefusedError
from service.peer_gate import TICKET_KEY, Tickets, peer_socket_path, request_ticket
from service.proto import nnhal_pb2 as pb
from service.proto import nnhal_pb2_grpc as pb_grpc
from service.server import create_server
from tests.service.conftest import HANG_LIMIT_S, ServerProcess
from tests.service.models import add_model

X = np.arange(6, dtype=np.float32).reshape(2, 3)
#: A uid no process here runs as.
STRANGER = os.geteuid() + 12345
#: The uid the other-user tests drop to (nobody).
OTHER_UID = 65534


@pytest.fixture
def refusing(tmp_path):
    """A service whose allow list excludes this process's uid."""
    running = create_server(str(tmp_path / "s.sock"), backends="reference", allow_uids={STRANGER})
    yield running
    running.stop()


@pytest.fixture
def unix_service(tmp_path):
    running = create_server(str(tmp_path / "s.sock"), backends="reference")
    yield running
    running.stop()


def _one_line(e: Exception) -> str:
    text = str(e)
    assert text.splitlines() == [text], text
    return text


# ---- (a) a uid not on the list: one clear line, nothing created -----------------------------------

def test_unlisted_uid_is_refused_in_one_line(refusing):
    with pytest.raises(ClientRefusedError) as e:
        Client.connect(refusing.address, timeout_s=30)
    text = _one_line(e.value)
    assert f"refused this client: uid {os.geteuid()} is not allowed" in text and "--allow-uid" in text
    assert refusing.driver.sessions.count() == 0


def test_delegate_falls_back_to_the_cpu_when_refused(refusing):
    """The delegate treats a refusal as an unreachable service: TFLite's CPU runs the whole model,
    and the result is TFLite's own."""
    from delegate import load_delegate
    from tests.delegate.helpers import interpreter, random_inputs, run
    from tests.delegate.models import head_model
    model = head_model()
    want_it = interpreter(model)
    xs = random_inputs(want_it, np.random.default_rng(0))
    d = load_delegate(refusing.address)
    got = run(interpreter(model, d), xs)
    assert d.report.delegated == 0 and "is not allowed to use this nnhal service" in (d.report.error or "")
    for g, w in zip(got, run(want_it, xs), strict=True):
        np.testing.assert_array_equal(g, w)
    assert refusing.driver.sessions.count() == 0


# ---- (b) OpenSession without a valid ticket ----------------------------------------------------------

def _open_session(address: str, metadata) -> pb.SessionReply:
    import grpc
    with grpc.insecure_channel(address) as ch:
        call = pb_grpc.DeviceStub(ch).OpenSession(iter(()), metadata=metadata, timeout=HANG_LIMIT_S)
        return next(iter(call))


def _ticket(running) -> str:
    return request_ticket(running.socket_path, 10.0).ticket


def _refused_session(reply: pb.SessionReply, why: str) -> None:
    assert reply.status.code == ErrorStatus.INVALID_ARGUMENT and why in reply.status.message, reply.status
    assert not reply.session_id


def test_open_session_needs_a_ticket(unix_service):
    _refused_session(_open_session(unix_service.address, None), f"no '{TICKET_KEY}'")


def test_open_session_refuses_a_forged_ticket(unix_service):
    _refused_session(_open_session(unix_service.address, [(TICKET_KEY, secrets.token_hex(16))]), "unknown, used")


def test_a_ticket_opens_one_session_only(unix_service):
    ticket = _ticket(unix_service)
    assert _open_session(unix_service.address, [(TICKET_KEY, ticket)]).session_id
    _refused_session(_open_session(unix_service.address, [(TICKET_KEY, ticket)]), "unknown, used")


def test_an_expired_ticket_is_refused(unix_service):
    unix_service.prepared_servicer.access.tickets.ttl_s = 0.0  # every ticket expires as it is issued
    _refused_session(_open_session(unix_service.address, [(TICKET_KEY, _ticket(unix_service))]), "expired")
    assert unix_service.driver.sessions.count() == 0


def test_tickets_expire_and_are_spent():
    now = [100.0]
    tickets = Tickets(ttl_s=5.0, clock=lambda: now[0])
    a, b = tickets.issue(1000), tickets.issue(1001)
    assert tickets.redeem(a) == 1000
    with pytest.raises(HalError, match="used or expired"):
        tickets.redeem(a)
    now[0] += 5.0
    with pytest.raises(HalError, match="used or expired"):
        tickets.redeem(b)


def test_the_ticket_server_survives_a_client_that_never_reads(unix_service):
    """A client that connects and goes silent, or closes at once, costs the handshake thread one
    bounded answer; the next client still gets its ticket."""
    idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3)]
    for s in idle:
        s.connect(peer_socket_path(unix_service.socket_path))
    idle[0].close()
    with Client.connect(unix_service.address, timeout_s=30) as c:
        assert c.prepare_model(add_model()).execute([X, X]).outputs[0].tolist() == (X + X).tolist()
    for s in idle[1:]:
        s.close()


# ---- every call beyond the device's description needs a session on the unix socket ------------------

def _calls_without_a_session(stub_d, stub_p, metadata):
    """Each call that costs the service work or reveals anything: (name, reply status)."""
    model = convert.model_to_proto(add_model())
    ref = pb.PreparedModelId(prepared_model_id="0" * 32)
    r = pb.Request(pools=[pb.Memory(shared=pb.SharedMemoryRef(name=f"nnhal-{uuid.uuid4().hex}", size=4096))])
    burst = pb.BurstRequest(serial=0, register_pools=[pb.PoolRegistration(pool_id=1, memory=r.pools[0])],
                            execute=pb.ExecuteRequest(prepared_model_id=ref.prepared_model_id, request=r))
    kw = dict(timeout=HANG_LIMIT_S, metadata=metadata)
    yield "GetSupportedOperations", stub_d.GetSupportedOperations(pb.SupportedOperationsRequest(model=model), **kw)
    yield "PrepareModel", stub_d.PrepareModel(pb.PrepareModelRequest(model=model), **kw)
    yield "PrepareModelFromCache", stub_d.PrepareModelFromCache(pb.PrepareModelFromCacheRequest(token=b"t" * 32), **kw)
    yield "PrepareModelFromCache with a local burst", stub_d.PrepareModelFromCache(pb.PrepareModelFromCacheRequest(
        token=b"t" * 32, local_burst_slot_bytes=256), **kw)
    yield "Allocate", stub_d.Allocate(pb.AllocateRequest(operand_type=int(OperandType.TENSOR_FLOAT32),
                                                         dimensions=[2, 3]), **kw)
    yield "ReleaseBuffer", stub_d.ReleaseBuffer(pb.BufferToken(buffer_token=1), **kw)
    yield "Execute", stub_p.Execute(pb.ExecuteRequest(prepared_model_id=ref.prepared_model_id, request=r), **kw)
    yield "ExecuteBurst", next(iter(stub_p.ExecuteBurst(iter([burst]), **kw))).result
    yield "OpenLocalBurst", stub_p.OpenLocalBurst(pb.LocalBurstRequest(prepared_model_id=ref.prepared_model_id,
                                                                       slot_bytes=256), **kw)
    yield "Release", stub_p.Release(ref, **kw)
    yield "GetPerfInfo", stub_p.GetPerfInfo(ref, **kw)
    yield "ResetPerfInfo", stub_p.ResetPerfInfo(ref, **kw)


@pytest.mark.parametrize("session, why", [(None, "no open session"),
                                          ("f" * 32, "unknown or closed session")])
def test_calls_need_a_session_on_the_unix_socket(unix_service, session, why):
    import grpc
    metadata = None if session is None else [("nnhal-session", session)]
    with grpc.insecure_channel(unix_service.address) as ch:
        d, p = pb_grpc.DeviceStub(ch), pb_grpc.PreparedModelStub(ch)
        for name, reply in _calls_without_a_session(d, p, metadata):
            assert reply.status.code == ErrorStatus.INVALID_ARGUMENT and why in reply.status.message, (name, reply)
        # what a client reads before its session: the device's description, nothing more
        assert d.GetVersionString(pb.Empty(), timeout=HANG_LIMIT_S).version.startswith("nnhal-")
        assert d.GetCapabilities(pb.Empty(), timeout=HANG_LIMIT_S).status.code == ErrorStatus.NONE
        assert d.GetType(pb.Empty(), timeout=HANG_LIMIT_S).status.code == ErrorStatus.NONE
        assert d.GetSupportedExtensions(pb.Empty(), timeout=HANG_LIMIT_S).status.code == ErrorStatus.NONE
        assert d.GetNumberOfCacheFilesNeeded(pb.Empty(), timeout=HANG_LIMIT_S).status.code == ErrorStatus.NONE
    assert unix_service.driver.sessions.count() == 0


# ---- the sockets -----------------------------------------------------------------------------------

def test_sockets_are_private_by_default_and_removed_on_stop(tmp_path):
    running = create_server(str(tmp_path / "s.sock"), backends="reference")
    peer = peer_socket_path(running.socket_path)
    assert os.stat(running.socket_path).st_mode & 0o777 == 0o600 and os.stat(peer).st_mode & 0o777 == 0o600
    running.stop()
    assert os.listdir(tmp_path) == []


def test_a_stale_handshake_socket_is_replaced(tmp_path):
    """A service killed without cleaning up leaves PATH.peer: like its gRPC socket, nothing answers
    there, so the next service takes the path."""
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "s.sock.peer"))
    stale.close()
    running = create_server(str(tmp_path / "s.sock"), backends="reference")
    try:
        with Client.connect(running.address, timeout_s=30) as c:
            assert c.get_version_string().startswith("nnhal-")
    finally:
        running.stop()


def test_a_handshake_socket_that_appears_while_the_client_waits_gives_its_ticket(tmp_path):
    """A restart: the old service removed PATH.peer, the new one has not bound it yet. The client
    waits for it (within its timeout) instead of opening a session with no ticket, which the new
    service would refuse; with none by the timeout, it has no ticket to send."""
    import threading
    import time

    path = str(tmp_path / "s.sock")
    assert request_ticket(path, 0.05).ticket is None  # nothing there: no ticket, after the wait
    started: list = []
    starter = threading.Timer(0.3, lambda: started.append(create_server(path, backends="reference")))
    t = time.monotonic()
    starter.start()
    try:
        handshake = request_ticket(path, 30.0)
        assert handshake.ticket and 0.25 < time.monotonic() - t < 30
        starter.join()
        with Client.connect(started[0].address, timeout_s=30) as c:
            assert c.get_version_string().startswith("nnhal-")
    finally:
        starter.join()
        for running in started:
            running.stop()


def test_allow_uid_is_for_the_unix_socket_only():
    with pytest.raises(ValueError, match="--allow-uid applies to the unix socket"):
        create_server(listen="127.0.0.1:0", insecure=True, allow_uids={0})


def test_serve_refuses_a_malformed_allow_uid(tmp_path):
    r = subprocess.run([sys.executable, "-m", "nnhal.cli", "serve", "--socket", str(tmp_path / "s.sock"),
                        "--no-cache", "--allow-uid", "0,alice"], capture_output=True, text=True,
                       timeout=HANG_LIMIT_S)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "nnhal serve: --allow-uid takes user ids, UID[,UID...] (e.g. $(id -u alice)), not '0,alice'"], r.stderr
    assert not os.path.exists(tmp_path / "s.sock")


# ---- (c) another uid, through the real `nnhal serve` -------------------------------------------------

#: What the child does: import as root (the interpreter's own files may be private to root), drop to
#: OTHER_UID, connect, and report what happened as one line.
_CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    from service.client import Client, ClientRefusedError, ServiceUnavailableError
    from service.proto import nnhal_pb2 as pb
    from tests.service.models import add_model
    address, segment, uid = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    try:
        c = Client.connect(address, timeout_s=30)
    except ClientRefusedError as e:
        print("refused:", e)
        sys.exit(0)
    except ServiceUnavailableError as e:
        print("unavailable:", e)
        sys.exit(0)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    big = np.arange(64 * 1024, dtype=np.float32)  # above SHM_THRESHOLD: inline, not shared memory
    pm = c.prepare_model(add_model(shape=big.shape))
    ok = pm.execute([big, big]).outputs[0].tolist() == (big + big).tolist()
    # the service user's segment, named by this client: refused, it is not this client's to name
    r = pb.Request(pools=[pb.Memory(shared=pb.SharedMemoryRef(name=segment, size=4096))])
    r.inputs.add(location=pb.DataLocation(pool_index=0, offset=0, length=4))
    r.inputs.add(data=np.zeros(1, np.float32).tobytes())
    r.outputs.add(inline_capacity=4)
    pm1 = c.prepare_model(add_model(shape=(1,)))
    reply = c.prepared.Execute(pb.ExecuteRequest(prepared_model_id=pm1.id, request=r), timeout=60)
    # a local burst asked for with a prepare from the cache: the model, but no burst (a memfd of root's)
    token = bytes(range(32))
    c.prepare_model(add_model(shape=(1,)), token=token)
    fc = c.device.PrepareModelFromCache(pb.PrepareModelFromCacheRequest(token=token, local_burst_slot_bytes=256),
                                        timeout=60)
    print("accepted:", os.geteuid(), c.shared_memory, ok, fc.status.code, bool(fc.prepared_model_id),
          fc.local_burst.status.code, reply.status.code, reply.status.message)
    c.close()
""")


def _as_other_user(address: str, segment: str) -> str:
    r = subprocess.run([sys.executable, "-c", _CHILD, address, segment, str(OTHER_UID)], capture_output=True,
                       text=True, timeout=HANG_LIMIT_S, cwd="/",
                       env={**os.environ, "HOME": "/", "PYTHONPATH": str(Path(__file__).parents[2])})
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture
def other_user_setup():
    """A socket directory other users can reach (pytest's tmp_path is private to root), and a
    segment of the service's user as its own clients make them (nnhal-*, 0600)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run a client as another uid")
    d = Path(tempfile.mkdtemp(prefix="nnhal-peer-uid-", dir="/tmp"))
    name = f"nnhal-{uuid.uuid4().hex[:12]}"
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.write(fd, np.float32(7.0).tobytes() + b"\0" * 4092)
    os.close(fd)
    yield d, name
    os.unlink(f"/dev/shm/{name}")
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("allow, outcome", [
    (None, "unavailable:"),                        # default: the socket is 0600, another uid cannot reach it
    (f"0,{OTHER_UID + 1}", "refused:"),            # others may connect, but this uid is not listed
    (f"0,{OTHER_UID}", "accepted:"),               # listed
])
def test_another_uid_through_nnhal_serve(other_user_setup, allow, outcome):
    d, segment = other_user_setup
    server = ServerProcess(d, *(["--allow-uid", allow] if allow else []))
    try:
        line = _as_other_user(server.address, segment)
    finally:
        server.stop()
    assert line.startswith(outcome), line
    if outcome == "unavailable:":  # told at once why: not a service that never answered
        assert f"this user (uid {OTHER_UID}) may not reach {server.address[len('unix:'):]}" in line, line
        assert "within" not in line, line
    if outcome == "refused:":
        assert f"uid {OTHER_UID} is not allowed to use this nnhal service" in line and "--allow-uid" in line
        assert "refused a client" in server.output() and f"uid {OTHER_UID}" in server.output()
    if outcome == "accepted:":
        # its uid, no shared memory (the service is root's), the inline result right, the segment refused
        uid, shared, ok, cached, prepared, burst, code, message = line.split(" ", 8)[1:]
        assert (uid, shared, ok, code) == (str(OTHER_UID), "False", "True", str(int(ErrorStatus.INVALID_ARGUMENT)))
        assert (cached, prepared, burst) == (str(int(ErrorStatus.NONE)), "True", str(int(ErrorStatus.INVALID_ARGUMENT)))
        assert "only on the service's unix socket, from a client of the service's own user" in message
        assert os.stat(d).st_mode & 0o777 == 0o711
    with open(f"/dev/shm/{segment}", "rb") as f:
        assert np.frombuffer(f.read(4), np.float32)[0] == np.float32(7.0)
