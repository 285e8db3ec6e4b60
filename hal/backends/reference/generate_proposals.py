"""GENERATE_PROPOSALS on numpy, in float32 as NNAPI's CPU path computes it (quantized inputs
dequantized, outputs requantized with std::round).

Per image: every anchor placed at every feature-map cell (shifted by the strides), moved by its
deltas and clipped to the image (AXIS_ALIGNED_BBOX_TRANSFORM's arithmetic); the pre_nms_top_n best
scores kept (a stable sort: equal scores keep cell order); boxes no larger than min_size, or whose
centre lies outside the image, dropped; hard NMS keeps at most post_nms_top_n.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hal.backends.reference import BACKEND
from hal.backends.reference.bbox import Quant, check_boxes, from_float, ieee, quant_of, to_float, transform
from hal.backends.reference.detection_postprocess import hard_nms
from hal.operations.generate_proposals import GENERATE_PROPOSALS, GenerateProposalsParams
from hal.registry import OperationContext

F = np.float32


@dataclass
class ProposalsData:
    p: GenerateProposalsParams
    quants: tuple[Quant | None, ...]  # scores, deltas, anchors, image info
    score_out_q: Quant | None
    roi_out_q: Quant | None


def plan(ctx: OperationContext) -> ProposalsData:
    return ProposalsData(ctx.params, tuple(quant_of(ctx.inputs[i]) for i in range(4)), quant_of(ctx.outputs[0]),
                         quant_of(ctx.outputs[1]))


def shifted_anchors(anchors: np.ndarray, p: GenerateProposalsParams) -> np.ndarray:
    """Anchor boxes at every cell, [height * width * num_anchors, 4], in NHWC order."""
    h_shift = np.arange(p.height, dtype=F) * F(p.height_stride)
    w_shift = np.arange(p.width, dtype=F) * F(p.width_stride)
    shift = np.zeros((p.height, p.width, 1, 4), F)
    shift[..., 0] = shift[..., 2] = w_shift[None, :, None]
    shift[..., 1] = shift[..., 3] = h_shift[:, None, None]
    return (anchors[None, None, :, :] + shift).reshape(-1, 4)


def select(scores: np.ndarray, boxes: np.ndarray, height: float, width: float,
           p: GenerateProposalsParams) -> list[int]:
    """Indexes of one image's proposals, in output order."""
    n = len(scores)
    idx = np.arange(n)
    if 0 < p.pre_nms_top_n < n:
        idx = np.argsort(-scores, kind="stable")[:p.pre_nms_top_n]
    b = boxes[idx]
    w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    keep = (w > F(p.min_size)) & (h > F(p.min_size)) & (b[:, 0] + w / F(2) < width) & (b[:, 1] + h / F(2) < height)
    idx = idx[keep]
    kept = hard_nms(scores[idx], boxes[idx], p.iou_threshold, p.post_nms_top_n if p.post_nms_top_n > 0 else -1)
    return [int(idx[k]) for k in kept]


@ieee
def execute(ctx: OperationContext, inputs: list) -> list:
    d: ProposalsData = ctx.data
    p = d.p
    scores, deltas, anchors, info = (to_float(x, q) for x, q in zip(inputs[:4], d.quants))
    if p.nchw:
        scores, deltas = scores.transpose(0, 2, 3, 1), deltas.transpose(0, 2, 3, 1)
    cells = p.height * p.width * p.num_anchors
    scores = scores.reshape(p.batches, cells)
    deltas = deltas.reshape(p.batches, cells, 1, 4)
    info = info.reshape(p.batches, 2)
    rois = shifted_anchors(anchors.reshape(p.num_anchors, 4), p)
    check_boxes(ctx, rois, "shifted anchor")
    out_scores, out_rois, out_batches = [], [], []
    for b in range(p.batches):
        height, width = info[b]
        boxes = transform(rois, deltas[b], np.full(cells, height, F), np.full(cells, width, F)).reshape(cells, 4)
        picked = select(scores[b], boxes, height, width, p)
        out_scores.append(scores[b][picked])
        out_rois.append(boxes[picked])
        out_batches += [b] * len(picked)
    all_scores = np.concatenate(out_scores) if out_scores else np.zeros(0, F)
    all_rois = np.concatenate(out_rois).reshape(-1, 4) if out_rois else np.zeros((0, 4), F)
    return [from_float(all_scores, d.score_out_q, ctx.outputs[0].dtype),
            from_float(all_rois, d.roi_out_q, ctx.outputs[1].dtype),
            np.array(out_batches, dtype=np.int32)]


BACKEND.register(GENERATE_PROPOSALS, plan=plan, execute=execute)
