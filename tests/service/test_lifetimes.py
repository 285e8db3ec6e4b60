"""Every server-side resource belongs to a client and dies with it (issue 18 finding 3).

Prepared models go when the Interpreter that made them is freed, everything a client owns goes
when it closes or its process dies, driver buffers can be released and are committed lazily,
one client's memory is bounded, and the embedded service dies with its parent.
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from hal.types import ErrorStatus, OperandType
from service.client import Client, ServiceError
from service.proto import nnhal_pb2 as pb
from tests.service.models import add_model

#: How long a test waits for the service to notice a client's end: far above what it takes
#: (milliseconds on a unix socket); only "it happens at all" is asserted.
NOTICE_LIMIT_S = 60


def _known(client: Client, prepared_id: str, owner: list[tuple[str, str]]) -> bool:
    """Whether the service still holds ``prepared_id``, asked in its owner's name (its session's
    metadata, kept after the owner closed: only the owning session reaches a prepared model)."""
    reply = client.prepared.GetPerfInfo(pb.PreparedModelId(prepared_model_id=prepared_id), timeout=30,
                                        metadata=owner)
    return reply.status.code == ErrorStatus.NONE


def _eventually_unknown(client: Client, prepared_id: str, owner: list[tuple[str, str]]) -> None:
    deadline = time.monotonic() + NOTICE_LIMIT_S
    while _known(client, prepared_id, owner):
        assert time.monotonic() < deadline, f"prepared model {prepared_id} still held by the service"
        time.sleep(0.05)


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_interpreter_freed_releases_its_prepared_models(server, client, tmp_path):
    from delegate import load_delegate
    from delegate.runtime import Interpreter
    from tests.delegate.models import head_model
    path = tmp_path / "m.tflite"
    path.write_bytes(head_model())
    d = load_delegate(server.address)
    it = Interpreter(model_path=str(path), experimental_delegates=[d])
    it.allocate_tensors()
    it.invoke()
    ids = [k.remote.id for k in d.impl.kernels if k.remote is not None]
    owner = list(d.impl.client.session)
    assert ids and all(_known(client, i, owner) for i in ids)
    del it
    gc.collect()
    assert not any(_known(client, i, owner) for i in ids)  # released synchronously by the kernel's free


def test_closing_a_client_releases_what_it_owned(server, client):
    other = Client.connect(server.address)
    pm = other.prepare_model(add_model())
    token = other.allocate(OperandType.TENSOR_FLOAT32, (2, 3), input_roles=[(pm, 0)])
    owner = list(other.session)
    assert _known(client, pm.id, owner)
    other.close()
    _eventually_unknown(client, pm.id, owner)
    r = pb.Request(pools=[pb.Memory(driver_buffer=token)])
    r.inputs.add(location=pb.DataLocation(pool_index=0, offset=0, length=24))
    r.inputs.add(data=np.ones(6, np.float32).tobytes())
    r.outputs.add(inline_capacity=24)
    mine = client.prepare_model(add_model())
    reply = client.prepared.Execute(pb.ExecuteRequest(prepared_model_id=mine.id, request=r), timeout=30)
    assert reply.status.code == ErrorStatus.INVALID_ARGUMENT and "unknown driver buffer" in reply.status.message
    reply = client.prepared.Execute(pb.ExecuteRequest(prepared_model_id=mine.id, request=r), timeout=30,
                                    metadata=owner)  # in the dead owner's name: released all the same
    assert reply.status.code == ErrorStatus.INVALID_ARGUMENT


_CLIENT = textwrap.dedent("""
    import sys, time
    from service.client import Client
    from tests.service.models import add_model
    c = Client.connect(sys.argv[1])
    print(c.prepare_model(add_model()).id, c.session[0][1], flush=True)
    time.sleep(600)
