"""A SimpleDelegate-style framework for TFLite delegates written in Python.

Mirrors tensorflow/lite/delegates/utils/simple_delegate.h: implement
``SimpleDelegateInterface`` (name, initialize, is_node_supported,
create_kernel) and ``SimpleDelegateKernel`` (init, prepare, eval); wrap it in
``PythonDelegate`` and pass that to ``Interpreter(experimental_delegates=[...])``.
The adapter owns the ctypes plumbing: callbacks that never let an exception
escape (kTfLiteError with a message instead, a message repeated on every invoke
logged once with a count; a Ctrl-C handed to the code that called TFLite:
delegate.interrupts), references kept for the interpreter's lifetime, partition
selection by options. The graph TFLite hands it is read by delegate.live_graph.
"""
from __future__ import annotations

import ctypes as C
import logging
import sys
import traceback
import weakref
from dataclasses import dataclass

import numpy as np

from delegate import capi, interrupts
from delegate.capi import (
    DelegatePrepareFn,
    FreeFn,
    InitFn,
    NodeFn,
    TfLiteContext,
    TfLiteDelegate,
    TfLiteDelegateParams,
    TfLiteNode,
    TfLiteRegistration,
    int_array,
    kTfLiteError,
    kTfLiteOk,
)
from delegate.live_graph import (
    CorruptModelError,
    ReadableMemory,
    read_graph,
    unpreparable_nodes,
)
from delegate.native_invoke import NativeInvoke, trampoline_address
from delegate.partition import PartitionOptions, PartitionPlan, choose_partitions
from delegate.subgraphs import LiveSubgraphs, SubgraphAccessError
from delegate.tfl.graph import TfLiteGraph
from delegate.tfl.graph import TfLiteNode as GraphNode
from service.logconfig import RepeatedMessages

log = logging.getLogger("nnhal.delegate")


@dataclass
class KernelParams:
    """What TFLite hands a kernel at init: its nodes and the partition's boundary tensors."""

    nodes: list[int]      # graph node indexes (positions in the execution plan)
    inputs: list[int]     # tensor indexes
    outputs: list[int]


class SimpleDelegateKernel:
    #: The node's native invoke (``delegate.native_invoke``), given by the adapter before ``init``
    #: when the delegate asks for it (``SimpleDelegateInterface.native_invoke``): the kernel arms it.
    native_invoke: NativeInvoke | None = None

    def init(self, context: "DelegateContext", params: KernelParams) -> None:
        pass

    def prepare(self, context: "DelegateContext") -> None:
        pass

    def eval(self, context: "DelegateContext") -> None:
        raise NotImplementedError


class SimpleDelegateInterface:
    """Override these; the adapter handles TFLite."""

    name = "PythonDelegate"
    flags = capi.kTfLiteDelegateFlagsNone
    #: With AllowDynamicTensors TFLite keeps the kernels across resize_tensor_input and prepares only
    #: them (their partitions' tensors keep stale shapes). True: TFLite prepares the original nodes first
    #: (RequirePropagatedShapes) for a model with a -1 in a signature, unless a CUSTOM node it cannot
    #: prepare (no kernel for it) would make that fail.
    propagate_shapes = False
    partition_options = PartitionOptions()
    #: Exceptions that describe the model or its use, not a bug: reported in one line, no traceback.
    expected_errors: tuple[type[BaseException], ...] = (ValueError,)
    #: TFLite calls the kernels through the native trampoline (``delegate.native_invoke``), which
    #: calls ``eval`` unless the kernel armed its ``native_invoke``; False: ``eval`` always.
    native_invoke = False

    def initialize(self, context: "DelegateContext") -> bool:
        """Called once per Prepare; return False to claim nothing."""
        return True

    def supported_nodes(self, context: "DelegateContext") -> dict[int, str | None]:
        """node index -> None if supported, else the reason it is not. Default: is_node_supported."""
        return {k: self.is_node_supported(context, k) for k in range(len(context.graph.nodes))}

    def is_node_supported(self, context: "DelegateContext", node_index: int) -> str | None:
        return "not supported"

    def create_kernel(self) -> SimpleDelegateKernel:
        raise NotImplementedError

    def on_plan(self, context: "DelegateContext", plan: PartitionPlan, reasons: dict[int, str | None]) -> None:
        """Hook: the partitions chosen (for reports)."""

    def on_delegated(self, context: "DelegateContext") -> None:
        """Hook: TFLite replaced the chosen partitions with this delegate's kernels (all inited)."""


