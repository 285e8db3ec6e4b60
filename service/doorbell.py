"""The shared-memory burst's wake-ups: a posted word in the shared memory, a socket byte only for a
peer that sleeps.

Each side posts a message by writing a sequence number into its own word of the shared page,
after the message itself. A peer that is polling sees the word change; a peer that has gone to
sleep on the socket first says so in its own "waiting" word, and only then is it sent a byte.
That takes the two send() system calls and the failed recv() polls out of a back-to-back round
trip, whose whole cost for a small model is a few such calls' worth.

The protocol is Dekker's: a side stores its word, then loads the other's. x86-64's memory order
(TSO) keeps stores in order and loads in order; the one reordering it allows, a load before an
earlier store, ``fence`` forbids (a lock operation, which is a locked instruction there). Other
architectures order less, so there every message is rung on the socket and the posted word is
read only after the byte arrived (the kernel's socket locks order the memory then). A sleeping
side also wakes once after BACKSTOP_S to look again, so even a lost wake-up costs a delay,
never a hang.
"""
from __future__ import annotations

import math
import os
import platform
import socket
import threading
import time

#: A posted or waiting word's size: each is read and written whole (``word``).
WORD_BYTES = 8
#: Whether a side polls the posted word in memory (x86-64's store order), else the socket.
POLL_MEMORY = platform.machine().lower() in ("x86_64", "amd64")
#: A side that went to sleep looks at the posted word again after this long, once.
BACKSTOP_S = 0.01
#: A side that finds nothing posted offers its CPU (sched_yield) after YIELD_AFTER_S, then every
#: YIELD_EVERY_S while it polls. When the peer is runnable on the same CPU (the scheduler put both
#: there, or both are pinned to it), the peer's answer needs the CPU the poller holds: offered at
#: the first miss, the peer runs at once, instead of after the poller's spin or its time slice.
#: With the peer on another CPU and nothing else waiting, a yield returns at once (one system call).
YIELD_AFTER_S = 0.0
YIELD_EVERY_S = 2e-6
yield_cpu = getattr(os, "sched_yield", lambda: None)
#: CPython waits for a socket's timeout with poll(), in whole milliseconds rounded up: a 0.3 ms
#: timeout sleeps 1 ms and more. A doze therefore sleeps only its whole milliseconds (each timeout
#: this much under them, so that it is not rounded up to the next) and polls the rest.
DOZE_UNDER_S = 1e-6

_fence_lock = threading.Lock()
#: ``_sleep``'s answer when its ``until`` came first.
_DOZED = object()


def word(view: memoryview, at: int) -> memoryview:
    """The 64-bit word at ``at`` (8-aligned) as a one-item view: an item is loaded and stored with
    one aligned 8-byte move, so a reader sees the old value or the new one. (``struct`` will not
    do: pack_into zeroes its bytes before writing them, and unpack_from reads byte by byte.)"""
    return view[at:at + WORD_BYTES].cast("Q")


def fence() -> None:
    """A full memory barrier between this thread's earlier stores and later loads (x86-64: a
    locked instruction in the lock's acquire)."""
    _fence_lock.acquire()
    _fence_lock.release()


