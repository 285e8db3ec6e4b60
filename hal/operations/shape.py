"""Data-movement ops: RESHAPE, SQUEEZE, TRANSPOSE, DEPTH_TO_SPACE, SPACE_TO_DEPTH.

None of them changes a value, so quantized tensors need no arithmetic: NNAPI
requires the output's scale and zero point to equal the input's (validated),
and every type runs the same numpy index shuffle. Outputs are fresh arrays,
never views of an input, so a caller may reuse its input buffers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hal.operations._legacy import register
from hal.operations.common import BOOL, F32, I32, INT32, QS8, QU8, QUANT8
from hal.registry import OperationContext
from hal.types import OperationType

SHAPE_TYPES = (F32, QU8, QS8)
MAX_RANK = 4


# ---- shared checks ----------------------------------------------------------------

def validate_same_io(ctx: OperationContext, max_rank: int | None = MAX_RANK) -> int:
    """Input 0 of a supported type, one output of the same type and quantization."""
    ctx.expect_num_outputs(1)
    ctx.expect_input_type(0, *SHAPE_TYPES)
    t = ctx.input_type(0)
    ctx.expect_output_type(0, t)
    if t in QUANT8:
        ctx.expect_same_quantization(0)
    if max_rank is not None:
        ctx.expect_max_input_rank(0, max_rank)
    return t


def int_vector(ctx: OperationContext, i: int, what: str, length: int | None = None) -> list[int] | None:
    """Constant 1-D TENSOR_INT32 input i as a list (None while it is not a constant)."""
    ctx.expect_input_type(i, I32)
    info = ctx.input(i)
    if info.shape and len(info.shape) != 1:
        raise ctx.fail(f"input {i} ({what}) must be 1-D, got shape {list(info.shape)}")
    if not info.is_constant:
        return None
    v = info.value
    if v.ndim != 1:
        raise ctx.fail(f"input {i} ({what}) must be 1-D, got shape {list(v.shape)}")
    if length is not None and v.shape[0] != length:
        raise ctx.fail(f"input {i} ({what}) must have {length} entries (the input rank), "
                       f"got {v.shape[0]}")
    return [int(x) for x in v]


def need_constant_vector(ctx: OperationContext, i: int, what: str, length: int | None = None) -> list[int]:
    v = int_vector(ctx, i, what, length)
    if v is None:
        raise ctx.fail(f"input {i} ({what}) must be a constant operand for this driver")
    return v


def need_shape(ctx: OperationContext, i: int = 0) -> tuple[int, ...]:
    info = ctx.input(i)
    if not info.shape or not all(d >= 0 for d in info.shape):
        raise ctx.fail(f"input {i} shape {list(info.shape)} must be known")
    return info.shape


def _copy(ctx: OperationContext, inputs: list) -> list:
    return [np.array(inputs[0], copy=True).reshape(ctx.data)]


# ---- RESHAPE ------------------------------------------------------------------------

def _reshape_target(ctx: OperationContext, shape: list[int], count: int | None) -> tuple[int, ...] | None:
    """NNAPI shape operand -> output dims; at most one -1, inferred from the element count."""
    if len(shape) > MAX_RANK:
        raise ctx.fail(f"input 1 (shape) must have at most {MAX_RANK} entries, got {len(shape)}")
    if shape.count(-1) > 1:
        raise ctx.fail(f"input 1 (shape) may contain at most one -1, got {shape}")
    if any(d < -1 for d in shape):
        raise ctx.fail(f"input 1 (shape) entries must be >= 0 or -1, got {shape}")
    if count is None:
        return None
    known = math.prod(d for d in shape if d != -1)
    if -1 in shape:
        if known == 0 or count % known:
            raise ctx.fail(f"cannot reshape {count} elements into {shape}")
        return tuple(count // known if d == -1 else d for d in shape)
    if known != count:
        raise ctx.fail(f"cannot reshape {count} elements into {shape}")
    return tuple(shape)


def _validate_reshape(ctx: OperationContext) -> None:
    ctx.expect_num_inputs(2)
    validate_same_io(ctx)
    shape = int_vector(ctx, 1, "shape")
    info = ctx.input(0)
    if shape is not None:
        _reshape_target(ctx, shape, math.prod(info.shape) if info.fully_specified and info.shape else None)


def _prepare_reshape(ctx: OperationContext) -> tuple[int, ...]:
    count = math.prod(need_shape(ctx))
    out = _reshape_target(ctx, need_constant_vector(ctx, 1, "shape"), count)
    ctx.set_output_shape(0, out)
    return out


# ---- SQUEEZE ------------------------------------------------------------------------

def _squeeze_shape(ctx: OperationContext, shape: tuple[int, ...], axes: list[int] | None) -> tuple[int, ...]:
    rank = len(shape)
    if axes is None:
        drop = {k for k, d in enumerate(shape) if d == 1}
    else:
        drop = set()
        for a in axes:
            if not -rank <= a < rank:
                raise ctx.fail(f"input 1 (axes): axis {a} is out of range for rank {rank}")
            k = a + rank if a < 0 else a
            if shape[k] != 1:
                raise ctx.fail(f"input 1 (axes): cannot squeeze dimension {k} of size {shape[k]}")
            drop.add(k)
    out = tuple(d for k, d in enumerate(shape) if k not in drop)
    return out or (1,)  # NNAPI: squeezing every dimension leaves shape [1]


def _validate_squeeze(ctx: OperationContext) -> None:
    ctx.expect_num_inputs(2)
    validate_same_io(ctx)
    info = ctx.input(0)
    axes = int_vector(ctx, 1, "axes") if ctx.has_input(1) else None
    if axes is not None and info.shape and info.fully_specified:
        _squeeze_shape(ctx, info.shape, axes)


def _prepare_squeeze(ctx: OperationContext) -> tuple[int, ...]:
    axes = need_constant_vector(ctx, 1, "axes") if ctx.has_input(1) else None
    out = _squeeze_shape(ctx, need_shape(ctx), axes)
    ctx.set_output_shape(0, out)
    return out


# ---- TRANSPOSE ----------------------------------------------------------------------

def _check_perm(ctx: OperationContext, perm: list[int], rank: int) -> None:
    if sorted(perm) != list(range(rank)):
        raise ctx.fail(f"input 1 (perm) {perm} is not a permutation of the {rank} input dimensions")


def _validate_transpose(ctx: OperationContext) -> None:
    ctx.expect_num_inputs(2)
    validate_same_io(ctx)
    info = ctx.input(0)
    if ctx.has_input(1):
        perm = int_vector(ctx, 1, "perm", info.rank if info.shape else None)
        if perm is not None and info.shape:
            _check_perm(ctx, perm, info.rank)


def _prepare_transpose(ctx: OperationContext) -> tuple[int, ...]:
    shape = need_shape(ctx)
    rank = len(shape)
    if ctx.has_input(1):
        perm = need_constant_vector(ctx, 1, "perm", rank)
        _check_perm(ctx, perm, rank)
    else:  # NNAPI: omitted perm means (n-1, ..., 0)
        perm = list(range(rank - 1, -1, -1))
    ctx.set_output_shape(0, [shape[p] for p in perm])
    return tuple(perm)


def _execute_transpose(ctx: OperationContext, inputs: list) -> list:
    return [np.ascontiguousarray(np.transpose(inputs[0], ctx.data))]


# ---- DEPTH_TO_SPACE / SPACE_TO_DEPTH -------------------------------------------------

@dataclass
class BlockData:
    block: int
    nchw: bool


def _validate_block(ctx: OperationContext) -> None:
    ctx.expect_num_inputs(2, 3)
    validate_same_io(ctx)
    info = ctx.input(0)
    if info.shape:
        ctx.expect_input_rank(0, 4)
    bs = ctx.scalar(1, INT32)
    ctx.check(bs >= 1, f"input 1 (block_size) must be >= 1, got {bs}")
    nchw = bool(ctx.optional_scalar(2, False, BOOL))
    if info.shape and info.fully_specified:
        _block_output(ctx, info.shape, bs, nchw)


def _block_output(ctx: OperationContext, shape: tuple[int, ...], bs: int, nchw: bool) -> tuple[int, ...]:
    n, h, w, c = (shape[0], shape[2], shape[3], shape[1]) if nchw else shape
    if ctx.op_type == OperationType.DEPTH_TO_SPACE:
        ctx.check(c % (bs * bs) == 0, f"input depth {c} must be divisible by block_size * "
                                      f"block_size = {bs * bs}")
        h, w, c = h * bs, w * bs, c // (bs * bs)
    else:
        ctx.check(h % bs == 0 and w % bs == 0, f"input height {h} and width {w} must be divisible "
                                               f"by block_size {bs}")
        h, w, c = h // bs, w // bs, c * bs * bs
    return (n, c, h, w) if nchw else (n, h, w, c)


def _prepare_block(ctx: OperationContext) -> BlockData:
    ctx.expect_input_rank(0, 4)
    data = BlockData(ctx.scalar(1, INT32), bool(ctx.optional_scalar(2, False, BOOL)))
    ctx.set_output_shape(0, _block_output(ctx, need_shape(ctx), data.block, data.nchw))
    return data


def _execute_block(ctx: OperationContext, inputs: list) -> list:
    """TFLite's layout: depth index (dy * block + dx) * c_small + c, in NHWC."""
    d: BlockData = ctx.data
    x = inputs[0]
    if d.nchw:
        x = np.transpose(x, (0, 2, 3, 1))
    n, h, w, c = x.shape
    b = d.block
    if ctx.op_type == OperationType.DEPTH_TO_SPACE:
        y = x.reshape(n, h, w, b, b, c // (b * b)).transpose(0, 1, 3, 2, 4, 5)
        y = y.reshape(n, h * b, w * b, c // (b * b))
    else:
        y = x.reshape(n, h // b, b, w // b, b, c).transpose(0, 1, 3, 2, 4, 5)
        y = y.reshape(n, h // b, w // b, b * b * c)
    if d.nchw:
        y = np.transpose(y, (0, 3, 1, 2))
    return [np.ascontiguousarray(y)]


register(OperationType.RESHAPE, validate=_validate_reshape, prepare=_prepare_reshape,
         execute=_copy, supported_types=SHAPE_TYPES)
register(OperationType.SQUEEZE, validate=_validate_squeeze, prepare=_prepare_squeeze,
         execute=_copy, supported_types=SHAPE_TYPES)
register(OperationType.TRANSPOSE, validate=_validate_transpose, prepare=_prepare_transpose,
         execute=_execute_transpose, supported_types=SHAPE_TYPES)
register([OperationType.DEPTH_TO_SPACE, OperationType.SPACE_TO_DEPTH], validate=_validate_block,
         prepare=_prepare_block, execute=_execute_block, supported_types=SHAPE_TYPES)
