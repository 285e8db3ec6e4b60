"""How the client lays out requests and models for the service: tensors above ``SHM_THRESHOLD``
bytes in a shared-memory scratch pool, large constants in a shared-memory CONSTANT_POOL."""
from __future__ import annotations

import dataclasses
import math
import threading
import uuid
from multiprocessing import shared_memory

import numpy as np

from hal.extension_registry import model_prefixes, operand_dtype
from hal.model import DataLocation, Model, Operand
from hal.types import SCALAR_TYPES, OperandLifeTime
from service import convert
from service.proto import nnhal_pb2 as pb

SHM_THRESHOLD = 64 << 10


class ScratchPool:
    """A client-owned shared-memory segment reused across executions (grown on demand)."""

    def __init__(self) -> None:
        self.shm: shared_memory.SharedMemory | None = None
        self.version = 0

    def ensure(self, size: int) -> shared_memory.SharedMemory:
        if self.shm is None or self.shm.size < size:
            self.close()
            self.shm = shared_memory.SharedMemory(name=f"nnhal-{uuid.uuid4().hex[:16]}", create=True,
                                                  size=max(size, 1 << 16))
            self.version += 1
        return self.shm

    def ref(self) -> pb.Memory:
        return pb.Memory(shared=pb.SharedMemoryRef(name=self.shm.name, size=self.shm.size))

    def close(self) -> None:
        if self.shm is not None:
            shm, self.shm = self.shm, None
            try:
                shm.unlink()
            except FileNotFoundError:
                pass
            try:
                shm.close()
            except BufferError:
                pass  # an exported view is still alive; the mapping goes with it


def operand_nbytes(op: Operand, dims, prefixes: dict[int, str] | None = None) -> int | None:
    itemsize = operand_dtype(op.type, prefixes or {}).itemsize  # extension types: via the model's prefixes
    if op.type in SCALAR_TYPES:
        return itemsize
    if not dims or 0 in dims:
        return None
    return itemsize * math.prod(dims)


class RequestBuilder:
    """Lays out inputs/outputs inline or in a scratch pool; decodes the reply."""

    def __init__(self, model: Model):
        sg = model.main
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
        big_in = [a is not None and a.nbytes > SHM_THRESHOLD for a in arrays]
        big_out = [s is not None and s > SHM_THRESHOLD for s in out_sizes]
        layout, offset = [], 0
        for a, big in zip(arrays, big_in):
            layout.append(offset if big else None)
            offset += (a.nbytes + 63) // 64 * 64 if big else 0
        out_layout = []
        for s, big in zip(out_sizes, big_out):
            out_layout.append(offset if big else None)
            offset += (s + 63) // 64 * 64 if big else 0
        req = pb.Request()
        if offset:
            shm = self.scratch.ensure(offset)
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

    def decode(self, reply: pb.ExecuteReply, out_layout) -> list[np.ndarray]:
        outs = []
        for k, (dtype, off) in enumerate(zip(self.out_dtypes, out_layout)):
            dims = tuple(reply.output_shapes[k].dimensions)
            if off is None:
                outs.append(np.frombuffer(reply.outputs[k], dtype=dtype).reshape(dims).copy())
            else:
                n = math.prod(dims)
                outs.append(np.frombuffer(self.scratch.shm.buf, dtype, n, off).reshape(dims).copy())
        return outs


class ModelTransfer:
    """Model -> proto; when constants are large, they travel in a shared-memory CONSTANT_POOL."""

    def __init__(self, model: Model):
        self.model = model
        self.shm: shared_memory.SharedMemory | None = None

    def __enter__(self) -> pb.Model:
        m = self.model
        if len(m.operand_values) <= SHM_THRESHOLD or m.pools:
            return convert.model_to_proto(m)
        data = bytes(m.operand_values)
        self.shm = shared_memory.SharedMemory(name=f"nnhal-{uuid.uuid4().hex[:16]}", create=True, size=len(data))
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
            self.shm.close()
            self.shm.unlink()
