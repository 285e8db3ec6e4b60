"""DETECTION_POSTPROCESSING (NNAPI 1.2): SSD post-processing, i.e. anchor box decoding then
class-wise non-maximum suppression, with outputs of a fixed (maximum) size.

Inputs:
 0 scores [batches, num_anchors, num_classes]: TENSOR_FLOAT32 or TENSOR_FLOAT16. Class 0 is the
   background and is never selected.
 1 deltas [batches, num_anchors, length_box_encoding >= 4], of input 0's type: (dy, dx, dh, dw)
   then anything (ignored).
 2 anchors [num_anchors, 4], (ctr_y, ctr_x, h, w), of input 0's type.
 3-6 scale_y, scale_x, scale_h, scale_w: FLOAT32 (FLOAT16 for float16 scores), all > 0.
 7 use_regular_nms: BOOL. true: NMS per class; false (fast): NMS of each anchor's best class,
   then its max_classes_per_detection best classes output.
 8 max_num_detections: INT32 > 0.
 9 max_classes_per_detection: INT32 (fast NMS: > 0).
 10 max_num_detections_per_class: INT32 (regular NMS: > 0).
 11 score_threshold (>= 0), 12 iou_threshold (>= 0): FLOAT32 (FLOAT16 for float16 scores).
 13 is_bg_in_label: BOOL; false: output class c - 1 for class c (the background is no label).
Outputs (num_output = max_num_detections, times max_classes_per_detection for fast NMS):
 0 scores [batches, num_output] and 1 boxes [batches, num_output, 4] (y1, x1, y2, x2), of input
 0's type; 2 classes [batches, num_output] and 3 number of detections [batches]: TENSOR_INT32.
Entries past an image's number of detections are 0.
"""
from __future__ import annotations

from dataclasses import dataclass

from hal.operations.common import BOOL, F16, F32, I32, INT32, param
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperandType, OperationType

DETECTION_POSTPROCESSING = OperationType.DETECTION_POSTPROCESSING
FLOAT16, FLOAT32 = OperandType.FLOAT16, OperandType.FLOAT32
TYPES = (F32, F16)

(SCORES, DELTAS, ANCHORS, SCALE_Y, SCALE_X, SCALE_H, SCALE_W, USE_REGULAR_NMS, MAX_NUM_DETECTIONS,
 MAX_CLASSES_PER_DETECTION, MAX_NUM_DETECTIONS_PER_CLASS, SCORE_THRESHOLD, IOU_THRESHOLD,
 IS_BG_IN_LABEL) = range(14)
OUT_SCORES, OUT_BOXES, OUT_CLASSES, OUT_NUM_DETECTIONS = range(4)

FLOAT_PARAMS = (SCALE_Y, SCALE_X, SCALE_H, SCALE_W, SCORE_THRESHOLD, IOU_THRESHOLD)
INT_PARAMS = (MAX_NUM_DETECTIONS, MAX_CLASSES_PER_DETECTION, MAX_NUM_DETECTIONS_PER_CLASS)


@dataclass
class DetectionPostprocessParams:
    scale_y: float
    scale_x: float
    scale_h: float
    scale_w: float
    use_regular_nms: bool
    max_num_detections: int
    max_classes_per_detection: int
    max_num_detections_per_class: int
    score_threshold: float
    iou_threshold: float
    is_bg_in_label: bool
    num_classes: int
    num_output: int


def _check_values(ctx: OperationContext, values: dict[int, object]) -> None:
    """The parameter ranges NNAPI sets (unknown ones, None, are left to prepare)."""
    for i in (SCALE_Y, SCALE_X, SCALE_H, SCALE_W):
        v = values[i]
        ctx.check(v is None or v > 0, f"input {i} (box scale) must be > 0, got {v}")
    for i in (SCORE_THRESHOLD, IOU_THRESHOLD):
        v = values[i]
        ctx.check(v is None or v >= 0, f"input {i} (threshold) must be >= 0, got {v}")
    m = values[MAX_NUM_DETECTIONS]
    ctx.check(m is None or m > 0, f"max_num_detections must be > 0, got {m}")
    regular = values[USE_REGULAR_NMS]
    if regular is None:
        return
    if regular:
        v = values[MAX_NUM_DETECTIONS_PER_CLASS]
        ctx.check(v is None or v > 0, f"max_num_detections_per_class must be > 0 for regular NMS, got {v}")
    else:
        v = values[MAX_CLASSES_PER_DETECTION]
        ctx.check(v is None or v > 0, f"max_classes_per_detection must be > 0 for fast NMS, got {v}")


