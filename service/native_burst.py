"""The local burst's steady round trip as one native function (``service.native_code``).

``steady(frame)`` does what ``LocalBurstChannel.execute_steady`` does: each input copied into
its slot, the request's sequence number written and posted (the service rung on its socket only
if it sleeps: ``service.doorbell``), the reply waited for as the wait strategy would (a long
execution's doze slept on the clock, a signal ending it as PENDING; then polling, offering the
CPU every YIELD_EVERY_S as the doorbell's poll does, for as long as ``spin_s``), then, for a
success whose output shape records are the known bytes, each output copied out of its slot. It
runs without the GIL and touches no Python object: its arguments are the 8-byte words of a
frame (``Frame``), which the channel fills when it arms it.

It answers DONE, or hands the invoke back to Python: NOT_RUN (the frame is not armed: nothing
was sent), PENDING (the request is posted, its reply not seen within the polling: the channel
goes on waiting for it, blocking), OTHER (a reply came that is not a plain success with the
known shapes: the channel decodes it). A DONE records its round trip as ``WaitStrategy.observe``
does (the estimate, the recent replies), and disarms the frame when the strategy would wait
otherwise for the next reply (the estimate crossed SHORT_S either way, a reply came during the
doze, a reply says other clients take turns), so that the next invoke runs the Python path,
which decides again. The doze sleeps on the clock, not on the socket as the Python path's does:
a reply during it waits for the doze's end, and disarms.

Closing: ``Frame.disarm`` clears ARMED and then waits while BUSY is set; ``steady`` sets BUSY
and then reads ARMED (Dekker's order, fenced on both sides): a channel is never unmapped under
a native round trip, and one started after the disarm sends nothing.
"""
from __future__ import annotations

import math
import threading
import time

import numpy as np

from service import burst_wire as wire
from service import native_code
from service.doorbell import YIELD_EVERY_S, fence

#: ``steady``'s answers.
DONE, NOT_RUN, PENDING, OTHER = 0, 1, 2, 3
NAME = "nnhal_burst_steady"
#: The frame's words.
(ARMED, BUSY, SEQ, N_IN, INS, N_OUT, OUTS, HEADER_SEQ, POSTED, PEER_WAITING, PEER_POSTED, FD, CLOCK, CLOCK_ID,
 YIELD, SEND, SLEEP, EXPECTED_NS, SPIN_MAX_NS, SHORT_NS, LONG, DOZE_NS, SPIN_NS, REPLY, SHAPES, KNOWN, KNOWN_WORDS,
 POSTED_AT_NS, LAST_NS, SLOWEST_NS, SHARED, WOKEN, RUNS, RECENT) = range(34)
#: RECENT: the last RECENT_WORDS round trips (``WaitStrategy.recent``'s entries), round trip k at
#: RECENT + k % RECENT_WORDS.
RECENT_WORDS = 8
WORDS = RECENT + RECENT_WORDS
TIMER_ABSTIME = 1
#: The polling's margin over twice the expected round trip (``WaitStrategy.spin_s``).
SPIN_EXTRA_NS = 20_000
MSG_DONTWAIT, MSG_NOSIGNAL = 0x40, 0x4000

_LIBC = ("clock_gettime", "sched_yield", "send", "clock_nanosleep")
_lock = threading.Lock()
_address: int | None = None
_failed = False


def steady_address() -> int | None:
    """The compiled ``steady`` (compiled on the first call, once per process); None where native
    code is unavailable (``service.native_code.enabled``) or the C library lacks a function."""
    global _address, _failed
    with _lock:
        if _address is None and not _failed:
            compiled = None
            if native_code.enabled() and all(map(native_code.libc_address, _LIBC)):
                compiled = native_code.compile_ir(_module())
            _failed = compiled is None
            _address = None if compiled is None else compiled.address(NAME)
        return _address


