"""gRPC servicers: convert proto <-> hal and delegate to the Driver. Never raise to gRPC.

A HalError becomes its ErrorStatus in the reply; any other exception becomes
GENERAL_FAILURE with a message, so one bad request cannot take the server down.
"""
from __future__ import annotations

import logging
import math
import mmap
import threading
import time
from contextlib import ExitStack
from typing import Callable, Iterator

from hal import extension_registry, performance
from hal.errors import HalError
from hal.model import DataLocation, Request, RequestArgument
from hal.types import ErrorStatus, OperandType
from service import convert
from service.access import Access, Caller, check_shared_allowed
from service.driver import Driver, perf_name
from service.execution import ExecutionResult, PreparedModel, deadline_from_timeout
from service.local_burst_server import LocalBurstServer
from service.memory import ClientPool
from service.proto import nnhal_pb2 as pb
from service.proto import nnhal_pb2_grpc as pb_grpc

log = logging.getLogger("nnhal.service")

#: Largest message either side accepts. Larger tensors and weights go through shared memory.
MAX_MESSAGE_BYTES = 64 << 20
#: The largest ``zeros`` pool a support query may name (address space, not memory: see PoolResolver).
MAX_ZERO_POOL_BYTES = 1 << 34
#: Pools one burst stream may hold registered (each is an open descriptor).
MAX_BURST_POOLS = 64

LOCAL_BURST_REFUSED = ("local bursts are only for clients of the service's own user on its unix socket; "
                       "others use ExecuteBurst")


def _guard(reply_cls, fn: Callable[[], object]):
    """Run a handler body; turn every failure into a reply status."""
    try:
        return fn()
    except HalError as e:
        return reply_cls(status=convert.hal_error_status(e))
    except Exception as e:  # noqa: BLE001 - the server must survive anything a client sends
        log.exception("internal error")
        return reply_cls(status=convert.status(ErrorStatus.GENERAL_FAILURE, f"internal error: {e!r}"))


class PoolResolver:
    """Maps proto Memory descriptors to pools for one request or model; owns what it opened.

    A client's shared memory is never mapped (see ``service.memory``): for a model it is read
    whole into a private copy; for a request it stays a ``ClientPool`` until ``privatize``
    copies the argument ranges in and out."""

    def __init__(self, driver: Driver, stack: ExitStack, burst_pools: dict[int, ClientPool] | None = None,
                 allow_inline: bool = True, copy_shared: bool = True, allow_zeros: bool = False,
                 allow_shared: bool = False, caller: str = ""):
        self.driver = driver
        self.caller = caller  # the session whose driver buffers the request may name
        self.allow_shared = allow_shared  # a same-user client on the unix socket (service.access)
        self.allow_zeros = allow_zeros  # a support query's withheld constants (service.transfer)
        self.stack = stack
        self.burst_pools = burst_pools
        self.allow_inline = allow_inline
        self.copy_shared = copy_shared

    def __call__(self, m: pb.Memory):
        kind = m.WhichOneof("kind")
        if kind == "shared":
            check_shared_allowed(self.allow_shared)
            pool = ClientPool(m.shared.name, m.shared.size)
            self.stack.callback(pool.close)
            return pool.read(0, pool.size, "model pool") if self.copy_shared else pool
        if kind == "driver_buffer":
            return self.driver.buffer(m.driver_buffer, self.caller)
        if kind == "burst_pool":
            if self.burst_pools is None:
                raise HalError(ErrorStatus.INVALID_ARGUMENT, "burst pools are only valid inside a burst")
            pool = self.burst_pools.get(m.burst_pool)
            if pool is None:
                raise HalError(ErrorStatus.INVALID_ARGUMENT, f"burst pool {m.burst_pool} is not registered")
            return pool
        if kind == "inline_data" and self.allow_inline:
            return m.inline_data
        if kind == "zeros" and self.allow_zeros:
            if m.zeros > MAX_ZERO_POOL_BYTES:
                raise HalError(ErrorStatus.INVALID_ARGUMENT, f"a pool of {m.zeros} zero bytes is more than the "
                                                             f"{MAX_ZERO_POOL_BYTES} a model may hold")
            try:
                return mmap.mmap(-1, max(m.zeros, 1))  # anonymous: pages exist only where read
            except OSError as e:
                raise HalError(ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT,
                               f"cannot reserve {m.zeros} bytes for the query's constants: {e.strerror}") from None
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"unsupported memory kind {kind!r}")


