"""ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM, PRELU and POW as ONNX's broadcasting binary operators.

ONNX broadcasts both inputs numpy-style, as NNAPI does, so the operators map one to one:

* ADD, SUB, MUL (float32; int32, which wraps in onnxruntime as in the reference) and DIV (float32:
  x / 0 is inf or nan in both) with the fused activation as Relu / Clip. int32 DIV is NNAPI's
  floor division where onnxruntime truncates and traps on x / 0: declined (reference).
* MAXIMUM / MINIMUM as Where(Greater/Less(a, b), a, b): the reference's (TFLite's) ``a > b ? a : b``,
  which picks b when a is NaN; onnxruntime's Max / Min propagate any NaN.
* PRELU (TFLite's x >= 0 ? x : x * alpha) with a constant alpha as Max(x, x * alpha) when every
  alpha is <= 1 and not 0, Min(x, x * alpha) when every alpha is >= 1: the same value up to the
  sign of a zero (x * alpha lies on the right side of x; infinities and NaN agree too; alpha = 0
  is left out because +inf * 0 is NaN). Two memory-speed passes, where onnxruntime's PRelu with a
  per-channel slope was half of a landmark network's time (96x96x16 blocks, measured: PRelu 4.5x
  a Relu in NHWC, 3.7x in NCHW; Max/Mul in NCHW 1.2x). Neither Max nor Mul by a per-channel
  constant exists in onnxruntime's NCHWc layout: between NCHWc convolutions both run on the
  blocked tensor itself (blocked.py, after onnxruntime's optimiser), with no reorder around them.
  Forms made only of NCHWc operators (relu(x) - alpha * relu(-x) with 1x1 depthwise or diagonal
  convolutions) were slower on the face-landmark-style network (2.2-2.6 ms against 1.6 ms of
  kernel time: a 1x1 NCHWc convolution costs 2-3x a Relu pass), and lose a NaN (MLAS's Relu
  is max(x, 0)); ONNX PRelu on the blocked view, 2.7x Max/Mul there. Otherwise
  PRelu when alpha broadcasts into the input's shape (ONNX broadcasts the slope one way only),
  else Where(x >= 0, x, x * alpha).
* POW as Pow (float32; within CTS's tolerance of powf).

Layout: computed in NCHW when an input already exists there (``OnnxGraph.channels_first``); in
NHWC a per-channel constant is tiled over a row of pixels (``_rows``).
"""
from __future__ import annotations

import numpy as np

from hal.backends.ort import BACKEND, gate
from hal.backends.ort.graph import OnnxGraph
from hal.operations.common import F32, I32
from hal.operations.elementwise import ADD, ALPHA, DIV, INPUT, LHS, MAXIMUM, MINIMUM, MUL, PRELU, RHS, SUB, BinaryParams
from hal.operations.unary import BASE, EXPONENT, POW
from hal.registry import OperationContext

_ARITHMETIC = {ADD: "Add", SUB: "Sub", MUL: "Mul", DIV: "Div"}


#: The most elements of a per-channel constant tiled over an NHWC row (``_rows``).
ROW_MAX_ELEMENTS = 16384


def _rows(g: OnnxGraph, ctx: OperationContext, x, i: int) -> str:
    """Input ``i`` for an NHWC operation: a constant that varies along the channels only
    ([C], [1, 1, C], ...) tiled to [1, 1, W, C] where that holds at most ROW_MAX_ELEMENTS, else as
    it is. onnxruntime broadcasts a constant one innermost span at a time: C elements per call
    for [C], W * C for [1, 1, W, C]. Measured (Mul and Max by per-channel alpha, a PRELU):
    32x32x64 19.9 -> 10.4 us, 96x96x16 102.4 -> 29.6 us, 56x56x24 40.3 -> 11.9 us."""
    out, info = ctx.output(0).shape, ctx.input(i)
    if info.value is None or len(out) != 4 or info.dtype != np.float32:
        return x[i]
    value = np.asarray(info.value, np.float32)
    n, h, w, c = out
    if value.ndim > 4 or value.size != c or value.shape[-1] != c or c == 1 or w * c > ROW_MAX_ELEMENTS:
        return x[i]
    return g.const(np.ascontiguousarray(np.broadcast_to(value.reshape(c), (1, 1, w, c))), "row_const")