def validate(ctx: OperationContext) -> None:
    t = ctx.input_type(SCORES)
    scalar_t = FLOAT16 if t == F16 else FLOAT32
    ctx.expect_input_type(DELTAS, t)
    ctx.expect_input_type(ANCHORS, t)
    for i in FLOAT_PARAMS:
        ctx.expect_input_type(i, scalar_t)
    for i in INT_PARAMS:
        ctx.expect_input_type(i, INT32)
    for i in (USE_REGULAR_NMS, IS_BG_IN_LABEL):
        ctx.expect_input_type(i, BOOL)
    ctx.expect_output_type(OUT_SCORES, t)
    ctx.expect_output_type(OUT_BOXES, t)
    ctx.expect_output_type(OUT_CLASSES, I32)
    ctx.expect_output_type(OUT_NUM_DETECTIONS, I32)
    ctx.expect_input_rank(SCORES, 3)
    ctx.expect_input_rank(DELTAS, 3)
    ctx.expect_input_rank(ANCHORS, 2)
    _check_values(ctx, {i: param(ctx, i) for i in (*FLOAT_PARAMS, *INT_PARAMS, USE_REGULAR_NMS)})


def prepare(ctx: OperationContext) -> DetectionPostprocessParams:
    scores, deltas, anchors = (ctx.input_shape(i) for i in (SCORES, DELTAS, ANCHORS))
    ctx.check(len(scores) == 3 and len(deltas) == 3 and len(anchors) == 2,
              f"scores, deltas and anchors must be rank 3, 3 and 2, got {list(scores)}, {list(deltas)}, "
              f"{list(anchors)}")
    batches, num_anchors, num_classes = scores
    ctx.check(num_classes > 1, f"scores must have at least 2 classes (class 0 is the background), got "
                               f"{num_classes}")
    ctx.check(deltas[:2] == (batches, num_anchors) and deltas[2] >= 4,
              f"deltas must be [{batches}, {num_anchors}, >= 4], got {list(deltas)}")
    ctx.check(anchors == (num_anchors, 4), f"anchors must be [{num_anchors}, 4], got {list(anchors)}")
    values = {i: ctx.scalar(i) for i in (*FLOAT_PARAMS, *INT_PARAMS, USE_REGULAR_NMS, IS_BG_IN_LABEL)}
    _check_values(ctx, values)
    regular = bool(values[USE_REGULAR_NMS])
    num_output = values[MAX_NUM_DETECTIONS] * (1 if regular else values[MAX_CLASSES_PER_DETECTION])
    ctx.check(num_output <= 1 << 24, f"{num_output} output detections per image is too many")
    ctx.set_output_shape(OUT_SCORES, (batches, num_output))
    ctx.set_output_shape(OUT_BOXES, (batches, num_output, 4))
    ctx.set_output_shape(OUT_CLASSES, (batches, num_output))
    ctx.set_output_shape(OUT_NUM_DETECTIONS, (batches,))
    return DetectionPostprocessParams(
        float(values[SCALE_Y]), float(values[SCALE_X]), float(values[SCALE_H]), float(values[SCALE_W]),
        regular, int(values[MAX_NUM_DETECTIONS]), int(values[MAX_CLASSES_PER_DETECTION]),
        int(values[MAX_NUM_DETECTIONS_PER_CLASS]), float(values[SCORE_THRESHOLD]),
        float(values[IOU_THRESHOLD]), bool(values[IS_BG_IN_LABEL]), num_classes, num_output)


register(DETECTION_POSTPROCESSING, validate=validate, prepare=prepare, input_types=TYPES, num_inputs=(14,),
         num_outputs=(4,), min_feature_level=FeatureLevel.FL3)
