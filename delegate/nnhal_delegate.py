"""The nnhal TFLite delegate: supported nodes run on the nnhal service, the rest on TFLite's CPU.

    from delegate import load_delegate
    it = Interpreter(model_path="m.tflite", experimental_delegates=[load_delegate()])

A node is delegated when a TFLite->NNAPI mapping exists for it AND the
service's GetSupportedOperations accepts exactly that operation. Each chosen
partition becomes an NNAPI model, prepared from the compilation cache when its
token (structure + weights + options) is there. If the service is unreachable
at prepare time nothing is claimed; if it fails during invoke, or does not
answer within the bound on every wait (deadline_ms plus a grace, else a default
scaled by the model's slowest execution: service.client's constants), the
partition runs in-process on hal (same kernels, same results) and reconnection
is tried later; with allow_in_process_fallback=False (TFLite's disallow_nnapi_cpu)
that invoke fails instead, with one clear error.
"""
from __future__ import annotations

import logging
import re
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

import hal
from delegate import capi
from delegate.mapping import (
    InvalidNnapiOperation,
    MappingContext,
    MappingError,
    convert_partition,
    lookup_mapper,
    map_node,
)
from delegate.mapping.core import custom_provider, lookup_custom_mapper
from delegate.mapping.folding import fold_constants
from delegate.options import NnhalOptions
from delegate.partition import PartitionOptions, PartitionPlan, parse_node_ranges
from delegate.simple import (
    DelegateContext,
    KernelParams,
    PythonDelegate,
    SimpleDelegateInterface,
    SimpleDelegateKernel,
)
from delegate.tfl.schema import builtin_name
from hal.types import ErrorStatus
from service.client import Client, ServiceError, ServiceUnavailableError
from service.token import model_token

log = logging.getLogger("nnhal.delegate")

RECONNECT_INTERVAL_S = 2.0
#: A kernel freed while the service is stopped must not hold up the Interpreter's destruction.
RELEASE_TIMEOUT_S = 5.0


@dataclass
class NodeReport:
    index: int
    op: str
    placement: str = "CPU"
    partition: int | None = None
    reason: str | None = None
    #: The service's compute backend(s) for this node's NNAPI operations (filled by
    #: NnhalDelegate.fetch_backends, e.g. for `nnhal report`).
    backend: str | None = None


@dataclass
class DelegationReport:
    nodes: list[NodeReport] = field(default_factory=list)
    partitions: list[list[int]] = field(default_factory=list)
    service: str | None = None
    error: str | None = None
    #: Other subgraphs TFLite prepared the delegate on, by subgraph index (negative: not known):
    #: those of IF / WHILE nodes left to TFLite's CPU (a delegated IF / WHILE runs its subgraphs).
    subgraphs: dict[int, DelegationReport] = field(default_factory=dict)

    @property
    def delegated(self) -> int:
        return sum(n.placement == "nnhal" for n in self.nodes)


class NoFallbackError(RuntimeError):
    """The service failed during invoke and in-process fallback is off: TFLite's invoke fails."""