class DelegateContext:
    """The TfLiteContext as the delegate sees it: a TfLiteGraph plus tensor access."""

    def __init__(self, ctx_p: int, graph: TfLiteGraph | None = None, plan: list[int] | None = None):
        self.ctx_p = ctx_p
        self.ctx = TfLiteContext.from_address(ctx_p)
        self.graph = graph
        self.plan = plan or []
        #: The interpreter's index of this context's subgraph (0: the primary; negative: another one,
        #: on a runtime where the index cannot be read, numbered in the order TFLite prepared them).
        self.subgraph = 0
        #: In kernel prepare: the partition's own tensors have TFLite's current shapes too (else why not).
        self.shapes_propagated, self.unpropagated_reason = True, ""
        self._views: dict[int, tuple[tuple, np.ndarray]] = {}
        #: The tensor array as 64-bit words (where each tensor's data, bytes and dims are read), and
        #: per set of tensors (``arrays``): the words' positions, their last values, the views.
        self._words, self._words_at = None, (0, 0)
        self._sets: dict[tuple[int, ...], list] = {}

    def tensor(self, index: int) -> np.ndarray:
        """Zero-copy view of tensor ``index``'s current buffer.

        Views are cached per tensor and rebuilt only when TFLite moved or resized the buffer
        (data pointer, byte size or dims array changed): rebuilding costs ~8 µs, the check ~1 µs."""
        t = capi.tensor_at(self.ctx, index)
        key = (t.data, t.bytes, t.dims)
        hit = self._views.get(index)
        if hit is not None and hit[0] == key:
            return hit[1]
        view = capi.tensor_array(t)
        self._views[index] = (key, view)
        return view

    def arrays(self, indexes: tuple[int, ...]) -> list[np.ndarray]:
        """``tensor`` of each of ``indexes`` (a kernel's inputs and outputs, on every invoke): the
        same list while none of them moved or was resized, checked by reading three words per tensor."""
        ctx = self.ctx
        at = (ctx.tensors, ctx.tensors_size)
        if at != self._words_at:  # TFLite reallocated its tensors (or this is the first call)
            self._words = (C.c_uint64 * (at[1] * _TENSOR_WORDS)).from_address(at[0])
            self._words_at = at
            self._sets.clear()
        entry = self._sets.get(indexes)
        if entry is None:
            entry = self._sets[indexes] = [[i * _TENSOR_WORDS + w for i in indexes for w in _KEY_WORDS], None, None]
        words = self._words
        key = [words[p] for p in entry[0]]
        if key != entry[1]:
            entry[2] = [self.tensor(i) for i in indexes]
            entry[1] = key
        return entry[2]


