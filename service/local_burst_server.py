"""The service half of the shared-memory burst (wire format: ``service.burst_wire``).

One thread per burst owns the socket and the memfd; it decodes each request from the slots and
executes it on the prepared model (``service.execution``), nothing more. A request laid out
exactly like the last one that succeeded runs on the model bound to the slots
(``PreparedModel.bind``): no re-validation, inputs read in place, outputs written into their
slots once (or computed straight into them).
"""
from __future__ import annotations

import fcntl
import hmac
import logging
import mmap
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time

import numpy as np

from hal.backends import compute_threads, host_memory
from hal.errors import HalError
from hal.model import DataLocation, Request, RequestArgument
from hal.types import ErrorStatus
from service import burst_wire as wire
from service.doorbell import Doorbell
from service.execution import BoundExecution, ExecutionResult, PreparedModel, deadline_from_timeout

log = logging.getLogger("nnhal.service")

ACCEPT_TIMEOUT_S = 10.0
#: The service polls its doorbell this long after a reply when the burst is invoked back to back
#: (its next request usually follows at once; see ``_LastServed``): a blocking wake-up is a
#: scheduler round trip, a poll of the posted word (``service.doorbell``) a memory read.
SERVICE_SPIN_S = 200e-6
#: After a longer execution, for this fraction of it (at most SERVICE_SPIN_MAX_S): the client's
#: turn between two invokes grows with the model (TFLite's input copies; its wake-up when the
#: reply came during its doze), and a request that finds the service asleep pays a socket byte
#: and the service's wake-up. MobileNetV2 int8 through the delegate, 2 cores: 52 of 300 requests
#: found it asleep after 200 us of polling.
SERVICE_SPIN_FRACTION = 0.25
SERVICE_SPIN_MAX_S = 2e-3


def spin_after(served_s: float) -> float:
    """How long to poll for the next request after serving one in ``served_s`` (back to back)."""
    return max(SERVICE_SPIN_S, min(SERVICE_SPIN_MAX_S, SERVICE_SPIN_FRACTION * served_s))


class _LastServed:
    """Which local burst of this process served the latest request.

    Why: a burst's thread that polls for its next request holds the GIL while it polls, and every
    burst of the process shares that GIL. When a model's partitions take turns (TFLite runs
    partition 0, a CPU node, partition 1, ...) or two clients execute at once, the burst that just
    replied would poll while the next request, to another burst, waits for the GIL. Measured on 2
    cores through the delegate, a model of 4 partitions (runs of ADDs split by COS): 916 us per
    invoke with every burst polling, 357 us with none, 228-322 us with this rule; a loop over a
    one-partition model: 56-60 us with it, as with polling always, 97 us with none. So a burst
    polls only while it is invoked back to back (the latest request before its own was its own);
    otherwise it blocks, paying one wake-up instead of stalling another burst.

    It also knows whose request came before (the client session owning the burst): two clients
    taking turns is what REPLY_SHARED tells them."""

    token: bytes = b""  # the burst's auth token: unique, and holds nothing of the burst alive
    client: str = ""

    @classmethod
    def took_turn(cls, burst: "LocalBurstServer") -> tuple[bool, bool]:
        """Record ``burst`` as serving now: (it also served the request before, the request before
        was another client's)."""
        again, shared = cls.token == burst.token, cls.client != burst.client
        cls.token, cls.client = burst.token, burst.client
        return again, shared


