"""The interpreter's other subgraphs (IF branches, WHILE cond/body), seen from a delegate's Prepare.

TfLiteContext's AcquireSubgraphContext / ReleaseSubgraphContext (TFLite >= 2.13, usable only while
a delegate prepares) give another subgraph's context in delegate mode: its plan, nodes and tensors
read exactly as the delegate reads its own. Two things TfLiteContext does not give a delegate:

- a subgraph's input and output tensor indexes (what an IF or WHILE passes to it and gets back);
- marking a subgraph delegation-skippable, which a delegate does for the subgraphs of a
  control-flow node it runs whole: TFLite would otherwise prepare the delegate on those subgraphs
  too, and delegate them a second time (experiment: a model with a WHILE gets one Prepare per
  subgraph, and only one once cond and body are marked).

TFLite's opaque C API has both (TfLiteOpaqueContextMarkSubgraphAsDelegationSkippable, ...), but
neither Python runtime's library makes them reachable: tflite_runtime 2.14 exports the C++ member
tflite::Subgraph::MarkSubgraphAsDelegationSkippable and no opaque-context function; LiteRT 2.3's
interpreter (libpywrap_litert_common.so) exports no TFLite symbol at all, and its symbol table shows
that neither that member nor those opaque-context functions were linked in. So both come from the
tflite::Subgraph behind ``context->impl_``, at offsets read from each runtime build's own code
(its symbol table names the functions, also where they are not exported):

- ``SetInputs`` / ``SetOutputs`` move their vector into ``inputs_`` / ``outputs_``;
- ``AcquireSubgraphContext`` indexes the ``subgraphs_`` list, bumps the acquired Subgraph's
  delegate-context switch count, and hands back the address of its ``context_``;
- ``Interpreter::ModifyGraphWithDelegateImpl`` tests each Subgraph's ``is_delegation_skippable_``
  byte before preparing a delegate on it (and 2.14's ``MarkSubgraphAsDelegationSkippable`` sets
  that byte).

Where the member is exported it is called; elsewhere the byte is set, as the member does. Every
read is checked for consistency first: the context lies inside its Subgraph where expected, and
TFLite has switched that Subgraph to the delegate context (its switch count is positive); that
Subgraph is in its own subgraph list, and every Subgraph there points back at itself through its
context; vectors are well formed, in readable memory, and hold valid tensor indexes; the flag is a
bool before it is set. On a runtime (version, machine) whose layout is not known here nothing is
read, and control flow stays on TFLite's CPU kernels.
"""
from __future__ import annotations

import ctypes as C
import os
import platform
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
    skippable: int  # bool is_delegation_skippable_
    switches: int  # int delegate_context_switch_count_: positive while a delegate prepares it
    #: (library file in the runtime's package, mangled Subgraph::MarkSubgraphAsDelegationSkippable(int))
    #: where the runtime exports it; None: set ``skippable`` instead.
    mark_skippable: tuple[str, str] | None = None

    @property
    def span(self) -> int:
        """Bytes of a Subgraph read here: every offset above lies below it."""
        return max(self.context + C.sizeof(capi.TfLiteContext), self.inputs + 24, self.outputs + 24,
                   self.subgraphs + 8, self.skippable + 1, self.switches + 4)


#: (runtime package, version) -> layout, for x86-64 builds (the manylinux wheels).
#: tflite_runtime 2.14.0 (_pywrap_tensorflow_interpreter_wrapper.so): SetInputs/SetOutputs store at
#: +0x128/+0x140; AcquireSubgraphContext reads the subgraph list at +0x240 and reports errors
#: through the context at +0x28; MarkSubgraphAsDelegationSkippable (exported) sets the byte at
#: +0x2f0, which Interpreter::ModifyGraphWithDelegateImpl tests; the context switch count is at
#: +0x2f4 (SwitchToKernelContext).
#: ai_edge_litert 2.3.0 (libpywrap_litert_common.so, named by its local symbols): the same, but the
#: subgraph list at +0x248, the skippable byte at +0x2f8 (tested by ModifyGraphWithDelegateImpl;
#: nothing in the library sets it) and the switch count at +0x2fc (AcquireSubgraphContext /
#: ReleaseSubgraphContext).
LAYOUTS = {
    ("tflite_runtime", "2.14.0"): SubgraphLayout(
        0x28, 0x128, 0x140, 0x240, 0x2f0, 0x2f4,
        ("_pywrap_tensorflow_interpreter_wrapper.so", "_ZN6tflite8Subgraph33MarkSubgraphAsDelegationSkippableEi")),
    ("ai_edge_litert", "2.3.0"): SubgraphLayout(0x28, 0x128, 0x140, 0x248, 0x2f8, 0x2fc),
}

