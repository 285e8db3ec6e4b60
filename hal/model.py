"""The NNAPI model as typed dataclasses (mirrors AIDL Model/Subgraph/Operand/Request).

Memory is Python buffers: ``Model.operand_values`` is the CONSTANT_COPY blob,
``Model.pools`` hold CONSTANT_POOL data (bytes, memoryview or numpy arrays — the
service maps shared memory here). Nothing in this module validates: see
``hal.validation``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from hal.types import OperandLifeTime, OperandType, OperationType

Buffer = Union[bytes, bytearray, memoryview]


@dataclass(frozen=True)
class DataLocation:
    """Where an operand's bytes live: a pool (or operand_values) + offset + length."""

    pool_index: int = 0
    offset: int = 0
    length: int = 0


@dataclass(frozen=True)
class SymmPerChannelQuantParams:
    """extraParams.channelQuant for TENSOR_QUANT8_SYMM_PER_CHANNEL."""

    scales: tuple[float, ...]
    channel_dim: int


@dataclass
class Operand:
    type: int  # OperandType, or an extension-encoded int
    dimensions: tuple[int, ...] = ()
    scale: float = 0.0
    zero_point: int = 0
    lifetime: OperandLifeTime = OperandLifeTime.TEMPORARY_VARIABLE
    location: DataLocation = field(default_factory=DataLocation)
    channel_quant: SymmPerChannelQuantParams | None = None
    extension_params: bytes | None = None


@dataclass
class Operation:
    type: int  # OperationType, or an extension-encoded int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@dataclass
class Subgraph:
    operands: list[Operand] = field(default_factory=list)
    operations: list[Operation] = field(default_factory=list)
    input_indexes: list[int] = field(default_factory=list)
    output_indexes: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class ExtensionNameAndPrefix:
    name: str
    prefix: int


@dataclass
class Model:
    main: Subgraph = field(default_factory=Subgraph)
    referenced: list[Subgraph] = field(default_factory=list)
    operand_values: bytes = b""
    pools: list[Buffer] = field(default_factory=list)
    relax_computation_float32_to_float16: bool = False
    extension_name_to_prefix: list[ExtensionNameAndPrefix] = field(default_factory=list)


@dataclass
class RequestArgument:
    """One request input/output; ``dimensions`` overrides unspecified operand dims."""

    has_no_value: bool = False
    location: DataLocation = field(default_factory=DataLocation)
    dimensions: tuple[int, ...] = ()


@dataclass
class Request:
    inputs: list[RequestArgument] = field(default_factory=list)
    outputs: list[RequestArgument] = field(default_factory=list)
    pools: list[Buffer] = field(default_factory=list)