class NnhalDelegate(SimpleDelegateInterface):
    name = "NnhalDelegate"
    expected_errors = (ValueError, MappingError, NoFallbackError)  # InvalidNnapiOperation is a MappingError

    def __init__(self, options: NnhalOptions):
        from extensions.registry import ensure_plugins_loaded, registered
        ensure_plugins_loaded()  # installed vendor extensions: CUSTOM ops they implement can be delegated
        # TFLite prepares every node before a delegate without kTfLiteDelegateFlagsAllowDynamicTensors
        # sees the graph, and fails on CUSTOM ops it has no kernel for. The flag has a cost: TFLite then
        # keeps our kernels across resize_tensor_input instead of re-delegating (see NnhalKernel.prepare),
        # so it is set only when an extension could claim a CUSTOM op. The delegate is created before it
        # sees the model: "could" is all it can know.
        if any(op.custom_codes for ext in registered() for op in ext.operations):
            self.flags = capi.kTfLiteDelegateFlagsAllowDynamicTensors
        self.options = options
        self.partition_options = PartitionOptions(options.max_delegated_partitions,
                                                  options.min_nodes_per_partition,
                                                  parse_node_ranges(options.partitions))
        self.client: Client | None = None
        self.report = DelegationReport()
        self._current = self.report  # the report of the subgraph being prepared
        self._warned = False
        self.kernels: list[NnhalKernel] = []

    # ---- service connection ---------------------------------------------------
    def connect(self) -> Client | None:
        if self.client is not None:
            return self.client
        from delegate.embedded import connect
        try:
            tls = self.options.tls
            self.client = connect(self.options.service_address, **(tls.connect_kwargs() if tls else {}))
            self.report.service = self.client.address
        except ServiceUnavailableError as e:
            self.report.error = str(e)
            if not self._warned:
                warnings.warn(f"nnhal delegate: {e}; the model runs on TFLite's CPU kernels", stacklevel=2)
                self._warned = True
        return self.client

    def initialize(self, context: DelegateContext) -> bool:
        context.graph, _ = fold_constants(context.graph)
        report = DelegationReport(service=self.report.service)
        report.nodes = [NodeReport(n.index, _op_name(n)) for n in context.graph.nodes]
        if context.subgraph:  # TFLite prepares the delegate on each subgraph in turn, the primary first
            self.report.subgraphs[context.subgraph] = report
        else:
            self.report = report
        self._current = report
        if self.connect() is None:
            for r in report.nodes:
                r.reason = "nnhal service unreachable"
            return False
        return True

    def supported_nodes(self, context: DelegateContext) -> dict[int, str | None]:
        return supported_nodes(context.graph, self.client)

    def on_plan(self, context: DelegateContext, plan: PartitionPlan, reasons: dict[int, str | None]) -> None:
        fill_report(self._current, plan, reasons)

    def create_kernel(self) -> SimpleDelegateKernel:
        k = NnhalKernel(self)
        self.kernels.append(k)
        return k

    def fetch_backends(self) -> None:
        """Ask the service which backend runs each delegated node (its perf info records the
        compiler's assignment per NNAPI operation); one RPC per partition, so only on request."""
        by_node = {r.index: r for r in self.report.nodes}
        for k in self.kernels:
            if k.remote is None:
                continue
            try:
                info = k.remote.perf_info()
            except ServiceError as e:
                log.info("perf info unavailable: %s", e)
                continue
            assigned = {i: op.backend for op in info.operations  # a partition record covers op.count operations
                        for i in range(op.index, op.index + max(op.count, 1))}
            for node, (lo, hi) in k.part.node_operations.items():
                names = sorted({assigned[i] for i in range(lo, hi) if assigned.get(i)})
                if node in by_node and names:
                    by_node[node].backend = ",".join(names)


def _op_name(node) -> str:
    return f"CUSTOM({node.custom_code})" if node.custom_code else builtin_name(node.builtin_code)