def privatize(request: Request) -> list[tuple[int, ClientPool, int]]:
    """Copy every input held in a client's shared memory into a private pool and give every such
    output a private pool; returns the outputs to copy back: (output index, pool, offset)."""
    pools = list(request.pools)
    shared = {i for i, p in enumerate(pools) if isinstance(p, ClientPool)}
    if not shared:
        return []
    for k, arg in enumerate(request.inputs):
        loc = arg.location
        if not arg.has_no_value and loc is not None and loc.pool_index in shared:
            pools.append(pools[loc.pool_index].read(loc.offset, loc.length, f"input {k}"))
            arg.location = DataLocation(len(pools) - 1, 0, loc.length)
    write_back = []
    for k, arg in enumerate(request.outputs):
        loc = arg.location
        if not arg.has_no_value and loc is not None and loc.pool_index in shared:
            pool = pools[loc.pool_index]
            pool.check_range(loc.offset, loc.length, f"output {k}")
            pools.append(bytearray(loc.length))
            write_back.append((k, pool, loc.offset))
            arg.location = DataLocation(len(pools) - 1, 0, loc.length)
    for i in shared:
        pools[i] = b""  # no argument refers to it any more
    request.pools = pools
    return write_back


def request_from_proto(req: pb.Request, resolve: PoolResolver) -> tuple[Request, list[tuple[int, int]]]:
    """Build a hal Request; inline arguments become extra pools. Returns (request, inline outputs)
    where each inline output is (output index, pool index)."""
    pools = [resolve(m) for m in req.pools]
    for kind, args in (("input", req.inputs), ("output", req.outputs)):
        for k, a in enumerate(args):  # before inline data joins the list as pools of its own
            if a.WhichOneof("where") == "location" and a.location.pool_index >= len(req.pools):
                raise HalError(ErrorStatus.INVALID_ARGUMENT, f"{kind} {k}: pool {a.location.pool_index} does not "
                                                             f"exist (the request has {len(req.pools)} pools)")
    inputs, outputs, inline_outputs = [], [], []
    for a in req.inputs:
        where = a.WhichOneof("where")
        arg = convert.request_argument(a)
        if where == "data":
            pools.append(a.data)
            arg.location = DataLocation(len(pools) - 1, 0, len(a.data))
        elif where == "inline_capacity":
            raise HalError(ErrorStatus.INVALID_ARGUMENT, "inline_capacity is only valid for outputs")
        inputs.append(arg)
    for k, a in enumerate(req.outputs):
        where = a.WhichOneof("where")
        arg = convert.request_argument(a)
        if where == "data":
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"output {k} cannot carry input data")
        if where != "location":
            cap = a.inline_capacity if where == "inline_capacity" else 0
            if cap > MAX_MESSAGE_BYTES:
                raise HalError(ErrorStatus.INVALID_ARGUMENT,
                               f"output {k}: inline capacity {cap} exceeds the {MAX_MESSAGE_BYTES}-byte "
                               f"message limit; use shared memory")
            pools.append(bytearray(cap))
            arg = RequestArgument(a.has_no_value, DataLocation(len(pools) - 1, 0, cap), tuple(a.dimensions))
            inline_outputs.append((k, len(pools) - 1))
        outputs.append(arg)
    return Request(inputs=inputs, outputs=outputs, pools=pools), inline_outputs


#: How often a session's thread checks that its client is still there.
SESSION_POLL_S = 1.0