#: A TfLiteTensor in 64-bit words, and the words of its data pointer, byte size and dims pointer.
_TENSOR_WORDS = C.sizeof(capi.TfLiteTensor) // 8
_KEY_WORDS = (capi.TfLiteTensor.data.offset // 8, capi.TfLiteTensor.bytes.offset // 8,
              capi.TfLiteTensor.dims.offset // 8)


def named_subgraphs(node: GraphNode) -> list[int]:
    """Subgraph indexes a control-flow node's options name (IF, WHILE: ``*_subgraph_index``)."""
    return [v for key, v in node.options.items() if key.endswith("_subgraph_index") and isinstance(v, int)]


def absorbed_subgraphs(graph: TfLiteGraph, chosen) -> set[int]:
    """Subgraphs that only the delegated nodes ``chosen`` reach (directly or through nested control
    flow): their kernels run them, so TFLite must not delegate them again. A subgraph a CPU node
    also reaches is left to TFLite (and may be delegated in part there)."""
    def reach(nodes) -> set[int]:
        seen: set[int] = set()
        stack = [k for n in nodes for k in named_subgraphs(n)]
        while stack:
            k = stack.pop()
            if k in seen:
                continue
            seen.add(k)
            try:
                stack.extend(j for n in graph.subgraph(k).nodes for j in named_subgraphs(n))
            except (LookupError, ValueError):
                pass  # not readable: only a CPU node can name it (a delegated node's were read to map it)
        return seen

    inside = set(chosen)
    mine = reach(graph.nodes[k] for k in inside)
    return mine - reach(n for n in graph.nodes if n.index not in inside) if mine else set()


class PythonDelegate:
    """The object TFLite's Python Interpreter accepts in ``experimental_delegates``."""

    def __init__(self, impl: SimpleDelegateInterface):
        self.impl = impl
        self.kernels: dict[int, tuple[SimpleDelegateKernel, DelegateContext]] = {}
        self._slots: dict[int, NativeInvoke] = {}  # each kernel's words, by their address (its handle)
        #: Each node's kernel by the node's address, as found at its prepare (cleared when any is freed).
        self._by_node: dict[int, tuple[SimpleDelegateKernel, DelegateContext]] = {}
        self.last_error: str | None = None
        self._name = impl.name.encode()  # referenced by the registration: must outlive it
        # Every callback object is kept on self: the interpreter holds raw pointers to them.
        self._prepare_cb = DelegatePrepareFn(self._delegate_prepare)
        self._init_cb = InitFn(self._kernel_init)
        self._free_cb = FreeFn(self._kernel_free)
        self._kprepare_cb = NodeFn(self._kernel_prepare)
        self._invoke_cb = NodeFn(self._kernel_invoke)
        self._invoke_address = C.cast(self._invoke_cb, C.c_void_p).value
        self._native_cb = None  # the trampoline, once a Prepare asked for it (``native_invoke``)
        interrupts.guard(self._delegate_prepare, self._kernel_init, self._kernel_free, self._kernel_prepare,
                         self._kernel_invoke)
        self._struct = TfLiteDelegate(None, self._prepare_cb, None, None, None, impl.flags, None)
        self._plans: dict[int, list[int]] = {}
        self._graphs: dict[int, TfLiteGraph] = {}
        self._unknown: dict[int, int] = {}  # context -> 0, -1, -2...: subgraphs whose index is not known
        self._subgraph_of: dict[int, int] = {}  # context -> its subgraph index (DelegateContext.subgraph)
        self._unpreparable = False  # a subgraph has a CUSTOM node TFLite cannot prepare
        # A node failing on every invoke (the service gone, fallback off) is said once, then counted.
        self._errors = RepeatedMessages(log)
        weakref.finalize(self, self._errors.flush)

    def _get_native_delegate_pointer(self) -> int:
        return C.addressof(self._struct)

    @property
    def shapes_propagated(self) -> bool:
        """Whether TFLite prepares every original node before the kernels: always without
        AllowDynamicTensors (it re-delegates on resize), else when RequirePropagatedShapes is set."""
        f = self._struct.flags
        return not f & capi.kTfLiteDelegateFlagsAllowDynamicTensors or bool(
            f & capi.kTfLiteDelegateFlagsRequirePropagatedShapes)

    @property
    def unpropagated_reason(self) -> str:
        return ("" if self.shapes_propagated else "the model has a CUSTOM op TFLite cannot prepare (only an "
                "extension runs it)" if self._unpreparable else "not asked for")

    def _request_propagated_shapes(self, ctx_p: int, graph: TfLiteGraph, plan: list[int]) -> None:
        """Set RequirePropagatedShapes unless this or an earlier subgraph has a node TFLite cannot
        prepare: any input may be resized (a -1 batch, or a user's resize_tensor_input of a fixed one),
        and the kernels then need the new shapes. TFLite reads the flags when it prepares (after every
        subgraph was delegated), from this struct: the last subgraph's answer holds for all."""
        if not (self.impl.propagate_shapes and self.impl.flags & capi.kTfLiteDelegateFlagsAllowDynamicTensors):
            return
        self._unpreparable = self._unpreparable or bool(unpreparable_nodes(ctx_p, plan))
        if not self._unpreparable:
            self._struct.flags |= capi.kTfLiteDelegateFlagsRequirePropagatedShapes
        else:
            self._struct.flags &= ~capi.kTfLiteDelegateFlagsRequirePropagatedShapes

    @property
    def report(self):
        """The implementation's delegation report (what ran where, and why not)."""
        return getattr(self.impl, "report", None)

    def _fail(self, where: str) -> int:
        """Record and log the exception being handled: the impl's ``expected_errors`` (a corrupted
        file, a resized input, a node it cannot map) in one line; anything else is a bug in the
        delegate and keeps its traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, self.impl.expected_errors):
            self.last_error = f"{self.impl.name} {where}: {exc}"
        else:
            self.last_error = f"{self.impl.name} {where}: {traceback.format_exc(limit=8)}"
        self._errors.log(self.last_error)
        return kTfLiteError

    @staticmethod
    def _interrupted(status: int | None) -> int | None:
        """Ctrl-C landed in a callback (KeyboardInterrupt): fail it with ``status``, quietly (no log
        line, no last_error: nothing went wrong); the Python code that called into TFLite gets the
        KeyboardInterrupt when TFLite returns to it (delegate.interrupts)."""
        interrupts.reraise_in_caller(sys._getframe(1))
        return status

    # ---- TfLiteDelegate::Prepare --------------------------------------------
    def _delegate_prepare(self, ctx_p: int, delegate_p: int) -> int:
        subgraphs = None
        try:
            memory = ReadableMemory()  # one read of this process's mappings for both
            subgraphs = LiveSubgraphs(ctx_p, lambda p: read_graph(p)[0], memory.readable)
            graph, plan = read_graph(ctx_p, memory)
            self._request_propagated_shapes(ctx_p, graph, plan)
            graph.subgraphs = subgraphs  # IF / WHILE mappers read the subgraphs they name from here
            context = DelegateContext(ctx_p, graph, plan)
            try:
                context.subgraph = subgraphs.access.index
            except SubgraphAccessError:  # a runtime whose layout is not known: control flow stays on CPU,
                # and TFLite prepares the delegate on each subgraph in turn, the primary first
                context.subgraph = self._unknown.setdefault(ctx_p, -len(self._unknown))
            self._subgraph_of[ctx_p] = context.subgraph
            if not self.impl.initialize(context):
                return kTfLiteOk
            graph = context.graph  # initialize may rewrite it (e.g. constant folding)
            reasons = self.impl.supported_nodes(context)
            supported = {k for k, why in reasons.items() if why is None}
            chosen = choose_partitions(graph, supported, self.impl.partition_options)
            self.impl.on_plan(context, chosen, reasons)
            if not chosen.nodes:
                return kTfLiteOk
            self._plans[ctx_p] = plan
            reg = TfLiteRegistration()
            reg.init, reg.free = self._init_cb, self._free_cb
            reg.prepare, reg.invoke = self._kprepare_cb, self._invoke_cb
            if self.impl.native_invoke:
                if self._native_cb is None and (address := trampoline_address()) is not None:
                    self._native_cb = NodeFn(address)
                if self._native_cb is not None:
                    reg.invoke = self._native_cb
            reg.builtin_code = capi.kTfLiteBuiltinDelegate
            reg.custom_name = self._name
            reg.version = 1
            nodes = capi.make_int_array(sorted(plan[k] for k in chosen.nodes))
            ctx = context.ctx
            self._graphs[ctx_p] = graph  # kernels convert their nodes from this snapshot
            status = ctx.ReplaceNodeSubsetsWithDelegateKernels(ctx_p, reg, C.addressof(nodes), delegate_p)
            if status == kTfLiteOk:
                self.impl.on_delegated(context)
            absorbed = absorbed_subgraphs(graph, chosen.nodes) if status == kTfLiteOk else set()
            for k in sorted(absorbed):  # read (so accessible) when their node was mapped
                subgraphs.access.mark_skippable(k)
            return status
        except CorruptModelError as e:
            # The model's fault, not the delegate's: one line, no traceback. Failing (rather than
            # claiming nothing) stops the app before TFLite's own kernels trip on the same damage.
            self.last_error = f"{self.impl.name}: corrupted model: {e}"
            self._errors.log(self.last_error)
            return kTfLiteError
        except KeyboardInterrupt:
            return self._interrupted(kTfLiteError)
        except Exception:  # noqa: BLE001
            return self._fail("Prepare")
        finally:
            if subgraphs is not None:
                subgraphs.close()  # TFLite forbids acquiring subgraph contexts once Prepare returns

    # ---- kernel callbacks -----------------------------------------------------
    def _kernel_init(self, ctx_p: int, buffer: int, length: int) -> int | None:
        self._by_node.clear()
        try:
            params = TfLiteDelegateParams.from_address(buffer)
            plan = self._plans.get(ctx_p, [])
            position = {ni: k for k, ni in enumerate(plan)}
            nodes = [position[n] for n in int_array(params.nodes_to_replace)]
            kp = KernelParams(nodes, [t for t in int_array(params.input_tensors) if t >= 0],
                              [t for t in int_array(params.output_tensors) if t >= 0])
            context = DelegateContext(ctx_p, self._graphs[ctx_p], plan)
            context.subgraph = self._subgraph_of.get(ctx_p, 0)
            kernel = self.impl.create_kernel()
            # The node's user_data: the address of its words, which the trampoline reads.
            slot = NativeInvoke(self._invoke_address)
            if self._native_cb is not None and self.impl.native_invoke:  # TFLite calls the trampoline
                kernel.native_invoke = slot
            kernel.init(context, kp)
            self.kernels[slot.address] = (kernel, context)
            self._slots[slot.address] = slot
            return slot.address
        except KeyboardInterrupt:
            return self._interrupted(None)
        except Exception:  # noqa: BLE001
            self._fail("kernel init")
            return None  # TFLite then fails the delegation with a clear error

    def _kernel_free(self, ctx_p: int, user_data: int) -> None:
        self._by_node.clear()  # a node's address may hold another kernel next
        try:
            slot = self._slots.pop(user_data or 0, None)
            if slot is not None:
                slot.disarm()
            entry = self.kernels.pop(user_data or 0, None)
            if entry is not None and hasattr(entry[0], "free"):
                entry[0].free()
        except KeyboardInterrupt:
            self._interrupted(None)
        except Exception:  # noqa: BLE001
            self._fail("kernel free")

    def _kernel(self, node_p: int) -> tuple[SimpleDelegateKernel, DelegateContext]:
        handle = TfLiteNode.from_address(node_p).user_data
        entry = self.kernels.get(handle or 0)
        if entry is None:
            raise RuntimeError(f"no kernel for handle {handle}")
        self._by_node[node_p] = entry
        return entry

    def _kernel_prepare(self, ctx_p: int, node_p: int) -> int:
        try:
            kernel, context = self._kernel(node_p)
            context.shapes_propagated, context.unpropagated_reason = self.shapes_propagated, self.unpropagated_reason
            kernel.prepare(context)
            return kTfLiteOk
        except KeyboardInterrupt:
            return self._interrupted(kTfLiteError)
        except Exception:  # noqa: BLE001
            return self._fail("kernel prepare")

    def _kernel_invoke(self, ctx_p: int, node_p: int) -> int:
        try:
            # the node's kernel as its prepare found it (a node keeps its user_data until freed)
            kernel, context = self._by_node.get(node_p) or self._kernel(node_p)
            kernel.eval(context)
            return kTfLiteOk
        except KeyboardInterrupt:
            return self._interrupted(kTfLiteError)
        except Exception:  # noqa: BLE001 - an exception must never cross the C boundary
            return self._fail("kernel eval")


__all__ = ["PythonDelegate", "SimpleDelegateInterface", "SimpleDelegateKernel", "DelegateContext",
           "KernelParams", "read_graph", "CorruptModelError", "absorbed_subgraphs"]
