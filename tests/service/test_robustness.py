"""Hostile and malformed requests never take the server down, nor another client's work."""
from __future__ import annotations

import os
import uuid
from multiprocessing import shared_memory

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hal.types import ErrorStatus
from service import convert
from service.client import Client, ServiceError
from service.proto import nnhal_pb2 as pb
from service.servicer import MAX_MESSAGE_BYTES
from tests.service.models import add_model

X = np.ones((2, 3), np.float32)


def _segment(size: int) -> shared_memory.SharedMemory:
    """A segment as an nnhal client makes one (the service accepts only nnhal-* names)."""
    return shared_memory.SharedMemory(name=f"nnhal-test-{uuid.uuid4().hex[:12]}", create=True, size=size)


def _alive(client: Client) -> None:
    """The server still serves correct results."""
    pm = client.prepare_model(add_model())
    np.testing.assert_array_equal(pm.execute([X, X]).outputs[0], X + X)


def test_garbage_bytes_are_rejected(server, client):
    for method in ("/nnhal.v1.Device/PrepareModel", "/nnhal.v1.PreparedModel/Execute",
                   "/nnhal.v1.Device/GetSupportedOperations"):
        call = client.channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        for junk in (b"\xff" * 64, os.urandom(1000), b"\x0a\xff\xff\xff\xff\x0f"):
            with pytest.raises(grpc.RpcError):
                call(junk, timeout=10)
    _alive(client)


def test_hostile_models(client):
    cases = {
        "huge dimensions": lambda m: setattr(m.main.operands[0], "dimensions", (1 << 31, 1 << 31)),
        "wrong type": lambda m: setattr(m.main.operands[1], "type", 1234),
        "bad lifetime": lambda m: setattr(m.main.operands[0], "lifetime", 42),
        "operand index out of range": lambda m: setattr(m.main.operations[0], "inputs", (0, 1, 99)),
        "operation type": lambda m: setattr(m.main.operations[0], "type", 77777),
    }
    for name, mutate in cases.items():
        m = add_model()
        mutate(m)
        with pytest.raises(ServiceError) as e:
            client.prepare_model(m)
        assert e.value.status == ErrorStatus.INVALID_ARGUMENT, name
    _alive(client)


def _raw_execute(client, pm_id, req):
    return client.prepared.Execute(pb.ExecuteRequest(prepared_model_id=pm_id, request=req), timeout=30)


def test_hostile_requests(client):
    pm = client.prepare_model(add_model())
    good = X.tobytes()

    def req(**kw):
        r = pb.Request(**kw)
        return r

    r = req()
    r.inputs.add(data=good)
    r.inputs.add(location=pb.DataLocation(pool_index=0, offset=(1 << 63), length=24))
    r.outputs.add(inline_capacity=24)
    assert _raw_execute(client, pm.id, r).status.code == ErrorStatus.INVALID_ARGUMENT  # no pool 0

    r = req(pools=[pb.Memory(shared=pb.SharedMemoryRef(name="nnhal-does-not-exist", size=24))])
    r.inputs.add(data=good)
    r.inputs.add(data=good)
    r.outputs.add(location=pb.DataLocation(pool_index=0, offset=0, length=24))
    reply = _raw_execute(client, pm.id, r)
    assert reply.status.code == ErrorStatus.INVALID_ARGUMENT and "does not exist" in reply.status.message

    r = req(pools=[pb.Memory(shared=pb.SharedMemoryRef(name="../../etc/passwd", size=24))])
    r.inputs.add(data=good)
    r.inputs.add(data=good)
    r.outputs.add(location=pb.DataLocation(pool_index=0, offset=0, length=24))
    reply = _raw_execute(client, pm.id, r)
    assert "invalid shared memory name" in reply.status.message

    r = req()
    r.inputs.add(data=good[:5])
    r.inputs.add(data=good)
    r.outputs.add(inline_capacity=24)
    reply = _raw_execute(client, pm.id, r)
    assert reply.status.code == ErrorStatus.INVALID_ARGUMENT and "needs 24" in reply.status.message

    r = req()
    r.inputs.add(data=good, dimensions=[3, 2])
    r.inputs.add(data=good)
    r.outputs.add(inline_capacity=24)
    assert _raw_execute(client, pm.id, r).status.code == ErrorStatus.INVALID_ARGUMENT

    r = req()
    r.inputs.add(data=good)
    r.outputs.add(inline_capacity=24)
    assert "request has 1 inputs" in _raw_execute(client, pm.id, r).status.message

    r = req()
    r.inputs.add(data=good)
    r.inputs.add(data=good)
    r.outputs.add(inline_capacity=MAX_MESSAGE_BYTES + 1)
    assert "message limit" in _raw_execute(client, pm.id, r).status.message
    _alive(client)


