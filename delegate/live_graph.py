"""The interpreter's graph as the delegate reads it through TfLiteContext: a TfLiteGraph snapshot.

TFLite's loader takes constant tensors', names' and custom options' pointers and sizes from the
model's flatbuffer without verifying it, and its node replacement trusts the graph's dataflow: every
pointer and size is checked here before it is read, and a graph no sound model has is refused
(CorruptModelError, one line) rather than handed back to TFLite.
"""
from __future__ import annotations

import bisect
import ctypes as C

import numpy as np

from delegate import capi
from delegate.capi import TfLiteContext, TfLiteNode, TfLiteRegistration, int_array, kTfLiteOk
from delegate.params import decode_options
from delegate.tfl.graph import TfLiteGraph
from delegate.tfl.graph import TfLiteNode as GraphNode
from delegate.tfl.graph import TfLiteTensor as GraphTensor


class CorruptModelError(ValueError):
    """TFLite handed the delegate a pointer, size or graph no sound model has (a corrupted file):
    the delegation fails rather than read it or hand it back to TFLite."""


class ReadableMemory:
    """This process's readable mappings (/proc/self/maps), to check a range before reading it.

    TFLite's loader takes constant tensors', names' and custom options' pointers and sizes from
    the model's flatbuffer without verifying it: in a corrupted file they can point past its mapping,
    and reading there kills the process (SIGSEGV/SIGBUS) instead of failing the delegation. A
    range must lie inside readable memory without a gap: adjacent readable mappings count as one
    (the kernel lists the heap as several, and a model in memory, e.g. ``model_content`` bytes,
    can straddle two). Where /proc is missing only sizes are checked."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.known = True
        try:
            with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
                for line in f:
                    fields = line.split(None, 2)
                    if len(fields) >= 2 and fields[1].startswith("r"):
                        lo, hi = (int(a, 16) for a in fields[0].split("-", 1))
                        if self.ends and self.ends[-1] == lo:  # contiguous with the previous one
                            self.ends[-1] = hi
                        else:
                            self.starts.append(lo)
                            self.ends.append(hi)
        except (OSError, ValueError):
            self.known = False

    def _end(self, addr: int) -> int:
        """End of the readable memory holding ``addr`` (``addr`` itself if none does)."""
        i = bisect.bisect_right(self.starts, addr) - 1
        return self.ends[i] if i >= 0 and addr < self.ends[i] else addr

    def readable(self, addr: int, size: int) -> bool:
        return size <= 0 or not self.known or addr + size <= self._end(addr)

    def c_string(self, addr: int | None, what: str) -> str:
        """A NUL-terminated string TFLite points into the model (a tensor's or custom op's name)."""
        if not addr:
            return ""
        if not self.known:
            return C.string_at(addr).decode(errors="replace")
        end, out = self._end(addr), b""
        while addr < end:
            chunk = C.string_at(addr, min(256, end - addr))
            k = chunk.find(b"\0")
            if k >= 0:
                return (out + chunk[:k]).decode(errors="replace")
            out, addr = out + chunk, addr + len(chunk)
        raise CorruptModelError(f"{what}: its name lies outside the model's memory")


def _pointer(struct: C.Structure, field) -> int | None:
    """A char* field's address, without ctypes reading the string behind it."""
    return C.c_void_p.from_address(C.addressof(struct) + field.offset).value