class Frame:
    """One channel's frame: its words, and the copy tables and known shape bytes they point at."""

    def __init__(self, view_address: int, fd: int) -> None:
        self.words = np.zeros(WORDS, np.int64)
        w = self.words
        w[HEADER_SEQ] = view_address + wire.REQ_SEQ_AT
        w[POSTED] = view_address + wire.REQUEST_POSTED
        w[PEER_WAITING] = view_address + wire.SERVICE_WAITING
        w[PEER_POSTED] = view_address + wire.REPLY_POSTED
        w[REPLY] = view_address + wire.REPLY_OFFSET
        w[SHAPES] = view_address + wire.SHAPES_OFFSET
        w[FD] = fd
        w[CLOCK], w[CLOCK_ID] = native_code.libc_address("clock_gettime"), time.CLOCK_MONOTONIC
        w[YIELD], w[SEND] = native_code.libc_address("sched_yield"), native_code.libc_address("send")
        w[SLEEP] = native_code.libc_address("clock_nanosleep")
        self._tables: tuple = ()  # held: the words point into them
        self._tables_of: tuple | None = None  # what they were made of (``arm``'s ins, outs, known)
        self.runs = 0  # RUNS when the channel last looked

    @property
    def address(self) -> int:
        return self.words.ctypes.data

    def arm(self, ins: list[tuple[int, int, int]], outs: list[tuple[int, int, int]], known: bytes, seq: int,
            expected_s: float, spin_max_s: float, short_s: float, doze: tuple[float, float] | None = None) -> None:
        """Arm for requests copying ``ins`` and ``outs`` ((destination, source, bytes) each), whose
        replies' shape records are ``known``, the last request posted being ``seq``. ``doze``: for
        executions expected longer than ``short_s``, (the doze, the polling after it) that the wait
        strategy gives now: kept while armed (a reply within the doze disarms, so that Python
        shortens it); else the polling follows the expected round trip as ``WaitStrategy.spin_s``."""
        w = self.words
        if (ins, outs, known) != self._tables_of:  # else the tables of the last arm are these
            tables = [np.array([v for t in ins for v in t] or [0], np.int64),
                      np.array([v for t in outs for v in t] or [0], np.int64),
                      np.frombuffer(known + b"\0" * (-len(known) % 8) or b"\0" * 8, np.int64).copy()]
            self._tables, self._tables_of = tuple(tables), (ins, outs, known)
            w[N_IN], w[INS] = len(ins), tables[0].ctypes.data
            w[N_OUT], w[OUTS] = len(outs), tables[1].ctypes.data
            w[KNOWN], w[KNOWN_WORDS] = tables[2].ctypes.data, math.ceil(len(known) / 8)
        w[SEQ] = seq
        w[EXPECTED_NS] = max(1, round(expected_s * 1e9))
        w[SPIN_MAX_NS], w[SHORT_NS] = round(spin_max_s * 1e9), round(short_s * 1e9)
        w[LONG] = doze is not None
        w[DOZE_NS], w[SPIN_NS] = (0, 0) if doze is None else (round(doze[0] * 1e9), round(doze[1] * 1e9))
        w[SHARED] = w[WOKEN] = 0
        w[ARMED] = 1

    def disarm(self) -> None:
        """No native round trip runs after this returns: one under way (on another thread) is
        waited for, its wait bounded by its doze and the polling after it."""
        w = self.words
        w[ARMED] = 0
        fence()
        while w[BUSY]:
            time.sleep(0)


