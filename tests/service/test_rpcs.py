"""Every Device / PreparedModel RPC against a real server process."""
from __future__ import annotations

import numpy as np
import pytest

import hal
from hal.compiler import compile_model
from hal.types import DeviceType, ErrorStatus, ExecutionPreference, OperandType, Priority
from service import convert
from service.client import SHM_THRESHOLD, ServiceError
from service.driver import perf_name
from service.proto import nnhal_pb2 as pb
from tests.service.conftest import socket_mode
from tests.service.models import add_chain, add_model, unsupported_model


def hal_reference(model, inputs):
    return hal.execute(hal.compile_model(model), inputs)


def test_device_queries(client, server):
    caps = client.get_capabilities()
    assert {p.type for p in caps.operand_performance} == {int(t) for t in OperandType} - {OperandType.SUBGRAPH}
    assert caps.relaxed_float32_to_float16_performance_tensor.exec_time > 0
    assert client.get_type() == DeviceType.CPU
    assert client.get_version_string().startswith("nnhal-")
    # the session's first reply carried both: the same answers as the calls
    assert client.version == client.get_version_string()
    assert client.device.GetCapabilities(pb.Empty()).capabilities == caps
    assert {e.name for e in client.get_supported_extensions()} >= {"com.example.fibonacci"}  # installed plugins
    assert client.get_number_of_cache_files_needed() == (1, 1)  # one model file, one data file
    assert socket_mode(server.socket) == 0o600


def test_supported_operations(client):
    assert client.get_supported_operations(add_model()) == [True]
    assert client.get_supported_operations(unsupported_model()) == [False]


def test_supported_operations_invalid_model(client):
    m = add_model()
    m.main.operands[0].type = 999
    with pytest.raises(ServiceError) as e:
        client.get_supported_operations(m)
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT
    assert "operand 0: unknown operand type 999" in e.value.message


def test_prepare_execute_matches_hal(client):
    m = add_model((3, 5))
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((3, 5)).astype(np.float32) for _ in range(2))
    pm = client.prepare_model(m, preference=ExecutionPreference.SUSTAINED_SPEED, priority=Priority.HIGH)
    out = pm.execute([a, b], measure_timing=True)
    np.testing.assert_array_equal(out.outputs[0], hal_reference(m, [a, b])[0])
    assert out.output_shapes == [(3, 5)]
    assert 0 < out.timing.time_on_device_ns <= out.timing.time_in_driver_ns
    assert pm.execute([a, b]).timing is None  # not measured unless asked
    pm.release()


def test_prepare_unsupported_model_fails_cleanly(client):
    with pytest.raises(ServiceError) as e:
        client.prepare_model(unsupported_model())
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT
    assert "operation 0 (OEM_OPERATION): not supported by this driver" in e.value.message


def test_prepare_rejects_bad_token_and_enums(client):
    with pytest.raises(ServiceError, match="cache token must be 32 bytes"):
        client.prepare_model(add_model(), token=b"short")
    with pytest.raises(ServiceError, match="unknown execution preference 7"):
        client.prepare_model(add_model(), preference=7)
    with pytest.raises(ServiceError, match="unknown priority 9"):
        client.prepare_model(add_model(), priority=9)


def test_prepare_from_cache_without_entry(client):
    with pytest.raises(ServiceError) as e:
        client.prepare_model_from_cache(add_model(), bytes(32))
    assert e.value.status == ErrorStatus.GENERAL_FAILURE and "no cache entry" in e.value.message


def test_unknown_and_released_prepared_model(client):
    pm = client.prepare_model(add_model())
    pm.release()
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ServiceError) as e:
        pm.execute([x, x])
    assert e.value.status == ErrorStatus.INVALID_ARGUMENT and "unknown prepared model id" in e.value.message
    with pytest.raises(ServiceError, match="unknown prepared model id"):
        pm.perf_info()


def test_perf_info_counts_operations(client):
    pm = client.prepare_model(add_chain(5))
    x = np.ones((8, 8), np.float32)
    for _ in range(3):
        pm.execute([x])
    info = pm.perf_info()
    assert info.executions == 3
    # one record per step of the program this process's compiler makes (the service's default
    # preference): per operation, or one PARTITION(n ops) record for a graph backend's partition
    program = compile_model(add_chain(5)).static_plan.program
    assert [(o.index, o.name, o.count, o.executions) for o in info.operations] == [
        (s.index, perf_name(s.ctx.op_type, len(s.operations)), len(s.operations), 3) for s in program]
    assert sum(len(s.operations) for s in program) == 5
    assert all(o.total_ns > 0 for o in info.operations)
    pm.reset_perf_info()
    assert pm.perf_info().executions == 0


def test_burst_reuses_registered_pool(client):
    m = add_model((300, 300))  # 360 KB tensors: shared memory
    pm = client.prepare_model(m)
    rng = np.random.default_rng(1)
    with pm.burst() as burst:
        for _ in range(5):
            a, b = (rng.standard_normal((300, 300)).astype(np.float32) for _ in range(2))
            np.testing.assert_array_equal(burst.execute([a, b]).outputs[0], a + b)
    assert a.nbytes > SHM_THRESHOLD


def test_large_constants_and_tensors_via_shared_memory(client):
    w = np.arange(512 * 512, dtype=np.float32).reshape(512, 512)  # 1 MiB of weights
    m = add_model((512, 512), constant=w)
    pm = client.prepare_model(m)
    x = np.ones((512, 512), np.float32)
    np.testing.assert_array_equal(pm.execute([x]).outputs[0], x + w)