def read_graph(ctx_p: int, memory: ReadableMemory | None = None) -> tuple[TfLiteGraph, list[int]]:
    """Snapshot of the interpreter's current graph as a TfLiteGraph (node k = plan[k]); ``memory``:
    the process's mappings if just read (else read here).

    Constants are read-only views of the model's buffers, not copies (a warm start reads them only
    to hash them): valid while the Interpreter lives, so only TFLite's callbacks read them, and a
    kernel drops the snapshot when TFLite frees it (delegate.nnhal_kernel).

    Raises CorruptModelError (one line) rather than read a constant, name or custom-options range
    that lies outside readable memory, or hand TFLite back a graph its node replacement crashes on."""
    ctx = TfLiteContext.from_address(ctx_p)
    plan_p = C.c_void_p()
    if ctx.GetExecutionPlan(ctx_p, C.byref(plan_p)) != kTfLiteOk:
        raise RuntimeError("GetExecutionPlan failed")
    plan = int_array(plan_p.value)  # copy at once: the next call invalidates it
    memory = memory or ReadableMemory()
    tensors = [_read_tensor(ctx, i, memory) for i in range(ctx.tensors_size)]
    nodes = []
    for k, ni in enumerate(plan):
        node_p, reg_p = C.c_void_p(), C.c_void_p()
        if ctx.GetNodeAndRegistration(ctx_p, ni, C.byref(node_p), C.byref(reg_p)) != kTfLiteOk:
            raise RuntimeError(f"GetNodeAndRegistration({ni}) failed")
        node = TfLiteNode.from_address(node_p.value)
        reg = TfLiteRegistration.from_address(reg_p.value)
        code = reg.builtin_code
        custom = None
        if code == capi.kTfLiteBuiltinCustom:
            custom = memory.c_string(_pointer(reg, TfLiteRegistration.custom_name), f"node {ni}") or None
        custom_data = b""
        if node.custom_initial_data and node.custom_initial_data_size > 0:
            if not memory.readable(node.custom_initial_data, node.custom_initial_data_size):
                raise CorruptModelError(f"node {ni}: its {node.custom_initial_data_size}-byte custom options lie "
                                        "outside the model's memory")
            custom_data = C.string_at(node.custom_initial_data, node.custom_initial_data_size)
        options = decode_options(code, node.builtin_data) if custom is None else {}
        nodes.append(GraphNode(index=k, builtin_code=code, inputs=tuple(int_array(node.inputs)),
                               outputs=tuple(int_array(node.outputs)),
                               options=options if options is not None else {"__undecoded__": True},
                               custom_code=custom, custom_options=custom_data, version=reg.version,
                               intermediates=tuple(int_array(node.intermediates))))
    constants = {i for i in range(ctx.tensors_size) if capi.tensor_at(ctx, i).allocation_type == capi.kTfLiteMmapRo}
    _check_dataflow(nodes, plan, constants)
    return TfLiteGraph(tensors=tensors, nodes=nodes, inputs=[], outputs=[],
                       constant_bytes=_constant_bytes(tensors, memory)), plan


def _constant_bytes(tensors: list[GraphTensor], memory: ReadableMemory) -> tuple[int, memoryview] | None:
    """The memory holding every constant, from the first one's byte to the last one's end, when it is
    readable without a gap and not much larger than the constants (TFLite keeps them all in the
    model's buffer): (its address, a read-only view). None otherwise."""
    ranges = [(t.data.__array_interface__["data"][0], t.data.nbytes) for t in tensors
              if t.data is not None and t.data.nbytes]
    if not ranges or not memory.known:
        return None
    lo = min(a for a, _ in ranges)
    hi = max(a + n for a, n in ranges)
    if hi - lo > 2 * sum(n for _, n in ranges) + (1 << 20) or not memory.readable(lo, hi - lo):
        return None
    return lo, memoryview((C.c_char * (hi - lo)).from_address(lo)).cast("B").toreadonly()


def unpreparable_nodes(ctx_p: int, plan: list[int]) -> list[int]:
    """CUSTOM nodes without a Prepare function: possibly ops TFLite's resolver lacks (a vendor op only
    an extension runs), whose Prepare TFLite fails. Only callable while the delegate prepares."""
    ctx = TfLiteContext.from_address(ctx_p)
    found = []
    for ni in plan:
        node_p, reg_p = C.c_void_p(), C.c_void_p()
        if ctx.GetNodeAndRegistration(ctx_p, ni, C.byref(node_p), C.byref(reg_p)) != kTfLiteOk:
            raise RuntimeError(f"GetNodeAndRegistration({ni}) failed")
        reg = TfLiteRegistration.from_address(reg_p.value)
        if reg.builtin_code == capi.kTfLiteBuiltinCustom and not reg.prepare:
            found.append(ni)
    return found


