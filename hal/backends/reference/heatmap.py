"""HEATMAP_MAX_KEYPOINT on numpy, vectorised over boxes and keypoints, in float32 as NNAPI's CPU
path computes it (quantized inputs dequantized, outputs requantized with std::round).

Per heatmap: the first maximum; its 3x3 neighbourhood, mirrored at the border (index -1 reads 1,
index size reads size - 2); the quadratic's gradient b and Hessian A there; the offset
A⁻¹b (no move when A is numerically singular), scaled back to at most 1.5 cells; the quadratic's
value there as the score; the cell centre plus offset, relative to the heatmap, mapped into the box.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal.backends.reference import BACKEND
from hal.backends.reference.bbox import Quant, check_boxes, from_float, ieee, quant_of, to_float
from hal.operations.heatmap import HEATMAP_MAX_KEYPOINT, HeatmapParams
from hal.registry import OperationContext

F = np.float32


@dataclass
class HeatmapData:
    p: HeatmapParams
    heatmap_q: Quant | None
    boxes_q: Quant | None
    score_q: Quant | None
    keypoint_q: Quant | None


def plan(ctx: OperationContext) -> HeatmapData:
    return HeatmapData(ctx.params, quant_of(ctx.inputs[0]), quant_of(ctx.inputs[1]), quant_of(ctx.outputs[0]),
                       quant_of(ctx.outputs[1]))


def solve_for_delta(g: np.ndarray, max_score: np.ndarray, atol: float, rtol: float):
    """Offsets (dx, dy) and refined scores from 3x3 grids ``g`` [..., 3, 3] (row = y)."""
    b0 = -(g[..., 1, 2] - g[..., 1, 0]) / F(2)
    b1 = -(g[..., 2, 1] - g[..., 0, 1]) / F(2)
    a00 = g[..., 1, 0] - F(2) * g[..., 1, 1] + g[..., 1, 2]
    a01 = (g[..., 2, 2] - g[..., 2, 0] - g[..., 0, 2] + g[..., 0, 0]) / F(4)
    a11 = g[..., 0, 1] - F(2) * g[..., 1, 1] + g[..., 2, 1]
    cross1 = a00 * a11
    det = cross1 - a01 * a01
    solvable = ~(np.abs(det) < F(atol) + F(rtol) * cross1)
    safe_det = np.where(solvable, det, F(1))
    d0 = np.where(solvable, (a11 * b0 - a01 * b1) / safe_det, F(0)).astype(F)
    d1 = np.where(solvable, (a00 * b1 - a01 * b0) / safe_det, F(0)).astype(F)
    big = np.maximum(np.abs(d0), np.abs(d1))
    clip = (np.abs(d0) > F(1.5)) | (np.abs(d1) > F(1.5))
    scale = F(1.5) / np.where(clip, big, F(1))
    d0 = np.where(clip, d0 * scale, d0)
    d1 = np.where(clip, d1 * scale, d1)
    score = g[..., 1, 1] - b0 * d0 - b1 * d1 + ((a00 * d0 + a01 * d1) * d0 + (a01 * d0 + a11 * d1) * d1) / F(2)
    return d0, d1, np.where(solvable, score, max_score).astype(F)


@ieee
def execute(ctx: OperationContext, inputs: list) -> list:
    d: HeatmapData = ctx.data
    p = d.p
    heat = to_float(inputs[0], d.heatmap_q)
    if p.nchw:
        heat = heat.transpose(0, 2, 3, 1)
    n, s, k = p.num_boxes, p.heatmap_size, p.num_keypoints
    boxes = to_float(inputs[1], d.boxes_q).reshape(n, 4)
    check_boxes(ctx, boxes, "box")
    flat = heat.reshape(n, s * s, k)
    # the first strict maximum, as a scan from -FLT_MAX finds it (NaN never wins)
    cand = np.where(np.isnan(flat), F(-np.inf), flat)
    idx = np.argmax(cand, axis=1)  # [n, k]
    max_score = np.take_along_axis(flat, idx[:, None, :], axis=1)[:, 0, :]
    max_score = np.where(max_score > F(np.finfo(F).min), max_score, F(np.finfo(F).min))
    mh, mw = idx // s, idx % s

    def mirror(v: np.ndarray) -> np.ndarray:
        return np.where(v < 0, 1, np.where(v >= s, s - 2, v))

    offs = np.arange(-1, 2)
    hh = mirror(mh[..., None] + offs)  # [n, k, 3]
    ww = mirror(mw[..., None] + offs)
    cells = hh[..., :, None] * s + ww[..., None, :]  # [n, k, 3, 3]
    bi = np.arange(n)[:, None, None, None]
    ki = np.arange(k)[None, :, None, None]
    grid = flat[bi, cells, ki]
    d0, d1, score = solve_for_delta(grid, max_score, p.fp_atol, p.fp_rtol)
    x_rel = (mw.astype(F) + d0 + F(0.5)) / F(s)
    y_rel = (mh.astype(F) + d1 + F(0.5)) / F(s)
    x1, y1 = boxes[:, 0:1], boxes[:, 1:2]
    kx = x_rel * (boxes[:, 2:3] - x1) + x1
    ky = y_rel * (boxes[:, 3:4] - y1) + y1
    keypoints = np.stack([kx, ky], axis=-1).astype(F)
    return [from_float(score, d.score_q, ctx.outputs[0].dtype),
            from_float(keypoints, d.keypoint_q, ctx.outputs[1].dtype)]


BACKEND.register(HEATMAP_MAX_KEYPOINT, plan=plan, execute=execute)