class Doorbell:
    """One side's end: ``post`` writes this side's word and wakes the peer if it sleeps; ``wait``
    returns the peer's word once it differs from the last value seen.

    ``sock``: the non-blocking private socket to the peer; ``view``: the shared page; the offsets
    of this side's posted and waiting words and of the peer's."""

    def __init__(self, sock: socket.socket, view: memoryview, posted_at: int, waiting_at: int,
                 peer_posted_at: int, peer_waiting_at: int):
        self.sock = sock
        self.posted, self.waiting = word(view, posted_at), word(view, waiting_at)
        self.peer_posted, self.peer_waiting = word(view, peer_posted_at), word(view, peer_waiting_at)
        self.woken = False  # the last wait with a doze's (``wait``)

    def release(self) -> None:
        """Let go of the shared page (before it is unmapped)."""
        for w in (self.posted, self.waiting, self.peer_posted, self.peer_waiting):
            w.release()

    def post(self, value: int) -> None:
        """Publish ``value`` (written after the message it announces) and wake the peer if it sleeps."""
        self.posted[0] = value
        if POLL_MEMORY:
            fence()
            if not self.peer_waiting[0]:
                return  # the peer is polling: it sees the word
        self.sock.send(b"\x01")

    def wait(self, last: int, spin_s: float, timeout_s: float | None = None, doze_s: float = 0.0) -> int | None:
        """The peer's posted word once it is not ``last``: slept for on the socket up to ``doze_s``
        (woken at once by the peer's word), then polled until ``spin_s`` after the doze's end,
        then slept for again, in all at most ``timeout_s`` (TimeoutError after it; None: no
        bound). None: the peer closed the connection. A doze ends on a timer before the word is
        due, so the wake-up (on a virtual machine, a halted CPU's) is over when it comes, and
        polling sees it at once; it sleeps whole milliseconds (``_sleep``), the rest of it is
        polled. After a wait with a doze: ``woken`` (the word came during the doze: it was too
        long)."""
        peer = self.peer_posted
        clock = time.perf_counter
        start = clock()
        if doze_s > 0:
            self.woken = False
            value = self._sleep(last, start, timeout_s, until=start + doze_s)
            if value is not _DOZED:
                self.woken = True
                return value
        polling = clock()
        end = max(polling, start + doze_s) + spin_s
        offer_at = polling + YIELD_AFTER_S
        if POLL_MEMORY:
            while True:
                value = peer[0]
                if value != last:
                    return value
                now = clock()
                if now >= end:
                    break
                if now >= offer_at:
                    yield_cpu()
                    offer_at = now + YIELD_EVERY_S
        else:
            while True:  # poll the socket: each message is one byte on it
                try:
                    if not self.sock.recv(1):
                        return None
                    value = peer[0]
                    if value != last:
                        return value
                except BlockingIOError:
                    now = clock()
                    if now >= end:
                        break
                    if now >= offer_at:
                        yield_cpu()
                        offer_at = now + YIELD_EVERY_S
        return self._sleep(last, start, timeout_s)

    def _sleep(self, last: int, start: float, timeout_s: float | None, until: float | None = None):
        """The peer's word, slept for on the socket; ``until``: give up then (``_DOZED``)."""
        peer, sock = self.peer_posted, self.sock
        clock = time.perf_counter
        backstop: float | None = None
        if POLL_MEMORY:  # say so before looking a last time: the peer then rings
            self.waiting[0] = 1
            fence()
            backstop = BACKSTOP_S
        try:
            while True:
                if POLL_MEMORY:
                    value = peer[0]
                    if value != last:
                        return value
                now = clock()
                left = None if timeout_s is None else timeout_s - (now - start)
                if left is not None and left <= 0:
                    raise TimeoutError("no answer on the local burst")
                limit = left if backstop is None else backstop if left is None else min(backstop, left)
                if until is not None:
                    whole_ms = math.floor((until - now) * 1e3)
                    if whole_ms < 1:
                        return _DOZED  # what is left of the doze is polled
                    doze = whole_ms * 1e-3 - DOZE_UNDER_S
                    limit = doze if limit is None else min(limit, doze)
                sock.settimeout(limit)
                try:
                    # memory: a byte, or several left by wake-ups the peer did not need in the end
                    got = sock.recv(64 if POLL_MEMORY else 1)
                except TimeoutError:
                    if until is None or clock() < until:
                        backstop = None  # looked once more; from now on the peer rings if it posts
                    continue
                if not got:
                    return None
                if not POLL_MEMORY:
                    value = peer[0]
                    if value != last:
                        return value
        finally:
            if POLL_MEMORY:
                self.waiting[0] = 0
            sock.setblocking(False)


__all__ = ["BACKSTOP_S", "Doorbell", "POLL_MEMORY", "WORD_BYTES", "fence", "word"]
