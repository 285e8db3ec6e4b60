"""The interpreter's other subgraphs (IF branches, WHILE cond/body), seen from a delegate's Prepare.

TfLiteContext's AcquireSubgraphContext / ReleaseSubgraphContext (TFLite >= 2.13, usable only while
a delegate prepares) give another subgraph's context in delegate mode: its plan, nodes and tensors
read exactly as the delegate reads its own. Two things TFLite's C API does not give a delegate:

- a subgraph's input and output tensor indexes (what an IF or WHILE passes to it and gets back);
- MarkSubgraphAsDelegationSkippable, a C++ member of tflite::Subgraph in TFLite 2.14, which a
  delegate calls for the subgraphs of a control-flow node it runs whole: TFLite would otherwise
  prepare the delegate on those subgraphs too, and delegate them a second time (experiment: a
  model with a WHILE gets one Prepare per subgraph, and only one once cond and body are marked).

Both come from the tflite::Subgraph behind ``context->impl_``, at offsets read from the runtime
build's exported code (``SetInputs``, ``SetOutputs``, ``AcquireSubgraphContext``,
``MarkSubgraphAsDelegationSkippable``). Every read is checked for consistency first (the context
lies inside its Subgraph where expected; that Subgraph is in its own subgraph list; vectors are
well formed, in readable memory, and hold valid tensor indexes). On a runtime whose layout is not
known here nothing is read, and control flow stays on TFLite's CPU kernels.
"""
from __future__ import annotations

import ctypes as C
import os
from dataclasses import dataclass
from typing import Callable

from delegate import capi


@dataclass(frozen=True)
class SubgraphLayout:
    """Where tflite::Subgraph keeps what a delegate needs (x86-64 byte offsets)."""

    context: int  # TfLiteContext context_
    inputs: int  # std::vector<int> inputs_
    outputs: int  # std::vector<int> outputs_
    subgraphs: int  # std::vector<std::unique_ptr<Subgraph>>* subgraphs_
    mark_skippable: str  # mangled Subgraph::MarkSubgraphAsDelegationSkippable(int)


#: (runtime package, version) -> layout. tflite_runtime 2.14.0 (manylinux x86-64), from its
#: disassembly: SetInputs/SetOutputs store at +0x128/+0x140, AcquireSubgraphContext reads the
#: subgraph list at +0x240 and reports errors through the context at +0x28.
LAYOUTS = {
    ("tflite_runtime", "2.14.0"): SubgraphLayout(0x28, 0x128, 0x140, 0x240,
                                                  "_ZN6tflite8Subgraph33MarkSubgraphAsDelegationSkippableEi"),
}

AcquireFn = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int, C.POINTER(C.c_void_p))
ReleaseFn = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int)
MAX_SUBGRAPHS = 1 << 16


class SubgraphAccessError(LookupError):
    """Another subgraph cannot be read from here (unknown runtime layout, bad index, odd memory)."""


def _runtime() -> tuple[tuple[str, str], str] | None:
    """((package, version), path of its interpreter library) of the TFLite runtime in use."""
    from delegate.runtime import RUNTIME
    try:
        pkg = __import__(RUNTIME)
    except ImportError:
        return None
    version = getattr(pkg, "__version__", "")
    lib = os.path.join(os.path.dirname(pkg.__file__), "_pywrap_tensorflow_interpreter_wrapper.so")
    return (RUNTIME, version), lib


_LAYOUT: tuple[SubgraphLayout, Callable[[int, int], int] | None] | None | bool = False


def layout() -> tuple[SubgraphLayout, Callable[[int, int], int] | None] | None:
    """This runtime's layout and its MarkSubgraphAsDelegationSkippable, or None if not known."""
    global _LAYOUT
    if _LAYOUT is False:
        _LAYOUT = None
        found = _runtime()
        if found is not None and found[0] in LAYOUTS:
            lay = LAYOUTS[found[0]]
            mark = None
            try:
                fn = getattr(C.CDLL(found[1]), lay.mark_skippable)
                fn.argtypes, fn.restype = [C.c_void_p, C.c_int], C.c_int
                mark = fn
            except (OSError, AttributeError):
                pass
            _LAYOUT = (lay, mark)
    return _LAYOUT


def _word(addr: int) -> int:
    return C.c_void_p.from_address(addr).value or 0