""")


def test_a_dead_client_process_releases_what_it_owned(server, client):
    child = subprocess.Popen([sys.executable, "-c", _CLIENT, server.address], stdout=subprocess.PIPE, text=True)
    try:
        prepared_id, session_id = child.stdout.readline().split()
        owner = [("nnhal-session", session_id)]
        assert _known(client, prepared_id, owner)
        child.kill()  # no goodbye: only the connection's end tells the service
        child.wait()
        _eventually_unknown(client, prepared_id, owner)
    finally:
        if child.poll() is None:
            child.kill()
        child.stdout.close()


def test_calls_that_create_resources_need_a_session(server, client):
    from service import convert
    from service.proto import nnhal_pb2_grpc as pb_grpc
    device = pb_grpc.DeviceStub(client.channel)  # the bare channel: no session metadata added
    reply = device.PrepareModel(pb.PrepareModelRequest(model=convert.model_to_proto(add_model())), timeout=30)
    assert reply.status.code == ErrorStatus.INVALID_ARGUMENT and "session" in reply.status.message
    reply = device.PrepareModel(pb.PrepareModelRequest(model=convert.model_to_proto(add_model())),
                                timeout=30, metadata=[("nnhal-session", "forged")])
    assert reply.status.code == ErrorStatus.INVALID_ARGUMENT and "session" in reply.status.message


def test_buffers_are_released_and_committed_lazily(server, client):
    pm = client.prepare_model(add_model((64, 1024, 1024)))  # 256 MiB per tensor, never executed
    before = _rss_kib(server.proc.pid)
    token = client.allocate(OperandType.TENSOR_FLOAT32, (64, 1024, 1024), input_roles=[(pm, 0)])
    assert _rss_kib(server.proc.pid) - before < 64 << 10  # 256 MiB allocated, far less committed
    client.release_buffer(token)
    with pytest.raises(ServiceError) as e:
        client.release_buffer(token)
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT


def test_one_client_memory_is_bounded(tmp_path):
    from tests.service.conftest import ServerProcess
    weights = np.ones((512, 1024), np.float32)  # 2 MiB: charged ~7 MiB (3x + 1 MiB)
    server = ServerProcess(tmp_path, "--client-max-bytes", str(12 << 20))
    try:
        c = Client.connect(server.address)
        first = c.prepare_model(add_model(weights.shape, constant=weights))
        with pytest.raises(ServiceError) as e:
            c.prepare_model(add_model(weights.shape, constant=2 * weights))
        assert e.value.status == ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT
        big = np.ones((2048, 1024), np.float32)
        with pytest.raises(ServiceError) as e:
            c.prepare_model(add_model(big.shape, constant=big))
        assert e.value.status == ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT
        with Client.connect(server.address) as other:  # the budget is per client
            other.prepare_model(add_model(weights.shape, constant=weights))
        first.release()
        c.prepare_model(add_model(weights.shape, constant=2 * weights))  # room again
        c.close()
    finally:
        server.stop()


def _connect_when_the_slot_frees(address: str) -> Client:
    """A closed client's slot frees when the service sees its session stream end, which is after
    close() returns: retry (RESOURCE_EXHAUSTED_TRANSIENT) within NOTICE_LIMIT_S."""
    deadline = time.monotonic() + NOTICE_LIMIT_S
    while True:
        try:
            return Client.connect(address)
        except ServiceError as e:
            assert e.status == ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT and time.monotonic() < deadline
            time.sleep(0.05)


def test_max_clients(tmp_path):
    from tests.service.conftest import ServerProcess
    server = ServerProcess(tmp_path, "--max-clients", "1")
    try:
        first = _connect_when_the_slot_frees(server.address)  # its readiness probe's client closed
        with pytest.raises(ServiceError) as e:
            Client.connect(server.address)
        assert e.value.status == ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT and "--max-clients" in e.value.message
        first.close()
        _connect_when_the_slot_frees(server.address).close()
    finally:
        server.stop()


_EMBEDDING = textwrap.dedent("""
    import os, sys, time
    from delegate import embedded
    client = embedded.connect(None)
    print(embedded._child.pid, embedded._child_address, flush=True)
    if sys.argv[1] == "exit":
        client.close()
        sys.exit(0)
    time.sleep(600)
""")


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_embedded_service_dies_with_its_parent_and_leaves_no_directory(tmp_path, how):
    # No service at the default socket; a $TMPDIR deeper than an AF_UNIX path allows (the embedded
    # service then makes its directory in /tmp).
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path / "run"), TMPDIR=str(tmp_path / ("t" * 60)))
    os.makedirs(env["XDG_RUNTIME_DIR"], mode=0o700)
    os.makedirs(env["TMPDIR"])
    parent = subprocess.Popen([sys.executable, "-c", _EMBEDDING, how], stdout=subprocess.PIPE, text=True, env=env)
    try:
        child_pid, address = parent.stdout.readline().split()
        if how == "kill":
            parent.kill()  # atexit never runs: only the child's own watch can stop it
        parent.wait(NOTICE_LIMIT_S)
        deadline = time.monotonic() + NOTICE_LIMIT_S
        while os.path.exists(f"/proc/{child_pid}") and _state(int(child_pid)) != "Z":
            assert time.monotonic() < deadline, "the embedded service outlived its parent"
            time.sleep(0.05)
        socket_dir = os.path.dirname(address[len("unix:"):])
        deadline = time.monotonic() + NOTICE_LIMIT_S
        while os.path.exists(socket_dir):  # the child removes its directory as it stops
            assert time.monotonic() < deadline, os.listdir(socket_dir)
            time.sleep(0.05)
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.stdout.close()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "Z"


def test_service_stops_when_the_parent_pid_is_already_gone(tmp_path):
    """--parent-pid naming a process that is not (or no longer) its parent: stop at once."""
    sock = str(tmp_path / "s.sock")
    r = subprocess.run([sys.executable, "-m", "nnhal.cli", "serve", "--socket", sock, "--parent-pid", "1",
                        "--no-cache", "--log-level", "error"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and not os.path.exists(sock)
