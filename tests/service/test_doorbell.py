"""The shared-memory burst's doorbell (service.doorbell): posted words, a socket byte only for a
sleeping peer, and no message lost or invented either way."""
from __future__ import annotations

import mmap
import os
import socket
import threading
import time

import pytest

from service import doorbell
from service.doorbell import Doorbell

# this side's posted and waiting words, then the peer's (as the burst's halves lay them out)
A_POSTED, A_WAITING, B_POSTED, B_WAITING = 0, 8, 16, 24


@pytest.fixture(params=[True, False], ids=["memory", "socket"])
def bells(request, monkeypatch):
    """Two ends over a socket pair and one shared page, polling memory (x86-64) or the socket."""
    monkeypatch.setattr(doorbell, "POLL_MEMORY", request.param)
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    mem = mmap.mmap(-1, 4096)
    view = memoryview(mem)
    ends = (Doorbell(a, view, A_POSTED, A_WAITING, B_POSTED, B_WAITING),
            Doorbell(b, view, B_POSTED, B_WAITING, A_POSTED, A_WAITING))
    yield ends
    for end in ends:
        end.release()
    view.release()
    mem.close()
    a.close()
    b.close()


def pending(sock: socket.socket) -> bytes:
    try:
        return sock.recv(64)
    except BlockingIOError:
        return b""


def test_a_polling_peer_sees_the_word_and_is_not_rung(bells):
    a, b = bells
    a.post(1)
    if doorbell.POLL_MEMORY:
        assert pending(b.sock) == b""  # no system call for a peer that polls
        assert b.wait(0, spin_s=0.0, timeout_s=5) == 1
    else:  # without x86-64's store order every message is a byte on the socket
        assert b.wait(0, spin_s=0.0, timeout_s=5) == 1
        assert pending(b.sock) == b""  # and each byte is consumed with its message


def test_a_sleeping_peer_is_rung(bells):
    a, b = bells
    got = []
    t = threading.Thread(target=lambda: got.append(b.wait(0, spin_s=0.0, timeout_s=30)))
    t.start()
    if doorbell.POLL_MEMORY:  # it says it sleeps before it sleeps
        while not b.waiting[0] and t.is_alive():
            pass
    a.post(1)
    t.join(30)
    assert not t.is_alive() and got == [1]
    assert b.waiting[0] == 0  # awake again


def test_a_word_posted_without_a_ring_is_still_seen(bells, monkeypatch):
    """A wake-up lost to a race (the poster read the waiting word before it was set) costs the
    backstop, not a hang: the sleeper looks at the word again once."""
    if not doorbell.POLL_MEMORY:
        pytest.skip("on the socket every message is rung")
    monkeypatch.setattr(doorbell, "BACKSTOP_S", 0.05)
    a, b = bells
    got = []
    t = threading.Thread(target=lambda: got.append(b.wait(0, spin_s=0.0, timeout_s=30)))
    t.start()
    while not b.waiting[0] and t.is_alive():
        pass
    a.posted[0] = 1  # posted, never rung
    t.join(30)
    assert not t.is_alive() and got == [1]


def test_a_stray_byte_is_not_a_message(bells):
    """A byte left by a wake-up the peer did not need is drained, not taken for a new message."""
    a, b = bells
    a.sock.send(b"\x01")
    with pytest.raises(TimeoutError):
        b.wait(0, spin_s=0.0, timeout_s=0.05)
    a.post(1)
    assert b.wait(0, spin_s=0.0, timeout_s=5) == 1


def test_waiting_is_bounded_and_a_closed_peer_ends_it(bells):
    a, b = bells
    with pytest.raises(TimeoutError):
        b.wait(0, spin_s=0.001, timeout_s=0.02)
    assert b.waiting[0] == 0
    a.sock.close()
    assert b.wait(0, spin_s=0.001, timeout_s=5) is None


def test_messages_in_turn_between_two_threads(bells):
    """Request and reply in lockstep, the two ends polling and sleeping in turn: every sequence
    number arrives, in order, once."""
    a, b = bells
    n = 300
    served = []

    def service():
        last = 0
        for k in range(n):
            posted = b.wait(last, spin_s=0.0 if k % 3 else 50e-6, timeout_s=30)
            served.append(posted)
            b.post(posted)
            last = posted

    t = threading.Thread(target=service)
    t.start()
    for seq in range(1, n + 1):
        a.post(seq)
        assert a.wait(seq - 1, spin_s=0.0 if seq % 2 else 50e-6, timeout_s=30) == seq
    t.join(30)
    assert served == list(range(1, n + 1))


