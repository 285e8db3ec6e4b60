"""The shared-memory burst (FMQ path) against a real server process."""
from __future__ import annotations

import mmap
import socket
import time

import numpy as np
import pytest

from hal.compiler import compile_model
from hal.types import ErrorStatus
from service.client import ServiceError, ServiceUnavailableError
from service.proto import nnhal_pb2 as pb
from tests.service.models import add_chain, add_model


def test_local_burst_results_and_timing(client):
    pm = client.prepare_model(add_model((3, 4)))
    rng = np.random.default_rng(3)
    with pm.local_burst() as lb:
        for i in range(50):
            a, b = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
            out = lb.execute([a, b], measure_timing=(i == 0))
            np.testing.assert_array_equal(out.outputs[0], a + b)
            assert out.output_shapes == [(3, 4)]
            if i == 0:
                assert 0 < out.timing.time_on_device_ns <= out.timing.time_in_driver_ns
    assert pm.perf_info().executions == 50


def test_local_burst_writes_into_the_arrays_given_and_reads_inputs_anew(client):
    """The same input and output arrays on every call (as the delegate's TFLite tensors): each call
    reads the inputs' current contents and writes each result into its array, contiguous or not;
    other arrays given later are checked and written as well."""
    pm = client.prepare_model(add_model((2, 3)))
    rng = np.random.default_rng(7)
    a, b = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    out, wide = np.empty((2, 3), np.float32), np.zeros((2, 6), np.float32)
    with pm.local_burst() as lb:
        for _ in range(3):
            a += 1  # in place: the same array, new contents
            assert lb.execute([a, b], [out]).outputs[0] is out
            np.testing.assert_array_equal(out, pm.execute([a, b]).outputs[0])
        strided = wide[:, ::2]  # not contiguous: written through numpy
        lb.execute([a, b], [strided])
        np.testing.assert_array_equal(strided, out)
        assert not wide[:, 1::2].any()
        flat = np.empty(6, np.float32)  # another shape, the same element count: reshaped to it
        lb.execute([b, a], [flat])
        np.testing.assert_array_equal(flat, out.reshape(6))
        with pytest.raises(ValueError):
            lb.execute([a, b], [np.empty(5, np.float32)])


def test_the_steady_path_keeps_deadlines_errors_and_perf_records(client):
    """The same arrays call after call (the client's and the service's steady path): each request's
    deadline is still checked, a failure is reported and followed by correct results, and every
    execution is in the perf records, before and after a reset."""
    m = add_chain(3)
    pm = client.prepare_model(m)
    x, out = np.ones((8, 8), np.float32), np.empty((8, 8), np.float32)
    program = compile_model(m).static_plan.program
    with pm.local_burst() as lb:
        for k in range(4):
            x += k
            lb.execute([x], [out])
            np.testing.assert_array_equal(out, pm.execute([x]).outputs[0])
        with pytest.raises(ServiceError) as e:
            lb.execute([x], [out], timeout_s=1e-9)
        assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
        x += 1
        lb.execute([x], [out])
        np.testing.assert_array_equal(out, pm.execute([x]).outputs[0])
        info = pm.perf_info()  # 5 + 5 executions (the burst's and pm.execute's); the late one never started
        assert info.executions == 10
        # per operation: every execution of a one-step program; a chained program's unmeasured
        # burst executions are sampled (service.execution.TIMED_ONE_IN), pm.execute's 5 are not
        timed = {o.executions for o in info.operations}
        assert [o.index for o in info.operations] == [s.index for s in program] and len(timed) == 1
        assert timed == {10} if len(program) == 1 else 5 < timed.pop() <= 10, (program, info.operations)
        pm.reset_perf_info()
        for _ in range(3):
            lb.execute([x], [out])
        info = pm.perf_info()
        assert info.executions == 3
        sampled = {o.index: o.executions for o in info.operations}
        if len(program) == 1:
            assert sampled == {program[0].index: 3}
        lb.execute([x], [out], measure_timing=True)  # a measured execution is timed per operation
        info = pm.perf_info()
        assert info.executions == 4
        assert [(o.index, o.executions) for o in info.operations] == [(s.index, sampled.get(s.index, 0) + 1)
                                                                        for s in program]
        assert all(o.total_ns > 0 for o in info.operations)


