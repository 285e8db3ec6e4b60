"""Priority ordering of queued work, and the execution deadline checked between operations."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import hal
from hal.errors import HalError
from hal.types import ErrorStatus, ExecutionPreference, Priority
from service.driver import Driver
from service.scheduler import Scheduler
from tests.service.models import add_chain


def test_highest_priority_queued_work_runs_first():
    s = Scheduler(workers=1)
    gate, holding = threading.Event(), threading.Event()
    order = []

    def hold():
        holding.set()
        gate.wait()
    blocker = threading.Thread(target=s.run, args=(Priority.LOW, hold))
    blocker.start()
    assert holding.wait(10)
    threads = []
    for i, p in enumerate([Priority.LOW, Priority.MEDIUM, Priority.HIGH, Priority.LOW, Priority.HIGH]):
        t = threading.Thread(target=s.run, args=(p, lambda p=p, i=i: order.append((p, i))))
        t.start()
        threads.append(t)
        while s.queued < i + 1:  # enqueue in a known order
            time.sleep(0.001)
    gate.set()
    for t in [blocker, *threads]:
        t.join(10)
    assert order == [(Priority.HIGH, 2), (Priority.HIGH, 4), (Priority.MEDIUM, 1), (Priority.LOW, 0),
                     (Priority.LOW, 3)]


def test_at_most_workers_run_at_once():
    s = Scheduler(workers=2)
    running, peak, lock = [0], [0], threading.Lock()

    def work():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
    threads = [threading.Thread(target=s.run, args=(Priority.MEDIUM, work)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert peak[0] == 2


def test_scheduler_delivers_exceptions_and_refuses_after_shutdown():
    s = Scheduler(workers=2)
    with pytest.raises(ZeroDivisionError):
        s.run(Priority.MEDIUM, lambda: 1 / 0)
    assert s.run(Priority.MEDIUM, lambda: 7) == 7  # the slot was given back
    s.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        s.run(Priority.MEDIUM, lambda: 1)


def test_deadline_is_checked_during_execution(monkeypatch):
    """The clock passes the deadline after the 3rd operation: execution stops there (per-operation
    backends: the deadline is checked before every step)."""
    compiled = hal.compile_model(add_chain(10, (2, 2)), backend_order=["reference"])
    import hal.executor as ex
    ticks = iter(range(0, 10**6, 100))
    monkeypatch.setattr(ex.time, "monotonic_ns", lambda: next(ticks))
    with pytest.raises(HalError) as e:
        hal.execute(compiled, [np.ones((2, 2), np.float32)], deadline_ns=250)
    assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
    assert "before operation 3 (ADD)" in e.value.message


def test_a_partition_checks_the_deadline_before_it_starts(monkeypatch):
    """A graph backend's partition is one step: the deadline is checked before it (it runs whole)."""
    compiled = hal.compile_model(add_chain(10, (2, 2)), backend_order=["onnxruntime", "reference"])
    assert len(compiled.static_plan.program) == 1
    import hal.executor as ex
    monkeypatch.setattr(ex.time, "monotonic_ns", lambda: 1000)
    with pytest.raises(HalError) as e:
        hal.execute(compiled, [np.ones((2, 2), np.float32)], deadline_ns=999)
    assert e.value.status == ErrorStatus.MISSED_DEADLINE_TRANSIENT
    assert "before operations 0-9 (onnxruntime partition)" in e.value.message
    hal.execute(compiled, [np.ones((2, 2), np.float32)], deadline_ns=1001)


def test_low_power_preference_serialises_executions():
    d = Driver()
    low = d.prepare(add_chain(1, (2, 2)), ExecutionPreference.LOW_POWER, Priority.MEDIUM, None)
    fast = d.prepare(add_chain(1, (2, 2)), ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM, None)
    assert low.gate is not None and low.gate._value == 1
    assert fast.gate is None
