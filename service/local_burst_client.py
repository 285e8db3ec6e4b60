"""The client half of the shared-memory burst (wire format: ``service.burst_wire``).

Each input is copied once into its slot; each output is copied once out of its slot, into the
caller's array when one is given (the delegate gives TFLite's output tensors). A steady round
trip can be armed to run as native code (``arm_native``, ``service.native_burst``), which hands
back to ``resume_native`` whatever it does not finish.
"""
from __future__ import annotations

import collections
import math
import mmap
import operator
import os
import socket
import struct
import threading
import time

import numpy as np

from service import burst_wire as wire
from service import native_burst
from service.doorbell import Doorbell
from service.slots import SlotLayout

#: Inputs up to this size are written into their slots as bytes, larger ones by numpy.
SMALL_COPY_BYTES = 4096

#: The client never polls longer than this. Executions expected to take longer than SHORT_S are
#: slept through (a polling client would hold a core all along) until a lead before their reply is
#: due, then polled for: a blocked client's wake-up on the reply cost 0.17-0.24 ms of MobileNetV2
#: int8's 3.5 ms on a 2-vCPU virtual machine (its halted vCPU woken), a timer's wake-up lands
#: before the reply instead.
CLIENT_SPIN_MAX_S = 2e-3
SHORT_S = 1e-3
#: A doze ends POLL_MARGIN_S plus DOZE_SPREAD of the execution before the earliest reply the last
#: few executions predict (``WaitStrategy.doze_s``): the wake-up's own delay, and the spread of an
#: execution's time from one invoke to the next (on a 2-vCPU virtual machine each vCPU ran 25-30%
#: slower for spells of a fraction of a second to seconds); at most half CLIENT_SPIN_MAX_S, so
#: that the polling after it reaches past the predicted reply.
POLL_MARGIN_S = 0.2e-3
DOZE_SPREAD = 0.1
#: The executions a doze is predicted from.
RECENT = 8
_SHAPE = operator.attrgetter("shape")
#: struct ucred, SO_PEERCRED's answer: pid, uid, gid.
PEERCRED = struct.Struct("3i")