def test_steady_replies_are_posted_once_each_whatever_comes_between(client):
    """A steady request's reply is posted from inside the execution, as soon as its outputs are
    valid (``BoundExecution``'s ``done``); requests that are measured, late or of another layout
    are answered after it. Mixed together, every reply answers its own request (a second post of
    one would be read as the next one's reply) with that request's outputs."""
    pm = client.prepare_model(add_chain(3))  # y = 4x
    x, out = np.ones((8, 8), np.float32), np.empty((8, 8), np.float32)
    with pm.local_burst() as lb:
        for k in range(120):
            x += 1
            if k % 11 == 5:
                with pytest.raises(ServiceError) as e:
                    lb.execute([x], [out], timeout_s=1e-9)
                assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
            elif k % 13 == 7:  # other arrays: the client's full path, the same request bytes
                np.testing.assert_array_equal(lb.execute([x.copy()]).outputs[0], 4 * x)
            else:
                lb.execute([x], [out], measure_timing=k % 5 == 0)
                np.testing.assert_array_equal(out, 4 * x)
    assert pm.perf_info().executions == 120 - len(range(5, 120, 11))


def test_a_request_like_the_bound_one_but_for_its_number_skips_decoding_only_then():
    import mmap

    from service import burst_wire as wire
    mem = mmap.mmap(-1, wire.HEADER_BYTES)
    view = memoryview(mem)
    ins, outs = [((2, 3), 0, 24), ((2, 3), 64, 24)], [(128, 24)]
    wire.write_request(view, 7, ins, outs, False, 0, 0)
    key = wire.request_key(view, wire.read_request(view))
    wire.write_header(view, 8, 2, 1, False, 0, 0)
    assert wire.same_request(view, key) == 8
    for changed in (dict(measure=True), dict(timeout_ns=5), dict(loop_timeout_ns=5)):
        args = dict(measure=False, timeout_ns=0, loop_timeout_ns=0) | changed
        wire.write_header(view, 9, 2, 1, args["measure"], args["timeout_ns"], args["loop_timeout_ns"])
        assert wire.same_request(view, key) is None, changed
    wire.write_request(view, 10, [((3, 2), 0, 24), ((2, 3), 64, 24)], outs, False, 0, 0)
    assert wire.same_request(view, key) is None
    wire.write_request(view, 11, ins, outs, False, 0, 0)
    view[0:4] = b"XXXX"
    assert wire.same_request(view, key) is None
    view.release()
    mem.close()


def test_a_bound_burst_still_reads_each_requests_deadline(client):
    pm = client.prepare_model(add_model((2, 3)))
    x = np.ones((2, 3), np.float32)
    with pm.local_burst() as lb:
        for _ in range(3):
            np.testing.assert_array_equal(lb.execute([x, x]).outputs[0], x + x)
        with pytest.raises(ServiceError) as e:
            lb.execute([x, x], timeout_s=1e-9)
        assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
        np.testing.assert_array_equal(lb.execute([x, 3 * x]).outputs[0], 4 * x)
        assert lb.execute([x, x], measure_timing=True).timing.time_in_driver_ns > 0


def test_local_burst_large_tensor(client):
    pm = client.prepare_model(add_chain(3, (224, 224 * 3)))
    x = np.random.default_rng(0).standard_normal((224, 224 * 3)).astype(np.float32)
    with pm.local_burst() as lb:
        np.testing.assert_allclose(lb.execute([x]).outputs[0], 4 * x, rtol=1e-6)


