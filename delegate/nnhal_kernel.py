"""The nnhal delegate's kernel: one delegated partition, prepared on the service (from the
compilation cache when its token is there), executed through its local burst or gRPC, and run
in-process on hal when the service fails (delegate.nnhal_delegate says when and how)."""
from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from delegate import capi
from delegate.delegation_record import PartitionRecord
from delegate.mapping import MappingError, convert_partition
from delegate.mapping.shape_inference import convert_with_inferred_shapes
from delegate.native_invoke import DONE, NOT_CALLED
from delegate.simple import DelegateContext, KernelParams, SimpleDelegateKernel
from hal.errors import HalError
from hal.types import ErrorStatus
from service import native_burst
from service.client import Client, ServiceError, ServiceUnavailableError
from service.driver import Driver
from service.token import model_token

log = logging.getLogger("nnhal.delegate")

RECONNECT_INTERVAL_S = 2.0
#: A kernel freed while the service is stopped must not hold up the Interpreter's destruction.
RELEASE_TIMEOUT_S = 5.0


_in_process: Driver | None = None


def in_process_driver() -> Driver:
    """The driver the in-process fallback prepares on: no cache, no sessions, no transport."""
    global _in_process
    if _in_process is None:
        _in_process = Driver()
    return _in_process


class NoFallbackError(RuntimeError):
    """The service failed during invoke and in-process fallback is off: TFLite's invoke fails."""


