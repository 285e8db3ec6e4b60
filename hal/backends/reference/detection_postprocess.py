"""DETECTION_POSTPROCESSING on numpy, in float32 as NNAPI's CPU path computes it (float16 operands
arrive widened). ``hard_nms`` is also GENERATE_PROPOSALS' suppression.

Decoding: centre = anchor centre + anchor size * (dy, dx) / (scale_y, scale_x); half size =
anchor size * exp((dh, dw) / (scale_h, scale_w)) / 2; box (y1, x1, y2, x2).
Regular NMS: per class but the background, the boxes scoring above the threshold go through hard
NMS (at most max_num_detections_per_class kept); all survivors sorted by score, best
max_num_detections kept. Fast NMS: hard NMS of each anchor's best non-background score (at most
max_num_detections anchors), then each kept anchor's max_classes_per_detection best classes.
"""
from __future__ import annotations

import numpy as np

from hal.backends.reference import BACKEND
from hal.backends.reference.bbox import ieee
from hal.backends.reference.detection_nms import iou
from hal.operations.detection_postprocess import DETECTION_POSTPROCESSING, DetectionPostprocessParams
from hal.registry import OperationContext

F = np.float32


def hard_nms(scores: np.ndarray, boxes: np.ndarray, iou_threshold: float, limit: int) -> list[int]:
    """Hard NMS of candidates 0..n-1 (``scores`` [n], ``boxes`` [n, 4]): the kept positions in
    selection order, at most ``limit`` (< 0: no limit). Repeatedly the best remaining candidate
    (the first of equal ones in the current order) is kept and those overlapping it by IoU >=
    the threshold dropped; the order follows AOSP's in-place walk, where a dropped candidate
    swaps with the last remaining one, so ties resolve as there."""
    n = len(scores)
    limit = n if limit < 0 else limit
    order = list(range(n))
    start, end = 0, n
    while start < end and start < limit:
        rest = np.array(order[start:end], dtype=np.int64)
        best = start + int(np.argmax(scores[rest]))
        order[start], order[best] = order[best], order[start]
        drop = np.zeros(n, dtype=bool)
        others = np.array(order[start + 1:end], dtype=np.int64)
        if others.size:
            drop[others] = iou(boxes[others], boxes[order[start]]) >= F(iou_threshold)
        i = start + 1
        while i < end:
            if drop[order[i]]:
                end -= 1
                order[i], order[end] = order[end], order[i]
            else:
                i += 1
        start += 1
    return order[:start]


def decode(deltas: np.ndarray, anchors: np.ndarray, p: DetectionPostprocessParams) -> np.ndarray:
    """Boxes [num_anchors, 4] (y1, x1, y2, x2) from one image's deltas [num_anchors, >= 4]."""
    y_ctr = anchors[:, 0] + anchors[:, 2] * deltas[:, 0] / F(p.scale_y)
    x_ctr = anchors[:, 1] + anchors[:, 3] * deltas[:, 1] / F(p.scale_x)
    h_half = anchors[:, 2] * np.exp(deltas[:, 2] / F(p.scale_h)) * F(0.5)
    w_half = anchors[:, 3] * np.exp(deltas[:, 3] / F(p.scale_w)) * F(0.5)
    return np.stack([y_ctr - h_half, x_ctr - w_half, y_ctr + h_half, x_ctr + w_half], axis=1).astype(F)


def regular_nms(scores: np.ndarray, boxes: np.ndarray, p: DetectionPostprocessParams) -> list[tuple[int, int]]:
    """(anchor, class) of one image's detections, best first."""
    picked: list[tuple[int, int]] = []
    for c in range(1, p.num_classes):
        cand = np.flatnonzero(scores[:, c] > F(p.score_threshold))
        kept = hard_nms(scores[cand, c], boxes[cand], p.iou_threshold, p.max_num_detections_per_class)
        picked += [(int(cand[k]), c) for k in kept]
    # candidates are gathered class by class, anchors ascending: the stable sort keeps that order
    # among equal scores
    picked.sort(key=lambda ac: -scores[ac])
    return picked[:p.max_num_detections]


def fast_nms(scores: np.ndarray, boxes: np.ndarray, p: DetectionPostprocessParams) -> list[tuple[int, int]]:
    """(anchor, class) of one image's detections: each kept anchor's best classes in turn."""
    best = scores[:, 1:].max(axis=1)
    cand = np.flatnonzero(best > F(p.score_threshold))
    kept = hard_nms(best[cand], boxes[cand], p.iou_threshold, p.max_num_detections)
    per_anchor = min(p.num_classes - 1, p.max_classes_per_detection)
    picked = []
    for k in kept:
        a = int(cand[k])
        classes = 1 + np.argsort(-scores[a, 1:], kind="stable")[:per_anchor]
        picked += [(a, int(c)) for c in classes]
    return picked


def plan(ctx: OperationContext) -> DetectionPostprocessParams:
    return ctx.params


@ieee
def execute(ctx: OperationContext, inputs: list) -> list:
    p: DetectionPostprocessParams = ctx.data
    scores_in, deltas_in, anchors_in = (x.astype(F) for x in inputs[:3])
    batches = scores_in.shape[0]
    out_scores = np.zeros((batches, p.num_output), F)
    out_boxes = np.zeros((batches, p.num_output, 4), F)
    out_classes = np.zeros((batches, p.num_output), np.int32)
    counts = np.zeros(batches, np.int32)
    label_shift = 0 if p.is_bg_in_label else 1
    for b in range(batches):
        scores = scores_in[b]
        boxes = decode(deltas_in[b], anchors_in, p)
        picked = (regular_nms if p.use_regular_nms else fast_nms)(scores, boxes, p)
        n = len(picked)
        if n:
            anchors = np.array([a for a, _ in picked])
            classes = np.array([c for _, c in picked])
            out_scores[b, :n] = scores[anchors, classes]
            out_boxes[b, :n] = boxes[anchors]
            out_classes[b, :n] = classes - label_shift
        counts[b] = n
    dtype = ctx.outputs[0].dtype
    return [out_scores.astype(dtype), out_boxes.astype(ctx.outputs[1].dtype), out_classes, counts]


BACKEND.register(DETECTION_POSTPROCESSING, plan=plan, execute=execute)
