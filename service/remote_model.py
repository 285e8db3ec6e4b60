"""IPreparedModel on the service, as the client holds it: unary executions, the gRPC burst stream
and the shared-memory burst (service.local_burst_client), each writing its results into the
caller's arrays."""
from __future__ import annotations

import os
import queue
import threading
import time
import weakref

import grpc
import numpy as np

from hal.model import Model
from hal.types import ErrorStatus
from service.local_burst_client import LocalBurstChannel
from service.proto import nnhal_pb2 as pb
from service.rpc import (
    DEADLINE_GRACE_S,
    EXECUTE_WAIT_FACTOR,
    EXECUTE_WAIT_MIN_S,
    ExecutionOutput,
    ServiceError,
    ServiceTimeoutError,
    ServiceUnavailableError,
    Timing,
    _check,
    _read_stream,
    _rpc,
    _rpc_error,
    _timeout_ns,
    _timing,
)
from service.slots import SlotLayout
from service.transfer import RequestBuilder, operand_nbytes


class RemotePreparedModel:
    """IPreparedModel on the service."""

    def __init__(self, client, prepared_id: str, model: Model, rb: RequestBuilder | None = None):
        self.client = client  # the service.client.Client
        self.id = prepared_id
        self._rb = rb or RequestBuilder(model, client.shared_memory)
        #: The local burst the service opened with the prepare reply, until local_burst() takes it.
        self.opened_burst: pb.LocalBurstReply | None = None
        weakref.finalize(self, self._rb.scratch.close)
        self.slowest_s = 0.0  # the slowest execution seen: scales the default wait
        self._wait_min_s = float(os.environ.get("NNHAL_EXECUTE_WAIT_MIN_S") or EXECUTE_WAIT_MIN_S)

    def observe(self, seconds: float) -> None:
        """An execution of this model took ``seconds`` (here or elsewhere, e.g. in-process)."""
        if seconds > self.slowest_s:
            self.slowest_s = seconds

    def wait_s(self, timeout_s: float | None, loop_timeout_s: float | None = None) -> float:
        """How long a client waits for one execution before giving the service up (a WHILE may
        legitimately run for its whole loop timeout)."""
        if timeout_s:
            return timeout_s + DEADLINE_GRACE_S
        if loop_timeout_s is None and EXECUTE_WAIT_FACTOR * self.slowest_s <= self._wait_min_s >= DEADLINE_GRACE_S:
            return self._wait_min_s  # the common case, asked on every execution
        return max(self._wait_min_s, EXECUTE_WAIT_FACTOR * self.slowest_s, (loop_timeout_s or 0) + DEADLINE_GRACE_S)

    def _abandon_scratch(self) -> None:
        """After a timeout the service may still write into the scratch pool: never reuse it."""
        self._rb.scratch.close()

    def execute(self, inputs: list[np.ndarray], outputs: list[np.ndarray] | None = None, *,
                measure_timing: bool = False, timeout_s: float | None = None,
                loop_timeout_s: float | None = None) -> ExecutionOutput:
        """``outputs``: arrays the results are written into (each reshaped to its array: the element
        counts must match), returned as the outputs; None: new arrays. ``loop_timeout_s``: NNAPI's
        loop timeout for each WHILE (None: the default, 2 s; the service clamps it to 15 s)."""
        with self._rb.lock:
            req, layout = self._rb.build(inputs)
            ex = pb.ExecuteRequest(prepared_model_id=self.id, request=req, measure_timing=measure_timing,
                                   timeout_ns=_timeout_ns(timeout_s), loop_timeout_ns=_timeout_ns(loop_timeout_s))
            t0 = time.perf_counter()
            try:
                reply = _rpc(self.client.prepared.Execute, ex, self.wait_s(timeout_s, loop_timeout_s))
                if reply.status.code == ErrorStatus.OUTPUT_INSUFFICIENT_SIZE and any(
                        s.dimensions for s in reply.output_shapes):
                    # Outputs of unknown size: retry once with the sizes the driver reported.
                    for k, s in enumerate(reply.output_shapes):
                        n = operand_nbytes(self._rb.out_ops[k], tuple(s.dimensions), self._rb.prefixes) or 0
                        out = ex.request.outputs[k]  # ex holds a copy of req: edit what is sent
                        if out.WhichOneof("where") != "location":
                            out.inline_capacity = n
                    reply = _rpc(self.client.prepared.Execute, ex, self.wait_s(timeout_s))
            except (ServiceTimeoutError, KeyboardInterrupt):  # gRPC cancels an interrupted call
                self._abandon_scratch()
                raise
            _check(reply)
            self.observe(time.perf_counter() - t0)
            return ExecutionOutput(self._rb.decode(reply, layout, outputs),
                                   [tuple(s.dimensions) for s in reply.output_shapes], _timing(reply, measure_timing))

    def burst(self) -> "GrpcBurst":
        return GrpcBurst(self)

    def local_burst(self, extra_slot_bytes: int = 0) -> "LocalBurst":
        """Same-machine burst through shared memory (falls back to nothing: raises if unavailable)."""
        opened, self.opened_burst = self.opened_burst, None
        return LocalBurst(self, extra_slot_bytes, opened if not extra_slot_bytes else None)

    def perf_info(self) -> pb.PerfInfoReply:
        reply = _rpc(self.client.prepared.GetPerfInfo, pb.PreparedModelId(prepared_model_id=self.id))
        _check(reply)
        return reply

    def reset_perf_info(self) -> None:
        _check(_rpc(self.client.prepared.ResetPerfInfo, pb.PreparedModelId(prepared_model_id=self.id)))

    def release(self, timeout_s: float | None = None) -> None:
        try:
            _check(_rpc(self.client.prepared.Release, pb.PreparedModelId(prepared_model_id=self.id), timeout_s))
        finally:
            self._rb.scratch.close()


