"""RESHAPE, SQUEEZE, TRANSPOSE, DEPTH_TO_SPACE, SPACE_TO_DEPTH: TFLite -> NNAPI.

TFLite copies quantized bytes whatever the output's quantization says; NNAPI
requires it to equal the input's (hal's validate refuses other variants, as it
does types, ranks and parameter values NNAPI does not allow). Shape-like
parameters must be constants (the driver plans shapes at compile time); they
are re-emitted as TENSOR_INT32 constants, since TFLite may store them as int64.
NNAPI gives shape [1] where TFLite gives a scalar, so rank-0 outputs are refused.
"""
from __future__ import annotations

import numpy as np

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import OptionsReader, ints, no_options
from delegate.tfl.graph import TfLiteNode, TfLiteTensor
from delegate.tfl.schema import BuiltinOperator
from hal.types import OperandType, OperationType

I32 = OperandType.TENSOR_INT32
QUANT8 = (OperandType.TENSOR_QUANT8_ASYMM, OperandType.TENSOR_QUANT8_ASYMM_SIGNED)
SHAPE_TYPES = (OperandType.TENSOR_FLOAT32, *QUANT8)  # used by the CONCATENATION mapper
MAX_RANK = 4


def check_arity(node: TfLiteNode, inputs: tuple[int, ...], outputs: int = 1) -> None:
    if len(node.inputs) not in inputs or len(node.outputs) != outputs:
        want = " or ".join(str(n) for n in inputs)
        raise MappingError(f"expected {want} inputs and {outputs} output, got {len(node.inputs)} "
                           f"and {len(node.outputs)}")


def same_io(ctx: MappingContext, node: TfLiteNode, op: OperationType,
            inputs: tuple[int, ...]) -> tuple[TfLiteTensor, TfLiteTensor, OperandType]:
    """Input 0 and output 0 of a pure data-movement op. NNAPI's rules on them (types, equal
    quantization, rank limits) are hal's validate's; what is left here is TFLite's side: tensor
    types NNAPI has no equivalent for, and scalars (rank 0): NNAPI has no rank-0 tensor (no
    dimensions means an unknown rank; a fully squeezed or sliced output has shape [1])."""
    check_arity(node, inputs)
    x, y = ctx.input_tensor(0), ctx.output_tensor(0)
    t = ctx.operand_type(x)
    ctx.operand_type(y)
    for what, tensor in (("input", x), ("output", y)):
        if not tensor.shape:
            raise MappingError(f"NNAPI has no rank-0 tensor for TFLite's scalar {what} ({op.name} needs "
                               f"{what} rank 1 to {MAX_RANK}, got 0)")
    return x, y, t


def constant_ints(ctx: MappingContext, k: int, what: str) -> np.ndarray:
    """A constant integer input tensor's values (MappingError when not constant)."""
    t = ctx.input_tensor(k)
    if not t.is_constant:
        raise MappingError(f"{what} (input {k}) must be a constant tensor")
    if not np.issubdtype(t.data.dtype, np.integer):
        raise MappingError(f"{what} (input {k}) must be an integer tensor, got {t.data.dtype}")
    return np.asarray(t.data, dtype=np.int64)


def int32_constant(ctx: MappingContext, values) -> int:
    return ctx.constant(I32, np.asarray(values, dtype=np.int32).reshape(-1))


def omitted(ctx: MappingContext, type: OperandType = I32) -> int:
    """An optional NNAPI input left out (lifetime NO_VALUE)."""
    idx = ctx.builder.add_operand(type, ())
    ctx.builder.set_no_value(idx)
    return idx


def _read_reshape(a: int) -> dict:
    n = ints(a + 32, 1)[0]  # TfLiteReshapeParams: int shape[8]; int num_dimensions
    return {"new_shape": ints(a, n) if 0 < n <= 8 else []}


def _read_squeeze(a: int) -> dict:
    n = ints(a + 32, 1)[0]  # TfLiteSqueezeParams: int squeeze_dims[8]; int num_squeeze_dims
    return {"squeeze_dims": ints(a, n) if 0 < n <= 8 else []}


def _read_block(a: int) -> dict:
    return {"block_size": ints(a, 1)[0]}  # TfLiteDepthToSpaceParams / TfLiteSpaceToDepthParams