class ModelBuilder:
    """Incremental construction of a Model (ANeuralNetworksModel_add* in Python).

    Constants go into ``operand_values`` (CONSTANT_COPY), 4-byte aligned. As with NNAPI's
    setOperandValue, values of up to 128 bytes are copied at once; larger ones are referenced
    and copied by ``finish`` (once, into the final buffer), so the caller must not change them
    until then. Mapping a 3.5 M-parameter graph no longer copies its weights three times.
    """

    IMMEDIATE_COPY_BYTES = 128  # ANEURALNETWORKS_MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES

    def __init__(self) -> None:
        self.model = Model()
        self._chunks: list = []  # bytes and read-only views, concatenated by finish()
        self._size = 0
        self._small: dict[int, bytes] = {}  # operand index -> value copied at once (<= 128 bytes)

    @property
    def operands(self) -> list[Operand]:
        return self.model.main.operands

    def add_operand(self, type: int, dimensions=(), scale: float = 0.0, zero_point: int = 0,
                    channel_quant: SymmPerChannelQuantParams | None = None) -> int:
        self.operands.append(Operand(type=type, dimensions=tuple(int(d) for d in dimensions),
                                     scale=float(scale), zero_point=int(zero_point),
                                     channel_quant=channel_quant))
        return len(self.operands) - 1

    def set_constant(self, index: int, data) -> None:
        """``data``: any bytes-like object (referenced until finish() when over 128 bytes)."""
        view = memoryview(data).cast("B")
        if view.nbytes <= self.IMMEDIATE_COPY_BYTES:
            view = view.tobytes()
            self._small[index] = view
        else:
            self._small.pop(index, None)
        pad = (-self._size) % 4
        if pad:
            self._chunks.append(b"\0" * pad)
            self._size += pad
        op = self.operands[index]
        op.lifetime = OperandLifeTime.CONSTANT_COPY
        op.location = DataLocation(pool_index=0, offset=self._size, length=len(view))
        self._chunks.append(view)
        self._size += len(view)

    def mark(self) -> tuple[int, ...]:
        """A point to rewind to (operands, operations, constants, extension prefixes, subgraphs)."""
        m = self.model
        return (len(m.main.operands), len(m.main.operations), len(self._chunks), self._size,
                len(m.extension_name_to_prefix), len(m.referenced), len(m.pools))

    def rewind(self, mark: tuple[int, ...]) -> None:
        """Drop everything added since ``mark`` (a caller backing out of a half-built operation)."""
        n_operands, n_operations, n_chunks, size, n_prefixes, n_referenced, n_pools = mark
        m = self.model
        del m.main.operands[n_operands:], m.main.operations[n_operations:], self._chunks[n_chunks:]
        del m.extension_name_to_prefix[n_prefixes:], m.referenced[n_referenced:], m.pools[n_pools:]
        self._size = size
        for i in [i for i in self._small if i >= n_operands]:
            del self._small[i]

    def small_value(self, index: int) -> bytes | None:
        """Bytes of a constant of at most 128 bytes (scalars among them), before finish():
        what validating an operation while the model is being built may read."""
        return self._small.get(index)

    def set_no_value(self, index: int) -> None:
        self._small.pop(index, None)
        op = self.operands[index]
        op.lifetime = OperandLifeTime.NO_VALUE
        op.location = DataLocation()

    def add_constant(self, type: int, array, dimensions=None, scale: float = 0.0, zero_point: int = 0,
                     channel_quant: SymmPerChannelQuantParams | None = None) -> int:
        import numpy as np

        from hal.types import NUMPY_DTYPE, SCALAR_TYPES

        arr = np.asarray(array, dtype=NUMPY_DTYPE[OperandType(type)])
        dims = () if type in SCALAR_TYPES else (arr.shape if dimensions is None else dimensions)
        idx = self.add_operand(type, dims, scale, zero_point, channel_quant)
        self.set_constant(idx, np.ascontiguousarray(arr).reshape(-1))
        return idx

    def add_scalar(self, type: OperandType, value) -> int:
        return self.add_constant(type, value)

    def add_int32(self, value: int) -> int:
        return self.add_constant(OperandType.INT32, int(value))

    def add_float32(self, value: float) -> int:
        return self.add_constant(OperandType.FLOAT32, float(value))

    def add_bool(self, value: bool) -> int:
        return self.add_constant(OperandType.BOOL, bool(value))

    def add_referenced(self, model: Model) -> int:
        """Append ``model``'s main subgraph to this model's referenced subgraphs (for IF and WHILE)
        and return its index, the ``offset`` of a SUBGRAPH operand naming it. The model's own
        referenced subgraphs come along (nested control flow): its constants are copied into this
        model's operand_values, its pools appended, its SUBGRAPH operands renumbered. Extension
        prefixes must agree between the two models."""
        import dataclasses

        mine = {e.name: e.prefix for e in self.model.extension_name_to_prefix}
        for e in model.extension_name_to_prefix:
            if mine.setdefault(e.name, e.prefix) != e.prefix:
                raise ValueError(f"extension {e.name!r} has prefix {e.prefix} in the subgraph, "
                                 f"{mine[e.name]} here")
            if e not in self.model.extension_name_to_prefix:
                self.model.extension_name_to_prefix.append(e)
        pad = (-self._size) % 4
        if pad:
            self._chunks.append(b"\0" * pad)
            self._size += pad
        values_at, pools_at, first = self._size, len(self.model.pools), len(self.model.referenced)
        if model.operand_values:
            self._chunks.append(memoryview(model.operand_values))
            self._size += len(model.operand_values)
        self.model.pools.extend(model.pools)

        def moved(sg: Subgraph) -> Subgraph:
            operands = []
            for op in sg.operands:
                loc = op.location
                if op.lifetime == OperandLifeTime.CONSTANT_COPY:
                    loc = dataclasses.replace(loc, offset=loc.offset + values_at)
                elif op.lifetime == OperandLifeTime.CONSTANT_POOL:
                    loc = dataclasses.replace(loc, pool_index=loc.pool_index + pools_at)
                elif op.lifetime == OperandLifeTime.SUBGRAPH:  # model.main is `first`, its referenced follow
                    loc = dataclasses.replace(loc, offset=loc.offset + first + 1)
                operands.append(dataclasses.replace(op, location=loc))
            return Subgraph(operands, list(sg.operations), list(sg.input_indexes), list(sg.output_indexes))

        self.model.referenced.append(moved(model.main))
        self.model.referenced.extend(moved(sg) for sg in model.referenced)
        return first

    def add_subgraph_operand(self, subgraph: int) -> int:
        """A SUBGRAPH operand naming referenced subgraph ``subgraph`` (an IF branch, a WHILE body)."""
        idx = self.add_operand(OperandType.SUBGRAPH)
        op = self.operands[idx]
        op.lifetime = OperandLifeTime.SUBGRAPH
        op.location = DataLocation(pool_index=0, offset=int(subgraph), length=0)
        return idx

    def add_operation(self, type: OperationType | int, inputs, outputs) -> int:
        self.model.main.operations.append(
            Operation(type=int(type), inputs=tuple(inputs), outputs=tuple(outputs)))
        return len(self.model.main.operations) - 1

    def identify_inputs_and_outputs(self, inputs, outputs) -> None:
        self.model.main.input_indexes = list(inputs)
        self.model.main.output_indexes = list(outputs)
        for i in inputs:
            self.operands[i].lifetime = OperandLifeTime.SUBGRAPH_INPUT
        for i in outputs:
            self.operands[i].lifetime = OperandLifeTime.SUBGRAPH_OUTPUT

    def finish(self) -> Model:
        self.model.operand_values = b"".join(self._chunks)
        return self.model