class LocalBurstServer:
    """One client's local burst: a thread that owns the socket, the memfd and the serving loop."""

    def __init__(self, model: PreparedModel, slot_bytes: int, parent_dir: str | None = None, client: str = ""):
        if not 0 < slot_bytes <= wire.MAX_SLOT_BYTES:
            raise HalError(ErrorStatus.INVALID_ARGUMENT,
                           f"slot_bytes must be in (0, {wire.MAX_SLOT_BYTES}], got {slot_bytes}")
        n_in, n_out = len(model.compiled.input_indexes), len(model.compiled.output_indexes)
        if not wire.fits(n_in, n_out):
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"{n_in} inputs / {n_out} outputs do not fit a local burst")
        self.model = model
        self.client = client  # the owning session's id: whose turn it is (_LastServed)
        self.shared = False   # REPLY_SHARED for the request being served
        self.size = wire.DATA_OFFSET + slot_bytes
        self.token = secrets.token_bytes(16)
        self.dir = tempfile.mkdtemp(prefix="nnhal-burst-", dir=parent_dir)  # 0700
        self.path = os.path.join(self.dir, "burst.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        os.chmod(self.path, 0o600)
        self.listener.listen(1)
        self.listener.settimeout(ACCEPT_TIMEOUT_S)
        self.conn: socket.socket | None = None
        #: The model bound to the slots of the last successful request's layout, and that layout.
        self._bound: BoundExecution | None = None
        self._bound_layout = b""
        self._bound_shapes = b""  # its output shape records, packed
        #: That request's bytes (``burst_wire.request_key``), and what a request equal to it but for
        #: its number runs without decoding its header: (the bound model, the timeout, the loop
        #: timeout, whether timed); None until a request has bound the model.
        self._bound_request: tuple[bytes, bytes, int] = (b"", b"", 0)
        self._steady: tuple[BoundExecution, int, int, bool] | None = None
        #: The output shape records the reply area holds (the very bytes object written), if any.
        self._shapes_written: bytes | None = None
        #: The doorbell and the number the request being served is answered with; None once posted.
        self._posting: tuple[Doorbell, int] | None = None
        #: The slots' view and the sequence number of the steady request being served (``_posted_early``).
        self._early: tuple[memoryview, int] | None = None
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._run, name="nnhal-local-burst", daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop serving (service shutdown): wakes the thread blocked on the doorbell."""
        self.closed.set()
        for s in (self.conn, self.listener):
            if s is not None:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _run(self) -> None:
        fd, mem, view, data, bell, pinned = -1, None, None, None, None, None
        try:
            conn, _ = self.listener.accept()
            self.conn = conn
            conn.settimeout(ACCEPT_TIMEOUT_S)
            if not hmac.compare_digest(wire.recv_exact(conn, len(self.token)), self.token):
                log.warning("local burst: bad auth token, closing")
                return
            conn.settimeout(None)
            fd = os.memfd_create("nnhal-burst", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, self.size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            mem = mmap.mmap(fd, self.size)
            pinned = host_memory.pin(mem)  # a device backend's copies read and write the slots in place
            socket.send_fds(conn, [wire.HANDSHAKE.pack(self.size, compute_threads())], [fd])
            view = memoryview(mem)
            data = view[wire.DATA_OFFSET:]
            conn.setblocking(False)
            bell = Doorbell(conn, view, wire.REPLY_POSTED, wire.SERVICE_WAITING, wire.REQUEST_POSTED,
                            wire.CLIENT_WAITING)
            spin_s, served = 0.0, 0
            while not self.closed.is_set():
                posted = bell.wait(served, spin_s)
                if posted is None:
                    break  # the client closed (or died)
                again, self.shared = _LastServed.took_turn(self)
                received = time.monotonic_ns()
                self._posting = (bell, posted)
                self._serve_one(view, data, received)
                if self._posting is not None:
                    bell.post(posted)  # after the reply: the client reads it once it sees this
                spin_s = spin_after((time.monotonic_ns() - received) * 1e-9) if again else 0.0
                served = posted
        except (OSError, socket.timeout) as e:  # e.g. a client that gave up while we were stopped
            if not self.closed.is_set():
                log.info("local burst ended: %s", e)
        finally:
            self._bound = self._steady = self._early = None  # drop views into the mapping before releasing it
            if pinned is not None:
                pinned.release()  # nothing runs on this burst's slots any more
            if bell is not None:
                bell.release()
            for v in (data, view):
                if v is not None:
                    v.release()
            for s in (self.conn, self.listener):
                if s is not None:
                    s.close()
            if mem is not None:
                try:
                    mem.close()
                except BufferError:  # a view still lives (an execution's array): unmapped with it
                    log.info("local burst: mapping still referenced; released later")
            if fd >= 0:
                os.close(fd)
            shutil.rmtree(self.dir, ignore_errors=True)
            self.closed.set()

    def _serve_one(self, view: memoryview, data: memoryview, received: int) -> None:
        seq = 0
        try:
            steady = self._steady
            if steady is not None:  # the request the model is bound to, but for its number?
                again = wire.same_request(view, self._bound_request)
                if again is not None:
                    seq = again
                    bound, timeout_ns, loop_timeout_ns, measure = steady
                    early = None if measure or self._shapes_written is not self._bound_shapes else self._posted_early
                    self._early = (view, seq)
                    result = bound(deadline_from_timeout(timeout_ns, received), received, loop_timeout_ns, measure,
                                   early)
                    if self._posting is not None:  # not replied yet
                        self._reply(view, seq, result, measure, self._bound_shapes)
                    return
            self._steady = None
            header = wire.read_request(view)
            seq = header.seq
            deadline = deadline_from_timeout(header.timeout_ns, received)
            if self._bound is not None and header.layout == self._bound_layout:
                result = self._bound(deadline, received, header.loop_timeout_ns, header.measure)
                shapes = self._bound_shapes
            else:
                self._bound = None
                result = self._execute(header, data, deadline, received)
                shapes = wire.pack_shapes(result.output_shapes)
            if self._bound is not None:  # what a request equal to this one but for its number runs
                self._bound_request = wire.request_key(view, header)
                self._steady = (self._bound, header.timeout_ns, header.loop_timeout_ns, header.measure)
            self._reply(view, seq, result, header.measure, shapes)
        except HalError as e:
            self._fail(view, seq, e.status, e.message, getattr(e, "output_shapes", None) or [])
        except Exception as e:  # noqa: BLE001 - never let a request kill the burst thread
            log.exception("local burst: internal error")
            self._fail(view, seq, ErrorStatus.GENERAL_FAILURE, f"internal error: {e!r}", [])

    def _posted_early(self) -> None:
        """A steady request's reply (a success, no timing, the shapes already in place), written and
        posted as soon as its outputs are valid (``BoundExecution``'s ``done``)."""
        view, seq = self._early
        wire.write_success(view, seq, -1, -1, self.shared)
        bell, posted = self._posting
        try:
            bell.post(posted)
        except OSError:  # the client is gone: left to the serving loop, whose post ends the burst
            return
        self._posting = None

    def _reply(self, view: memoryview, seq: int, result: ExecutionResult, measure: bool, shapes: bytes) -> None:
        t_dev, t_drv = (result.time_on_device_ns, result.time_in_driver_ns) if measure else (-1, -1)
        if shapes is self._shapes_written:  # a bound model's every reply after its first
            wire.write_success(view, seq, t_dev, t_drv, self.shared)
        else:
            wire.write_reply(view, seq, ErrorStatus.NONE, "", shapes, t_dev, t_drv, self.shared)
            self._shapes_written = shapes

    def _execute(self, header: wire.RequestHeader, data: memoryview, deadline, received) -> ExecutionResult:
        """A request of a new layout: validated and executed as any request, then the model is bound
        to its slots for the requests laid out like it."""
        ins, outs = wire.read_descriptors(header)
        request = Request(inputs=[RequestArgument(False, DataLocation(0, off, n), dims) for dims, off, n in ins],
                          outputs=[RequestArgument(False, DataLocation(0, off, cap), ()) for off, cap in outs],
                          pools=[data])
        result = self.model.execute(request, deadline, received, header.loop_timeout_ns)
        self._bound = self._bind(ins, outs, data)
        self._bound_layout = header.layout if self._bound is not None else b""
        self._bound_shapes = wire.pack_shapes(self._bound.shapes) if self._bound is not None else b""
        return result

    def _bind(self, ins, outs, data: memoryview) -> BoundExecution | None:
        slots = self.model.output_slots()
        if slots is None:
            return None  # output shapes depend on the inputs: each request is validated
        inputs = []
        for k, (dims, off, _) in enumerate(ins):
            info = self.model.compiled.input_info(k)
            dims = dims or info.shape
            count = int(np.prod(dims)) if dims else 1
            inputs.append(np.frombuffer(data, info.dtype, count, off).reshape(dims))
        outputs = []
        for (off, cap), (shape, dtype) in zip(outs, slots):
            count = int(np.prod(shape)) if shape else 1
            if count * dtype.itemsize > cap:
                return None
            outputs.append(np.frombuffer(data, dtype, count, off).reshape(shape))
        try:
            return self.model.bind(inputs, outputs)
        except HalError:
            return None  # e.g. a scalar sent with dimensions: served, but validated each time

    def _fail(self, view: memoryview, seq: int, status, message: str, shapes) -> None:
        self._shapes_written = None
        wire.write_reply(view, seq, status, message, wire.pack_shapes(shapes), -1, -1, self.shared)


__all__ = ["LocalBurstServer", "SERVICE_SPIN_S", "spin_after"]