def _check_dataflow(nodes: list[GraphNode], plan: list[int], constants: set[int]) -> None:
    """Each tensor written by one node, never a constant, and before every node reading it. TFLite
    does not check it: its node replacement and kernels crash on such a graph (a corrupted file,
    e.g. a node's output index turned into a constant's that an earlier node reads)."""
    writer: dict[int, int] = {}
    for k, node in enumerate(nodes):
        for t in node.outputs:
            if t in constants:
                raise CorruptModelError(f"node {plan[k]} writes constant tensor {t}")
            if t in writer:
                raise CorruptModelError(f"tensor {t} is written by nodes {plan[writer[t]]} and {plan[k]}")
            writer[t] = k
    for k, node in enumerate(nodes):
        for t in node.inputs:
            if writer.get(t, -1) >= k:
                raise CorruptModelError(f"node {plan[k]} reads tensor {t} before node {plan[writer[t]]} writes it")


def _check_constant(i: int, name: str, t, shape: tuple[int, ...], dense: bool, memory: ReadableMemory) -> None:
    """A constant's bytes: a whole number of values, as many as its shape needs (dense), and
    inside readable memory: never read a buffer whose bounds are not checked."""
    itemsize = np.dtype(capi.TFLITE_TYPE_DTYPE[t.type]).itemsize
    if t.bytes % itemsize or (dense and t.bytes != int(np.prod(shape, dtype=np.int64)) * itemsize):
        raise CorruptModelError(f"tensor {i} ({name}): its buffer holds {t.bytes} bytes, which its shape "
                                f"{list(shape)} of {itemsize}-byte values does not fit")
    if not memory.readable(t.data, t.bytes):
        raise CorruptModelError(f"tensor {i} ({name}): its {t.bytes}-byte buffer lies outside the model's "
                                "memory")


def _read_tensor(ctx: TfLiteContext, i: int, memory: ReadableMemory) -> GraphTensor:
    t = capi.tensor_at(ctx, i)
    name = memory.c_string(_pointer(t, capi.TfLiteTensor.name), f"tensor {i}")
    shape = tuple(int_array(t.dims))
    if any(d < 0 for d in shape):  # TFLite's loader lets one through when another dimension is 0
        raise CorruptModelError(f"tensor {i} ({name}): negative dimension in its shape {list(shape)}")
    sig = tuple(int_array(t.dims_signature)) if t.dims_signature else None
    scales: tuple[float, ...] = ()
    zps: tuple[int, ...] = ()
    qdim = 0
    if t.quantization.type == capi.kTfLiteAffineQuantization and t.quantization.params:
        q = capi.TfLiteAffineQuantization.from_address(t.quantization.params)
        scales = tuple(capi.float_array(q.scale))
        zps = tuple(int_array(q.zero_point))
        qdim = q.quantized_dimension
    elif t.params.scale != 0.0:
        scales, zps = (t.params.scale,), (t.params.zero_point,)
    data = None
    sparsity = capi.read_sparsity(t.sparsity) if t.sparsity else None
    if t.allocation_type == capi.kTfLiteMmapRo and t.data and t.type in capi.TFLITE_TYPE_DTYPE:
        _check_constant(i, name, t, shape, sparsity is None, memory)
        if sparsity is None:
            data = capi.tensor_array(t)
        else:  # only the stored values: densified by delegate.mapping.folding
            data = np.frombuffer((C.c_char * t.bytes).from_address(t.data), capi.TFLITE_TYPE_DTYPE[t.type])
        data.flags.writeable = False  # the model's own bytes (often a read-only file mapping)
    return GraphTensor(index=i, name=name,
                       type=capi.TFLITE_TYPE_TO_SCHEMA.get(t.type, -1), shape=shape, shape_signature=sig,
                       scales=scales, zero_points=zps, quantized_dimension=qdim, data=data,
                       is_variable=bool(t.is_variable), sparsity=sparsity,
                       runtime_shape=t.allocation_type == capi.kTfLiteDynamic)