def test_claimed_shared_memory_size_is_checked(client):
    pm = client.prepare_model(add_model())
    shm = _segment(4096)
    try:
        r = pb.Request(pools=[pb.Memory(shared=pb.SharedMemoryRef(name=shm.name, size=1 << 30))])
        r.inputs.add(location=pb.DataLocation(pool_index=0, offset=0, length=24))
        r.inputs.add(location=pb.DataLocation(pool_index=0, offset=0, length=24))
        r.outputs.add(location=pb.DataLocation(pool_index=0, offset=64, length=24))
        reply = _raw_execute(client, pm.id, r)
        assert reply.status.code == ErrorStatus.INVALID_ARGUMENT and "the client claims" in reply.status.message
    finally:
        shm.close()
        shm.unlink()
    _alive(client)


def test_burst_pool_that_vanishes_or_shrinks(client):
    pm = client.prepare_model(add_model())
    shm = _segment(4096)
    np.frombuffer(shm.buf, np.float32, 6)[:] = 1.0
    stream_in = []

    def msg(serial, register=False):
        m = pb.BurstRequest(serial=serial)
        if register:
            m.register_pools.add(pool_id=7, memory=pb.Memory(shared=pb.SharedMemoryRef(name=shm.name, size=4096)))
        r = m.execute.request
        m.execute.prepared_model_id = pm.id
        r.pools.add(burst_pool=7)
        r.inputs.add(location=pb.DataLocation(pool_index=0, offset=0, length=24))
        r.inputs.add(location=pb.DataLocation(pool_index=0, offset=0, length=24))
        r.outputs.add(location=pb.DataLocation(pool_index=0, offset=64, length=24))
        return m

    stream_in = [msg(0, register=True), msg(1)]
    replies = list(client.prepared.ExecuteBurst(iter(stream_in), timeout=30))
    assert [r.result.status.code for r in replies] == [0, 0]
    assert np.frombuffer(shm.buf, np.float32, 6, 64).tolist() == [2.0] * 6
    # Unlinked by its owner: the service's mapping stays valid (as with NNAPI memory).
    shm.unlink()
    os.truncate(f"/dev/shm/{shm.name}", 0) if os.path.exists(f"/dev/shm/{shm.name}") else None
    shm2 = _segment(4096)
    try:
        stream = [msg(0, register=False)]
        stream[0].execute.request.pools[0].burst_pool = 8  # never registered
        replies = list(client.prepared.ExecuteBurst(iter(stream), timeout=30))
        assert "not registered" in replies[0].result.status.message
        # A pool shrunk under the service is refused, not touched (touching it would SIGBUS).
        import queue
        q: queue.Queue = queue.Queue()
        first = msg(0, register=True)
        first.register_pools[0].memory.shared.name = shm2.name
        q.put(first)
        replies = client.prepared.ExecuteBurst(iter(q.get, None), timeout=30)
        assert next(replies).result.status.code == 0  # registered and executed
        os.ftruncate(shm2._fd, 16)
        q.put(msg(1))
        assert "shrank" in next(replies).result.status.message
        q.put(None)
    finally:
        shm.close()
        shm2.close()
        shm2.unlink()
    _alive(client)


def test_oversized_message_gets_a_clear_error(client):
    pm = client.prepare_model(add_model())
    r = pb.Request()
    r.inputs.add(data=b"\0" * (MAX_MESSAGE_BYTES + 16))
    r.inputs.add(data=X.tobytes())
    r.outputs.add(inline_capacity=24)
    with pytest.raises(grpc.RpcError) as e:
        _raw_execute(client, pm.id, r)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    _alive(client)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzzed_model_protos_never_crash_the_server(client, data):
    proto = convert.model_to_proto(add_model())
    fields = ["type", "lifetime", "zero_point"]
    for _ in range(data.draw(st.integers(1, 4))):
        op = proto.main.operands[data.draw(st.integers(0, len(proto.main.operands) - 1))]
        choice = data.draw(st.sampled_from(fields + ["dims", "loc", "opin"]))
        if choice == "dims":
            op.dimensions[:] = data.draw(st.lists(st.integers(0, 2**32 - 1), max_size=5))
        elif choice == "loc":
            op.location.offset = data.draw(st.integers(0, 2**64 - 1))
            op.location.length = data.draw(st.integers(0, 2**64 - 1))
        elif choice == "opin":
            proto.main.operations[0].inputs[:] = data.draw(st.lists(st.integers(0, 2**32 - 1), max_size=4))
        else:
            setattr(op, choice, data.draw(st.integers(-(2**31), 2**31 - 1)))
    reply = client.device.PrepareModel(pb.PrepareModelRequest(model=proto), timeout=30)
    assert reply.status.code in (ErrorStatus.NONE, ErrorStatus.INVALID_ARGUMENT), reply.status.message