AcquireFn = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int, C.POINTER(C.c_void_p))
ReleaseFn = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int)
MAX_SUBGRAPHS = 1 << 16
#: Nested delegate-context switches of one Subgraph: one per Prepare in progress, and one per
#: AcquireSubgraphContext not yet released.
MAX_SWITCHES = 1 << 10


class SubgraphAccessError(LookupError):
    """Another subgraph cannot be read from here (unknown runtime layout, bad index, odd memory)."""


def _runtime() -> tuple[tuple[str, str], str] | None:
    """((package, version), its directory) of the TFLite runtime in use."""
    from delegate.runtime import RUNTIME
    try:
        pkg = __import__(RUNTIME)
    except ImportError:
        return None
    return (RUNTIME, getattr(pkg, "__version__", "")), os.path.dirname(pkg.__file__)


_LAYOUT: tuple[SubgraphLayout, Callable[[int, int], int] | None] | None | bool = False


def layout() -> tuple[SubgraphLayout, Callable[[int, int], int] | None] | None:
    """This runtime's layout and its exported MarkSubgraphAsDelegationSkippable (None where the
    runtime has none to call), or None if the layout is not known."""
    global _LAYOUT
    if _LAYOUT is False:
        _LAYOUT = None
        found = _runtime()
        if found is not None and found[0] in LAYOUTS and platform.machine() == "x86_64":
            lay = LAYOUTS[found[0]]
            mark = None
            if lay.mark_skippable is not None:
                library, symbol = lay.mark_skippable
                try:
                    fn = getattr(C.CDLL(os.path.join(found[1], library)), symbol)
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
        if not self.readable(self.impl, self.layout.span):
            raise SubgraphAccessError("the context's Subgraph lies outside readable memory")
        # TFLite switched this Subgraph to the delegate context before calling Prepare: a count at
        # the wrong place (another build) would most likely read 0 or garbage.
        if not 0 < C.c_int.from_address(self.impl + self.layout.switches).value <= MAX_SWITCHES:
            raise SubgraphAccessError("the context's Subgraph is not being prepared by a delegate")
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
        found = self._vector(holder, 8, MAX_SUBGRAPHS)
        for sub in found:  # each a Subgraph whose context names it as its impl_, as TFLite sets it
            if not sub or not self.readable(sub, self.layout.span) \
                    or capi.TfLiteContext.from_address(sub + self.layout.context).impl_ != sub:
                raise SubgraphAccessError("the subgraph list holds something other than Subgraphs")
        return found

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

    def skippable(self, index: int) -> bool:
        """Whether TFLite will skip subgraph ``index`` when it prepares delegates."""
        return C.c_uint8.from_address(self.all[index] + self.layout.skippable).value == 1

    def mark_skippable(self, index: int) -> bool:
        """TFLite will not prepare delegates on subgraph ``index`` (a control-flow node the delegate
        runs whole owns it). False when this runtime cannot."""
        if not 0 < index < len(self.all):
            return False
        flag = C.c_uint8.from_address(self.all[index] + self.layout.skippable)
        if flag.value not in (0, 1):  # not a bool: not the byte TFLite tests
            return False
        if self._mark is not None:
            if self._mark(self.impl, index) != capi.kTfLiteOk:
                return False
        else:  # what MarkSubgraphAsDelegationSkippable does, where the runtime left it out
            flag.value = 1
        return flag.value == 1


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