def supported_nodes(graph, client: Client | None) -> dict[int, str | None]:
    """Mapping check per node, then one GetSupportedOperations call for all mappable nodes."""
    reasons: dict[int, str | None] = {}
    ctx = MappingContext(graph)
    spans: dict[int, tuple[int, int]] = {}
    for node in graph.nodes:
        if node.outputs and all(graph.tensors[t].is_constant for t in node.outputs):
            reasons[node.index] = None  # folded into constants at delegation time
            continue
        if node.custom_code is not None:
            found = custom_provider(node)
            if found is None and lookup_custom_mapper(node.custom_code) is None:
                reasons[node.index] = f"no NNAPI mapping for {_op_name(node)}: no registered extension implements it"
                continue
        elif lookup_mapper(node.builtin_code) is None:
            reasons[node.index] = f"no NNAPI mapping for {_op_name(node)}"
            continue
        if node.options.get("__undecoded__"):
            reasons[node.index] = "parameters of this builtin are not read by the delegate"
            continue
        checkpoint = ctx.checkpoint()
        start = len(ctx.builder.model.main.operations)
        try:
            map_node(ctx, node)
        except InvalidNnapiOperation as e:
            ctx.rollback(checkpoint)
            reasons[node.index] = str(e)
            continue
        except MappingError as e:
            ctx.rollback(checkpoint)
            reasons[node.index] = f"no NNAPI mapping: {e}"
            continue
        except Exception as e:  # noqa: BLE001 - a mapper bug must not break delegation
            ctx.rollback(checkpoint)
            reasons[node.index] = f"mapping failed: {e!r}"
            continue
        spans[node.index] = (start, len(ctx.builder.model.main.operations))
    if not spans:
        return reasons
    # Every mapped tensor becomes an input or output so the probe model is valid on its own.
    b = ctx.builder
    written = {o for op in b.model.main.operations for o in op.outputs}
    consts = {i for i, o in enumerate(b.operands) if o.lifetime != hal.OperandLifeTime.TEMPORARY_VARIABLE}
    ins = [i for i in range(len(b.operands)) if i not in written and i not in consts]
    outs = sorted(written)
    b.identify_inputs_and_outputs(ins, outs)
    model = b.finish()
    if client is None:
        answers = hal.support_reasons(model)
    else:
        try:
            answers = client.get_support_reasons(model)
        except ServiceError as e:
            for k in spans:
                reasons[k] = f"service error: {e}"
            return reasons
    for k, (lo, hi) in spans.items():
        why = next((a for a in answers[lo:hi] if a is not None), None)
        reasons[k] = None if why is None else f"not supported by the nnhal service: {_strip_operation(why)}"
    return reasons


_OPERATION_PREFIX = re.compile(r"^operation \d+ \((.*?)\): ")  # names may hold parentheses: EXTENSION(...)


def _strip_operation(message: str) -> str:
    """hal's "operation 3 (HARD_SWISH): ..." names an index of the probe model, not a node of
    the user's graph: keep the operation's name only."""
    return _OPERATION_PREFIX.sub(r"\1: ", message, count=1)


def fill_report(report: DelegationReport, plan: PartitionPlan, reasons: dict[int, str | None]) -> None:
    report.partitions = plan.partitions
    part_of = {n: p for p, nodes in enumerate(plan.partitions) for n in nodes}
    for r in report.nodes:
        if r.index in part_of:
            r.placement, r.partition, r.reason = "nnhal", part_of[r.index], None
        else:
            r.reason = plan.rejected.get(r.index) or reasons.get(r.index) or "not supported"


