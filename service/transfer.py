"""How the client lays out requests and models for the service: tensors above ``SHM_THRESHOLD``
bytes in a shared-memory scratch pool, large constants in a shared-memory CONSTANT_POOL; over TCP
or to a service of another user (``shared=False``) everything inline, since the service accepts
shared memory only from a client of its own user on its unix socket (service.access, SECURITY.md)."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import threading
import uuid
from multiprocessing import shared_memory

import numpy as np

from hal.extension_registry import model_prefixes, operand_dtype
from hal.model import DataLocation, Model, Operand
from hal.types import SCALAR_TYPES, OperandLifeTime
from service import convert
from service.proto import nnhal_pb2 as pb
from service.slots import SlotLayout, slot_bytes

SHM_THRESHOLD = 64 << 10


@contextlib.contextmanager
def ctrl_c_held():
    """A Ctrl-C (SIGINT's default handler) is held back until the block ends, then raised: between
    creating a /dev/shm file and recording it, or between removing it and forgetting it, a
    KeyboardInterrupt would leak the file (or leave it registered with multiprocessing's resource
    tracker, which then warns at exit). Blocking the signal in this thread would not do: the kernel
    hands a process-wide SIGINT to any thread that does not block it, and Python runs the handler
    in the main thread at its next bytecode."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    held: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if held:
            raise KeyboardInterrupt


def _new_segment(size: int) -> shared_memory.SharedMemory:
    return shared_memory.SharedMemory(name=f"nnhal-{uuid.uuid4().hex[:16]}", create=True, size=size)


def _remove(shm: shared_memory.SharedMemory) -> None:
    try:
        shm.unlink()
    except FileNotFoundError:
        pass
    try:
        shm.close()
    except BufferError:
        pass  # an exported view is still alive; the mapping goes with it


class ScratchPool:
    """A client-owned shared-memory segment reused across executions (grown on demand)."""

    def __init__(self) -> None:
        self.shm: shared_memory.SharedMemory | None = None
        self.version = 0

    def ensure(self, size: int) -> shared_memory.SharedMemory:
        if self.shm is None or self.shm.size < size:
            self.close()
            with ctrl_c_held():
                self.shm = _new_segment(max(size, 1 << 16))
            self.version += 1
        return self.shm

    def ref(self) -> pb.Memory:
        return pb.Memory(shared=pb.SharedMemoryRef(name=self.shm.name, size=self.shm.size))

    def close(self) -> None:
        if self.shm is not None:
            with ctrl_c_held():
                shm, self.shm = self.shm, None
                _remove(shm)


def operand_nbytes(op: Operand, dims, prefixes: dict[int, str] | None = None) -> int | None:
    itemsize = operand_dtype(op.type, prefixes or {}).itemsize  # extension types: via the model's prefixes
    if op.type in SCALAR_TYPES:
        return itemsize
    if not dims or 0 in dims:
        return None
    return itemsize * math.prod(dims)


class RequestBuilder:
    """Lays out inputs/outputs inline or in a scratch pool; decodes the reply."""

    def __init__(self, model: Model, shared: bool = True):
        sg = model.main
        #: Tensors above this many bytes go through the scratch pool (never over TCP).
        self.threshold = SHM_THRESHOLD if shared else math.inf
        self.in_ops = [sg.operands[i] for i in sg.input_indexes]
        self.out_ops = [sg.operands[i] for i in sg.output_indexes]
        self.prefixes = model_prefixes(model)
        self.out_dtypes = [operand_dtype(op.type, self.prefixes) for op in self.out_ops]
        self.scratch = ScratchPool()
        self.lock = threading.Lock()

    def build(self, inputs: list[np.ndarray], pool: pb.Memory | None = None, burst_pool_id: int | None = None):
        if len(inputs) != len(self.in_ops):
            raise ValueError(f"model has {len(self.in_ops)} inputs, got {len(inputs)}")
        # None: an omitted (optional) input, sent as has_no_value
        arrays = [None if x is None else np.ascontiguousarray(x) for x in inputs]
        out_sizes = [operand_nbytes(op, op.dimensions, self.prefixes) for op in self.out_ops]
        # Tensors above SHM_THRESHOLD get a slot in the scratch pool; the others travel inline.
        slots = SlotLayout.of([a.nbytes if a is not None and a.nbytes > self.threshold else None for a in arrays]
                              + [s if s is not None and s > self.threshold else None for s in out_sizes])
        layout, out_layout = slots.offsets[:len(arrays)], slots.offsets[len(arrays):]
        req = pb.Request()
        if slots.total:
            shm = self.scratch.ensure(slots.total)
            if burst_pool_id is not None:
                req.pools.append(pb.Memory(burst_pool=burst_pool_id))
            else:
                req.pools.append(self.scratch.ref())
            for a, off in zip(arrays, layout):
                if off is not None:
                    np.frombuffer(shm.buf, np.uint8, a.nbytes, off)[:] = a.view(np.uint8).reshape(-1)
        for a, off in zip(arrays, layout):
            if a is None:
                req.inputs.add(has_no_value=True)
                continue
            arg = req.inputs.add(dimensions=list(a.shape))
            if off is None:
                arg.data = a.tobytes()
            else:
                arg.location.CopyFrom(pb.DataLocation(pool_index=0, offset=off, length=a.nbytes))
        for s, off in zip(out_sizes, out_layout):
            arg = req.outputs.add()
            if off is None:
                arg.inline_capacity = s or 0
            else:
                arg.location.CopyFrom(pb.DataLocation(pool_index=0, offset=off, length=s))
        return req, out_layout

    def decode(self, reply: pb.ExecuteReply, out_layout, outputs: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """The reply's outputs, each copied once: into ``outputs[k]`` when given (reshaped to it: the
        element counts must match; those arrays are returned), else into a new array."""
        outs = []
        for k, (dtype, off) in enumerate(zip(self.out_dtypes, out_layout)):
            dims = tuple(reply.output_shapes[k].dimensions)
            if off is None:
                src = np.frombuffer(reply.outputs[k], dtype=dtype)
            else:
                src = np.frombuffer(self.scratch.shm.buf, dtype, math.prod(dims), off)
            if outputs is None:
                outs.append(src.reshape(dims).copy())
                continue
            dst = outputs[k]
            if dst.size != src.size or dst.dtype != dtype:
                raise ValueError(f"output {k} came back {dtype}{list(dims)}, the array given for it is "
                                 f"{dst.dtype}{list(dst.shape)}")
            np.copyto(dst, src.reshape(dst.shape), casting="no")
            outs.append(dst)
        return outs


#: A support query sends tensor constants up to this size by value (parameters: shapes, paddings,
#: axes, small tables); larger ones point into a pool of zeros the service makes itself.
SUPPORT_VALUE_BYTES = 1024


def support_query_proto(model: Model) -> pb.Model:
    """``model`` for getSupportedOperations, without its weights: every constant tensor of more than
    SUPPORT_VALUE_BYTES in operand_values is moved to a ``zeros`` pool of the same layout, so no
    weight byte is copied or sent. Validation never reads a tensor's value (hal's rule), so the
    answer is the full model's; the kernels' plans then see zeros."""
    if model.pools:  # constants already in pools (shared memory or the caller's): sent as they are
        return convert.model_to_proto(model)
    values = memoryview(model.operand_values)
    kept = bytearray()
    zeros = 0

    def move(op: Operand) -> Operand:
        nonlocal zeros
        if op.lifetime != OperandLifeTime.CONSTANT_COPY:
            return op
        loc = op.location
        if op.type in SCALAR_TYPES or loc.length <= SUPPORT_VALUE_BYTES:
            offset = slot_bytes(len(kept))
            kept.extend(b"\0" * (offset - len(kept)))
            kept.extend(values[loc.offset:loc.offset + loc.length])
            return dataclasses.replace(op, location=DataLocation(0, offset, loc.length))
        offset, zeros = zeros, slot_bytes(zeros + loc.length)
        return dataclasses.replace(op, lifetime=OperandLifeTime.CONSTANT_POOL,
                                   location=DataLocation(0, offset, loc.length))

    def subgraph(sg):
        return dataclasses.replace(sg, operands=[move(op) for op in sg.operands])
    moved = dataclasses.replace(model, main=subgraph(model.main), referenced=[subgraph(s) for s in model.referenced],
                                operand_values=bytes(kept))
    return convert.model_to_proto(moved, pools=[pb.Memory(zeros=zeros)] if zeros else [])


class ModelTransfer:
    """Model -> proto; when constants are large, they travel in a shared-memory CONSTANT_POOL."""

    def __init__(self, model: Model, shared: bool = True):
        self.model = model
        self.shared = shared  # False over TCP: constants travel inline
        self.shm: shared_memory.SharedMemory | None = None

    def __enter__(self) -> pb.Model:
        m = self.model
        if not self.shared or len(m.operand_values) <= SHM_THRESHOLD or m.pools:
            return convert.model_to_proto(m)
        data = bytes(m.operand_values)
        with ctrl_c_held():
            self.shm = _new_segment(len(data))
        try:
            return self._moved(m, data)
        except BaseException:  # __exit__ does not run when __enter__ raises
            self.__exit__()
            raise

    def _moved(self, m: Model, data: bytes) -> pb.Model:
        """``m`` with its constants in the segment, as CONSTANT_POOL operands."""
        self.shm.buf[: len(data)] = data
        operands = []
        for op in m.main.operands:
            if op.lifetime == OperandLifeTime.CONSTANT_COPY:
                loc = op.location
                op = dataclasses.replace(op, lifetime=OperandLifeTime.CONSTANT_POOL,
                                         location=DataLocation(0, loc.offset, loc.length))
            operands.append(op)
        moved = dataclasses.replace(m, main=dataclasses.replace(m.main, operands=operands), operand_values=b"")
        return convert.model_to_proto(moved, pools=[pb.Memory(shared=pb.SharedMemoryRef(
            name=self.shm.name, size=self.shm.size))])

    def __exit__(self, *exc) -> None:
        if self.shm is not None:
            with ctrl_c_held():
                shm, self.shm = self.shm, None
                _remove(shm)