def test_local_burst_errors_are_statuses(client):
    pm = client.prepare_model(add_model((2, 3)))
    with pm.local_burst() as lb:
        with pytest.raises(ServiceError) as e:
            lb.execute([np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)])
        assert e.value.status == ErrorStatus.INVALID_ARGUMENT
        with pytest.raises(ServiceError) as e:
            lb.execute([np.ones((2, 3), np.float32)] * 2, timeout_s=1e-9)
        assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
        x = np.ones((2, 3), np.float32)
        np.testing.assert_array_equal(lb.execute([x, x]).outputs[0], x + x)  # still serving


def test_local_burst_opened_by_the_prepare_from_cache(client):
    """One call loads the model and opens its burst; the burst runs as one opened on its own."""
    model, token = add_model((3, 4)), bytes(range(32))
    client.prepare_model(model, token=token).release()
    pm = client.prepare_model_from_cache(model, token, local_burst=True)
    assert pm.opened_burst is not None and pm.opened_burst.status.code == ErrorStatus.NONE
    a, b = (np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32) for _ in range(2))
    with pm.local_burst() as lb:
        assert pm.opened_burst is None  # taken: a second local_burst() asks the service for another
        np.testing.assert_array_equal(lb.execute([a, b]).outputs[0], pm.execute([a, b]).outputs[0])
    with pm.local_burst() as lb:
        np.testing.assert_array_equal(lb.execute([a, b]).outputs[0], a + b)
    assert client.prepare_model_from_cache(model, token).opened_burst is None  # not asked for


def test_local_burst_with_the_prepare_from_cache_validates_it(client):
    model, token = add_model(), bytes(range(1, 33))
    client.prepare_model(model, token=token).release()
    reply = client.device.PrepareModelFromCache(pb.PrepareModelFromCacheRequest(
        token=token, local_burst_slot_bytes=1 << 40))
    assert reply.status.code == ErrorStatus.NONE and reply.prepared_model_id  # the model is prepared either way
    assert reply.local_burst.status.code == ErrorStatus.INVALID_ARGUMENT
    assert "slot_bytes" in reply.local_burst.status.message


def test_wrong_token_is_refused(client):
    pm = client.prepare_model(add_model())
    reply = client.prepared.OpenLocalBurst(pb.LocalBurstRequest(prepared_model_id=pm.id, slot_bytes=256))
    assert reply.status.code == 0
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(reply.socket_path)
    s.sendall(b"x" * 16)
    msg, fds, _, _ = socket.recv_fds(s, 16, 1)
    assert msg == b"" and fds == []  # closed without handing out memory
    s.close()


def test_open_local_burst_validation(client):
    pm = client.prepare_model(add_model())
    for slot in (0, 1 << 40):
        reply = client.prepared.OpenLocalBurst(pb.LocalBurstRequest(prepared_model_id=pm.id, slot_bytes=slot))
        assert reply.status.code == ErrorStatus.INVALID_ARGUMENT and "slot_bytes" in reply.status.message
    reply = client.prepared.OpenLocalBurst(pb.LocalBurstRequest(prepared_model_id="nope", slot_bytes=64))
    assert "unknown prepared model" in reply.status.message


def test_local_burst_after_server_death_is_unavailable(server, client):
    pm = client.prepare_model(add_model())
    x = np.ones((2, 3), np.float32)
    lb = pm.local_burst()
    lb.execute([x, x])
    server.proc.kill()
    server.proc.wait()
    with pytest.raises(ServiceUnavailableError):
        lb.execute([x, x])
    lb.close()


