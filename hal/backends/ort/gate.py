"""MUL in the forms onnxruntime keeps in its NCHWc layout: a squeeze-excite block's gate.

onnxruntime runs a Mul on NCHWc values only when both inputs are NCHWc values of one shape (a
constant operand, or a [N, C, 1, 1] operand broadcast over the rows and columns, is not in that
layout): a squeeze-excite block (MEAN, 1x1 CONV + RELU, 1x1 CONV + RELU6, MUL by 1/6, MUL onto the
block's input) reordered the block's input out of NCHWc and the product back in around every block.
Two forms keep it in NCHWc, both exact:

* ``hard_sigmoid``: MUL of a CONV's RELU6 (Clip(z, 0, 6)) by a constant c with 6 * c == 1 in
  float32 (1/6) is HardSigmoid(z) with alpha c and beta 0, which onnxruntime fuses into the
  convolution: max(0, min(1, c * z)) is c * clip(z, 0, 6): for z in [0, 6] both are c * z rounded
  once (at most 6 * c = 1, so min(1, .) changes nothing), above 6 both are 1, below 0 both are 0
  (NaN: kept by onnxruntime's HardSigmoid as by the reference; tested).
* ``spread``: MUL of a full [N, C, H, W] value by a [N, C, 1, 1] gate spreads the gate to [N, C, H, W]
  first (Resize, nearest: a copy), which onnxruntime does in NCHWc; the Mul is then of two NCHWc
  values. One more write of the block's size, where the reorders were two reads and two writes.

Both apply in NCHW only (``OnnxGraph.channels_first``), where the convolutions' values are.
"""
from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from hal.backends.ort.graph import OnnxGraph
from hal.registry import OperationContext


def _constant(g: OnnxGraph, name: str) -> np.ndarray | None:
    """The value of initializer ``name``; None when it is not one."""
    found = next((t for t in g.initializers if t.name == name), None)
    return None if found is None else numpy_helper.to_array(found)


def _relu6_input(g: OnnxGraph, name: str) -> str | None:
    """z when ``name`` is Clip(z, 0, 6)'s output, else None."""
    node = next((n for n in reversed(g.nodes) if name in n.output), None)
    if node is None or node.op_type != "Clip" or len(node.input) != 3:
        return None
    low, high = _constant(g, node.input[1]), _constant(g, node.input[2])
    if low is None or high is None or low.size != 1 or high.size != 1:
        return None
    return node.input[0] if float(low.item()) == 0.0 and float(high.item()) == 6.0 else None


def hard_sigmoid(g: OnnxGraph, ctx: OperationContext, a: str, b: str) -> str | None:
    """HardSigmoid for ``a * b`` (NCHW names) when one is a RELU6 and the other 1/6, else None."""
    for data, k in ((a, 1), (b, 0)):  # k: the constant's input
        c = ctx.input(k).value
        if c is None or np.asarray(c).size != 1 or tuple(ctx.input(1 - k).shape) != tuple(ctx.output(0).shape):
            continue
        c = np.float32(np.asarray(c, np.float32).item())
        if not (c > 0 and np.float32(6) * c == np.float32(1)):
            continue
        z = _relu6_input(g, data)
        if z is not None:
            return g.node("HardSigmoid", [z], alpha=float(c), beta=0.0)
    return None


def spread(g: OnnxGraph, ctx: OperationContext, a: str, b: str) -> tuple[str, str] | None:
    """``a`` and ``b`` (NCHW names) with a [N, C, 1, 1] gate spread over the other's rows and
    columns, when one is such a gate of a full-size value; None otherwise."""
    out = tuple(ctx.output(0).shape)
    if len(out) != 4 or out[1] * out[2] == 1:
        return None
    shapes = [tuple(ctx.input(i).shape) for i in (0, 1)]
    gate = (out[0], 1, 1, out[3])
    if any(ctx.input(i).value is not None for i in (0, 1)) or sorted(shapes) != sorted([gate, out]):
        return None
    n, h, w, c = out
    sizes = g.ints([n, c, h, w])

    def wide(v: str) -> str:  # every output cell reads input cell (0, 0)
        return g.node("Resize", [v, None, None, sizes], mode="nearest",
                      coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    return (wide(a), b) if shapes[0] == gate else (a, wide(b))