def test_a_word_is_read_whole_while_another_process_writes_it():
    """The posted word is stored and loaded as one 8-byte move: a reader in another process sees
    each value whole, never a half-written one (struct.pack_into zeroes the bytes first, and a
    reader caught between saw 0: the reply "to request 0" a burst once got)."""
    mem = mmap.mmap(-1, 4096)
    view = memoryview(mem)
    w = doorbell.word(view, 8)
    w[0] = first = (1 << 40) - 1  # every write carries into all five low bytes
    pid = os.fork()
    if pid == 0:  # the writer: values that differ from the last in every byte
        try:
            for k in range(200_000):
                w[0] = first + 1 + (k % 2) * ((1 << 48) - 1)
        finally:
            os._exit(0)
    seen = set()
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        seen.add(w[0])
    allowed = {first, first + 1, first + (1 << 48)}
    assert seen <= allowed, f"torn reads: {sorted(seen - allowed)[:5]}"
    w.release()
    view.release()
    mem.close()


def test_a_long_poll_offers_the_cpu(bells, monkeypatch):
    """Past YIELD_AFTER_S a poller yields between polls: a peer the scheduler put on the same CPU
    gets to answer instead of waiting out the poller's time slice."""
    a, b = bells
    offered = []
    monkeypatch.setattr(doorbell, "yield_cpu", lambda: offered.append(1))
    with pytest.raises(TimeoutError):
        b.wait(0, spin_s=0.01, timeout_s=0.02)
    assert offered
    offered.clear()
    a.post(1)
    assert b.wait(0, spin_s=0.01, timeout_s=5) == 1 and not offered  # the answer was there: no yield


def test_a_dozing_waiter_is_woken_by_the_word(bells):
    """A doze (the client's sleep until a long execution's reply is due) is a sleep the peer rings:
    a word posted during it is answered at once, not at the doze's end."""
    a, b = bells
    got = []
    t = threading.Thread(target=lambda: got.append(b.wait(0, spin_s=0.0, timeout_s=30, doze_s=30)))
    t.start()
    if doorbell.POLL_MEMORY:  # it says it sleeps before it sleeps
        while not b.waiting[0] and t.is_alive():
            pass
    a.post(1)
    t.join(10)  # well before the doze's 30 s
    assert not t.is_alive() and got == [1]
    assert b.waiting[0] == 0 and b.woken  # the doze was too long: the waiter says so


def test_after_a_doze_the_waiter_polls_a_word_posted_without_a_ring(bells, monkeypatch):
    """The doze ends on its timer; the waiter then polls (no longer "waiting"), so the peer posts
    without ringing and the word is still seen, within the poll, not after a backstop."""
    if not doorbell.POLL_MEMORY:
        pytest.skip("on the socket every message is rung")
    monkeypatch.setattr(doorbell, "BACKSTOP_S", 60.0)  # a missed word would take a minute
    a, b = bells
    dozed = []
    real_sleep = doorbell.Doorbell._sleep

    def sleep(self, last, start, timeout_s, until=None):
        value = real_sleep(self, last, start, timeout_s, until)
        dozed.append(value is doorbell._DOZED)
        return value
    monkeypatch.setattr(doorbell.Doorbell, "_sleep", sleep)
    got = []
    t = threading.Thread(target=lambda: got.append(b.wait(0, spin_s=30, timeout_s=60, doze_s=0.02)))
    t.start()
    while not dozed and t.is_alive():  # the doze is over: the waiter polls now
        pass
    assert b.waiting[0] == 0
    a.post(1)
    assert pending(b.sock) == b""  # not rung: the poller sees the word
    t.join(10)
    assert not t.is_alive() and got == [1] and dozed == [True]
    assert not b.woken  # seen by polling, after the doze


def test_a_doze_sleeps_its_whole_milliseconds_and_polls_the_rest(bells):
    """CPython waits for a socket's timeout in whole milliseconds rounded up (poll()): a 2.5 ms doze
    asked of the socket would sleep 3 ms and more, past a reply due at 2.6 ms, and one of 0.4 ms a
    whole millisecond. So the socket is asked for the doze's whole milliseconds only (a hair under
    each, not to be rounded up to the next), never past its end, and a doze under 1 ms not at all:
    the rest is polled (``wait``)."""
    a, b = bells
    asked = []
    real = b.sock

    class Recording:
        def settimeout(self, t):
            asked.append(t)
            real.settimeout(t)

        def __getattr__(self, name):
            return getattr(real, name)
    b.sock = Recording()
    start = time.perf_counter()
    assert b._sleep(0, start, None, until=start + 0.5e-3) is doorbell._DOZED
    assert asked == []  # under a millisecond: nothing slept on the socket
    start = time.perf_counter()
    assert b._sleep(0, start, None, until=start + 2.5e-3) is doorbell._DOZED
    whole = [round((t + doorbell.DOZE_UNDER_S) * 1e3) for t in asked]
    assert asked and all(t == pytest.approx(k * 1e-3 - doorbell.DOZE_UNDER_S, abs=1e-12) for t, k in zip(asked, whole))
    assert all(1 <= k <= 2 for k in whole)  # never past the doze's end at 2.5 ms
    a.post(1)
    assert b.wait(0, spin_s=0.0, timeout_s=10, doze_s=0.5e-3) == 1


def test_a_doze_counts_against_the_bound(bells):
    a, b = bells
    with pytest.raises(TimeoutError):
        b.wait(0, spin_s=0.001, timeout_s=0.05, doze_s=10)
    assert b.waiting[0] == 0