def test_the_client_polls_only_when_a_core_is_free_and_the_wait_is_short():
    from service.local_burst_client import CLIENT_SPIN_MAX_S, SHORT_S, WaitStrategy
    for busy in (WaitStrategy(service_threads=2, cores=2), WaitStrategy(service_threads=0, cores=8)):
        busy.observe(5e-3)  # the service computes on every core (0 = every core): block throughout
        assert busy.spin_s() == 0 and busy.doze_s() == 0
    w = WaitStrategy(service_threads=1, cores=2)
    assert w.spin_s() == SHORT_S and w.doze_s() == 0  # no estimate yet
    w.observe(30e-6)
    assert w.spin_s() == pytest.approx(80e-6) and w.doze_s() == 0  # about twice the expected round trip
    for t in (4e-3, 6e-3, 5e-3) * 20:
        w.observe(t)  # the model turned out long: sleep through it, poll only for its end
    assert w.expected_s > SHORT_S
    assert w.doze_s() == pytest.approx(4e-3 - w.lead_s(4e-3))  # until the lead before the fastest recent one
    assert w.spin_s() == pytest.approx(min(CLIENT_SPIN_MAX_S, 2 * w.lead_s(w.expected_s) + 0.1 * w.expected_s))
    w = WaitStrategy(service_threads=1, cores=4)
    w.observe(0.995e-3)
    assert w.spin_s() == CLIENT_SPIN_MAX_S and w.doze_s() == 0  # capped


def test_the_doze_ends_a_lead_before_the_earliest_recent_reply():
    """The doze is predicted from the fastest of the last RECENT executions, not fitted to the
    latest: on a machine whose speed changes from spell to spell (30% on a 2-vCPU virtual machine)
    a doze fitted to a slow execution ends after the next fast one's reply. A reply that came
    during a doze counts as due by the doze's end (its round trip includes the client's wake-up),
    so the next doze ends a lead earlier; other clients taking turns, or a short execution, drop
    the doze."""
    from service.local_burst_client import CLIENT_SPIN_MAX_S, DOZE_SPREAD, POLL_MARGIN_S, RECENT, WaitStrategy
    w = WaitStrategy(service_threads=1, cores=2)
    assert w.lead_s(5e-3) == pytest.approx(POLL_MARGIN_S + DOZE_SPREAD * 5e-3)
    # a long execution's lead stops at half the polling that follows it, which then reaches past
    # the predicted reply (a 30 ms one's 3.2 ms lead would end the 2 ms of polling before it)
    assert w.lead_s(30e-3) == CLIENT_SPIN_MAX_S / 2
    w.observe(30e-3)
    assert w.spin_s() >= 2 * w.lead_s(30e-3)
    for t in (3e-3, 4e-3) * 3:  # a fast spell's executions among slow ones
        w.observe(t)
    first = w.doze_s()
    assert first == pytest.approx(3e-3 - w.lead_s(3e-3))  # the slow ones do not move it
    w.observe(3.5e-3, woken=True)  # the reply came during the doze: due by its end at the latest
    second = w.doze_s()
    assert second == pytest.approx(first - w.lead_s(first))
    for _ in range(40):
        w.observe(1.5e-3, woken=True)  # every reply during the doze: down to a plain poll, never below
        w.doze_s()
    assert w.doze_s() == 0
    for _ in range(RECENT):
        w.observe(5e-3)  # a slower spell: once the last RECENT executions are all slow, the doze grows
    assert w.doze_s() == pytest.approx(5e-3 - w.lead_s(5e-3))
    w.shared = True
    assert w.doze_s() == 0 and w.doze is None
    w.shared = False
    assert w.doze_s() == pytest.approx(5e-3 - w.lead_s(5e-3))
    w.observe(2e-3, woken=False)  # a reply seen while polling counts as its round trip
    assert w.doze_s() == pytest.approx(2e-3 - w.lead_s(2e-3))
    for _ in range(20):
        w.observe(0.2e-3)  # short again: polled, no doze
    assert w.doze_s() == 0 and w.doze is None