class WaitStrategy:
    """How long the client polls for the reply before blocking, fitted to the machine and the model.

    Polling answers sooner than a blocking wake-up (a 1-op model through the delegate, client and
    service pinned to different cores of 2: 15 us per invoke polling, 41 us blocking), but holds
    a core. So: never when the service's compute threads leave no core free (polling would slow
    the execution it waits for); for executions expected to be long (> SHORT_S), only from
    shortly before the reply is due (``doze_s``: slept through until a lead before the earliest
    reply of the last RECENT executions; a reply that came during the doze counts as due by the
    doze's end, so a doze that was too long is followed by a shorter one) for at most twice that
    lead and a tenth of the expected time; else for about twice the expected time (a moving
    average of this burst's round trips), so a short execution is caught while polling and a
    stalled one costs at most
    CLIENT_SPIN_MAX_S. And not while the service says other clients take turns with this one
    (REPLY_SHARED on the last reply): on 2 cores, two clients looping a 1-op model took 267 us
    per invoke each polling, 107-127 us blocking; one client alone, 35 us polling, 48 us blocking.

    A core is free when the client may run on a CPU the service may not (its compute threads never
    need the client's core), or when client and service have one CPU between them: the poller
    offers that CPU at every poll (``service.doorbell``), so the service runs whenever it has work,
    and a blocking wait would add two wake-ups to each round trip. ``client_cpus``,
    ``service_cpus``: the CPUs each may run on (None: the client's own affinity; the service's
    unknown); ``cores``: how many CPUs the two share out (default: their union's size)."""

    def __init__(self, service_threads: int, cores: int | None = None, client_cpus: set[int] | None = None,
                 service_cpus: set[int] | None = None):
        if client_cpus is None:
            client_cpus = cpus_of(0) or set()
        known = service_cpus is not None and bool(client_cpus)
        if cores is None:
            cores = len(client_cpus | service_cpus) if known else len(client_cpus) or (os.cpu_count() or 1)
        # the client's own thread polls; the service's threads compute (0: every core)
        self.core_free = ((service_threads > 0 and cores > service_threads)
                          or (known and (not client_cpus & service_cpus or cores == 1)))
        self.expected_s: float | None = None
        #: The last executions' replies: each round trip, or for a reply that came during a doze
        #: (the round trip then includes the client's wake-up) the doze's length, which it came
        #: within. A doze is predicted from the earliest: the next execution may be as fast as
        #: the fastest of them, not as one fitted to the latest alone, which on a machine whose
        #: speed changes from one spell to the next ends after the reply every other time.
        self.recent: collections.deque[float] = collections.deque(maxlen=RECENT)
        #: The last doze (``doze_s``); None: the last wait had none.
        self.doze: float | None = None
        self.shared = False  # the last reply's REPLY_SHARED

    @staticmethod
    def lead_s(due_s: float) -> float:
        """How long before a reply due after ``due_s`` a doze ends."""
        return min(POLL_MARGIN_S + DOZE_SPREAD * due_s, CLIENT_SPIN_MAX_S / 2)

    def spin_s(self) -> float:
        """How long to poll (after ``doze_s``) before blocking."""
        if not self.core_free or self.shared:
            return 0.0
        if self.expected_s is None:
            return SHORT_S  # the first execution: no estimate yet
        if self.expected_s > SHORT_S:
            return min(CLIENT_SPIN_MAX_S, 2 * self.lead_s(self.expected_s) + 0.1 * self.expected_s)
        return min(CLIENT_SPIN_MAX_S, 2 * self.expected_s + 20e-6)

    def doze_s(self) -> float:
        """How long to sleep before polling, for a long execution: until ``lead_s`` before the
        earliest of the recent replies."""
        if not self.core_free or self.shared or self.expected_s is None or self.expected_s <= SHORT_S:
            self.doze = None
            return 0.0
        due = min(self.recent)
        self.doze = max(0.0, due - self.lead_s(due))
        return self.doze

    def observe(self, seconds: float, woken: bool = False) -> None:
        """A round trip of ``seconds``; ``woken``: its reply came during the doze."""
        self.recent.append(self.doze if woken and self.doze is not None else seconds)
        e = self.expected_s
        self.expected_s = seconds if e is None else 0.8 * e + 0.2 * seconds