def _shrinking(shm: shared_memory.SharedMemory, stop) -> None:
    """A hostile client: shrink and regrow its own pool as fast as it can."""
    while not stop.is_set():
        os.ftruncate(shm._fd, 0)
        os.ftruncate(shm._fd, shm.size)


@pytest.mark.parametrize("path", ["execute", "burst", "prepare"])
def test_a_client_shrinking_its_pool_cannot_fault_the_service(server, client, path):
    """Issue 18 finding 1: the service once mapped client pools and died of SIGBUS (4 of 4 runs)
    when a client truncated one while a request read it. Whatever the client does to its memory,
    the service answers (correctly or INVALID_ARGUMENT) and keeps serving."""
    import threading
    shape = (256, 1024)  # 1 MiB per tensor: a long read window
    nbytes = 4 * 256 * 1024
    shm = _segment(3 * nbytes)
    pm = client.prepare_model(add_model(shape))
    r = pb.Request(pools=[pb.Memory(shared=pb.SharedMemoryRef(name=shm.name, size=shm.size))])
    r.inputs.add(location=pb.DataLocation(pool_index=0, offset=0, length=nbytes))
    r.inputs.add(location=pb.DataLocation(pool_index=0, offset=nbytes, length=nbytes))
    r.outputs.add(location=pb.DataLocation(pool_index=0, offset=2 * nbytes, length=nbytes))
    if path == "prepare":
        model = convert.model_to_proto(add_model(shape, constant=np.ones(shape, np.float32)))
        values = model.operand_values
        np.frombuffer(shm.buf, np.uint8, len(values))[:] = np.frombuffer(values, np.uint8)
        for o in model.main.operands:
            if o.lifetime == 1:  # CONSTANT_COPY -> CONSTANT_POOL 0
                o.lifetime = 2
        model.operand_values = b""
        model.pools.append(pb.Memory(shared=pb.SharedMemoryRef(name=shm.name, size=shm.size)))
    stop = threading.Event()
    attacker = threading.Thread(target=_shrinking, args=(shm, stop), daemon=True)
    attacker.start()
    codes = set()
    try:
        if path == "execute":
            for _ in range(150):
                codes.add(_raw_execute(client, pm.id, r).status.code)
        elif path == "burst":
            def msgs():
                for k in range(150):
                    m = pb.BurstRequest(serial=k)
                    if k == 0:
                        m.register_pools.add(pool_id=1, memory=r.pools[0])
                    m.execute.prepared_model_id = pm.id
                    m.execute.request.CopyFrom(r)
                    m.execute.request.pools[0].CopyFrom(pb.Memory(burst_pool=1))
                    yield m
            codes |= {rep.result.status.code for rep in client.prepared.ExecuteBurst(msgs(), timeout=120)}
        else:
            for _ in range(60):
                codes.add(client.device.PrepareModel(pb.PrepareModelRequest(model=model), timeout=120).status.code)
    finally:
        stop.set()
        attacker.join()
        shm.close()
        shm.unlink()
    assert server.proc.poll() is None, "the service died"
    assert codes <= {ErrorStatus.NONE, ErrorStatus.INVALID_ARGUMENT}, codes
    _alive(client)


def test_a_location_cannot_name_another_arguments_inline_data(client):
    """Inline arguments become pools after the request's own: a location past the request's pools
    once read another argument's bytes (found by make fuzz)."""
    pm = client.prepare_model(add_model())
    r = pb.Request()
    r.inputs.add(location=pb.DataLocation(pool_index=0, offset=0, length=24))
    r.inputs.add(data=(10 * X).tobytes())
    r.outputs.add(inline_capacity=24)
    reply = _raw_execute(client, pm.id, r)
    assert reply.status.code == ErrorStatus.INVALID_ARGUMENT and "does not exist" in reply.status.message
