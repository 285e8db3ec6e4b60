"""The nnhal TFLite delegate: supported nodes run on the nnhal service, the rest on TFLite's CPU.

    from delegate import load_delegate
    it = Interpreter(model_path="m.tflite", experimental_delegates=[load_delegate()])

A node is delegated when a TFLite->NNAPI mapping exists for it AND the
service's GetSupportedOperations accepts exactly that operation. Each chosen
partition becomes an NNAPI model, prepared from the compilation cache when its
token (structure + weights + options) is there; a graph delegated before on the same service is
delegated from its record (delegate.delegation_record: no probe, no conversion). If the service is unreachable
at prepare time nothing is claimed; if it fails during invoke, or does not
answer within the bound on every wait (deadline_ms plus a grace, else a default
scaled by the model's slowest execution: service.client's constants), the
partition runs in-process on hal (same kernels, same results) and reconnection
is tried later; with allow_in_process_fallback=False (TFLite's disallow_nnapi_cpu)
that invoke fails instead, with one clear error (logged once, then counted while it
repeats). A Ctrl-C is the caller's KeyboardInterrupt, never a fallback (delegate.interrupts).
With several services (a list or a ``dns:`` service_address: service.fleet) an invoke whose replica
fails is first retried once on another replica; the fallback is for when none can take it.
"""
from __future__ import annotations

import dataclasses
import logging

from delegate import capi
from delegate.background import Background
from delegate.cost import CostModel
from delegate.delegation_record import (
    DelegationRecord,
    PartitionRecord,
    fetch_record,
    graph_fingerprint,
    record_key,
    record_of,
    recordable,
    weights_digest,
)
from delegate.delegation_report import DelegationReport, NodeReport, fill_report  # noqa: F401 (re-exported)
from delegate.mapping import MappingError
from delegate.mapping.folding import fold_constants
from delegate.nnhal_kernel import (  # noqa: F401 (re-exported)
    RECONNECT_INTERVAL_S,
    NnhalKernel,
    NoFallbackError,
    in_process_driver,
)
from delegate.options import NnhalOptions
from delegate.partition import PartitionOptions, PartitionPlan, parse_node_ranges
from delegate.simple import (
    DelegateContext,
    PythonDelegate,
    SimpleDelegateInterface,
    SimpleDelegateKernel,
)
from delegate.support_probe import op_name, supported_nodes
from service import native_code
from service.client import Client, ServiceError, ServiceUnavailableError

log = logging.getLogger("nnhal.delegate")



