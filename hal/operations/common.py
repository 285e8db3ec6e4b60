"""Helpers shared by op specs: type sets, broadcasting, activations, padding, windows.

Scalar readers adapt to the phase: while validating, a parameter that is not a constant (a model
input) reads as None and its value checks are left to prepare."""
from __future__ import annotations

from dataclasses import dataclass

from hal.registry import OperationContext
from hal.types import FusedActivationFunc, OperandType, PaddingScheme

F32 = OperandType.TENSOR_FLOAT32
F16 = OperandType.TENSOR_FLOAT16
I32 = OperandType.TENSOR_INT32
QU8 = OperandType.TENSOR_QUANT8_ASYMM
QS8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
QPC = OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL
INT32 = OperandType.INT32
FLOAT32 = OperandType.FLOAT32
BOOL = OperandType.BOOL
QUANT8 = (QU8, QS8)


def broadcast_shape(ctx: OperationContext, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """NNAPI/numpy broadcasting of two shapes, with a clear error."""
    out = []
    for i in range(max(len(a), len(b))):
        da = a[len(a) - 1 - i] if i < len(a) else 1
        db = b[len(b) - 1 - i] if i < len(b) else 1
        if da != db and da != 1 and db != 1:
            raise ctx.fail(f"inputs of shapes {list(a)} and {list(b)} cannot be broadcast")
        out.append(db if da == 1 else da)
    return tuple(reversed(out))


def _param(ctx: OperationContext, i: int, *types: int):
    return ctx.known_scalar(i, *types) if ctx.validating else ctx.scalar(i, *types)


def fused_activation(ctx: OperationContext, i: int) -> FusedActivationFunc | None:
    """Read the fused activation scalar at input i and check it is a known code (None while
    validating a non-constant one)."""
    v = _param(ctx, i, INT32)
    if v is None:
        return None
    try:
        return FusedActivationFunc(v)
    except ValueError:
        raise ctx.fail(f"input {i}: unknown fused activation {v}") from None


def implicit_padding(in_size: int, stride: int, filter_size: int, dilation: int,
                     scheme: int) -> tuple[int, int]:
    """NNAPI calculateExplicitPadding (== TFLite ComputePaddingHeightWidth): (head, tail)."""
    if scheme == PaddingScheme.VALID:
        return 0, 0
    eff = (filter_size - 1) * dilation + 1
    out = (in_size + stride - 1) // stride
    needed = max(0, (out - 1) * stride + eff - in_size)
    return needed // 2, needed - needed // 2


def conv_output_size(in_size: int, filter_size: int, stride: int, dilation: int,
                     pad_head: int, pad_tail: int) -> int:
    eff = (filter_size - 1) * dilation + 1
    return (in_size - eff + stride + pad_head + pad_tail) // stride


def padding_scheme(ctx: OperationContext, i: int) -> PaddingScheme | None:
    v = _param(ctx, i, INT32)
    if v is None:
        return None
    try:
        return PaddingScheme(v)
    except ValueError:
        raise ctx.fail(f"input {i}: unknown implicit padding scheme {v}") from None


def param(ctx: OperationContext, i: int, *types: int):
    """A scalar parameter: its value, or None while validating a non-constant one."""
    return _param(ctx, i, *types)


def optional_param(ctx: OperationContext, i: int, default, *types: int):
    return _param(ctx, i, *types) if ctx.has_input(i) else default


@dataclass(frozen=True)
class Window:
    """One spatial axis of a sliding window (conv, depthwise, pools): the padding resolved from an
    explicit pair or an implicit scheme, and the output size. ``reach`` is how much tail padding the
    windows actually touch (a kernel never needs more)."""

    size: int
    filter: int
    stride: int
    dilation: int
    pad_head: int
    pad_tail: int
    out: int

    @property
    def effective(self) -> int:
        return (self.filter - 1) * self.dilation + 1

    @property
    def reach(self) -> int:
        return max(0, (self.out - 1) * self.stride + self.effective - self.pad_head - self.size)


def window(size: int, filter_size: int, stride: int, dilation: int = 1, *,
           pads: tuple[int, int] | None = None, scheme: int | None = None) -> Window:
    """Resolve one axis: explicit ``pads`` (head, tail) or an implicit padding ``scheme``."""
    head, tail = pads if pads is not None else implicit_padding(size, stride, filter_size, dilation, scheme)
    return Window(size, filter_size, stride, dilation, head, tail,
                  conv_output_size(size, filter_size, stride, dilation, head, tail))


def check_window_params(ctx: OperationContext, pads: tuple[int, int, int, int] | None, scheme: int | None,
                        stride_w: int, stride_h: int) -> None:
    """The window parameters conv, depthwise and pools share: explicit paddings (at ``pads``) are
    >= 0, or the implicit scheme (at ``scheme``) is a known one; strides are >= 1. While
    validating, only the known (constant) ones are checked."""
    if pads is not None:
        values = [param(ctx, i, INT32) for i in pads]
        ctx.check(all(p is None or p >= 0 for p in values), f"paddings must be >= 0, got {values}")
    else:
        padding_scheme(ctx, scheme)
    sw, sh = param(ctx, stride_w, INT32), param(ctx, stride_h, INT32)
    ctx.check(all(s is None or s >= 1 for s in (sw, sh)), f"strides must be >= 1, got width {sw}, height {sh}")


def sequence_shape(ctx: OperationContext, i: int, time_major: bool) -> tuple[int, int, int]:
    """(max_time, batch, size) of a rank-3 sequence input (the RNN and LSTM sequence operations)."""
    s = ctx.input_shape(i)
    ctx.check(len(s) == 3, f"input {i} must be rank 3, got {list(s)}")
    return (s[0], s[1], s[2]) if time_major else (s[1], s[0], s[2])


def sequence_output_shape(max_time: int, batch: int, units: int, time_major: bool) -> tuple[int, int, int]:
    return (max_time, batch, units) if time_major else (batch, max_time, units)