class LocalBurstChannel:
    """The client's end of one local burst: write inputs into their slots, ring, wait, read outputs.

    ``layout``: the slots of the inputs then the outputs (``service.slots``), sized for the model's
    tensors; ``out_dtypes``: each output's numpy dtype."""

    def __init__(self, socket_path: str, token: bytes, layout: SlotLayout, n_inputs: int, out_dtypes,
                 timeout_s: float = 10.0):
        self.layout, self.n_inputs = layout, n_inputs
        self.out_dtypes = [np.dtype(d) for d in out_dtypes]
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        self.sock.connect(socket_path)
        self.sock.sendall(token)
        msg, fds, _, _ = socket.recv_fds(self.sock, wire.HANDSHAKE.size, 1)
        if len(msg) != wire.HANDSHAKE.size or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            self.sock.close()
            raise OSError("local burst: the service did not send its memory")
        self.sock.setblocking(False)
        size, service_threads = wire.HANDSHAKE.unpack(msg)
        if size < wire.DATA_OFFSET + layout.total:
            os.close(fds[0])
            self.sock.close()
            raise OSError(f"local burst: the service's memory ({size} bytes) is smaller than the slots need")
        self.wait = WaitStrategy(service_threads, service_cpus=cpus_of(_peer_pid(self.sock)))
        self.fd = fds[0]
        self.mem = mmap.mmap(self.fd, size)
        self.view = memoryview(self.mem)
        self.bell = Doorbell(self.sock, self.view, wire.REQUEST_POSTED, wire.CLIENT_WAITING, wire.REPLY_POSTED,
                             wire.SERVICE_WAITING)
        self.last_s = 0.0
        #: The native steady round trip's frame (``arm_native``), and the slowest round trip it made.
        self.native: native_burst.Frame | None = None
        self.native_slowest_s = 0.0
        self.seq = 0
        self.lock = threading.Lock()
        self.closed = False
        # What the last execution laid out, reused while it does not change: the input slots'
        # views (and the descriptors written for them), the output shapes and the output slots' views.
        self._outs_desc = [(layout.offsets[k], layout.sizes[k]) for k in range(n_inputs, len(layout.offsets))]
        self._n_outputs = len(self._outs_desc)
        self._inputs_key: list | None = None
        self._in_shapes: list[tuple[int, ...]] = []  # the shapes of _inputs_key
        #: Per input: its slot's first and last byte, and a view of it as the input's array (large
        #: inputs only: small ones are copied as bytes).
        self._in_slots: list[tuple[int, int, np.ndarray | None]] = []
        self._shapes_known: tuple[bytes, list] | None = None
        self._out_views: list[np.ndarray] = []
        #: The arrays last given for the inputs and the outputs, and how each is copied: byte
        #: views of contiguous arrays (a copy between them is one memcpy, no numpy machinery).
        self._in_from: list[np.ndarray] = []
        self._in_bytes: list[memoryview | None] = []
        self._out_to: list[np.ndarray] = []
        self._out_copies: list[tuple] = []

    def execute(self, inputs: list[np.ndarray], outputs: list[np.ndarray] | None = None, measure_timing: bool = False,
                timeout_ns: int = 0, wait_s: float | None = None, loop_timeout_ns: int = 0):
        """Returns (reply, outputs): ``service.burst_wire.Reply`` and, when it succeeded, the outputs
        — the given arrays, written in place (each reshaped to its array: the element counts must
        match), or new ones. Waits for the reply at most ``wait_s``; after that the channel is
        closed (TimeoutError): the service may still answer and write the slots later, so they
        must never be read or written again. ``last_s``: this round trip's time."""
        with self.lock:
            if self.closed:
                raise ConnectionError("local burst: the channel is closed")
            if self.native is not None:
                self._take_native()
            view = self.view
            key = [(a.dtype, a.shape) for a in inputs]
            if key != self._inputs_key:  # new shapes: new descriptors and slot views (cached for the next)
                self._lay_out_inputs(inputs, key)
            if not _same(inputs, self._in_from):  # other arrays than last time: their bytes' views
                self._in_from = list(inputs)
                self._in_bytes = [_bytes_of(a) if a.nbytes <= SMALL_COPY_BYTES else None for a in inputs]
            _write_inputs(view, self._in_slots, inputs, self._in_bytes)
            seq = self.seq = self.seq + 1
            wire.write_header(view, seq, len(inputs), self._n_outputs, measure_timing, timeout_ns, loop_timeout_ns)
            self._round_trip(seq, wait_s)
            return self._finish(wire.read_reply(view, self._n_outputs, self._shapes_known), outputs)

    def execute_steady(self, inputs: list[np.ndarray], outputs: list[np.ndarray], timeout_ns: int, wait_s: float | None,
                       loop_timeout_ns: int):
        """``execute`` untimed, into ``outputs``, for the very arrays (the same objects, the same
        shapes) of the last execution that copied its outputs into them (a delegate's every invoke
        but its first): their slots, byte views and copies are the ones it prepared. None: not that
        case, nothing was sent (``execute`` serves it)."""
        with self.lock:
            if self.closed or not self._laid_out_for(inputs, outputs):
                return None
            if self.native is not None:
                self._take_native()
            view = self.view
            _write_inputs(view, self._in_slots, inputs, self._in_bytes)
            seq = self.seq = self.seq + 1
            wire.write_header(view, seq, len(inputs), self._n_outputs, False, timeout_ns, loop_timeout_ns)
            self._round_trip(seq, wait_s)
            return self._steady_reply(outputs)

    def _laid_out_for(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> bool:
        """Whether the last execution copied its outputs into these very ``outputs`` from these
        very ``inputs``, shaped as then: their slots, byte views and copies are ready."""
        return bool(self._out_copies) and _same(inputs, self._in_from) and _same(outputs, self._out_to) \
            and list(map(_SHAPE, inputs)) == self._in_shapes

    def _steady_reply(self, outputs: list[np.ndarray]):
        """``execute_steady``'s answer once the reply is in: the outputs copied into ``outputs``."""
        reply = wire.read_success(self.view, self._shapes_known)
        if reply is None:  # a failure, or other output shapes
            return self._finish(wire.read_reply(self.view, self._n_outputs, self._shapes_known), outputs)
        self.wait.shared = reply.shared
        for dst, src in self._out_copies:
            dst[:] = src
        return reply, outputs

    def arm_native(self, inputs: list[np.ndarray], outputs: list[np.ndarray], timeout_ns: int,
                   loop_timeout_ns: int) -> tuple[int, int] | None:
        """Arm the native steady round trip (``service.native_burst``) for the next requests with
        these very arrays, as the last ``execute_steady`` (or ``execute``) into ``outputs`` laid
        them out: (its function's address, its frame's address), called as ``fn(frame)``; until
        the channel's next Python call, which disarms it and takes in what it did. It waits as
        the wait strategy would now (a long execution: its doze and polling). None where that
        strategy would not poll for the next reply (``WaitStrategy``: no core free, turns shared,
        no estimate yet), an array is not contiguous plain bytes, or native code is unavailable."""
        with self.lock:
            w = self.wait
            if self.closed or not w.core_free or w.shared or w.expected_s is None \
                    or not self._laid_out_for(inputs, outputs) \
                    or not all(a.flags.c_contiguous for a in inputs) \
                    or not all(o.flags.c_contiguous and o.flags.writeable for o in outputs):
                return None
            fn = native_burst.steady_address()
            if fn is None:
                return None
            base = _address_of(self.mem)
            if self.native is None:
                self.native = native_burst.Frame(base, self.sock.fileno())
            self._take_native()
            wire.write_header(self.view, self.seq, len(inputs), self._n_outputs, False, timeout_ns, loop_timeout_ns)
            ins = [(base + start, a.ctypes.data, a.nbytes) for (start, _, _), a in zip(self._in_slots, inputs)]
            outs = [(o.ctypes.data, v.ctypes.data, o.nbytes) for o, v in zip(outputs, self._out_views)]
            doze = (w.doze_s(), w.spin_s()) if w.expected_s > SHORT_S else None
            self.native.arm(ins, outs, self._shapes_known[0], self.seq, w.expected_s, CLIENT_SPIN_MAX_S, SHORT_S, doze)
            return fn, self.native.address

    def resume_native(self, code: int, outputs: list[np.ndarray], wait_s: float | None):
        """``execute_steady``'s answer for the request a native round trip posted and handed back
        with ``code`` (``service.native_burst``: PENDING, its reply not seen yet: waited for here
        as ``execute`` waits; OTHER: a reply it does not decode); None for NOT_RUN (nothing was
        sent: ``execute`` serves it)."""
        if code == native_burst.NOT_RUN:
            return None
        with self.lock:
            if self.closed:
                raise ConnectionError("local burst: the channel is closed")
            self._take_native()
            seq, words = self.seq, self.native.words
            posted_at = int(words[native_burst.POSTED_AT_NS])
            if code == native_burst.PENDING:
                # the rest of the wait ``_round_trip`` would make since the request was posted: its
                # polling was spent natively, so this blocks (a stalled or dead service: the bound)
                elapsed = (_monotonic_ns() - posted_at) / 1e9
                left = None if wait_s is None else max(0.0, wait_s - elapsed)
                try:
                    posted = self.bell.wait(seq - 1, max(0.0, self.wait.spin_s() - elapsed), left)
                except TimeoutError:
                    self._close()
                    raise
            else:
                posted = int(self.bell.peer_posted[0])
            self._replied(seq, posted, (_monotonic_ns() - posted_at) / 1e9)
            return self._steady_reply(outputs)

    @property
    def native_runs(self) -> int:
        """The round trips the native path made whole (``arm_native``)."""
        return 0 if self.native is None else int(self.native.words[native_burst.RUNS])

    def _take_native(self) -> None:
        """Disarm the native round trip and take in what it did: the sequence numbers it posted,
        and its round trips (the wait strategy's estimate, the last reply's REPLY_SHARED)."""
        frame = self.native
        frame.disarm()
        words = frame.words
        self.seq = max(self.seq, int(words[native_burst.SEQ]))
        runs = int(words[native_burst.RUNS])
        if runs != frame.runs:
            wait = self.wait
            for k in range(max(frame.runs, runs - native_burst.RECENT_WORDS), runs):
                wait.recent.append(words[native_burst.RECENT + k % native_burst.RECENT_WORDS] / 1e9)
            frame.runs = runs
            wait.expected_s = words[native_burst.EXPECTED_NS] / 1e9
            self.last_s = words[native_burst.LAST_NS] / 1e9
            wait.shared = bool(words[native_burst.SHARED])
            self.native_slowest_s = max(self.native_slowest_s, words[native_burst.SLOWEST_NS] / 1e9)

    def _round_trip(self, seq: int, wait_s: float | None) -> None:
        """Post request ``seq`` (its slots and header written) and wait for its reply."""
        t = time.perf_counter()
        try:
            self.bell.post(seq)
            doze = self.wait.doze_s()
            posted = self.bell.wait(seq - 1, self.wait.spin_s(), wait_s, doze)
        except TimeoutError:
            self._close()
            raise
        self._replied(seq, posted, time.perf_counter() - t, woken=doze > 0 and self.bell.woken)

    def _replied(self, seq: int, posted: int | None, seconds: float, woken: bool = False) -> None:
        """Request ``seq``'s wait ended with the service's posted word ``posted`` after ``seconds``."""
        if posted is None:
            raise ConnectionError("local burst: the service closed the connection")
        if posted != seq:
            raise ConnectionError(f"local burst: the service answered request {posted}, not {seq}")
        self.last_s = seconds
        self.wait.observe(seconds, woken)

    def _finish(self, reply: wire.Reply, outputs: list[np.ndarray] | None):
        """``execute``'s answer to ``reply``: the outputs copied out of their slots when it succeeded."""
        self.wait.shared = reply.shared
        if reply.status != 0:
            return reply, None
        if self._shapes_known is None or reply.shapes is not self._shapes_known[1]:
            self._shapes_known = (reply.shapes_raw, reply.shapes)
            self._out_views = [np.frombuffer(self.view, dtype, math.prod(shape), wire.DATA_OFFSET + off).reshape(shape)
                               for dtype, (off, _), shape in zip(self.out_dtypes, self._outs_desc, reply.shapes)]
            self._out_to, self._out_copies = [], []
        if outputs is None:
            return reply, [src.copy() for src in self._out_views]
        if not _same(outputs, self._out_to):  # checked once per set of arrays (the delegate's are TFLite's)
            self._out_copies = _output_copies(self._out_views, outputs)
            self._out_to = list(outputs)
        for dst, src in self._out_copies:
            dst[:] = src  # bytes into bytes, or an array into its array
        return reply, outputs

    def _lay_out_inputs(self, inputs: list[np.ndarray], key: list) -> None:
        """The descriptors and slot views of inputs shaped as ``inputs``."""
        offsets, sizes = self.layout.offsets, self.layout.sizes
        for k, a in enumerate(inputs):
            if a.nbytes > sizes[k]:
                raise ValueError(f"input {k} ({a.nbytes} bytes) does not fit its slot of {sizes[k]} bytes")
        self._inputs_key = None
        slots = []
        for k, a in enumerate(inputs):
            start = wire.DATA_OFFSET + offsets[k]
            as_array = np.frombuffer(self.view, a.dtype, a.size, start).reshape(a.shape) \
                if a.nbytes > SMALL_COPY_BYTES else None
            slots.append((start, start + a.nbytes, as_array))
        self._in_slots = slots
        wire.write_descriptors(self.view, [(a.shape, offsets[k], a.nbytes) for k, a in enumerate(inputs)],
                               self._outs_desc)
        self._inputs_key, self._in_shapes = key, [a.shape for a in inputs]

    def close(self) -> None:
        self._close()  # not under the lock: close never waits for an execution in progress

    def _close(self) -> None:
        if self.closed:
            return  # the fd number may belong to someone else by now
        self.closed = True
        if self.native is not None:
            self.native.disarm()  # no native round trip reads the slots from here on
        self._in_slots, self._out_views, self._inputs_key, self._shapes_known = [], [], None, None
        self._in_from, self._in_bytes, self._out_to, self._out_copies = [], [], [], []
        try:
            self.sock.close()
        finally:
            try:
                self.bell.release()
                self.view.release()
                self.mem.close()
            except BufferError:  # an array still views the slots (a caller's frame): unmapped with it
                pass
            os.close(self.fd)


def cpus_of(pid: int | None) -> set[int] | None:
    """The CPUs process ``pid`` (0: this one) may run on; None where that cannot be known."""
    if pid is None or not hasattr(os, "sched_getaffinity"):
        return None
    try:
        return os.sched_getaffinity(pid)
    except OSError:  # gone, or not ours to ask about
        return None


def _address_of(mem: mmap.mmap) -> int:
    """The address of a mapping's first byte (the view taking it is released on return)."""
    return np.frombuffer(mem, np.uint8, 1).ctypes.data


def _monotonic_ns() -> int:
    """CLOCK_MONOTONIC, the clock the native round trip stamps its requests with."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def _peer_pid(sock: socket.socket) -> int | None:
    """The process at the other end of a unix socket (None: unknown, e.g. in another pid namespace)."""
    try:
        pid = PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size))[0]
    except (OSError, AttributeError):
        return None
    return pid if pid > 0 else None


def _write_inputs(view: memoryview, slots: list, inputs: list[np.ndarray], as_bytes: list) -> None:
    """Each input into its slot (in a function of its own: no loop variable outlives it to hold a
    view of the slots when the channel closes). A small one as its bytes (one memcpy is cheaper
    than numpy's copy machinery), a larger one by numpy, straight into the slot."""
    for (start, end, as_array), a, b in zip(slots, inputs, as_bytes):
        if as_array is not None:
            np.copyto(as_array, a, casting="no")
        elif b is not None:
            view[start:end] = b
        else:
            view[start:end] = a.tobytes()


def _same(arrays: list, before: list) -> bool:
    """Whether ``arrays`` are the very arrays of ``before`` (not equal ones: the same objects)."""
    return len(arrays) == len(before) and all(map(operator.is_, arrays, before))


def _bytes_of(a: np.ndarray) -> memoryview | None:
    """A C-contiguous array's bytes as a view (it sees later writes to the array); else None."""
    return memoryview(a).cast("B") if a.flags.c_contiguous else None


def _output_copies(sources: list[np.ndarray], dests: list[np.ndarray]) -> list[tuple]:
    """(destination, source) per output, copied as ``destination[:] = source``: byte views where
    the destination is contiguous and writable, else the arrays (the source reshaped to it)."""
    copies = []
    for k, (src, dst) in enumerate(zip(sources, dests)):
        if dst.dtype != src.dtype or dst.size != src.size:
            raise ValueError(f"output {k} came back {src.dtype}{list(src.shape)}, the array given for it is "
                             f"{dst.dtype}{list(dst.shape)}")
        b = _bytes_of(dst) if dst.flags.writeable else None
        if b is not None:
            copies.append((b, _bytes_of(src)))
        else:  # sliced as [:], so at least one dimension
            copies.append((dst.reshape(1) if dst.ndim == 0 else dst,
                           src.reshape((1,) if dst.ndim == 0 else dst.shape)))
    return copies


__all__ = ["CLIENT_SPIN_MAX_S", "DOZE_SPREAD", "LocalBurstChannel", "POLL_MARGIN_S", "RECENT", "SHORT_S",
           "WaitStrategy"]