def _module():
    """The IR module defining ``i32 steady(i64* frame)``."""
    from llvmlite import ir

    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    c64 = lambda v: ir.Constant(i64, v)  # noqa: E731
    module = ir.Module("nnhal_native_burst")
    fn = ir.Function(module, ir.FunctionType(i32, [i64.as_pointer()]), NAME)
    frame = fn.args[0]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    memcpy = module.declare_intrinsic("llvm.memcpy", [i8.as_pointer(), i8.as_pointer(), i64])

    def at(k):
        return b.gep(frame, [c64(k)])

    def word(k):
        return b.load(at(k), align=8)

    def as_ptr(value, ty=i64):
        return b.inttoptr(value, ty.as_pointer())

    def block(name):
        return fn.append_basic_block(name)

    clock_type = ir.FunctionType(i32, [i32, i64.as_pointer()])
    timespec = b.alloca(i64, 2)

    def now():
        b.call(as_ptr(word(CLOCK), clock_type), [b.trunc(word(CLOCK_ID), i32), timespec])
        return b.add(b.mul(b.load(timespec), c64(1_000_000_000)), b.load(b.gep(timespec, [c64(1)])))

    def leave(code):
        b.store_atomic(c64(0), at(BUSY), "release", 8)
        b.ret(ir.Constant(i32, code))

    def copies(count, table, name):
        """memcpy(dst, src, n) for each of ``count`` triples at ``table``."""
        head, body, done = block(name), block(name + "_copy"), block(name + "_done")
        k = b.alloca(i64)
        b.store(c64(0), k)
        b.branch(head)
        b.position_at_end(head)
        j = b.load(k)
        b.cbranch(b.icmp_signed("<", j, count), body, done)
        b.position_at_end(body)
        base = b.mul(j, c64(3))
        dst, src, n = (b.load(b.gep(table, [b.add(base, c64(i))])) for i in range(3))
        b.call(memcpy, [b.inttoptr(dst, i8.as_pointer()), b.inttoptr(src, i8.as_pointer()), n,
                        ir.Constant(ir.IntType(1), 0)])
        b.store(b.add(j, c64(1)), k)
        b.branch(head)
        b.position_at_end(done)

    # Announce the round trip, then look at ARMED (a disarm waits for BUSY to clear).
    b.store_atomic(c64(1), at(BUSY), "seq_cst", 8)
    b.fence("seq_cst")
    armed, idle = block("armed"), block("idle")
    b.cbranch(b.icmp_signed("!=", b.load_atomic(at(ARMED), "seq_cst", 8), c64(0)), armed, idle)
    b.position_at_end(idle)
    leave(NOT_RUN)

    b.position_at_end(armed)
    copies(word(N_IN), as_ptr(word(INS)), "inputs")
    seq = b.add(word(SEQ), c64(1))
    b.store(seq, at(SEQ))
    b.store(seq, as_ptr(word(HEADER_SEQ)), align=8)
    start = now()
    b.store(start, at(POSTED_AT_NS))
    b.store_atomic(seq, as_ptr(word(POSTED)), "release", 8)  # after the slots and the header
    b.fence("seq_cst")
    ring, polling = block("ring"), block("polling")
    b.cbranch(b.icmp_signed("!=", b.load_atomic(as_ptr(word(PEER_WAITING)), "seq_cst", 8), c64(0)), ring, polling)
    b.position_at_end(ring)  # the service sleeps on its socket: one byte wakes it
    one = b.alloca(i8)
    b.store(ir.Constant(i8, 1), one)
    send_type = ir.FunctionType(i64, [i32, i8.as_pointer(), i64, i32])
    b.call(as_ptr(word(SEND), send_type), [b.trunc(word(FD), i32), one, c64(1),
                                           ir.Constant(i32, MSG_DONTWAIT | MSG_NOSIGNAL)])
    b.branch(polling)  # a failed send: the service's backstop looks again, or the Python wait finds it gone

    b.position_at_end(polling)
    peer = as_ptr(word(PEER_POSTED))
    last = b.sub(seq, c64(1))
    doze = word(DOZE_NS)
    b.store(c64(0), at(WOKEN))
    sleep, awake = block("sleep"), block("awake")
    b.cbranch(b.icmp_signed(">", doze, c64(0)), sleep, awake)
    b.position_at_end(sleep)  # until the doze's end (an interrupted sleep polls longer, nothing else)
    until = b.add(start, doze)
    b.store(b.sdiv(until, c64(1_000_000_000)), timespec)
    b.store(b.srem(until, c64(1_000_000_000)), b.gep(timespec, [c64(1)]))
    sleep_type = ir.FunctionType(i32, [i32, i32, i64.as_pointer(), i64.as_pointer()])
    slept = b.call(as_ptr(word(SLEEP), sleep_type), [b.trunc(word(CLOCK_ID), i32), ir.Constant(i32, TIMER_ABSTIME),
                                                      timespec, ir.Constant(i64.as_pointer(), None)])
    # A signal cut the sleep short (Ctrl-C: Python's handler has run): the invoke goes to Python,
    # which waits interruptibly, instead of polling out the rest of the doze.
    interrupted, rested = block("interrupted"), block("rested")
    b.cbranch(b.icmp_signed("!=", slept, ir.Constant(i32, 0)), interrupted, rested)
    b.position_at_end(interrupted)
    leave(PENDING)
    b.position_at_end(rested)
    came = b.icmp_signed("!=", b.load_atomic(peer, "acquire", 8), last)  # during the doze: it was too long
    b.store(b.zext(came, i64), at(WOKEN))
    b.branch(awake)
    b.position_at_end(awake)
    expected = word(EXPECTED_NS)
    spin = b.add(b.mul(expected, c64(2)), c64(SPIN_EXTRA_NS))
    spin_max = word(SPIN_MAX_NS)
    spin = b.select(b.icmp_signed("<", spin, spin_max), spin, spin_max)
    spin = b.select(b.icmp_signed("!=", word(LONG), c64(0)), word(SPIN_NS), spin)
    end = b.add(b.add(start, doze), spin)
    offer_at = b.alloca(i64)
    b.store(start, offer_at)
    poll, check, maybe, offer, got, pending = (block(s) for s in ("poll", "check", "maybe", "offer", "got", "pending"))
    b.branch(poll)
    b.position_at_end(poll)
    value = b.load_atomic(peer, "acquire", 8)
    b.cbranch(b.icmp_signed("!=", value, last), got, check)
    b.position_at_end(check)
    t = now()
    b.cbranch(b.icmp_signed(">=", t, end), pending, maybe)
    b.position_at_end(maybe)
    b.cbranch(b.icmp_signed(">=", t, b.load(offer_at)), offer, poll)
    b.position_at_end(offer)
    b.call(as_ptr(word(YIELD), ir.FunctionType(i32, [])), [])
    b.store(b.add(t, c64(round(YIELD_EVERY_S * 1e9))), offer_at)
    b.branch(poll)
    b.position_at_end(pending)
    leave(PENDING)

    b.position_at_end(got)
    seen = now()
    other, ours, status_ok = block("other"), block("ours"), block("status_ok")
    b.cbranch(b.icmp_signed("==", value, seq), ours, other)
    b.position_at_end(other)
    leave(OTHER)
    b.position_at_end(ours)
    reply = word(REPLY)
    status = b.load(b.inttoptr(b.add(reply, c64(wire.REP_STATUS_AT)), i32.as_pointer()))
    b.cbranch(b.icmp_signed("==", status, ir.Constant(i32, 0)), status_ok, other)
    # the shape records: the known bytes, word by word
    b.position_at_end(status_ok)
    shapes, known, n_known = as_ptr(word(SHAPES)), as_ptr(word(KNOWN)), word(KNOWN_WORDS)
    k = b.alloca(i64)
    b.store(c64(0), k)
    cmp_head, cmp_body, cmp_next, success = block("cmp"), block("cmp_body"), block("cmp_next"), block("success")
    b.branch(cmp_head)
    b.position_at_end(cmp_head)
    j = b.load(k)
    b.cbranch(b.icmp_signed("<", j, n_known), cmp_body, success)
    b.position_at_end(cmp_body)
    same = b.icmp_unsigned("==", b.load(b.gep(shapes, [j]), align=8), b.load(b.gep(known, [j]), align=8))
    b.cbranch(same, cmp_next, other)
    b.position_at_end(cmp_next)
    b.store(b.add(j, c64(1)), k)
    b.branch(cmp_head)

    b.position_at_end(success)
    copies(word(N_OUT), as_ptr(word(OUTS)), "outputs")
    took = b.sub(seen, start)
    expected = word(EXPECTED_NS)  # 0.8 of the last estimate, 0.2 of this round trip
    expected = b.sdiv(b.add(b.mul(expected, c64(4)), took), c64(5))
    b.store(expected, at(EXPECTED_NS))
    b.store(took, at(LAST_NS))
    slowest = word(SLOWEST_NS)
    b.store(b.select(b.icmp_signed(">", took, slowest), took, slowest), at(SLOWEST_NS))
    # WaitStrategy.observe: a reply that came during the doze is recorded as due by the doze's end
    woken = b.icmp_signed("!=", word(WOKEN), c64(0))
    runs = word(RUNS)
    b.store(b.select(woken, word(DOZE_NS), took), b.gep(frame, [b.add(b.srem(runs, c64(RECENT_WORDS)), c64(RECENT))]))
    b.store(b.add(runs, c64(1)), at(RUNS))
    flags = b.load(b.inttoptr(b.add(reply, c64(wire.REP_FLAGS_AT)), i32.as_pointer()))
    shared = b.icmp_unsigned("!=", b.and_(flags, ir.Constant(i32, wire.REPLY_SHARED)), ir.Constant(i32, 0))
    # the strategy's kind of wait changes (a doze, or none) when the estimate crosses SHORT_NS
    crossed = b.icmp_unsigned("!=", b.zext(b.icmp_signed(">", expected, word(SHORT_NS)), i64), word(LONG))
    stop, done = block("stop"), block("done")
    b.store(b.zext(shared, i64), at(SHARED))
    b.cbranch(b.or_(b.or_(shared, crossed), woken), stop, done)
    b.position_at_end(stop)  # the strategy would wait otherwise for the next one: Python does
    b.store_atomic(c64(0), at(ARMED), "seq_cst", 8)
    b.branch(done)
    b.position_at_end(done)
    leave(DONE)
    return module

__all__ = ["DONE", "Frame", "NOT_RUN", "OTHER", "PENDING", "steady_address"]
