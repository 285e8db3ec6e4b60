"""A sequence operation unrolled over its time steps in NNAPI: the input cut into per-step
operands, and the steps' outputs put back together. For what an NNAPI sequence operation cannot
express: a TANH sequence RNN (``rnn``), the fully integer sequence LSTM (``lstm_integer``).
"""
from __future__ import annotations

from delegate.mapping.core import MappingContext, MappingError
from delegate.mapping.slicing import int32_tensor
from hal.types import OperationType

#: Most time steps a sequence is unrolled over (one or two NNAPI operations a step and direction).
MAX_UNROLLED_STEPS = 256


def time_steps(ctx: MappingContext, time_major: bool, what: str, why: str) -> int:
    """The (static) number of time steps of input 0, within MAX_UNROLLED_STEPS; ``what`` and
    ``why`` (why it is unrolled) name the sequence in the refusal."""
    shape = ctx.input_tensor(0).shape
    if len(shape) != 3:
        raise MappingError(f"input 0 has shape {list(shape)}, not a rank-3 sequence")
    steps = shape[0] if time_major else shape[1]
    if not 1 <= steps <= MAX_UNROLLED_STEPS:
        raise MappingError(f"{what} of {steps} time steps: {why}, and unrolling it step by step is "
                           f"done for 1 to {MAX_UNROLLED_STEPS} steps")
    return steps


def split_steps(ctx: MappingContext, x: int, time_major: bool) -> list[int]:
    """Operands [batch, size] for every time step of sequence operand ``x``: reshaped to 2-D so that
    the steps are consecutive row blocks (time-major [T*B, size]) or column blocks (batch-major
    [B, T*size]), then SPLIT along that axis."""
    d = ctx.builder.operands[x].dimensions
    steps, batch, size = (d[0], d[1], d[2]) if time_major else (d[1], d[0], d[2])
    flat = [steps * batch, size] if time_major else [batch, steps * size]
    x2 = ctx.new_temporary(x, flat)
    ctx.operation(OperationType.RESHAPE, [x, int32_tensor(ctx, flat)], [x2])
    if steps == 1:
        return [x2]
    parts = [ctx.new_temporary(x, [batch, size]) for _ in range(steps)]
    ctx.operation(OperationType.SPLIT, [x2, ctx.int32(0 if time_major else 1), ctx.int32(steps)], parts)
    return parts


def join_steps(ctx: MappingContext, states: list[int], y: int, time_major: bool) -> None:
    """Writes the steps' [batch, units] outputs, in time order, into sequence operand ``y``
    (split_steps backwards: CONCATENATION along that axis, RESHAPE to 3-D)."""
    batch, units = ctx.builder.operands[states[0]].dimensions
    flat = states[0]
    if len(states) > 1:
        flat = ctx.new_temporary(y, [len(states) * batch, units] if time_major else [batch, len(states) * units])
        ctx.operation(OperationType.CONCATENATION, [*states, ctx.int32(0 if time_major else 1)], [flat])
    ctx.operation(OperationType.RESHAPE, [flat, int32_tensor(ctx, ctx.builder.operands[y].dimensions)], [y])
