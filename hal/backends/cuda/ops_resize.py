"""ONNX Resize (opset 17), nearest mode: one index_select per resized axis, the source index of
each output position computed once per input shape with ONNX's coordinate transform and rounding.
The lowerings emit it to spread a [N, C, 1, 1] gate over a feature map (hal/backends/ort/gate.py);
linear and cubic modes are not run (no lowering emits them)."""
from __future__ import annotations

import numpy as np
import torch

from hal.backends.cuda.program import Node, Unsupported, operator, per_shape


def _text(value, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else value


def _source(x_out: np.ndarray, n_in: int, n_out: int, scale: float, transform: str) -> np.ndarray:
    """ONNX's coordinate transform: the input coordinate of each output coordinate."""
    if transform == "asymmetric":
        return x_out / scale
    if transform == "half_pixel":
        return (x_out + 0.5) / scale - 0.5
    if transform == "pytorch_half_pixel":
        return (x_out + 0.5) / scale - 0.5 if n_out > 1 else np.zeros_like(x_out)
    if transform == "align_corners":
        return x_out * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros_like(x_out)
    if transform == "tf_half_pixel_for_nn":
        return (x_out + 0.5) / scale
    raise Unsupported(f"Resize coordinate_transformation_mode {transform}")


def _round(x: np.ndarray, mode: str) -> np.ndarray:
    if mode == "floor":
        return np.floor(x)
    if mode == "ceil":
        return np.ceil(x)
    if mode == "round_prefer_floor":
        return np.where(x - np.floor(x) == 0.5, np.floor(x), np.round(x))
    if mode == "round_prefer_ceil":
        return np.where(x - np.floor(x) == 0.5, np.ceil(x), np.round(x))
    raise Unsupported(f"Resize nearest_mode {mode}")


@operator("Resize")
def _resize(node: Node):
    if _text(node.attr("mode"), "nearest") != "nearest":
        raise Unsupported(f"Resize mode {_text(node.attr('mode'), 'nearest')}")
    if node.attr("antialias", 0) or node.attr("axes") is not None \
            or _text(node.attr("keep_aspect_ratio_policy"), "stretch") != "stretch":
        raise Unsupported("Resize with antialias, axes or a kept aspect ratio")
    if len(node.proto.input) > 1 and node.proto.input[1]:
        raise Unsupported("Resize with a region of interest")
    transform = _text(node.attr("coordinate_transformation_mode"), "half_pixel")
    rounding = _text(node.attr("nearest_mode"), "round_prefer_floor")
    scales = node.const(2) if len(node.proto.input) > 2 and node.proto.input[2] else None
    sizes = node.const(3) if len(node.proto.input) > 3 and node.proto.input[3] else None
    if (scales is None or scales.size == 0) == (sizes is None or sizes.size == 0):
        raise Unsupported("Resize needs constant scales or sizes, one of them")
    @per_shape
    def plan(x) -> list:
        steps = []
        for axis, n_in in enumerate(x.shape):
            if sizes is not None and sizes.size:
                n_out = int(sizes[axis])
                scale = n_out / n_in
            else:
                scale = float(scales[axis])
                n_out = int(np.floor(n_in * scale))
            if n_out == n_in and scale == 1.0:
                continue
            source = _round(_source(np.arange(n_out, dtype=np.float64), n_in, n_out, scale, transform), rounding)
            index = np.clip(source, 0, n_in - 1).astype(np.int64)
            steps.append((axis, torch.as_tensor(index, device=x.device)))
        return steps

    def resize(x, *_):
        for axis, index in plan(x):
            x = x.index_select(axis, index)
        return x
    return resize
