"""Same-machine burst: NNAPI's fast message queue, in shared memory with a socket doorbell.

gRPC costs ~250-400 µs a round trip in Python; this path costs tens of µs. The
service creates a memfd sealed against shrinking and growing (a client can
never make the service fault on it), passes it over a private unix socket
(SCM_RIGHTS) and then serves requests on a dedicated thread:

    page 0 (HEADER_BYTES): request header, input/output descriptors | reply at REPLY_OFFSET
    DATA_OFFSET...:        tensors; the client writes inputs, the service writes outputs

Each request is one byte on the socket, each reply one byte back. The
client copies each input in once, the kernels read it in place, and each
output is written once into the slots.
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
import struct
import tempfile
import threading
import time

import numpy as np

from hal.backends import compute_threads
from hal.errors import HalError
from hal.executor import OutputShape
from hal.executor import bind as hal_bind
from hal.executor import execute as hal_execute
from hal.model import DataLocation, Request, RequestArgument
from hal.types import ErrorStatus

log = logging.getLogger("nnhal.service")

MAGIC = b"NNHB"
VERSION = 3  # 2: the request carries the loop timeout; 3: the reply carries flags (REPLY_SHARED)
HEADER_BYTES = 4096
REPLY_OFFSET = 2048
DATA_OFFSET = HEADER_BYTES
MAX_DIMS = 8
MAX_SLOT_BYTES = 1 << 30
ACCEPT_TIMEOUT_S = 10.0
#: Spin-then-block doorbell waits. A blocking wake-up costs ~70 µs on a VM vCPU; polling the
#: socket first answers in ~6 µs. The service polls briefly after a reply when the burst is being
#: invoked back to back (its next request usually follows at once; see ``_LastServed``). The
#: client polls only while that pays and costs nobody: see ``WaitStrategy``.
SERVICE_SPIN_S = 200e-6
#: The client never polls longer than this; executions expected to take longer than SHORT_S are
#: waited for blocking (a wake-up is then < 7% of the wait, and a polling client would hold a core).
CLIENT_SPIN_MAX_S = 2e-3
SHORT_S = 1e-3
HANDSHAKE = struct.Struct("<QI")  # slot memory size, the service's compute threads per execution


def wait_doorbell(sock: socket.socket, spin_s: float, timeout_s: float | None = None) -> bytes:
    """One byte from a non-blocking socket: poll for ``spin_s``, then block, in all at most
    ``timeout_s`` (TimeoutError after it; None: no bound, the service waiting for its client)."""
    start = time.perf_counter()
    while True:
        try:
            return sock.recv(1)
        except BlockingIOError:
            if time.perf_counter() - start >= spin_s:
                break
    sock.settimeout(None if timeout_s is None else max(timeout_s - (time.perf_counter() - start), 1e-3))
    try:
        return sock.recv(1)
    finally:
        sock.setblocking(False)

REQ = struct.Struct("<4sIQIIIqq")      # magic, version, seq, n_inputs, n_outputs, measure, timeout_ns,
#                                        loop_timeout_ns (0: NNAPI's default)
IN_DESC = struct.Struct("<I8IQQ")      # rank, dims[8], offset, length
OUT_DESC = struct.Struct("<QQ")        # offset, capacity
REP = struct.Struct("<QiIqqI")         # seq, status, message length, time on device, time in driver, flags
#: Reply flag: the request the service served before this one was another client's. Clients then
#: block for their reply instead of polling (two polling clients and the service's thread would
#: need more cores than a small machine has): see WaitStrategy.
REPLY_SHARED = 1
MSG_OFFSET = REPLY_OFFSET + REP.size
MSG_MAX = 512
SHAPE = struct.Struct("<II8I")         # rank, is_sufficient, dims[8]
SHAPES_OFFSET = MSG_OFFSET + MSG_MAX


def max_io(n_outputs: int) -> int:
    """How many inputs fit in the request page next to n_outputs output descriptors."""
    return (REPLY_OFFSET - REQ.size - n_outputs * OUT_DESC.size) // IN_DESC.size


def fits(n_inputs: int, n_outputs: int) -> bool:
    return (n_inputs <= max_io(n_outputs)
            and SHAPES_OFFSET + n_outputs * SHAPE.size <= HEADER_BYTES)


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
    """One client's local burst: a thread that owns the socket, the memfd and the execution loop."""

    def __init__(self, driver, entry, slot_bytes: int, parent_dir: str | None = None, client: str = ""):
        if not 0 < slot_bytes <= MAX_SLOT_BYTES:
            raise HalError(ErrorStatus.INVALID_ARGUMENT,
                           f"slot_bytes must be in (0, {MAX_SLOT_BYTES}], got {slot_bytes}")
        n_in, n_out = len(entry.compiled.input_indexes), len(entry.compiled.output_indexes)
        if not fits(n_in, n_out):
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"{n_in} inputs / {n_out} outputs do not fit a local burst")
        self.driver, self.entry = driver, entry
        self.client = client  # the owning session's id: whose turn it is (_LastServed)
        self.shared = False   # REPLY_SHARED for the request being served
        self.size = DATA_OFFSET + slot_bytes
        self.token = secrets.token_bytes(16)
        self.dir = tempfile.mkdtemp(prefix="nnhal-burst-", dir=parent_dir)  # 0700
        self.path = os.path.join(self.dir, "burst.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        os.chmod(self.path, 0o600)
        self.listener.listen(1)
        self.listener.settimeout(ACCEPT_TIMEOUT_S)
        self.conn: socket.socket | None = None
        self._fast: _FastLayout | None = None
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
        fd, mem, view, data = -1, None, None, None
        try:
            conn, _ = self.listener.accept()
            self.conn = conn
            conn.settimeout(ACCEPT_TIMEOUT_S)
            if not hmac.compare_digest(_recv_exact(conn, len(self.token)), self.token):
                log.warning("local burst: bad auth token, closing")
                return
            conn.settimeout(None)
            fd = os.memfd_create("nnhal-burst", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, self.size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            mem = mmap.mmap(fd, self.size)
            socket.send_fds(conn, [HANDSHAKE.pack(self.size, compute_threads())], [fd])
            view = memoryview(mem)
            data = view[DATA_OFFSET:]
            conn.setblocking(False)
            spin_s = 0.0
            while not self.closed.is_set():
                if not wait_doorbell(conn, spin_s):
                    break  # the client closed (or died)
                again, self.shared = _LastServed.took_turn(self)
                spin_s = SERVICE_SPIN_S if again else 0.0
                self._serve_one(view, data)
                conn.send(b"\x01")
        except (OSError, socket.timeout) as e:  # e.g. a client that gave up while we were stopped
            if not self.closed.is_set():
                log.info("local burst ended: %s", e)
        finally:
            self._fast = None  # drop views into the mapping before releasing it, however the loop ended
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

    def _serve_one(self, view: memoryview, data: memoryview) -> None:
        received = time.monotonic_ns()
        seq = 0
        try:
            magic, version, seq, n_in, n_out, measure, timeout_ns, loop_ns = REQ.unpack_from(view, 0)
            if magic != MAGIC or version != VERSION:
                raise HalError(ErrorStatus.INVALID_ARGUMENT, f"bad local burst header {magic!r} v{version}")
            if not fits(n_in, n_out):
                raise HalError(ErrorStatus.INVALID_ARGUMENT, f"{n_in} inputs / {n_out} outputs do not fit")
            layout = bytes(view[REQ.size:REQ.size + n_in * IN_DESC.size + n_out * OUT_DESC.size])
            if self._fast is not None and self._fast.layout == layout:
                self._serve_fast(view, seq, measure, timeout_ns, received, loop_ns)
                return
            inputs, pos = [], REQ.size
            for _ in range(n_in):
                rank, *rest = IN_DESC.unpack_from(view, pos)
                pos += IN_DESC.size
                if rank > MAX_DIMS:
                    raise HalError(ErrorStatus.INVALID_ARGUMENT, f"input rank {rank} > {MAX_DIMS}")
                dims, off, length = tuple(rest[:rank]), rest[8], rest[9]
                inputs.append(RequestArgument(False, DataLocation(0, off, length), dims))
            outputs = []
            for _ in range(n_out):
                off, cap = OUT_DESC.unpack_from(view, pos)
                pos += OUT_DESC.size
                outputs.append(RequestArgument(False, DataLocation(0, off, cap), ()))
            deadline = received + timeout_ns if timeout_ns > 0 else None
            request = Request(inputs=inputs, outputs=outputs, pools=[data])
            try:
                result = self.driver.execute(self.entry, request, deadline, received, loop_ns)
                status, msg, shapes = ErrorStatus.NONE, "", result.output_shapes
                t_dev, t_drv = (result.time_on_device_ns, result.time_in_driver_ns) if measure else (-1, -1)
                self._fast = _FastLayout.build(self.entry.compiled, layout, inputs, outputs, data)
            except HalError as e:
                shapes = getattr(e, "output_shapes", None) or []
                status, msg, t_dev, t_drv = e.status, e.message, -1, -1
        except HalError as e:
            status, msg, shapes, t_dev, t_drv = e.status, e.message, [], -1, -1
        except Exception as e:  # noqa: BLE001 - never let a request kill the burst thread
            log.exception("local burst: internal error")
            status, msg, shapes, t_dev, t_drv = ErrorStatus.GENERAL_FAILURE, f"internal error: {e!r}", [], -1, -1
        self._reply(view, seq, status, msg, shapes, t_dev, t_drv)

    def _serve_fast(self, view: memoryview, seq: int, measure: int, timeout_ns: int, received: int,
                    loop_timeout_ns: int = 0) -> None:
        """A request laid out exactly like the last validated one: skip re-validation, reuse the
        numpy views onto the slots (inputs read in place, outputs written once)."""
        fast = self._fast
        deadline = received + timeout_ns if timeout_ns > 0 else None
        timings: list = []
        gate = self.entry.gate
        try:
            if gate is not None:
                gate.acquire()
            try:
                if fast.runner is not None:  # one partition bound to the slots: computes in place
                    fast.runner(timings, deadline)
                else:
                    outs = hal_execute(self.entry.compiled, fast.inputs, timings, deadline, _validated=True,
                                       loop_timeout_ns=loop_timeout_ns or None)
                    for dst, out in zip(fast.outputs, outs):
                        np.copyto(dst, out, casting="no")
            finally:
                if gate is not None:
                    gate.release()
            self.entry.perf.record(timings)
            t_dev = sum(t.ns for t in timings) if measure else -1
            t_drv = time.monotonic_ns() - received if measure else -1
            self._reply(view, seq, ErrorStatus.NONE, "", fast.shapes, t_dev, t_drv)
        except HalError as e:
            self._reply(view, seq, e.status, e.message, [], -1, -1)
        except Exception as e:  # noqa: BLE001
            log.exception("local burst: internal error")
            self._reply(view, seq, ErrorStatus.GENERAL_FAILURE, f"internal error: {e!r}", [], -1, -1)

    def _reply(self, view: memoryview, seq: int, status, msg: str, shapes, t_dev: int, t_drv: int) -> None:
        raw = msg.encode()[:MSG_MAX]
        REP.pack_into(view, REPLY_OFFSET, seq, int(status), len(raw), t_dev, t_drv, REPLY_SHARED if self.shared else 0)
        view[MSG_OFFSET:MSG_OFFSET + len(raw)] = raw
        for k, s in enumerate(shapes[: (HEADER_BYTES - SHAPES_OFFSET) // SHAPE.size]):
            dims = list(s.dimensions[:MAX_DIMS]) + [0] * (MAX_DIMS - min(len(s.dimensions), MAX_DIMS))
            SHAPE.pack_into(view, SHAPES_OFFSET + k * SHAPE.size, len(s.dimensions), int(s.is_sufficient), *dims)


class _FastLayout:
    """Numpy views onto the slots for one validated request layout of a static model."""

    def __init__(self, layout: bytes, inputs: list, outputs: list, shapes: list, runner=None):
        self.layout, self.inputs, self.outputs, self.shapes = layout, inputs, outputs, shapes
        #: ``hal.executor.bind``'s runner over these views, when the model allows one
        self.runner = runner

    @classmethod
    def build(cls, compiled, layout: bytes, in_args, out_args, data: memoryview) -> "_FastLayout | None":
        if compiled.static_plan is None:
            return None  # output shapes depend on the inputs: keep validating each request
        ins = []
        for k, arg in enumerate(in_args):
            info = compiled.input_info(k)
            dims = arg.dimensions or info.shape
            count = int(np.prod(dims)) if dims else 1
            ins.append(np.frombuffer(data, info.dtype, count, arg.location.offset).reshape(dims))
        outs, shapes = [], []
        for k, arg in enumerate(out_args):
            info = compiled.static_plan.infos[compiled.output_indexes[k]]
            count = int(np.prod(info.shape)) if info.shape else 1
            if count * info.dtype.itemsize > arg.location.length:
                return None
            outs.append(np.frombuffer(data, info.dtype, count, arg.location.offset).reshape(info.shape))
            shapes.append(OutputShape(info.shape, True))
        return cls(layout, ins, outs, shapes, hal_bind(compiled, ins, outs))


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


class WaitStrategy:
    """How long the client polls for the reply before blocking, fitted to the machine and the model.

    Polling answers ~60 µs sooner than a blocking wake-up, but holds a core. So: never when the
    service's compute threads leave no core free (polling would slow the execution it waits for);
    not for executions expected to be long (> SHORT_S: the wake-up is then a small share); else for
    about twice the expected time (a moving average of this session's round trips), so a short
    execution is caught while polling and a stalled one costs at most CLIENT_SPIN_MAX_S. And not
    while the service says other clients take turns with this one (REPLY_SHARED on the last
    reply): on 2 cores, two clients looping a 1-op model took 267 us per invoke each polling,
    107-127 us blocking; one client alone, 35 us polling, 48 us blocking."""

    def __init__(self, service_threads: int, cores: int | None = None):
        if cores is None:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        # the client's own thread polls; the service's threads compute (0: every core)
        self.core_free = service_threads > 0 and cores > service_threads
        self.expected_s: float | None = None
        self.shared = False  # the last reply's REPLY_SHARED

    def spin_s(self) -> float:
        if not self.core_free or self.shared:
            return 0.0
        if self.expected_s is None:
            return SHORT_S  # the first execution: no estimate yet
        if self.expected_s > SHORT_S:
            return 0.0
        return min(CLIENT_SPIN_MAX_S, 2 * self.expected_s + 20e-6)

    def observe(self, seconds: float) -> None:
        e = self.expected_s
        self.expected_s = seconds if e is None else 0.8 * e + 0.2 * seconds


class LocalBurstSession:
    """Client side: write inputs into the slots, ring, wait, read outputs."""

    def __init__(self, socket_path: str, token: bytes, in_ops, out_ops, timeout_s: float = 10.0,
                 out_dtypes=None):
        import numpy as np  # noqa: F401  (kept local: the server side needs no numpy import here)

        from hal.types import NUMPY_DTYPE, OperandType
        # out_dtypes: given by the client for extension operand types (their dtype depends on the model)
        self._dtypes_out = list(out_dtypes) if out_dtypes is not None else \
            [NUMPY_DTYPE[OperandType(op.type)] for op in out_ops]
        self._in_ops, self._out_ops = in_ops, out_ops
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        self.sock.connect(socket_path)
        self.sock.sendall(token)
        msg, fds, _, _ = socket.recv_fds(self.sock, HANDSHAKE.size, 1)
        if len(msg) != HANDSHAKE.size or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            self.sock.close()
            raise OSError("local burst: the service did not send its memory")
        self.sock.setblocking(False)
        size, service_threads = HANDSHAKE.unpack(msg)
        self.wait = WaitStrategy(service_threads)
        self.fd = fds[0]
        self.mem = mmap.mmap(self.fd, size)
        self.view = memoryview(self.mem)
        self.size = size
        self.seq = 0
        self.lock = threading.Lock()
        self.closed = False

    def execute(self, inputs, out_sizes, measure_timing: bool = False, timeout_ns: int = 0,
                wait_s: float | None = None, loop_timeout_ns: int = 0):
        """Returns (status, message, output shapes, outputs, (t_dev, t_drv)). Waits for the reply at
        most ``wait_s``; after that the session is closed (TimeoutError): the service may still
        answer and write the slots later, so they must never be read or written again."""
        import numpy as np

        with self.lock:
            if self.closed:
                raise ConnectionError("local burst: the session is closed")
            view = self.view
            self.seq += 1
            pos, off = REQ.size, 0
            REQ.pack_into(view, 0, MAGIC, VERSION, self.seq, len(inputs), len(out_sizes),
                          int(measure_timing), timeout_ns, loop_timeout_ns)
            for a in inputs:
                n = a.nbytes
                if DATA_OFFSET + off + n > self.size:
                    raise ValueError("inputs do not fit the local burst slots")
                np.frombuffer(view, np.uint8, n, DATA_OFFSET + off)[:] = a.reshape(-1).view(np.uint8)
                dims = list(a.shape) + [0] * (MAX_DIMS - a.ndim)
                IN_DESC.pack_into(view, pos, a.ndim, *dims, off, n)
                pos += IN_DESC.size
                off += (n + 63) // 64 * 64
            out_offsets = []
            for cap in out_sizes:
                cap = min(cap, max(0, self.size - DATA_OFFSET - off))
                OUT_DESC.pack_into(view, pos, off, cap)
                out_offsets.append(off)
                pos += OUT_DESC.size
                off += (cap + 63) // 64 * 64
            t = time.perf_counter()
            self.sock.send(b"\x01")
            try:
                rang = wait_doorbell(self.sock, self.wait.spin_s(), wait_s)
            except TimeoutError:
                self._close()
                raise
            if not rang:
                raise ConnectionError("local burst: the service closed the connection")
            self.wait.observe(time.perf_counter() - t)
            seq, status, mlen, t_dev, t_drv, flags = REP.unpack_from(view, REPLY_OFFSET)
            self.wait.shared = bool(flags & REPLY_SHARED)
            message = bytes(view[MSG_OFFSET:MSG_OFFSET + mlen]).decode(errors="replace")
            shapes = []
            for k in range(len(out_sizes)):
                rank, _, *dims = SHAPE.unpack_from(view, SHAPES_OFFSET + k * SHAPE.size)
                shapes.append(tuple(dims[:rank]))
            outs = []
            if status == 0:
                for dtype, o, shape in zip(self._dtypes_out, out_offsets, shapes):
                    count = 1
                    for d in shape:
                        count *= d
                    outs.append(np.frombuffer(view, dtype, count, DATA_OFFSET + o).reshape(shape).copy())
            return status, message, shapes, outs, (t_dev, t_drv)

    def close(self) -> None:
        self._close()  # not under the lock: close never waits for an execution in progress

    def _close(self) -> None:
        if self.closed:
            return  # the fd number may belong to someone else by now
        self.closed = True
        try:
            self.sock.close()
        finally:
            self.view.release()
            self.mem.close()
            os.close(self.fd)