def test_the_client_polls_when_the_service_cannot_need_its_core():
    """Pinned apart (no CPU in common) the service's threads never need the client's core; pinned
    to one CPU together, the poller hands the CPU over at each poll. Sharing some CPUs of several,
    the service's thread count decides as before; an unknown service, the client's affinity."""
    from service.local_burst_client import SHORT_S, WaitStrategy
    assert WaitStrategy(service_threads=0, client_cpus={0}, service_cpus={1}).spin_s() == SHORT_S
    assert WaitStrategy(service_threads=1, client_cpus={0}, service_cpus={0}).spin_s() == SHORT_S
    assert WaitStrategy(service_threads=2, client_cpus={0, 1}, service_cpus={0, 1}).spin_s() == 0
    assert WaitStrategy(service_threads=1, client_cpus={0, 1}, service_cpus={1, 2}).spin_s() == SHORT_S
    assert WaitStrategy(service_threads=2, client_cpus={0, 1}, service_cpus={1, 2}).spin_s() == SHORT_S
    assert WaitStrategy(service_threads=0, client_cpus={0, 1}, service_cpus={1, 2}).spin_s() == 0
    assert WaitStrategy(service_threads=1, client_cpus={0}).spin_s() == 0


def test_the_client_knows_the_services_cpus(server, client):
    """The channel asks the kernel which process serves it (SO_PEERCRED) and where it may run."""
    import os

    from service.local_burst_client import _peer_pid, cpus_of
    pm = client.prepare_model(add_model((2, 3)))
    with pm.local_burst() as lb:
        pid = _peer_pid(lb.channel.sock)
        assert pid == server.proc.pid
        assert cpus_of(pid) == os.sched_getaffinity(server.proc.pid)


def test_the_service_polls_only_for_a_burst_invoked_back_to_back():
    """A burst's thread polls after a reply only when the request before it was its own: bursts
    taking turns (a model's partitions, two clients) would hold the GIL the next one needs. Whether
    the request before was another client's is what the reply's REPLY_SHARED says."""
    from types import SimpleNamespace

    from service.local_burst_server import _LastServed
    a1, a2 = SimpleNamespace(token=b"1" * 16, client="A"), SimpleNamespace(token=b"2" * 16, client="A")
    b1 = SimpleNamespace(token=b"3" * 16, client="B")
    turns = [_LastServed.took_turn(x) for x in (a1, a1, a2, a1, b1, b1, a1)]
    assert [again for again, _ in turns][1:] == [True, False, False, False, True, False]
    assert [shared for _, shared in turns][1:] == [False, False, False, True, False, True]


def test_the_service_polls_longer_after_a_longer_execution():
    """After a reply the service polls SERVICE_SPIN_S, or a fraction of the execution it served when
    that is longer (the client's turn between invokes grows with the model), never past the cap."""
    from service import local_burst_server as lbs
    assert lbs.spin_after(1e-5) == lbs.SERVICE_SPIN_S
    long = 2 * lbs.SERVICE_SPIN_S / lbs.SERVICE_SPIN_FRACTION
    assert lbs.spin_after(long) == pytest.approx(2 * lbs.SERVICE_SPIN_S)
    assert lbs.spin_after(10.0) == lbs.SERVICE_SPIN_MAX_S


def test_the_client_blocks_while_the_service_says_other_clients_take_turns():
    from service.local_burst_client import WaitStrategy
    w = WaitStrategy(service_threads=1, cores=2)
    w.observe(30e-6)
    assert w.spin_s() > 0
    w.shared = True
    assert w.spin_s() == 0
    w.shared = False
    assert w.spin_s() > 0
    for _ in range(10):
        w.observe(5e-3)
    assert w.doze_s() > 0
    w.shared = True
    assert w.spin_s() == 0 and w.doze_s() == 0  # a long execution too: blocked on, whole


def test_replies_say_when_another_client_was_served_in_between(server, client):
    """Two clients (two sessions) taking turns: each reply after the other's request carries
    REPLY_SHARED, so neither polls; alone again, the flag clears."""
    from service.client import Client
    rng = np.random.default_rng(5)
    with Client.connect(server.address) as other:
        pa, pb_ = client.prepare_model(add_model((3, 4))), other.prepare_model(add_chain(2, (3, 4)))
        with pa.local_burst() as la, pb_.local_burst() as lb:
            for _ in range(3):
                a, b = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
                np.testing.assert_array_equal(la.execute([a, b]).outputs[0], a + b)
                np.testing.assert_allclose(lb.execute([a]).outputs[0], 3 * a, rtol=1e-6)
                assert la.channel.wait.shared and lb.channel.wait.shared
            la.execute([a, b])
            assert la.channel.wait.shared  # b's request came before this one
            la.execute([a, b])
            assert not la.channel.wait.shared  # alone again