class NnhalKernel(SimpleDelegateKernel):
    """One delegated partition: an NNAPI model prepared on the service."""

    def __init__(self, owner: NnhalDelegate):
        self.owner = owner
        self.remote = None
        self.burst = None
        self.local = None  # hal CompiledModel, compiled on first fallback
        self.fallbacks = 0
        self.slowest_s = 0.0  # the slowest in-process run: a re-prepared remote waits in proportion
        self._retry_at = 0.0
        self.from_cache = False
        self.prepare_s = 0.0

    def init(self, context: DelegateContext, params: KernelParams) -> None:
        # The support query validated these very nodes a moment ago (and the service validates again).
        part = convert_partition(context.graph, params.nodes, params.inputs, params.outputs, validate=False)
        part.model.relax_computation_float32_to_float16 = self.owner.options.allow_fp16
        self.part = part
        self.inputs, self.outputs = part.input_tensors, part.output_tensors
        self.input_dims = [capi.int_array(capi.tensor_at(context.ctx, t).dims) for t in self.inputs]
        o = self.owner.options
        self.token = model_token(part.model, o.token_salt(), o.token_options())
        self._prepare()

    def prepare(self, context: DelegateContext) -> None:
        """With AllowDynamicTensors, TFLite keeps this kernel when an input is resized: the partition
        was prepared for fixed shapes, so say so instead of failing obscurely at invoke."""
        for t, want in zip(self.inputs, self.input_dims):
            dims = capi.int_array(capi.tensor_at(context.ctx, t).dims)
            if dims != want:
                raise ValueError(f"input tensor {t} was resized to {dims} after delegation (the partition was "
                                 f"prepared for {want}); with CUSTOM-op support on, create a new Interpreter "
                                 f"for the new shape")

    def _prepare(self) -> None:
        client = self.owner.client
        if client is None:  # another partition lost the service meanwhile
            self.remote = None
            return
        o = self.owner.options
        kw = dict(preference=o.execution_preference, priority=o.priority)
        t0 = time.perf_counter()
        try:
            try:
                self.remote = client.prepare_model_from_cache(self.part.model, self.token, **kw)
                self.from_cache = True
            except ServiceError as e:
                if isinstance(e, ServiceUnavailableError):
                    raise
                self.remote = client.prepare_model(self.part.model, token=self.token, **kw)
                self.from_cache = False
            self.prepare_s = time.perf_counter() - t0
            self.remote.observe(self.slowest_s)  # in-process runs measured this model too
            self.burst = None
            if o.local_burst:
                try:
                    self.burst = self.remote.local_burst()
                except ServiceError as e:
                    log.info("local burst unavailable (%s); using gRPC", e)
        except ServiceUnavailableError as e:
            log.warning("nnhal service lost while preparing a partition: %s", e)
            self._lose(client)

    def eval(self, context: DelegateContext) -> None:
        inputs = [context.tensor(t) for t in self.inputs]
        outs = None
        if self.remote is not None and self.remote.client is not self.owner.client:
            self._lose(self.remote.client)  # another partition lost this connection: don't wait on it too
        if self.remote is None and time.monotonic() >= self._retry_at:
            self._reconnect()
        failure = "the nnhal service is unreachable"
        if self.remote is not None:
            timeout = self.owner.options.deadline_ms / 1e3 if self.owner.options.deadline_ms else None
            try:
                runner = self.burst if self.burst is not None else self.remote
                # Every wait is bounded (service.client: the deadline plus a grace, else a default
                # scaled by this model's slowest execution): a stopped service times out as lost.
                outs = runner.execute(inputs, timeout_s=timeout).outputs
            except ServiceError as e:
                if e.status in (ErrorStatus.MISSED_DEADLINE_TRANSIENT, ErrorStatus.MISSED_DEADLINE_PERSISTENT):
                    raise
                failure = f"the nnhal service failed during invoke ({e})"
                if self.owner.options.allow_in_process_fallback:
                    log.warning("%s; running the partition in-process", failure)
                self._lose(self.remote.client)
        if outs is None:
            if not self.owner.options.allow_in_process_fallback:
                raise NoFallbackError(f"{failure}; in-process fallback is off (disallow_nnapi_cpu)")
            outs = self._run_locally(inputs)
        for t, out in zip(self.outputs, outs):
            np.copyto(context.tensor(t), out.reshape(context.tensor(t).shape), casting="no")
        for t, value in self.part.constant_outputs.items():
            np.copyto(context.tensor(t), value.reshape(context.tensor(t).shape), casting="no")

    def _run_locally(self, inputs):
        if self.local is None:
            self.local = hal.compile_model(self.part.model)
        self.fallbacks += 1
        t0 = time.perf_counter()
        outs = hal.execute(self.local, inputs)
        self.slowest_s = max(self.slowest_s, time.perf_counter() - t0)
        return outs

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


def load_delegate(service_address: str | None = None, **options) -> PythonDelegate:
    """The nnhal delegate for ``Interpreter(..., experimental_delegates=[load_delegate()])``.

    Options: max_delegated_partitions (3; 0 = unlimited), min_nodes_per_partition (1),
    partitions ("0-11,177-215"), cache_token, cache_dir, execution_preference, priority,
    allow_fp16, deadline_ms, local_burst, allow_in_process_fallback, accelerator_name ("nnhal"),
    tls_ca_file / tls_cert_file / tls_key_file (TLS to a HOST:PORT service_address, with a client
    certificate for mTLS); TFLite NNAPI delegate names are aliases (delegate.options.ALIASES).
    ``.report`` tells what went where.
    """
    impl = NnhalDelegate(NnhalOptions.from_kwargs(service_address=service_address, **options))
    return PythonDelegate(impl)