class DeviceServicer(pb_grpc.DeviceServicer):
    def __init__(self, driver: Driver, access: Access, relative_speed: float | None = None,
                 measured: dict[str, dict[int, float]] | None = None):
        self.driver = driver
        self.access = access  # who may call what (sessions, tickets, shared memory)
        #: NNAPI operand type -> the exec_time getCapabilities reports (the device's time relative
        #: to LiteRT 2.3's CPU, 1 thread; the delegate's cost partitioning reads them, delegate.cost): what the
        #: driver's backends measured (hal.performance; `nnhal serve --performance FILE`: this
        #: machine's figures), or `nnhal serve --relative-speed` for every type.
        times = performance.exec_times(driver.backend_order, measured)
        self.exec_times = times if relative_speed is None else dict.fromkeys(times, float(relative_speed))
        #: Relaxed float32's: float16's where the float backend computes it so (hal.performance.RELAXED);
        #: a performance file or --relative-speed states float32's.
        self.relaxed_exec_time = self.exec_times[int(OperandType.TENSOR_FLOAT32)]
        if relative_speed is None and not measured:
            self.relaxed_exec_time = performance.relaxed_exec_time(driver.backend_order, times)
        #: Opens the local burst a prepare asks for with its reply (the server sets it).
        self.bursts: PreparedModelServicer | None = None

    def OpenSession(self, request_iterator, context):
        """Held open by each client; its end (client close, disconnect, death) releases what the
        client owned. Costs one server thread per connected client while it lasts."""
        try:
            session = self.access.open_session(context)
        except HalError as e:
            yield pb.SessionReply(status=convert.hal_error_status(e))
            return
        context.add_callback(lambda: self.driver.close_session(session.id))  # also if never resumed
        try:
            yield pb.SessionReply(status=convert.status(), session_id=session.id,
                                  version=self.driver.version_string(), capabilities=self.capabilities())
            # The client sends nothing: wait for its end (the callback above releases at once; this
            # thread notices within a second) or for the service to stop.
            while context.is_active() and not self.driver.sessions_closing.wait(SESSION_POLL_S):
                pass
        finally:
            self.driver.close_session(session.id)

    def ReleaseBuffer(self, request, context):
        def body():
            self.driver.release_buffer(request.buffer_token, self.access.caller(context).session_id)
            return pb.ReleaseReply(status=convert.status())
        return _guard(pb.ReleaseReply, body)

    def capabilities(self) -> pb.Capabilities:
        def perf(exec_time: float) -> pb.PerformanceInfo:
            return pb.PerformanceInfo(exec_time=exec_time, power_usage=1.0)  # power: not known

        relaxed = perf(self.relaxed_exec_time)  # float16 where the float backend computes it so
        other = perf(performance.slowest(self.exec_times))  # control flow: hal's Python interpreter
        return pb.Capabilities(
            relaxed_float32_to_float16_performance_scalar=relaxed,
            relaxed_float32_to_float16_performance_tensor=relaxed,
            operand_performance=[pb.OperandPerformance(type=t, info=perf(v)) for t, v in self.exec_times.items()],
            if_performance=other, while_performance=other)

    def GetCapabilities(self, request, context):
        return _guard(pb.CapabilitiesReply, lambda: pb.CapabilitiesReply(status=convert.status(),
                                                                         capabilities=self.capabilities()))

    def GetType(self, request, context):
        return pb.TypeReply(status=convert.status(), device_type=int(self.driver.device_type()))

    def GetVersionString(self, request, context):
        return pb.VersionStringReply(status=convert.status(), version=self.driver.version_string())

    def GetSupportedExtensions(self, request, context):
        def body():
            exts = [pb.Extension(name=e.name, operand_types=[
                pb.ExtensionOperandTypeInformation(type=t.type, is_tensor=t.is_tensor, byte_size=t.dtype.itemsize)
                for _, t in sorted(e.operand_types.items())]) for e in extension_registry.extensions()]
            return pb.ExtensionsReply(status=convert.status(), extensions=exts)
        return _guard(pb.ExtensionsReply, body)

    def GetSupportedOperations(self, request, context):
        def body():
            caller = self.access.caller(context)
            with ExitStack() as stack:
                model = convert.model_from_proto(request.model, PoolResolver(
                    self.driver, stack, allow_zeros=True, allow_shared=caller.shared))
                reasons = self.driver.support_reasons(model)
            return pb.SupportedOperationsReply(status=convert.status(), supported=[r is None for r in reasons],
                                               reasons=[r or "" for r in reasons])
        return _guard(pb.SupportedOperationsReply, body)

    def GetNumberOfCacheFilesNeeded(self, request, context):
        n_model, n_data = self.driver.cache_files_needed()  # (0, 0): caching disabled
        return pb.CacheFilesReply(status=convert.status(), num_model_cache=n_model, num_data_cache=n_data)

    def PrepareModel(self, request, context):
        def body():
            caller = self.access.caller(context, session=True)
            deadline = deadline_from_timeout(request.timeout_ns)
            if request.token and len(request.token) != 32:
                raise HalError(ErrorStatus.INVALID_ARGUMENT,
                               f"cache token must be 32 bytes, got {len(request.token)}")
            with ExitStack() as stack:
                model = convert.model_from_proto(request.model, PoolResolver(
                    self.driver, stack, allow_shared=caller.shared))
                # One private copy of each pool: the client may reuse or unmap its memory.
                model.pools = [p if isinstance(p, bytes) else bytes(p) for p in model.pools]
            entry = self.driver.prepare(model, request.preference, request.priority, deadline, request.token,
                                        session=caller.session)
            return pb.PrepareModelReply(status=convert.status(), prepared_model_id=entry.id)
        return _guard(pb.PrepareModelReply, body)

    def PrepareModelFromCache(self, request, context):
        def body():
            caller = self.access.caller(context, session=True)
            entry = self.driver.prepare_from_cache(request.token, request.preference, request.priority,
                                                   deadline_from_timeout(request.timeout_ns), session=caller.session)
            reply = pb.PrepareModelReply(status=convert.status(), prepared_model_id=entry.id, from_cache=True)
            if request.local_burst_slot_bytes and self.bursts is not None:
                reply.local_burst.CopyFrom(_guard(pb.LocalBurstReply, lambda: self.bursts.open_local_burst(
                    caller, entry, request.local_burst_slot_bytes)))
            return reply
        return _guard(pb.PrepareModelReply, body)

    def GetDelegationRecord(self, request, context):
        def body():
            self.access.caller(context)  # on the unix socket: a session (service.access)
            record = self.driver.delegation_record(request.key)
            return pb.DelegationRecordReply(status=convert.status(), found=record is not None, record=record or b"")
        return _guard(pb.DelegationRecordReply, body)

    def PutDelegationRecord(self, request, context):
        def body():
            self.access.caller(context, session=True)  # it writes to the cache: a session, as PrepareModel
            stored = self.driver.store_delegation_record(request.key, request.record)
            return pb.DelegationRecordReply(status=convert.status(), found=stored)
        return _guard(pb.DelegationRecordReply, body)

    def Allocate(self, request, context):
        def body():
            roles = [(r.prepared_model_id, r.io_index, True) for r in request.input_roles] + \
                    [(r.prepared_model_id, r.io_index, False) for r in request.output_roles]
            token = self.driver.allocate(request.operand_type, tuple(request.dimensions), roles,
                                         session=self.access.caller(context, session=True).session)
            return pb.AllocateReply(status=convert.status(), buffer_token=token)
        return _guard(pb.AllocateReply, body)