@mapper(BuiltinOperator.RESHAPE, options=OptionsReader("ReshapeOptions", _read_reshape))
def map_reshape(ctx: MappingContext, node: TfLiteNode) -> None:
    """TFLite gives the shape as input 1 (a 1-D tensor; here a constant, possibly folded from
    SHAPE arithmetic) or ReshapeOptions.new_shape; the result, its -1 resolved from the input's
    size, becomes NNAPI's constant shape operand. It is computed, not read from the output
    tensor: after a resize TFLite leaves that tensor's dims stale (a RESHAPE to a computed
    shape is prepared only when it runs), and the partition's shapes are inferred from it."""
    x, y, _ = same_io(ctx, node, OperationType.RESHAPE, (1, 2))
    shape = None
    if len(node.inputs) == 2 and node.inputs[1] >= 0:
        given = constant_ints(ctx, 1, "shape")
        shape = given.tolist() if given.ndim == 1 else None
    if shape is None and ctx.option("new_shape"):
        shape = [int(d) for d in ctx.option("new_shape")]
    ins = [ctx.tensor(node.inputs[0]), int32_constant(ctx, y.shape if shape is None else
                                                      _resolve_shape(shape, x.shape))]
    ctx.operation(OperationType.RESHAPE, ins, [ctx.tensor(node.outputs[0])])


def _resolve_shape(shape: list[int], input_shape) -> list[int]:
    """TFLite's RESHAPE output shape: at most one -1, which takes the input's remaining size."""
    size = int(np.prod(input_shape, dtype=np.int64))
    known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise MappingError(f"shape {shape} has more than one -1 or a negative dimension")
    if -1 in shape:
        if known == 0 or size % known:
            raise MappingError(f"shape {shape} does not fit the input {list(input_shape)}")
        shape = [size // known if d == -1 else d for d in shape]
    elif known != size:
        raise MappingError(f"shape {shape} has {known} elements, the input {list(input_shape)} {size}")
    return shape


@mapper(BuiltinOperator.SQUEEZE, options=OptionsReader("SqueezeOptions", _read_squeeze))
def map_squeeze(ctx: MappingContext, node: TfLiteNode) -> None:
    x, _, _ = same_io(ctx, node, OperationType.SQUEEZE, (1,))
    dims = [int(d) for d in ctx.option("squeeze_dims", []) or []]
    rank = len(x.shape)
    if any(not -rank <= d < rank for d in dims):
        raise MappingError(f"squeeze_dims {dims} out of range for rank {rank}")
    axes = omitted(ctx) if not dims else int32_constant(ctx, [d % rank for d in dims])
    ctx.operation(OperationType.SQUEEZE, [ctx.tensor(node.inputs[0]), axes],
                  [ctx.tensor(node.outputs[0])])


@mapper(BuiltinOperator.TRANSPOSE, options=no_options("TransposeOptions"))
def map_transpose(ctx: MappingContext, node: TfLiteNode) -> None:
    same_io(ctx, node, OperationType.TRANSPOSE, (2,))
    perm = constant_ints(ctx, 1, "perm").reshape(-1)
    ctx.operation(OperationType.TRANSPOSE, [ctx.tensor(node.inputs[0]), int32_constant(ctx, perm)],
                  [ctx.tensor(node.outputs[0])])


_BLOCK = {BuiltinOperator.DEPTH_TO_SPACE: OperationType.DEPTH_TO_SPACE,
          BuiltinOperator.SPACE_TO_DEPTH: OperationType.SPACE_TO_DEPTH}


@mapper(*_BLOCK, options={BuiltinOperator.DEPTH_TO_SPACE: OptionsReader("DepthToSpaceOptions", _read_block),
                          BuiltinOperator.SPACE_TO_DEPTH: OptionsReader("SpaceToDepthOptions", _read_block)})
def map_block(ctx: MappingContext, node: TfLiteNode) -> None:
    """TFLite is NHWC only: NNAPI's optional layout input is left out (NHWC)."""
    op = _BLOCK[node.builtin_code]
    same_io(ctx, node, op, (1,))
    block = int(ctx.option("block_size", 0))
    ctx.operation(op, [ctx.tensor(node.inputs[0]), ctx.int32(block)], [ctx.tensor(node.outputs[0])])