class NnhalDelegate(SimpleDelegateInterface):
    name = "NnhalDelegate"
    expected_errors = (ValueError, MappingError, NoFallbackError)  # InvalidNnapiOperation is a MappingError
    propagate_shapes = True  # a resized input: NnhalKernel.prepare converts the partition again
    #: Always: without it TFLite prepares every node before the delegate sees the graph, fails on a
    #: CUSTOM op only an extension runs, and refuses the delegate outright for a graph with a tensor
    #: sized at run time (Keras' Flatten of a dynamic batch): the Interpreter constructor raises. With
    #: it TFLite keeps the kernels across resize_tensor_input, and PythonDelegate asks it to propagate
    #: the new shapes (RequirePropagatedShapes) so NnhalKernel.prepare converts the partition again.
    flags = capi.kTfLiteDelegateFlagsAllowDynamicTensors

    def __init__(self, options: NnhalOptions):
        from extensions.plugins import ensure_plugins_loaded
        ensure_plugins_loaded()  # installed vendor extensions: CUSTOM ops they implement can be delegated
        self.options = options
        self.partition_options = PartitionOptions(options.max_delegated_partitions,
                                                  options.min_nodes_per_partition,
                                                  parse_node_ranges(options.partitions), options.partitioning)
        #: The connected service's cost model and its capabilities as they were sent.
        self._cost: tuple[Client, CostModel, bytes] | None = None
        self.client: Client | None = None
        self.report = DelegationReport()
        self._current = self.report  # the report of the subgraph being prepared
        self._warned = False
        self.kernels: list[NnhalKernel] = []
        #: The primary subgraph's delegation record (delegate.delegation_record): its key, the record
        #: the service had (None: none, delegated afresh), the probe's answers and the kernels made.
        self._record_key: bytes | None = None
        self._record: DelegationRecord | None = None
        self._probed: dict[int, str | None] | None = None
        self._made: list[NnhalKernel] = []
        #: The connection (ticket handshake, channel, session), started now in a thread: it overlaps
        #: TFLite loading the model and the graph snapshot; the first prepare takes it (connect).
        self._early: Background | None = Background("nnhal-connect", self._connector())

    @property
    def native_invoke(self) -> bool:
        """The kernels' steady invokes may run natively (``delegate.native_invoke``): they do
        through a local burst alone (this user's service on this machine)."""
        client = self.client
        return bool(self.options.local_burst and client is not None and client.shared_memory
                    and native_code.enabled())

    # ---- service connection ---------------------------------------------------
    def _connector(self):
        """A call that connects to the service (capturing the options, not the delegate)."""
        from delegate.embedded import connect
        address, tls = self.options.service_address, self.options.tls

        def run() -> Client:
            return connect(address, **(tls.connect_kwargs() if tls else {}))
        return run

    def connect(self) -> Client | None:
        if self.client is not None:
            return self.client
        early, self._early = self._early, None
        try:
            # the early attempt's answer, unless it had already failed before this prepare (then it is
            # stale: the service may have started since): connect again
            if early is not None and not early.failed():
                self.client = early.result()
            else:
                self.client = self._connector()()
            self.report.service = self.client.address
        except ServiceUnavailableError as e:
            self.report.error = str(e)
            if not self._warned:  # logged, not warnings.warn: a warning would show a line of nnhal's source
                log.warning("nnhal delegate: %s; the model runs on TFLite's CPU kernels", e)
                self._warned = True
        return self.client

    def initialize(self, context: DelegateContext) -> bool:
        as_read = context.graph
        context.graph, _ = fold_constants(context.graph)
        report = DelegationReport(service=self.report.service)
        report.nodes = [NodeReport(n.index, op_name(n)) for n in context.graph.nodes]
        if context.subgraph:  # TFLite prepares the delegate on each subgraph in turn, the primary first
            self.report.subgraphs[context.subgraph] = report
        else:
            self.report = report
        self._current = report
        # the record's key hashes every weight: in a thread (BLAKE3 runs without the GIL) while the
        # connection is awaited and the rest of the key is hashed
        weights = Background("nnhal-fingerprint", weights_digest, as_read) \
            if context.subgraph == 0 and recordable(as_read) else None
        if self.connect() is None:
            for r in report.nodes:
                r.reason = "nnhal service unreachable"
            return False
        self.partition_options = dataclasses.replace(self.partition_options, cost=self._cost_model())
        self._record_key, self._record, self._probed, self._made = None, None, None, []
        if weights is not None and self._cost and self._cost[0] is self.client and self.client.version:
            self._record_key = record_key(graph_fingerprint(as_read, weights.result), self.options,
                                          self.options.token_salt(), self.client.version, self._cost[2])
            self._record = fetch_record(self.client, self._record_key, len(context.graph.nodes))
        return True

    def partition_record(self, context: DelegateContext, nodes, inputs, outputs) -> PartitionRecord | None:
        """The record of the partition TFLite hands a kernel, if this delegation found one."""
        if self._record is None or context.subgraph != 0:
            return None
        return self._record.partition(nodes, inputs, outputs)

    def on_delegated(self, context: DelegateContext) -> None:
        """TFLite replaced the partitions: keep a record of this delegation for the next start
        (only a complete one: every answer from the service, every partition converted, with
        operations and without constant outputs)."""
        if self._record_key is None or self._record is not None or self._probed is None or context.subgraph != 0:
            return
        record = record_of(self._probed, [k for k in self._made if not k.freed])
        client = self.client  # None: the service was lost while a kernel prepared
        if record is None or client is None:
            return
        try:
            client.put_delegation_record(self._record_key, record.encode())
        except ServiceError as e:
            log.info("delegation record not stored: %s", e)

    def _cost_model(self) -> CostModel | None:
        """The connected service's relative speeds (getCapabilities), asked once per connection;
        None if it cannot say (then "cost" partitioning keeps everything on the CPU)."""
        client = self.client
        if self._cost is None or self._cost[0] is not client:
            try:
                caps = client.get_capabilities()
            except ServiceError as e:
                log.info("capabilities unavailable: %s", e)
                return None
            local = self.options.local_burst and client.shared_memory  # TCP, another user's service: none
            self._cost = (client, CostModel.from_capabilities(caps, local_burst=local,
                                                              allow_fp16=self.options.allow_fp16),
                          caps.SerializeToString(deterministic=True))
        return self._cost[1]

    def supported_nodes(self, context: DelegateContext) -> dict[int, str | None]:
        if self._record is not None and context.subgraph == 0:
            return dict(self._record.reasons)  # what the service answered for this very graph
        reasons = supported_nodes(context.graph, self.client)
        if context.subgraph == 0:
            self._probed = reasons
        return reasons

    def on_plan(self, context: DelegateContext, plan: PartitionPlan, reasons: dict[int, str | None]) -> None:
        fill_report(self._current, plan, reasons)

    def create_kernel(self) -> SimpleDelegateKernel:
        self.kernels = [k for k in self.kernels if not k.freed]  # TFLite re-delegated (a resize): the current ones
        k = NnhalKernel(self)
        self.kernels.append(k)
        self._made.append(k)
        return k

    def fetch_backends(self) -> None:
        """Ask the service which backend runs each delegated node (its perf info records the
        compiler's assignment per NNAPI operation); one RPC per partition, so only on request."""
        reports = {0: self.report, **self.report.subgraphs}
        for k in self.kernels:
            if k.remote is None or k.subgraph not in reports:
                continue
            by_node = {r.index: r for r in reports[k.subgraph].nodes}  # the kernel's own subgraph's nodes
            try:
                info = k.remote.perf_info()
            except ServiceError as e:
                log.info("perf info unavailable: %s", e)
                continue
            assigned = {i: op.backend for op in info.operations  # a partition record covers op.count operations
                        for i in range(op.index, op.index + max(op.count, 1))}
            for node, (lo, hi) in k.node_operations.items():
                names = sorted({assigned[i] for i in range(lo, hi) if assigned.get(i)})
                if node in by_node and names:
                    by_node[node].backend = ",".join(names)




def load_delegate(service_address: str | None = None, **options) -> PythonDelegate:
    """The nnhal delegate for ``Interpreter(..., experimental_delegates=[load_delegate()])``.

    Options: max_delegated_partitions (3; 0 = unlimited), min_nodes_per_partition (1),
    partitions ("0-11,177-215"), partitioning ("cost", the default: a wholly supported graph whole,
    else only partitions estimated faster on the service than on the CPU; "cost_strict"; "largest",
    TFLite's rule: delegate.partition.PARTITIONING), cache_token, cache_dir,
    execution_preference, priority, allow_fp16, deadline_ms, loop_timeout_ms, local_burst,
    allow_in_process_fallback, accelerator_name ("nnhal"),
    tls_ca_file / tls_cert_file / tls_key_file (TLS to a HOST:PORT service_address, with a client
    certificate for mTLS); TFLite NNAPI delegate names are aliases (delegate.options.ALIASES).
    ``.report`` tells what went where.
    """
    impl = NnhalDelegate(NnhalOptions.from_kwargs(service_address=service_address, **options))
    return PythonDelegate(impl)