class PreparedModelServicer(pb_grpc.PreparedModelServicer):
    def __init__(self, driver: Driver, access: Access, runtime_dir: str | None = None):
        self.driver = driver
        self.access = access  # who may call what (sessions, shared memory)
        self.runtime_dir = runtime_dir  # where local-burst sockets go (the service socket's private dir)
        self.local_bursts: list[LocalBurstServer] = []
        self.max_local_bursts = 4 * driver.sessions.max_clients
        self._grpc_bursts = 0
        self._lock = threading.Lock()
        driver.release_hooks.append(self._close_bursts_of)

    def _close_bursts_of(self, prepared_id: str) -> None:
        """A released prepared model's local bursts stop (their threads hold the model)."""
        for b in self.local_bursts:
            if b.model.id == prepared_id:
                b.close()

    def OpenLocalBurst(self, request, context):
        def body():
            caller = self.access.caller(context)
            if not caller.shared:  # checked before the id is looked up, as ever
                raise HalError(ErrorStatus.INVALID_ARGUMENT, LOCAL_BURST_REFUSED)
            entry = self.driver.get(request.prepared_model_id, caller.session_id)
            return self.open_local_burst(caller, entry, request.slot_bytes)
        return _guard(pb.LocalBurstReply, body)

    def open_local_burst(self, caller: Caller, entry: PreparedModel, slot_bytes: int) -> pb.LocalBurstReply:
        """A local burst on ``entry`` (which ``caller`` owns); HalError if the caller may not have one."""
        if not caller.shared:  # its socket and memfd are this machine's, reachable by the service's user
            raise HalError(ErrorStatus.INVALID_ARGUMENT, LOCAL_BURST_REFUSED)
        with self._lock:
            self.local_bursts = [b for b in self.local_bursts if not b.closed.is_set()]
            if len(self.local_bursts) >= self.max_local_bursts:  # each is a thread and a memfd
                raise HalError(ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT,
                               f"{len(self.local_bursts)} local bursts are open, the service's limit")
            burst = LocalBurstServer(entry, slot_bytes, self.runtime_dir,
                                     client=self.driver.sessions.owner_of(entry.id))
            self.local_bursts.append(burst)
        return pb.LocalBurstReply(status=convert.status(), socket_path=burst.path, auth_token=burst.token)

    def close_local_bursts(self, timeout_s: float = 5.0) -> None:
        """Stop every local burst and wait for its thread to remove its socket directory."""
        for b in self.local_bursts:
            b.close()
        for b in self.local_bursts:
            b.thread.join(timeout_s)

    def run(self, ex: pb.ExecuteRequest, burst_pools: dict[int, ClientPool] | None = None, *,
            allow_shared: bool = False, caller: str = "") -> pb.ExecuteReply:
        """Execute one request (unary or burst): decode it, execute it on the prepared model (its
        one execution path: ``service.execution``), encode the reply."""
        received = time.monotonic_ns()

        def body():
            deadline = deadline_from_timeout(ex.timeout_ns, received)
            entry = self.driver.get(ex.prepared_model_id, caller)
            with ExitStack() as stack:
                request, inline = request_from_proto(
                    ex.request, PoolResolver(self.driver, stack, burst_pools, allow_inline=False, copy_shared=False,
                                             allow_shared=allow_shared, caller=caller))
                write_back = privatize(request)
                reply = _execute(entry, request, deadline, received, ex.loop_timeout_ns)
                if reply.status.code == ErrorStatus.NONE:
                    for k, pool, offset in write_back:
                        nbytes = _nbytes(entry, k, reply.output_shapes[k].dimensions)
                        pool.write(offset, memoryview(request.pools[request.outputs[k].location.pool_index])[:nbytes],
                                   f"output {k}")
                if reply.status.code == ErrorStatus.NONE and inline:
                    outs = [b""] * len(request.outputs)
                    for k, pool_index in inline:
                        nbytes = _nbytes(entry, k, reply.output_shapes[k].dimensions)
                        outs[k] = bytes(request.pools[pool_index][:nbytes])
                    reply.outputs.extend(outs)
                return reply
        return _guard(pb.ExecuteReply, body)

    def Execute(self, request, context):
        try:
            caller = self.access.caller(context)
        except HalError as e:
            return pb.ExecuteReply(status=convert.hal_error_status(e))
        return self.run(request, allow_shared=caller.shared, caller=caller.session_id)

    def ExecuteBurst(self, request_iterator: Iterator[pb.BurstRequest], context):
        try:
            caller = self.access.caller(context)
        except HalError as e:
            yield pb.BurstReply(result=pb.ExecuteReply(status=convert.hal_error_status(e)))
            return
        with self._lock:
            full = self._grpc_bursts >= self.driver.sessions.max_clients  # each holds a server thread
            self._grpc_bursts += not full
        if full:
            yield pb.BurstReply(result=pb.ExecuteReply(status=convert.status(
                ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT, "too many bursts are open on the service")))
            return
        pools: dict[int, ClientPool] = {}
        try:
            for msg in request_iterator:
                reply = _guard(pb.ExecuteReply, lambda msg=msg: self._burst_step(msg, pools, caller.shared,
                                                                                   caller.session_id))
                if msg.HasField("execute") or reply.status.code:
                    yield pb.BurstReply(serial=msg.serial, result=reply)
        finally:
            for p in pools.values():
                p.close()
            with self._lock:
                self._grpc_bursts -= 1

    def _burst_step(self, msg: pb.BurstRequest, pools: dict[int, ClientPool], allow_shared: bool,
                    caller: str) -> pb.ExecuteReply:
        for pid in msg.release_pools:
            p = pools.pop(pid, None)
            if p is not None:
                p.close()
        for reg in msg.register_pools:
            if reg.memory.WhichOneof("kind") != "shared":
                raise HalError(ErrorStatus.INVALID_ARGUMENT, "burst pools must be shared memory")
            check_shared_allowed(allow_shared)
            if reg.pool_id not in pools and len(pools) >= MAX_BURST_POOLS:
                raise HalError(ErrorStatus.INVALID_ARGUMENT, f"a burst may register at most {MAX_BURST_POOLS} pools")
            new = ClientPool(reg.memory.shared.name, reg.memory.shared.size)
            old = pools.pop(reg.pool_id, None)
            if old is not None:
                old.close()
            pools[reg.pool_id] = new
        if not msg.HasField("execute"):
            return pb.ExecuteReply(status=convert.status())
        return self.run(msg.execute, pools, allow_shared=allow_shared, caller=caller)

    def Release(self, request, context):
        def body():
            self.driver.release(request.prepared_model_id, self.access.caller(context).session_id)
            return pb.ReleaseReply(status=convert.status())
        return _guard(pb.ReleaseReply, body)

    def GetPerfInfo(self, request, context):
        def body():
            entry = self.driver.get(request.prepared_model_id, self.access.caller(context).session_id)
            executions, ops = entry.perf.snapshot()
            return pb.PerfInfoReply(status=convert.status(), executions=executions, operations=[
                pb.OperationPerf(index=r.index, type=r.type, name=perf_name(r.type, r.count), executions=r.executions,
                                 total_ns=r.total_ns, backend=r.backend, count=r.count) for r in ops])
        return _guard(pb.PerfInfoReply, body)

    def ResetPerfInfo(self, request, context):
        def body():
            self.driver.get(request.prepared_model_id, self.access.caller(context).session_id).perf.reset()
            return pb.ReleaseReply(status=convert.status())
        return _guard(pb.ReleaseReply, body)


