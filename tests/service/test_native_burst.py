"""The local burst's native steady round trip (service.native_burst) against a real server process:
the same results, sequence numbers and records as the Python path, every hand-back finished in
Python, and a channel never unmapped under it."""
from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

from hal.types import ErrorStatus
from service import native_burst
from service.client import ServiceError
from tests.service.models import add_chain, add_model

pytestmark = pytest.mark.skipif(native_burst.steady_address() is None,
                                reason="native code unavailable here (not x86-64 Linux, or NNHAL_NATIVE_INVOKE=0)")

STEADY = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)


def _arm(lb, inputs, outputs, **timeouts):
    """The native round trip armed for these arrays, the strategy set to poll (the policy itself is
    WaitStrategy's, tested with it): (callable, frame address)."""
    w = lb.channel.wait
    w.core_free, w.shared, w.expected_s = True, False, 50e-6
    armed = lb.arm_native(inputs, outputs, **timeouts)
    assert armed is not None
    fn, frame = armed
    return STEADY(fn), frame


def test_native_round_trips_match_the_python_path_and_share_its_sequence(client):
    """Native round trips and Python executions interleaved on one burst: every result right, each
    request answered once (the perf records count them all), a hand-back finished in Python."""
    pm = client.prepare_model(add_model((3, 4)))
    rng = np.random.default_rng(11)
    a, b = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
    out = np.empty((3, 4), np.float32)
    executions = 0
    with pm.local_burst() as lb:
        lb.execute([a, b], [out])
        executions += 1
        for k in range(200):
            if k % 40 == 0:  # a Python execution between (it disarms), then armed again
                a += 1
                lb.execute([a, b], [out])
                executions += 1
                np.testing.assert_array_equal(out, a + b)
                steady, frame = _arm(lb, [a, b], [out])
            a[k % 3, k % 4] = k  # in place: the slots read the input anew
            code = steady(frame)
            executions += 1
            if code == native_burst.NOT_RUN:  # it stood down after a slow round trip: nothing was sent
                assert lb.resume_native(code, [out]) is None
                lb.execute([a, b], [out])
            elif code != native_burst.DONE:  # its reply came after the polling
                assert code == native_burst.PENDING, code
                assert lb.resume_native(code, [out]).outputs[0] is out
            if code != native_burst.DONE:
                steady, frame = _arm(lb, [a, b], [out])
            np.testing.assert_array_equal(out, a + b)
        assert lb.channel.native_runs > 0
        lb.execute([a, b], [out])  # the sequence goes on in Python
        np.testing.assert_array_equal(out, a + b)
    assert pm.perf_info().executions == executions + 1


def test_a_reply_not_seen_while_polling_is_waited_for_in_python(client):
    """With no polling the native round trip hands the invoke back once it posted, and Python
    waits for the reply. The model takes a while (3 ADDs over 1 MB) so that its reply is not in
    before the first look; a client descheduled right after posting (a loaded machine) may still
    find it there (DONE, also right): a few tries, one of them is to hand back."""
    pm = client.prepare_model(add_chain(3, (512, 512)))  # y = 4x
    x, out = np.ones((512, 512), np.float32), np.empty((512, 512), np.float32)
    with pm.local_burst() as lb:
        lb.execute([x], [out])
        codes = []
        for _ in range(5):
            steady, frame = _arm(lb, [x], [out])
            lb.channel.native.words[native_burst.SPIN_MAX_NS] = 0  # hands back as soon as it posted
            x += 2
            code = steady(frame)
            codes.append(code)
            if code != native_burst.DONE:
                assert lb.resume_native(code, [out]).outputs[0] is out
            np.testing.assert_array_equal(out, 4 * x)
            if code == native_burst.PENDING:
                break
        assert codes[-1] == native_burst.PENDING, codes
        assert lb.channel.native_runs == len(codes) - 1  # the DONEs before it
        x += 1
        lb.execute([x], [out])
        np.testing.assert_array_equal(out, 4 * x)


def test_a_failure_reply_is_decoded_in_python(client):
    """The service's answer to a request past its deadline is a status: handed back (OTHER), raised
    by the Python path as any local burst failure, and the next request is answered right."""
    pm = client.prepare_model(add_model((2, 3)))
    a, b, out = np.ones((2, 3), np.float32), np.full((2, 3), 2, np.float32), np.empty((2, 3), np.float32)
    with pm.local_burst() as lb:
        lb.execute([a, b], [out])
        steady, frame = _arm(lb, [a, b], [out], timeout_s=1e-9)  # every request late on arrival
        code = steady(frame)
        assert code in (native_burst.OTHER, native_burst.PENDING)  # PENDING: it came after the polling
        with pytest.raises(ServiceError) as e:
            lb.resume_native(code, [out], timeout_s=1e-9)
        assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
        a += 5
        lb.execute([a, b], [out])
        np.testing.assert_array_equal(out, a + b)


def test_the_native_path_stands_down_when_the_strategy_would_not_poll(client):
    pm = client.prepare_model(add_model((2, 3)))
    a, b, out = np.ones((2, 3), np.float32), np.ones((2, 3), np.float32), np.empty((2, 3), np.float32)
    with pm.local_burst() as lb:
        lb.execute([a, b], [out])
        w = lb.channel.wait
        for setting in ({"core_free": False}, {"shared": True}, {"expected_s": None}):
            w.core_free, w.shared, w.expected_s = True, False, 50e-6
            for name, value in setting.items():
                setattr(w, name, value)
            assert lb.arm_native([a, b], [out]) is None, setting
        assert lb.arm_native([a.copy(), b], [out]) is None  # not the arrays the slots were laid out for
        steady, frame = _arm(lb, [a, b], [out])
        lb.channel.native.words[native_burst.SHORT_NS] = 0  # every execution now "long"
        code = steady(frame)
        if code == native_burst.PENDING:
            lb.resume_native(code, [out])
        else:  # done, and disarmed: the next one is Python's (it would doze)
            assert code == native_burst.DONE and steady(frame) == native_burst.NOT_RUN
            assert lb.resume_native(native_burst.NOT_RUN, [out]) is None
        np.testing.assert_array_equal(out, a + b)
        lb.execute([a, b], [out])
        np.testing.assert_array_equal(out, a + b)


