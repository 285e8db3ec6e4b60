"""BOX_WITH_NMS_LIMIT (NNAPI 1.2): per-class non-maximum suppression of detection boxes, then a
limit on the number of detections per image. How many boxes survive depends on the values: the
operation opts in to ``data_dependent_outputs`` (its outputs' first dimension is known only once
the kernel has run; see ``hal.compiler.make_plan``).

Inputs:
 0 scores [num_rois, num_classes]: TENSOR_FLOAT32, TENSOR_FLOAT16, TENSOR_QUANT8_ASYMM,
   TENSOR_QUANT8_ASYMM_SIGNED (1.3). Class 0 is the background and is never output.
 1 boxes [num_rois, num_classes * 4], (x1, y1, x2, y2) per class: input 0's float type, or
   TENSOR_QUANT16_ASYMM (scale 0.125, zero point 0) for quantized scores.
 2 batch index [num_rois]: TENSOR_INT32; boxes of one image are consecutive.
 3 score threshold: FLOAT32 (FLOAT16 for float16 scores); boxes scoring <= it are dropped.
 4 maximum number of detections per image: INT32, negative for unlimited.
 5 NMS kernel: INT32, 0 hard, 1 linear, 2 gaussian.
 6 IoU threshold (hard and linear kernels), 7 sigma (gaussian), 8 NMS score threshold (a box whose
   score the kernel decayed below it is dropped): FLOAT32 (FLOAT16 for float16 scores).
Outputs [num_output_rois]: 0 scores (input 0's type and quantization), 1 boxes [num_output_rois, 4]
(input 1's type and quantization), 2 classes (TENSOR_INT32), 3 batch index (TENSOR_INT32). Per
image the outputs are sorted by class, then by score, descending.
"""
from __future__ import annotations

from dataclasses import dataclass

from hal.operations.common import F16, F32, I32, INT32, QS8, QU8, QUANT8, param
from hal.registry import OperationContext, register
from hal.types import FeatureLevel, OperandType, OperationType

BOX_WITH_NMS_LIMIT = OperationType.BOX_WITH_NMS_LIMIT
QU16 = OperandType.TENSOR_QUANT16_ASYMM
FLOAT16, FLOAT32 = OperandType.FLOAT16, OperandType.FLOAT32
TYPES = (F32, F16, QU8, QS8)

SCORES, ROIS, BATCHES, SCORE_THRESHOLD, MAX_DETECTIONS, NMS_KERNEL, IOU_THRESHOLD, SIGMA, \
    NMS_SCORE_THRESHOLD = range(9)
OUT_SCORES, OUT_ROIS, OUT_CLASSES, OUT_BATCHES = range(4)

HARD, LINEAR, GAUSSIAN = 0, 1, 2
ROI_SCALE = 0.125  # NNAPI's fixed quantization of TENSOR_QUANT16_ASYMM boxes


@dataclass
class BoxWithNmsLimitParams:
    num_classes: int
    score_threshold: float
    max_detections: int  # < 0: unlimited
    kernel: int
    iou_threshold: float
    sigma: float
    nms_score_threshold: float


def box_types(t: int) -> tuple[int, int]:
    """(boxes type, float scalar type) NNAPI pairs with a scores type."""
    if t in QUANT8:
        return QU16, FLOAT32
    return t, (FLOAT16 if t == F16 else FLOAT32)


def validate(ctx: OperationContext) -> None:
    t = ctx.input_type(SCORES)
    roi_t, scalar_t = box_types(t)
    ctx.expect_input_type(ROIS, roi_t)
    ctx.expect_input_type(BATCHES, I32)
    for i in (SCORE_THRESHOLD, IOU_THRESHOLD, SIGMA, NMS_SCORE_THRESHOLD):
        ctx.expect_input_type(i, scalar_t)
    for i in (MAX_DETECTIONS, NMS_KERNEL):
        ctx.expect_input_type(i, INT32)
    ctx.expect_output_type(OUT_SCORES, t)
    ctx.expect_output_type(OUT_ROIS, roi_t)
    ctx.expect_output_type(OUT_CLASSES, I32)
    ctx.expect_output_type(OUT_BATCHES, I32)
    ctx.expect_input_rank(SCORES, 2)
    ctx.expect_input_rank(ROIS, 2)
    ctx.expect_input_rank(BATCHES, 1)
    kernel = param(ctx, NMS_KERNEL, INT32)
    ctx.check(kernel is None or kernel in (HARD, LINEAR, GAUSSIAN),
              f"NMS kernel must be 0 (hard), 1 (linear) or 2 (gaussian), got {kernel}")
    if t in QUANT8:
        ctx.expect_same_quantization(SCORES, OUT_SCORES)
        for info, what in ((ctx.input(ROIS), "input 1"), (ctx.output(OUT_ROIS), "output 1")):
            ctx.check(info.scale == ROI_SCALE and info.zero_point == 0,
                      f"{what} (TENSOR_QUANT16_ASYMM boxes) must have scale 0.125 and zero point 0, "
                      f"got scale {info.scale}, zero point {info.zero_point}")


def _count(ctx: OperationContext, out: int) -> int:
    """The output count as the model declares it, or 0: known only once the kernel has run."""
    declared = ctx.output(out).shape
    return declared[0] if declared else 0


def prepare(ctx: OperationContext) -> BoxWithNmsLimitParams:
    scores, rois, batches = (ctx.input_shape(i) for i in (SCORES, ROIS, BATCHES))
    ctx.check(len(scores) == 2 and len(rois) == 2 and len(batches) == 1,
              f"scores, boxes and batch indexes must be rank 2, 2 and 1, got {list(scores)}, "
              f"{list(rois)}, {list(batches)}")
    num_rois, num_classes = scores
    ctx.check(num_classes > 1, f"scores must have at least 2 classes (class 0 is the background), got "
                               f"{num_classes}")
    ctx.check(rois == (num_rois, num_classes * 4),
              f"boxes must be [{num_rois}, {num_classes * 4}] (4 per class), got {list(rois)}")
    ctx.check(batches == (num_rois,), f"batch indexes must be [{num_rois}], got {list(batches)}")
    kernel = ctx.scalar(NMS_KERNEL, INT32)
    ctx.check(kernel in (HARD, LINEAR, GAUSSIAN),
              f"NMS kernel must be 0 (hard), 1 (linear) or 2 (gaussian), got {kernel}")
    ctx.set_output_shape(OUT_SCORES, (_count(ctx, OUT_SCORES),))
    ctx.set_output_shape(OUT_ROIS, (_count(ctx, OUT_ROIS), 4))
    ctx.set_output_shape(OUT_CLASSES, (_count(ctx, OUT_CLASSES),))
    ctx.set_output_shape(OUT_BATCHES, (_count(ctx, OUT_BATCHES),))
    return BoxWithNmsLimitParams(num_classes, float(ctx.scalar(SCORE_THRESHOLD)),
                                 int(ctx.scalar(MAX_DETECTIONS, INT32)), kernel,
                                 float(ctx.scalar(IOU_THRESHOLD)), float(ctx.scalar(SIGMA)),
                                 float(ctx.scalar(NMS_SCORE_THRESHOLD)))


register(BOX_WITH_NMS_LIMIT, validate=validate, prepare=prepare, input_types=TYPES, num_inputs=(9,),
         num_outputs=(4,), allow_zero_sized_inputs=True, min_feature_level=FeatureLevel.FL3,
         type_feature_levels={QS8: FeatureLevel.FL4}, data_dependent_outputs=True)
