"""Client library for the nnhal service (used by the delegate and the tools).

    client = Client.connect()                      # default per-user unix socket
    pm = client.prepare_model(model)               # hal.Model
    outputs = pm.execute([x]).outputs              # numpy arrays
    with pm.burst() as burst: burst.execute([x])   # pools registered once per burst

On the service's unix socket, tensors above ``SHM_THRESHOLD`` bytes travel through shared memory,
and large model constants go as a shared-memory CONSTANT_POOL instead of inline bytes; over TCP
everything travels inline (the service accepts shared memory only from its unix socket).
"""
from __future__ import annotations

import os
import queue
import threading
import time
import weakref
from dataclasses import dataclass

import grpc
import numpy as np

from hal.model import Model
from hal.types import DeviceType, ErrorStatus, ExecutionPreference, OperandType, Priority
from service.access import SESSION_KEY
from service.address import client_address, is_unix, unix_socket_path, untrusted_socket
from service.local_burst_client import LocalBurstChannel
from service.peer_gate import PEER_SUFFIX, TICKET_KEY, request_ticket
from service.proto import nnhal_pb2 as pb
from service.proto import nnhal_pb2_grpc as pb_grpc
from service.server import default_address
from service.servicer import MAX_MESSAGE_BYTES, grpc_options
from service.session_calls import SessionStub
from service.slots import SlotLayout
from service.tls import connect_failure
from service.transfer import (
    SHM_THRESHOLD,  # noqa: F401 - re-exported: callers size tensors by it
    ModelTransfer,
    RequestBuilder,
    operand_nbytes,
    support_query_proto,
)

# Every wait for the service is bounded: a stopped or wedged service must not hang its clients.
#: A control RPC (connect's probe, capabilities, the support query, opening a burst, perf info).
RPC_TIMEOUT_S = 60.0
#: PrepareModel / PrepareModelFromCache without a deadline: compiling a large model takes seconds.
PREPARE_TIMEOUT_S = 300.0
#: An execution without a deadline waits max(EXECUTE_WAIT_MIN_S, EXECUTE_WAIT_FACTOR x the slowest
#: execution seen on its prepared model); $NNHAL_EXECUTE_WAIT_MIN_S overrides the minimum (tests).
EXECUTE_WAIT_MIN_S = 10.0
EXECUTE_WAIT_FACTOR = 50
#: With a deadline the service answers MISSED_DEADLINE itself; the client waits this much longer.
DEADLINE_GRACE_S = 1.0


class ServiceError(Exception):
    """The service answered with an NNAPI error status."""

    def __init__(self, status: int, message: str, output_shapes: list | None = None):
        try:
            self.status = ErrorStatus(status)
        except ValueError:
            self.status = ErrorStatus.GENERAL_FAILURE
        self.message = message
        self.output_shapes = output_shapes
        super().__init__(f"{self.status.name}: {message}")


class ServiceUnavailableError(ServiceError):
    """Nothing answers at the address, or the connection broke."""

    def __init__(self, message: str):
        super().__init__(ErrorStatus.DEVICE_UNAVAILABLE, message)


class ServiceTimeoutError(ServiceUnavailableError):
    """The service did not answer within the client's bound (stopped, wedged or overloaded): treat
    the connection as lost. A request it still holds may complete later, unseen."""


class UntrustedServiceError(ServiceUnavailableError):
    """The unix socket is not provably this user's service (service.address.untrusted_socket):
    refused before anything is sent on it."""

    def __init__(self, path: str, why: str):
        super().__init__(f"refusing the nnhal service socket {path}: {why}")


class ClientRefusedError(ServiceUnavailableError):
    """The service refused this client's uid (`nnhal serve --allow-uid`, service.peer_gate)."""

    def __init__(self, path: str, why: str):
        super().__init__(f"the nnhal service on {path} refused this client: {why}")


@dataclass
class Timing:
    time_on_device_ns: int
    time_in_driver_ns: int


@dataclass
class ExecutionOutput:
    outputs: list[np.ndarray]
    output_shapes: list[tuple[int, ...]]
    timing: Timing | None


def _check(reply) -> None:
    if reply.status.code != ErrorStatus.NONE:
        shapes = [tuple(s.dimensions) for s in getattr(reply, "output_shapes", [])] or None
        raise ServiceError(reply.status.code, reply.status.message, shapes)