def _binary(g: OnnxGraph, ctx: OperationContext, x, build) -> list[str]:
    """``build(a, b)`` on both inputs, in NCHW when one of them is already there."""
    nchw = g.channels_first(ctx, x, (LHS, RHS))  # (PRELU's INPUT, ALPHA: the same positions)
    if nchw is None:
        return [build(_rows(g, ctx, x, LHS), _rows(g, ctx, x, RHS))]
    return [g.nhwc(build(*nchw))]


def lower_arithmetic(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    p: BinaryParams = ctx.params
    return _binary(g, ctx, x, lambda a, b: g.activation(g.node(_ARITHMETIC[ctx.op_type], [a, b]), p.act))


def lower_mul(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    """MUL; in NCHW (float32) in the forms of a squeeze-excite gate onnxruntime keeps in NCHWc."""
    p: BinaryParams = ctx.params
    nchw = g.channels_first(ctx, x, (LHS, RHS))
    if nchw is None or ctx.input_type(LHS) != F32:
        return _binary(g, ctx, x, lambda a, b: g.activation(g.node("Mul", [a, b]), p.act))
    a, b = nchw
    y = gate.hard_sigmoid(g, ctx, a, b)
    if y is None:
        y = g.node("Mul", list(gate.spread(g, ctx, a, b) or (a, b)))
    return [g.nhwc(g.activation(y, p.act))]


def lower_min_max(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    def build(a: str, b: str) -> str:
        pick_a = g.node("Greater" if ctx.op_type == MAXIMUM else "Less", [a, b])
        return g.node("Where", [pick_a, a, b])
    return _binary(g, ctx, x, build)


def prelu_form(alpha: np.ndarray | None) -> str | None:
    """"Max" or "Min" when Max/Min(x, x * alpha) is PRELU exactly for this constant alpha."""
    if alpha is None or alpha.size == 0 or not np.all(np.isfinite(alpha)) or np.any(alpha == 0):
        return None
    if np.all(alpha <= 1):
        return "Max"
    if np.all(alpha >= 1):
        return "Min"
    return None


def lower_prelu(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    alpha = ctx.input(ALPHA).value
    form = prelu_form(None if alpha is None else np.asarray(alpha, np.float32))
    same_shape = tuple(ctx.input(INPUT).shape) == tuple(ctx.output(0).shape)

    def build(data: str, slope: str) -> str:
        if form is not None:
            return g.node(form, [data, g.node("Mul", [data, slope])])
        if same_shape:
            return g.node("PRelu", [data, slope])
        # The alpha broadcasts the input up: PRelu cannot, so the reference's formula as it stands.
        positive = g.node("GreaterOrEqual", [data, g.const(np.float32(0))])
        return g.node("Where", [positive, data, g.node("Mul", [data, slope])])
    return _binary(g, ctx, x, build)


def lower_pow(g: OnnxGraph, ctx: OperationContext, x) -> list[str]:
    return [g.node("Pow", [x[BASE], x[EXPONENT]])]


BACKEND.lowering([ADD, SUB], lower=lower_arithmetic, types=[F32, I32])
BACKEND.lowering(MUL, lower=lower_mul, types=[F32, I32])
BACKEND.lowering(DIV, lower=lower_arithmetic, types=[F32])
BACKEND.lowering([MAXIMUM, MINIMUM], lower=lower_min_max, types=[F32, I32])
BACKEND.lowering(PRELU, lower=lower_prelu, types=[F32])
BACKEND.lowering(POW, lower=lower_pow, types=[F32])