def test_output_insufficient_size_reports_shapes(client):
    pm = client.prepare_model(add_model((2, 3)))
    req = pb.Request()
    x = np.ones((2, 3), np.float32).tobytes()
    req.inputs.add(data=x)
    req.inputs.add(data=x)
    req.outputs.add(inline_capacity=8)
    reply = client.prepared.Execute(pb.ExecuteRequest(prepared_model_id=pm.id, request=req))
    assert reply.status.code == ErrorStatus.OUTPUT_INSUFFICIENT_SIZE
    assert [(list(s.dimensions), s.is_sufficient) for s in reply.output_shapes] == [([2, 3], False)]


def test_allocate_driver_buffer_used_as_pool(client):
    pm = client.prepare_model(add_model((2, 3)))
    token = client.allocate(OperandType.TENSOR_FLOAT32, (2, 3), output_roles=[(pm, 0)])
    x = np.full((2, 3), 2, np.float32).tobytes()
    req = pb.Request(pools=[pb.Memory(driver_buffer=token)])
    req.inputs.add(data=x)
    req.inputs.add(data=x)
    req.outputs.add(location=pb.DataLocation(pool_index=0, offset=0, length=24))
    reply = client.prepared.Execute(pb.ExecuteRequest(prepared_model_id=pm.id, request=req))
    assert reply.status.code == 0, reply.status.message
    # The buffer now holds a+b: feed it back as an input.
    req2 = pb.Request(pools=[pb.Memory(driver_buffer=token)])
    req2.inputs.add(location=pb.DataLocation(pool_index=0, offset=0, length=24))
    req2.inputs.add(data=x)
    req2.outputs.add(inline_capacity=24)
    reply2 = client.prepared.Execute(pb.ExecuteRequest(prepared_model_id=pm.id, request=req2))
    assert reply2.status.code == 0, reply2.status.message
    np.testing.assert_array_equal(np.frombuffer(reply2.outputs[0], np.float32), [6.0] * 6)


def test_allocate_errors(client):
    pm = client.prepare_model(add_model((2, 3)))
    with pytest.raises(ServiceError, match="at least one role"):
        client.allocate(OperandType.TENSOR_FLOAT32, (2, 3))
    with pytest.raises(ServiceError, match="out of range"):
        client.allocate(OperandType.TENSOR_FLOAT32, (2, 3), input_roles=[(pm, 5)])
    with pytest.raises(ServiceError, match="full dimensions"):
        client.allocate(OperandType.TENSOR_FLOAT32, (2, 0), input_roles=[(pm, 0)])


def test_deadline_already_passed(client):
    with pytest.raises(ServiceError) as e:
        client.prepare_model(add_model(), timeout_s=1e-9)
    assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
    pm = client.prepare_model(add_model())
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ServiceError) as e:
        pm.execute([x, x], timeout_s=1e-9)
    assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
    # A generous deadline is met.
    assert pm.execute([x, x], timeout_s=30).outputs[0][0, 0] == 2.0


def test_model_round_trips_through_proto():
    m = add_model((2, 2), constant=np.eye(2))
    back = convert.model_from_proto(convert.model_to_proto(m), lambda mem: mem.inline_data)
    assert back == m


def test_stopped_service_every_call_is_bounded(server, client, monkeypatch):
    """A stopped service holds its socket but never answers: executions (unary and burst), prepares,
    the support query and connect all give up at their bound with ServiceTimeoutError (a
    DEVICE_UNAVAILABLE), not MISSED_DEADLINE, which is the service's own answer."""
    import service.rpc as sc  # the bounds every call waits within
    from service.client import Client, ServiceTimeoutError, ServiceUnavailableError
    from tests.service.conftest import returns, stopped
    monkeypatch.setenv("NNHAL_EXECUTE_WAIT_MIN_S", "0.5")
    pm = client.prepare_model(add_model((300, 300)))  # tensors in the shared scratch pool
    a, b = (np.full((300, 300), v, np.float32) for v in (1, 2))
    burst = pm.burst()
    np.testing.assert_array_equal(burst.execute([a, b], timeout_s=30).outputs[0], a + b)
    version = pm._rb.scratch.version
    with stopped(server):
        for call, kw in ((pm.execute, {"timeout_s": 0.2}), (pm.execute, {}), (burst.execute, {"timeout_s": 0.2})):
            with pytest.raises(ServiceTimeoutError) as e:
                returns(call, [a, b], **kw)
            assert e.value.status == ErrorStatus.DEVICE_UNAVAILABLE
        with pytest.raises(ServiceUnavailableError):
            burst.execute([a, b])  # the stream was cancelled: never reused
        with pytest.raises(ServiceTimeoutError):
            returns(client.prepare_model, add_model(), timeout_s=0.2)
        monkeypatch.setattr(sc, "PREPARE_TIMEOUT_S", 0.5)
        monkeypatch.setattr(sc, "RPC_TIMEOUT_S", 0.5)
        with pytest.raises(ServiceTimeoutError):
            returns(client.prepare_model_from_cache, add_model(), b"t" * 32)
        with pytest.raises(ServiceTimeoutError):
            returns(client.get_support_reasons, add_model())
        with pytest.raises(ServiceUnavailableError, match="no nnhal service answers"):
            returns(Client.connect, server.address, timeout_s=0.5)
    # Resumed: the same client and prepared model work again (with a fresh scratch pool: the
    # abandoned one may have been written by the late executions).
    np.testing.assert_array_equal(pm.execute([b, b]).outputs[0], b + b)
    assert pm._rb.scratch.version > version
    with pm.burst() as burst2:
        np.testing.assert_array_equal(burst2.execute([a, a]).outputs[0], a + a)