def _rpc(fn, request, timeout_s: float | None = None, metadata=None):
    """Call a unary stub, waiting at most timeout_s (default RPC_TIMEOUT_S); transport faults become
    ServiceUnavailableError / ServiceTimeoutError / ServiceError."""
    bound = RPC_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        return fn(request, timeout=bound, metadata=metadata)
    except grpc.RpcError as e:
        raise _rpc_error(e, bound) from None
    except ValueError as e:  # grpcio: "Cannot invoke RPC on closed channel!" (the client was closed)
        if "closed channel" not in str(e):
            raise
        raise ServiceUnavailableError("the connection to the nnhal service was closed") from None


def _rpc_error(e: grpc.RpcError, bound: float) -> ServiceError:
    code = e.code() if hasattr(e, "code") else None
    detail = e.details() if hasattr(e, "details") else str(e)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ServiceError(ErrorStatus.INVALID_ARGUMENT,
                            f"message too large for the service ({detail}); the limit is "
                            f"{MAX_MESSAGE_BYTES} bytes, use shared memory for large tensors")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:  # our bound: the service's own deadline is a status
        return ServiceTimeoutError(f"the nnhal service did not answer within {bound:g} s")
    return ServiceUnavailableError(f"nnhal service unavailable ({code}: {detail})")


def _timeout_ns(timeout_s: float | None) -> int:
    return int(timeout_s * 1e9) if timeout_s else 0


def _timing(reply: pb.ExecuteReply, measure: bool) -> Timing | None:
    if not measure or not reply.HasField("timing"):
        return None
    return Timing(reply.timing.time_on_device_ns, reply.timing.time_in_driver_ns)


class RemotePreparedModel:
    """IPreparedModel on the service."""

    def __init__(self, client: "Client", prepared_id: str, model: Model):
        self.client = client
        self.id = prepared_id
        self._rb = RequestBuilder(model, client.shared_memory)
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
        return LocalBurst(self, extra_slot_bytes)

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


def _read_stream(call, replies: queue.Queue) -> None:
    """A burst's replies into ``replies``, then None (stream ended) or the RpcError that ended it."""
    try:
        for reply in call:
            replies.put(reply)
    except grpc.RpcError as e:
        replies.put(e)
    else:
        replies.put(None)


class LocalBurst:
    """NNAPI FMQ-style burst: shared-memory slots + socket doorbell; gRPC only to open it."""

    def __init__(self, pm: RemotePreparedModel, extra_slot_bytes: int = 0):
        self.pm = pm
        rb = pm._rb
        sizes = [operand_nbytes(op, op.dimensions, rb.prefixes) for op in rb.in_ops + rb.out_ops]
        if any(s is None for s in sizes):
            raise ServiceError(ErrorStatus.INVALID_ARGUMENT,
                               "local bursts need fully specified input and output dimensions")
        layout = SlotLayout.of(sizes)
        reply = _rpc(pm.client.prepared.OpenLocalBurst,
                     pb.LocalBurstRequest(prepared_model_id=pm.id, slot_bytes=layout.total + extra_slot_bytes))
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
        arrays = [np.ascontiguousarray(x) for x in inputs]
        bound = self.pm.wait_s(timeout_s, loop_timeout_s)
        try:
            reply, outs = self.channel.execute(arrays, outputs, measure_timing, _timeout_ns(timeout_s), bound,
                                               _timeout_ns(loop_timeout_s))
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


