"""LSH_PROJECTION: TFLite -> NNAPI.

TFLite's inputs (hash seeds [num_hash, num_bits] float32, input, optional weight) are NNAPI's.
TFLite's SPARSE type adds ``i << num_bits`` to hash function i's code, which is NNAPI 1.2's
SPARSE (3), not NNAPI 1.0's SPARSE_DEPRECATED (1); DENSE is DENSE (2) in both.
"""
from __future__ import annotations

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import OptionsReader, ints
from delegate.mapping.shape import omitted
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import BuiltinOperator, TensorType
from hal.operations.lsh_projection import LshProjectionType
from hal.types import OperandType, OperationType

#: TFLite's LSHProjectionType (schema and TfLiteLSHProjectionType: UNKNOWN 0, SPARSE 1, DENSE 2).
_TYPES = {1: LshProjectionType.SPARSE, 2: LshProjectionType.DENSE}


def _read_lsh_projection(a: int) -> dict:
    kind, = ints(a, 1)  # TfLiteLSHProjectionParams: TfLiteLSHProjectionType type
    return {"type": kind}


@mapper(BuiltinOperator.LSH_PROJECTION, options=OptionsReader("LSHProjectionOptions", _read_lsh_projection))
def map_lsh_projection(ctx: MappingContext, node: TfLiteNode) -> None:
    kind = ctx.option("type", 0)
    if kind not in _TYPES:
        raise MappingError(f"LSH projection type {kind} is neither SPARSE (1) nor DENSE (2)")
    if ctx.input_tensor(0).type != TensorType.FLOAT32:
        raise MappingError("hash seeds (input 0) must be float32")
    if len(node.outputs) != 1:
        raise MappingError(f"expected 1 output, got {len(node.outputs)}")
    h, x = ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])
    has_weight = len(node.inputs) > 2 and node.inputs[2] >= 0
    w = ctx.tensor(node.inputs[2]) if has_weight else omitted(ctx, OperandType.TENSOR_FLOAT32)
    ctx.operation(OperationType.LSH_PROJECTION, [h, x, w, ctx.int32(_TYPES[kind])], [ctx.tensor(node.outputs[0])])