def test_closing_waits_for_a_native_round_trip_and_stops_the_next(client):
    """A close from another thread while native round trips run: it returns only once none is
    under way (the slots are unmapped after), and every round trip after it sends nothing."""
    pm = client.prepare_model(add_model((64, 64)))
    a, b, out = np.ones((64, 64), np.float32), np.ones((64, 64), np.float32), np.empty((64, 64), np.float32)
    lb = pm.local_burst()
    lb.execute([a, b], [out])
    steady, frame = _arm(lb, [a, b], [out])
    codes: list[int] = []
    started = threading.Event()

    def loop():
        while True:
            code = steady(frame)
            codes.append(code)
            started.set()
            if code != native_burst.DONE:
                return

    t = threading.Thread(target=loop)
    t.start()
    started.wait(10)
    lb.close()
    t.join(10)
    assert not t.is_alive() and codes[-1] in (native_burst.NOT_RUN, native_burst.PENDING), codes[-5:]
    assert steady(frame) == native_burst.NOT_RUN


def test_a_long_execution_is_dozed_through_as_the_strategy_says(client):
    """Executions expected longer than SHORT_S: the native round trip sleeps the strategy's doze
    and polls after it. A reply that came during the doze is right, recorded as due by the doze's
    end, and disarms (the strategy shortens the next doze); one that came while polling keeps it."""
    from service.local_burst_client import SHORT_S
    pm = client.prepare_model(add_model((2, 3)))
    a, b, out = np.ones((2, 3), np.float32), np.ones((2, 3), np.float32), np.empty((2, 3), np.float32)
    with pm.local_burst() as lb:
        lb.execute([a, b], [out])
        w = lb.channel.wait
        w.core_free, w.shared, w.expected_s = True, False, 4 * SHORT_S
        w.recent.clear()
        w.recent.append(4 * SHORT_S)  # a doze of about 3.4 ms: this execution replies well within it
        fn, frame = lb.arm_native([a, b], [out])
        words = lb.channel.native.words
        doze = words[native_burst.DOZE_NS] / 1e9
        assert words[native_burst.LONG] == 1 and 2 * SHORT_S < doze < 4 * SHORT_S
        a += 1
        code = STEADY(fn)(frame)
        assert code in (native_burst.DONE, native_burst.PENDING)
        if code == native_burst.PENDING:  # descheduled past the polling: finished in Python
            lb.resume_native(code, [out])
        else:
            assert words[native_burst.WOKEN] == 1 and STEADY(fn)(frame) == native_burst.NOT_RUN
            lb.channel._take_native()
            assert w.recent[-1] == pytest.approx(doze)
        np.testing.assert_array_equal(out, a + b)
        # no doze (the recent replies were quick), the execution still expected long: polled for
        w.shared, w.expected_s = False, 4 * SHORT_S
        w.recent.clear()
        w.recent.append(30e-6)
        fn, frame = lb.arm_native([a, b], [out])
        assert words[native_burst.LONG] == 1 and words[native_burst.DOZE_NS] == 0
        for _ in range(50):  # until one is done natively (a loaded machine may make one late)
            a += 1
            code = STEADY(fn)(frame)
            if code == native_burst.DONE:
                np.testing.assert_array_equal(out, a + b)
                break
            if lb.resume_native(code, [out]) is None:
                lb.execute([a, b], [out])
            np.testing.assert_array_equal(out, a + b)
            w.shared, w.expected_s = False, 4 * SHORT_S
            w.recent.append(30e-6)
            fn, frame = lb.arm_native([a, b], [out])
        assert code == native_burst.DONE and lb.channel.native_runs >= 1


def test_a_signal_ends_a_native_doze(client):
    """A signal (Ctrl-C's SIGINT, here SIGUSR1 with a handler) during the native doze hands the
    invoke to Python at once, which then waits interruptibly, instead of polling out the doze."""
    import signal
    import time
    pm = client.prepare_model(add_model((2, 3)))
    a, b, out = np.ones((2, 3), np.float32), np.ones((2, 3), np.float32), np.empty((2, 3), np.float32)
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    try:
        with pm.local_burst() as lb:
            lb.execute([a, b], [out])
            w = lb.channel.wait
            w.core_free, w.shared, w.expected_s = True, False, 30.0
            w.recent.clear()
            w.recent.append(30.0)  # a 30 s execution expected: a doze of about as long
            fn, frame = lb.arm_native([a, b], [out])
            assert lb.channel.native.words[native_burst.DOZE_NS] > 20e9
            timer = threading.Timer(0.2, signal.pthread_kill, (threading.main_thread().ident, signal.SIGUSR1))
            timer.start()
            t0 = time.monotonic()
            a += 1
            code = STEADY(fn)(frame)
            assert code == native_burst.PENDING and time.monotonic() - t0 < 10
            lb.resume_native(code, [out])
            np.testing.assert_array_equal(out, a + b)
    finally:
        signal.signal(signal.SIGUSR1, previous)
