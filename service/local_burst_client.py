"""The client half of the shared-memory burst (wire format: ``service.burst_wire``).

Each input is copied once into its slot; each output is copied once out of its slot, into the
caller's array when one is given (the delegate gives TFLite's output tensors).
"""
from __future__ import annotations

import mmap
import os
import socket
import threading
import time

import numpy as np

from service import burst_wire as wire
from service.slots import SlotLayout

#: The client never polls longer than this; executions expected to take longer than SHORT_S are
#: waited for blocking (a wake-up is then < 7% of the wait, and a polling client would hold a core).
CLIENT_SPIN_MAX_S = 2e-3
SHORT_S = 1e-3


class WaitStrategy:
    """How long the client polls for the reply before blocking, fitted to the machine and the model.

    Polling answers ~60 µs sooner than a blocking wake-up, but holds a core. So: never when the
    service's compute threads leave no core free (polling would slow the execution it waits for);
    not for executions expected to be long (> SHORT_S: the wake-up is then a small share); else for
    about twice the expected time (a moving average of this burst's round trips), so a short
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
        self.wait = WaitStrategy(service_threads)
        self.fd = fds[0]
        self.mem = mmap.mmap(self.fd, size)
        self.view = memoryview(self.mem)
        self.seq = 0
        self.lock = threading.Lock()
        self.closed = False

    def execute(self, inputs: list[np.ndarray], outputs: list[np.ndarray] | None = None, measure_timing: bool = False,
                timeout_ns: int = 0, wait_s: float | None = None, loop_timeout_ns: int = 0):
        """Returns (reply, outputs): ``service.burst_wire.Reply`` and, when it succeeded, the outputs
        — the given arrays, written in place (each reshaped to its array: the element counts must
        match), or new ones. Waits for the reply at most ``wait_s``; after that the channel is
        closed (TimeoutError): the service may still answer and write the slots later, so they
        must never be read or written again."""
        offsets = self.layout.offsets
        with self.lock:
            if self.closed:
                raise ConnectionError("local burst: the channel is closed")
            view = self.view
            self.seq += 1
            descs = []
            for k, a in enumerate(inputs):
                n, off = a.nbytes, offsets[k]
                if n > self.layout.sizes[k]:
                    raise ValueError(f"input {k} ({n} bytes) does not fit its slot of {self.layout.sizes[k]} bytes")
                np.frombuffer(view, np.uint8, n, wire.DATA_OFFSET + off)[:] = a.reshape(-1).view(np.uint8)
                descs.append((a.shape, off, n))
            outs_desc = [(offsets[k], self.layout.sizes[k]) for k in range(self.n_inputs, len(offsets))]
            wire.write_request(view, self.seq, descs, outs_desc, measure_timing, timeout_ns, loop_timeout_ns)
            t = time.perf_counter()
            self.sock.send(b"\x01")
            try:
                rang = wire.wait_doorbell(self.sock, self.wait.spin_s(), wait_s)
            except TimeoutError:
                self._close()
                raise
            if not rang:
                raise ConnectionError("local burst: the service closed the connection")
            self.wait.observe(time.perf_counter() - t)
            reply = wire.read_reply(view, len(outs_desc))
            self.wait.shared = reply.shared
            if reply.status != 0:
                return reply, None
            results = []
            for k, (dtype, (off, _), shape) in enumerate(zip(self.out_dtypes, outs_desc, reply.shapes)):
                count = int(np.prod(shape)) if shape else 1
                src = np.frombuffer(view, dtype, count, wire.DATA_OFFSET + off)
                if outputs is None:
                    results.append(src.reshape(shape).copy())
                    continue
                dst = outputs[k]
                if dst.size != count or dst.dtype != dtype:
                    raise ValueError(f"output {k} came back {dtype}{list(shape)}, the array given for it is "
                                     f"{dst.dtype}{list(dst.shape)}")
                np.copyto(dst, src.reshape(dst.shape), casting="no")
                results.append(dst)
            return reply, results

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


__all__ = ["CLIENT_SPIN_MAX_S", "LocalBurstChannel", "SHORT_S", "WaitStrategy"]