class Client:
    """IDevice on the service."""

    def __init__(self, channel: grpc.Channel, address: str):
        self.channel = channel
        self.address = address
        self.version = ""  # the service's getVersionString, read by connect
        #: Shared-memory pools only on a unix socket, to a service of this user: the service refuses
        #: them over TCP and from other users (SECURITY.md; _open_session learns the service's uid).
        self.shared_memory = is_unix(address)
        #: Metadata naming this client's session (see _open_session): every call carries it (the
        #: service lets a session reach only what it owns), filled in place once the session opens.
        self.session: list[tuple[str, str]] = []
        self.device = SessionStub(pb_grpc.DeviceStub(channel), self.session)
        self.prepared = SessionStub(pb_grpc.PreparedModelStub(channel), self.session)
        self._end_session = weakref.finalize(self, channel.close)

    def _open_session(self, timeout_s: float) -> None:
        """Open the session every prepared model and buffer of this client belongs to: the service
        releases them all when the stream ends (close(), garbage collection, or this process dying).
        On a unix socket, with a ticket from the service's handshake socket (service.peer_gate)."""
        metadata = None
        path = unix_socket_path(self.address)
        if path:
            try:
                handshake = request_ticket(path, timeout_s)
            except OSError as e:
                raise ServiceUnavailableError(f"no session ticket from {path}{PEER_SUFFIX}: {e}") from None
            if handshake.refused:
                raise ClientRefusedError(path, handshake.refused)
            if handshake.service_uid is not None:  # its segments must be the service's own user's
                self.shared_memory = handshake.service_uid == os.geteuid()
            if handshake.ticket:
                metadata = [(TICKET_KEY, handshake.ticket)]
        send: queue.Queue = queue.Queue()
        call = self.device.OpenSession(iter(send.get, None), metadata=metadata)
        first: queue.Queue = queue.Queue()
        # The reader holds only the call and a queue (not self): an unused Client is still collected.
        threading.Thread(target=_read_stream, args=(call, first), daemon=True, name="nnhal-session").start()
        self._end_session.detach()
        self._end_session = weakref.finalize(self, _close_session, send, call, self.channel)
        try:
            reply = first.get(timeout=timeout_s)
        except queue.Empty:
            raise ServiceTimeoutError(f"the nnhal service did not open a session within {timeout_s:g} s") from None
        if isinstance(reply, grpc.RpcError):
            raise _rpc_error(reply, timeout_s)
        if reply is None:
            raise ServiceUnavailableError("the service ended the session stream at once")
        _check(reply)
        self.session[:] = [(SESSION_KEY, reply.session_id)]

    @classmethod
    def connect(cls, address: str | None = None, timeout_s: float = 5.0,
                root_certificates: bytes | None = None, private_key: bytes | None = None,
                certificate_chain: bytes | None = None, channel_options: tuple = ()) -> "Client":
        """Connect and wait until the service answers; ServiceUnavailableError otherwise. TLS when
        root_certificates (PEM of the CA to trust) or a client certificate (mTLS: private_key and
        certificate_chain, PEM) is given; service.tls.client_tls reads them from files.
        ``address``: unix:PATH, a bare socket path (taken as unix:PATH) or HOST:PORT
        (service.address; ValueError for a name that could be either); None: the per-user socket.
        ``channel_options``: more gRPC channel arguments (service.fleet names the TLS host of a
        replica it resolved to an IP address)."""
        address = client_address(address) if address else default_address()
        path = unix_socket_path(address)
        why = untrusted_socket(path) if path else None
        if why:  # before any channel: not one byte of a model to a socket someone else controls
            raise UntrustedServiceError(path, why)
        tls = root_certificates is not None or certificate_chain is not None
        if tls:
            channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(
                root_certificates, private_key, certificate_chain), options=grpc_options() + list(channel_options))
        else:
            channel = grpc.insecure_channel(address, options=grpc_options() + list(channel_options))
        deadline = time.monotonic() + timeout_s
        client = cls(channel, address)
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout_s)
            # A ready channel only means the socket accepted: a stopped service must answer too.
            client.version = client.get_version_string(max(deadline - time.monotonic(), 0.05))
            client._open_session(max(deadline - time.monotonic(), 0.05))
        except ClientRefusedError:
            channel.close()
            raise
        except (grpc.FutureTimeoutError, ServiceUnavailableError):
            why = connect_failure(address, timeout_s, tls, channel)
            channel.close()
            raise ServiceUnavailableError(why) from None
        except ServiceError:  # it answered, and refused (e.g. too many clients)
            client.close()
            raise
        return client

    def close(self) -> None:
        """Ends the session (the service releases this client's models and buffers) and the channel."""
        self._end_session()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- IDevice ------------------------------------------------------------
    def get_capabilities(self) -> pb.Capabilities:
        reply = _rpc(self.device.GetCapabilities, pb.Empty())
        _check(reply)
        return reply.capabilities

    def get_type(self) -> DeviceType:
        reply = _rpc(self.device.GetType, pb.Empty())
        _check(reply)
        return DeviceType(reply.device_type)

    def get_version_string(self, timeout_s: float | None = None) -> str:
        reply = _rpc(self.device.GetVersionString, pb.Empty(), timeout_s)
        _check(reply)
        return reply.version

    def get_supported_extensions(self) -> list[pb.Extension]:
        reply = _rpc(self.device.GetSupportedExtensions, pb.Empty())
        _check(reply)
        return list(reply.extensions)

    def get_delegation_record(self, key: bytes) -> bytes | None:
        """The delegate's record kept under ``key`` in the service's cache (None: none verified)."""
        reply = _rpc(self.device.GetDelegationRecord, pb.DelegationRecordRequest(key=key))
        _check(reply)
        return reply.record if reply.found else None

    def put_delegation_record(self, key: bytes, record: bytes) -> bool:
        reply = _rpc(self.device.PutDelegationRecord, pb.DelegationRecordRequest(key=key, record=record))
        _check(reply)
        return reply.found

    def get_number_of_cache_files_needed(self) -> tuple[int, int]:
        reply = _rpc(self.device.GetNumberOfCacheFilesNeeded, pb.Empty())
        _check(reply)
        return reply.num_model_cache, reply.num_data_cache

    def get_supported_operations(self, model: Model) -> list[bool]:
        return [r is None for r in self.get_support_reasons(model)]

    def get_support_reasons(self, model: Model) -> list[str | None]:
        """getSupportedOperations with the service's reasons: None per supported operation, else
        hal's message (a service that sends no reasons gets a generic one)."""
        reply = _rpc(self.device.GetSupportedOperations, pb.SupportedOperationsRequest(
            model=support_query_proto(model)))  # no weights: service.transfer.support_query_proto
        _check(reply)
        reasons = list(reply.reasons) if len(reply.reasons) == len(reply.supported) else [""] * len(reply.supported)
        return [None if ok else (why or "the service does not support this operation variant")
                for ok, why in zip(reply.supported, reasons)]

    def prepare_model(self, model: Model, *, preference: ExecutionPreference = ExecutionPreference.FAST_SINGLE_ANSWER,
                      priority: Priority = Priority.MEDIUM, timeout_s: float | None = None,
                      token: bytes = b"") -> RemotePreparedModel:
        with ModelTransfer(model, self.shared_memory) as proto:
            reply = _rpc(self.device.PrepareModel, pb.PrepareModelRequest(
                model=proto, preference=int(preference), priority=int(priority),
                timeout_ns=_timeout_ns(timeout_s), token=token), _prepare_wait_s(timeout_s), self.session)
        _check(reply)
        return RemotePreparedModel(self, reply.prepared_model_id, model)

    def prepare_model_from_cache(self, model: Model, token: bytes, *,
                                 preference: ExecutionPreference = ExecutionPreference.FAST_SINGLE_ANSWER,
                                 priority: Priority = Priority.MEDIUM,
                                 timeout_s: float | None = None) -> RemotePreparedModel:
        reply = _rpc(self.device.PrepareModelFromCache, pb.PrepareModelFromCacheRequest(
            token=token, preference=int(preference), priority=int(priority),
            timeout_ns=_timeout_ns(timeout_s)), _prepare_wait_s(timeout_s), self.session)
        _check(reply)
        return RemotePreparedModel(self, reply.prepared_model_id, model)

    def allocate(self, operand_type: OperandType, dimensions, *, input_roles=(), output_roles=()) -> int:
        reply = _rpc(self.device.Allocate, pb.AllocateRequest(
            operand_type=int(operand_type), dimensions=list(dimensions),
            input_roles=[pb.BufferRole(prepared_model_id=m.id, io_index=i, probability=1.0) for m, i in input_roles],
            output_roles=[pb.BufferRole(prepared_model_id=m.id, io_index=i, probability=1.0) for m, i in output_roles]),
            metadata=self.session)
        _check(reply)
        return reply.buffer_token

    def release_buffer(self, token: int) -> None:
        _check(_rpc(self.device.ReleaseBuffer, pb.BufferToken(buffer_token=token)))


def _close_session(send: queue.Queue, call, channel: grpc.Channel) -> None:
    send.put(None)  # ends the stream: the service releases the session's resources
    call.cancel()
    channel.close()


def _prepare_wait_s(timeout_s: float | None) -> float:
    return timeout_s + DEADLINE_GRACE_S if timeout_s else PREPARE_TIMEOUT_S