class NnhalKernel(SimpleDelegateKernel):
    """One delegated partition: an NNAPI model prepared on the service. ``owner``: the
    NnhalDelegate that made it (its options, its connection, its delegation record)."""

    def __init__(self, owner):
        self.owner = owner
        self.remote = None
        self.burst = None
        self._reopen_burst = False  # a Ctrl-C closed the local burst: open another at the next eval
        self.local = None  # service.execution.PreparedModel, in-process, prepared on the first fallback
        self.fallbacks = 0
        self.slowest_s = 0.0  # the slowest in-process run: a re-prepared remote waits in proportion
        self._retry_at = 0.0
        self.from_cache = False
        self.prepare_s = 0.0
        self.freed = False
        self.subgraph = 0  # the TFLite subgraph whose nodes this partition holds (set by init)
        self._part = None  # the converted partition (None: taken from a delegation record, converted on use)

    def init(self, context: DelegateContext, params: KernelParams) -> None:
        self.graph, self.params = context.graph, params
        self.subgraph = context.subgraph  # node indexes in params are this subgraph's
        record = self.owner.partition_record(context, params.nodes, params.inputs, params.outputs)
        if record is not None:
            self._from_record(record)
        else:
            # The support query validated these very nodes a moment ago (and the service validates again).
            self._convert(context.graph, validate=False)
        self.dims = {t: d for t, (d, _) in self._live_shapes(context).items()}  # what the partition is built for
        self._prepare()

    def _convert(self, graph, validate: bool, infer_shapes: bool = False) -> None:
        p = self.params
        if infer_shapes:  # only the inputs' shapes are trusted: the others are inferred by hal
            part = convert_with_inferred_shapes(convert_partition, graph, p.nodes, p.inputs, p.outputs, validate)
        else:
            part = convert_partition(graph, p.nodes, p.inputs, p.outputs, validate=validate)
        part.model.relax_computation_float32_to_float16 = self.owner.options.allow_fp16
        self._part = part
        self.inputs, self.outputs = part.input_tensors, part.output_tensors
        self.state_tensors, self.node_operations = part.state_tensors, part.node_operations
        self.constant_outputs, self.io_model = part.constant_outputs, part.model
        self.folded_only = not part.model.main.operations
        self._bind_io()
        o = self.owner.options
        self.token = model_token(part.model, o.token_salt(), o.token_options())  # hashes the shapes too

    def _from_record(self, r: PartitionRecord) -> None:
        """What the cold start converted (a record has operations and no constant outputs)."""
        self.inputs, self.outputs = r.input_tensors, r.output_tensors
        self.state_tensors, self.node_operations = r.state_tensors, r.node_operations
        self.constant_outputs, self.io_model, self.folded_only = {}, r.io_model, False
        self._bind_io()
        self.token = r.token

    @property
    def part(self):
        """The converted partition (converted now if it came from a delegation record: a cache
        miss, an in-process fallback, a tool reading it)."""
        if self._part is None:
            if self.graph is None:
                raise RuntimeError("the partition's kernel was freed (its Interpreter is gone): nothing to convert")
            self._convert(self.graph, validate=False)
        return self._part

    def _live_shapes(self, context: DelegateContext) -> dict[int, tuple[tuple[int, ...], bool]]:
        """The interpreter's current (dims, sized-at-run-time) of every non-constant tensor the
        partition's nodes read or write."""
        tensors = {t for n in self.params.nodes for t in (*self.graph.nodes[n].inputs, *self.graph.nodes[n].outputs)
                   if t >= 0 and not self.graph.tensors[t].is_constant}
        live = {}
        for t in sorted(tensors):
            ct = capi.tensor_at(context.ctx, t)
            live[t] = (tuple(capi.int_array(ct.dims)), ct.allocation_type == capi.kTfLiteDynamic)
        return live

    def prepare(self, context: DelegateContext) -> None:
        """TFLite prepares the kernel on every allocate_tensors. Without AllowDynamicTensors a resize
        re-delegates (this kernel is freed, a new one converts the new shapes); with it TFLite keeps
        this kernel, and the shapes it propagated through the original nodes (context.shapes_propagated)
        are converted again here and prepared on the service, the old prepared model released.

        TFLite stops propagating at a node it sizes only when it runs (a RESHAPE to a computed shape,
        Keras' Flatten of a dynamic batch): the tensors after it keep stale dims. So only the partition
        inputs' shapes are taken from TFLite; the rest are inferred by hal (convert_with_inferred_shapes,
        which folds SHAPE arithmetic again for the new shapes), and the partition's outputs are resized
        to them here, as a kernel's Prepare resizes its outputs."""
        live = self._live_shapes(context)
        dims = {t: d for t, (d, _) in live.items()}
        # Dimensions only: a tensor inside the partition that TFLite sizes at run time (kTfLiteDynamic)
        # but whose shape the partition was built for as it stands runs as before.
        if dims == self.dims:
            return
        if not context.shapes_propagated:
            for t in self.inputs:
                if dims[t] != self.dims[t]:
                    raise ValueError(f"input tensor {t} was resized to {list(dims[t])} after delegation (the "
                                     f"partition was prepared for {list(self.dims[t])}), and TFLite does not "
                                     f"propagate the new shape to the delegate: {context.unpropagated_reason}; "
                                     f"create a new Interpreter for the new shape")
            return
        tensors = list(self.graph.tensors)
        for t, (d, runtime) in live.items():
            # A partition input TFLite sizes at run time (a data-dependent shape from a CPU node) has its
            # current shape now: TFLite prepares the nodes after the one that resized it. Inside the
            # partition such a shape is unknown (its producer has not run): refused.
            runtime = runtime and t not in self.params.inputs
            tensors[t] = dataclasses.replace(tensors[t], shape=d, runtime_shape=runtime)
        graph = dataclasses.replace(self.graph, tensors=tensors)
        try:
            self._convert(graph, validate=True, infer_shapes=True)  # new shapes: hal's rules are checked again
        except MappingError as e:
            raise MappingError(f"the partition of nodes {self.params.nodes} cannot run at the resized shapes: "
                               f"{e}") from None
        self._resize_outputs(context)
        self.graph = graph
        self.dims = {t: d for t, (d, _) in self._live_shapes(context).items()}  # outputs resized now
        log.info("partition of nodes %s converted again for resized shapes", self.params.nodes)
        self._release()  # the prepared model of the old shapes
        self.local = None
        self._prepare()

    def _resize_outputs(self, context: DelegateContext) -> None:
        """Give TFLite's partition outputs the shapes the converted partition computes (those
        after a node TFLite sizes at run time are stale in TFLite)."""
        main = self.part.model.main
        want = {t: tuple(main.operands[i].dimensions) for t, i in zip(self.outputs, main.output_indexes)}
        want.update({t: tuple(v.shape) for t, v in self.part.constant_outputs.items()})
        for t, dims in want.items():
            have = tuple(capi.int_array(capi.tensor_at(context.ctx, t).dims))
            if have != dims and not (have == () and dims == (1,)):  # a scalar stays one (scalars.py)
                capi.resize_tensor(context.ctx_p, t, dims)

    def _prepare(self) -> None:
        client = self.owner.client
        if client is None or self.folded_only:  # another partition lost the service meanwhile; or nothing to run
            self.remote = None
            return
        o = self.owner.options
        kw = dict(preference=o.execution_preference, priority=o.priority)
        local = o.local_burst and client.shared_memory  # a memfd and a socket only the service's user reaches
        t0 = time.perf_counter()
        try:
            try:  # the local burst opened in the same call
                self.remote = client.prepare_model_from_cache(self.io_model, self.token, local_burst=local, **kw)
                self.from_cache = True
            except ServiceError as e:
                if isinstance(e, ServiceUnavailableError):
                    raise
                model = self.part.model  # converted now if it came from a record (its token too)
                self.remote = client.prepare_model(model, token=self.token, **kw)
                self.from_cache = False
            self.prepare_s = time.perf_counter() - t0
            self.remote.observe(self.slowest_s)  # in-process runs measured this model too
            self.burst = None
            if local:
                self._open_local_burst()
        except ServiceUnavailableError as e:
            log.warning("nnhal service lost while preparing a partition: %s", e)
            self._lose(client)

    def _open_local_burst(self) -> None:
        try:
            self.burst = self.remote.local_burst()
            if self.native_invoke is not None:
                native_burst.steady_address()  # compiled now (once per process), not in an invoke
        except ServiceError as e:
            log.info("local burst unavailable (%s); using gRPC", e)
        self._reopen_burst = False  # unless a Ctrl-C interrupted this too

    def eval(self, context: DelegateContext) -> None:
        # What the native invoke did before handing this one to Python (NOT_CALLED: nothing; else
        # the local burst's answer for a request it posted: this eval collects that reply).
        native = self.native_invoke.take() if self.native_invoke is not None else NOT_CALLED
        if self.folded_only:
            for t, value in self.constant_outputs.items():
                np.copyto(context.tensor(t), value.reshape(context.tensor(t).shape), casting="no")
            return
        inputs, outputs = self._arrays(context)
        done = False
        if self.remote is not None and self.remote.client is not self.owner.client:
            self._lose(self.remote.client)  # another partition lost this connection: don't wait on it too
        if self.remote is None and time.monotonic() >= self._retry_at:
            self._reconnect()
        failure = "the nnhal service is unreachable"
        if self.remote is not None:
            o = self.owner.options
            if self._reopen_burst and self.burst is None:
                self._open_local_burst()
            runner = self.burst if self.burst is not None else self.remote
            timeouts = dict(timeout_s=o.deadline_ms / 1e3 if o.deadline_ms else None,
                            loop_timeout_s=o.loop_timeout_ms / 1e3 if o.loop_timeout_ms else None)
            try:
                # Every wait is bounded (service.client: the deadline plus a grace, else a default
                # scaled by this model's slowest execution): a stopped service times out as lost.
                resumed = None  # the reply to the request the native invoke posted
                if native > DONE and runner is self.burst:
                    resumed = runner.resume_native(native, outputs, **timeouts)
                if resumed is None:
                    runner.execute(inputs, outputs, **timeouts)
                done = True
                if runner is self.burst and self.native_invoke is not None and not self.constant_outputs:
                    armed = runner.arm_native(inputs, outputs, **timeouts)
                    if armed is not None:
                        self.native_invoke.arm(context.ctx, self._io_tensors, *armed, same=self._io_from)
            except ServiceError as e:
                if e.status in (ErrorStatus.MISSED_DEADLINE_TRANSIENT, ErrorStatus.MISSED_DEADLINE_PERSISTENT):
                    raise
                failure = f"the nnhal service failed during invoke ({e})"
                if self.owner.options.allow_in_process_fallback:
                    log.warning("%s; running the partition in-process", failure)
                self._lose(self.remote.client)
            except KeyboardInterrupt:  # Ctrl-C: not a service failure, so no fallback (delegate.interrupts)
                if runner is self.burst:  # its request may still be answered into its slots: never reused
                    self._close_burst()
                    self.burst, self._reopen_burst = None, True
                raise
        if not done:
            if not self.owner.options.allow_in_process_fallback:
                raise NoFallbackError(f"{failure}; in-process fallback is off (disallow_nnapi_cpu)")
            self._run_locally(inputs, outputs)
        for t, value in self.constant_outputs.items():
            np.copyto(context.tensor(t), value.reshape(context.tensor(t).shape), casting="no")

    def _bind_io(self) -> None:
        """The TFLite tensors ``_arrays`` reads: inputs, outputs, then LSTM/RNN state."""
        self._io_tensors = (*self.inputs, *self.outputs, *self.state_tensors)
        self._io_from, self._io = None, ([], [])

    def _arrays(self, context: DelegateContext) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The partition's input and output tensors (LSTM/RNN state last), the same lists while
        TFLite keeps their buffers. A rank-0 input is an NNAPI [1] tensor (delegate.mapping.scalars);
        every result is written once, straight into its TFLite tensor (reshaped to it), whichever
        path computed it."""
        io = context.arrays(self._io_tensors)
        if io is not self._io_from:
            n = len(self.inputs)
            self._io = ([x.reshape(1) if x.ndim == 0 else x for x in io[:n]], io[n:])
            self._io_from = io
        return self._io

    def _run_locally(self, inputs, outputs) -> None:
        """The partition on an in-process prepared model: the service's own execution path
        (``service.execution``) without a transport, compiled on the first fallback."""
        o = self.owner.options
        self.fallbacks += 1
        t0 = time.perf_counter()
        loop_ms = o.loop_timeout_ms
        try:
            if self.local is None:
                self.local = in_process_driver().prepare(self.part.model, o.execution_preference, o.priority, None)
            self.local.execute_arrays(inputs, outputs, loop_timeout_ns=int(loop_ms * 1e6) if loop_ms else 0)
        except HalError as e:
            raise ValueError(f"in-process fallback: {e.message}") from None
        self.slowest_s = max(self.slowest_s, time.perf_counter() - t0)

    def _lose(self, client: Client) -> None:
        """The service connection is lost for this partition (dead, or silent past the bound): drop
        the prepared model and its burst (a burst that timed out has closed itself already) and
        retry after RECONNECT_INTERVAL_S."""
        self._close_burst()
        self.remote = self.burst = None
        if self.owner.client is client:
            self.owner.client = None
            # Closing the connection ends its session: a service that was only stopped or slow
            # releases this client's models when it resumes, instead of holding them forever.
            client.close()
        self._retry_at = time.monotonic() + RECONNECT_INTERVAL_S

    def _reconnect(self) -> None:
        self._retry_at = time.monotonic() + RECONNECT_INTERVAL_S
        if self.owner.connect() is not None:
            self._prepare()

    def free(self) -> None:
        """TFLite frees the kernel (the Interpreter is gone): release the prepared model on the
        service now, not when the whole client goes."""
        self.freed = True  # e.g. a resize undid the delegation: the next kernel created drops this one
        self._release()
        # The graph snapshot's constants are views of the Interpreter's buffers, unmapped once it is
        # gone: the snapshot is dropped, and a constant output (possibly such a view) copied. A converted
        # partition's model owns its bytes (ModelBuilder.finish joins them): tools read it after the run.
        self.graph = None
        self.constant_outputs = {t: np.array(v) for t, v in self.constant_outputs.items()}
        if self._part is not None:
            self._part.constant_outputs = self.constant_outputs

    def _release(self) -> None:
        self._close_burst()
        remote, self.remote, self.burst = self.remote, None, None
        if remote is not None:
            try:
                remote.release(timeout_s=RELEASE_TIMEOUT_S)
            except ServiceError as e:  # a lost service released it already, or will with the session
                log.info("releasing a prepared model failed: %s", e)

    def _close_burst(self) -> None:
        if self.burst is not None:
            try:
                self.burst.close()
            except (OSError, BufferError):
                pass
