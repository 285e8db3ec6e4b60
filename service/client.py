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

import grpc

from hal.model import Model
from hal.types import DeviceType, ExecutionPreference, OperandType, Priority
from service.access import SESSION_KEY
from service.address import client_address, denied_socket, is_unix, unix_socket_path, untrusted_socket
from service.peer_gate import PEER_SUFFIX, TICKET_KEY, peer_socket_path, request_ticket
from service.proto import nnhal_pb2 as pb
from service.proto import nnhal_pb2_grpc as pb_grpc
from service.remote_model import GrpcBurst, LocalBurst, RemotePreparedModel, burst_layout  # noqa: F401 - re-exported
from service.rpc import (  # noqa: F401 - the errors and types are re-exported: callers catch them from here
    ClientRefusedError,
    ExecutionOutput,
    ServiceError,
    ServiceTimeoutError,
    ServiceUnavailableError,
    Timing,
    UntrustedServiceError,
    _check,
    _prepare_wait_s,
    _read_stream,
    _rpc,
    _rpc_error,
    _timeout_ns,
)
from service.server import default_address
from service.servicer import grpc_options
from service.session_calls import SessionStub
from service.tls import connect_failure
from service.transfer import (
    SHM_THRESHOLD,  # noqa: F401 - re-exported: callers size tensors by it
    ModelTransfer,
    RequestBuilder,
    support_query_proto,
)


class Client:
    """IDevice on the service."""

    def __init__(self, channel: grpc.Channel, address: str):
        self.channel = channel
        self.address = address
        self.version = ""  # the service's getVersionString, read by connect
        #: getCapabilities as the session's first reply carried it (None: an older service's reply).
        self.capabilities: pb.Capabilities | None = None
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
        deadline = time.monotonic() + timeout_s
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
        call = self.device.OpenSession(iter(send.get, None), metadata=metadata, wait_for_ready=True)
        first: queue.Queue = queue.Queue()
        # The reader holds only the call and a queue (not self): an unused Client is still collected.
        threading.Thread(target=_read_stream, args=(call, first), daemon=True, name="nnhal-session").start()
        self._end_session.detach()
        self._end_session = weakref.finalize(self, _close_session, send, call, self.channel)
        try:
            reply = first.get(timeout=max(deadline - time.monotonic(), 0.05))  # the ticket's wait included
        except queue.Empty:
            raise ServiceTimeoutError(f"the nnhal service did not open a session within {timeout_s:g} s") from None
        if isinstance(reply, grpc.RpcError):
            raise _rpc_error(reply, timeout_s)
        if reply is None:
            raise ServiceUnavailableError("the service ended the session stream at once")
        _check(reply)
        self.session[:] = [(SESSION_KEY, reply.session_id)]
        self.version = reply.version or self.version
        if reply.HasField("capabilities"):
            self.capabilities = reply.capabilities

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
        why = denied_socket(path) if path else None
        if why:  # no use waiting for a service this user may not reach
            raise ServiceUnavailableError(f"no nnhal service can be reached at {address}: {why}")
        tls = root_certificates is not None or certificate_chain is not None
        if tls:
            channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(
                root_certificates, private_key, certificate_chain), options=grpc_options() + list(channel_options))
        else:
            channel = grpc.insecure_channel(address, options=grpc_options() + list(channel_options))
        deadline = time.monotonic() + timeout_s
        client = cls(channel, address)
        try:
            # The first call waits for the connection itself (wait_for_ready, within the bound), and
            # a stopped service must answer it. Not grpc.channel_ready_future: its connectivity
            # poller watches in 0.2 s steps, and closing a channel it watched waits for the step.
            # On a unix socket whose handshake socket is there the session is that call (its reply
            # names the version); else the version call waits for the service to listen (it binds
            # the handshake socket first), and over TCP it tells a TLS mismatch apart.
            if not path or not os.path.exists(peer_socket_path(path)):
                client._read_version(timeout_s)
            client._open_session(max(deadline - time.monotonic(), 0.05))
            if not client.version:  # an older service's session reply
                client._read_version(max(deadline - time.monotonic(), 0.05))
        except ClientRefusedError:
            channel.close()
            raise
        except ServiceUnavailableError:
            why = connect_failure(address, timeout_s, tls, channel)
            channel.close()
            raise ServiceUnavailableError(why) from None
        except ServiceError:  # it answered, and refused (e.g. too many clients)
            client.close()
            raise
        return client

    def _read_version(self, timeout_s: float) -> None:
        try:
            reply = self.device.GetVersionString(pb.Empty(), timeout=timeout_s, wait_for_ready=True)
        except grpc.RpcError as e:
            raise _rpc_error(e, timeout_s) from None
        _check(reply)
        self.version = reply.version

    def close(self) -> None:
        """Ends the session (the service releases this client's models and buffers) and the channel."""
        self._end_session()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- IDevice ------------------------------------------------------------
    def get_capabilities(self) -> pb.Capabilities:
        """The service's capabilities (fixed while it runs: those its session reply carried, if it did)."""
        if self.capabilities is not None:
            return self.capabilities
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
                                 timeout_s: float | None = None, local_burst: bool = False) -> RemotePreparedModel:
        """``local_burst``: the service also opens the model's local burst in the same call (where
        this client may have one), which the first ``local_burst()`` then connects to."""
        rb = RequestBuilder(model, self.shared_memory)
        layout = burst_layout(rb) if local_burst and self.shared_memory else None
        reply = _rpc(self.device.PrepareModelFromCache, pb.PrepareModelFromCacheRequest(
            token=token, preference=int(preference), priority=int(priority), timeout_ns=_timeout_ns(timeout_s),
            local_burst_slot_bytes=layout.total if layout else 0), _prepare_wait_s(timeout_s), self.session)
        _check(reply)
        pm = RemotePreparedModel(self, reply.prepared_model_id, model, rb)
        if layout and reply.HasField("local_burst"):  # an older service opens none: local_burst() asks
            pm.opened_burst = reply.local_burst
        return pm

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


def answers(address: str, timeout_s: float = 0.5) -> bool:
    """Whether a plaintext service answers at ``address`` now, for a caller waiting on one it
    started: False at once while its unix socket does not exist yet (a connect would wait out
    ``timeout_s`` for it)."""
    path = unix_socket_path(client_address(address))
    if path is not None and not os.path.exists(path):
        return False
    try:
        Client.connect(address, timeout_s=timeout_s).close()
        return True
    except ServiceUnavailableError:
        return False


def _close_session(send: queue.Queue, call, channel: grpc.Channel) -> None:
    send.put(None)  # ends the stream: the service releases the session's resources
    call.cancel()
    channel.close()
