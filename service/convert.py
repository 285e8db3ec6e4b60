"""proto <-> hal conversion. The servicer converts and delegates; hal validates."""
from __future__ import annotations

from typing import Callable

from hal.errors import HalError
from hal.model import (
    DataLocation,
    ExtensionNameAndPrefix,
    Model,
    Operand,
    Operation,
    RequestArgument,
    Subgraph,
    SymmPerChannelQuantParams,
)
from hal.types import ErrorStatus, OperandLifeTime
from service.proto import nnhal_pb2 as pb


def status(code: ErrorStatus = ErrorStatus.NONE, message: str = "") -> pb.Status:
    return pb.Status(code=int(code), message=message)


def _location(loc: pb.DataLocation) -> DataLocation:
    return DataLocation(pool_index=loc.pool_index, offset=loc.offset, length=loc.length)


def _lifetime(v: int) -> OperandLifeTime | int:
    try:
        return OperandLifeTime(v)
    except ValueError:
        return v  # validation reports it with the operand's index


def operand_from_proto(o: pb.Operand) -> Operand:
    cq = None
    if o.HasField("channel_quant"):
        cq = SymmPerChannelQuantParams(tuple(o.channel_quant.scales), o.channel_quant.channel_dim)
    return Operand(type=o.type, dimensions=tuple(o.dimensions), scale=o.scale, zero_point=o.zero_point,
                   lifetime=_lifetime(o.lifetime), location=_location(o.location), channel_quant=cq,
                   extension_params=o.extension if o.HasField("extension") else None)


def subgraph_from_proto(s: pb.Subgraph) -> Subgraph:
    return Subgraph(operands=[operand_from_proto(o) for o in s.operands],
                    operations=[Operation(type=op.type, inputs=tuple(op.inputs), outputs=tuple(op.outputs))
                                for op in s.operations],
                    input_indexes=list(s.input_indexes), output_indexes=list(s.output_indexes))


MemoryResolver = Callable[[pb.Memory], memoryview]


def model_from_proto(m: pb.Model, resolve_memory: MemoryResolver) -> Model:
    return Model(main=subgraph_from_proto(m.main), referenced=[subgraph_from_proto(s) for s in m.referenced],
                 operand_values=m.operand_values, pools=[resolve_memory(p) for p in m.pools],
                 relax_computation_float32_to_float16=m.relax_computation_float32_to_float16,
                 extension_name_to_prefix=[ExtensionNameAndPrefix(e.name, e.prefix)
                                           for e in m.extension_name_to_prefix])


def _location_proto(loc: DataLocation) -> pb.DataLocation:
    return pb.DataLocation(pool_index=loc.pool_index, offset=loc.offset, length=loc.length)


def operand_to_proto(o: Operand) -> pb.Operand:
    p = pb.Operand(type=int(o.type), dimensions=list(o.dimensions), scale=o.scale, zero_point=o.zero_point,
                   lifetime=int(o.lifetime), location=_location_proto(o.location))
    if o.channel_quant is not None:
        p.channel_quant.scales.extend(o.channel_quant.scales)
        p.channel_quant.channel_dim = o.channel_quant.channel_dim
    if o.extension_params is not None:
        p.extension = o.extension_params
    return p


def subgraph_to_proto(s: Subgraph) -> pb.Subgraph:
    return pb.Subgraph(operands=[operand_to_proto(o) for o in s.operands],
                       operations=[pb.Operation(type=int(op.type), inputs=list(op.inputs),
                                                outputs=list(op.outputs)) for op in s.operations],
                       input_indexes=list(s.input_indexes), output_indexes=list(s.output_indexes))


def model_to_proto(m: Model, pools: list[pb.Memory] | None = None, *, with_values: bool = True) -> pb.Model:
    """hal Model -> proto; ``pools`` replaces the model's pools (e.g. shared-memory references);
    ``with_values=False`` leaves operand_values empty (the structure alone, without a copy of it)."""
    if pools is None:
        pools = [pb.Memory(inline_data=bytes(memoryview(p).cast("B"))) for p in m.pools]
    return pb.Model(main=subgraph_to_proto(m.main), referenced=[subgraph_to_proto(s) for s in m.referenced],
                    operand_values=bytes(m.operand_values) if with_values else b"", pools=pools,
                    relax_computation_float32_to_float16=m.relax_computation_float32_to_float16,
                    extension_name_to_prefix=[pb.ExtensionNameAndPrefix(name=e.name, prefix=e.prefix)
                                              for e in m.extension_name_to_prefix])


def request_argument(a: pb.RequestArgument) -> RequestArgument:
    return RequestArgument(has_no_value=a.has_no_value, location=_location(a.location),
                           dimensions=tuple(a.dimensions))


def hal_error_status(e: HalError) -> pb.Status:
    return status(e.status, e.message)
