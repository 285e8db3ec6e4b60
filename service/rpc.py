"""What every client-side call to the service shares: the bounds on waiting for it, the errors it
raises (NNAPI statuses and transport faults), and the unary-call and stream-reading helpers
(service.client's Client, service.remote_model's prepared models and bursts, service.fleet)."""
from __future__ import annotations

import queue
from dataclasses import dataclass

import grpc
import numpy as np

from hal.types import ErrorStatus
from service.proto import nnhal_pb2 as pb
from service.servicer import MAX_MESSAGE_BYTES

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


def _read_stream(call, replies: queue.Queue) -> None:
    """A burst's replies into ``replies``, then None (stream ended) or the RpcError that ended it."""
    try:
        for reply in call:
            replies.put(reply)
    except grpc.RpcError as e:
        replies.put(e)
    else:
        replies.put(None)


def _prepare_wait_s(timeout_s: float | None) -> float:
    return timeout_s + DEADLINE_GRACE_S if timeout_s else PREPARE_TIMEOUT_S