class SubgraphAccess:
    """The tflite::Subgraph behind a context being prepared (checked against the known layout)."""

    def __init__(self, ctx_p: int, readable: Callable[[int, int], bool]):
        found = layout()
        if found is None:
            raise SubgraphAccessError("this TFLite runtime's subgraph layout is not known to the delegate")
        self.layout, self._mark = found
        self.ctx_p = ctx_p
        self.readable = readable
        self.impl = capi.TfLiteContext.from_address(ctx_p).impl_ or 0
        if self.impl + self.layout.context != ctx_p:
            raise SubgraphAccessError("the context is not where this runtime's Subgraph keeps it")
        self.all = self._subgraph_list()
        if self.impl not in self.all:
            raise SubgraphAccessError("the context's Subgraph is not in its own subgraph list")

    def _vector(self, at: int, width: int, limit: int) -> list[int]:
        """A std::vector (begin, end, capacity pointers) of ``width``-byte elements."""
        if not self.readable(at, 24):
            raise SubgraphAccessError("subgraph vector outside readable memory")
        begin, end, cap = _word(at), _word(at + 8), _word(at + 16)
        if begin == end:
            return []
        if not (begin <= end <= cap) or (end - begin) % width or (end - begin) // width > limit \
                or not self.readable(begin, end - begin):
            raise SubgraphAccessError("malformed subgraph vector")
        n = (end - begin) // width
        kind = C.c_int if width == 4 else C.c_void_p
        return [v or 0 for v in (kind * n).from_address(begin)]

    def _subgraph_list(self) -> list[int]:
        holder = _word(self.impl + self.layout.subgraphs)
        if not holder:
            raise SubgraphAccessError("the Subgraph has no subgraph list")
        return self._vector(holder, 8, MAX_SUBGRAPHS)

    @property
    def index(self) -> int:
        """This context's subgraph index in the interpreter (0: the primary subgraph)."""
        return self.all.index(self.impl)

    def io(self, ctx_p: int) -> tuple[list[int], list[int]]:
        """Input and output tensor indexes of the subgraph whose context is ``ctx_p`` (-1: an input
        TFLite found unused and dropped, as it does in IF/WHILE subgraphs)."""
        impl = ctx_p - self.layout.context
        if impl not in self.all:
            raise SubgraphAccessError("not a context of this interpreter's subgraphs")
        n = capi.TfLiteContext.from_address(ctx_p).tensors_size
        ins = self._vector(impl + self.layout.inputs, 4, n)
        outs = self._vector(impl + self.layout.outputs, 4, n)
        if any(not -1 <= t < n for t in ins) or any(not 0 <= t < n for t in outs):
            raise SubgraphAccessError("subgraph inputs/outputs out of range")
        return ins, outs

    def mark_skippable(self, index: int) -> bool:
        """TFLite will not prepare delegates on subgraph ``index`` (a control-flow node the delegate
        runs whole owns it). False when this runtime cannot."""
        if self._mark is None or not 0 < index < len(self.all):
            return False
        return self._mark(self.impl, index) == capi.kTfLiteOk


class LiveSubgraphs:
    """TfLiteGraph.subgraphs for a context being prepared: subgraph k read on first use (acquired,
    read with ``read(ctx_p) -> TfLiteGraph``, released). Valid only during that Prepare: ``close``
    it when Prepare ends, since TFLite forbids acquiring contexts afterwards."""

    def __init__(self, ctx_p: int, read: Callable[[int], object], readable: Callable[[int, int], bool]):
        self.ctx_p = ctx_p
        self._read = read
        self._readable = readable
        self.graphs: dict[int, object] = {}
        self.contexts: dict[int, int] = {}  # subgraph index -> its context
        self._access: SubgraphAccess | None = None
        self._error: str | None = None
        self.closed = False

    @property
    def access(self) -> SubgraphAccess:
        if self._access is None:
            if self._error is not None:
                raise SubgraphAccessError(self._error)
            try:
                self._access = SubgraphAccess(self.ctx_p, self._readable)
            except SubgraphAccessError as e:
                self._error = str(e)
                raise
        return self._access

    def __len__(self) -> int:
        return len(self.access.all)

    def __getitem__(self, k: int):
        if k in self.graphs:
            return self.graphs[k]
        if self.closed:
            raise SubgraphAccessError(f"subgraph {k} was not read while the delegate prepared")
        access = self.access
        if not 0 <= k < len(access.all):
            raise IndexError(k)
        ctx = capi.TfLiteContext.from_address(self.ctx_p)
        acquired = C.c_void_p()
        if AcquireFn(ctx.AcquireSubgraphContext)(self.ctx_p, k, C.byref(acquired)) != capi.kTfLiteOk \
                or not acquired.value:
            raise SubgraphAccessError(f"TFLite refused to give subgraph {k}'s context")
        try:
            graph = self._read(acquired.value)
            graph.inputs, graph.outputs = access.io(acquired.value)
        finally:
            ReleaseFn(ctx.ReleaseSubgraphContext)(self.ctx_p, k)
        graph.subgraphs = self
        self.graphs[k] = graph
        self.contexts[k] = acquired.value
        return graph

    def close(self) -> None:
        self.closed = True
