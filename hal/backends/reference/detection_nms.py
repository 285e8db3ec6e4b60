"""BOX_WITH_NMS_LIMIT on numpy, in float32 as NNAPI's CPU path computes it (quantized scores and
boxes dequantized first, output scores requantized with rounding half away from zero).

Per image (a run of equal batch indexes) and per class but the background: keep the boxes scoring
above the score threshold; then repeatedly take the best remaining box and decay every other one
by the kernel of their IoU (hard: 0 at IoU >= threshold, linear: 1 - IoU there, gaussian:
exp(-IoU²/sigma) everywhere), dropping those decayed below the NMS score threshold, until the
per-class limit. The image's survivors are sorted by decayed score, cut to the limit, and ordered
by class then score. The selection order (and so the choice among equal scores) follows AOSP's
in-place swap-to-the-end walk, which this reproduces step by step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal.backends.reference import BACKEND
from hal.operations.detection_nms import BOX_WITH_NMS_LIMIT, GAUSSIAN, HARD, BoxWithNmsLimitParams
from hal.quant import round_half_away
from hal.registry import OperationContext

F = np.float32


@dataclass
class NmsData:
    p: BoxWithNmsLimitParams
    score_scale: float
    score_zero_point: int
    roi_scale: float
    roi_zero_point: int
    quantized: bool


def plan(ctx: OperationContext) -> NmsData:
    s, r = ctx.inputs[0], ctx.inputs[1]
    return NmsData(ctx.params, s.scale, s.zero_point, r.scale, r.zero_point, s.dtype.kind in "iu")


def iou(boxes: np.ndarray, best: np.ndarray) -> np.ndarray:
    """IoU of each of ``boxes`` [n, 4] with ``best`` [4], in float32 (AOSP's order of operations;
    infinities and NaN propagate as in C, silently)."""
    with np.errstate(all="ignore"):
        area1 = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        area2 = (best[2] - best[0]) * (best[3] - best[1])
        w = np.maximum(np.minimum(boxes[:, 2], best[2]) - np.maximum(boxes[:, 0], best[0]), F(0))
        h = np.maximum(np.minimum(boxes[:, 3], best[3]) - np.maximum(boxes[:, 1], best[1]), F(0))
        inter = w * h
        return inter / (area1 + area2 - inter)


def decay(p: BoxWithNmsLimitParams, overlap: np.ndarray) -> np.ndarray:
    if p.kernel == HARD:
        return np.where(overlap < F(p.iou_threshold), F(1), F(0))
    if p.kernel == GAUSSIAN:
        with np.errstate(all="ignore"):
            return np.exp(F(-1) * overlap * overlap / F(p.sigma)).astype(F)
    return np.where(overlap < F(p.iou_threshold), F(1), F(1) - overlap)


def nms_single_class(p: BoxWithNmsLimitParams, scores: np.ndarray, boxes: np.ndarray, select: list[int]) -> list[int]:
    """Soft NMS of ``select`` (flat indexes into ``scores``/``boxes``); decays ``scores`` in place."""
    limit = len(select) if p.max_detections < 0 else p.max_detections
    start, end, kept = 0, len(select), 0
    while start < end and kept < limit:
        best = start + int(np.argmax(scores[select[start:end]]))  # the first maximum, as max_element
        select[start], select[best] = select[best], select[start]
        rest = np.array(select[start + 1:end], dtype=np.int64)
        if rest.size:  # each other entry is decayed once, whatever order the walk visits it in
            scores[rest] *= decay(p, iou(boxes[rest], boxes[select[start]]))
        # AOSP's walk: a dropped entry swaps with the current last one, whose slot is examined next.
        i = start + 1 if rest.size and (scores[rest] < F(p.nms_score_threshold)).any() else end
        while i < end:
            if scores[select[i]] < F(p.nms_score_threshold):
                end -= 1
                select[i], select[end] = select[end], select[i]
            else:
                i += 1
        start += 1
        kept += 1
    return select[:start]


def nms_image(p: BoxWithNmsLimitParams, scores: np.ndarray, boxes: np.ndarray) -> list[int]:
    """Selected flat indexes (roi * num_classes + class) of one image, in output order."""
    n, c = scores.shape
    flat = scores.reshape(-1)
    selected: list[int] = []
    for cls in range(1, c):
        candidates = (np.nonzero(scores[:, cls] > F(p.score_threshold))[0] * c + cls).tolist()
        selected += nms_single_class(p, flat, boxes, candidates)
    selected.sort(key=lambda k: -flat[k])
    if 0 <= p.max_detections < len(selected):
        selected = selected[:p.max_detections]
    selected.sort(key=lambda k: (k % c, -flat[k]))
    return selected


def execute(ctx: OperationContext, inputs: list) -> list:
    d: NmsData = ctx.data
    p = d.p
    scores_in, rois_in, batches = inputs[0], inputs[1], inputs[2]
    c = p.num_classes
    if d.quantized:
        scores = ((scores_in.astype(np.int32) - d.score_zero_point).astype(F) * F(d.score_scale))
        rois = ((rois_in.astype(np.int32) - d.roi_zero_point).astype(F) * F(d.roi_scale))
    else:
        scores, rois = scores_in.astype(F), rois_in.astype(F)
    boxes = rois.reshape(-1, 4)  # box of (roi, class) at roi * num_classes + class
    scores = scores.copy()
    picked_idx: list[int] = []
    out_batches: list[int] = []
    n = scores.shape[0]
    start = 0
    while start < n:
        end = start + 1
        while end < n and batches[end] == batches[start]:
            end += 1
        image_boxes = boxes[start * c:end * c]
        bad = (image_boxes[:, 0] > image_boxes[:, 2]) | (image_boxes[:, 1] > image_boxes[:, 3])
        if bad.any():
            k = int(np.argmax(bad))
            raise ctx.fail(f"box {k // c + start} (class {k % c}) has x2 < x1 or y2 < y1: "
                           f"{image_boxes[k].tolist()}")
        sel = nms_image(p, scores[start:end], image_boxes)
        picked_idx += [start * c + k for k in sel]
        out_batches += [int(batches[start])] * len(sel)
        start = end
    idx = np.array(picked_idx, dtype=np.int64)
    flat_scores = scores.reshape(-1)
    out_scores = flat_scores[idx]
    if d.quantized:
        lo, hi = np.iinfo(scores_in.dtype).min, np.iinfo(scores_in.dtype).max
        with np.errstate(all="ignore"):  # float32, as AOSP; a NaN score stores as the zero point
            q = round_half_away(out_scores / F(d.score_scale) + F(d.score_zero_point))
        out_scores = np.clip(np.nan_to_num(q, nan=d.score_zero_point), lo, hi).astype(scores_in.dtype)
    else:
        out_scores = out_scores.astype(scores_in.dtype)
    out_rois = rois_in.reshape(-1, 4)[idx].reshape(-1, 4)
    classes = (idx % c).astype(np.int32)
    return [out_scores, out_rois, classes, np.array(out_batches, dtype=np.int32)]


BACKEND.register(BOX_WITH_NMS_LIMIT, plan=plan, execute=execute, native_float16=True)