class GrpcBurst:
    """ExecuteBurst: one bidirectional stream; the scratch pool is registered once per version.
    A thread reads the replies so that each wait is bounded (a stream has no per-message timeout);
    after a timeout the stream is cancelled and the burst refuses further executions."""

    _POOL_ID = 1

    def __init__(self, pm: RemotePreparedModel):
        self.pm = pm
        self._rb = pm._rb  # shares the model's layout and scratch pool
        self._send: queue.Queue = queue.Queue()
        self._serial = 0
        self._registered_version = -1
        self._broken: str | None = None
        self._call = pm.client.prepared.ExecuteBurst(iter(self._send.get, None))
        self._replies: queue.Queue = queue.Queue()
        threading.Thread(target=_read_stream, args=(self._call, self._replies), daemon=True,
                         name="nnhal-burst-replies").start()
        weakref.finalize(self, self._send.put, None)  # ends the stream if never closed

    def _next_reply(self, bound: float) -> pb.BurstReply:
        try:
            reply = self._replies.get(timeout=bound)
        except queue.Empty:
            self._abandon(f"the burst was abandoned after the service did not answer within {bound:g} s")
            raise ServiceTimeoutError(f"the nnhal service did not answer within {bound:g} s") from None
        except KeyboardInterrupt:  # the reply may still come: it must not be read as the next one's
            self._abandon("the burst was abandoned when an execution was interrupted")
            raise
        if isinstance(reply, grpc.RpcError):
            self._broken = "the burst stream failed"
            raise _rpc_error(reply, bound)
        if reply is None:
            self._broken = "the service ended the burst stream"
            raise ServiceUnavailableError(self._broken)
        return reply

    def _abandon(self, why: str) -> None:
        self._broken = why
        self._call.cancel()
        self._send.put(None)  # releases the thread feeding the stream
        self.pm._abandon_scratch()

    def execute(self, inputs: list[np.ndarray], outputs: list[np.ndarray] | None = None, *,
                measure_timing: bool = False, timeout_s: float | None = None,
                loop_timeout_s: float | None = None) -> ExecutionOutput:
        """As RemotePreparedModel.execute, on the stream."""
        if self._broken:
            raise ServiceUnavailableError(self._broken)
        with self._rb.lock:
            req, layout = self._rb.build(inputs, burst_pool_id=self._POOL_ID)
            msg = pb.BurstRequest(serial=self._serial)
            self._serial += 1
            if req.pools and self._registered_version != self._rb.scratch.version:
                msg.register_pools.add(pool_id=self._POOL_ID, memory=self._rb.scratch.ref())
                self._registered_version = self._rb.scratch.version
            msg.execute.CopyFrom(pb.ExecuteRequest(prepared_model_id=self.pm.id, request=req,
                                                   measure_timing=measure_timing,
                                                   timeout_ns=_timeout_ns(timeout_s),
                                                   loop_timeout_ns=_timeout_ns(loop_timeout_s)))
            t0 = time.perf_counter()
            self._send.put(msg)
            reply = self._next_reply(self.pm.wait_s(timeout_s, loop_timeout_s)).result
            _check(reply)
            self.pm.observe(time.perf_counter() - t0)
            return ExecutionOutput(self._rb.decode(reply, layout, outputs),
                                   [tuple(s.dimensions) for s in reply.output_shapes], _timing(reply, measure_timing))

    def close(self) -> None:
        self._send.put(None)

    def __enter__(self) -> "GrpcBurst":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LocalBurst:
    """NNAPI FMQ-style burst: shared-memory slots + socket doorbell; gRPC only to open it."""

    def __init__(self, pm: RemotePreparedModel, extra_slot_bytes: int = 0, opened: pb.LocalBurstReply | None = None):
        """``opened``: the service's answer to a prepare that asked for this burst (OpenLocalBurst's)."""
        self.pm = pm
        rb = pm._rb
        layout = burst_layout(rb)
        if layout is None:
            raise ServiceError(ErrorStatus.INVALID_ARGUMENT,
                               "local bursts need fully specified input and output dimensions")
        reply = opened if opened is not None else _rpc(pm.client.prepared.OpenLocalBurst, pb.LocalBurstRequest(
            prepared_model_id=pm.id, slot_bytes=layout.total + extra_slot_bytes))
        _check(reply)
        try:
            self.channel = LocalBurstChannel(reply.socket_path, reply.auth_token, layout, len(rb.in_ops),
                                             rb.out_dtypes)
        except OSError as e:
            raise ServiceUnavailableError(f"cannot open the local burst: {e}") from None

    def execute(self, inputs: list[np.ndarray], outputs: list[np.ndarray] | None = None, *,
                measure_timing: bool = False, timeout_s: float | None = None,
                loop_timeout_s: float | None = None) -> ExecutionOutput:
        """As RemotePreparedModel.execute, through the shared-memory slots."""
        bound = self.pm.wait_s(timeout_s, loop_timeout_s)

        def run():
            done = None
            if outputs is not None and not measure_timing:  # the arrays of the last execution, as a rule
                done = self.channel.execute_steady(inputs, outputs, _timeout_ns(timeout_s), bound,
                                                   _timeout_ns(loop_timeout_s))
            if done is None:
                done = self.channel.execute([np.ascontiguousarray(x) for x in inputs], outputs, measure_timing,
                                            _timeout_ns(timeout_s), bound, _timeout_ns(loop_timeout_s))
            return done
        return self._answer(run, bound, measure_timing)

    def resume_native(self, code: int, outputs: list[np.ndarray], *, timeout_s: float | None = None,
                      loop_timeout_s: float | None = None) -> ExecutionOutput | None:
        """``execute``'s answer for a request the native round trip (``arm_native``) posted and
        handed back with ``code`` (``LocalBurstChannel.resume_native``); None: it posted nothing."""
        bound = self.pm.wait_s(timeout_s, loop_timeout_s)
        return self._answer(lambda: self.channel.resume_native(code, outputs, bound), bound, False)

    def arm_native(self, inputs: list[np.ndarray], outputs: list[np.ndarray], *, timeout_s: float | None = None,
                   loop_timeout_s: float | None = None) -> tuple[int, int] | None:
        """``LocalBurstChannel.arm_native`` for requests with these timeouts; the slowest round trip
        it made is observed (``RemotePreparedModel.observe``) when the channel next runs Python."""
        self.pm.observe(self.channel.native_slowest_s)
        return self.channel.arm_native(inputs, outputs, _timeout_ns(timeout_s), _timeout_ns(loop_timeout_s))

    def _answer(self, run, bound: float, measure_timing: bool) -> ExecutionOutput | None:
        """``run()``'s (reply, outputs) as an ExecutionOutput (None for None), its failures as
        ServiceErrors."""
        try:
            done = run()
            if done is None:
                return None
            reply, outs = done
        except TimeoutError:  # the channel closed itself: the service may still write its slots
            raise ServiceTimeoutError(f"the nnhal service did not answer the local burst within {bound:g} s; "
                                      f"the burst is closed") from None
        except (OSError, ConnectionError) as e:
            raise ServiceUnavailableError(f"local burst broken: {e}") from None
        except KeyboardInterrupt:  # the service may still answer into the slots: never use them again
            self.close()
            raise
        if reply.status:  # not ErrorStatus.NONE
            raise ServiceError(reply.status, reply.message, reply.shapes)
        self.pm.observe(self.channel.last_s)
        timing = Timing(reply.time_on_device_ns, reply.time_in_driver_ns) if measure_timing else None
        return ExecutionOutput(outs, reply.shapes, timing)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "LocalBurst":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def burst_layout(rb: RequestBuilder) -> SlotLayout | None:
    """A local burst's slots for the model's inputs then outputs; None if a shape is not fixed."""
    sizes = [operand_nbytes(op, op.dimensions, rb.prefixes) for op in rb.in_ops + rb.out_ops]
    return None if any(s is None for s in sizes) else SlotLayout.of(sizes)