def test_bursts_taking_turns_still_answer_each_request(client):
    """Two prepared models' local bursts invoked alternately, as a two-partition model's are: every
    reply is the right one (the polling policy changes waits, never results)."""
    pa, pb_ = client.prepare_model(add_model((3, 4))), client.prepare_model(add_chain(2, (3, 4)))
    rng = np.random.default_rng(7)
    with pa.local_burst() as la, pb_.local_burst() as lb:
        for _ in range(30):
            a, b = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
            np.testing.assert_array_equal(la.execute([a, b]).outputs[0], a + b)
            np.testing.assert_allclose(lb.execute([a]).outputs[0], 3 * a, rtol=1e-6)


def test_stopped_service_local_burst_times_out_and_closes(server, client, monkeypatch):
    """A stopped service never rings the doorbell: the wait ends at its bound (the deadline plus a
    grace; else the default, shortened here), and the session closes for good, since the service may
    still write its slots when it resumes."""
    from service.client import ServiceTimeoutError
    from tests.service.conftest import returns, stopped
    monkeypatch.setenv("NNHAL_EXECUTE_WAIT_MIN_S", "0.5")
    pm = client.prepare_model(add_model((2, 3)))
    x = np.ones((2, 3), np.float32)
    for kw in ({"timeout_s": 0.2}, {}):
        lb = pm.local_burst()
        np.testing.assert_array_equal(lb.execute([x, x], timeout_s=30).outputs[0], x + x)
        with stopped(server):
            with pytest.raises(ServiceTimeoutError, match="did not answer the local burst"):
                returns(lb.execute, [x, x], **kw)
            assert lb.channel.closed
            with pytest.raises(ServiceUnavailableError, match="closed"):
                lb.execute([x, x])  # never reused
        lb.close()
    with pm.local_burst() as lb:  # the service resumed: a new session works
        np.testing.assert_array_equal(lb.execute([x, 2 * x]).outputs[0], 3 * x)


def test_a_burst_pins_its_mapping_for_device_backends_and_releases_it_when_it_ends(tmp_path):
    """A registered pinner (what a GPU backend registers: hal.backends.host_memory) is given the
    burst's whole mapping once, when the burst maps it, and its release runs once, when the burst
    ends; results are unchanged. The service runs in this process, so it sees this pinner."""
    from hal.backends import host_memory
    from service.client import Client
    from service.server import create_server

    calls: list[tuple] = []

    def pinner(address: int, nbytes: int):
        calls.append(("pin", address, nbytes))
        return lambda: calls.append(("release", address, nbytes))

    host_memory.register_pinner(pinner)
    running = create_server(str(tmp_path / "s.sock"), backends="reference")
    try:
        with Client.connect(running.address, timeout_s=30) as client:
            pm = client.prepare_model(add_model((3, 4)))
            a, b = np.ones((3, 4), np.float32), np.full((3, 4), 2, np.float32)
            with pm.local_burst() as lb:
                for _ in range(3):
                    np.testing.assert_array_equal(lb.execute([a, b]).outputs[0], a + b)
                assert [c[0] for c in calls] == ["pin"] and calls[0][1] % mmap.PAGESIZE == 0
                assert calls[0][2] >= a.nbytes * 3
            deadline = time.monotonic() + 10
            while len(calls) < 2 and time.monotonic() < deadline:  # the burst's thread ends after the client
                time.sleep(0.01)
            assert calls[1] == ("release", *calls[0][1:])
    finally:
        host_memory.unregister_pinner(pinner)
        running.stop()
