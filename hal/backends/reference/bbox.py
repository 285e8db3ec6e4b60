"""AXIS_ALIGNED_BBOX_TRANSFORM on numpy, in float32 as NNAPI's CPU path computes it: quantized
boxes and deltas are dequantized first and the result requantized (rounding half away from zero,
saturating). The float helpers here are shared by the other detection kernels (heatmap,
detection_postprocess, generate_proposals)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from hal.backends.reference import BACKEND
from hal.operations.bbox import AXIS_ALIGNED_BBOX_TRANSFORM, BboxTransformParams
from hal.quant import round_half_away
from hal.registry import OperandInfo, OperationContext

F = np.float32


@dataclass(frozen=True)
class Quant:
    """How one operand is stored: None for a float one."""

    scale: float
    zero_point: int


def ieee(execute):
    """Run a kernel with numpy's floating-point warnings off: NaN and infinite inputs propagate
    (or compare false) as in AOSP's C++, and are no reason to warn."""
    @functools.wraps(execute)
    def run(ctx: OperationContext, inputs: list) -> list:
        with np.errstate(all="ignore"):
            return execute(ctx, inputs)
    return run


def quant_of(info: OperandInfo) -> Quant | None:
    return Quant(info.scale, info.zero_point) if info.dtype.kind in "iu" else None


def to_float(x: np.ndarray, q: Quant | None) -> np.ndarray:
    """float32 values of a float or quantized tensor ((q - zero point) * scale, in float32)."""
    if q is None:
        return x.astype(F)
    return (x.astype(np.int32) - q.zero_point).astype(F) * F(q.scale)


def from_float(x: np.ndarray, q: Quant | None, dtype: np.dtype) -> np.ndarray:
    """Store float32 results in ``dtype``: quantized with std::round(x / scale + zero point),
    saturated to the type's range."""
    if q is None:
        return x.astype(dtype)
    info = np.iinfo(dtype)
    v = round_half_away(x.astype(F) / F(q.scale) + F(q.zero_point))
    return np.clip(v, info.min, info.max).astype(dtype)


def check_boxes(ctx: OperationContext, boxes: np.ndarray, what: str) -> None:
    """NNAPI's malformed-box check: every (x1, y1, x2, y2) must have x1 <= x2 and y1 <= y2."""
    bad = ~((boxes[:, 0] <= boxes[:, 2]) & (boxes[:, 1] <= boxes[:, 3]))
    if bad.any():
        k = int(np.argmax(bad))
        raise ctx.fail(f"{what} {k} has x2 < x1 or y2 < y1 (or is NaN): {boxes[k].tolist()}")


def transform(rois: np.ndarray, deltas: np.ndarray, heights: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """Boxes [n, 4] moved by deltas [n, c, 4] and clipped to per-box image sizes [n]: [n, c, 4].
    Float32 throughout, in AOSP's order of operations (centre/size form, then corners)."""
    w = (rois[:, 2] - rois[:, 0])[:, None]
    h = (rois[:, 3] - rois[:, 1])[:, None]
    cx = ((rois[:, 0] + rois[:, 2]) / F(2))[:, None]
    cy = ((rois[:, 1] + rois[:, 3]) / F(2))[:, None]
    new_w = np.exp(deltas[..., 2]) * w
    new_h = np.exp(deltas[..., 3]) * h
    new_x = cx + deltas[..., 0] * w
    new_y = cy + deltas[..., 1] * h
    half_w, half_h = new_w / F(2), new_h / F(2)
    x1, x2 = new_x - half_w, new_x + half_w
    y1, y2 = new_y - half_h, new_y + half_h
    wmax, hmax = widths[:, None], heights[:, None]
    out = np.stack([np.minimum(np.maximum(x1, F(0)), wmax), np.minimum(np.maximum(y1, F(0)), hmax),
                    np.minimum(np.maximum(x2, F(0)), wmax), np.minimum(np.maximum(y2, F(0)), hmax)], axis=-1)
    return out.astype(F)


@dataclass
class BboxData:
    p: BboxTransformParams
    roi_q: Quant | None
    delta_q: Quant | None
    info_q: Quant | None
    out_q: Quant | None


def plan(ctx: OperationContext) -> BboxData:
    return BboxData(ctx.params, quant_of(ctx.inputs[0]), quant_of(ctx.inputs[1]), quant_of(ctx.inputs[3]),
                    quant_of(ctx.outputs[0]))


@ieee
def execute(ctx: OperationContext, inputs: list) -> list:
    d: BboxData = ctx.data
    rois = to_float(inputs[0], d.roi_q).reshape(-1, 4)
    n = rois.shape[0]
    deltas = to_float(inputs[1], d.delta_q).reshape(n, d.p.num_classes, 4)
    batches = inputs[2].astype(np.int64)
    info = to_float(inputs[3], d.info_q).reshape(-1, 2)
    bad = (batches < 0) | (batches >= info.shape[0])
    if bad.any():
        k = int(np.argmax(bad))
        raise ctx.fail(f"roi {k} has batch index {int(batches[k])}, not in [0, {info.shape[0]})")
    check_boxes(ctx, rois, "roi")
    out = transform(rois, deltas, info[batches, 0], info[batches, 1]).reshape(n, -1)
    return [from_float(out, d.out_q, ctx.outputs[0].dtype)]


BACKEND.register(AXIS_ALIGNED_BBOX_TRANSFORM, plan=plan, execute=execute)