def _execute(entry: PreparedModel, request: Request, deadline, received, loop_timeout_ns: int) -> pb.ExecuteReply:
    try:
        result: ExecutionResult | None = entry.execute(request, deadline, received, loop_timeout_ns)
        status = convert.status()
        shapes = result.output_shapes
    except HalError as e:
        shapes = getattr(e, "output_shapes", None)
        if shapes is None:
            return pb.ExecuteReply(status=convert.hal_error_status(e))
        status, result = convert.hal_error_status(e), None
    reply = pb.ExecuteReply(status=status, output_shapes=[
        pb.OutputShape(dimensions=list(s.dimensions), is_sufficient=s.is_sufficient) for s in shapes])
    if result is not None:
        reply.timing.time_on_device_ns = result.time_on_device_ns
        reply.timing.time_in_driver_ns = result.time_in_driver_ns
    else:
        reply.timing.time_on_device_ns = reply.timing.time_in_driver_ns = -1
    return reply


def _nbytes(entry: PreparedModel, k: int, dims) -> int:
    return entry.compiled.output_info(k).dtype.itemsize * math.prod(dims)  # extension types included


def grpc_options() -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]


__all__ = ["DeviceServicer", "PreparedModelServicer", "MAX_MESSAGE_BYTES", "grpc_options"]
